#include "model/hf_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "core/error.h"
#include "io/json_file.h"
#include "model/python_regex.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int64_t get_int(const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) return fallback;
  return it->get<int64_t>();
}

// The largest size or count moepack takes from a config: 2^40 (a 2^40-wide dimension is already
// far past any real model; products of two such stay inside int64).
constexpr int64_t kMaxConfigDim = int64_t{1} << 40;

// A size or count field of the model config: absent or null gives 0; anything else must be an
// integer in [0, 2^40] (a string, a float, a negative or a 20-digit number is a malformed config,
// never a silently ignored or wrapped value). `key_out` receives the key's name when present.
int64_t get_dim(const json& j, const char* key, const std::string& file, const std::string& where,
                std::string* key_out = nullptr) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  const std::string field = where + key;
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(kMaxConfigDim)) ||
      (!it->is_number_unsigned() && (it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxConfigDim)))
    throw Error(ErrorCode::kBadConfig, file, "",
                field + ": expected an integer in [0, 2^40], got " + it->dump());
  if (key_out) *key_out = field;
  return it->get<int64_t>();
}

// An integer in [1, 2^40] (block sizes, group sizes).
bool is_positive_dim(const json& v) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) return v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= 1ull << 40;
  return v.get<int64_t>() >= 1 && v.get<int64_t>() <= kMaxConfigDim;
}

std::string get_str(const json& j, const char* key, const std::string& fallback = "") {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return fallback;
  return it->get<std::string>();
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

[[noreturn]] void bad(const std::string& file, const std::string& key, const std::string& msg) {
  throw Error(ErrorCode::kBadConfig, file, "", "quantization_config." + key + ": " + msg);
}

// A boolean field; absent or null gives `fallback`. Anything else that is not a bool is a
// malformed config (json::value() would throw a bare nlohmann type_error instead).
bool get_bool(const json& j, const char* key, bool fallback, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad(file, key, "expected true or false, got " + it->dump());
  return it->get<bool>();
}

int require_bits(const json& j, const char* key, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) bad(file, key, "missing or not an integer");
  // Range-checked before narrowing: 2^32 + 4 must not read as 4.
  if (it->is_number_unsigned() ? it->get<uint64_t>() > 64
                               : (it->get<int64_t>() < 0 || it->get<int64_t>() > 64))
    bad(file, key, "expected a bit count in [0, 64], got " + it->dump());
  return static_cast<int>(it->get<int64_t>());
}

int64_t group_size_of(const json& j, const char* key, const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return -1;
  if (!it->is_number_integer()) bad(file, key, "not an integer");
  // Range-checked as unsigned first: 2^64 - 1 must not read as -1, and no group size may make
  // (k + group_size - 1) or a group count overflow.
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(kMaxConfigDim))
    bad(file, key, "must be -1 or in [1, 2^40], got " + it->dump());
  const int64_t g = it->get<int64_t>();
  if (g == 0 || g < -1 || g > kMaxConfigDim)
    bad(file, key, "must be -1 or in [1, 2^40], got " + it->dump());
  return g;
}

QuantParams normalize_gptq(const json& qc, const std::string& file, DType dtype) {
  QuantParams p;
  p.method = QuantMethod::kGptq;
  p.dtype = dtype;
  p.bits = require_bits(qc, "bits", file);
  if (p.bits != 4 && p.bits != 8)
    throw Error(ErrorCode::kUnsupported, file, "",
                "GPTQ bits=" + std::to_string(p.bits) + " is not supported (4 or 8)");
  p.group_size = group_size_of(qc, "group_size", file);
  p.act_order = get_bool(qc, "desc_act", false, file);
  p.symmetric = get_bool(qc, "sym", true, file);
  std::string fmt = lower(get_str(qc, "checkpoint_format", get_str(qc, "format", "gptq")));
  if (get_bool(qc, "is_marlin_format", false, file) || fmt == "marlin")
    throw Error(ErrorCode::kUnsupported, file, "",
                "legacy Marlin GPTQ checkpoints (checkpoint_format \"marlin\") are already packed "
                "for the removed AutoGPTQ Marlin kernel and are not supported");
  if (fmt == "gptq_v2")
    p.gptq_format = GptqFormat::kV2;
  else if (fmt == "gptq" || fmt.empty())
    p.gptq_format = GptqFormat::kV1;
  else
    bad(file, "checkpoint_format", "unknown value \"" + fmt + "\" (gptq or gptq_v2)");
  return p;
}

