// FP8 checkpoints with one scale per output channel or per tensor (no blocks) <-> QuantTensor.
//
//   compressed-tensors float-quantized, weights strategy "channel" (FP8_DYNAMIC):
//     weight        F8_E4M3 [N, K]
//     weight_scale  F32 / BF16 / F16 [N, 1]        x[n, k] = e4m3(w[n, k]) * s[n]
//   compressed-tensors float-quantized, weights strategy "tensor" (FP8, static activations):
//     weight        F8_E4M3 [N, K]
//     weight_scale  F32 / BF16 / F16 [1]           x[n, k] = e4m3(w[n, k]) * s
//     input_scale   F32 / BF16 / F16 [1]           (static activations: not read by Marlin)
//   ModelOpt FP8 (quant_algo FP8):
//     weight        F8_E4M3 [N, K]
//     weight_scale  F32 []  (0-d; [1] accepted, as vLLM's _to_scalar does)
//     input_scale   F32 []
//
// Canonical: kind kFp8E4M3, bits 8, group_size -1 (one group over K), scale_block_n 1, the scale
// dtype as stored. A per-tensor scale becomes one scale per row, all equal (so a stacked w13
// holds the gate's on its first I rows and the up's on the next I, as vLLM's w13_weight_scale
// [E, 2] does); pack writes the one value back and refuses rows that differ.
// Mirrors vLLM 0.33's CompressedTensorsW8A8Fp8MoEMethod.create_weights (channel / tensor) and
// ModelOptFp8MoEMethod.create_weights; compressed-tensors' FloatQuantizationCompressor.
#pragma once

#include "formats/codec.h"

namespace moepack {

// compressed-tensors FP8 channel.
std::vector<std::string> ct_fp8_channel_required_suffixes(const QuantParams& p);
std::vector<std::string> ct_fp8_channel_optional_suffixes(const QuantParams& p);
QuantTensor unpack_ct_fp8_channel(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                                  int64_t k);
TensorMap pack_ct_fp8_channel(const QuantParams& p, const QuantTensor& q);
std::vector<std::string> ct_fp8_channel_refusals(const QuantParams& p);
std::vector<QuantParams> ct_fp8_channel_param_space();

// compressed-tensors FP8 tensor and ModelOpt FP8 (per-tensor weight and input scales).
std::vector<std::string> fp8_tensor_required_suffixes(const QuantParams& p);
std::vector<std::string> fp8_tensor_optional_suffixes(const QuantParams& p);
QuantTensor unpack_fp8_tensor(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                              int64_t k);
TensorMap pack_fp8_tensor(const QuantParams& p, const QuantTensor& q);
std::vector<std::string> fp8_tensor_refusals(const QuantParams& p);
std::vector<QuantParams> ct_fp8_tensor_param_space();
std::vector<QuantParams> modelopt_fp8_param_space();

// The canonical encoding of both: e4m3 codes, one scale per row in the stored dtype (the model
// dtype for compressed-tensors, F32 for ModelOpt).
QuantSpec fp8_scaled_spec_for(const QuantParams& p);

}  // namespace moepack
