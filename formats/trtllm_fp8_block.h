// FlashInfer TRT-LLM-Gen DeepSeek FP8 block MoE layout (spec/mxfp8_trtllm.md §5). Mirrors vLLM
// prepare_fp8_moe_layer_for_fi(is_trtllm=True) for block quant: swap_w13_to_w31 on weights and
// scale rows -> _shuffle_deepseek_fp8_moe_weights (FlashInfer shuffle_matrix_a(., 64) then
// convert_to_block_layout(., 128)) -> scales clamp_(min=1e-10). Parameter names follow
// Fp8MoEMethod (weight_scale_name "weight_scale_inv" for block quant).
//
//   w13_weight           F8_E4M3 [E, H/128, 2I, 128]  BlockMajorK: [kb][r][j] = W'[r, kb*128 + j]
//                        where W' = rows of [up; gate] (W31) gathered by shuffle_matrix_a(2I, 64)
//                        (16-row blocks: src[r] = (r - w) + (w%8)*2 + w/8, w = r % 16)
//   w2_weight            F8_E4M3 [E, I/128, H, 128]   same with shuffle_matrix_a(H, 64), no swap
//   w13_weight_scale_inv F32 [E, 2I/128, H/128]       W31-swapped scale rows, not shuffled
//   w2_weight_scale_inv  F32 [E, H/128, I/128]        as in the checkpoint
// The scale of physical weight row r is scale row shuffle_matrix_a_rows(M, 64)[r] / 128.
// Non-gated (opts.gated == false): w13 has I rows, no swap.
// vLLM clamps scales to >= 1e-10; a clamp cannot be inverted, so pack refuses (kBadValue) any
// scale below 1e-10 (and NaN / Inf / negative ones) and the layout stays exactly invertible.
#pragma once

#include "formats/codec.h"
#include "formats/trtllm_mxfp8.h"

namespace moepack {

std::vector<Tensor> pack_trtllm_fp8_block_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_trtllm_fp8_block_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
// Every reason (with numbers) these experts cannot take this layout; empty when they can:
// H and I multiples of 128 (BlockMajorK along H and I, W31 swap of whole 128-row scale blocks)
// and both projections FP8 128x128 block (e4m3, group 128, scale_block_n 128, F32 scales).
std::vector<std::string> trtllm_fp8_block_unsupported_reasons(const LayoutOptions& opts,
                                                              const MoeShape& shape);
// The parameters as unpack checks them (same errors, finite non-negative scales included), for
// the layout's reader (its make_reader).
TrtllmLayerView trtllm_fp8_block_read_layer(const LayoutOptions& opts,
                                            const TensorMap& params_by_name);
// The row's reader (TargetLayout::make_reader): e4m3 codes of the BlockMajorK, shuffled (and
// for gated w13 W31-swapped) rows times their float 128x128 block scales; act_quant: vLLM's
// per-token-group (128) FP8 quantisation of the activations.
reader::ProjReader trtllm_fp8_block_make_reader(const LayoutOptions& opts,
                                                const TensorMap& params_by_name, MoeProj proj,
                                                const ParamLocator& locate);
reader::ActQuant trtllm_fp8_block_act_quant(const LayoutOptions& opts);
// The smallest scale vLLM leaves unclamped (_FI_CUTLASS_MIN_BLOCK_SCALE, as float32).
constexpr float kTrtllmFp8BlockMinScale = 1e-10f;

std::vector<ParamSpec> trtllm_fp8_block_param_specs(const LayoutOptions& opts,
                                                    const MoeShape& shape);
std::vector<std::string> trtllm_fp8_block_deviations_from_vllm(const LayoutOptions& opts,
                                                               const MoeShape& shape);

}  // namespace moepack
