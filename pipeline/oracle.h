// The backend oracle, offline: like vLLM's fused_moe/oracle/{int_wna16,int8,fp8,mxfp8}.py it
// picks a kernel backend for a quantisation scheme, but for a *target* GPU given as a flag (never
// the GPU present), and it keeps every candidate's rejection reasons. Every fact it uses comes
// from the registry rows: the source codec's scheme and refusals, each target layout's schemes,
// archs, priority and unsupported_reasons on the layer's shape.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/codec.h"

namespace moepack {

// What the oracle looks at for one MoE layer kind.
struct OracleQuery {
  QuantParams quant;  // the checkpoint's (after --quantize: the target's)
  int64_t experts = 0, hidden = 0, inter = 0;
  bool gated = true;
  // Whether w13 / w2 carry a non-trivial act-order g_idx (-1: take quant.act_order).
  int act_order_w13 = -1, act_order_w2 = -1;
  TargetArch arch = TargetArch::kSm90;
  std::string requested = "auto";  // "auto" or a backend name
  DType act_dtype = DType::kBF16;  // serving activations
  bool vllm_w13_scale_size_k = false;
  VllmTarget vllm_target = newest_vllm_target();
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
  // What vLLM's own oracle (for the query's --vllm-target and arch) would run instead of the
  // chosen layout, and why moepack writes the chosen one anyway; "" when they agree.
  std::string vllm_would_pick, vllm_note;
  nlohmann::json to_json() const;
  std::string explain() const;  // multi-line text
};

// Throws kUsage for an unknown requested backend (listing the registry's names).
OracleDecision choose_backend(const OracleQuery& q);

}  // namespace moepack