QuantParams normalize_awq(const json& qc, const std::string& file, DType dtype) {
  QuantParams p;
  p.method = QuantMethod::kAwq;
  p.dtype = dtype;
  p.bits = qc.contains("bits") ? require_bits(qc, "bits", file) : require_bits(qc, "w_bit", file);
  p.group_size = qc.contains("group_size") ? group_size_of(qc, "group_size", file)
                                           : group_size_of(qc, "q_group_size", file);
  p.symmetric = false;
  const std::string version = lower(get_str(qc, "version", "gemm"));
  if (version != "gemm")
    throw Error(ErrorCode::kUnsupported, file, "",
                "AWQ version \"" + version + "\" is not supported (only gemm)");
  // zero_point false (auto-round's auto_awq export of a symmetric scheme) still stores qzeros
  // (2^(bits-1) each), and vLLM's AWQ MoE path reads them like any others: so does moepack.
  get_bool(qc, "zero_point", true, file);
  if (p.bits != 4)
    throw Error(ErrorCode::kUnsupported, file, "",
                "AWQ bits=" + std::to_string(p.bits) + " is not supported (4)");
  if (p.group_size <= 0) bad(file, "group_size", "AWQ needs a positive group size");
  return p;
}

// compressed-tensors nvfp4-pack-quantized (strategy tensor_group, group 16, a global scale) and
// mxfp4-pack-quantized (strategy group, group 32): 4-bit float weights, symmetric. Activations:
// none (NVFP4A16) or FP4 (W4A4: input_activations of 4-bit floats, "dynamic": "local", whose
// Linears carry input_global_scale): NVFP4 W4A4 is dynamic_input false, as vLLM's
// CompressedTensorsW4A4Nvfp4MoEMethod reads it (use_a16 false).
QuantParams normalize_ct_fp4(const std::string& fmt, const json& w, const json& a,
                             const std::string& file, DType dtype) {
  const bool nv = fmt == "nvfp4-pack-quantized";
  QuantParams p;
  p.dynamic_input = !(nv && a.is_object() && get_int(a, "num_bits", 16) == 4 &&
                      get_str(a, "type", "") == "float");
  p.dtype = dtype;
  p.method = nv ? QuantMethod::kCtNvfp4 : QuantMethod::kCtMxfp4;
  p.bits = 4;
  p.group_size = nv ? 16 : 32;
  if (get_int(w, "num_bits", 4) != 4 || get_str(w, "type", "float") != "float")
    bad(file, "weights", fmt + " needs 4-bit float weights, got " + w.dump());
  const int64_t g = get_int(w, "group_size", p.group_size);
  if (g != p.group_size)
    bad(file, "weights.group_size",
        fmt + " uses groups of " + std::to_string(p.group_size) + ", got " + std::to_string(g));
  const std::string strategy = get_str(w, "strategy", nv ? "tensor_group" : "group");
  if (strategy != (nv ? "tensor_group" : "group"))
    bad(file, "weights.strategy",
        fmt + " expects strategy " + (nv ? "tensor_group" : "group") + ", got " + strategy);
  if (!get_bool(w, "symmetric", true, file))
    throw Error(ErrorCode::kUnsupported, file, "",
                fmt +
                    " with asymmetric weights (weight_zero_point) is not supported; vLLM 0.33 "
                    "reads symmetric FP4 only");
  return p;
}

