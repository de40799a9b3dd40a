// vLLM 0.33's Marlin layouts for float experts (weight-only float, 16-bit activations): what
// prepare_fp8_moe_layer_for_marlin / prepare_mxfp8_moe_layer_for_marlin
// (quantization/utils/marlin_utils_fp8.py) leave on a FusedMoE layer, read by the shipped
// moe_wna16_marlin_gemm (fused_moe/experts/marlin_moe.py). docs/marlin_float.md has the diagrams,
// the padding and every scale transform with its vLLM function.
//
// One file pair, one row per family of bytes:
//   marlin-fp8    FP8 e4m3 codes with 128x128 block scales (DeepSeek fp8, compressed-tensors
//                 FP8_BLOCK): Fp8MoEMethod / CompressedTensorsW8A8Fp8MoEMethod on MARLIN
//   marlin-mxfp8  MXFP8 (ModelOpt, compressed-tensors): e4m3 codes, E8M0 scales per 32 along K
//   marlin-nvfp4  NVFP4 (ModelOpt, compressed-tensors): e2m1 codes, E4M3 scales per 16 along K
//                 and a global scale: prepare_nvfp4_moe_layer_for_marlin (marlin_utils_fp4.py)
//   marlin-mxfp4  MXFP4 (compressed-tensors): e2m1 codes, E8M0 scales per 32 along K:
//                 prepare_moe_fp4_layer_for_marlin (marlin_utils_fp4.py)
//
//   w13_weight  I32 [E, H/16, 2Ip*16/pf]  Marlin tiles (docs/marlin.md "Weight tiles", the int8
//   w2_weight   I32 [E, Ip/16, H*16/pf]   map, pf = 4) of the raw e4m3 bytes, no bias or sign
//   change FP8:   w13_weight_scale_inv (Fp8MoEMethod) / w13_weight_scale (compressed-tensors)
//            act dtype [E, H/128, 2Ip]: each block scale rounded to the activation dtype,
//            repeated over the block's 128 output columns, 64-permuted (32-permuted with one
//            group), times 2^120 (bf16) / 2^8 (fp16) -- fp8_fused_exponent_bias_into_scales
//          w2_weight_scale(_inv) act dtype [E, Ip/128, H], the same
//   MXFP8: w13_weight_scale F8_E8M0 [E, H/32, 2Ip]: codes transposed to [G, N], 64-permuted,
//            then every 4 values stored as (0, 2, 1, 3) (mxfp8_marlin_process_scales)
//          w2_weight_scale  F8_E8M0 [E, Ip/32, H]
//   NVFP4: w13_weight I32 [E, H/16, 2Ip*2] / w2_weight I32 [E, Ip/16, 2H]: the int4 map on the
//            e2m1 nibbles (pf = 8)
//          w13_weight_scale F8_E4M3 [E, H/16, 2Ip]: the block scales times the layer's 2^k
//            (_nvfp4_compute_scale_factor, bf16 only), 64-permuted, pair-swapped, as "S0E5M3"
//            bytes: bits 14..7 of the fp16 value scale * 2^(k+7), 0 below 2
//            (nvfp4_marlin_process_scales); w2_weight_scale F8_E4M3 [E, Ip/16, H]
//          w13_weight_scale_2 / w2_weight_scale_2 F32 [E]: the decode global (the gate's for
//            w13; 1/G for compressed-tensors) times 2^119 (bf16) / 2^7 (fp16), divided by 2^k
//   MXFP4: weights as NVFP4; w13_weight_scale F8_E8M0 [E, H/32, 2I], w2_weight_scale
//            [E, I/32, H]: the codes permuted and pair-swapped (mxfp4_marlin_process_scales)
// Ip is the padded intermediate (marlin_moe_padded_intermediate): FP8 block I (vLLM takes I %
// block_n == 0 only), MXFP8 the next multiple of 64. Padding is zero codes and zero scales: each
// gate/up shard of w13 gets Ip - I rows at its end, w2 Ip - I columns of K.
#pragma once

#include "formats/codec.h"

