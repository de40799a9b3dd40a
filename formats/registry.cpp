// The explicit codec registry (STYLE.md §1): a table, not self-registering statics that a
// static link could drop. Adding a format = its file pair + one row here.
#include "formats/awq.h"
#include "formats/codec.h"
#include "formats/compressed_tensors.h"
#include "formats/fp8_block.h"
#include "formats/gptq.h"
#include "formats/marlin.h"
#include "formats/mxfp8.h"
#include "formats/triton_int8.h"
#include "formats/triton_wna16.h"
#include "formats/trtllm_fp8_block.h"
#include "formats/trtllm_mxfp8.h"

namespace moepack {

const std::vector<SourceCodec>& source_codecs() {
  // {name, method, required_suffixes, optional_suffixes, unpack, pack}
  static const std::vector<SourceCodec> table = {
      {"gptq", QuantMethod::kGptq, gptq_required_suffixes, gptq_optional_suffixes, unpack_gptq,
       pack_gptq},
      {"awq", QuantMethod::kAwq, awq_required_suffixes, awq_optional_suffixes, unpack_awq,
       pack_awq},
      {"ct-pack-quantized", QuantMethod::kCtPackQuantized, ct_pack_required_suffixes,
       ct_pack_optional_suffixes, unpack_ct_pack, pack_ct_pack},
      {"ct-int-quantized", QuantMethod::kCtIntQuantized, ct_int8_required_suffixes,
       ct_int8_optional_suffixes, unpack_ct_int8, pack_ct_int8},
      {"modelopt-mxfp8", QuantMethod::kModeloptMxfp8, mxfp8_required_suffixes,
       mxfp8_optional_suffixes, unpack_mxfp8, pack_mxfp8},
      {"ct-mxfp8", QuantMethod::kCtMxfp8, mxfp8_required_suffixes, mxfp8_optional_suffixes,
       unpack_mxfp8, pack_mxfp8},
      {"fp8-block", QuantMethod::kFp8Block, fp8_block_required_suffixes,
       fp8_block_optional_suffixes, unpack_fp8_block, pack_fp8_block},
  };
  return table;
}

const std::vector<TargetLayout>& target_layouts() {
  // {name, layout_version, pack, unpack, expert_matmul, deviations_from_vllm}
  static const std::vector<TargetLayout> table = {
      {"marlin", 1, pack_marlin_moe, unpack_marlin_moe, marlin_expert_matmul,
       marlin_deviations_from_vllm},
      {"triton-wna16", 1, pack_triton_wna16_moe, unpack_triton_wna16_moe,
       triton_wna16_expert_matmul, triton_wna16_deviations_from_vllm},
      {"triton-int8", 1, pack_triton_int8_moe, unpack_triton_int8_moe, triton_int8_expert_matmul,
       triton_int8_deviations_from_vllm},
      {"trtllm-mxfp8", 1, pack_trtllm_mxfp8_moe, unpack_trtllm_mxfp8_moe,
       trtllm_mxfp8_expert_matmul, trtllm_mxfp8_deviations_from_vllm},
      {"trtllm-fp8-block", 1, pack_trtllm_fp8_block_moe, unpack_trtllm_fp8_block_moe,
       trtllm_fp8_block_expert_matmul, trtllm_fp8_block_deviations_from_vllm},
  };
  return table;
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

}  // namespace moepack
