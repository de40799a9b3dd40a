// How a model's MoE block routes tokens and what its experts compute, as its config.json says: the
// router (scoring, top-k, groups, scaling, biases, where its tensors are), the experts'
// activation, and which decoder layers are MoE layers. One reader of these fields for every
// command: Checkpoint::open judges a source with it (convert, inspect, merge, verify --source),
// and verify rebuilds the router and the activation it evaluates from it. A config it refuses is
// refused before anything is written.
//
// The families are rows (moe_family_rows() in routing.cpp: model types -> router, tensor names,
// activation, layer rule), each mirroring transformers' modeling code for the family (facts,
// not code; the row names the class). tests/routers/ proves every row's router and activation
// against transformers itself.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/layout/activation.h"

namespace moepack {

enum class RouterScoring : uint8_t { kSoftmax, kSigmoid };

// How a group of experts is scored for group-limited selection.
enum class GroupScore : uint8_t {
  kNone,     // no group limit (n_group == 1 or topk_method greedy)
  kMax,      // DeepSeek-V2 group_limited_greedy: the best score in the group
  kSumTop2,  // DeepSeek-V3 noaux_tc, Mistral-4: the sum of the two best scores in the group
};

// How the experts are selected from the scores.
enum class RouterKind : uint8_t {
  kTopK,         // the top_k best selection scores (every family but PhiMoE)
  kSparseMixer,  // PhiMoE's sparsemixer (eval): the best logit, then the best of the rest, each
                 // weighted by a softmax over the logits within 2 * jitter_eps of it (top_k 2)
};

// How the router's input is made from the hidden states before its Linear.
enum class RouterInput : uint8_t {
  kHidden,         // the hidden states themselves
  kRmsNormScaled,  // Gemma-4: rms_norm(x, eps) * scale[H] * H^-0.5 (router.scale [H])
};

struct RouterConfig {
  std::string family;  // the model_type ("mixtral", "qwen3_moe", ...), for reports and tensors
  RouterKind kind = RouterKind::kTopK;
  RouterScoring scoring = RouterScoring::kSoftmax;
  int64_t num_experts = 0;      // routed experts E
  std::string num_experts_key;  // the config field E came from ("n_routed_experts", ...)
  int top_k = 1;
  bool renormalize = false;  // divide the selected weights by their sum (norm_topk_prob)
  int n_group = 1;
  int topk_group = 1;
  GroupScore group_score = GroupScore::kNone;
  double routed_scaling_factor = 1.0;
  bool has_correction_bias = false;   // e_score_correction_bias [E], added for selection only
  bool has_router_bias = false;       // the router Linear has a bias (gpt-oss)
  bool has_per_expert_scale = false;  // weights x per_expert_scale[e] after renormalising (Gemma-4)
  double jitter_eps = 0.0;            // kSparseMixer: router_jitter_noise
  RouterInput input = RouterInput::kHidden;
  double input_norm_eps = 1e-6;  // kRmsNormScaled: rms_norm_eps
  // The weight multiplies the expert's input instead of its output (Llama-4:
  // routed_in = x * sigmoid(score); out = sum_k expert_k(routed_in)).
  bool weights_on_input = false;

