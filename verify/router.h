// MoE routers of the supported model families: router logits -> per token top-k (expert, weight).
//
//   logits [T, E] --score--> s [T, E] --(+ correction bias, selection only)--> c [T, E]
//     --(grouped: keep topk_group groups by group score)--> top_k of c (ties: lower expert id)
//     --> weights = s[selected] (/ their sum if renormalize) * routed_scaling_factor
//
// Mirrors transformers' routers (facts, not code):
//   Mixtral      models/mixtral/modeling_mixtral.py   softmax, top-k, always renormalised
//   Qwen2/3-MoE  models/qwen3_moe/modeling_qwen3_moe.py  softmax, top-k, renormalised iff
//                norm_topk_prob
//   DeepSeek-V2  models/deepseek_v2/modeling_deepseek_v2.py  softmax; topk_method greedy or
//                group_limited_greedy (group score = MAX score of the group); x routed_scaling
//   DeepSeek-V3  models/deepseek_v3/modeling_deepseek_v3.py DeepseekV3TopkRouter: sigmoid,
//                e_score_correction_bias added for SELECTION only, group score = sum of the top-2
//                biased scores, weights = unbiased sigmoid of the selected experts, / (sum+1e-20)
//                iff norm_topk_prob, x routed_scaling_factor (Kimi-K2, GLM-4.5 share it)
//   gpt-oss      models/gpt_oss/modeling_gpt_oss.py  top-k of the logits (router has a bias),
//                softmax over those k logits == softmax over all, top-k, renormalised
//
// One deliberate choice where transformers and vLLM differ: experts of groups that were not
// kept are EXCLUDED (vLLM grouped_topk masks them with -inf); transformers masks them with 0.0,
// which only matters when fewer than top_k biased scores in the kept groups are positive.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/moe_runtime.h"

namespace moepack::ref {

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
  int64_t num_experts = 0;  // routed experts E
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
// top level has no MoE fields, as in Qwen3-VL-MoE). Throws kBadConfig (missing/invalid field)
// or kUnsupported (unknown model_type; the message lists the supported ones).
RouterConfig router_config_from_hf(const nlohmann::json& config);

// The routing of T tokens: row t holds the top_k selections of token t, best first.
struct Routing {
  int64_t tokens = 0;
  int top_k = 0;
  std::vector<int32_t> expert_ids;  // [T, top_k]
  std::vector<double> weights;      // [T, top_k], already x routed_scaling_factor

  int32_t expert(int64_t t, int k) const { return expert_ids[static_cast<size_t>(t * top_k + k)]; }
  double weight(int64_t t, int k) const { return weights[static_cast<size_t>(t * top_k + k)]; }
  // Number of tokens routed to each of `experts` experts.
  std::vector<int64_t> tokens_per_expert(int64_t experts) const;
};

// Routes T = logits.size() / cfg.num_experts tokens. logits [T, E] = router_weight . x (+ router
// bias). correction_bias [E] or empty (required non-empty when cfg.has_correction_bias).
// Scores are computed in double. Equal selection scores go to the lower expert id (and the lower
// group id), so the result never depends on the platform's sort. Non-finite logits: kBadValue.
Routing route(const std::vector<float>& logits, const std::vector<float>& correction_bias,
              const RouterConfig& cfg);

const char* router_scoring_name(RouterScoring s);  // "softmax" / "sigmoid"
const char* group_score_name(GroupScore g);        // "none" / "max" / "sum_top2"

// The router as the CUDA runtime's routing kernels take it (kernels/moe_runtime.h).
MoeRouterSpec runtime_router_spec(const RouterConfig& c);

}  // namespace moepack::ref
