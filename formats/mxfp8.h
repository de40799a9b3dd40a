// MXFP8 checkpoint Linear (ModelOpt MXFP8 and compressed-tensors mxfp8-quantized) <-> QuantTensor,
// and the MXFP8 quantisers. weight F8_E4M3 [N, K], weight_scale U8 or F8_E8M0 [N, K/32].
// spec/mxfp8_trtllm.md §1, §6.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<std::string> mxfp8_required_suffixes(const QuantParams& p);
std::vector<std::string> mxfp8_optional_suffixes(const QuantParams& p);
QuantTensor unpack_mxfp8(const QuantParams& p, const TensorMap& by_suffix, int64_t n, int64_t k);
TensorMap pack_mxfp8(const QuantParams& p, const QuantTensor& q);

// An MXFP8 QuantTensor of E experts [N, K] (e4m3 codes, U8 E8M0 scales per 32 along K), bytes
// zeroed, ready to fill.
QuantTensor make_mxfp8_tensor(int64_t experts, int64_t n, int64_t k);

// Which rule turns a block's amax into its E8M0 code (spec/mxfp8_trtllm.md §6).
enum class MxRecipe : uint8_t {
  kFlashInfer,  // smallest c with 2^(c-127) >= amax/448; c == 0 blocks are written as zeros
  kModelOpt,    // same codes, but c == 0 blocks are still scaled by 2^127
};
// Quantises float weights [E, N, K] (K % 32 == 0) to MXFP8 (codes e4m3, scales U8 E8M0).
QuantTensor quantize_mxfp8(const float* w, int64_t experts, int64_t n, int64_t k, MxRecipe recipe);

QuantSpec mxfp8_spec_for(const QuantParams& p);
std::vector<QuantParams> mxfp8_param_space();

}  // namespace moepack