namespace moepack {

// ---- marlin-fp8 ---------------------------------------------------------------------------------
std::vector<std::string> marlin_fp8_unsupported_reasons(const LayoutOptions& opts,
                                                        const MoeShape& shape);
std::vector<ParamSpec> marlin_fp8_param_specs(const LayoutOptions& opts, const MoeShape& shape);
std::vector<Tensor> pack_marlin_fp8_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_marlin_fp8_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
reader::ProjReader marlin_fp8_make_reader(const LayoutOptions& opts,
                                          const TensorMap& params_by_name, MoeProj proj,
                                          const ParamLocator& locate);
std::vector<std::string> marlin_fp8_deviations_from_vllm(const LayoutOptions& opts,
                                                         const MoeShape& shape);
int64_t marlin_fp8_padded_inter(const LayoutOptions& opts, const MoeShape& shape);
// Per-tensor FP8 sources (compressed-tensors tensor, ModelOpt FP8) of a gated layer: w13
// requantised to one scale per expert as vLLM 0.33 does before prepare_fp8_moe_layer_for_marlin
// (process_fp8_weight_tensor_strategy_moe); any other source as it is.
MoeExperts marlin_fp8_vllm_loaded(const LayoutOptions& opts, const MoeExperts& experts);

// ---- marlin-mxfp8 -------------------------------------------------------------------------------
std::vector<std::string> marlin_mxfp8_unsupported_reasons(const LayoutOptions& opts,
                                                          const MoeShape& shape);
std::vector<ParamSpec> marlin_mxfp8_param_specs(const LayoutOptions& opts, const MoeShape& shape);
std::vector<Tensor> pack_marlin_mxfp8_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_marlin_mxfp8_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
reader::ProjReader marlin_mxfp8_make_reader(const LayoutOptions& opts,
                                            const TensorMap& params_by_name, MoeProj proj,
                                            const ParamLocator& locate);
std::vector<std::string> marlin_mxfp8_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeShape& shape);
int64_t marlin_mxfp8_padded_inter(const LayoutOptions& opts, const MoeShape& shape);

// ---- marlin-nvfp4 -------------------------------------------------------------------------------
std::vector<std::string> marlin_nvfp4_unsupported_reasons(const LayoutOptions& opts,
                                                          const MoeShape& shape);
std::vector<ParamSpec> marlin_nvfp4_param_specs(const LayoutOptions& opts, const MoeShape& shape);
std::vector<Tensor> pack_marlin_nvfp4_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_marlin_nvfp4_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
reader::ProjReader marlin_nvfp4_make_reader(const LayoutOptions& opts,
                                            const TensorMap& params_by_name, MoeProj proj,
                                            const ParamLocator& locate);
std::vector<std::string> marlin_nvfp4_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeShape& shape);
int64_t marlin_nvfp4_padded_inter(const LayoutOptions& opts, const MoeShape& shape);
// The layer's rescale factor per projection (layer decisions "w13_nvfp4_scale_factor_log2" /
// "w2_..."), from the largest positive block scale over every expert (_nvfp4_compute_scale_factor).
std::map<std::string, std::string> marlin_nvfp4_decide_layer(const LayoutOptions& opts,
                                                             const MoeShape& shape,
                                                             const LayerExperts& layer);

// ---- marlin-mxfp4 -------------------------------------------------------------------------------
// Two source methods, one row: compressed-tensors MXFP4 (prepare_moe_fp4_layer_for_marlin, no
// padding) and gpt-oss' MXFP4 (GptOssMxfp4MoEMethod on MARLIN: the loader copies the checkpoint
// into parameters padded to Hp = H rounded up to 256 and Ip = I up to 128, w13's rows kept in the
// checkpoint's gate/up interleave (row 2j gate j, 2j + 1 up j, rows 2I.. zero), then
// prepare_moe_mxfp4_layer_for_marlin, whose tiles and scales are those above on the padded
// extents, adds the biases:
//   w13_bias BF16 [E, 2Ip]  each expert's interleaved, zero-padded bias, every 32 values permuted
//   w2_bias  BF16 [E, Hp]   by marlin_permute_bias (scale_perm_single)
std::vector<std::string> marlin_mxfp4_unsupported_reasons(const LayoutOptions& opts,
                                                          const MoeShape& shape);
std::vector<ParamSpec> marlin_mxfp4_param_specs(const LayoutOptions& opts, const MoeShape& shape);
std::vector<Tensor> pack_marlin_mxfp4_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_marlin_mxfp4_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
reader::ProjReader marlin_mxfp4_make_reader(const LayoutOptions& opts,
                                            const TensorMap& params_by_name, MoeProj proj,
                                            const ParamLocator& locate);
std::vector<std::string> marlin_mxfp4_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeShape& shape);
int64_t marlin_mxfp4_padded_inter(const LayoutOptions& opts, const MoeShape& shape);

// Every float Marlin row: 16-bit activations in the activation dtype (fused_marlin_moe takes the
// hidden states as they are).
reader::ActQuant marlin_float_act_quant(const LayoutOptions& opts);

// Whether vLLM 0.33's shipped Marlin MoE kernel has a thread configuration for a GEMM with
// output size n and reduction size k: (thread_n, thread_k) in {(64, 128), (128, 64), (128, 128),
// (256, 64)}, i.e. n % 64 == 0 and k % 128 == 0, or n % 128 == 0 and k % 64 == 0 (read from
// the PTX of the wheel's _moe_C; "Invalid thread config" otherwise, checked on an H100).
bool marlin_float_gemm_runs(int64_t n, int64_t k);

}  // namespace moepack
