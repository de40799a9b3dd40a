// Routers on hand-computed cases (expected values worked out from the formulas in the comments,
// not taken from our own output), config parsing, and deterministic tie-breaking.
#include "verify/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/error.h"

namespace moepack::ref {
namespace {

RouterConfig softmax_cfg(int64_t experts, int top_k, bool renormalize) {
  RouterConfig c;
  c.num_experts = experts;
  c.top_k = top_k;
  c.renormalize = renormalize;
  return c;
}

ErrorCode code_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no moepack::Error thrown";
  return ErrorCode::kInternal;
}

TEST(Router, SoftmaxTopKRenormalised) {
  // Mixtral: logits [1, 2, 3, 0] -> top-2 = experts 2, 1; renormalised weights
  // e^3 / (e^3 + e^2) = e / (e + 1) = 0.7310585786..., 1 / (e + 1) = 0.2689414213...
  const Routing r = route({1.f, 2.f, 3.f, 0.f}, {}, softmax_cfg(4, 2, true));
  ASSERT_EQ(r.tokens, 1);
  EXPECT_EQ(r.expert(0, 0), 2);
  EXPECT_EQ(r.expert(0, 1), 1);
  EXPECT_NEAR(r.weight(0, 0), 0.7310585786300049, 1e-12);
  EXPECT_NEAR(r.weight(0, 1), 0.2689414213699951, 1e-12);
}

TEST(Router, SoftmaxTopKNotRenormalised) {
  // Qwen-MoE with norm_topk_prob = false: the weights are the full softmax probabilities.
  // Z = e + e^2 + e^3 + 1 = 31.19287485...; p2 = e^3 / Z = 0.6439142599, p1 = e^2 / Z =
  // 0.2368828181.
  const Routing r = route({1.f, 2.f, 3.f, 0.f, 1.f, 2.f, 3.f, 0.f}, {}, softmax_cfg(4, 2, false));
  ASSERT_EQ(r.tokens, 2);
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(r.expert(t, 0), 2);
    EXPECT_EQ(r.expert(t, 1), 1);
    EXPECT_NEAR(r.weight(t, 0), 0.6439142598879722, 1e-12);
    EXPECT_NEAR(r.weight(t, 1), 0.23688281808991013, 1e-12);
  }
}

