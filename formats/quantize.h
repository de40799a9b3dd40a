// Reference quantisers that turn float weights into the canonical QuantTensor the way real
// producers do (GPTQ/AWQ-style round-to-nearest with real scales and zero points, act-order
// groups, W8A8 channel int8, DeepSeek FP8 blocks). Used by `moepack synth` and tests; MXFP8 lives
// in formats/mxfp8 (quantize_mxfp8).
#pragma once

#include <cstdint>
#include <vector>

#include "formats/codec.h"

namespace moepack {

struct IntQuantSpec {
  int bits = 4;
  int64_t group_size = 128;  // -1: channelwise
  bool symmetric = true;
  DType scale_dtype = DType::kF16;
  // Smallest zero point an asymmetric quantisation may pick: GPTQ v1 stores zero-1, so its zero
  // cannot be 0 (AutoGPTQ's v1 format loses it); 1 there, 0 elsewhere.
  int min_zero = 0;
  // Act-order: column processing order (GPTQ desc_act). g_idx[order[i]] = i / group_size and a
  // group's scale is computed over the columns it holds. Empty: natural order, no g_idx.
  std::vector<int32_t> order;
};

// w: [N, K] row-major floats -> QuantTensor (experts = 1, CodeKind::kUint).
QuantTensor quantize_int(const float* w, int64_t n, int64_t k, const IntQuantSpec& spec);

// W8A8 int8, symmetric per output channel: codes int8 (CodeKind::kInt), scales [N, 1].
QuantTensor quantize_int8_channel(const float* w, int64_t n, int64_t k, DType scale_dtype);

// DeepSeek FP8 block: scale = amax / 448 per [block_n, block_k] block (F32), codes e4m3 RNE.
QuantTensor quantize_fp8_block(const float* w, int64_t n, int64_t k, int64_t block_n,
                               int64_t block_k);

// Deterministic pseudo-random numbers independent of the C++ library (splitmix64 + xoshiro).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next_u64();
  double uniform();  // [0, 1)
  float normal();    // approximately N(0, 1) (Box-Muller on our own uniforms)
  static uint64_t hash(uint64_t seed, const std::string& label);

 private:
  uint64_t s_[4];
};

}  // namespace moepack
