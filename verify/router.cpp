#include "verify/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace moepack::ref {
namespace {

Error bad_config(const std::string& field, const std::string& message) {
  return Error(ErrorCode::kBadConfig, "config.json", field, message);
}

// The object holding the MoE fields: the top level, or "text_config" for multimodal wrappers.
const nlohmann::json& moe_section(const nlohmann::json& config) {
  static const char* kExpertKeys[] = {"num_local_experts", "num_experts", "n_routed_experts"};
  for (const char* key : kExpertKeys)
    if (config.contains(key)) return config;
  if (config.contains("text_config") && config["text_config"].is_object()) {
    const nlohmann::json& text = config["text_config"];
    for (const char* key : kExpertKeys)
      if (text.contains(key)) return text;
  }
  return config;
}

const nlohmann::json* find_key(const nlohmann::json& section, const nlohmann::json& top,
                               const char* key) {
  if (section.contains(key) && !section[key].is_null()) return &section[key];
  if (top.contains(key) && !top[key].is_null()) return &top[key];
  return nullptr;
}

int64_t get_int(const nlohmann::json& section, const nlohmann::json& top,
                std::initializer_list<const char*> keys, const int64_t* fallback) {
  for (const char* key : keys) {
    const nlohmann::json* v = find_key(section, top, key);
    if (!v) continue;
    if (!v->is_number_integer() && !v->is_number_unsigned())
      throw bad_config(key, std::string("expected an integer, got ") + v->dump());
    return v->get<int64_t>();
  }
  if (fallback) return *fallback;
  throw bad_config(*keys.begin(), "missing (needed to rebuild the MoE router)");
}

double get_double(const nlohmann::json& section, const nlohmann::json& top, const char* key,
                  double fallback) {
  const nlohmann::json* v = find_key(section, top, key);
  if (!v) return fallback;
  if (!v->is_number()) throw bad_config(key, std::string("expected a number, got ") + v->dump());
  return v->get<double>();
}

bool get_bool(const nlohmann::json& section, const nlohmann::json& top, const char* key,
              bool fallback) {
  const nlohmann::json* v = find_key(section, top, key);
  if (!v) return fallback;
  if (!v->is_boolean()) throw bad_config(key, std::string("expected true/false, got ") + v->dump());
  return v->get<bool>();
}

std::string get_string(const nlohmann::json& section, const nlohmann::json& top, const char* key,
                       const std::string& fallback) {
  const nlohmann::json* v = find_key(section, top, key);
  if (!v) return fallback;
  if (!v->is_string()) throw bad_config(key, std::string("expected a string, got ") + v->dump());
  return v->get<std::string>();
}

int to_int(int64_t v, const char* key) {
  if (v <= 0 || v > std::numeric_limits<int>::max())
    throw bad_config(key, "must be a positive integer, got " + std::to_string(v));
  return static_cast<int>(v);
}

// DeepSeek-V2 / V3 / Kimi-K2 / GLM-4.5 (MoEGate with scoring_func and topk_method).
void parse_deepseek(const nlohmann::json& s, const nlohmann::json& top, bool v3_defaults,
                    RouterConfig* cfg) {
  cfg->num_experts = get_int(s, top, {"n_routed_experts"}, nullptr);
  cfg->top_k = to_int(get_int(s, top, {"num_experts_per_tok"}, nullptr), "num_experts_per_tok");
  const std::string scoring =
      get_string(s, top, "scoring_func", v3_defaults ? "sigmoid" : "softmax");
  if (scoring == "softmax") {
    cfg->scoring = RouterScoring::kSoftmax;
  } else if (scoring == "sigmoid") {
    cfg->scoring = RouterScoring::kSigmoid;
  } else {
    throw Error(ErrorCode::kUnsupported, "config.json", "scoring_func",
                "scoring_func '" + scoring + "' is not supported (softmax, sigmoid)");
  }
  // The DeepSeek-V2 remote code's default spells it "gready".
  std::string method = get_string(s, top, "topk_method", v3_defaults ? "noaux_tc" : "greedy");
  if (method == "gready") method = "greedy";
  const int64_t one = 1;
  const int n_group = to_int(get_int(s, top, {"n_group"}, &one), "n_group");
  const int topk_group = to_int(get_int(s, top, {"topk_group"}, &one), "topk_group");
  if (method == "greedy") {
    cfg->group_score = GroupScore::kNone;
  } else if (method == "group_limited_greedy") {
    cfg->group_score = GroupScore::kMax;
    cfg->n_group = n_group;
    cfg->topk_group = topk_group;
  } else if (method == "noaux_tc") {
    if (cfg->scoring != RouterScoring::kSigmoid)
      throw Error(ErrorCode::kUnsupported, "config.json", "topk_method",
                  "topk_method noaux_tc with scoring_func " + scoring + " is not supported");
    cfg->group_score = GroupScore::kSumTop2;
    cfg->n_group = n_group;
    cfg->topk_group = topk_group;
    cfg->has_correction_bias = true;
  } else {
    throw Error(ErrorCode::kUnsupported, "config.json", "topk_method",
                "topk_method '" + method +
                    "' is not supported (greedy, group_limited_greedy, "
                    "noaux_tc)");
  }
  cfg->renormalize = get_bool(s, top, "norm_topk_prob", v3_defaults);
  cfg->routed_scaling_factor = get_double(s, top, "routed_scaling_factor", 1.0);
}

}  // namespace

