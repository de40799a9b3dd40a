// FlashInfer TRT-LLM-Gen DeepSeek FP8 block MoE layout: W31 swap, shuffle_matrix_a (epilogue tile
// 64), BlockMajorK [K/128, M, 128]; scales W31-swapped and clamped >= 1e-10. spec/mxfp8_trtllm.md
// §5.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<Tensor> pack_trtllm_fp8_block_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_trtllm_fp8_block_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
void trtllm_fp8_block_expert_matmul(const LayoutOptions& opts, const TensorMap& params_by_name,
                                    MoeProj proj, int64_t expert, const float* x, int64_t m,
                                    float* y);
std::vector<std::string> trtllm_fp8_block_deviations_from_vllm(const LayoutOptions& opts,
                                                               const MoeExperts& experts);

}  // namespace moepack