// One config_groups entry (a scheme) as QuantParams. `name` is the group's key, for errors.
QuantParams normalize_ct_group(const json& qc, const std::string& name, const json& group,
                               const std::string& file, DType dtype) {
  QuantParams p;
  p.dtype = dtype;
  const std::string format = get_str(qc, "format");
  if (!group.is_object()) bad(file, "config_groups." + name, "not an object");
  const json* scheme = &group;
  const json w = scheme->value("weights", json::object());
  if (!w.is_object()) bad(file, "config_groups.weights", "missing or not an object");
  const json a = scheme->value("input_activations", json());
  const std::string fmt = get_str(*scheme, "format", format);
  const std::string wtype = get_str(w, "type", "int");
  const std::string strategy = get_str(w, "strategy", "group");
  if (fmt == "pack-quantized" || fmt == "int-quantized" || fmt == "naive-quantized") {
    if (wtype != "int") bad(file, "weights.type", "expected int for format " + fmt);
    const int bits = require_bits(w, "num_bits", file);
    p.bits = bits;
    p.symmetric = get_bool(w, "symmetric", true, file);
    if (strategy == "channel")
      p.group_size = -1;
    else if (strategy == "group")
      p.group_size = group_size_of(w, "group_size", file);
    else
      throw Error(ErrorCode::kUnsupported, file, "",
                  "compressed-tensors weight strategy \"" + strategy +
                      "\" is not supported (group, channel)");
    const auto ao = w.find("actorder");
    p.actorder = (ao != w.end() && ao->is_string()) ? ao->get<std::string>() : "";
    if (ao != w.end() && ao->is_boolean()) p.actorder = ao->get<bool>() ? "group" : "";
    p.act_order = p.actorder == "group";
    if (fmt == "pack-quantized") {
      p.method = QuantMethod::kCtPackQuantized;
      if (bits != 4 && bits != 8)
        throw Error(ErrorCode::kUnsupported, file, "",
                    "compressed-tensors pack-quantized num_bits=" + std::to_string(bits) +
                        " is not supported (4 or 8)");
      if (!a.is_null() && a.is_object())
        throw Error(ErrorCode::kUnsupported, file, "",
                    "compressed-tensors pack-quantized with quantized activations is not "
                    "supported (W4A16/W8A16 only)");
    } else {
      p.method = QuantMethod::kCtIntQuantized;
      if (bits != 8)
        throw Error(ErrorCode::kUnsupported, file, "",
                    "compressed-tensors int-quantized num_bits=" + std::to_string(bits) +
                        " is not supported (8)");
      p.dynamic_input = a.is_object() ? get_bool(a, "dynamic", true, file) : true;
    }
    return p;
  }
  if (fmt == "nvfp4-pack-quantized" || fmt == "mxfp4-pack-quantized")
    return normalize_ct_fp4(fmt, w, a, file, dtype);
  if (fmt == "mxfp8-quantized") {
    p.method = QuantMethod::kCtMxfp8;
    p.bits = 8;
    p.group_size = 32;
    return p;
  }
  if (fmt == "float-quantized") {
    if (strategy == "block") {
      p.method = QuantMethod::kCtFp8Block;
      if (get_int(w, "num_bits", 8) != 8 || get_str(w, "type", "float") != "float")
        bad(file, "weights", "FP8 block needs float 8-bit weights, got " + w.dump());
      p.dynamic_input = !a.is_object() || get_bool(a, "dynamic", true, file);
      p.bits = 8;
      auto bs = w.find("block_structure");
      if (bs != w.end() && !bs->is_null()) {
        if (!bs->is_array() || bs->size() != 2 || !is_positive_dim((*bs)[0]) ||
            !is_positive_dim((*bs)[1]))
          bad(file, "weights.block_structure", "expected [block_n, block_k] of positive integers");
        p.block_n = (*bs)[0].get<int64_t>();
        p.block_k = (*bs)[1].get<int64_t>();
      }
      p.group_size = p.block_k;
      return p;
    }
    if (strategy == "channel" || strategy == "tensor") {
      p.method = strategy == "channel" ? QuantMethod::kCtFp8Channel : QuantMethod::kCtFp8Tensor;
      if (get_int(w, "num_bits", 8) != 8 || get_str(w, "type", "float") != "float")
        bad(file, "weights", "FP8 " + strategy + " needs float 8-bit weights, got " + w.dump());
      p.dynamic_input = !a.is_object() || get_bool(a, "dynamic", true, file);
      p.bits = 8;
      p.group_size = -1;
      return p;
    }
  }
  throw Error(ErrorCode::kUnsupported, file, "",
              "compressed-tensors format \"" + fmt + "\" with weights " + w.dump() +
                  " is not supported. Supported: " + supported_formats_text());
}

// Whether a config_groups entry lists `target` among its targets.
bool ct_group_targets(const json& group, const std::string& target) {
  auto t = group.find("targets");
  if (t == group.end() || !t->is_array()) return false;
  for (const auto& v : *t)
    if (v.is_string() && v.get<std::string>() == target) return true;
  return false;
}

// The checkpoint-wide view of a compressed-tensors config: its only group, or with several
// groups the one targeting the Linear class (the experts' scheme is then resolved per module by
// quant_for_modules; a group the experts do not use must not make the checkpoint unreadable, so
// the first group that normalises stands in when the Linear one does not).
QuantParams normalize_compressed_tensors(const json& qc, const std::string& file, DType dtype) {
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->empty())
    bad(file, "config_groups", "missing or empty");
  std::vector<std::pair<std::string, const json*>> order;
  for (auto& [name, g] : groups->items()) {
    if (!g.is_object()) bad(file, "config_groups." + name, "not an object");
    if (ct_group_targets(g, "Linear"))
      order.insert(order.begin(), {name, &g});
    else
      order.push_back({name, &g});
  }
  std::optional<Error> first_error;
  for (const auto& [name, g] : order) {
    try {
      return normalize_ct_group(qc, name, *g, file, dtype);
    } catch (const Error& e) {
      if (order.size() == 1) throw;
      if (!first_error) first_error = e;
    }
  }
  throw *first_error;
}