void RouterConfig::validate() const {
  if (num_experts <= 0)
    throw bad_config("num_experts", "must be positive, got " + std::to_string(num_experts));
  if (top_k <= 0 || top_k > num_experts)
    throw bad_config("num_experts_per_tok", "top_k " + std::to_string(top_k) + " must be in [1, " +
                                                std::to_string(num_experts) + "]");
  if (n_group <= 0 || num_experts % n_group != 0)
    throw bad_config("n_group", "n_group " + std::to_string(n_group) + " must divide " +
                                    std::to_string(num_experts) + " experts");
  if (topk_group <= 0 || topk_group > n_group)
    throw bad_config("topk_group", "topk_group " + std::to_string(topk_group) +
                                       " must be in [1, n_group " + std::to_string(n_group) + "]");
  if (group_score != GroupScore::kNone &&
      static_cast<int64_t>(top_k) > static_cast<int64_t>(topk_group) * (num_experts / n_group))
    throw bad_config("topk_group", "top_k " + std::to_string(top_k) + " exceeds the " +
                                       std::to_string(topk_group * (num_experts / n_group)) +
                                       " experts of the kept groups");
  if (!std::isfinite(routed_scaling_factor))
    throw bad_config("routed_scaling_factor", "must be finite");
}

RouterConfig router_config_from_hf(const nlohmann::json& config) {
  if (!config.is_object()) throw bad_config("", "config.json is not a JSON object");
  const nlohmann::json& s = moe_section(config);
  const std::string model_type = get_string(s, config, "model_type", "");
  RouterConfig cfg;
  cfg.family = model_type;
  if (model_type == "mixtral") {
    cfg.num_experts = get_int(s, config, {"num_local_experts"}, nullptr);
    cfg.top_k = to_int(get_int(s, config, {"num_experts_per_tok"}, nullptr), "num_experts_per_tok");
    cfg.renormalize = true;
  } else if (model_type == "qwen2_moe" || model_type == "qwen3_moe" ||
             model_type == "qwen3_vl_moe" || model_type == "qwen3_vl_moe_text" ||
             model_type == "qwen3_next" || model_type == "qwen3_5_moe" ||
             model_type == "qwen3_5_moe_text") {
    // transformers >= 5 saves Qwen3-MoE configs with num_local_experts instead of num_experts.
    cfg.num_experts = get_int(s, config, {"num_experts", "num_local_experts"}, nullptr);
    cfg.top_k = to_int(get_int(s, config, {"num_experts_per_tok"}, nullptr), "num_experts_per_tok");
    cfg.renormalize = get_bool(s, config, "norm_topk_prob", false);
  } else if (model_type == "deepseek_v2") {
    parse_deepseek(s, config, /*v3_defaults=*/false, &cfg);
  } else if (model_type == "deepseek_v3" || model_type == "kimi_k2" || model_type == "glm4_moe") {
    parse_deepseek(s, config, /*v3_defaults=*/true, &cfg);
  } else if (model_type == "gpt_oss") {
    // Softmax over the top-k logits equals softmax over all logits renormalised over the top k.
    cfg.num_experts = get_int(s, config, {"num_local_experts"}, nullptr);
    cfg.top_k = to_int(get_int(s, config, {"num_experts_per_tok", "experts_per_token"}, nullptr),
                       "num_experts_per_tok");
    cfg.renormalize = true;
    cfg.has_router_bias = true;
  } else {
    throw Error(ErrorCode::kUnsupported, "config.json", "model_type",
                "no router for model_type '" + model_type +
                    "' (supported: mixtral, qwen2_moe, qwen3_moe, qwen3_vl_moe, qwen3_next, "
                    "qwen3_5_moe, deepseek_v2, deepseek_v3, kimi_k2, glm4_moe, gpt_oss)");
  }
  cfg.validate();
  return cfg;
}

std::vector<int64_t> Routing::tokens_per_expert(int64_t experts) const {
  std::vector<int64_t> counts(static_cast<size_t>(experts), 0);
  for (int32_t e : expert_ids)
    if (e >= 0 && e < experts) ++counts[static_cast<size_t>(e)];
  return counts;
}

