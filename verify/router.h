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
//   PhiMoE       models/phimoe PhimoeTopKRouter, sparsemixer (eval): expert 1 = argmax logit,
//                weight = softmax over the logits l with (max - l) / max(|l|, max) <= 2 eps;
//                expert 2 the same over the logits without expert 1 (eps = router_jitter_noise)
//   Llama-4      models/llama4 Llama4Router: top-k logits, sigmoid, the weight scales the expert's
//                INPUT (route_layer: expert input x * w, combine weight 1; top_k 1)
//   Gemma-4      models/gemma4 Gemma4TextRouter: softmax of proj(rms_norm(x) * scale * H^-0.5),
//                top-k renormalised, x per_expert_scale[e]
//   The others are rows of the above (model/routing.cpp: OLMoE = Qwen, Granite = Mixtral,
//   GLM-4.7-Flash / DeepSeek-V3.2 = DeepSeek-V3, MiniMax-M2 and ERNIE-4.5 = a correction bias on
//   sigmoid / softmax scores, Mistral-4 = softmax with sum-of-top-2 groups).
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
#include "model/routing.h"

namespace moepack::ref {

// The router's configuration is the model tier's (model/routing.h: one reader of the fields for
// convert and verify); verify's code names them here.
using moepack::group_score_name;
using moepack::GroupScore;
using moepack::router_config_from_hf;
using moepack::router_scoring_name;
using moepack::RouterConfig;
using moepack::RouterInput;
using moepack::RouterKind;
using moepack::RouterScoring;

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
// per_expert_scale [E] (required non-empty when cfg.has_per_expert_scale) multiplies each
// selected expert's final weight.
Routing route(const std::vector<float>& logits, const std::vector<float>& correction_bias,
              const RouterConfig& cfg, const std::vector<float>& per_expert_scale = {});

// One layer's router tensors as floats; empty where the router has none.
struct RouterTensors {
  std::vector<float> weight;            // [E, H]
  std::vector<float> bias;              // [E] (gpt-oss)
  std::vector<float> correction_bias;   // [E]
  std::vector<float> per_expert_scale;  // [E] (Gemma-4)
  std::vector<float> input_scale;       // [H] (Gemma-4 router.scale)
};

// The router's input from the hidden states x [T, H]: x itself, or Gemma-4's
// rms_norm(x, eps) * scale * H^-0.5 (double, rounded to float).
std::vector<float> router_input(const RouterConfig& cfg, const float* x, int64_t tokens,
                                int64_t hidden, const std::vector<float>& input_scale);

// Whether the CUDA runtime's routing kernels compute this router from the hidden states (top-k
// selection of the plain input, no per-expert scale, weights on the output). The others are routed
// by route_layer on the host and their routing uploaded.
bool device_routable(const RouterConfig& c);

// The router as the CUDA runtime's routing kernels take it (kernels/moe_runtime.h).
MoeRouterSpec runtime_router_spec(const RouterConfig& c);
// The device's routing (MoeRuntime::begin_layer) as the host's reference takes it.
Routing routing_from_device(const MoeDeviceRouting& d);

}  // namespace moepack::ref
