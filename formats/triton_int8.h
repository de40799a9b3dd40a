// vLLM compressed-tensors W8A8 int8 MoE (Triton): int8 weights and float32 channel scales stacked
// as vLLM's parameters, no transposes. spec/wna16_marlin.md §9.
//
// Mirrors vLLM 9aaf83ef compressed_tensors_moe_w8a8_int8.py (CompressedTensorsW8A8Int8MoEMethod:
// create_weights; process_weights_after_loading changes no bytes). Channel-strategy weights with
// dynamic per-token int8 activations only.
//
//   w13_weight        I8  [E, 2I, H]   row n = output feature n (gate rows 0..I-1, then up)
//   w2_weight         I8  [E, H, I]
//   w13_weight_scale  F32 [E, 2I, 1]   one scale per output row (checkpoint BF16/F16 widened
//   w2_weight_scale   F32 [E, H, 1]     exactly, as copy_ into the float32 parameter does)
//
//   W[n, k] = int8(weight[n, k]) * scale[n]     (no zero point)
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<Tensor> pack_triton_int8_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_triton_int8_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
std::vector<ParamSpec> triton_int8_param_specs(const LayoutOptions& opts, const MoeShape& shape);
std::vector<std::string> triton_int8_deviations_from_vllm(const LayoutOptions& opts,
                                                          const MoeShape& shape);

// The parameters as unpack and the reader check them (same errors): experts, and each
// projection's [N, K] (w13 then w2), for the layout's reader (its make_reader).
struct TritonInt8LayerView {
  int64_t experts = 0, n[2] = {0, 0}, k[2] = {0, 0};
};
TritonInt8LayerView triton_int8_read_layer(const LayoutOptions& opts,
                                           const TensorMap& params_by_name);
// The row's reader (TargetLayout::make_reader): int8 code times the row's float scale;
// act_quant: vLLM's per-token int8 quantisation of the activations.
reader::ProjReader triton_int8_make_reader(const LayoutOptions& opts,
                                           const TensorMap& params_by_name, MoeProj proj,
                                           const ParamLocator& locate);
reader::ActQuant triton_int8_act_quant(const LayoutOptions& opts);

// Every reason these experts cannot be written in this layout (empty = supported); pack throws
// kUnsupported listing them (kBadShape first when w13 and w2 disagree).
std::vector<std::string> triton_int8_unsupported_reasons(const LayoutOptions& opts,
                                                         const MoeShape& shape);

}  // namespace moepack