Routing route(const std::vector<float>& logits, const std::vector<float>& correction_bias,
              const RouterConfig& cfg) {
  cfg.validate();
  const int64_t E = cfg.num_experts;
  if (logits.size() % static_cast<size_t>(E) != 0)
    throw Error(ErrorCode::kBadShape, "", "router_logits",
                "logits hold " + std::to_string(logits.size()) +
                    " values, not a multiple of E=" + std::to_string(E));
  const int64_t T = static_cast<int64_t>(logits.size()) / E;
  if (cfg.has_correction_bias && correction_bias.size() != static_cast<size_t>(E))
    throw Error(ErrorCode::kMissingTensor, "", "e_score_correction_bias",
                "router needs a correction bias of " + std::to_string(E) + " values, got " +
                    std::to_string(correction_bias.size()));
  const bool use_bias = cfg.has_correction_bias;
  const int64_t group_size = E / cfg.n_group;
  const bool grouped = cfg.group_score != GroupScore::kNone && cfg.topk_group < cfg.n_group;

  Routing r;
  r.tokens = T;
  r.top_k = cfg.top_k;
  r.expert_ids.resize(static_cast<size_t>(T * cfg.top_k));
  r.weights.resize(static_cast<size_t>(T * cfg.top_k));

  std::vector<double> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::vector<double> group_value(static_cast<size_t>(cfg.n_group));
  std::vector<int32_t> group_order(static_cast<size_t>(cfg.n_group));
  std::vector<char> group_kept(static_cast<size_t>(cfg.n_group));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  // Best first; equal values go to the lower index (deterministic tie-breaking).
  auto by_value_desc = [](const std::vector<double>* v) {
    return [v](int32_t a, int32_t b) {
      const double va = (*v)[static_cast<size_t>(a)], vb = (*v)[static_cast<size_t>(b)];
      return va > vb || (va == vb && a < b);
    };
  };

  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      if (!std::isfinite(row[e]))
        throw Error(ErrorCode::kBadValue, "", "router_logits",
                    "non-finite router logit at token " + std::to_string(t) + ", expert " +
                        std::to_string(e));
    }
    if (cfg.scoring == RouterScoring::kSoftmax) {
      double mx = row[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(row[e]));
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        score[static_cast<size_t>(e)] = std::exp(static_cast<double>(row[e]) - mx);
        sum += score[static_cast<size_t>(e)];
      }
      for (double& v : score) v /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e)
        score[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-static_cast<double>(row[e])));
    }
    for (int64_t e = 0; e < E; ++e)
      choice[static_cast<size_t>(e)] =
          score[static_cast<size_t>(e)] +
          (use_bias ? static_cast<double>(correction_bias[static_cast<size_t>(e)]) : 0.0);

    if (grouped) {
      for (int g = 0; g < cfg.n_group; ++g) {
        const double* c = choice.data() + static_cast<int64_t>(g) * group_size;
        double v;
        if (cfg.group_score == GroupScore::kMax) {
          v = *std::max_element(c, c + group_size);
        } else {
          // Sum of the two best (a group of one expert contributes its only score).
          double best = neg_inf, second = neg_inf;
          for (int64_t i = 0; i < group_size; ++i) {
            if (c[i] > best) {
              second = best;
              best = c[i];
            } else if (c[i] > second) {
              second = c[i];
            }
          }
          v = group_size >= 2 ? best + second : best;
        }
        group_value[static_cast<size_t>(g)] = v;
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::stable_sort(group_order.begin(), group_order.end(), by_value_desc(&group_value));
      std::fill(group_kept.begin(), group_kept.end(), 0);
      for (int i = 0; i < cfg.topk_group; ++i)
        group_kept[static_cast<size_t>(group_order[static_cast<size_t>(i)])] = 1;
      for (int64_t e = 0; e < E; ++e)
        if (!group_kept[static_cast<size_t>(e / group_size)])
          choice[static_cast<size_t>(e)] = neg_inf;
    }

    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + cfg.top_k, order.end(),
                      by_value_desc(&choice));
    double sum = 0.0;
    for (int k = 0; k < cfg.top_k; ++k)
      sum += score[static_cast<size_t>(order[static_cast<size_t>(k)])];
    // transformers adds 1e-20 to the denominator (DeepSeek); softmax sums are never that small.
    const double denom = cfg.renormalize ? sum + 1e-20 : 1.0;
    for (int k = 0; k < cfg.top_k; ++k) {
      const int32_t e = order[static_cast<size_t>(k)];
      const size_t slot = static_cast<size_t>(t * cfg.top_k + k);
      r.expert_ids[slot] = e;
      r.weights[slot] = score[static_cast<size_t>(e)] / denom * cfg.routed_scaling_factor;
    }
  }
  return r;
}

const char* router_scoring_name(RouterScoring s) {
  return s == RouterScoring::kSoftmax ? "softmax" : "sigmoid";
}

const char* group_score_name(GroupScore g) {
  switch (g) {
    case GroupScore::kNone:
      return "none";
    case GroupScore::kMax:
      return "max";
    case GroupScore::kSumTop2:
      return "sum_top2";
  }
  return "?";
}

MoeRouterSpec runtime_router_spec(const RouterConfig& c) {
  MoeRouterSpec s;
  s.experts = c.num_experts;
  s.top_k = c.top_k;
  s.sigmoid = c.scoring == RouterScoring::kSigmoid;
  s.renormalize = c.renormalize;
  s.n_group = c.n_group;
  s.topk_group = c.topk_group;
  s.group_score = c.group_score == GroupScore::kNone  ? 0
                  : c.group_score == GroupScore::kMax ? 1
                                                      : 2;
  s.routed_scaling_factor = c.routed_scaling_factor;
  s.correction_bias = c.has_correction_bias;
  return s;
}

}  // namespace moepack::ref