// auto-round's own format (quant_method "auto-round"): integer weights packed like AutoGPTQ
// ("packing_format": "auto_round:auto_gptq", the default) or AutoAWQ ("auto_round:auto_awq").
// vLLM's AutoRoundConfig serves the first through its GPTQ MoE path and the second through AWQ's,
// so moepack reads them with those codecs. Per-layer "extra_config" is resolved per module
// (quant_for_module).
QuantParams normalize_auto_round(const json& qc, const std::string& file, DType dtype) {
  const std::string data_type = lower(get_str(qc, "data_type", "int"));
  if (data_type != "int")
    throw Error(ErrorCode::kUnsupported, file, "",
                "quantization_config.data_type: auto-round \"" + data_type +
                    "\" is not supported (only int). Supported: " + supported_formats_text());
  std::string packing = lower(get_str(qc, "packing_format", get_str(qc, "backend", "")));
  if (packing.empty()) packing = "auto_round:auto_gptq";
  json as = qc;
  as["desc_act"] = false;
  if (packing == "auto_round:auto_gptq" || packing == "auto_round:gptqmodel" ||
      packing == "auto_gptq" || packing == "auto_round") {
    as["checkpoint_format"] = "gptq";
    return normalize_gptq(as, file, dtype);
  }
  if (packing == "auto_round:auto_awq" || packing == "auto_awq") {
    as["version"] = "gemm";
    as["zero_point"] = true;
    return normalize_awq(as, file, dtype);
  }
  throw Error(ErrorCode::kUnsupported, file, "",
              "quantization_config.packing_format: auto-round \"" + packing +
                  "\" is not supported (auto_round:auto_gptq, auto_round:auto_awq)");
}

// ModelOpt writes its config in several shapes (spec/checkpoints.md §3.3):
//  (1) config.json {"quant_method":"modelopt","quant_algo":"MXFP8",...}           flat, >= 0.41
//  (2) config.json {"quant_method":"modelopt","quantization":{"quant_algo":...}}  nested
//  (3) hf_quant_config.json {"producer":{...},"quantization":{"quant_algo":...}}  side file
//  (4) config.json {"quant_method":"modelopt_mxfp8"} / "modelopt_fp8"             vLLM names
//  (5) any of the above with quant_algo "FP8" (per-tensor FP8)
QuantParams normalize_modelopt(const json& qc, const std::string& file, DType dtype) {
  const json* body = &qc;
  if (qc.contains("quantization") && qc["quantization"].is_object()) body = &qc["quantization"];
  std::string algo = get_str(*body, "quant_algo");
  const std::string method = lower(get_str(qc, "quant_method"));
  if (algo.empty() && method == "modelopt_mxfp8") algo = "MXFP8";
  if (algo.empty() && method == "modelopt_fp8") algo = "FP8";
  if (algo.empty() && method == "modelopt_fp4") algo = "NVFP4";
  QuantParams p;
  p.dtype = dtype;
  const std::string up = [&] {
    std::string s = algo;
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
    return s;
  }();
  if (up.find("MXFP8") != std::string::npos) {
    p.method = QuantMethod::kModeloptMxfp8;
    p.bits = 8;
    p.group_size = get_int(*body, "group_size", 32);  // any other value is refused below
    if (p.group_size != 32) bad(file, "group_size", "MXFP8 uses blocks of 32");
    return p;
  }
  if (up == "NVFP4" || up == "W4A16_NVFP4") {
    p.method = QuantMethod::kModeloptNvfp4;
    p.bits = 4;
    // NVFP4 is W4A4: every Linear carries its activations' static global scale (input_scale).
    p.dynamic_input = up == "W4A16_NVFP4";
    p.group_size = get_int(*body, "group_size", 16);
    if (p.group_size != 16) bad(file, "group_size", "NVFP4 uses blocks of 16");
    return p;
  }
  if (up == "FP8") {
    p.method = QuantMethod::kModeloptFp8;
    p.bits = 8;
    p.dynamic_input = false;  // ModelOpt FP8 calibrates static per-tensor input scales
    return p;
  }
  if (algo.empty()) bad(file, "quant_algo", "missing");
  throw Error(ErrorCode::kUnsupported, file, "",
              "ModelOpt quant_algo \"" + algo +
                  "\" is not supported. Supported: " + supported_formats_text());
}

