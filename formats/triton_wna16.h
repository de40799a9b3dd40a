// vLLM Triton moe_wna16 layout (MoeWNA16Method and CompressedTensorsWNA16MoEMethod): N-major uint8
// codes, group-size halving, packed zeros. spec/wna16_marlin.md §8-9.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<Tensor> pack_triton_wna16_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_triton_wna16_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
void triton_wna16_expert_matmul(const LayoutOptions& opts, const TensorMap& params_by_name,
                                MoeProj proj, int64_t expert, const float* x, int64_t m, float* y);
std::vector<std::string> triton_wna16_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeExperts& experts);

}  // namespace moepack