TEST(Router, TiesGoToTheLowerExpertId) {
  // All equal: top-3 of 5 must be 0, 1, 2 with 1/3 each after renormalisation.
  Routing r = route({0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, {}, softmax_cfg(5, 3, true));
  EXPECT_EQ(r.expert(0, 0), 0);
  EXPECT_EQ(r.expert(0, 1), 1);
  EXPECT_EQ(r.expert(0, 2), 2);
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(r.weight(0, k), 1.0 / 3.0, 1e-15);
  // A tie for the last place: [1, 3, 0, 3, 2] top-2 -> 1 then 3 (3 == 3, lower id first).
  r = route({1.f, 3.f, 0.f, 3.f, 2.f}, {}, softmax_cfg(5, 2, true));
  EXPECT_EQ(r.expert(0, 0), 1);
  EXPECT_EQ(r.expert(0, 1), 3);
  // top-1 of a tie at the end of the row.
  r = route({0.f, 0.f, 7.f, 7.f}, {}, softmax_cfg(4, 1, true));
  EXPECT_EQ(r.expert(0, 0), 2);
  EXPECT_NEAR(r.weight(0, 0), 1.0, 1e-15);
}

// DeepSeek-V3 noaux_tc, E = 8 in 4 groups of 2, topk_group 2, top_k 2, norm, scale 2.5.
// logits chosen so that sigmoid gives round numbers: ln 9 -> 0.9, ln 3 -> 0.75, 0 -> 0.5,
// ln(1/3) -> 0.25, ln(1/9) -> 0.1.
//   expert      0     1     2     3     4     5     6     7
//   score s    0.9   0.1   0.75  0.75  0.5   0.5   0.25  0.1
//   bias       0     0     0    -0.3   0.2   0.2   0.7   0
//   biased c   0.9   0.1   0.75  0.45  0.7   0.7   0.95  0.1
//   group (sum of top-2 c): g0 1.0, g1 1.2, g2 1.4, g3 1.05 -> keep g2, g1
//   (expert 6 has the best biased score and expert 0 the best unbiased one: both excluded)
//   top-2 of c in {2,3,4,5}: 2 (0.75), then 4 and 5 tie at 0.7 -> 4 (lower id)
//   (without the bias it would be 2 and 3: the bias changes the selection)
//   weights: unbiased s = 0.75, 0.5 -> /1.25 = 0.6, 0.4 -> x2.5 = 1.5, 1.0
TEST(Router, DeepSeekV3SigmoidCorrectionBiasGrouped) {
  RouterConfig c;
  c.family = "deepseek_v3";
  c.scoring = RouterScoring::kSigmoid;
  c.num_experts = 8;
  c.top_k = 2;
  c.renormalize = true;
  c.n_group = 4;
  c.topk_group = 2;
  c.group_score = GroupScore::kSumTop2;
  c.routed_scaling_factor = 2.5;
  c.has_correction_bias = true;
  const float l9 = std::log(9.0f), l3 = std::log(3.0f);
  const std::vector<float> logits = {l9, -l9, l3, l3, 0.f, 0.f, -l3, -l9};
  const std::vector<float> bias = {0.f, 0.f, 0.f, -0.3f, 0.2f, 0.2f, 0.7f, 0.f};
  const Routing r = route(logits, bias, c);
  EXPECT_EQ(r.expert(0, 0), 2);
  EXPECT_EQ(r.expert(0, 1), 4);
  EXPECT_NEAR(r.weight(0, 0), 1.5, 1e-6);
  EXPECT_NEAR(r.weight(0, 1), 1.0, 1e-6);

  // Without the group limit (n_group 1) expert 6 (c = 0.95) and 0 (0.9) win;
  // weights s = 0.25, 0.9 -> /1.15 -> x2.5 = 0.5434782..., 1.9565217...
  c.n_group = 1;
  c.topk_group = 1;
  const Routing flat = route(logits, bias, c);
  EXPECT_EQ(flat.expert(0, 0), 6);
  EXPECT_EQ(flat.expert(0, 1), 0);
  EXPECT_NEAR(flat.weight(0, 0), 2.5 * 0.25 / 1.15, 1e-6);
  EXPECT_NEAR(flat.weight(0, 1), 2.5 * 0.9 / 1.15, 1e-6);

  // No normalisation: weights are the raw sigmoid scores x 2.5 (0.625, 2.25).
  c.renormalize = false;
  const Routing raw = route(logits, bias, c);
  EXPECT_NEAR(raw.weight(0, 0), 0.625, 1e-6);
  EXPECT_NEAR(raw.weight(0, 1), 2.25, 1e-6);
}

TEST(Router, DeepSeekV2GroupLimitedGreedyRanksGroupsByMax) {
  // logits [2, 0, 1.5, 1.5], 2 groups, keep 1, top-2, routed_scaling_factor 16, no renorm.
  // group maxima: g0 = p0 > g1 = p2 -> experts 0 and 1 although 2 and 3 score higher than 1.
  // Z = e^2 + 1 + 2 e^1.5 = 17.35755...; weights 16 e^2 / Z, 16 / Z.
  RouterConfig c = softmax_cfg(4, 2, false);
  c.n_group = 2;
  c.topk_group = 1;
  c.group_score = GroupScore::kMax;
  c.routed_scaling_factor = 16.0;
  const Routing r = route({2.f, 0.f, 1.5f, 1.5f}, {}, c);
  const double z = std::exp(2.0) + 1.0 + 2.0 * std::exp(1.5);
  EXPECT_EQ(r.expert(0, 0), 0);
  EXPECT_EQ(r.expert(0, 1), 1);
  EXPECT_NEAR(r.weight(0, 0), 16.0 * std::exp(2.0) / z, 1e-9);
  EXPECT_NEAR(r.weight(0, 1), 16.0 / z, 1e-9);
}

TEST(Router, GroupTieGoesToTheLowerGroup) {
  // Two groups with identical scores: keep group 0.
  RouterConfig c = softmax_cfg(4, 2, true);
  c.n_group = 2;
  c.topk_group = 1;
  c.group_score = GroupScore::kMax;
  const Routing r = route({1.f, 0.f, 1.f, 0.f}, {}, c);
  EXPECT_EQ(r.expert(0, 0), 0);
  EXPECT_EQ(r.expert(0, 1), 1);
}

TEST(Router, GptOssSoftmaxOverTopKLogits) {
  // softmax over the top-2 logits [3, 2] = [e / (1 + e), 1 / (1 + e)].
  const nlohmann::json cfg = {{"model_type", "gpt_oss"},
                              {"num_local_experts", 4},
                              {"experts_per_token", 2},
                              {"hidden_act", "silu"}};
  const RouterConfig c = router_config_from_hf(cfg);
  EXPECT_TRUE(c.has_router_bias);
  const Routing r = route({1.f, 3.f, 2.f, -1.f}, {}, c);
  EXPECT_EQ(r.expert(0, 0), 1);
  EXPECT_EQ(r.expert(0, 1), 2);
  EXPECT_NEAR(r.weight(0, 0), 0.7310585786300049, 1e-12);
  EXPECT_NEAR(r.weight(0, 1), 0.2689414213699951, 1e-12);
}

// gpt-oss' swiglu_limit: vLLM 0.33 and transformers clamp at 7.0 whatever the config says, so
// the published 7.0 is read and any other limit is refused (never verified with 7).
TEST(RouterConfigFromHf, GptOssSwigluLimit) {
  nlohmann::json cfg = {{"model_type", "gpt_oss"},
                        {"num_local_experts", 4},
                        {"num_experts_per_tok", 2},
                        {"swiglu_limit", 7.0}};
  EXPECT_NO_THROW(router_config_from_hf(cfg));
  cfg["swiglu_limit"] = 10.0;
  try {
    router_config_from_hf(cfg, "cfg.json");
    ADD_FAILURE() << "swiglu_limit 10 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.file(), "cfg.json");
    EXPECT_NE(e.message().find("swiglu_limit"), std::string::npos) << e.what();
  }
  cfg["swiglu_limit"] = "7";
  try {
    router_config_from_hf(cfg, "cfg.json");
    ADD_FAILURE() << "swiglu_limit \"7\" accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadConfig);
  }
}

TEST(Router, TokensPerExpert) {
  const Routing r = route({1.f, 2.f, 3.f, 0.f, 3.f, 2.f, 1.f, 0.f}, {}, softmax_cfg(4, 2, true));
  const std::vector<int64_t> n = r.tokens_per_expert(4);
  EXPECT_EQ(n, (std::vector<int64_t>{1, 2, 1, 0}));
}

TEST(RouterConfigFromHf, Mixtral) {
  const RouterConfig c = router_config_from_hf(
      {{"model_type", "mixtral"}, {"num_local_experts", 8}, {"num_experts_per_tok", 2}});
  EXPECT_EQ(c.scoring, RouterScoring::kSoftmax);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_TRUE(c.renormalize);
  EXPECT_EQ(c.group_score, GroupScore::kNone);
  EXPECT_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_FALSE(c.has_correction_bias);
}

TEST(RouterConfigFromHf, Qwen) {
  RouterConfig c = router_config_from_hf({{"model_type", "qwen3_moe"},
                                          {"num_experts", 128},
                                          {"num_experts_per_tok", 8},
                                          {"norm_topk_prob", true}});
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_TRUE(c.renormalize);
  c = router_config_from_hf(
      {{"model_type", "qwen2_moe"}, {"num_experts", 60}, {"num_experts_per_tok", 4}});
  EXPECT_FALSE(c.renormalize);  // Qwen2-MoE default norm_topk_prob = false
  // transformers >= 5 saves Qwen3-MoE with num_local_experts (issue 11, item 4).
  c = router_config_from_hf(
      {{"model_type", "qwen3_moe"}, {"num_local_experts", 16}, {"num_experts_per_tok", 2}});
  EXPECT_EQ(c.num_experts, 16);
  // Qwen3-VL-MoE: the MoE fields live in text_config.
  c = router_config_from_hf({{"model_type", "qwen3_vl_moe"},
                             {"text_config",
                              {{"model_type", "qwen3_vl_moe_text"},
                               {"num_experts", 128},
                               {"num_experts_per_tok", 8},
                               {"norm_topk_prob", true}}}});
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_TRUE(c.renormalize);
}

TEST(RouterConfigFromHf, DeepSeekV3) {
  const RouterConfig c = router_config_from_hf({{"model_type", "deepseek_v3"},
                                                {"n_routed_experts", 256},
                                                {"num_experts_per_tok", 8},
                                                {"n_group", 8},
                                                {"topk_group", 4},
                                                {"norm_topk_prob", true},
                                                {"routed_scaling_factor", 2.5},
                                                {"scoring_func", "sigmoid"},
                                                {"topk_method", "noaux_tc"}});
  EXPECT_EQ(c.scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(c.group_score, GroupScore::kSumTop2);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_TRUE(c.renormalize);
  EXPECT_TRUE(c.has_correction_bias);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
}

TEST(RouterConfigFromHf, DeepSeekV2) {
  RouterConfig c = router_config_from_hf({{"model_type", "deepseek_v2"},
                                          {"n_routed_experts", 160},
                                          {"num_experts_per_tok", 6},
                                          {"n_group", 8},
                                          {"topk_group", 3},
                                          {"norm_topk_prob", false},
                                          {"routed_scaling_factor", 16.0},
                                          {"scoring_func", "softmax"},
                                          {"topk_method", "group_limited_greedy"}});
  EXPECT_EQ(c.scoring, RouterScoring::kSoftmax);
  EXPECT_EQ(c.group_score, GroupScore::kMax);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 3);
  EXPECT_FALSE(c.renormalize);
  EXPECT_FALSE(c.has_correction_bias);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 16.0);
  // V2-Lite: greedy (the remote code's default spelling "gready"), no group limit.
  c = router_config_from_hf({{"model_type", "deepseek_v2"},
                             {"n_routed_experts", 64},
                             {"num_experts_per_tok", 6},
                             {"n_group", 1},
                             {"topk_group", 1},
                             {"topk_method", "gready"}});
  EXPECT_EQ(c.group_score, GroupScore::kNone);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.0);
}