QuantParams normalize_fp8(const json& qc, const std::string& file, DType dtype) {
  QuantParams p;
  p.dtype = dtype;
  p.bits = 8;
  auto bs = qc.find("weight_block_size");
  if (bs == qc.end() || bs->is_null())
    throw Error(ErrorCode::kUnsupported, file, "",
                "fp8 checkpoints without weight_block_size (per-tensor FP8) are not supported; "
                "supported: " +
                    supported_formats_text());
  if (!bs->is_array() || bs->size() != 2 || !is_positive_dim((*bs)[0]) ||
      !is_positive_dim((*bs)[1]))
    bad(file, "weight_block_size", "expected [block_n, block_k] of positive integers");
  p.method = QuantMethod::kFp8Block;
  p.block_n = (*bs)[0].get<int64_t>();
  p.block_k = (*bs)[1].get<int64_t>();
  p.group_size = p.block_k;
  const std::string fmt = get_str(qc, "fmt", "e4m3");
  if (fmt != "e4m3") bad(file, "fmt", "only e4m3 is supported, got " + fmt);
  p.dynamic_input = get_str(qc, "activation_scheme", "dynamic") == "dynamic";
  return p;
}

// gpt-oss's own MXFP4 (transformers Mxfp4Config, vLLM Mxfp4Config): {"quant_method": "mxfp4",
// "modules_to_not_convert": [...]}; the experts are fused <proj>_blocks / _scales
// (formats/fp4.h). modules_to_not_convert is matched per module (module_not_converted).
QuantParams normalize_gpt_oss_mxfp4(const json& qc, const std::string& file, DType dtype) {
  QuantParams p;
  p.dtype = dtype;
  p.method = QuantMethod::kGptOssMxfp4;
  p.bits = 4;
  p.group_size = 32;
  auto m = qc.find("modules_to_not_convert");
  if (m != qc.end() && !m->is_null()) {
    if (!m->is_array()) bad(file, "modules_to_not_convert", "expected a list of module names");
    for (const auto& v : *m)
      if (!v.is_string())
        bad(file, "modules_to_not_convert", "expected strings, got " + json_excerpt(v));
  }
  return p;
}

}  // namespace

DType parse_torch_dtype(const std::string& s, const std::string& file) {
  if (s == "bfloat16" || s == "bf16") return DType::kBF16;
  if (s == "float16" || s == "fp16" || s == "half") return DType::kF16;
  if (s == "float32" || s == "fp32" || s == "float") return DType::kF32;
  throw Error(ErrorCode::kBadConfig, file, "", "unknown torch_dtype \"" + s + "\"");
}

namespace {

// The config normalisers, one row per quantization_config "quant_method" value (lower case).
// A new source format adds its row here (docs/architecture.md).
using Normaliser = QuantParams (*)(const json&, const std::string&, DType);
struct NormaliserRow {
  const char* quant_method;
  Normaliser normalise;
};
const std::vector<NormaliserRow>& normaliser_rows() {
  static const std::vector<NormaliserRow> rows = {
      {"gptq", normalize_gptq},
      {"awq", normalize_awq},
      {"compressed-tensors", normalize_compressed_tensors},
      {"compressed_tensors", normalize_compressed_tensors},
      {"modelopt", normalize_modelopt},
      {"modelopt_mxfp8", normalize_modelopt},
      {"modelopt_fp8", normalize_modelopt},
      {"modelopt_fp4", normalize_modelopt},
      {"fp8", normalize_fp8},
      {"auto-round", normalize_auto_round},
      {"auto_round", normalize_auto_round},
      {"mxfp4", normalize_gpt_oss_mxfp4},
  };
  return rows;
}

}  // namespace

