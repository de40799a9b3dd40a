// triton-mxfp4: gpt-oss' MXFP4 experts as vLLM 0.33.0 hands them to the OAI Triton kernels
// (matmul_ogs, vendored at vllm/third_party/triton_kernels) on Hopper (sm90): what
// GptOssMxfp4MoEMethod leaves when its oracle picks Mxfp4MoeBackend.TRITON
// (convert_gpt_oss_weight_to_mxfp4_moe_kernel_format, fused_moe/oracle/mxfp4.py, whose
// _swizzle_mxfp4 runs quantization/utils/mxfp4_utils.py with num_warps 8). docs/triton_mxfp4.md.
//
// Ip = I rounded up to 64 (mxfp4_round_up_hidden_size_and_intermediate_size: TRITON on CUDA; H is
// not rounded); the loader copies the checkpoint into the leading rows / columns of zeros and
// keeps w13's rows in the checkpoint's gate/up interleave (row 2j gate j, 2j + 1 up j). Per
// expert, M output rows of K/2 bytes (two e2m1 codes a byte, low nibble first) and E8M0 scales
// [M, K/32] become (formats/layout/triton_mxfp4_layout.h):
//   w13_weight        U8  [E, 2Ip/4, kbp(H)*4]        HopperMXValueLayout of [2Ip, H/2] bytes
//   w2_weight         U8  [E, Hp16/4, kbp(Ip)*4]      ... of [H, Ip/2] bytes
//   w13_weight_scale  U8  [E, msp(2Ip)/32, gp(H/32)*32]   HopperMXScaleLayout of [2Ip, H/32]
//   w2_weight_scale   U8  [E, msp(H)/32, gp(Ip/32)*32]    ... of [H, Ip/32]
//   w13_bias          F32 [E, 2Ip]   the interleaved bias, .to(torch.float32)
//   w2_bias           F32 [E, H]
// kbp(k) = k/2 rounded up to 32 bytes, Hp16 = H rounded up to 16, msp(m) = m rounded up to 256
// (32 * num_warps), gp(g) = g rounded up to 4 (sm90's pad of the scale groups, vLLM #47303).
// The weights and scales are the contiguous buffers whose transposes (.mT) are the triton
// Tensors' storage vLLM holds (layer.w13_weight, the PrecisionConfig's weight_scale).
#pragma once

#include <string>
#include <vector>

#include "formats/codec.h"
#include "formats/layout/moe_reader.h"

namespace moepack {

std::vector<std::string> triton_mxfp4_unsupported_reasons(const LayoutOptions& opts,
                                                          const MoeShape& shape);
std::vector<ParamSpec> triton_mxfp4_param_specs(const LayoutOptions& opts, const MoeShape& shape);
std::vector<Tensor> pack_triton_mxfp4_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_triton_mxfp4_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
reader::ProjReader triton_mxfp4_make_reader(const LayoutOptions& opts,
                                            const TensorMap& params_by_name, MoeProj proj,
                                            const ParamLocator& locate);
// bf16 activations (GptOssMxfp4Config takes bf16 only; matmul_ogs multiplies them as they are).
reader::ActQuant triton_mxfp4_act_quant(const LayoutOptions& opts);
std::vector<std::string> triton_mxfp4_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeShape& shape);
int64_t triton_mxfp4_padded_inter(const LayoutOptions& opts, const MoeShape& shape);
// The shapes vLLM 0.33's matmul_ogs does not run on Hopper although its oracle picks TRITON for
// every gpt-oss layer on sm90 (OAITritonExperts checks no shape): a GEMM output N <= 128 (does not
// compile) and H % 64 != 0 (a wrong product). Part of triton_mxfp4_unsupported_reasons.
std::vector<std::string> triton_mxfp4_kernel_failures(const LayoutOptions& opts,
                                                      const MoeShape& shape);

}  // namespace moepack
