// The Hugging Face config model: config.json (+ hf_quant_config.json / quantize_config.json)
// normalised into the facts moepack needs: MoE shape, activation, model dtype, and QuantParams.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/codec.h"

namespace moepack {

struct HfConfig {
  nlohmann::json raw;        // config.json as read
  nlohmann::json text;       // the object holding the language-model fields (raw or text_config)
  std::string model_type;    // "qwen3_moe", "mixtral", "deepseek_v3", ...
  std::string architecture;  // architectures[0] or ""
  int64_t hidden_size = 0;
  int64_t moe_intermediate_size = 0;  // per expert
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t num_layers = 0;
  // The config key each of the four came from ("num_local_experts", "text_config.hidden_size"),
  // or "" when the config does not say: errors about a disagreement with the tensors name it.
  std::string hidden_size_key, moe_intermediate_size_key, num_experts_key, top_k_key;
  std::string hidden_act = "silu";
  bool gated = true;           // silu/swiglu gated MLP; false for relu2-style activations
  DType dtype = DType::kBF16;  // torch_dtype / dtype

  // Quantization as found, and where it was found.
  QuantParams quant;
  nlohmann::json quant_raw;  // the quantization_config object (or {} for unquantized)
  std::string quant_file;    // "config.json", "hf_quant_config.json", "quantize_config.json", ""
  // A moepack output's quantization_config (quant_method "moepack"; null otherwise). `quant`
  // and `quant_raw` then describe its nested source_quantization_config: what the weights carry.
  nlohmann::json moepack_quant;
};

// Reads DIR/config.json and the quantization side files (regular files only, size and nesting
// bounded: io/json_file.h). Throws kBadConfig (naming the file and the key) for malformed configs
// (a size or count that is not an integer in [0, 2^40] included) and kUnsupported (listing the
// supported formats) for unknown quantization methods.
HfConfig load_hf_config(const std::string& dir);
// The same from an already parsed config.json named `path` (tests, fuzzing); the side files are
// looked up in `dir`, none when it is "".
HfConfig hf_config_from_json(nlohmann::json raw, const std::string& path, const std::string& dir);

// Normalises one quantization_config object. `file` names where it came from (for errors).
QuantParams normalize_quant_config(const nlohmann::json& qc, const std::string& file,
                                   DType model_dtype);

// The quantization of one module as the producer's config assigns it: compressed-tensors
// config_groups (name, "re:" regex, then class Linear) and ignore; GPTQModel "dynamic" overrides.
// `module` is the full module name ("model.layers.0.mlp.experts.3.gate_proj"). Configs without
// per-module rules give c.quant. `rule`, when given, receives the group or pattern that applied.
// Throws kUnsupported naming the field for unquantized (ignored) modules, ambiguous matches and
// patterns moepack cannot read as Python regexes.
QuantParams quant_for_module(const HfConfig& c, const std::string& module,
                             std::string* rule = nullptr);
// The one scheme of a set of expert Linears; kUnsupported naming both modules when they differ.
QuantParams quant_for_modules(const HfConfig& c, const std::vector<std::string>& modules);

// The quantization_config.modules_to_not_convert entry that leaves `module` unquantized, as
// transformers' should_convert_module matches it (re.match of "<key>\\." or "<key>", or the
// name ending with the key), or "" when none does (or the config has no such list).
std::string module_not_converted(const HfConfig& c, const std::string& module);
DType parse_torch_dtype(const std::string& s, const std::string& file);  // "bfloat16" -> kBF16

}  // namespace moepack