namespace {

bool same_quant(const QuantParams& a, const QuantParams& b) {
  return a.method == b.method && a.bits == b.bits && a.group_size == b.group_size &&
         a.symmetric == b.symmetric && a.act_order == b.act_order &&
         a.gptq_format == b.gptq_format && a.actorder == b.actorder && a.block_n == b.block_n &&
         a.block_k == b.block_k && a.dtype == b.dtype && a.dynamic_input == b.dynamic_input;
}

// compressed-tensors: the scheme of the group whose targets match the module, as
// compressed-tensors' match_targets resolves it: a target equal to the module name first, then a
// "re:" regex matching it, then the class ("Linear"). `ignore` lists
// modules left unquantized. Two groups matching at the same level with different schemes are
// refused: which one wins depends on the order of keys, which JSON objects do not keep.
QuantParams ct_quant_for_module(const HfConfig& c, const std::string& module,
                                std::string* group_out) {
  const json& qc = c.quant_raw;
  const std::string& file = c.quant_file;
  auto name_matches = [&](const std::string& target, const std::string& field) {
    if (target.rfind("re:", 0) == 0)
      return python_re_match(target.substr(3), module, file, "quantization_config." + field);
    return target == module;
  };
  if (auto ig = qc.find("ignore"); ig != qc.end() && ig->is_array())
    for (const auto& t : *ig)
      if (t.is_string() && (name_matches(t.get<std::string>(), "ignore") || t == "Linear"))
        throw Error(ErrorCode::kUnsupported, file, module,
                    "quantization_config.ignore: expert Linear " + module +
                        " is listed as unquantized (ignore " + t.dump() +
                        "); unquantized experts in a quantized checkpoint are not converted");
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object()) return c.quant;
  // Levels in compressed-tensors' order of precedence: exact name, re: regex, class.
  for (const int level : {0, 1, 2}) {
    std::optional<QuantParams> found;
    std::string found_group;
    for (auto& [gname, g] : groups->items()) {
      auto t = g.find("targets");
      if (!g.is_object() || t == g.end() || !t->is_array()) continue;
      bool hit = false;
      for (const auto& target : *t) {
        if (!target.is_string()) continue;
        const std::string s = target.get<std::string>();
        const bool regex = s.rfind("re:", 0) == 0;
        if (level == 0) hit |= !regex && s == module;
        if (level == 1 && regex)
          hit |= python_re_match(s.substr(3), module, file,
                                 "quantization_config.config_groups." + gname + ".targets");
        if (level == 2) hit |= s == "Linear";
      }
      if (!hit) continue;
      const QuantParams q = normalize_ct_group(qc, gname, g, file, c.dtype);
      if (found && !same_quant(*found, q))
        throw Error(ErrorCode::kUnsupported, file, module,
                    "quantization_config.config_groups: groups \"" + found_group + "\" and \"" +
                        gname + "\" both match " + module +
                        " with different schemes; which one applies is ambiguous");
      if (!found) {
        found = q;
        found_group = gname;
      }
    }
    if (found) {
      if (group_out) *group_out = found_group;
      return *found;
    }
  }
  throw Error(ErrorCode::kUnsupported, file, module,
              "quantization_config.config_groups: no group targets expert Linear " + module +
                  " (by name, re: regex or class Linear)");
}

// GPTQModel's "dynamic": {pattern: overrides}. "-:pattern" leaves matching modules unquantized,
// "+:pattern" or a bare pattern overrides bits / group_size / desc_act / sym for them (vLLM's
// get_dynamic_override, first match wins; several matching patterns with different results are
// refused, as JSON objects do not keep their order). Patterns are matched as Python's re.match
// (GPTQModel's dynamic_get) by RE2, within the subset of model/python_regex.h: any other key is
// exit 3 naming it.
QuantParams gptq_quant_for_module(const HfConfig& c, const std::string& module,
                                  std::string* rule_out) {
  const json& qc = c.quant_raw;
  auto dyn = qc.find("dynamic");
  if (dyn == qc.end() || dyn->is_null()) return c.quant;
  if (!dyn->is_object()) bad(c.quant_file, "dynamic", "expected an object of pattern: overrides");
  std::optional<QuantParams> found;
  std::string found_rule;
  for (auto& [key, overrides] : dyn->items()) {
    const bool negative = key.rfind("-:", 0) == 0;
    const std::string pattern = key.rfind("+:", 0) == 0 || negative ? key.substr(2) : key;
    if (!python_re_match(pattern, module, c.quant_file,
                         "quantization_config.dynamic \"" + key + "\""))
      continue;
    if (negative)
      throw Error(ErrorCode::kUnsupported, c.quant_file, module,
                  "quantization_config.dynamic \"" + key + "\" leaves expert Linear " + module +
                      " unquantized; unquantized experts in a quantized checkpoint are not "
                      "converted");
    if (!overrides.is_object())
      bad(c.quant_file, "dynamic." + key, "expected an object of overrides");
    json merged = qc;
    merged.erase("dynamic");
    for (auto& [k, v] : overrides.items()) merged[k] = v;
    const QuantParams q = normalize_quant_config(merged, c.quant_file, c.dtype);
    if (found && !same_quant(*found, q))
      throw Error(ErrorCode::kUnsupported, c.quant_file, module,
                  "quantization_config.dynamic: \"" + found_rule + "\" and \"" + key +
                      "\" both match " + module +
                      " with different overrides; which one applies is ambiguous");
    if (!found) {
      found = q;
      found_rule = key;
    }
  }
  if (rule_out && found) *rule_out = found_rule;
  return found ? *found : c.quant;
}

