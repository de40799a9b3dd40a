// Why a vLLM would not run one of its MoE backends that moepack has no layout row for: the
// VllmBackend::vllm_refusals hooks of the backend orders in vllm_target_rows()
// (formats/registry.cpp). Each mirrors the vLLM checks it cites, on what moepack knows before
// reading a byte (the checkpoint's QuantParams and the layer's MoeShape); checks on things a
// checkpoint does not fix (routing method, expert parallelism, optional packages) are not made.
// A backend with a moepack layout row is judged by that row instead.
#pragma once

#include <string>
#include <vector>

#include "formats/codec.h"

namespace moepack {

// vLLM 0.33.0's FLASHINFER_TRTLLM WNA16 backend (TrtLlmMxint4ExpertsMonolithic): 4-bit symmetric
// weights in groups of 32 (kInt4Static32), gated, no zero points and no expert bias
// (fused_moe/oracle/int_wna16.py, _backend_incompatibility_reason). GPTQ's and AWQ's MoE methods
// declare expert bias, so they reach it only through the MoeWNA16 fallback, taken where Marlin
// refuses the layer (AutoGPTQConfig / AutoAWQConfig.get_quant_method); AWQ always has zero points.
std::vector<std::string> vllm033_wna16_mxint4_refusals(const VllmTargetRow& target,
                                                       const QuantParams& q, const MoeShape& s);
// The same backend as ../shared/spec describes it for vLLM@9aaf83ef (wna16_marlin.md §7:
// compressed-tensors int4 with group size 32 when FlashInfer's mxint4 backend is available).
std::vector<std::string> spec_wna16_mxint4_refusals(const VllmTargetRow& target,
                                                    const QuantParams& q, const MoeShape& s);
// A WNA16 backend without a check of its own beyond the target's act-order rule (HUMMING): a
// vLLM that takes no act-order MoE checkpoint refuses them before any backend is tried.
std::vector<std::string> wna16_act_order_refusals(const VllmTargetRow& target, const QuantParams& q,
                                                  const MoeShape& s);
// vLLM 0.33.0's EMULATION WNA16 backend (Int4EmulationTritonExperts: 4-bit keys only). GPTQ and
// AWQ never reach it: their methods run Marlin first, and their MoeWNA16 fallback excludes it.
std::vector<std::string> vllm033_wna16_emulation_refusals(const VllmTargetRow& target,
                                                          const QuantParams& q, const MoeShape& s);
// A backend whose experts take gated layers only (_supports_no_act_and_mul() is False:
// DeepGemmExperts).
std::vector<std::string> gated_only_refusals(const VllmTargetRow& target, const QuantParams& q,
                                             const MoeShape& s);

}  // namespace moepack