TEST(RouterConfigFromHf, Errors) {
  EXPECT_EQ(code_of([] {
              router_config_from_hf({{"model_type", "llama"}});
            }),
            ErrorCode::kUnsupported);
  EXPECT_EQ(code_of([] {
              router_config_from_hf({{"model_type", "mixtral"}, {"num_local_experts", 8}});
            }),
            ErrorCode::kBadConfig);
  EXPECT_EQ(
      code_of([] {
        router_config_from_hf(
            {{"model_type", "mixtral"}, {"num_local_experts", 2}, {"num_experts_per_tok", 3}});
      }),
      ErrorCode::kBadConfig);
  EXPECT_EQ(code_of([] {
              router_config_from_hf({{"model_type", "deepseek_v3"},
                                     {"n_routed_experts", 10},
                                     {"num_experts_per_tok", 2},
                                     {"n_group", 4},
                                     {"topk_group", 2}});
            }),
            ErrorCode::kBadConfig);  // 4 groups do not divide 10 experts
  EXPECT_EQ(
      code_of([] {
        router_config_from_hf(
            {{"model_type", "mixtral"}, {"num_local_experts", "8"}, {"num_experts_per_tok", 2}});
      }),
      ErrorCode::kBadConfig);
  EXPECT_EQ(code_of([] {
              router_config_from_hf({{"model_type", "deepseek_v3"},
                                     {"n_routed_experts", 8},
                                     {"num_experts_per_tok", 2},
                                     {"topk_method", "weird"}});
            }),
            ErrorCode::kUnsupported);
}

