// The backend oracle, offline: like vLLM's fused_moe/oracle/{int_wna16,int8,fp8,mxfp8}.py it
// picks a kernel backend for a quantisation scheme, but for a *target* GPU given as a flag (never
// the GPU present), and it keeps every candidate's rejection reasons.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/codec.h"

namespace moepack {

enum class TargetArch { kSm80, kSm89, kSm90, kSm100, kSm120 };
TargetArch parse_target_arch(const std::string& s);  // throws kUsage
const char* target_arch_name(TargetArch a);
const std::vector<std::string>& backend_names();  // "marlin", "triton-wna16", ...

// What the oracle looks at for one MoE layer kind.
struct OracleQuery {
  QuantParams quant;   // the checkpoint's (after --quantize: the target's)
  std::string scheme;  // filled by the oracle: "wna16", "w8a8-int8", "mxfp8", ...
  int64_t experts = 0, hidden = 0, inter = 0;
  bool gated = true;
  TargetArch arch = TargetArch::kSm90;
  std::string requested = "auto";  // "auto" or a backend name
  LayoutOptions layout;            // act dtype etc. (prefix unused)
};

struct BackendVerdict {
  std::string backend;
  bool supported = false;
  std::vector<std::string> reasons;  // why not (empty when supported)
};

struct OracleDecision {
  std::string scheme;
  std::string chosen;                    // "" when nothing can take the layer
  std::vector<BackendVerdict> verdicts;  // candidates in priority order (explicit: just that one)
  nlohmann::json to_json() const;
  std::string explain() const;  // multi-line text
};

// A one-expert MoeExperts with the layer's real shapes and parameters and legal values; what
// the oracle and the planner probe layouts with (their refusals and output shapes).
// act_order_w13 / act_order_w2: whether that projection really carries a non-trivial g_idx
// (-1: take q.act_order).
MoeExperts probe_experts(const QuantParams& q, int64_t hidden, int64_t inter, bool gated,
                         int act_order_w13 = -1, int act_order_w2 = -1);

OracleDecision choose_backend(const OracleQuery& q);

}  // namespace moepack
