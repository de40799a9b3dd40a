// The backend oracle, offline: like vLLM's fused_moe/oracle/{int_wna16,int8,fp8,mxfp8}.py it
// picks a kernel backend for a quantisation scheme, but for a *target* GPU given as a flag (never
// the GPU present), and it keeps every candidate's rejection reasons. Every fact it uses comes
// from the rows: the source codec's scheme and refusals, the --vllm-target row's backend order
// for the scheme and arch (VllmTargetRow::moe_backend_orders), and each target layout row's
// schemes, archs and unsupported_reasons on the layer's shape.
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

// One backend of the target vLLM's order, as the oracle judged it for the layer.
struct VllmOrderVerdict {
  std::string backend;          // vLLM's name ("HUMMING")
  std::string moe_backend;      // its --moe-backend value, "" if none
  std::string layout;           // the moepack layout that writes what it reads ("" if none needed)
  bool moepack_writes = false;  // a layout row of that name takes the scheme
  bool vllm_runs = false;       // that vLLM would run it for this layer on the target arch
  std::string reads;            // what it reads (VllmBackend::reads)
  std::vector<std::string> reasons;  // why it would not (empty when it runs)
  // Where it runs (vLLM's oracle picks it) but its kernel fails on this layer's shape
  // (TargetLayout::kernel_failures): why. `auto` then writes the next layout of the order.
  std::vector<std::string> kernel_fails;
};

struct OracleDecision {
  std::string scheme;
  std::string chosen;                    // "" when nothing can take the layer
  std::vector<BackendVerdict> verdicts;  // candidates in vLLM's order (explicit: just that one)
  // vLLM's backend order for the scheme on the target arch, judged for the layer, and where it
  // comes from; empty when the target has no order for the scheme (no codec reads it).
  std::vector<VllmOrderVerdict> vllm_order;
  std::string vllm_order_source;
  // What the target vLLM's own oracle would run: the first backend of its order that it runs
  // here, named by its moepack layout where moepack writes it, else by its --moe-backend value
  // (vLLM's name without one); "" when it runs none or has no order.
  std::string vllm_would_pick;
  // Why moepack writes something else, from the rows; "" when vllm_would_pick is the chosen one.
  std::string vllm_note;
  nlohmann::json to_json() const;
  std::string explain() const;  // multi-line text
};

// Throws kUsage for an unknown requested backend (listing the layouts' names). The layout and
// vLLM target tables are parameters so that tests can show a new row taking effect; the CLI
// and the plan use the registry's.
OracleDecision choose_backend(const OracleQuery& q,
                              const std::vector<TargetLayout>& layouts = target_layouts(),
                              const std::vector<VllmTargetRow>& targets = vllm_target_rows());

}  // namespace moepack
