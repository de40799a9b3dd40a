// The explicit registry tables (STYLE.md §1): tables, not self-registering statics that a
// static link could drop. A new format is its codec file pair plus one row here (and one
// normaliser row in model/hf_config.cpp, one generator row in synth/synth.cpp);
// docs/architecture.md has the checklist.
#include <algorithm>
#include <cctype>
#include <numeric>

#include "formats/awq.h"
#include "formats/codec.h"
#include "formats/compressed_tensors.h"
#include "formats/fp4.h"
#include "formats/fp8_block.h"
#include "formats/fp8_scaled.h"
#include "formats/gptq.h"
#include "formats/humming.h"
#include "formats/marlin.h"
#include "formats/marlin_float.h"
#include "formats/mxfp8.h"
#include "formats/parallel.h"
#include "formats/triton_int8.h"
#include "formats/triton_mxfp4.h"
#include "formats/triton_wna16.h"
#include "formats/trtllm_fp4.h"
#include "formats/trtllm_fp8_block.h"
#include "formats/trtllm_mxfp8.h"
#include "formats/vllm_backends.h"

namespace moepack {

namespace {

// Every quantization method's name, and a scheme label for the methods no codec reads.
struct QuantMethodRow {
  QuantMethod method;
  const char* name;
  const char* scheme_without_codec;
};
const std::vector<QuantMethodRow>& quant_method_rows() {
  static const std::vector<QuantMethodRow> rows = {
      {QuantMethod::kNone, "none", "unquantized"},
      {QuantMethod::kGptq, "gptq", nullptr},
      {QuantMethod::kAwq, "awq", nullptr},
      {QuantMethod::kCtPackQuantized, "compressed-tensors-pack-quantized", nullptr},
      {QuantMethod::kCtIntQuantized, "compressed-tensors-int-quantized", nullptr},
      {QuantMethod::kCtMxfp8, "compressed-tensors-mxfp8", nullptr},
      {QuantMethod::kModeloptMxfp8, "modelopt-mxfp8", nullptr},
      {QuantMethod::kModeloptFp8, "modelopt-fp8", nullptr},
      {QuantMethod::kFp8Block, "fp8-block", nullptr},
      {QuantMethod::kCtFp8Block, "compressed-tensors-fp8-block", nullptr},
      {QuantMethod::kModeloptNvfp4, "modelopt-nvfp4", nullptr},
      {QuantMethod::kCtNvfp4, "compressed-tensors-nvfp4", nullptr},
      {QuantMethod::kCtMxfp4, "compressed-tensors-mxfp4", nullptr},
      {QuantMethod::kGptOssMxfp4, "gpt-oss-mxfp4", nullptr},
      {QuantMethod::kCtFp8Channel, "compressed-tensors-fp8-channel", nullptr},
      {QuantMethod::kCtFp8Tensor, "compressed-tensors-fp8-tensor", nullptr},
  };
  return rows;
}

std::pair<int64_t, int64_t> weight_logical_shape(
    const QuantParams&, const std::map<std::string, TensorView>& by_suffix) {
  const Shape& s = linear_tensor_shape(by_suffix, "weight");  // [N, K]
  return {s[0], s[1]};
}

QuantParams mxfp8_target_params(DType model_dtype) {
  QuantParams q = mxfp8_param_space().front();  // ModelOpt MXFP8: bits 8, blocks of 32
  q.dtype = model_dtype;
  return q;
}

std::vector<QuantParams> ct_mxfp8_param_space() {
  std::vector<QuantParams> v = mxfp8_param_space();
  for (auto& p : v) p.method = QuantMethod::kCtMxfp8;
  return v;
}

// Named fields (designated initialisers, in SourceCodec's declaration order): an optional hook
// left out is nullptr.
std::vector<SourceCodec> int_and_fp8_codecs() {
  return {
      {.name = "gptq",
       .method = QuantMethod::kGptq,
       .scheme = "wna16",
       .description = "gptq (4/8-bit, sym; asym for triton-wna16; desc_act; gptq and gptq_v2)",
       .spec_for = gptq_spec_for,
       .logical_shape = gptq_logical_shape,
       .refine = gptq_refine,
       .has_act_order = gptq_has_act_order,
       .required_suffixes = gptq_required_suffixes,
       .optional_suffixes = gptq_optional_suffixes,
       .unpack = unpack_gptq,
       .pack = pack_gptq,
       .param_space = gptq_param_space,
       .params_shown = {"group_size", "symmetric", "act_order", "gptq_format", "actorder"}},
      {.name = "awq",
       .method = QuantMethod::kAwq,
       .scheme = "wna16",
       .description = "awq (4-bit gemm with zero points)",
       .spec_for = awq_spec_for,
       .logical_shape = awq_logical_shape,
       .required_suffixes = awq_required_suffixes,
       .optional_suffixes = awq_optional_suffixes,
       .unpack = unpack_awq,
       .pack = pack_awq,
       .param_space = awq_param_space,
       .params_shown = {"group_size", "symmetric", "act_order", "actorder"}},
      {.name = "ct-pack-quantized",
       .method = QuantMethod::kCtPackQuantized,
       .scheme = "wna16",
       .description = "compressed-tensors pack-quantized (W4A16/W8A16, group/channel, actorder)",
       .spec_for = ct_pack_spec_for,
       .logical_shape = ct_pack_logical_shape,
       .has_act_order = ct_pack_has_act_order,
       .required_suffixes = ct_pack_required_suffixes,
       .optional_suffixes = ct_pack_optional_suffixes,
       .unpack = unpack_ct_pack,
       .pack = pack_ct_pack,
       .param_space = ct_pack_param_space,
       .params_shown = {"group_size", "symmetric", "act_order", "actorder"}},
      {.name = "ct-int-quantized",
       .method = QuantMethod::kCtIntQuantized,
       .scheme = "w8a8-int8",
       .description = "compressed-tensors int-quantized (W8A8 int8, channel, dynamic tokens)",
       .spec_for = ct_int8_spec_for,
       .logical_shape = weight_logical_shape,
       .refusals = ct_int8_refusals,
       .required_suffixes = ct_int8_required_suffixes,
       .optional_suffixes = ct_int8_optional_suffixes,
       .unpack = unpack_ct_int8,
       .pack = pack_ct_int8,
       .param_space = ct_int8_param_space,
       .params_shown = {"group_size", "symmetric", "dynamic_input"}},
      {.name = "ct-mxfp8",
       .method = QuantMethod::kCtMxfp8,
       .scheme = "mxfp8",
       .description = "compressed-tensors mxfp8-quantized",
       .spec_for = mxfp8_spec_for,
       .logical_shape = weight_logical_shape,
       .required_suffixes = mxfp8_required_suffixes,
       .optional_suffixes = mxfp8_optional_suffixes,
       .unpack = unpack_mxfp8,
       .pack = pack_mxfp8,
       .param_space = ct_mxfp8_param_space,
       .params_shown = {"group_size"}},
      {.name = "modelopt-mxfp8",
       .method = QuantMethod::kModeloptMxfp8,
       .scheme = "mxfp8",
       .description = "modelopt MXFP8",
       .spec_for = mxfp8_spec_for,
       .logical_shape = weight_logical_shape,
       .required_suffixes = mxfp8_required_suffixes,
       .optional_suffixes = mxfp8_optional_suffixes,
       .unpack = unpack_mxfp8,
       .pack = pack_mxfp8,
       .param_space = mxfp8_param_space,
       .params_shown = {"group_size"}},
      {.name = "fp8-block",
       .method = QuantMethod::kFp8Block,
       .scheme = "fp8-block",
       .description = "fp8 block (weight_block_size [128, 128])",
       .spec_for = fp8_block_spec_for,
       .logical_shape = weight_logical_shape,
       .required_suffixes = fp8_block_required_suffixes,
       .optional_suffixes = fp8_block_optional_suffixes,
       .unpack = unpack_fp8_block,
       .pack = pack_fp8_block,
       .param_space = fp8_block_param_space,
       .params_shown = {"block", "dynamic_input"}},
      {.name = "ct-fp8-block",
       .method = QuantMethod::kCtFp8Block,
       .scheme = "fp8-block",
       .description =
           "compressed-tensors float-quantized FP8_BLOCK (block [128, 128], dynamic activations)",
       .spec_for = ct_fp8_block_spec_for,
       .logical_shape = weight_logical_shape,
       .refusals = ct_fp8_block_refusals,
       .required_suffixes = ct_fp8_block_required_suffixes,
       .optional_suffixes = ct_fp8_block_optional_suffixes,
       .unpack = unpack_ct_fp8_block,
       .pack = pack_ct_fp8_block,
       .param_space = ct_fp8_block_param_space,
       .params_shown = {"block", "dynamic_input"}},
  };
}

// FP8 with one scale per output channel / per tensor (formats/fp8_scaled.h): their own schemes,
// since vLLM 0.33's oracle orders each (weight, activation) key pair apart.
std::vector<SourceCodec> fp8_scaled_codecs() {
  return {
      {.name = "ct-fp8-channel",
       .method = QuantMethod::kCtFp8Channel,
       .scheme = "fp8-channel",
       .description = "compressed-tensors float-quantized FP8 channel (FP8_DYNAMIC: per-channel "
                      "weight scales, dynamic per-token activations)",
       .spec_for = fp8_scaled_spec_for,
       .logical_shape = weight_logical_shape,
       .refusals = ct_fp8_channel_refusals,
       .required_suffixes = ct_fp8_channel_required_suffixes,
       .optional_suffixes = ct_fp8_channel_optional_suffixes,
       .unpack = unpack_ct_fp8_channel,
       .pack = pack_ct_fp8_channel,
       .param_space = ct_fp8_channel_param_space,
       .params_shown = {"dynamic_input"}},
      {.name = "ct-fp8-tensor",
       .method = QuantMethod::kCtFp8Tensor,
       .scheme = "fp8-tensor",
       .description = "compressed-tensors float-quantized FP8 tensor (per-tensor weight and "
                      "static input scales)",
       .spec_for = fp8_scaled_spec_for,
       .logical_shape = weight_logical_shape,
       .refusals = fp8_tensor_refusals,
       .required_suffixes = fp8_tensor_required_suffixes,
       .optional_suffixes = fp8_tensor_optional_suffixes,
       .unpack = unpack_fp8_tensor,
       .pack = pack_fp8_tensor,
       .param_space = ct_fp8_tensor_param_space,
       .params_shown = {"dynamic_input"}},
      {.name = "modelopt-fp8",
       .method = QuantMethod::kModeloptFp8,
       .scheme = "fp8-tensor",
       .description = "modelopt FP8 (quant_algo FP8: per-tensor weight and input scales)",
       .spec_for = fp8_scaled_spec_for,
       .logical_shape = weight_logical_shape,
       .refusals = fp8_tensor_refusals,
       .required_suffixes = fp8_tensor_required_suffixes,
       .optional_suffixes = fp8_tensor_optional_suffixes,
       .unpack = unpack_fp8_tensor,
       .pack = pack_fp8_tensor,
       .param_space = modelopt_fp8_param_space,
       .params_shown = {}},
  };
}

// The FP4 sources (formats/fp4.h).
std::vector<SourceCodec> fp4_codecs() {
  return {
      {.name = "modelopt-nvfp4",
       .method = QuantMethod::kModeloptNvfp4,
       .scheme = "nvfp4",
       .description = "modelopt NVFP4 / W4A16_NVFP4 (e2m1, e4m3 scales per 16, weight_scale_2)",
       .spec_for = modelopt_nvfp4_spec_for,
       .logical_shape = modelopt_nvfp4_logical_shape,
       .required_suffixes = modelopt_nvfp4_required_suffixes,
       .optional_suffixes = modelopt_nvfp4_optional_suffixes,
       .unpack = unpack_modelopt_nvfp4,
       .pack = pack_modelopt_nvfp4,
       .param_space = modelopt_nvfp4_param_space,
       .params_shown = {"group_size"},
       .global_scale_suffix = "weight_scale_2"},
      {.name = "ct-nvfp4",
       .method = QuantMethod::kCtNvfp4,
       .scheme = "nvfp4",
       .description = "compressed-tensors nvfp4-pack-quantized (NVFP4 / NVFP4A16, "
                      "weight_global_scale an encode divisor)",
       .spec_for = ct_nvfp4_spec_for,
       .logical_shape = ct_fp4_logical_shape,
       .required_suffixes = ct_nvfp4_required_suffixes,
       .optional_suffixes = ct_nvfp4_optional_suffixes,
       .unpack = unpack_ct_nvfp4,
       .pack = pack_ct_nvfp4,
       .param_space = ct_nvfp4_param_space,
       .params_shown = {"group_size"},
       .global_scale_suffix = "weight_global_scale"},
      {.name = "ct-mxfp4",
       .method = QuantMethod::kCtMxfp4,
       .scheme = "mxfp4",
       .description = "compressed-tensors mxfp4-pack-quantized (e2m1, E8M0 scales per 32)",
       .spec_for = ct_mxfp4_spec_for,
       .logical_shape = ct_fp4_logical_shape,
       .required_suffixes = ct_mxfp4_required_suffixes,
       .optional_suffixes = ct_mxfp4_optional_suffixes,
       .unpack = unpack_ct_mxfp4,
       .pack = pack_ct_mxfp4,
       .param_space = ct_mxfp4_param_space,
       .params_shown = {"group_size"}},
      // Its own scheme: gpt-oss experts carry biases and compute the clamped SwiGLU on
      // interleaved gate/up, and vLLM picks their kernel from another order
      // (_get_priority_backends_for_gpt_oss), so no MXFP4 layout takes them by the scheme alone.
      {.name = "gpt-oss-mxfp4",
       .method = QuantMethod::kGptOssMxfp4,
       .scheme = "gpt-oss-mxfp4",
       .description = "gpt-oss MXFP4 (quant_method mxfp4: fused <proj>_blocks / _scales, e2m1 "
                      "with E8M0 scales per 32, gate/up interleaved, expert biases)",
       .spec_for = gpt_oss_mxfp4_spec_for,
       .logical_shape = gpt_oss_mxfp4_logical_shape,
       .required_suffixes = gpt_oss_mxfp4_required_suffixes,
       .optional_suffixes = gpt_oss_mxfp4_optional_suffixes,
       .unpack = unpack_gpt_oss_mxfp4,
       .pack = pack_gpt_oss_mxfp4,
       .param_space = gpt_oss_mxfp4_param_space,
       .params_shown = {"group_size"}},
  };
}

}  // namespace

const std::vector<SourceCodec>& source_codecs() {
  static const std::vector<SourceCodec> table = [] {
    std::vector<SourceCodec> v = int_and_fp8_codecs();
    for (const SourceCodec& c : fp8_scaled_codecs()) v.push_back(c);
    for (const SourceCodec& c : fp4_codecs()) v.push_back(c);
    return v;
  }();
  return table;
}

namespace {

// The rows every vLLM 0.33 loader narrows by tp_rank and post-processes as a layer of I / tp
// (formats/parallel.h's canonical split).
TensorParallelSplit canonical_tensor_parallel() {
  return {.reasons = tp_canonical_reasons, .split = tp_canonical_split};
}

// vLLM 0.33's first WNA16 choice on SM90 (prioritize_humming). Its kernel runs on every
// arch vLLM's Humming experts take (capability 7.5 and up); its LayerConfig names the exact
// SM, and moepack writes it for SM90 only (humming_unsupported_reasons).
TargetLayout humming_row(const std::vector<TargetArch>& every_arch) {
  using S = ServingPath;
  return {.name = "humming",
          .kernel = "vLLM 0.33's Humming MoE kernel (humming-kernels 0.1.19)",
          .layout_version = 1,
          .schemes = {"wna16"},
          .archs = every_arch,
          .unsupported_reasons = humming_unsupported_reasons,
          .param_specs = humming_param_specs,
          .pack = pack_humming_moe,
          .unpack = unpack_humming_moe,
          .reader_kind = reader::Kind::kHumming,
          .act_quant = humming_act_quant,
          .make_reader = humming_make_reader,
          .deviations_from_vllm = humming_deviations_from_vllm,
          // vLLM 0.33's WNA16 MoE methods run convert_to_humming_moe_kernel_format in
          // process_weights_after_loading and have no pre-processed path; the plugin builds vLLM's
          // Humming experts itself from the parameters and the recorded LayerConfigs.
          .vllm_serving = {{.target = VllmTarget::kV0_33,
                            .path = S::kKernelBuilder,
                            .kernel_builder = "wna16-humming"}},
          .decide_layer = humming_decide_layer,
          .layer_config = humming_layer_config,
          // Under tensor or expert parallelism each rank of vLLM 0.33 converts its own slice (the
          // loader's narrowing, or its local experts) with convert_to_humming_moe_kernel_format:
          // decide_layer and layer_config are then the rank's (make_plan calls them per rank).
          .tensor_parallel = canonical_tensor_parallel()};
}

}  // namespace

namespace {

// FlashInfer's TRT-LLM-Gen MoE rows (Blackwell).
std::vector<TargetLayout> trtllm_layouts(const std::vector<TargetArch>& sm100) {
  using S = ServingPath;
  return {
      {.name = "trtllm-mxfp8",
       .kernel = "the FlashInfer TRT-LLM-Gen MXFP8 MoE kernel",
       .layout_version = 1,
       .schemes = {"mxfp8"},
       .archs = sm100,
       .unsupported_reasons = trtllm_mxfp8_unsupported_reasons,
       .param_specs = trtllm_mxfp8_param_specs,
       .pack = pack_trtllm_mxfp8_moe,
       .unpack = unpack_trtllm_mxfp8_moe,
       .reader_kind = reader::Kind::kTrtllmMxfp8,
       .act_quant = trtllm_mxfp8_act_quant,
       .make_reader = trtllm_mxfp8_make_reader,
       .deviations_from_vllm = trtllm_mxfp8_deviations_from_vllm,
       .vllm_serving = {{.target = VllmTarget::kV0_33,
                         .reason = "vLLM 0.33's MXFP8 MoE methods (ModelOptMxFp8FusedMoE, "
                                   "CompressedTensorsW8A8Mxfp8MoEMethod) do not declare "
                                   "supports_pre_processed_weights (they always shuffle in "
                                   "process_weights_after_loading), and this plugin has no kernel "
                                   "builder for the TRT-LLM MXFP8 experts yet"}},
       .tensor_parallel = canonical_tensor_parallel()},
      {.name = "trtllm-fp8-block",
       .kernel = "the FlashInfer TRT-LLM-Gen FP8 block MoE kernel",
       .layout_version = 1,
       .schemes = {"fp8-block"},
       .archs = sm100,
       .unsupported_reasons = trtllm_fp8_block_unsupported_reasons,
       .param_specs = trtllm_fp8_block_param_specs,
       .pack = pack_trtllm_fp8_block_moe,
       .unpack = unpack_trtllm_fp8_block_moe,
       .reader_kind = reader::Kind::kTrtllmFp8Block,
       .act_quant = trtllm_fp8_block_act_quant,
       .make_reader = trtllm_fp8_block_make_reader,
       .deviations_from_vllm = trtllm_fp8_block_deviations_from_vllm,
       // Fp8Config's Fp8MoEMethod on Blackwell picks FLASHINFER_TRTLLM for 128x128 blocks; under
       // weights_already_processed() it only builds TrtLlmFp8Experts from these parameters (the
       // names, dtypes and shapes prepare_fp8_moe_layer_for_fi leaves).
       .vllm_serving = {{.target = VllmTarget::kV0_33,
                         .sources = {QuantMethod::kFp8Block},
                         .path = S::kVllmMethod,
                         .vllm_method = "Fp8MoEMethod",
                         .vllm_backend = "Fp8MoeBackend.FLASHINFER_TRTLLM"},
                        {.target = VllmTarget::kV0_33,
                         .sources = {QuantMethod::kCtFp8Block},
                         .reason = "vLLM 0.33's CompressedTensorsW8A8Fp8MoEMethod does not declare "
                                   "supports_pre_processed_weights (it always shuffles in "
                                   "process_weights_after_loading)"}},
       .tensor_parallel = canonical_tensor_parallel()},
      {.name = "trtllm-mxfp4",
       .kernel = "the FlashInfer TRT-LLM-Gen MXFP4 MoE kernel (bf16 activations)",
       .layout_version = 1,
       .schemes = {"gpt-oss-mxfp4"},
       .archs = sm100,
       .unsupported_reasons = trtllm_mxfp4_unsupported_reasons,
       .param_specs = trtllm_mxfp4_param_specs,
       .pack = pack_trtllm_mxfp4_moe,
       .unpack = unpack_trtllm_mxfp4_moe,
       .reader_kind = reader::Kind::kTrtllmFp4,
       .act_quant = trtllm_mxfp4_act_quant,
       .make_reader = trtllm_mxfp4_make_reader,
       .deviations_from_vllm = trtllm_mxfp4_deviations_from_vllm,
       .padded_inter = trtllm_mxfp4_padded_inter,
       // GptOssMxfp4MoEMethod does not declare supports_pre_processed_weights (Mxfp4MoEMethod,
       // which does, is not what gpt-oss loads): the plugin's gpt-oss-trtllm builder runs that
       // method without its conversion (its oracle must pick FLASHINFER_TRTLLM_MXFP4_BF16; the
       // parameters are what the conversion leaves), docs/vllm.md "Serving paths".
       .vllm_serving = {{.target = VllmTarget::kV0_33,
                         .path = S::kKernelBuilder,
                         .kernel_builder = "gpt-oss-trtllm"}},
       // gpt-oss only, and vLLM 0.33's gpt-oss loader splits its experts its own way (pairs of
       // interleaved gate/up rows, w2's bias on rank 0): formats/parallel.cpp refuses them.
       .tensor_parallel = {.unsupported = "trtllm-mxfp4 takes gpt-oss experts only, which are "
                                          "written for one rank (vLLM 0.33's gpt-oss loader "
                                          "splits them its own way, _load_weights_mxfp4)"}},
      {.name = "trtllm-nvfp4",
       .kernel = "the FlashInfer TRT-LLM-Gen NVFP4 MoE kernel (NVFP4 activations)",
       .layout_version = 1,
       .schemes = {"nvfp4"},
       .archs = sm100,
       .unsupported_reasons = trtllm_nvfp4_unsupported_reasons,
       .param_specs = trtllm_nvfp4_param_specs,
       .pack = pack_trtllm_nvfp4_moe,
       .unpack = unpack_trtllm_nvfp4_moe,
       .reader_kind = reader::Kind::kTrtllmFp4,
       .act_quant = trtllm_nvfp4_act_quant,
       .make_reader = trtllm_nvfp4_make_reader,
       .deviations_from_vllm = trtllm_nvfp4_deviations_from_vllm,
       .padded_inter = trtllm_nvfp4_padded_inter,
       .vllm_serving = {{.target = VllmTarget::kV0_33,
                         .reason = "not yet served by this plugin (ModelOptNvFp4FusedMoE declares "
                                   "supports_pre_processed_weights for FLASHINFER_TRTLLM; the "
                                   "plugin's declaration for it is not written)"}},
       .decide_layer = trtllm_nvfp4_decide_layer,
       // vLLM 0.33 reduces the activation scales over every expert of the layer, all ranks' (the
       // FlashInfer backends load global_num_experts input scales): a rank's share alone does
       // not give its bytes.
       .tensor_parallel = {.unsupported = "its activation scales are the maximum over every "
                                          "expert of the layer, which moepack's parallel "
                                          "writers (one rank's share each) do not reduce"},
       .vllm_loaded = trtllm_nvfp4_vllm_loaded},
  };
}

// vLLM 0.33's float Marlin rows (formats/marlin_float.h): where vLLM runs FP8 block, MXFP8, NVFP4
// and MXFP4 through prepare_{fp8,mxfp8,nvfp4}_moe_layer_for_marlin /
// prepare_moe_fp4_layer_for_marlin and MarlinExperts.
std::vector<TargetLayout> marlin_float_layouts(const std::vector<TargetArch>& every_arch) {
  using S = ServingPath;
  // Under tensor parallelism vLLM 0.33 narrows the checkpoint's codes and scales by tp_rank
  // (FusedMoE weight_loader), then prepare_{fp8,mxfp8}_moe_layer_for_marlin post-process the
  // rank's slice with layer.intermediate_size_per_partition: the padding
  // (marlin_moe_padded_intermediate) and the scale permutation are the per-rank I's, which the
  // row's pack does with the rank's options (formats/parallel.h). What vLLM refuses per rank
  // (validate_fp8_block_shape_moe: I/tp % block_n and % block_k; ModelOpt MXFP8: I/tp % 32) is
  // the canonical split's straddle reasons.
  const TensorParallelSplit float_marlin_tp = canonical_tensor_parallel();
  return {
      {.name = "marlin-fp8",
       .kernel = "vLLM 0.33's fused Marlin MoE kernel (FP8 weights, 16-bit activations)",
       .layout_version = 1,
       .schemes = {"fp8-block", "fp8-channel", "fp8-tensor"},
       .archs = every_arch,
       .unsupported_reasons = marlin_fp8_unsupported_reasons,
       .param_specs = marlin_fp8_param_specs,
       .pack = pack_marlin_fp8_moe,
       .unpack = unpack_marlin_fp8_moe,
       .reader_kind = reader::Kind::kMarlinFloat,
       .act_quant = marlin_float_act_quant,
       .make_reader = marlin_fp8_make_reader,
       .deviations_from_vllm = marlin_fp8_deviations_from_vllm,
       .padded_inter = marlin_fp8_padded_inter,
       // Fp8MoEMethod (DeepSeek fp8 with weight_block_size) supports pre-processed weights for
       // every backend: under weights_already_processed() it only builds MarlinExperts from the
       // parameters prepare_fp8_moe_layer_for_marlin leaves, once its oracle picks MARLIN
       // (--moe-backend marlin where vLLM would pick another). compressed-tensors' method and
       // ModelOptFp8MoEMethod do not: the plugin's marlin-float builder.
       .vllm_serving = {{.target = VllmTarget::kV0_33,
                         .sources = {QuantMethod::kFp8Block},
                         .path = S::kVllmMethod,
                         .vllm_method = "Fp8MoEMethod",
                         .vllm_backend = "Fp8MoeBackend.MARLIN"},
                        {.target = VllmTarget::kV0_33,
                         .sources = {QuantMethod::kCtFp8Block, QuantMethod::kCtFp8Channel,
                                     QuantMethod::kCtFp8Tensor, QuantMethod::kModeloptFp8},
                         .path = S::kKernelBuilder,
                         .kernel_builder = "marlin-float"}},
       .tensor_parallel = float_marlin_tp,
       .vllm_loaded = marlin_fp8_vllm_loaded},
      {.name = "marlin-mxfp8",
       .kernel = "vLLM 0.33's fused Marlin MoE kernel (MXFP8 weights, bf16 activations)",
       .layout_version = 1,
       .schemes = {"mxfp8"},
       .archs = every_arch,
       .unsupported_reasons = marlin_mxfp8_unsupported_reasons,
       .param_specs = marlin_mxfp8_param_specs,
       .pack = pack_marlin_mxfp8_moe,
       .unpack = unpack_marlin_mxfp8_moe,
       .reader_kind = reader::Kind::kMarlinFloat,
       .act_quant = marlin_float_act_quant,
       .make_reader = marlin_mxfp8_make_reader,
       .deviations_from_vllm = marlin_mxfp8_deviations_from_vllm,
       .padded_inter = marlin_mxfp8_padded_inter,
       // ModelOptMxFp8FusedMoE and CompressedTensorsW8A8Mxfp8MoEMethod do not declare
       // supports_pre_processed_weights: the plugin builds vLLM's MarlinExperts itself.
       .vllm_serving = {{.target = VllmTarget::kV0_33,
                         .path = S::kKernelBuilder,
                         .kernel_builder = "marlin-float"}},
       .tensor_parallel = float_marlin_tp},
      {.name = "marlin-nvfp4",
       .kernel = "vLLM 0.33's fused Marlin MoE kernel (NVFP4 weights, 16-bit activations)",
       .layout_version = 1,
       .schemes = {"nvfp4"},
       .archs = every_arch,
       .unsupported_reasons = marlin_nvfp4_unsupported_reasons,
       .param_specs = marlin_nvfp4_param_specs,
       .pack = pack_marlin_nvfp4_moe,
       .unpack = unpack_marlin_nvfp4_moe,
       .reader_kind = reader::Kind::kMarlinFloat,
       .act_quant = marlin_float_act_quant,
       .make_reader = marlin_nvfp4_make_reader,
       .deviations_from_vllm = marlin_nvfp4_deviations_from_vllm,
       .padded_inter = marlin_nvfp4_padded_inter,
       // ModelOptNvFp4FusedMoE declares supports_pre_processed_weights but raises under
       // weights_already_processed() unless its backend is FLASHINFER_TRTLLM;
       // CompressedTensorsW4A4Nvfp4MoEMethod does not declare it: the plugin builds MarlinExperts.
       .vllm_serving = {{.target = VllmTarget::kV0_33,
                         .path = S::kKernelBuilder,
                         .kernel_builder = "marlin-float"}},
       // The rescale factor of every projection's block scales is the layer's (all its experts).
       .decide_layer = marlin_nvfp4_decide_layer,
       // vLLM 0.33 computes that factor on each rank's slice (_nvfp4_compute_scale_factor after
       // the loader's narrowing, or over its local experts): make_plan decides per rank.
       .tensor_parallel = float_marlin_tp},
      {.name = "marlin-mxfp4",
       .kernel = "vLLM 0.33's fused Marlin MoE kernel (MXFP4 weights, bf16 activations)",
       .layout_version = 1,
       .schemes = {"mxfp4", "gpt-oss-mxfp4"},
       .archs = every_arch,
       .unsupported_reasons = marlin_mxfp4_unsupported_reasons,
       .param_specs = marlin_mxfp4_param_specs,
       .pack = pack_marlin_mxfp4_moe,
       .unpack = unpack_marlin_mxfp4_moe,
       .reader_kind = reader::Kind::kMarlinFloat,
       .act_quant = marlin_float_act_quant,
       .make_reader = marlin_mxfp4_make_reader,
       .deviations_from_vllm = marlin_mxfp4_deviations_from_vllm,
       .padded_inter = marlin_mxfp4_padded_inter,
       // CompressedTensorsW4A4Mxfp4MoEMethod does not declare supports_pre_processed_weights, nor
       // does GptOssMxfp4MoEMethod (Mxfp4MoEMethod, which does, is not what gpt-oss loads): the
       // plugin's marlin-float builder, for gpt-oss with the biases, swigluoai and vLLM's hidden
       // padding (docs/gpt-oss.md "Served by the plugin").
       .vllm_serving = {{.target = VllmTarget::kV0_33,
                         .path = S::kKernelBuilder,
                         .kernel_builder = "marlin-float"}},
       .tensor_parallel = float_marlin_tp},
  };
}
// vLLM 0.33's OAI Triton MoE rows (formats/triton_mxfp4.h): gpt-oss MXFP4 where
// GptOssMxfp4MoEMethod picks Mxfp4MoeBackend.TRITON on Hopper.
std::vector<TargetLayout> triton_mxfp4_layouts() {
  using S = ServingPath;
  return {
      {.name = "triton-mxfp4",
       .kernel = "vLLM 0.33's OAI Triton MoE kernels (matmul_ogs, Hopper MXFP4 swizzle)",
       .layout_version = 1,
       .schemes = {"gpt-oss-mxfp4"},
       .archs = {TargetArch::kSm90},
       .unsupported_reasons = triton_mxfp4_unsupported_reasons,
       .param_specs = triton_mxfp4_param_specs,
       .pack = pack_triton_mxfp4_moe,
       .unpack = unpack_triton_mxfp4_moe,
       .reader_kind = reader::Kind::kTritonMxfp4,
       .act_quant = triton_mxfp4_act_quant,
       .make_reader = triton_mxfp4_make_reader,
       .deviations_from_vllm = triton_mxfp4_deviations_from_vllm,
       .padded_inter = triton_mxfp4_padded_inter,
       // GptOssMxfp4MoEMethod does not declare supports_pre_processed_weights, and vLLM holds
       // the swizzled tensors as triton_kernels Tensors in the method's PrecisionConfigs, not as
       // layer parameters: the plugin's gpt-oss-triton builder runs that method without its
       // conversion, wrapping the parameters into those objects (its oracle must pick TRITON).
       .vllm_serving = {{.target = VllmTarget::kV0_33,
                         .path = S::kKernelBuilder,
                         .kernel_builder = "gpt-oss-triton"}},
       // vLLM 0.33 picks TRITON for every gpt-oss layer on sm90; these shapes fail in its kernel.
       .kernel_failures = triton_mxfp4_kernel_failures,
       .tensor_parallel = {.unsupported =
                               "gpt-oss experts are written for one rank only: vLLM 0.33's "
                               "gpt-oss loader narrows the interleaved gate/up rows in pairs and "
                               "loads w2's bias on rank 0 only (_load_weights_mxfp4)"}},
  };
}
}  // namespace

// vllm_serving: what vLLM 0.33.0's code does (read in its source, docs/vllm.md "What is served").
// Path (a) needs a MoE method that declares supports_pre_processed_weights and skips its
// transforms under weights_already_processed(); Fp8MoEMethod does (every backend),
// ModelOptMxFp8FusedMoE, CompressedTensorsW8A8Mxfp8MoEMethod, CompressedTensorsW8A8Fp8MoEMethod,
// the WNA16 and W8A8-int8 MoE methods do not.
const std::vector<TargetLayout>& target_layouts() {
  using A = TargetArch;
  using S = ServingPath;
  static const std::vector<A> every_arch = all_target_archs();
  // FlashInfer's TRT-LLM-Gen MoE kernels run only on the SM100 family (Blackwell).
  static const std::vector<A> sm100 = {A::kSm100};
  // vLLM 0.33 narrows each rank's slice of the checkpoint and post-processes it as a layer of
  // intermediate size I / tp for every layout below (formats/parallel.h).
  static const TensorParallelSplit canonical_tp = canonical_tensor_parallel();
  // Named fields (designated initialisers, in TargetLayout's declaration order): an optional
  // hook left out is nullptr.
  static const std::vector<TargetLayout> table = [] {
    std::vector<TargetLayout> t = {
        {.name = "marlin",
         .kernel = "vLLM's fused Marlin MoE kernel",
         .layout_version = 2,
         .schemes = {"wna16"},
         .archs = every_arch,
         .unsupported_reasons = marlin_unsupported_reasons,
         .param_specs = marlin_param_specs,
         .pack = pack_marlin_moe,
         .unpack = unpack_marlin_moe,
         .reader_kind = reader::Kind::kMarlin,
         .act_quant = marlin_act_quant,
         .make_reader = marlin_make_reader,
         .deviations_from_vllm = marlin_deviations_from_vllm,
         .option_deviations = marlin_option_deviations,
         .padded_inter = marlin_padded_inter,
         // vLLM 0.33's WNA16 MoE methods repack in process_weights_after_loading and have no
         // pre-processed path; the plugin builds MarlinExperts' modular kernel itself (its oracle
         // would put Humming first on sm90, which reads another layout).
         .vllm_serving = {{.target = VllmTarget::kV0_33,
                           .path = S::kKernelBuilder,
                           .kernel_builder = "wna16-marlin"}},
         .tensor_parallel = canonical_tp},
        {.name = "triton-wna16",
         .kernel = "vLLM's Triton fused_moe kernel (moe_wna16)",
         .layout_version = 2,
         .schemes = {"wna16"},
         .archs = every_arch,
         .unsupported_reasons = triton_wna16_unsupported_reasons,
         .param_specs = triton_wna16_param_specs,
         .pack = pack_triton_wna16_moe,
         .unpack = unpack_triton_wna16_moe,
         .reader_kind = reader::Kind::kTritonWna16,
         .act_quant = triton_wna16_act_quant,
         .make_reader = triton_wna16_make_reader,
         .deviations_from_vllm = triton_wna16_deviations_from_vllm,
         .vllm_serving = {{.target = VllmTarget::kV0_33,
                           .reason =
                               "vLLM 0.33's MoeWNA16 method reads the checkpoint-format "
                               "qweight/scales and repacks them itself; its Triton kernel has "
                               "no pre-packed entry point this plugin can feed"}},
         .tensor_parallel = canonical_tp},
        {.name = "triton-int8",
         .kernel = "vLLM's Triton fused_moe kernel (W8A8 int8)",
         .layout_version = 1,
         .schemes = {"w8a8-int8"},
         .archs = every_arch,
         .unsupported_reasons = triton_int8_unsupported_reasons,
         .param_specs = triton_int8_param_specs,
         .pack = pack_triton_int8_moe,
         .unpack = unpack_triton_int8_moe,
         .reader_kind = reader::Kind::kTritonInt8,
         .act_quant = triton_int8_act_quant,
         .make_reader = triton_int8_make_reader,
         .deviations_from_vllm = triton_int8_deviations_from_vllm,
         .vllm_serving = {{.target = VllmTarget::kV0_33,
                           .reason = "vLLM 0.33's W8A8 int8 MoE methods quantise per load and have "
                                     "no pre-processed weight path this plugin can feed"}},
         .tensor_parallel = canonical_tp},
    };
    for (TargetLayout& r : trtllm_layouts(sm100)) t.push_back(std::move(r));
    t.push_back(humming_row(every_arch));
    for (TargetLayout& r : marlin_float_layouts(every_arch)) t.push_back(std::move(r));
    for (TargetLayout& r : triton_mxfp4_layouts()) t.push_back(std::move(r));
    return t;
  }();
  return table;
}

const std::vector<QuantizeRecipe>& quantize_recipes() {
  static const std::vector<QuantizeRecipe> table = {
      {"mxfp8", "flashinfer", mxfp8_target_params,
       [](const float* w, int64_t e, int64_t n, int64_t k) {
         return quantize_mxfp8(w, e, n, k, MxRecipe::kFlashInfer);
       }},
      {"mxfp8", "modelopt", mxfp8_target_params,
       [](const float* w, int64_t e, int64_t n, int64_t k) {
         return quantize_mxfp8(w, e, n, k, MxRecipe::kModelOpt);
       }},
  };
  return table;
}

const QuantizeRecipe& find_quantize_recipe(const std::string& format, const std::string& recipe) {
  std::string formats, recipes;
  for (const auto& r : quantize_recipes()) {
    if (format == r.format && recipe == r.recipe) return r;
    if (formats.find(r.format) == std::string::npos)
      formats += std::string(formats.empty() ? "" : ", ") + r.format;
    if (format == r.format) recipes += std::string(recipes.empty() ? "" : ", ") + r.recipe;
  }
  if (recipes.empty())
    throw Error(ErrorCode::kUsage, "unknown --quantize \"" + format + "\" (" + formats + ")");
  throw Error(ErrorCode::kUsage, "unknown --mx-recipe \"" + recipe + "\" (" + recipes + ")");
}

const SourceCodec* find_source_codec(QuantMethod method) {
  for (const auto& c : source_codecs())
    if (c.method == method) return &c;
  return nullptr;
}

const TargetLayout* find_target_layout(const std::string& name) {
  for (const auto& t : target_layouts())
    if (name == t.name) return &t;
  return nullptr;
}

VllmServing find_vllm_serving(const TargetLayout& layout, VllmTarget target, QuantMethod source) {
  for (const VllmServing& s : layout.vllm_serving) {
    const bool covers = s.sources.empty() ||
                        std::find(s.sources.begin(), s.sources.end(), source) != s.sources.end();
    if (s.target == target && covers) return s;
  }
  VllmServing none{.target = target};
  none.reason = "moepack records no serving path for this layout, source and vLLM target";
  return none;
}

namespace {
struct ParamRoleRow {
  ParamRole role;
  const char* name;
};
const std::vector<ParamRoleRow>& param_role_rows() {
  static const std::vector<ParamRoleRow> rows = {
      {ParamRole::kW13Weight, "w13_weight"},
      {ParamRole::kW2Weight, "w2_weight"},
      {ParamRole::kW13Scale, "w13_scale"},
      {ParamRole::kW2Scale, "w2_scale"},
      {ParamRole::kW13Zero, "w13_zero"},
      {ParamRole::kW2Zero, "w2_zero"},
      {ParamRole::kW13GIdx, "w13_g_idx"},
      {ParamRole::kW2GIdx, "w2_g_idx"},
      {ParamRole::kW13SortIndices, "w13_sort_indices"},
      {ParamRole::kW2SortIndices, "w2_sort_indices"},
      {ParamRole::kW13GlobalScale, "w13_global_scale"},
      {ParamRole::kW2GlobalScale, "w2_global_scale"},
      {ParamRole::kW13Bias, "w13_bias"},
      {ParamRole::kW2Bias, "w2_bias"},
      {ParamRole::kW13InputScale, "w13_input_scale"},
      {ParamRole::kW2InputScale, "w2_input_scale"},
      {ParamRole::kW13OutputScale, "w13_output_scale"},
      {ParamRole::kW2OutputScale, "w2_output_scale"},
      {ParamRole::kW13SourceGlobalScale, "w13_source_global_scale"},
      {ParamRole::kW2SourceGlobalScale, "w2_source_global_scale"},
  };
  return rows;
}
struct ServingPathRow {
  ServingPath path;
  const char* name;
};
const std::vector<ServingPathRow>& serving_path_rows() {
  static const std::vector<ServingPathRow> rows = {{ServingPath::kNone, "none"},
                                                   {ServingPath::kVllmMethod, "vllm-method"},
                                                   {ServingPath::kKernelBuilder, "kernel-builder"}};
  return rows;
}
}  // namespace

const char* param_role_name(ParamRole r) {
  for (const auto& row : param_role_rows())
    if (row.role == r) return row.name;
  return "unknown";
}

std::optional<ParamRole> parse_param_role(const std::string& name) {
  for (const auto& row : param_role_rows())
    if (name == row.name) return row.role;
  return std::nullopt;
}

ParamRole param_role_of(MoeProj proj, ParamRole w13_role) {
  // The rows pair each w13 role with its w2 role, in that order.
  if (proj == MoeProj::kW13) return w13_role;
  return static_cast<ParamRole>(static_cast<uint8_t>(w13_role) + 1);
}

const char* serving_path_name(ServingPath p) {
  for (const auto& row : serving_path_rows())
    if (row.path == p) return row.name;
  return "unknown";
}

std::optional<ServingPath> parse_serving_path(const std::string& name) {
  for (const auto& row : serving_path_rows())
    if (name == row.name) return row.path;
  return std::nullopt;
}

const char* quant_method_name(QuantMethod m) {
  for (const auto& r : quant_method_rows())
    if (r.method == m) return r.name;
  return "unknown";
}

std::optional<QuantMethod> parse_quant_method(const std::string& name) {
  for (const auto& r : quant_method_rows())
    if (name == r.name) return r.method;
  return std::nullopt;
}

std::string scheme_of(QuantMethod method) {
  if (const SourceCodec* c = find_source_codec(method)) return c->scheme;
  for (const auto& r : quant_method_rows())
    if (r.method == method && r.scheme_without_codec) return r.scheme_without_codec;
  return quant_method_name(method);
}

namespace {

// vLLM's MoE backend orders, per target, scheme and arch: VllmTargetRow::moe_backend_orders.
// Each order is the list vLLM's oracle for the scheme tries, for NVIDIA GPUs and the standard
// (non-batched, no expert-parallel all2all) activation format; backends for other platforms
// (ROCm, XPU, CPU) and the batched variants are left out, and each order's `source` says which.
// A backend's `archs` come from its experts' _supports_current_device and the arch gates of
// _supports_quant_scheme for the scheme; optional packages (flashinfer, deep_gemm, humming) are
// taken as installed. Backends with a moepack layout row are judged by the row; the others by
// their archs and vllm_refusals (formats/vllm_backends.h).

// The arch lists vLLM's MoE backends run on.
struct ArchSets {
  std::vector<TargetArch> every = all_target_archs();
  std::vector<TargetArch> sm90 = {TargetArch::kSm90};
  std::vector<TargetArch> sm100 = {TargetArch::kSm100};  // is_device_capability_family(100)
  std::vector<TargetArch> not_sm90 = {TargetArch::kSm80, TargetArch::kSm86, TargetArch::kSm89,
                                      TargetArch::kSm100, TargetArch::kSm120};
  std::vector<TargetArch> fp8_archs = {TargetArch::kSm89, TargetArch::kSm90, TargetArch::kSm100,
                                       TargetArch::kSm120};  // supports_fp8()
  std::vector<TargetArch> deep_gemm_archs = {TargetArch::kSm90, TargetArch::kSm100,
                                             TargetArch::kSm120};  // support_deep_gemm()
  std::vector<TargetArch> fp4_archs = {TargetArch::kSm100, TargetArch::kSm120};  // NVFP4 MMA
};

constexpr const char* kHummingReads = "Humming's own layout (convert_to_humming_moe_kernel_format)";

struct Wna16Backends {
  VllmBackend trtllm, marlin, triton, humming, emulation, spec_trtllm;
};
Wna16Backends wna16_backends(const ArchSets& a) {
  // WNA16 (GPTQ, AWQ, compressed-tensors pack-quantized): vLLM 0.33.0 WNA16MoEBackend
  // (fused_moe/oracle/int_wna16.py).
  const VllmBackend trtllm = {
      .name = "FLASHINFER_TRTLLM",
      .moe_backend = "flashinfer_trtllm",
      .archs = a.sm100,  // TrtLlmMxint4ExpertsMonolithic._supports_current_device
      .layout = "trtllm-mxint4",
      .reads = "FlashInfer's MxInt4 layout (convert_to_wna16_moe_kernel_format)",
      .vllm_refusals = vllm033_wna16_mxint4_refusals};
  const VllmBackend marlin = {.name = "MARLIN",
                              .moe_backend = "marlin",
                              .archs = a.every,  // MarlinExperts: capability 7.5 and up
                              .layout = "marlin",
                              .reads = "Marlin's tiles (gptq_marlin_moe_repack)"};
  const VllmBackend triton = {.name = "TRITON",
                              .moe_backend = "triton",
                              .archs = a.every,  // TritonWNA16Experts: any CUDA GPU
                              .layout = "triton-wna16",
                              .reads = "the moe_wna16 layout (bytes, transposed)"};
  const VllmBackend humming = {.name = "HUMMING",
                               .moe_backend = "humming",
                               .archs = a.every,  // Humming experts: capability 7.5 and up
                               .layout = "humming",
                               .reads = kHummingReads};  // judged by moepack's humming row
  const VllmBackend emulation = {.name = "EMULATION",
                                 .moe_backend = "emulation",
                                 .archs = a.every,  // Int4EmulationTritonExperts: any CUDA GPU
                                 .layout = nullptr,
                                 .reads = "the experts dequantised to bf16 at load",
                                 .vllm_refusals = vllm033_wna16_emulation_refusals};
  // The same FLASHINFER_TRTLLM as ../shared/spec describes it for vLLM@9aaf83ef.
  VllmBackend spec_trtllm = trtllm;
  spec_trtllm.vllm_refusals = spec_wna16_mxint4_refusals;
  return {.trtllm = trtllm,
          .marlin = marlin,
          .triton = triton,
          .humming = humming,
          .emulation = emulation,
          .spec_trtllm = spec_trtllm};
}

struct Int8Backends {
  VllmBackend triton, humming;
};
Int8Backends int8_backends(const ArchSets& a) {
  // W8A8 int8 (compressed-tensors int-quantized): vLLM 0.33.0 Int8MoeBackend (oracle/int8.py).
  const VllmBackend triton = {.name = "TRITON",
                              .moe_backend = "triton",
                              .archs = a.every,  // TritonExperts int8: capability 7.5 and up
                              .layout = "triton-int8",
                              .reads = "the int8 weights and float32 scales as loaded"};
  const VllmBackend humming = {.name = "HUMMING",
                               .moe_backend = "humming",
                               .archs = a.every,
                               .layout = "humming-int8",
                               .reads = kHummingReads};
  return {.triton = triton, .humming = humming};
}

struct Mxfp8Backends {
  VllmBackend trtllm, deep_gemm, marlin, humming, emulation;
};
Mxfp8Backends mxfp8_backends(const ArchSets& a) {
  // MXFP8 (ModelOpt, compressed-tensors): vLLM 0.33.0 Fp8MoeBackend as oracle/mxfp8.py uses it.
  const VllmBackend trtllm = {.name = "FLASHINFER_TRTLLM",
                              .moe_backend = "flashinfer_trtllm",
                              .archs = a.sm100,  // TrtLlmFp8ExpertsMonolithic
                              .layout = "trtllm-mxfp8",
                              .reads = "FlashInfer TRT-LLM-Gen's shuffled MXFP8 layout"};
  const VllmBackend deep_gemm = {
      .name = "DEEPGEMM",
      .moe_backend = "deep_gemm",
      .archs = a.sm100,  // DeepGemmExperts._supports_quant_scheme: MXFP8 on family 100 only
      .layout = "deepgemm-mxfp8",
      .reads = "DeepGEMM's layout (prepare_fp8_moe_layer_for_deepgemm)",
      .vllm_refusals = gated_only_refusals};
  const VllmBackend marlin = {.name = "MARLIN",
                              .moe_backend = "marlin",
                              .archs = a.every,
                              .layout = "marlin-mxfp8",
                              .reads = "Marlin's MXFP8 tiles (prepare_mxfp8_moe_layer_for_marlin)"};
  const VllmBackend humming = {.name = "HUMMING",
                               .moe_backend = "humming",
                               .archs = a.every,
                               .layout = "humming-mxfp8",
                               .reads = kHummingReads};
  const VllmBackend emulation = {
      .name = "EMULATION",
      .moe_backend = nullptr,  // not in mxfp8.py's _BACKEND_NAME_MAP
      .archs = a.every,        // Mxfp8EmulationTritonExperts: any device
      .layout = nullptr,
      .reads = "the MXFP8 experts as loaded, dequantised to bf16 on every call"};
  return {.trtllm = trtllm,
          .deep_gemm = deep_gemm,
          .marlin = marlin,
          .humming = humming,
          .emulation = emulation};
}

struct Fp8BlockBackends {
  VllmBackend trtllm, cutlass, deep_gemm, triton, marlin, humming;
};
Fp8BlockBackends fp8_block_backends(const ArchSets& a) {
  // FP8 block (weight_block_size [128, 128]): vLLM 0.33.0 Fp8MoeBackend (oracle/fp8.py).
  const VllmBackend trtllm = {.name = "FLASHINFER_TRTLLM",
                              .moe_backend = "flashinfer_trtllm",
                              .archs = a.sm100,
                              .layout = "trtllm-fp8-block",
                              .reads = "FlashInfer TRT-LLM-Gen's shuffled block-major FP8 layout"};
  const VllmBackend cutlass = {
      .name = "FLASHINFER_CUTLASS",
      .moe_backend = "flashinfer_cutlass",
      .archs = a.sm90,  // FlashInferExperts._supports_quant_scheme: block FP8 on capability 90
      .layout = "flashinfer-cutlass-fp8-block",
      .reads = "FlashInfer CUTLASS's layout (prepare_fp8_moe_layer_for_fi)"};
  const VllmBackend deep_gemm = {
      .name = "DEEPGEMM",
      .moe_backend = "deep_gemm",
      .archs = a.deep_gemm_archs,  // TritonOrDeepGemmExperts: DeepGEMM and Triton FP8 both
      .layout = "deepgemm-fp8-block",
      .reads = "DeepGEMM's layout (prepare_fp8_moe_layer_for_deepgemm)",
      .vllm_refusals = gated_only_refusals};
  const VllmBackend triton = {
      .name = "TRITON",
      .moe_backend = "triton",
      .archs = a.fp8_archs,  // TritonExperts: FP8 schemes where supports_fp8()
      .layout = nullptr,
      .reads =
          "the FP8 weights and block scales as loaded (convert_to_fp8_moe_kernel_format "
          "leaves them)"};
  const VllmBackend marlin = {.name = "MARLIN",
                              .moe_backend = "marlin",
                              .archs = a.every,
                              .layout = "marlin-fp8",
                              .reads = "Marlin's FP8 tiles (prepare_fp8_moe_layer_for_marlin)"};
  const VllmBackend humming = {.name = "HUMMING",
                               .moe_backend = "humming",
                               .archs = a.every,
                               .layout = "humming-fp8-block",
                               .reads = kHummingReads};
  return {.trtllm = trtllm,
          .cutlass = cutlass,
          .deep_gemm = deep_gemm,
          .triton = triton,
          .marlin = marlin,
          .humming = humming};
}

// ModelOptFp8MoEMethod selects its backend with allow_vllm_cutlass=False (oracle/fp8.py
// select_fp8_moe_backend); CompressedTensorsW8A8Fp8MoEMethod with True.
std::vector<std::string> vllm_cutlass_fp8_refusals(const VllmTargetRow&, const QuantParams& q,
                                                   const MoeShape&) {
  if (q.method != QuantMethod::kModeloptFp8) return {};
  return {"ModelOptFp8MoEMethod selects its backend with allow_vllm_cutlass=False"};
}

struct Fp8ScaledBackends {
  VllmBackend trtllm, fi_cutlass, vllm_cutlass, triton, marlin, humming;
};
Fp8ScaledBackends fp8_scaled_backends(const ArchSets& a) {
  // FP8 with per-channel or per-tensor weight scales (compressed-tensors channel / tensor,
  // ModelOpt FP8): vLLM 0.33.0 Fp8MoeBackend (oracle/fp8.py), the same list as block FP8 with
  // each expert class's _supports_quant_scheme for the pair: kFp8StaticChannelSym x
  // kFp8DynamicTokenSym, kFp8StaticTensorSym x kFp8StaticTensorSym. DEEPGEMM takes block FP8
  // only. Per-tensor sources reach every backend requantised (process_fp8_weight_tensor_strategy_
  // moe runs before convert_to_fp8_moe_kernel_format).
  const VllmBackend trtllm = {
      .name = "FLASHINFER_TRTLLM",
      .moe_backend = "flashinfer_trtllm",
      .archs = a.sm100,  // TrtLlmFp8Experts: family 100; per-tensor static only
      .layout = "trtllm-fp8-tensor",
      .reads = "FlashInfer TRT-LLM-Gen's FP8 per-tensor layout (prepare_fp8_moe_layer_for_fi)"};
  const VllmBackend fi_cutlass = {
      .name = "FLASHINFER_CUTLASS",
      .moe_backend = "flashinfer_cutlass",
      // FlashInferExperts: per-tensor static FP8 on capability 9.0 and up (devices 90, 100, 120)
      .archs = {TargetArch::kSm90, TargetArch::kSm100, TargetArch::kSm120},
      .layout = "flashinfer-cutlass-fp8-tensor",
      .reads = "FlashInfer CUTLASS's layout (prepare_fp8_moe_layer_for_fi)"};
  const VllmBackend vllm_cutlass = {
      .name = "VLLM_CUTLASS",
      .moe_backend = "cutlass",
      // CutlassExpertsFp8: cutlass_group_gemm_supported() (90 <= capability < 110)
      .archs = {TargetArch::kSm90, TargetArch::kSm100},
      .layout = nullptr,
      .reads = "the FP8 weights and scales as loaded (a per-tensor w13 requantised to one scale)",
      .vllm_refusals = vllm_cutlass_fp8_refusals};
  const VllmBackend triton = {
      .name = "TRITON",
      .moe_backend = "triton",
      .archs = a.fp8_archs,  // TritonExperts: FP8 schemes where supports_fp8()
      .layout = nullptr,
      .reads = "the FP8 weights and scales as loaded (a per-tensor w13 requantised to one scale)"};
  const VllmBackend marlin = {.name = "MARLIN",
                              .moe_backend = "marlin",
                              .archs = a.every,
                              .layout = "marlin-fp8",
                              .reads = "Marlin's FP8 tiles (prepare_fp8_moe_layer_for_marlin)"};
  const VllmBackend humming = {.name = "HUMMING",
                               .moe_backend = "humming",
                               .archs = a.every,
                               .layout = "humming-fp8",
                               .reads = kHummingReads};
  return {.trtllm = trtllm,
          .fi_cutlass = fi_cutlass,
          .vllm_cutlass = vllm_cutlass,
          .triton = triton,
          .marlin = marlin,
          .humming = humming};
}

struct Nvfp4Backends {
  VllmBackend trtllm, cutedsl, fi_cutlass, vllm_cutlass, marlin, humming, emulation;
};
Nvfp4Backends nvfp4_backends(const ArchSets& a) {
  // NVFP4 (ModelOpt, compressed-tensors; W4A4 or A16): vLLM 0.33.0 NvFp4MoeBackend
  // (fused_moe/oracle/nvfp4.py, select_nvfp4_moe_backend).
  const VllmBackend trtllm = {.name = "FLASHINFER_TRTLLM",
                              .moe_backend = "flashinfer_trtllm",
                              .archs = a.sm100,  // TrtLlmNvFp4ExpertsMonolithic: family 100
                              .layout = "trtllm-nvfp4",
                              .reads = "FlashInfer TRT-LLM-Gen's shuffled NVFP4 layout"};
  const VllmBackend cutedsl = {.name = "FLASHINFER_CUTEDSL",
                               .moe_backend = "flashinfer_cutedsl",
                               .archs = a.sm100,  // family 100
                               .layout = "flashinfer-cutedsl-nvfp4",
                               .reads = "FlashInfer CuTe DSL's NVFP4 layout"};
  const VllmBackend fi_cutlass = {
      .name = "FLASHINFER_CUTLASS",
      .moe_backend = "flashinfer_cutlass",
      .archs = a.fp4_archs,  // FlashInferExperts: NVFP4 on capability >= 100
      .layout = "flashinfer-cutlass-nvfp4",
      .reads = "FlashInfer CUTLASS's swizzled NVFP4 layout"};
  const VllmBackend vllm_cutlass = {
      .name = "VLLM_CUTLASS",
      .moe_backend = "cutlass",
      .archs = a.fp4_archs,  // CutlassExpertsFp4: families 100, 110, 120
      .layout = "cutlass-nvfp4",
      .reads = "vLLM CUTLASS's swizzled NVFP4 layout"};
  const VllmBackend marlin = {.name = "MARLIN",
                              .moe_backend = "marlin",
                              .archs = a.every,
                              .layout = "marlin-nvfp4",
                              .reads = "Marlin's FP4 tiles (prepare_nvfp4_moe_layer_for_marlin)"};
  const VllmBackend humming = {.name = "HUMMING",
                               .moe_backend = "humming",
                               .archs = a.every,
                               .layout = "humming-nvfp4",
                               .reads = kHummingReads};
  const VllmBackend emulation = {.name = "EMULATION",
                                 .moe_backend = "emulation",
                                 .archs = a.every,
                                 .layout = nullptr,
                                 .reads = "the NVFP4 experts dequantised at load"};
  return {.trtllm = trtllm,
          .cutedsl = cutedsl,
          .fi_cutlass = fi_cutlass,
          .vllm_cutlass = vllm_cutlass,
          .marlin = marlin,
          .humming = humming,
          .emulation = emulation};
}

struct GptOssMxfp4Backends {
  VllmBackend trtllm, triton, triton_blackwell, fi_cutlass, marlin;
};
GptOssMxfp4Backends gpt_oss_mxfp4_backends(const ArchSets& a) {
  // gpt-oss MXFP4 (Mxfp4MoEMethod): select_mxfp4_moe_backend over
  // _get_priority_backends_for_gpt_oss (vLLM 0.33.0 fused_moe/oracle/mxfp4.py), with 16-bit
  // activations (_filter_by_activation keeps the BF16 variants). Archs: TrtLlmMxfp4Experts
  // (capability family 100), _triton_kernel_moe_supports_current_device (9.0 <= cc < 13.0),
  // FlashInferExperts' (kMxfp4Static, None) on capability 9.0 only, MarlinExperts (cc >= 7.5).
  const VllmBackend trtllm = {.name = "FLASHINFER_TRTLLM_MXFP4_BF16",
                              .moe_backend = "flashinfer_trtllm",
                              .archs = a.sm100,
                              .layout = "trtllm-mxfp4",
                              .reads =
                                  "FlashInfer TRT-LLM's shuffled MXFP4 weights and "
                                  "interleaved block scales"};
  // TRITON reads another layout per arch: _swizzle_mxfp4 takes triton_kernels'
  // make_default_matmul_mxfp4_w_layout / _w_scale_layout, Hopper's on sm90, Blackwell's from
  // capability 10 on (sm100, sm120).
  const VllmBackend triton = {.name = "TRITON",
                              .moe_backend = "triton",
                              .archs = a.sm90,
                              .layout = "triton-mxfp4",
                              .reads =
                                  "the OAI Triton kernels' Hopper-swizzled MXFP4 values and scales "
                                  "(matmul_ogs)"};
  const VllmBackend triton_blackwell = {
      .name = "TRITON",
      .moe_backend = "triton",
      .archs = {TargetArch::kSm100, TargetArch::kSm120},
      .layout = "triton-mxfp4-blackwell",
      .reads = "the OAI Triton kernels' Blackwell-swizzled MXFP4 values and scales (matmul_ogs)"};
  const VllmBackend fi_cutlass = {.name = "FLASHINFER_CUTLASS_MXFP4_BF16",
                                  .moe_backend = "flashinfer_cutlass",
                                  .archs = a.sm90,
                                  .layout = "flashinfer-cutlass-mxfp4",
                                  .reads = "FlashInfer CUTLASS's MXFP4 weights"};
  const VllmBackend marlin = {.name = "MARLIN",
                              .moe_backend = "marlin",
                              .archs = a.every,
                              .layout = "marlin-mxfp4",
                              .reads =
                                  "Marlin's FP4 tiles and the gpt-oss biases "
                                  "(prepare_moe_mxfp4_layer_for_marlin)"};
  return {.trtllm = trtllm,
          .triton = triton,
          .triton_blackwell = triton_blackwell,
          .fi_cutlass = fi_cutlass,
          .marlin = marlin};
}

// gpt-oss MXFP4's orders: vLLM 0.33.0's on every arch (consumer Blackwell moves TRITON behind
// BATCHED_MARLIN); AITER (ROCm), XPU, CPU, the activation-quantised variants, BATCHED_MARLIN
// (batched all2all only), HUMMING and EMULATION left out: none of them comes before the pick.
std::vector<VllmBackendOrder> gpt_oss_mxfp4_orders(const ArchSets& a, const char* source) {
  const GptOssMxfp4Backends g = gpt_oss_mxfp4_backends(a);
  return {{.scheme = "gpt-oss-mxfp4",
           .archs = {TargetArch::kSm80, TargetArch::kSm86, TargetArch::kSm89, TargetArch::kSm90},
           .backends = {g.trtllm, g.triton, g.fi_cutlass, g.marlin},
           .source = source,
           .auto_writes_only_vllm_pick = true},
          {.scheme = "gpt-oss-mxfp4",
           .archs = {TargetArch::kSm100},
           .backends = {g.trtllm, g.triton_blackwell, g.fi_cutlass, g.marlin},
           .source = source,
           .auto_writes_only_vllm_pick = true},
          {.scheme = "gpt-oss-mxfp4",
           .archs = {TargetArch::kSm120},
           .backends = {g.trtllm, g.marlin, g.triton_blackwell},
           .source = source,
           .auto_writes_only_vllm_pick = true}};
}

struct Mxfp4Backends {
  VllmBackend cutlass, marlin;
};
Mxfp4Backends mxfp4_backends(const ArchSets& a) {
  // compressed-tensors MXFP4: no oracle; CompressedTensorsW4A4Mxfp4MoEMethod.__init__ takes
  // CutlassExpertsMxfp4 where ops.mxfp4_experts_quant_supported (capability 100 / 103 / 110),
  // else XPU (Intel only), else MarlinExperts. --moe-backend does not change it (b12x and the
  // FlashInfer EP backends aside).
  const VllmBackend cutlass = {.name = "CUTLASS_MXFP4",
                               .moe_backend = nullptr,
                               .archs = a.sm100,
                               .layout = "cutlass-mxfp4",
                               .reads = "CUTLASS's swizzled MXFP4 scales"};
  const VllmBackend marlin = {.name = "MARLIN",
                              .moe_backend = nullptr,
                              .archs = a.every,
                              .layout = "marlin-mxfp4",
                              .reads = "Marlin's FP4 tiles (prepare_moe_fp4_layer_for_marlin)"};
  return {.cutlass = cutlass, .marlin = marlin};
}

VllmTargetRow vllm_033_row(const ArchSets& a) {
  const Wna16Backends w = wna16_backends(a);
  const Int8Backends i = int8_backends(a);
  const Mxfp8Backends m = mxfp8_backends(a);
  const Fp8BlockBackends f = fp8_block_backends(a);
  const Fp8ScaledBackends c = fp8_scaled_backends(a);
  const Nvfp4Backends n = nvfp4_backends(a);
  const Mxfp4Backends x = mxfp4_backends(a);
  VllmTargetRow row = {
      .target = VllmTarget::kV0_33,
      .name = "0.33",
      .follows = "vLLM 0.33.0 (PyPI release)",
      .moe_act_order = false,
      .param_child = "routed_experts.",
      .marlin_pads_intermediate = true,
      .moe_backend_orders = {
          {.scheme = "wna16",
           .archs = a.not_sm90,
           .backends = {w.trtllm, w.marlin, w.triton, w.humming, w.emulation},
           .source = "vLLM 0.33.0 fused_moe/oracle/int_wna16.py, _get_priority_backends "
                     "(RDNA3: HIP only; BATCHED_MARLIN: batched all2all only)"},
          {.scheme = "wna16",
           .archs = a.sm90,
           .backends = {w.trtllm, w.humming, w.marlin, w.triton, w.emulation},
           .source = "vLLM 0.33.0 fused_moe/oracle/int_wna16.py, _get_priority_backends, then "
                     "prioritize_humming (quantization/utils/humming/priority.py: HUMMING "
                     "directly ahead of MARLIN on capability 90)"},
          {.scheme = "w8a8-int8",
           .archs = a.every,
           .backends = {i.triton, i.humming},
           .source = "vLLM 0.33.0 fused_moe/oracle/int8.py, _get_priority_backends (CPU left "
                     "out; no prioritize_humming)"},
          {.scheme = "mxfp8",
           .archs = a.not_sm90,
           .backends = {m.trtllm, m.deep_gemm, m.marlin, m.humming, m.emulation},
           .source = "vLLM 0.33.0 fused_moe/oracle/mxfp8.py, _SUPPORTED_BACKENDS (XPU, "
                     "AITER_MXFP8, TRITON_MXFP8: Intel / ROCm only)",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "mxfp8",
           .archs = a.sm90,
           .backends = {m.trtllm, m.deep_gemm, m.humming, m.marlin, m.emulation},
           .source = "vLLM 0.33.0 fused_moe/oracle/mxfp8.py, _SUPPORTED_BACKENDS through "
                     "prioritize_humming in select_mxfp8_moe_backend",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "fp8-block",
           .archs = a.not_sm90,
           .backends = {f.trtllm, f.cutlass, f.deep_gemm, f.triton, f.marlin, f.humming},
           .source = "vLLM 0.33.0 fused_moe/oracle/fp8.py, _get_priority_backends "
                     "(VLLM_CUTLASS: takes no block FP8 and Fp8MoEMethod disallows it; AITER, "
                     "XPU, CPU, HPC and the batched variants left out)",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "fp8-block",
           .archs = a.sm90,
           .backends = {f.triton, f.trtllm, f.cutlass, f.deep_gemm, f.humming, f.marlin},
           .source = "vLLM 0.33.0 fused_moe/oracle/fp8.py, _get_priority_backends: "
                     "prioritize_humming, then TRITON to the front for block FP8 on "
                     "capability 90 without expert parallelism",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "fp8-channel",
           .archs = a.not_sm90,
           .backends = {c.vllm_cutlass, c.triton, c.marlin, c.humming},
           .source = "vLLM 0.33.0 fused_moe/oracle/fp8.py, _get_priority_backends "
                     "(FLASHINFER_TRTLLM and FLASHINFER_CUTLASS take no channel FP8, DEEPGEMM "
                     "block FP8 only; AITER, XPU, CPU, HPC and the batched variants left out)",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "fp8-channel",
           .archs = a.sm90,
           .backends = {c.vllm_cutlass, c.triton, c.humming, c.marlin},
           .source = "vLLM 0.33.0 fused_moe/oracle/fp8.py, _get_priority_backends through "
                     "prioritize_humming (HUMMING ahead of MARLIN on capability 90)",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "fp8-tensor",
           .archs = a.not_sm90,
           .backends = {c.trtllm, c.fi_cutlass, c.vllm_cutlass, c.triton, c.marlin, c.humming},
           .source = "vLLM 0.33.0 fused_moe/oracle/fp8.py, _get_priority_backends (static "
                     "per-tensor activations; VLLM_CUTLASS for compressed-tensors only: "
                     "ModelOpt passes allow_vllm_cutlass=False)",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "fp8-tensor",
           .archs = a.sm90,
           .backends = {c.trtllm, c.fi_cutlass, c.vllm_cutlass, c.triton, c.humming, c.marlin},
           .source = "vLLM 0.33.0 fused_moe/oracle/fp8.py, _get_priority_backends through "
                     "prioritize_humming",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "nvfp4",
           .archs = a.not_sm90,
           .backends = {n.trtllm, n.cutedsl, n.fi_cutlass, n.vllm_cutlass, n.marlin, n.humming,
                        n.emulation},
           .source = "vLLM 0.33.0 fused_moe/oracle/nvfp4.py, select_nvfp4_moe_backend "
                     "(FLASHINFER_CUTEDSL_BATCHED: batched only)",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "nvfp4",
           .archs = a.sm90,
           .backends = {n.trtllm, n.cutedsl, n.fi_cutlass, n.vllm_cutlass, n.humming, n.marlin,
                        n.emulation},
           .source = "vLLM 0.33.0 fused_moe/oracle/nvfp4.py, select_nvfp4_moe_backend "
                     "through prioritize_humming (HUMMING ahead of MARLIN on capability 90)",
           .auto_writes_only_vllm_pick = true},
          {.scheme = "mxfp4",
           .archs = a.every,
           .backends = {x.cutlass, x.marlin},
           .source = "vLLM 0.33.0 compressed_tensors_moe_w4a4_mxfp4.py, "
                     "CompressedTensorsW4A4Mxfp4MoEMethod.__init__ (no oracle; XPU: Intel "
                     "only; no Humming on this path)",
           .auto_writes_only_vllm_pick = true}}};
  for (auto& o : gpt_oss_mxfp4_orders(
           a,
           "vLLM 0.33.0 fused_moe/oracle/mxfp4.py, select_mxfp4_moe_backend over "
           "_get_priority_backends_for_gpt_oss (BF16-activation variants; AITER, XPU, CPU, "
           "BATCHED_MARLIN, HUMMING and EMULATION never come before the pick)"))
    row.moe_backend_orders.push_back(std::move(o));
  return row;
}

VllmTargetRow vllm_2026_05_row(const ArchSets& a) {
  const Wna16Backends w = wna16_backends(a);
  const Int8Backends i = int8_backends(a);
  const Mxfp8Backends m = mxfp8_backends(a);
  const Fp8BlockBackends f = fp8_block_backends(a);
  const Fp8ScaledBackends c = fp8_scaled_backends(a);
  const Nvfp4Backends n = nvfp4_backends(a);
  const Mxfp4Backends x = mxfp4_backends(a);
  VllmTargetRow row = {
      .target = VllmTarget::kV2026_05,
      .name = "2026-05",
      .follows = "vLLM@9aaf83ef (2026-05, ../shared/spec)",
      .moe_act_order = true,
      .param_child = "",
      .marlin_pads_intermediate = false,
      .moe_backend_orders = {
          {.scheme = "wna16",
           .archs = a.every,
           .backends = {w.spec_trtllm, w.marlin, w.triton},
           .source = "../shared/spec w.marlin.md §7 'Method selection' (Marlin where "
                     "check_moe_marlin_supports_layer takes the layer, else the moe_wna16 / "
                     "compressed-tensors Triton method) and its note on FlashInfer's mxint4 "
                     "backend; assumed: that backend first and on the SM100 family only, as "
                     "in vLLM 0.33.0"},
          {.scheme = "w8a8-int8",
           .archs = a.every,
           .backends = {i.triton},
           .source = "../shared/spec w.marlin.md §9 (CompressedTensorsW8A8Int8MoEMethod: "
                     "Triton only)"},
          {.scheme = "mxfp8",
           .archs = a.every,
           .backends = {m.trtllm, m.marlin},
           .source = "../shared/spec m.trtllm.md §2 (auto tries FLASHINFER_TRTLLM, MARLIN, "
                     "XPU; XPU: Intel only); assumed: MARLIN on every arch, as in vLLM 0.33.0"},
          {.scheme = "fp8-block",
           .archs = a.not_sm90,
           .backends = {f.trtllm, f.cutlass, f.deep_gemm, f.triton, f.marlin},
           .source = "assumed: the spec (m.trtllm.md §5) gives block FP8's TRT-LLM layout "
                     "but not the order; vLLM 0.33.0's fp8.py order without HUMMING, which "
                     "the spec's vLLM predates"},
          {.scheme = "fp8-block",
           .archs = a.sm90,
           .backends = {f.triton, f.trtllm, f.cutlass, f.deep_gemm, f.marlin},
           .source = "assumed as for the other archs, with vLLM 0.33.0's TRITON first for "
                     "block FP8 on capability 90"},
          {.scheme = "fp8-channel",
           .archs = a.every,
           .backends = {c.vllm_cutlass, c.triton, c.marlin},
           .source = "assumed: the spec has no FP8 channel MoE order; vLLM 0.33.0's fp8.py order "
                     "without HUMMING, which the spec's vLLM predates"},
          {.scheme = "fp8-tensor",
           .archs = a.every,
           .backends = {c.trtllm, c.fi_cutlass, c.vllm_cutlass, c.triton, c.marlin},
           .source = "assumed: the spec has no FP8 per-tensor MoE order; vLLM 0.33.0's fp8.py "
                     "order without HUMMING"},
          {.scheme = "nvfp4",
           .archs = a.every,
           .backends = {n.trtllm, n.cutedsl, n.fi_cutlass, n.vllm_cutlass, n.marlin, n.emulation},
           .source = "assumed: the spec has no NVFP4 MoE; vLLM 0.33.0's nvfp4.py order "
                     "without HUMMING, which the spec's vLLM predates"},
          {.scheme = "mxfp4",
           .archs = a.every,
           .backends = {x.cutlass, x.marlin},
           .source = "assumed: the spec has no compressed-tensors MXFP4 MoE; vLLM 0.33.0's "
                     "CompressedTensorsW4A4Mxfp4MoEMethod choice"}}};
  for (auto& o : gpt_oss_mxfp4_orders(a,
                                      "assumed: the spec has no gpt-oss MoE; vLLM 0.33.0's "
                                      "_get_priority_backends_for_gpt_oss"))
    row.moe_backend_orders.push_back(std::move(o));
  return row;
}

}  // namespace

const std::vector<VllmTargetRow>& vllm_target_rows() {
  // Named fields (VllmTargetRow's declaration order). Newest first: the first row is the default.
  static const std::vector<VllmTargetRow> rows = {vllm_033_row(ArchSets{}),
                                                  vllm_2026_05_row(ArchSets{})};
  return rows;
}

const VllmBackendOrder* vllm_backend_order(const VllmTargetRow& target, const std::string& scheme,
                                           TargetArch arch) {
  for (const auto& o : target.moe_backend_orders)
    if (scheme == o.scheme && std::find(o.archs.begin(), o.archs.end(), arch) != o.archs.end())
      return &o;
  return nullptr;
}

const VllmTargetRow& vllm_target_row(VllmTarget t) {
  for (const auto& r : vllm_target_rows())
    if (r.target == t) return r;
  throw Error(ErrorCode::kInternal, "unknown VllmTarget " + std::to_string(static_cast<int>(t)));
}

std::optional<VllmTarget> vllm_target_from_name(const std::string& name) {
  for (const auto& r : vllm_target_rows())
    if (name == r.name) return r.target;
  return std::nullopt;
}

VllmTarget parse_vllm_target(const std::string& s) {
  if (const auto t = vllm_target_from_name(s)) return *t;
  throw Error(ErrorCode::kUsage,
              "unknown --vllm-target \"" + s + "\" (" + vllm_target_names() + ")");
}

const char* vllm_target_name(VllmTarget t) {
  return vllm_target_row(t).name;
}

std::string vllm_target_names(const std::string& separator) {
  std::string s;
  for (const auto& r : vllm_target_rows()) s += (s.empty() ? "" : separator) + r.name;
  return s;
}

VllmTarget newest_vllm_target() {
  return vllm_target_rows().front().target;
}

int64_t marlin_padded_intermediate(int64_t inter, int64_t group_size) {
  const int64_t g = group_size > 0 ? group_size : 1;
  const int64_t unit = 64 / std::gcd<int64_t>(64, g) * g;  // lcm(64, g)
  return (inter + unit - 1) / unit * unit;
}

std::string vllm_param_prefix(VllmTarget t, const std::string& module_prefix) {
  return module_prefix + vllm_target_row(t).param_child;
}

LayoutOptions LayoutOptions::for_layer(QuantMethod source_method, DType act_dtype, bool gated,
                                       bool vllm_w13_scale_size_k, VllmTarget vllm_target,
                                       std::string param_prefix, int64_t inter, int threads) {
  LayoutOptions o;
  o.source_method = source_method;
  o.act_dtype = act_dtype;
  o.gated = gated;
  o.vllm_w13_scale_size_k = vllm_w13_scale_size_k;
  o.vllm_target = vllm_target;
  o.inter = inter;
  o.prefix = std::move(param_prefix);
  o.threads = threads;
  return o;
}

MoeShape moe_shape_for(const QuantParams& q, int64_t experts, int64_t hidden, int64_t inter,
                       bool gated, int act_order_w13, int act_order_w2) {
  const SourceCodec* codec = find_source_codec(q.method);
  if (!codec)
    throw Error(ErrorCode::kUnsupported,
                std::string("no codec reads ") + quant_method_name(q.method) + " experts");
  const QuantSpec spec = codec->spec_for(q);
  auto proj = [&](int64_t n, int64_t k, int flag) {
    const bool wanted = flag < 0 ? q.act_order : flag != 0;
    // Act-order belongs to the layer: vLLM gives every projection of a grouped act-order layer
    // g_idx and sort indices [E, K], even one whose K holds a single group.
    return ProjShape{spec, n, k, wanted && spec.kind == CodeKind::kUint && spec.group_size > 0};
  };
  MoeShape s;
  s.experts = experts;
  s.w13 = proj(gated ? 2 * inter : inter, hidden, act_order_w13);
  s.w2 = proj(hidden, inter, act_order_w2);
  return s;
}

std::string target_layout_names(const std::string& separator) {
  std::string s;
  for (const auto& t : target_layouts()) s += (s.empty() ? "" : separator) + t.name;
  return s;
}

std::string supported_formats_text() {
  std::string s;
  for (const auto& c : source_codecs()) s += std::string(s.empty() ? "" : ", ") + c.description;
  return s + ", unquantized bf16/fp16";
}

namespace {
struct TargetArchRow {
  TargetArch arch;
  const char* name;
  const char* alias;  // also accepted by parse_target_arch
};
const std::vector<TargetArchRow>& target_arch_rows() {
  static const std::vector<TargetArchRow> rows = {
      {TargetArch::kSm80, "sm80", nullptr},    {TargetArch::kSm86, "sm86", nullptr},
      {TargetArch::kSm89, "sm89", nullptr},    {TargetArch::kSm90, "sm90", "sm90a"},
      {TargetArch::kSm100, "sm100", "sm100a"}, {TargetArch::kSm120, "sm120", nullptr}};
  return rows;
}
}  // namespace

const std::vector<TargetArch>& all_target_archs() {
  static const std::vector<TargetArch> v = [] {
    std::vector<TargetArch> a;
    for (const auto& r : target_arch_rows()) a.push_back(r.arch);
    return a;
  }();
  return v;
}

std::string target_arch_names(const std::string& separator) {
  std::string s;
  for (const auto& r : target_arch_rows()) s += (s.empty() ? "" : separator) + r.name;
  return s;
}

TargetArch parse_target_arch(const std::string& s) {
  std::string names;
  for (const auto& r : target_arch_rows()) {
    if (s == r.name || (r.alias && s == r.alias)) return r.arch;
    names += (names.empty() ? "" : ", ") + std::string(r.name);
  }
  // A GPU's name instead of its arch: say which arch it is (a hint, never an alias: the arch is
  // what the layouts are for).
  static const std::vector<std::pair<std::vector<const char*>, const char*>> gpus = {
      {{"a100", "a800", "a30", "a10", "a10g", "a40", "rtx3090", "3090"}, "sm80"},
      {{"l4", "l40", "l40s", "rtx4090", "4090", "rtx6000ada"}, "sm89"},
      {{"h100", "h200", "h800", "h20", "gh200"}, "sm90"},
      {{"b100", "b200", "gb200", "b300", "gb300"}, "sm100"},
      {{"rtx5090", "5090", "rtxpro6000"}, "sm120"}};
  std::string key;
  for (char c : s)
    if (std::isalnum(static_cast<unsigned char>(c)))
      key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string hint;
  for (const auto& [names_of_gpus, arch] : gpus)
    for (const char* g : names_of_gpus)
      if (key == g || (key.size() > std::string(g).size() && key.rfind(g, 0) == 0 &&
                       !std::isdigit(static_cast<unsigned char>(key[std::string(g).size()]))))
        hint = std::string(": ") + s + " is " + arch + ", use --target-arch " + arch;
  throw Error(ErrorCode::kUsage, "unknown --target-arch \"" + s + "\" (" + names + ")" + hint);
}

std::optional<TargetArch> target_arch_from_name(const std::string& name) {
  for (const auto& r : target_arch_rows())
    if (name == r.name) return r.arch;
  return std::nullopt;
}

const char* target_arch_name(TargetArch a) {
  for (const auto& r : target_arch_rows())
    if (r.arch == a) return r.name;
  return "?";
}

}  // namespace moepack
