// DeepSeek-style FP8 block checkpoint Linear <-> QuantTensor: weight F8_E4M3 [N, K],
// weight_scale_inv F32 [ceil(N/128), ceil(K/128)] (a dequant multiplier despite the name).
// spec/checkpoints.md §3.2, spec/mxfp8_trtllm.md §5.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<std::string> fp8_block_required_suffixes(const QuantParams& p);
std::vector<std::string> fp8_block_optional_suffixes(const QuantParams& p);
QuantTensor unpack_fp8_block(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                             int64_t k);
TensorMap pack_fp8_block(const QuantParams& p, const QuantTensor& q);

QuantSpec fp8_block_spec_for(const QuantParams& p);
// Float8 e4m3 codes with F32 scales per [block_n, block_k] block.
QuantSpec fp8_block_spec(int64_t block_n, int64_t block_k);
std::vector<QuantParams> fp8_block_param_space();

// compressed-tensors FP8_BLOCK (format float-quantized, weights strategy "block"): weight
// F8_E4M3 [N, K], weight_scale in the model dtype (BF16 / F16, or F32) [ceil(N/bn), ceil(K/bk)],
// a dequant multiplier like weight_scale_inv. Canonical scales keep the stored dtype (a layout
// that serves F32 widens them exactly). Mirrors compressed-tensors' FloatQuantizationCompressor
// with QuantizationStrategy.BLOCK and vLLM's CompressedTensorsW8A8Fp8MoEMethod (block_quant).
std::vector<std::string> ct_fp8_block_required_suffixes(const QuantParams& p);
std::vector<std::string> ct_fp8_block_optional_suffixes(const QuantParams& p);
QuantTensor unpack_ct_fp8_block(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                                int64_t k);
TensorMap pack_ct_fp8_block(const QuantParams& p, const QuantTensor& q);
QuantSpec ct_fp8_block_spec_for(const QuantParams& p);
std::vector<std::string> ct_fp8_block_refusals(const QuantParams& p);
std::vector<QuantParams> ct_fp8_block_param_space();

}  // namespace moepack