// Which decoder layers are MoE layers, by the family's fields (transformers / vLLM rules).
TEST(MoeLayerRuleFromHf, PerFamily) {
  MoeLayerRule q = moe_layer_rule_from_hf(
      {{"model_type", "qwen3_moe"}, {"mlp_only_layers", {0, 3}}, {"decoder_sparse_step", 2}});
  EXPECT_FALSE(q.is_moe_layer(0));  // mlp_only_layers
  EXPECT_TRUE(q.is_moe_layer(1));   // (1 + 1) % 2 == 0
  EXPECT_FALSE(q.is_moe_layer(2));  // (2 + 1) % 2 != 0
  EXPECT_FALSE(q.is_moe_layer(3));  // mlp_only_layers
  EXPECT_EQ(q.dense_because(3), "mlp_only_layers = [0,3]");
  EXPECT_EQ(q.dense_because(2), "decoder_sparse_step = 2");
  MoeLayerRule d = moe_layer_rule_from_hf(
      {{"model_type", "deepseek_v2"}, {"first_k_dense_replace", 1}, {"moe_layer_freq", 2}});
  EXPECT_FALSE(d.is_moe_layer(0));
  EXPECT_FALSE(d.is_moe_layer(1));  // 1 % 2 != 0
  EXPECT_TRUE(d.is_moe_layer(2));
  // GLM-4.5: first_k_dense_replace only; Mixtral: every layer.
  EXPECT_TRUE(moe_layer_rule_from_hf(
                  {{"model_type", "glm4_moe"}, {"first_k_dense_replace", 1}, {"moe_layer_freq", 5}})
                  .is_moe_layer(3));
  EXPECT_TRUE(moe_layer_rule_from_hf({{"model_type", "mixtral"}}).is_moe_layer(7));
  // Qwen3-VL: the fields live in text_config, and say so.
  const MoeLayerRule vl =
      moe_layer_rule_from_hf({{"model_type", "qwen3_vl_moe"},
                              {"text_config", {{"num_experts", 4}, {"mlp_only_layers", {1}}}}});
  EXPECT_EQ(vl.dense_because(1), "text_config.mlp_only_layers = [1]");
}

