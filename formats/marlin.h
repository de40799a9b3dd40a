// vLLM Marlin MoE layout (GPTQ / AWQ / compressed-tensors WNA16 -> Marlin tiles, permuted scales,
// Marlin zero points, act-order sort indices). spec/wna16_marlin.md §3-7, §10.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<Tensor> pack_marlin_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_marlin_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
void marlin_expert_matmul(const LayoutOptions& opts, const TensorMap& params_by_name, MoeProj proj,
                          int64_t expert, const float* x, int64_t m, float* y);
std::vector<std::string> marlin_deviations_from_vllm(const LayoutOptions& opts,
                                                     const MoeExperts& experts);

// Single-matrix building blocks (also used by tests against the golden gptq_repack_* cases).
// codes: logical Q as [N, K] (canonical orientation); perm: [K] or empty. Returns int32 words
// [K/16, N*16/pf] (bits 4 or 8; a8 = 8-bit-activation tiles).
std::vector<uint32_t> marlin_repack(const uint8_t* codes_nk, int64_t n, int64_t k, int bits,
                                    const int32_t* perm, bool a8);
// Inverse: words -> codes [N, K] of the logical (permuted) matrix Q'[k, n] = Q[perm[k], n].
std::vector<uint8_t> marlin_unrepack(const uint32_t* words, int64_t n, int64_t k, int bits,
                                     bool a8);
// Scale permutations on a row-major [G, N] tensor of elem_bytes-wide elements (§4.1).
void marlin_permute_scales(uint8_t* data, int64_t rows, int64_t n, int elem_bytes, bool grouped);
void marlin_unpermute_scales(uint8_t* data, int64_t rows, int64_t n, int elem_bytes, bool grouped);
// Zero points: codes [G, N] -> int32 [G, N/pf] and back (§5.1).
std::vector<uint32_t> marlin_pack_zero_points(const uint8_t* zp_gn, int64_t g, int64_t n, int bits,
                                              bool a8);
std::vector<uint8_t> marlin_unpack_zero_points(const uint32_t* words, int64_t g, int64_t n,
                                               int bits, bool a8);

}  // namespace moepack
