// FP4 (e2m1) checkpoint Linears <-> QuantTensor, and their quantisers (docs/nvfp4.md,
// docs/mxfp4.md). Two e2m1 codes per byte, the even k in the low nibble:
//
//   byte j of row n = code(n, 2j) | code(n, 2j + 1) << 4        code = S EE M (bias 1)
//
//   ModelOpt NVFP4 (quant_algo NVFP4 / W4A16_NVFP4; modelopt NVFP4QTensor, vLLM
//   ModelOptNvFp4FusedMoE):
//     weight          U8      [N, K/2]
//     weight_scale    F8_E4M3 [N, K/16]   block scale s of the 16 codes k in [16b, 16b + 16)
//     weight_scale_2  F32     [] or [1]   g, a decode multiplier: x = e2m1 * (s * g)
//     input_scale     F32     [] or [1]   W4A4 (quant_algo NVFP4) only: the activations' global
//                                         scale a, a decode multiplier (QuantTensor::input_scales)
//   compressed-tensors nvfp4-pack-quantized (NVFP4PackedCompressor; vLLM
//   CompressedTensorsW4A4Nvfp4MoEMethod):
//     weight_packed        U8      [N, K/2]
//     weight_scale         F8_E4M3 [N, K/16]
//     weight_global_scale  F32     [1]      g, an encode divisor: x = e2m1 * (s / g)
//     input_global_scale   F32     [1]      W4A4 only: 1 / a, an encode divisor
//   A W4A4 config (QuantParams::dynamic_input false) requires the activation scale and sets
//   QuantSpec::input_global_scale; layouts whose kernels take 16-bit activations ignore it.
//   compressed-tensors mxfp4-pack-quantized (MXFP4PackedCompressor; vLLM
//   CompressedTensorsW4A4Mxfp4MoEMethod):
//     weight_packed  U8          [N, K/2]
//     weight_scale   U8/F8_E8M0  [N, K/32]  E8M0 code c: x = e2m1 * 2^(c - 127)
//   gpt-oss MXFP4 (openai/gpt-oss-*, quant_method "mxfp4"; transformers integrations/mxfp4.py
//   _convert_moe_packed_tensors, vLLM models/gpt_oss.py _load_weights_mxfp4): fused 3-D experts,
//   <proj>_blocks U8 [E, N, K/32, 16] and <proj>_scales U8 [E, N, K/32]. The codec reads one
//   expert's slice (model/checkpoint.cpp cuts it and de-interleaves gate/up, docs/gpt-oss.md):
//     blocks  U8 [N, K/32, 16]  byte j of block b = code(n, 32b + 2j) | code(n, 32b + 2j + 1) << 4
//     scales  U8 [N, K/32]      E8M0 code c: x = e2m1 * 2^(c - 127)
//
// Canonical: kind kFp4E2M1 (one code per byte), bits 4, group 16 with F8_E4M3 scales and a
// GlobalScale (kDecodeMultiplier / kEncodeDivisor, the stored float kept bit for bit), or group
// 32 with U8 E8M0 scales. unpack refuses (kBadValue) NaN block scales (e4m3 0x7f / 0xff), E8M0
// code 255, and a global scale that is zero, negative, NaN or infinite.
#pragma once

#include "formats/codec.h"

namespace moepack {

// ModelOpt NVFP4.
std::vector<std::string> modelopt_nvfp4_required_suffixes(const QuantParams& p);
std::vector<std::string> modelopt_nvfp4_optional_suffixes(const QuantParams& p);
QuantTensor unpack_modelopt_nvfp4(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                                  int64_t k);
TensorMap pack_modelopt_nvfp4(const QuantParams& p, const QuantTensor& q);
QuantSpec modelopt_nvfp4_spec_for(const QuantParams& p);
std::pair<int64_t, int64_t> modelopt_nvfp4_logical_shape(
    const QuantParams& p, const std::map<std::string, TensorView>& by_suffix);
std::vector<QuantParams> modelopt_nvfp4_param_space();

// compressed-tensors nvfp4-pack-quantized.
std::vector<std::string> ct_nvfp4_required_suffixes(const QuantParams& p);
std::vector<std::string> ct_nvfp4_optional_suffixes(const QuantParams& p);
QuantTensor unpack_ct_nvfp4(const QuantParams& p, const TensorMap& by_suffix, int64_t n, int64_t k);
TensorMap pack_ct_nvfp4(const QuantParams& p, const QuantTensor& q);
QuantSpec ct_nvfp4_spec_for(const QuantParams& p);
std::vector<QuantParams> ct_nvfp4_param_space();

// compressed-tensors mxfp4-pack-quantized.
std::vector<std::string> ct_mxfp4_required_suffixes(const QuantParams& p);
std::vector<std::string> ct_mxfp4_optional_suffixes(const QuantParams& p);
QuantTensor unpack_ct_mxfp4(const QuantParams& p, const TensorMap& by_suffix, int64_t n, int64_t k);
TensorMap pack_ct_mxfp4(const QuantParams& p, const QuantTensor& q);
QuantSpec ct_mxfp4_spec_for(const QuantParams& p);
std::vector<QuantParams> ct_mxfp4_param_space();

// gpt-oss MXFP4: one expert's slice of <proj>_blocks / <proj>_scales.
std::vector<std::string> gpt_oss_mxfp4_required_suffixes(const QuantParams& p);
std::vector<std::string> gpt_oss_mxfp4_optional_suffixes(const QuantParams& p);
QuantTensor unpack_gpt_oss_mxfp4(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                                 int64_t k);
TensorMap pack_gpt_oss_mxfp4(const QuantParams& p, const QuantTensor& q);
QuantSpec gpt_oss_mxfp4_spec_for(const QuantParams& p);
std::pair<int64_t, int64_t> gpt_oss_mxfp4_logical_shape(
    const QuantParams& p, const std::map<std::string, TensorView>& by_suffix);
std::vector<QuantParams> gpt_oss_mxfp4_param_space();

// (N, K) of a compressed-tensors FP4 Linear: weight_packed [N, K/2].
std::pair<int64_t, int64_t> ct_fp4_logical_shape(
    const QuantParams& p, const std::map<std::string, TensorView>& by_suffix);

// Nearest e2m1 code of x (ties to the even code, as the producers' rounding does; saturating at
// +-6; NaN is refused by the callers). The sign of x is kept (-0 is code 8).
uint8_t float_to_e2m1(float x);

// Quantises float weights [N, K] (K % 16 == 0) to NVFP4 with the decode global scale g
// (> 0, finite): block scale s = e4m3(amax / 6 / g) (saturating at 448), codes e2m1(x / (s * g))
// (code 0 where s * g is 0). `convention` kDecodeMultiplier stores g, kEncodeDivisor stores
// 1 / g (then the stored value decodes as s / (1 / g); the codes are computed from it).
QuantTensor quantize_nvfp4(const float* w, int64_t n, int64_t k, float g, GlobalScale convention);

// Quantises float weights [N, K] (K % 32 == 0) to MXFP4 (OCP MX v1.0 §6.3): E8M0 code
// c = clamp(floor(log2(amax)) - 2 + 127, 0, 254) per block of 32, codes e2m1(x / 2^(c - 127)).
QuantTensor quantize_mxfp4(const float* w, int64_t n, int64_t k);

}  // namespace moepack