  // Throws kBadConfig when the numbers do not make a router (top_k > E, E % n_group, ...).
  void validate() const;
};

// Parses the router of a Hugging Face config.json (a nested "text_config" is used when the
// top level has no MoE fields, as in Qwen3-VL-MoE). Throws kBadConfig naming `file` and the field
// (missing, of the wrong type or out of range) or kUnsupported (unknown model_type, scoring_func
// or topk_method; the message lists the supported ones).
RouterConfig router_config_from_hf(const nlohmann::json& config,
                                   const std::string& file = "config.json");

// Whether the config's model_type has a row (a router moepack rebuilds).
bool has_moe_family(const nlohmann::json& config);
// "mixtral, qwen2_moe, ...": every model type with a row, for messages and docs.
std::string moe_family_model_types();

// The tensors that route the experts of `module` ("model.layers.3.mlp"), as verify reads them and
// vLLM loads them, by the family's row (the first set of names whose weight exists): the router
// weight [E, H] (<module>.gate.weight, <module>.router.weight for gpt-oss and Llama-4,
// router.layer.weight for Granite, router.proj.weight for Gemma-4), its bias, the correction
// bias (under the gate, beside the experts for MiniMax-M2, gate.moe_statics for ERNIE-4.5), and
// Gemma-4's per-expert scale and input scale. `exists` says which names the checkpoint holds. A
// name is "" where the router has no such tensor (no weight found, or the config does not use it).
// `unused` (when given) receives the names of the family's router tensors the config does not
// use (a bias next to a router without one), so that the checkpoint can refuse them.
struct RouterTensorNames {
  std::string weight, bias, correction_bias, per_expert_scale, input_scale;
};
RouterTensorNames router_tensor_names(const std::string& module, const RouterConfig& router,
                                      const std::function<bool(const std::string&)>& exists,
                                      std::vector<std::string>* unused = nullptr);
// Every name a router of `module` may go by in any family (weights, biases, scales); the
// checkpoint refuses a quantized one under any of them.
std::vector<std::string> router_tensor_prefixes(const std::string& module);

// What a routed expert computes from w13 = [gate; up] (gated) or w13 = up (not gated):
enum class Activation : uint8_t {
  kSilu,       // silu(gate) * up                  hidden_act "silu" / "swish"
  kRelu2,      // relu(x)^2                        "relu2" / "relu_squared" (Nemotron-H style)
  kGeluTanh,   // gelu_tanh(gate) * up             "gelu_pytorch_tanh" / "gelu_tanh" (Gemma-4)
  kSwigluOai,  // gpt-oss: g = min(gate, 7), u = clamp(up, -7, 7), (u + 1) * g * sigmoid(1.702 g)
};
// Computed by formats/layout/activation.h (host and device), whose codes are these values.
static_assert(static_cast<int>(Activation::kSilu) == kActSilu &&
                  static_cast<int>(Activation::kRelu2) == kActRelu2 &&
                  static_cast<int>(Activation::kGeluTanh) == kActGeluTanh &&
                  static_cast<int>(Activation::kSwigluOai) == kActSwigluOai,
              "Activation values are formats/layout/activation.h's codes");

// Parses a hidden_act value; throws kUnsupported naming `field` for anything else.
Activation activation_from_name(const std::string& name, const std::string& file = "config.json",
                                const std::string& field = "hidden_act");
const char* activation_name(Activation a);  // "silu", "relu2", "gelu_tanh", "swigluoai"

// The activation the config's model computes, by its family's row: from the field the family's
// modeling code reads (hidden_act, or hidden_activation for Gemma-4), or fixed where the model
// computes one whatever the config says (gpt-oss: clamped SwiGLU, although its config says
// "silu"). Throws kUnsupported for a model_type without a row or an activation moepack cannot
// compute: never assumed.
Activation expert_activation_from_hf(const nlohmann::json& config,
                                     const std::string& file = "config.json");

// Which decoder layers the config makes MoE layers, by the family's rule (its row).
struct MoeLayerRule {
  std::vector<int64_t> mlp_only_layers;  // Qwen: always dense
  int64_t decoder_sparse_step = 1;       // MoE iff (i + 1) % step == 0 (Qwen; ERNIE's
                                         // moe_layer_interval; Llama-4's interleave step)
  int64_t first_k_dense_replace = 0;     // the first k layers are dense (DeepSeek, GLM, Mistral-4;
                                         // ERNIE's moe_layer_start_index)
  int64_t moe_layer_freq = 1;            // DeepSeek: MoE iff i % freq == 0
  int64_t last_moe_layer = -1;           // ERNIE's moe_layer_end_index (-1: none)
  bool explicit_list = false;            // the config lists the MoE layers (below)
  std::vector<int64_t> moe_layers;       // Llama-4 moe_layers; mlp_layer_types "sparse"
  std::string where;                     // "" or "text_config." (the fields' object)
  // The config field behind each rule, for messages.
  std::string step_key = "decoder_sparse_step", first_dense_key = "first_k_dense_replace",
              last_key = "moe_layer_end_index", list_key = "moe_layers";

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
const char* router_kind_name(RouterKind k);        // "top_k" / "sparsemixer"

}  // namespace moepack