TEST(MoeLayerRuleFromHf, MalformedFields) {
  for (const nlohmann::json& c :
       {nlohmann::json{{"model_type", "qwen3_moe"}, {"decoder_sparse_step", 0}},
        nlohmann::json{{"model_type", "qwen3_moe"}, {"decoder_sparse_step", "1"}},
        nlohmann::json{{"model_type", "qwen3_moe"}, {"mlp_only_layers", 1}},
        nlohmann::json{{"model_type", "qwen3_moe"}, {"mlp_only_layers", {-1}}},
        nlohmann::json{{"model_type", "deepseek_v3"}, {"first_k_dense_replace", -1}},
        nlohmann::json{{"model_type", "deepseek_v3"}, {"moe_layer_freq", 0}}})
    EXPECT_EQ(code_of([&] { moe_layer_rule_from_hf(c, "/x/config.json"); }), ErrorCode::kBadConfig)
        << c.dump();
}

// The router's tensors by the names vLLM loads and verify reads.
TEST(RouterTensorNames, GateThenRouterWithTheConfigsBiases) {
  RouterConfig v3;
  v3.has_correction_bias = true;
  const std::set<std::string> have = {"m.gate.weight", "m.gate.e_score_correction_bias"};
  const auto exists = [&](const std::string& n) { return have.count(n) != 0; };
  RouterTensorNames n = router_tensor_names("m", v3, exists);
  EXPECT_EQ(n.weight, "m.gate.weight");
  EXPECT_EQ(n.correction_bias, "m.gate.e_score_correction_bias");
  EXPECT_EQ(n.bias, "");
  RouterConfig oss;
  oss.has_router_bias = true;
  n = router_tensor_names("m", oss, [](const std::string& s) { return s == "m.router.weight"; });
  EXPECT_EQ(n.weight, "m.router.weight");
  EXPECT_EQ(n.bias, "m.router.bias");
  EXPECT_EQ(router_tensor_names("m", oss, [](const std::string&) { return false; }).weight, "");
}

// Errors name the real file and the field as the config spells it.
TEST(RouterConfigFromHf, ErrorsNameFileAndField) {
  try {
    router_config_from_hf({{"model_type", "qwen3_vl_moe"},
                           {"text_config", {{"num_experts", 4}, {"num_experts_per_tok", 8}}}},
                          "/ckpt/config.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.file(), "/ckpt/config.json");
    EXPECT_EQ(e.message().rfind("text_config.num_experts_per_tok: ", 0), 0u) << e.message();
  }
}

TEST(Router, InputErrors) {
  RouterConfig c = softmax_cfg(4, 2, true);
  EXPECT_EQ(code_of([&] { route({1.f, 2.f, 3.f}, {}, c); }), ErrorCode::kBadShape);
  EXPECT_EQ(code_of([&] { route({1.f, NAN, 3.f, 0.f}, {}, c); }), ErrorCode::kBadValue);
  c.scoring = RouterScoring::kSigmoid;
  c.has_correction_bias = true;
  EXPECT_EQ(code_of([&] { route({1.f, 2.f, 3.f, 0.f}, {}, c); }), ErrorCode::kMissingTensor);
}

}  // namespace
}  // namespace moepack::ref
