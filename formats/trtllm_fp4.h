// FlashInfer TRT-LLM-Gen FP4 MoE layouts (Blackwell): what vLLM 0.33.0 leaves on the FusedMoE
// layer for its FlashInfer TRT-LLM FP4 experts. docs/trtllm_fp4.md has the diagrams.
//
//   trtllm-nvfp4  NVFP4 W4A4 on FLASHINFER_TRTLLM: prepare_nvfp4_moe_layer_for_fi_or_cutlass
//                 (reorder_w1w3_to_w3w1, H padded to 256, I to 64 / 128 per half, the same
//                 interleave + shuffle + 128x4 as below with blocks of 16 and E4M3 scales) and
//                 TrtLlmNvFp4Experts' fold: w13_weight_scale_2 = g_gate * a13, w2_weight_scale_2 =
//                 g2 * a2, g1_scale_c = w13_weight_scale_2 / a2 (F32 [E]), with a13 / a2 the
//                 layer's largest activation scale. ModelOpt keeps w13_input_scale / w2_input_scale
//                 [E] (a13, a2 repeated); compressed-tensors keeps its loaded
//                 w13_weight_global_scale / w13_input_global_scale [E, 2] and w2_* [E].
//
//   trtllm-mxfp4  gpt-oss MXFP4 on FLASHINFER_TRTLLM_MXFP4_BF16 (bf16 activations, the default
//                 _get_priority_backends_for_gpt_oss picks on sm100): GptOssMxfp4MoEMethod's
//                 loader copies the checkpoint into parameters padded to Hp = H rounded up to 256
//                 and Ip = I up to 128 (mxfp4_round_up_hidden_size_and_intermediate_size, zeros
//                 elsewhere, w13's rows in the checkpoint's gate/up interleave), then
//                 convert_gpt_oss_weight_to_mxfp4_moe_kernel_format (fused_moe/oracle/mxfp4.py):
//                 swap_every_two_rows (up0, gate0, up1, gate1, ...), per expert
//                 get_w2_permute_indices_with_cache(., 128) = FlashInfer shuffle_matrix_a's rows
//                 on weights, scales ([.., 16] sf indices: the same rows) and biases, then
//                 nvfp4_block_scale_interleave (128x4) on the scales.
//
//   w13_weight        U8      [E, 2Ip, Hp/2]   e2m1 pairs (even column in the low nibble); physical
//                                              row r holds logical row of shuffle_a_src_row(r, 32)
//                                              in the interleave: pre-row 2j = up j, 2j + 1 = gate
//                                              j (trtllm::gated_w13_prerow), pre-rows 2I.. zero
//   w2_weight         U8      [E, Hp, Ip/2]    rows shuffle_a_src_row(r, 32), rows H.. zero
//   w13_weight_scale  F8_E4M3 [E, 2Ip, Hp/32]  the E8M0 codes (vLLM views them as float8_e4m3fn),
//                                              same row map, then per expert 128x4-interleaved:
//                                              byte(r, b) = trtllm::scale_128x4_offset(r, b, Hp/32)
//   w2_weight_scale   F8_E4M3 [E, Hp, Ip/32]   the same
//   w13_bias          F32     [E, 2Ip]         the bf16 biases as float32, same row map, pads zero
//   w2_bias           F32     [E, Hp]
// Columns past H (w13) / I (w2) are zero codes and zero (2^-127) scales.
#pragma once

#include "formats/codec.h"

