// vLLM compressed-tensors W8A8 int8 MoE (Triton): int8 weights and float32 channel scales stacked
// as vLLM's parameters, no transposes. spec/wna16_marlin.md §9.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<Tensor> pack_triton_int8_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_triton_int8_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
void triton_int8_expert_matmul(const LayoutOptions& opts, const TensorMap& params_by_name,
                               MoeProj proj, int64_t expert, const float* x, int64_t m, float* y);
std::vector<std::string> triton_int8_deviations_from_vllm(const LayoutOptions& opts,
                                                          const MoeExperts& experts);

}  // namespace moepack
