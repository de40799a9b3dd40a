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
  static const char* kExpertKeys[] = {"num_local_experts", "num_experts", "n_routed_experts",
                                      "moe_num_experts"};
  for (const char* key : kExpertKeys)
    if (config.contains(key)) return {config, config, file, ""};
  if (config.contains("text_config") && config["text_config"].is_object()) {
    const json& text = config["text_config"];
    for (const char* key : kExpertKeys)
      if (text.contains(key)) return {text, config, file, "text_config."};
  }
  return {config, config, file, ""};
}

// DeepSeek-V2 / V3 / Kimi-K2 / GLM-4.5 / GLM-4.7-Flash / DeepSeek-V3.2 (MoEGate with scoring_func
// and topk_method).
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

void parse_deepseek_v2(const Fields& f, RouterConfig* cfg) {
  parse_deepseek(f, false, cfg);
}
void parse_deepseek_v3(const Fields& f, RouterConfig* cfg) {
  parse_deepseek(f, true, cfg);
}

void parse_mixtral(const Fields& f, RouterConfig* cfg) {
  cfg->num_experts = f.integer({"num_local_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"num_experts_per_tok"}, nullptr);
  cfg->renormalize = true;
}

void parse_qwen(const Fields& f, RouterConfig* cfg) {
  // transformers >= 5 saves Qwen3-MoE configs with num_local_experts instead of num_experts.
  cfg->num_experts =
      f.integer({"num_experts", "num_local_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"num_experts_per_tok"}, nullptr);
  cfg->renormalize = f.boolean("norm_topk_prob", false);
}

void parse_gpt_oss(const Fields& f, RouterConfig* cfg) {
  // Softmax over the top-k logits equals softmax over all logits renormalised over the top k.
  cfg->num_experts = f.integer({"num_local_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"num_experts_per_tok", "experts_per_token"}, nullptr);
  cfg->renormalize = true;
  cfg->has_router_bias = true;
  // The clamp of its SwiGLU: vLLM 0.33's gpt-oss (SwigluOAIAndMul) and transformers'
  // GptOssExperts compute it at 7.0 whatever the config says; a config asking for another limit
  // describes an activation neither computes, so it is refused rather than verified as 7.
  const double limit = f.number("swiglu_limit", kSwigluOaiLimit);
  if (!std::isfinite(limit) || limit <= 0)
    f.fail(f.name_of("swiglu_limit"), "must be a positive finite number");
  if (limit != kSwigluOaiLimit)
    throw Error(ErrorCode::kUnsupported, f.file, "",
                f.name_of("swiglu_limit") + ": " + std::to_string(limit) +
                    " (vLLM 0.33's gpt-oss and transformers' GptOssExperts clamp at 7.0 whatever "
                    "the config says; moepack computes no other limit)");
}

// PhiMoE: sparsemixer in eval mode always selects two experts, whatever num_experts_per_tok.
void parse_phimoe(const Fields& f, RouterConfig* cfg) {
  cfg->num_experts = f.integer({"num_local_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"num_experts_per_tok"}, nullptr);
  if (cfg->top_k != 2)
    throw Error(ErrorCode::kUnsupported, f.file, "",
                f.name_of("num_experts_per_tok") + ": " + std::to_string(cfg->top_k) +
                    " (PhiMoE's sparsemixer selects exactly 2 experts)");
  cfg->kind = RouterKind::kSparseMixer;
  cfg->jitter_eps = f.number("router_jitter_noise", 0.01);  // PhimoeConfig's default
  if (!std::isfinite(cfg->jitter_eps) || cfg->jitter_eps < 0)
    f.fail(f.name_of("router_jitter_noise"), "must be a finite number >= 0");
}

// ERNIE-4.5: softmax, moe_statics.e_score_correction_bias for selection, always renormalised
// (by max(sum, moe_norm_min): the top-k of a softmax never sums below k/E).
void parse_ernie(const Fields& f, RouterConfig* cfg) {
  cfg->num_experts = f.integer({"moe_num_experts", "num_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"moe_k", "num_experts_per_tok"}, nullptr);
  cfg->renormalize = true;
  cfg->has_correction_bias = true;
}

// Llama-4: the top-k logits, weight sigmoid(logit), applied to the expert's input.
void parse_llama4(const Fields& f, RouterConfig* cfg) {
  cfg->num_experts = f.integer({"num_local_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"num_experts_per_tok"}, nullptr);
  cfg->scoring = RouterScoring::kSigmoid;
  cfg->weights_on_input = true;
  if (cfg->top_k != 1)
    throw Error(ErrorCode::kUnsupported, f.file, "",
                f.name_of("num_experts_per_tok") + ": " + std::to_string(cfg->top_k) +
                    " with Llama-4's router (weights applied to the expert input); moepack "
                    "verifies top-1, as every Llama-4 release routes");
}

// MiniMax-M2: sigmoid, e_score_correction_bias (beside the experts) for selection, renormalised.
void parse_minimax_m2(const Fields& f, RouterConfig* cfg) {
  cfg->num_experts = f.integer({"num_local_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"num_experts_per_tok"}, nullptr);
  cfg->scoring = RouterScoring::kSigmoid;
  cfg->has_correction_bias = true;
  cfg->renormalize = true;
}

// Mistral-4: softmax, groups scored by the sum of their two best scores, no correction bias.
void parse_mistral4(const Fields& f, RouterConfig* cfg) {
  cfg->num_experts = f.integer({"n_routed_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"num_experts_per_tok"}, nullptr);
  const int64_t one = 1;
  cfg->n_group = f.count({"n_group"}, &one);
  cfg->topk_group = f.count({"topk_group"}, &one);
  cfg->group_score = GroupScore::kSumTop2;
  cfg->renormalize = f.boolean("norm_topk_prob", true);
  cfg->routed_scaling_factor = f.number("routed_scaling_factor", 1.0);
}

// Gemma-4: softmax of proj(rms_norm(x) * scale * H^-0.5), top_k_experts renormalised, x
// per_expert_scale.
void parse_gemma4(const Fields& f, RouterConfig* cfg) {
  cfg->num_experts = f.integer({"num_experts"}, nullptr, &cfg->num_experts_key);
  cfg->top_k = f.count({"top_k_experts"}, nullptr);
  cfg->renormalize = true;
  cfg->has_per_expert_scale = true;
  cfg->input = RouterInput::kRmsNormScaled;
  cfg->input_norm_eps = f.number("rms_norm_eps", 1e-6);
  if (!std::isfinite(cfg->input_norm_eps) || cfg->input_norm_eps < 0)
    f.fail(f.name_of("rms_norm_eps"), "must be a finite number >= 0");
}

// --- which decoder layers are MoE layers, per family

void layers_every(const Fields&, MoeLayerRule*) {}

void layers_qwen(const Fields& f, MoeLayerRule* rule);
void layers_deepseek(const Fields& f, MoeLayerRule* rule);
void layers_glm(const Fields& f, MoeLayerRule* rule);
void layers_first_dense(const Fields& f, MoeLayerRule* rule, int64_t fallback);
void layers_glm_lite(const Fields& f, MoeLayerRule* rule);
void layers_deepseek_v32(const Fields& f, MoeLayerRule* rule);
void layers_mistral4(const Fields& f, MoeLayerRule* rule);
void layers_ernie(const Fields& f, MoeLayerRule* rule);
void layers_llama4(const Fields& f, MoeLayerRule* rule);

// The names a family's router tensors go by, relative to the MoE module; the first set whose
// weight exists is the router's. Each optional tensor lists its spellings (the first that exists
// is read; the first is named when none does).
struct RouterNameSet {
  const char* weight;
  std::vector<const char*> bias, correction_bias, per_expert_scale, input_scale;
};

const std::vector<RouterNameSet>& default_router_names() {
  static const std::vector<RouterNameSet> names = {
      {"gate.weight", {"gate.bias"}, {"gate.e_score_correction_bias"}, {}, {}},
      {"router.weight", {"router.bias"}, {"router.e_score_correction_bias"}, {}, {}},
  };
  return names;
}

// One family: its model types, the transformers class it mirrors, how its config is read, where
// its router tensors are, what its experts compute.
struct FamilyRow {
  std::vector<const char*> model_types;
  const char* transformers_class;  // models/<type>/modeling_<type>.py, the router's class
  void (*router)(const Fields&, RouterConfig*);
  void (*layers)(const Fields&, MoeLayerRule*);
  std::vector<RouterNameSet> names;  // empty: default_router_names()
  // The config field the experts' activation comes from, or null where the model computes
  // `fixed` whatever its config says.
  const char* activation_field;
  Activation fixed;
};

// The families moepack routed before issue 30, and those it added (below).
std::vector<FamilyRow> first_family_rows() {
  return {
      {{"mixtral"},
       "MixtralTopKRouter",
       parse_mixtral,
       layers_every,
       {},
       "hidden_act",
       Activation::kSilu},
      {{"qwen2_moe", "qwen3_moe", "qwen3_vl_moe", "qwen3_vl_moe_text", "qwen3_next", "qwen3_5_moe",
        "qwen3_5_moe_text"},
       "Qwen3MoeTopKRouter",
       parse_qwen,
       layers_qwen,
       {},
       "hidden_act",
       Activation::kSilu},
      // OLMoE's router is Qwen2-MoE's (softmax, top-k, norm_topk_prob); every layer is MoE.
      {{"olmoe"}, "OlmoeTopKRouter", parse_qwen, layers_every, {}, "hidden_act", Activation::kSilu},
      {{"deepseek_v2"},
       "DeepseekV2Moe",
       parse_deepseek_v2,
       layers_deepseek,
       {},
       "hidden_act",
       Activation::kSilu},
      {{"deepseek_v3", "kimi_k2"},
       "DeepseekV3TopkRouter",
       parse_deepseek_v3,
       layers_deepseek,
       {},
       "hidden_act",
       Activation::kSilu},
      {{"glm4_moe"},
       "Glm4MoeTopkRouter",
       parse_deepseek_v3,
       layers_glm,
       {},
       "hidden_act",
       Activation::kSilu},
      // GLM-4.7-Flash and DeepSeek-V3.2: DeepSeek-V3's noaux_tc router.
      {{"glm4_moe_lite"},
       "Glm4MoeLiteTopkRouter",
       parse_deepseek_v3,
       layers_glm_lite,
       {},
       "hidden_act",
       Activation::kSilu},
      {{"deepseek_v32"},
       "DeepseekV32TopkRouter",
       parse_deepseek_v3,
       layers_deepseek_v32,
       {},
       "hidden_act",
       Activation::kSilu},
      {{"mistral4"},
       "Mistral4TopkRouter",
       parse_mistral4,
       layers_mistral4,
       {},
       "hidden_act",
       Activation::kSilu},
      {{"gpt_oss"},
       "GptOssTopKRouter",
       parse_gpt_oss,
       layers_every,
       {},
       nullptr,
       Activation::kSwigluOai},
  };
}

std::vector<FamilyRow> issue30_family_rows() {
  return {
      {{"phimoe"},
       "PhimoeTopKRouter (sparsemixer)",
       parse_phimoe,
       layers_every,
       {},
       "hidden_act",
       Activation::kSilu},
      {{"ernie4_5_moe"},
       "Ernie4_5_MoeTopKRouter",
       parse_ernie,
       layers_ernie,
       {{"gate.weight",
         {"gate.bias"},
         {"moe_statics.e_score_correction_bias", "gate.moe_statics.e_score_correction_bias"},
         {},
         {}}},
       "hidden_act",
       Activation::kSilu},
      {{"llama4_text", "llama4"},
       "Llama4Router",
       parse_llama4,
       layers_llama4,
       {{"router.weight", {"router.bias"}, {}, {}, {}}},
       "hidden_act",
       Activation::kSilu},
      {{"minimax_m2"},
       "MiniMaxM2TopKRouter",
       parse_minimax_m2,
       layers_every,
       {{"gate.weight",
         {"gate.bias"},
         {"e_score_correction_bias", "gate.e_score_correction_bias"},
         {},
         {}}},
       "hidden_act",
       Activation::kSilu},
      // Granite's router is Mixtral's (softmax of the top-k logits).
      {{"granitemoe", "granitemoeshared"},
       "GraniteMoeTopKRouter",
       parse_mixtral,
       layers_every,
       {{"router.layer.weight", {"router.layer.bias"}, {}, {}, {}},
        {"router.weight", {"router.bias"}, {}, {}, {}}},
       "hidden_act",
       Activation::kSilu},
      {{"gemma4_text", "gemma4"},
       "Gemma4TextRouter",
       parse_gemma4,
       layers_every,
       {{"router.proj.weight",
         {"router.proj.bias"},
         {},
         {"router.per_expert_scale"},
         {"router.scale"}}},
       "hidden_activation",
       Activation::kGeluTanh},
  };
}

const std::vector<FamilyRow>& family_rows() {
  static const std::vector<FamilyRow> rows = [] {
    std::vector<FamilyRow> all = first_family_rows();
    for (FamilyRow& r : issue30_family_rows()) all.push_back(std::move(r));
    return all;
  }();
  return rows;
}

const FamilyRow* find_row(const std::string& model_type) {
  for (const FamilyRow& row : family_rows())
    for (const char* t : row.model_types)
      if (model_type == t) return &row;
  return nullptr;
}

const FamilyRow& row_of(const Fields& f) {
  const std::string model_type = f.string("model_type", "");
  const FamilyRow* row = find_row(model_type);
  if (!row)
    throw Error(ErrorCode::kUnsupported, f.file, "",
                "model_type: no MoE router known for \"" + model_type +
                    "\" (supported: " + moe_family_model_types() + ")");
  return *row;
}

int64_t at_least(const Fields& f, const char* key, int64_t fallback, int64_t low) {
  const int64_t v = f.integer({key}, &fallback);
  if (v < low)
    f.fail(f.name_of(key),
           "must be at least " + std::to_string(low) + ", got " + std::to_string(v));
  return v;
}

// A list of non-negative layer numbers.
std::vector<int64_t> layer_list(const Fields& f, const char* key, bool* present) {
  std::string name;
  std::vector<int64_t> out;
  const json* v = f.find(key, &name);
  *present = v != nullptr;
  if (!v) return out;
  if (!v->is_array()) f.fail(name, "expected a list of layer numbers, got " + v->dump());
  for (const json& x : *v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      f.fail(name, "expected a list of layer numbers, got " + v->dump());
    out.push_back(x.get<int64_t>());
  }
  return out;
}

void layers_qwen(const Fields& f, MoeLayerRule* rule) {
  rule->decoder_sparse_step = at_least(f, "decoder_sparse_step", 1, 1);
  bool present = false;
  rule->mlp_only_layers = layer_list(f, "mlp_only_layers", &present);
}

void layers_deepseek(const Fields& f, MoeLayerRule* rule) {
  rule->first_k_dense_replace = at_least(f, "first_k_dense_replace", 0, 0);
  rule->moe_layer_freq = at_least(f, "moe_layer_freq", 1, 1);
}

void layers_glm(const Fields& f, MoeLayerRule* rule) {
  rule->first_k_dense_replace = at_least(f, "first_k_dense_replace", 0, 0);
}

// mlp_layer_types ("dense" / "sparse" per layer) where the config lists them, else the first
// first_k_dense_replace layers dense (transformers' default when the list is absent).
void layers_first_dense(const Fields& f, MoeLayerRule* rule, int64_t fallback) {
  std::string name;
  if (const json* v = f.find("mlp_layer_types", &name)) {
    if (!v->is_array()) f.fail(name, "expected a list of \"dense\" / \"sparse\", got " + v->dump());
    rule->explicit_list = true;
    rule->list_key = name;
    for (size_t i = 0; i < v->size(); ++i) {
      const json& x = (*v)[i];
      if (!x.is_string() || (x != "dense" && x != "sparse"))
        f.fail(name, "expected a list of \"dense\" / \"sparse\", got " + v->dump());
      if (x == "sparse") rule->moe_layers.push_back(static_cast<int64_t>(i));
    }
    return;
  }
  rule->first_k_dense_replace = at_least(f, "first_k_dense_replace", fallback, 0);
}
void layers_glm_lite(const Fields& f, MoeLayerRule* rule) {
  layers_first_dense(f, rule, 1);
}
void layers_deepseek_v32(const Fields& f, MoeLayerRule* rule) {
  layers_first_dense(f, rule, 3);
}
void layers_mistral4(const Fields& f, MoeLayerRule* rule) {
  layers_first_dense(f, rule, 0);
}

// ERNIE-4.5: MoE iff (i + 1) % moe_layer_interval == 0 and start <= i <= end (end -1: the last).
void layers_ernie(const Fields& f, MoeLayerRule* rule) {
  rule->decoder_sparse_step = at_least(f, "moe_layer_interval", 1, 1);
  rule->step_key = f.name_of("moe_layer_interval");
  rule->first_k_dense_replace = at_least(f, "moe_layer_start_index", 1, 0);
  rule->first_dense_key = f.name_of("moe_layer_start_index");
  const int64_t end = at_least(f, "moe_layer_end_index", -1, -1);
  rule->last_moe_layer = end;
  rule->last_key = f.name_of("moe_layer_end_index");
}

// Llama-4: moe_layers where listed, else every interleave_moe_layer_step-th layer.
void layers_llama4(const Fields& f, MoeLayerRule* rule) {
  bool present = false;
  rule->moe_layers = layer_list(f, "moe_layers", &present);
  if (present) {
    rule->explicit_list = true;
    rule->list_key = f.name_of("moe_layers");
    return;
  }
  rule->decoder_sparse_step = at_least(f, "interleave_moe_layer_step", 1, 1);
  rule->step_key = f.name_of("interleave_moe_layer_step");
}

const char* kActivationNames = "silu, swish, relu2, relu_squared, gelu_pytorch_tanh, gelu_tanh";

}  // namespace

bool has_moe_family(const json& config) {
  if (!config.is_object()) return false;
  const Fields f = fields_of(config, "config.json");
  std::string name;
  const json* t = f.find("model_type", &name);
  return t && t->is_string() && find_row(t->get<std::string>()) != nullptr;
}

std::string moe_family_model_types() {
  std::string out;
  for (const FamilyRow& row : family_rows())
    for (const char* t : row.model_types) out += (out.empty() ? "" : ", ") + std::string(t);
  return out;
}

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
  if (kind == RouterKind::kSparseMixer && top_k != 2)
    bad("num_experts_per_tok", "sparsemixer selects 2 experts, got top_k " + std::to_string(top_k));
  if (weights_on_input && top_k != 1)
    bad("num_experts_per_tok",
        "a router weighting the expert input takes top_k 1, got " + std::to_string(top_k));
}

RouterConfig router_config_from_hf(const json& config, const std::string& file) {
  if (!config.is_object()) throw Error(ErrorCode::kBadConfig, file, "", "not a JSON object");
  const Fields f = fields_of(config, file);
  const FamilyRow& row = row_of(f);
  RouterConfig cfg;
  cfg.family = f.string("model_type", "");
  row.router(f, &cfg);
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
                                      const std::function<bool(const std::string&)>& exists,
                                      std::vector<std::string>* unused) {
  RouterTensorNames n;
  const FamilyRow* row = find_row(router.family);
  const std::vector<RouterNameSet>& sets =
      row && !row->names.empty() ? row->names : default_router_names();
  const RouterNameSet* found = nullptr;
  for (const RouterNameSet& s : sets)
    if (exists(module + "." + s.weight)) {
      found = &s;
      break;
    }
  if (!found) return n;
  n.weight = module + "." + found->weight;
  // The first spelling that exists, else the first (named when missing).
  auto pick = [&](const std::vector<const char*>& spellings, bool used, std::string* out) {
    if (spellings.empty()) return;
    std::string chosen = module + "." + spellings.front();
    for (const char* s : spellings)
      if (exists(module + "." + s)) {
        chosen = module + "." + s;
        break;
      }
    if (used) {
      *out = chosen;
    } else if (unused) {
      for (const char* s : spellings)
        if (exists(module + "." + s)) unused->push_back(module + "." + s);
    }
  };
  pick(found->bias, router.has_router_bias, &n.bias);
  pick(found->correction_bias, router.has_correction_bias, &n.correction_bias);
  pick(found->per_expert_scale, router.has_per_expert_scale, &n.per_expert_scale);
  pick(found->input_scale, router.input == RouterInput::kRmsNormScaled, &n.input_scale);
  return n;
}

std::vector<std::string> router_tensor_prefixes(const std::string& module) {
  return {module + ".gate.", module + ".router.", module + ".router.layer.",
          module + ".router.proj."};
}

Activation activation_from_name(const std::string& name, const std::string& file,
                                const std::string& field) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "relu2" || name == "relu_squared") return Activation::kRelu2;
  if (name == "gelu_pytorch_tanh" || name == "gelu_tanh") return Activation::kGeluTanh;
  throw Error(ErrorCode::kUnsupported, file, "",
              field + ": activation \"" + name + "\" is not supported (" + kActivationNames + ")");
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kSilu:
      return "silu";
    case Activation::kRelu2:
      return "relu2";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kSwigluOai:
      return "swigluoai";
  }
  return "?";
}

Activation expert_activation_from_hf(const json& config, const std::string& file) {
  if (!config.is_object()) throw Error(ErrorCode::kBadConfig, file, "", "not a JSON object");
  const Fields f = fields_of(config, file);
  const FamilyRow& row = row_of(f);
  if (!row.activation_field) return row.fixed;
  const std::string fallback = activation_name(row.fixed) == std::string("gelu_tanh")
                                   ? "gelu_pytorch_tanh"
                                   : activation_name(row.fixed);
  return activation_from_name(f.string(row.activation_field, fallback), file,
                              f.name_of(row.activation_field));
}

bool MoeLayerRule::is_moe_layer(int64_t layer) const {
  return dense_because(layer).empty();
}

std::string MoeLayerRule::dense_because(int64_t layer) const {
  if (explicit_list) {
    if (std::find(moe_layers.begin(), moe_layers.end(), layer) == moe_layers.end())
      return where + list_key + " = " + json(moe_layers).dump();
    return "";
  }
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
    return where + "mlp_only_layers = " + json(mlp_only_layers).dump();
  if ((layer + 1) % decoder_sparse_step != 0)
    return where + step_key + " = " + std::to_string(decoder_sparse_step);
  if (layer < first_k_dense_replace)
    return where + first_dense_key + " = " + std::to_string(first_k_dense_replace);
  if (last_moe_layer >= 0 && layer > last_moe_layer)
    return where + last_key + " = " + std::to_string(last_moe_layer);
  if (layer % moe_layer_freq != 0)
    return where + "moe_layer_freq = " + std::to_string(moe_layer_freq);
  return "";
}

MoeLayerRule moe_layer_rule_from_hf(const json& config, const std::string& file) {
  if (!config.is_object()) throw Error(ErrorCode::kBadConfig, file, "", "not a JSON object");
  const Fields f = fields_of(config, file);
  MoeLayerRule rule;
  rule.where = f.where;
  const FamilyRow* row = find_row(f.string("model_type", ""));
  if (row) row->layers(f, &rule);
  // The step/first/last keys as messages name them carry the prefix already.
  for (std::string* key : {&rule.step_key, &rule.first_dense_key, &rule.last_key, &rule.list_key})
    if (!rule.where.empty() && key->compare(0, rule.where.size(), rule.where) == 0)
      *key = key->substr(rule.where.size());
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

const char* router_kind_name(RouterKind k) {
  return k == RouterKind::kSparseMixer ? "sparsemixer" : "top_k";
}

}  // namespace moepack
