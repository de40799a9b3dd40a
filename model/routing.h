// How a model routes tokens to its experts, as its config.json says: the router (scoring, top-k,
// groups, scaling, correction bias) and which decoder layers are MoE layers. One reader of these
// fields for every command: Checkpoint::open judges a source with it (convert, inspect, merge,
// verify --source), and verify rebuilds the router it evaluates from it. A config it refuses is
// refused before anything is written.
//
// Mirrors transformers' and vLLM's readings of the fields (facts, not code):
//   Mixtral      models/mixtral: softmax, top-k, always renormalised; every layer is MoE
//   Qwen2/3-MoE  models/qwen3_moe: softmax, top-k, renormalised iff norm_topk_prob; layer i is MoE
//                iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
//   DeepSeek-V2  models/deepseek_v2: softmax; topk_method greedy or group_limited_greedy (group
//                score = MAX score of the group); x routed_scaling_factor; layer i is MoE iff
//                i >= first_k_dense_replace and i % moe_layer_freq == 0 (vLLM deepseek_v2.py)
//   DeepSeek-V3  models/deepseek_v3: sigmoid, e_score_correction_bias for SELECTION only, group
//                score = sum of the top-2 biased scores; Kimi-K2 and GLM-4.5 share it (GLM: layer
//                i is MoE iff i >= first_k_dense_replace)
//   gpt-oss      models/gpt_oss: top-k of the logits (the router has a bias), renormalised
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moepack {

enum class RouterScoring : uint8_t { kSoftmax, kSigmoid };

// How a group of experts is scored for group-limited selection.
enum class GroupScore : uint8_t {
  kNone,     // no group limit (n_group == 1 or topk_method greedy)
  kMax,      // DeepSeek-V2 group_limited_greedy: the best score in the group
  kSumTop2,  // DeepSeek-V3 noaux_tc: the sum of the two best biased scores in the group
};

struct RouterConfig {
  std::string family;  // "mixtral", "qwen3_moe", "deepseek_v3", ... (model_type), for reports
  RouterScoring scoring = RouterScoring::kSoftmax;
  int64_t num_experts = 0;      // routed experts E
  std::string num_experts_key;  // the config field E came from ("n_routed_experts", ...)
  int top_k = 1;
  bool renormalize = false;  // divide the selected weights by their sum (norm_topk_prob)
  int n_group = 1;
  int topk_group = 1;
  GroupScore group_score = GroupScore::kNone;
  double routed_scaling_factor = 1.0;
  bool has_correction_bias = false;  // e_score_correction_bias [E] (DeepSeek-V3 noaux_tc)
  bool has_router_bias = false;      // the router Linear has a bias (gpt-oss)

  // Throws kBadConfig when the numbers do not make a router (top_k > E, E % n_group, ...).
  void validate() const;
};

// Parses the router of a Hugging Face config.json (a nested "text_config" is used when the
// top level has no MoE fields, as in Qwen3-VL-MoE). Throws kBadConfig naming `file` and the field
// (missing, of the wrong type or out of range) or kUnsupported (unknown model_type, scoring_func
// or topk_method; the message lists the supported ones).
RouterConfig router_config_from_hf(const nlohmann::json& config,
                                   const std::string& file = "config.json");

// The tensors that route the experts of `module` ("model.layers.3.mlp"), as verify reads them and
// vLLM loads them: the router weight [E, H] is <module>.gate.weight, else <module>.router.weight
// (gpt-oss); its bias (gpt-oss) and e_score_correction_bias (noaux_tc) sit next to it. `exists`
// says which names the checkpoint holds. A name is "" where the router has no such tensor (no
// weight found, or the config uses no bias).
struct RouterTensorNames {
  std::string weight, bias, correction_bias;
};
RouterTensorNames router_tensor_names(const std::string& module, const RouterConfig& router,
                                      const std::function<bool(const std::string&)>& exists);

// Which decoder layers the config makes MoE layers, by the family's rule (above).
struct MoeLayerRule {
  std::vector<int64_t> mlp_only_layers;  // Qwen: always dense
  int64_t decoder_sparse_step = 1;       // Qwen: MoE iff (i + 1) % step == 0
  int64_t first_k_dense_replace = 0;     // DeepSeek / GLM: the first k layers are dense
  int64_t moe_layer_freq = 1;            // DeepSeek: MoE iff i % freq == 0
  std::string where;                     // "" or "text_config." (the fields' object)

  bool is_moe_layer(int64_t layer) const;
  // The field that makes `layer` dense ("mlp_only_layers", "first_k_dense_replace", ...), or ""
  // when the rule makes it an MoE layer. For messages.
  std::string dense_because(int64_t layer) const;
};
// The rule's fields of `config` (same object as the router's): kBadConfig naming `file` and the
// field for a value of the wrong type or range (decoder_sparse_step 0, a negative
// first_k_dense_replace, mlp_only_layers that is not a list of layer numbers).
MoeLayerRule moe_layer_rule_from_hf(const nlohmann::json& config,
                                    const std::string& file = "config.json");

const char* router_scoring_name(RouterScoring s);  // "softmax" / "sigmoid"
const char* group_score_name(GroupScore g);        // "none" / "max" / "sum_top2"

}  // namespace moepack