// auto-round's "extra_config": {layer name or regex: {bits, group_size, sym, data_type}}. As
// vLLM's AutoRoundConfig.get_layer_config: an exact name first, then keys holding regex
// characters searched (re.search) in the name. bits >= 16 leaves the module unquantized. A key
// outside the regex subset of model/python_regex.h is exit 3 naming it (vLLM skips keys Python
// cannot compile; moepack cannot tell those from keys it would match differently).
QuantParams auto_round_quant_for_module(const HfConfig& c, const std::string& module,
                                        std::string* rule_out) {
  const json& qc = c.quant_raw;
  auto extra = qc.find("extra_config");
  if (extra == qc.end() || extra->is_null()) return c.quant;
  if (!extra->is_object()) bad(c.quant_file, "extra_config", "expected an object");
  const json* hit = nullptr;
  std::string key;
  if (auto it = extra->find(module); it != extra->end()) {
    hit = &*it;
    key = module;
  } else {
    for (auto& [pattern, cfg] : extra->items()) {
      if (pattern.find_first_of("*+?^$()[]{}|\\") == std::string::npos) continue;
      if (!python_re_search(pattern, module, c.quant_file,
                            "quantization_config.extra_config \"" + pattern + "\""))
        continue;
      hit = &cfg;
      key = pattern;
      break;
    }
  }
  if (!hit) return c.quant;
  if (!hit->is_object()) bad(c.quant_file, "extra_config." + key, "expected an object");
  json merged = qc;
  merged.erase("extra_config");
  for (auto& [k, v] : hit->items()) merged[k] = v;
  if (merged.contains("bits") && merged["bits"].is_number_integer() &&
      merged["bits"].get<int>() >= 16)
    throw Error(
        ErrorCode::kUnsupported, c.quant_file, module,
        "quantization_config.extra_config \"" + key + "\" leaves expert Linear " + module +
            " unquantized; unquantized experts in a quantized checkpoint are not converted");
  if (rule_out) *rule_out = "extra_config \"" + key + "\"";
  return normalize_quant_config(merged, c.quant_file, c.dtype);
}

}  // namespace

QuantParams quant_for_module(const HfConfig& c, const std::string& module, std::string* rule) {
  if (c.quant.method == QuantMethod::kNone || !c.quant_raw.is_object()) return c.quant;
  const std::string method = lower(get_str(c.quant_raw, "quant_method"));
  if (method == "compressed-tensors" || method == "compressed_tensors")
    return ct_quant_for_module(c, module, rule);
  if (method == "auto-round" || method == "auto_round")
    return auto_round_quant_for_module(c, module, rule);
  if (c.quant.method == QuantMethod::kGptq || c.quant.method == QuantMethod::kAwq)
    return gptq_quant_for_module(c, module, rule);
  return c.quant;
}

QuantParams quant_for_modules(const HfConfig& c, const std::vector<std::string>& modules) {
  if (modules.empty()) return c.quant;
  std::string first_rule;
  const QuantParams first = quant_for_module(c, modules.front(), &first_rule);
  for (size_t i = 1; i < modules.size(); ++i) {
    std::string rule;
    const QuantParams q = quant_for_module(c, modules[i], &rule);
    if (!same_quant(first, q))
      throw Error(ErrorCode::kUnsupported, c.quant_file, modules[i],
                  "expert Linears have different quantization schemes: " + modules.front() +
                      (first_rule.empty() ? "" : " (" + first_rule + ")") + " and " + modules[i] +
                      (rule.empty() ? "" : " (" + rule + ")") +
                      "; vLLM's fused MoE takes one scheme for all experts of a model");
  }
  return first;
}

QuantParams normalize_quant_config(const json& qc, const std::string& file, DType model_dtype) {
  if (!qc.is_object())
    throw Error(ErrorCode::kBadConfig, file, "", "quantization_config is not an object");
  std::string method = lower(get_str(qc, "quant_method"));
  if (method.empty() && qc.contains("quantization") && qc.contains("producer"))
    method = "modelopt";  // hf_quant_config.json shape
  if (method.empty() && qc.contains("bits") && qc.contains("group_size"))
    method = "gptq";  // quantize_config.json written by AutoGPTQ has no quant_method
  for (const auto& row : normaliser_rows())
    if (method == row.quant_method) return row.normalise(qc, file, model_dtype);
  if (method.empty())
    throw Error(ErrorCode::kBadConfig, file, "", "quantization_config has no quant_method");
  throw Error(
      ErrorCode::kUnsupported, file, "",
      "quant_method \"" + method + "\" is not supported. Supported: " + supported_formats_text());
}

HfConfig load_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  return hf_config_from_json(read_json_file(path, {.if_missing = "config.json not found"}), path,
                             dir);
}

