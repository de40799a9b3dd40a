// `moepack synth`: realistic random MoE checkpoints in every source format. Random bf16-style
// weights are quantised properly (real scales from the weights, real zero points, a real
// act-order permutation shared by gate and up), packed by the format's own codec, and written
// streaming (tensor by tensor) with a config.json like the real producers write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/progress.h"

namespace moepack {

struct SynthOptions {
  std::string format = "gptq";  // see synth_formats()
  // qwen3 | mixtral | deepseek | fused3d | gpt_oss; empty: the format's own (gpt_oss for
  // gpt-oss-mxfp4, qwen3 for the rest)
  std::string family;
  int64_t layers = 2;
  int64_t experts = 4;
  int64_t hidden = 256;
  int64_t inter = 128;
  int64_t group_size = 0;  // 0: the format's default (128; 32 for MXFP8)
  int bits = 0;            // 0: the format's default
  int64_t top_k = 2;
  int64_t vocab = 512;
  uint64_t seed = 0;
  DType dtype = DType::kBF16;  // model dtype (--dtype)
  uint64_t max_shard_bytes = 5000000000ull;
  bool force = false;
  int threads = 0;
  ProgressFn progress;  // tensors written and their bytes
};

const std::vector<std::string>& synth_formats();
const std::vector<std::string>& synth_families();

struct SynthResult {
  std::string dir;     // out_dir
  std::string family;  // the family written (SynthOptions::family resolved)
  int64_t tensors = 0;
  uint64_t bytes = 0;
  int64_t shards = 0;
};

// Writes the checkpoint atomically into `out_dir`. Throws Error (kUsage for bad options).
SynthResult synth_checkpoint(const std::string& out_dir, const SynthOptions& opts);

}  // namespace moepack
