#include "model/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace moepack {
using nlohmann::json;

namespace {

// Where the fields are read: the object holding the MoE fields (the top level, or "text_config"
// for multimodal wrappers), falling back to the top level; errors name the field with its prefix.
struct Fields {
  const json& section;
  const json& top;
  std::string file;
  std::string where;  // "text_config." when section is the top level's text_config

  // The value of `key` and the name it goes by in messages, or null when absent or null.
  const json* find(const char* key, std::string* name) const {
    if (section.contains(key) && !section[key].is_null()) {
      *name = where + key;
      return &section[key];
    }
    if (top.contains(key) && !top[key].is_null()) {
      *name = key;
      return &top[key];
    }
    *name = where + key;
    return nullptr;
  }
  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    throw Error(ErrorCode::kBadConfig, file, "", field + ": " + message);
  }
  int64_t integer(std::initializer_list<const char*> keys, const int64_t* fallback,
                  std::string* found = nullptr) const {
    std::string name;
    for (const char* key : keys) {
      const json* v = find(key, &name);
      if (!v) continue;
      if (found) *found = name;
      if (!v->is_number_integer()) fail(name, std::string("expected an integer, got ") + v->dump());
      if (v->is_number_unsigned() &&
          v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(name, std::string("out of range, got ") + v->dump());
      return v->get<int64_t>();
    }
    if (fallback) return *fallback;
    find(*keys.begin(), &name);
    fail(name, "missing (needed to rebuild the MoE router)");
  }
  double number(const char* key, double fallback) const {
    std::string name;
    const json* v = find(key, &name);
    if (!v) return fallback;
    if (!v->is_number()) fail(name, std::string("expected a number, got ") + v->dump());
    return v->get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    std::string name;
    const json* v = find(key, &name);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(name, std::string("expected true or false, got ") + v->dump());
    return v->get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    std::string name;
    const json* v = find(key, &name);
    if (!v) return fallback;
    if (!v->is_string()) fail(name, std::string("expected a string, got ") + v->dump());
    return v->get<std::string>();
  }
  // A positive int-sized count.
  int count(std::initializer_list<const char*> keys, const int64_t* fallback) const {
    const int64_t v = integer(keys, fallback);
    if (v <= 0 || v > std::numeric_limits<int>::max()) {
      std::string name;
      for (const char* key : keys)
        if (find(key, &name)) break;
      fail(name, "must be a positive integer, got " + std::to_string(v));
    }
    return static_cast<int>(v);
  }
  std::string name_of(const char* key) const {
    std::string name;
    find(key, &name);
    return name;
  }
};

// The object holding the MoE fields: the top level, or "text_config" for multimodal wrappers.
Fields fields_of(const json& config, const std::string& file) {
  static const char* kExpertKeys[] = {"num_local_experts", "num_experts", "n_routed_experts"};
  for (const char* key : kExpertKeys)
    if (config.contains(key)) return {config, config, file, ""};
  if (config.contains("text_config") && config["text_config"].is_object()) {
    const json& text = config["text_config"];
    for (const char* key : kExpertKeys)
      if (text.contains(key)) return {text, config, file, "text_config."};
  }
  return {config, config, file, ""};
}

// DeepSeek-V2 / V3 / Kimi-K2 / GLM-4.5 (MoEGate with scoring_func and topk_method).
void parse_deepseek(const Fields& f, bool v3_defaults, RouterConfig* cfg) {
  cfg->num_experts = f.integer({"n_routed_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"num_experts_per_tok"}, nullptr);
  const std::string scoring = f.string("scoring_func", v3_defaults ? "sigmoid" : "softmax");
  if (scoring == "softmax") {
    cfg->scoring = RouterScoring::kSoftmax;
  } else if (scoring == "sigmoid") {
    cfg->scoring = RouterScoring::kSigmoid;
  } else {
    throw Error(
        ErrorCode::kUnsupported, f.file, "",
        f.name_of("scoring_func") + ": \"" + scoring + "\" is not supported (softmax, sigmoid)");
  }
  // The DeepSeek-V2 remote code's default spells it "gready".
  std::string method = f.string("topk_method", v3_defaults ? "noaux_tc" : "greedy");
  if (method == "gready") method = "greedy";
  const int64_t one = 1;
  const int n_group = f.count({"n_group"}, &one);
  const int topk_group = f.count({"topk_group"}, &one);
  if (method == "greedy") {
    cfg->group_score = GroupScore::kNone;
  } else if (method == "group_limited_greedy") {
    cfg->group_score = GroupScore::kMax;
  } else if (method == "noaux_tc") {
    if (cfg->scoring != RouterScoring::kSigmoid)
      throw Error(ErrorCode::kUnsupported, f.file, "",
                  f.name_of("topk_method") + ": noaux_tc with scoring_func " + scoring +
                      " is not supported");
    cfg->group_score = GroupScore::kSumTop2;
    cfg->has_correction_bias = true;
  } else {
    throw Error(ErrorCode::kUnsupported, f.file, "",
                f.name_of("topk_method") + ": \"" + method +
                    "\" is not supported (greedy, group_limited_greedy, noaux_tc)");
  }
  // Greedy ignores the groups, but vLLM and transformers still read both fields: they must be
  // well formed either way.
  cfg->n_group = n_group;
  cfg->topk_group = topk_group;
  cfg->renormalize = f.boolean("norm_topk_prob", v3_defaults);
  cfg->routed_scaling_factor = f.number("routed_scaling_factor", 1.0);
}

bool is_qwen_family(const std::string& t) {
  return t == "qwen2_moe" || t == "qwen3_moe" || t == "qwen3_vl_moe" || t == "qwen3_vl_moe_text" ||
         t == "qwen3_next" || t == "qwen3_5_moe" || t == "qwen3_5_moe_text";
}
bool is_deepseek_family(const std::string& t) {
  return t == "deepseek_v2" || t == "deepseek_v3" || t == "kimi_k2";
}

const char* kSupportedFamilies =
    "mixtral, qwen2_moe, qwen3_moe, qwen3_vl_moe, qwen3_next, qwen3_5_moe, deepseek_v2, "
    "deepseek_v3, kimi_k2, glm4_moe, gpt_oss";

}  // namespace

void RouterConfig::validate() const {
  auto bad = [](const std::string& field, const std::string& message) {
    throw Error(ErrorCode::kBadConfig, "config.json", "", field + ": " + message);
  };
  if (num_experts <= 0) bad("num_experts", "must be positive, got " + std::to_string(num_experts));
  if (top_k <= 0 || top_k > num_experts)
    bad("num_experts_per_tok",
        "top_k " + std::to_string(top_k) + " must be in [1, " + std::to_string(num_experts) + "]");
  if (n_group <= 0 || num_experts % n_group != 0)
    bad("n_group", "n_group " + std::to_string(n_group) + " must divide " +
                       std::to_string(num_experts) + " experts");
  if (topk_group <= 0 || topk_group > n_group)
    bad("topk_group", "topk_group " + std::to_string(topk_group) + " must be in [1, n_group " +
                          std::to_string(n_group) + "]");
  if (group_score != GroupScore::kNone &&
      static_cast<int64_t>(top_k) > static_cast<int64_t>(topk_group) * (num_experts / n_group))
    bad("topk_group", "top_k " + std::to_string(top_k) + " exceeds the " +
                          std::to_string(topk_group * (num_experts / n_group)) +
                          " experts of the kept groups");
  if (!std::isfinite(routed_scaling_factor) || routed_scaling_factor <= 0)
    bad("routed_scaling_factor",
        "must be a positive finite number, got " + std::to_string(routed_scaling_factor));
}

RouterConfig router_config_from_hf(const json& config, const std::string& file) {
  if (!config.is_object()) throw Error(ErrorCode::kBadConfig, file, "", "not a JSON object");
  const Fields f = fields_of(config, file);
  const std::string model_type = f.string("model_type", "");
  RouterConfig cfg;
  cfg.family = model_type;
  if (model_type == "mixtral") {
    cfg.num_experts = f.integer({"num_local_experts"}, nullptr, &cfg.num_experts_key);
    cfg.top_k = f.count({"num_experts_per_tok"}, nullptr);
    cfg.renormalize = true;
  } else if (is_qwen_family(model_type)) {
    // transformers >= 5 saves Qwen3-MoE configs with num_local_experts instead of num_experts.
    cfg.num_experts =
        f.integer({"num_experts", "num_local_experts"}, nullptr, &cfg.num_experts_key);
    cfg.top_k = f.count({"num_experts_per_tok"}, nullptr);
    cfg.renormalize = f.boolean("norm_topk_prob", false);
  } else if (model_type == "deepseek_v2") {
    parse_deepseek(f, /*v3_defaults=*/false, &cfg);
  } else if (model_type == "deepseek_v3" || model_type == "kimi_k2" || model_type == "glm4_moe") {
    parse_deepseek(f, /*v3_defaults=*/true, &cfg);
  } else if (model_type == "gpt_oss") {
    // Softmax over the top-k logits equals softmax over all logits renormalised over the top k.
    cfg.num_experts = f.integer({"num_local_experts"}, nullptr, &cfg.num_experts_key);
    cfg.top_k = f.count({"num_experts_per_tok", "experts_per_token"}, nullptr);
    cfg.renormalize = true;
    cfg.has_router_bias = true;
  } else {
    throw Error(ErrorCode::kUnsupported, file, "",
                "model_type: no MoE router known for \"" + model_type +
                    "\" (supported: " + kSupportedFamilies + ")");
  }
  try {
    cfg.validate();
  } catch (const Error& e) {  // name the real file and the field as the config spells it
    const std::string& m = e.message();
    const std::string field = m.substr(0, m.find(':'));
    const std::string name = field == "num_experts" ? field : f.name_of(field.c_str());
    throw Error(e.code(), file, "", name + m.substr(field.size()));
  }
  return cfg;
}

RouterTensorNames router_tensor_names(const std::string& module, const RouterConfig& router,
                                      const std::function<bool(const std::string&)>& exists) {
  RouterTensorNames n;
  std::string prefix;
  for (const char* child : {".gate.", ".router."})
    if (exists(module + child + "weight")) {
      prefix = module + child;
      break;
    }
  if (prefix.empty()) return n;
  n.weight = prefix + "weight";
  if (router.has_router_bias) n.bias = prefix + "bias";
  if (router.has_correction_bias) n.correction_bias = prefix + "e_score_correction_bias";
  return n;
}

bool MoeLayerRule::is_moe_layer(int64_t layer) const {
  return dense_because(layer).empty();
}

std::string MoeLayerRule::dense_because(int64_t layer) const {
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
    return where + "mlp_only_layers = " + json(mlp_only_layers).dump();
  if ((layer + 1) % decoder_sparse_step != 0)
    return where + "decoder_sparse_step = " + std::to_string(decoder_sparse_step);
  if (layer < first_k_dense_replace)
    return where + "first_k_dense_replace = " + std::to_string(first_k_dense_replace);
  if (layer % moe_layer_freq != 0)
    return where + "moe_layer_freq = " + std::to_string(moe_layer_freq);
  return "";
}

MoeLayerRule moe_layer_rule_from_hf(const json& config, const std::string& file) {
  if (!config.is_object()) throw Error(ErrorCode::kBadConfig, file, "", "not a JSON object");
  const Fields f = fields_of(config, file);
  const std::string model_type = f.string("model_type", "");
  MoeLayerRule rule;
  rule.where = f.where;
  const int64_t zero = 0, one = 1;
  auto at_least = [&](const char* key, int64_t fallback, int64_t low) {
    const int64_t v = f.integer({key}, &fallback);
    if (v < low)
      f.fail(f.name_of(key),
             "must be at least " + std::to_string(low) + ", got " + std::to_string(v));
    return v;
  };
  if (is_qwen_family(model_type)) {
    rule.decoder_sparse_step = at_least("decoder_sparse_step", one, 1);
    std::string name;
    if (const json* v = f.find("mlp_only_layers", &name)) {
      if (!v->is_array()) f.fail(name, "expected a list of layer numbers, got " + v->dump());
      for (const json& x : *v) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0)
          f.fail(name, "expected a list of layer numbers, got " + v->dump());
        rule.mlp_only_layers.push_back(x.get<int64_t>());
      }
    }
  } else if (is_deepseek_family(model_type) || model_type == "glm4_moe") {
    rule.first_k_dense_replace = at_least("first_k_dense_replace", zero, 0);
    if (model_type != "glm4_moe") rule.moe_layer_freq = at_least("moe_layer_freq", one, 1);
  }
  return rule;
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

}  // namespace moepack
