// vLLM 0.33's Humming WNA16 MoE layout on SM90 (humming-kernels 0.1.19): GPTQ / AWQ /
// compressed-tensors pack-quantized int4 and int8 experts, 16-bit activations, as vLLM 0.33's
// convert_to_humming_moe_kernel_format (quantization/utils/humming/moe.py) leaves them on the
// layer, plus the LayerConfig per sublayer that Humming's kernel is called with. docs/humming.md
// has the diagrams; /work/notes/humming_spec.md the sources.
//
// Per sublayer (w13: N = 2I gated [gate; up] or I, K = H; w2: N = H, K = I), E local experts,
// b bits, g group size, Np = roundup(N, 256), Kp = roundup(K, 128) (zero padding at the END of
// the stacked N and of K, after gate|up), Gp = Kp / g:
//
//   <sub>_weight       I32 [E, Kp/16, Np*16*b/32]  Marlin's 16x64 tiles (formats/layout/
//                                                  marlin_layout.h) of the codes below
//   <sub>_weight_scale act [E, Gp, Np]             transposed, 64-permuted (Marlin grouped)
//   <sub>_zero_point   I32 [E, Gp, Np*b/32]        (AWQ, CT asymmetric) zero codes transposed,
//                                                  64-permuted, packed IN ORDER (no interleave)
//
// The codes the tiles hold, per sublayer:
//   - sign-magnitude float{b}e0m{b-1} where the sublayer is symmetric and none of its codes (all
//     local experts, all N, all K) is 0 (HummingWeightSchema.convert_symmetric_integer_weight):
//     c' = |c - 2^(b-1)| | (c < 2^(b-1)) << (b-1); a decision of the WHOLE layer (of a rank's
//     share of it in a tensor- or expert-parallel output: each rank of vLLM decides on its
//     slice), made once by humming_decide_layer and carried in LayoutOptions::layer_decisions
//     ("w13_b_dtype",
//     "w2_b_dtype": "uint4" / "uint8" / "float4e0m3" / "float8e0m7");
//   - else for bf16 activations and 8-bit codes the int2fp preprocessing of weight_repack_nk:
//     c' = c >= z ? c - z : 2^b - 1 - c, z = the zero code of (n, group) or 2^(b-1), applied
//     after padding (padding codes of a symmetric sublayer become 255);
//   - else the offset-binary codes as they are.
// Weight W[n, k] = (c - z) * s, or for sign-magnitude (-1)^sign * magnitude * s.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "formats/codec.h"

namespace moepack {

// The humming-kernels release whose layout and LayerConfig this writes (vLLM 0.33.0's pin
// humming-kernels[cu13]==0.1.19), and the one SM it writes them for (the LayerConfig names the
// target arch's SM, and Humming refuses one of another SM: LayerConfig.check_device).
inline constexpr const char* kHummingKernelsPackage = "humming-kernels";
inline constexpr const char* kHummingKernelsVersion = "0.1.19";
inline constexpr int kHummingSmVersion = 90;

std::vector<Tensor> pack_humming_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_humming_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
std::vector<ParamSpec> humming_param_specs(const LayoutOptions& opts, const MoeShape& shape);
std::vector<std::string> humming_deviations_from_vllm(const LayoutOptions& opts,
                                                      const MoeShape& shape);

// Everything vLLM 0.33's Humming path (or this layout) cannot take for experts of this shape, one
// sentence with the numbers per reason; empty = supported. Refused with the stock vLLM reason:
// GPTQ channelwise (LayerConfig asserts weight_scale_group_size > 0), compressed-tensors channel
// strategy (CompressedTensorsWNA16MoEMethod asserts strategy == "group" off Marlin), act-order,
// and the GPTQ / AWQ layers vLLM routes through MoeWNA16Method instead.
std::vector<std::string> humming_unsupported_reasons(const LayoutOptions& opts,
                                                     const MoeShape& shape);

// The per-layer code decision (TargetLayout::decide_layer): for each projection, "float4e0m3" /
// "float8e0m7" when it is symmetric and no code of any expert is 0, else "uint4" / "uint8".
// Reads experts from `layer` until both projections hold a code 0 (usually in expert 0).
std::map<std::string, std::string> humming_decide_layer(const LayoutOptions& opts,
                                                        const MoeShape& shape,
                                                        const LayerExperts& layer);

// What Humming's runtime needs beside the parameters (TargetLayout::layer_config), in this order:
//   kernel_package "humming-kernels", kernel_version "0.1.19", sm_version "90",
//   w13_layer_config / w2_layer_config: exactly LayerConfig.to_str() (the JSON string vLLM passes
//     to humming_gemm and keys the kernel JIT with),
//   w13_weight_schema / w2_weight_schema: the final HummingWeightSchema's fields as a JSON object
//     (HummingWeightSchema(**json) rebuilds it), input_schema: "{}" (HummingInputSchema()).
std::vector<std::pair<std::string, std::string>> humming_layer_config(const LayoutOptions& opts,
                                                                      const MoeShape& shape);
// LayerConfig.to_str() of one sublayer (humming_spec §5).
std::string humming_layer_config_json(const LayoutOptions& opts, const MoeShape& shape,
                                      MoeProj proj);

// The b_dtype name of `bits`-bit codes, recoded (sign-magnitude) or not.
std::string humming_b_dtype_name(int bits, bool recoded);

// The layer as unpack and the reader validate it (same errors).
struct HummingLayerView {
  struct Proj {
    int64_t n = 0, k = 0;    // real (logical) sizes
    int64_t np = 0, kp = 0;  // as the parameters carry them
    int64_t groups = 0, groups_p = 0;
    bool recoded = false;  // sign-magnitude codes (layer decision)
    bool int2fp = false;   // int2fp-preprocessed codes
  };
  Proj proj[2];  // w13, w2
  int64_t experts = 0, hidden = 0, inter = 0, group_size = 0;
  int bits = 4;
  bool zero_points = false;
};
HummingLayerView humming_read_layer(const LayoutOptions& opts, const TensorMap& params_by_name);
// The row's reader (TargetLayout::make_reader): Marlin's tiles through the code map of the
// projection (sign-magnitude, int2fp or plain), the 64-permuted scales and in-order zero points;
// the padding hidden. act_quant: the activation dtype (16-bit activations, vLLM's default
// HummingInputSchema()).
reader::ProjReader humming_make_reader(const LayoutOptions& opts, const TensorMap& params_by_name,
                                       MoeProj proj, const ParamLocator& locate);
reader::ActQuant humming_act_quant(const LayoutOptions& opts);

}  // namespace moepack