HfConfig hf_config_from_json(nlohmann::json raw, const std::string& path, const std::string& dir) {
  HfConfig c;
  c.raw = std::move(raw);
  if (!c.raw.is_object()) throw Error(ErrorCode::kBadConfig, path, "", "not a JSON object");
  c.text = c.raw;
  if (c.raw.contains("text_config") && !c.raw["text_config"].is_null() &&
      !c.raw["text_config"].is_object())
    throw Error(ErrorCode::kBadConfig, path, "",
                "text_config: expected an object, got " + json_excerpt(c.raw["text_config"]));
  const bool from_text_config = c.raw.contains("text_config") && c.raw["text_config"].is_object();
  if (from_text_config) c.text = c.raw["text_config"];
  c.model_type = get_str(c.text, "model_type", get_str(c.raw, "model_type"));
  if (c.raw.contains("architectures") && c.raw["architectures"].is_array() &&
      !c.raw["architectures"].empty() && c.raw["architectures"][0].is_string())
    c.architecture = c.raw["architectures"][0].get<std::string>();
  const std::string where = from_text_config ? "text_config." : "";
  c.hidden_size = get_dim(c.text, "hidden_size", path, where, &c.hidden_size_key);
  c.num_layers = get_dim(c.text, "num_hidden_layers", path, where);
  // A per-layer list (Hunyuan) is not one size to check the experts against.
  const bool per_layer_inter =
      c.text.contains("moe_intermediate_size") && c.text["moe_intermediate_size"].is_array();
  if (!per_layer_inter)
    c.moe_intermediate_size =
        get_dim(c.text, "moe_intermediate_size", path, where, &c.moe_intermediate_size_key);
  if (c.moe_intermediate_size == 0 && !per_layer_inter)
    c.moe_intermediate_size =
        get_dim(c.text, "intermediate_size", path, where, &c.moe_intermediate_size_key);
  for (const char* key :
       {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"})
    if (c.num_experts == 0) c.num_experts = get_dim(c.text, key, path, where, &c.num_experts_key);
  for (const char* key : {"num_experts_per_tok", "experts_per_token", "moe_k", "top_k_experts"})
    if (c.top_k_key.empty()) c.top_k = get_dim(c.text, key, path, where, &c.top_k_key);
  c.hidden_act = get_str(c.text, "hidden_act", get_str(c.text, "hidden_activation", "silu"));
  c.gated = !(c.hidden_act == "relu2" || c.hidden_act == "relu_squared");
  std::string dt = get_str(c.text, "torch_dtype", get_str(c.raw, "torch_dtype"));
  if (dt.empty()) dt = get_str(c.text, "dtype", get_str(c.raw, "dtype", "bfloat16"));
  c.dtype = parse_torch_dtype(dt, path);

  // Where the quantization config lives, in vLLM's order of preference.
  const json* qc = nullptr;
  json side;
  if (c.raw.contains("quantization_config") && !c.raw["quantization_config"].is_null()) {
    qc = &c.raw["quantization_config"];
    c.quant_file = path;
  } else if (c.text.contains("quantization_config") && !c.text["quantization_config"].is_null()) {
    side = c.text["quantization_config"];
    qc = &side;
    c.quant_file = path;
  } else if (!dir.empty()) {
    for (const char* name : {"hf_quant_config.json", "quantize_config.json"}) {
      const std::string p = (fs::path(dir) / name).string();
      if (regular_file_or_missing(p) == PathKind::kRegular) {
        side = read_json_file(p);
        qc = &side;
        c.quant_file = p;
        break;
      }
    }
  }
  if (qc && qc->is_object() && qc->value("quant_method", json()) == json("moepack")) {
    c.moepack_quant = *qc;
    const json* nested =
        qc->contains("source_quantization_config") ? &(*qc)["source_quantization_config"] : nullptr;
    if (!nested)
      throw Error(ErrorCode::kBadConfig, c.quant_file, "quantization_config",
                  "quant_method \"moepack\" without source_quantization_config");
    qc = nested->is_null() ? nullptr : nested;
  }
  if (qc) {
    c.quant_raw = *qc;
    c.quant = normalize_quant_config(*qc, c.quant_file, c.dtype);
  } else {
    c.quant_raw = json::object();
    c.quant.method = QuantMethod::kNone;
    c.quant.bits = dtype_bits(c.dtype);
    c.quant.dtype = c.dtype;
  }
  return c;
}

std::string module_not_converted(const HfConfig& c, const std::string& module) {
  if (!c.quant_raw.is_object()) return "";
  auto m = c.quant_raw.find("modules_to_not_convert");
  if (m == c.quant_raw.end() || !m->is_array()) return "";
  const std::string field = "modules_to_not_convert";
  for (const auto& v : *m) {
    if (!v.is_string()) continue;
    const std::string key = v.get<std::string>();
    const bool suffix = module.size() >= key.size() &&
                        module.compare(module.size() - key.size(), key.size(), key) == 0;
    if (python_re_match(key + "\\.", module, c.quant_file, field) ||
        python_re_match(key, module, c.quant_file, field) || suffix)
      return key;
  }
  return "";
}

}  // namespace moepack
