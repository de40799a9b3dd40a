// FlashInfer TRT-LLM-Gen MXFP8 MoE layout: W31 swap, gated row interleave, shuffle_matrix_a
// (epilogue tile 128), scales with the same row map then 128x4 interleave. spec/mxfp8_trtllm.md §3.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<Tensor> pack_trtllm_mxfp8_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_trtllm_mxfp8_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
void trtllm_mxfp8_expert_matmul(const LayoutOptions& opts, const TensorMap& params_by_name,
                                MoeProj proj, int64_t expert, const float* x, int64_t m, float* y);
std::vector<std::string> trtllm_mxfp8_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeExperts& experts);

// Row maps as data (out[r] = in[src[r]]); inverses via invert_permutation.
std::vector<int32_t> shuffle_matrix_a_rows(int64_t rows, int epilogue_tile_m);
std::vector<int32_t> gated_act_reorder_rows(int64_t rows);
std::vector<int32_t> swap_w13_to_w31_rows(int64_t rows);
// The complete w13 / w2 row maps for one expert (§3.6).
std::vector<int32_t> trtllm_w13_rows(int64_t rows, bool gated);
std::vector<int32_t> trtllm_w2_rows(int64_t rows);
// 128x4 scale interleave of one [R, C] byte matrix (R % 128 == 0, C % 4 == 0) and its inverse.
std::vector<uint8_t> scale_interleave_128x4(const uint8_t* src, int64_t rows, int64_t cols);
std::vector<uint8_t> scale_deinterleave_128x4(const uint8_t* src, int64_t rows, int64_t cols);

}  // namespace moepack