namespace moepack {

// ---- trtllm-mxfp4 -------------------------------------------------------------------------------
// Every reason (with the numbers) these experts cannot take the layout; empty when they can:
// vLLM 0.33 only, gpt-oss MXFP4 only (vLLM 0.33 sends compressed-tensors MXFP4 to CUTLASS or
// Marlin, never to this backend), bf16 activations, gated experts, H and I multiples of 32.
std::vector<std::string> trtllm_mxfp4_unsupported_reasons(const LayoutOptions& opts,
                                                          const MoeShape& shape);
std::vector<ParamSpec> trtllm_mxfp4_param_specs(const LayoutOptions& opts, const MoeShape& shape);
std::vector<Tensor> pack_trtllm_mxfp4_moe(const LayoutOptions& opts, const MoeExperts& experts);
// The exact inverse: padding must be zero and every float32 bias a bf16 value (kBadValue).
MoeExperts unpack_trtllm_mxfp4_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
// The row's reader (TargetLayout::make_reader): e2m1 codes of the shuffled rows times their
// swizzled E8M0 scales; act_quant: bf16 (FLASHINFER_TRTLLM_MXFP4_BF16 takes bf16 activations).
reader::ProjReader trtllm_mxfp4_make_reader(const LayoutOptions& opts,
                                            const TensorMap& params_by_name, MoeProj proj,
                                            const ParamLocator& locate);
reader::ActQuant trtllm_mxfp4_act_quant(const LayoutOptions& opts);
std::vector<std::string> trtllm_mxfp4_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeShape& shape);
int64_t trtllm_mxfp4_padded_inter(const LayoutOptions& opts, const MoeShape& shape);

// ---- trtllm-nvfp4 -------------------------------------------------------------------------------
// NVFP4 W4A4 experts (ModelOpt NVFP4, compressed-tensors nvfp4-pack-quantized with 4-bit float
// activations) on FLASHINFER_TRTLLM (vLLM 0.33's first NVFP4 backend on sm100): every reason
// (with the numbers) they cannot take it; empty when they can. Weight-only NVFP4 never goes there.
std::vector<std::string> trtllm_nvfp4_unsupported_reasons(const LayoutOptions& opts,
                                                          const MoeShape& shape);
std::vector<ParamSpec> trtllm_nvfp4_param_specs(const LayoutOptions& opts, const MoeShape& shape);
// Needs the layer's decisions (trtllm_nvfp4_decide_layer): the activation scales a13, a2.
std::vector<Tensor> pack_trtllm_nvfp4_moe(const LayoutOptions& opts, const MoeExperts& experts);
// The inverse up to what vLLM keeps (trtllm_nvfp4_vllm_loaded); refuses (kBadValue) folded
// scales that are not vLLM's products of the scales beside them.
MoeExperts unpack_trtllm_nvfp4_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
// e2m1 codes of the shuffled rows times their swizzled E4M3 scales and second-level scales;
// act_quant: NVFP4 blocks of 16 with the layer's activation scale (ProjReader::act_scale).
reader::ProjReader trtllm_nvfp4_make_reader(const LayoutOptions& opts,
                                            const TensorMap& params_by_name, MoeProj proj,
                                            const ParamLocator& locate);
reader::ActQuant trtllm_nvfp4_act_quant(const LayoutOptions& opts);
std::vector<std::string> trtllm_nvfp4_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeShape& shape);
int64_t trtllm_nvfp4_padded_inter(const LayoutOptions& opts, const MoeShape& shape);
// The layer's activation scales a13 / a2 (decode multipliers), the maximum over all its experts
// as vLLM computes them (amax_for_moe_activation_quant), as "w13_input_scale" /
// "w2_input_scale" -> the float32's bits "0x%08x".
std::map<std::string, std::string> trtllm_nvfp4_decide_layer(const LayoutOptions& opts,
                                                             const MoeShape& shape,
                                                             const LayerExperts& layer);
// What vLLM keeps of ModelOpt experts: each projection's input scales the layer's maximum a, and
// its second-level scales the smallest g with fl(g * a) = fl(g_gate * a) (trtllm::unfold_global);
// compressed-tensors experts as they are.
MoeExperts trtllm_nvfp4_vllm_loaded(const LayoutOptions& opts, const MoeExperts& experts);

// The physical -> logical row map of one projection (-1: padding), out[r] = in[src[r]]: for a
// gated w13 of `inter` real rows per shard padded to `rows` = 2 Ip, the interleave then the
// shuffle; otherwise the shuffle over `rows`, with logical rows below `real_rows`.
std::vector<int32_t> trtllm_fp4_w13_rows(int64_t rows, int64_t inter, bool gated);
std::vector<int32_t> trtllm_fp4_w2_rows(int64_t rows, int64_t real_rows);

}  // namespace moepack
