#include "model/hf_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/json_file.h"

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
  if (!get_bool(qc, "zero_point", true, file))
    throw Error(ErrorCode::kUnsupported, file, "", "AWQ without zero points is not supported");
  if (p.bits != 4)
    throw Error(ErrorCode::kUnsupported, file, "",
                "AWQ bits=" + std::to_string(p.bits) + " is not supported (4)");
  if (p.group_size <= 0) bad(file, "group_size", "AWQ needs a positive group size");
  return p;
}

QuantParams normalize_compressed_tensors(const json& qc, const std::string& file, DType dtype) {
  QuantParams p;
  p.dtype = dtype;
  const std::string format = get_str(qc, "format");
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->empty())
    bad(file, "config_groups", "missing or empty");
  // moepack handles one scheme for the experts: take the group targeting Linear layers.
  const json* scheme = nullptr;
  for (auto& [name, g] : groups->items()) {
    if (!g.is_object()) bad(file, "config_groups." + name, "not an object");
    if (!scheme) scheme = &g;
    if (g.contains("targets") && g["targets"].is_array())
      for (const auto& t : g["targets"])
        if (t.is_string() && t.get<std::string>() == "Linear") scheme = &g;
  }
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
  if (fmt == "mxfp8-quantized") {
    p.method = QuantMethod::kCtMxfp8;
    p.bits = 8;
    p.group_size = 32;
    return p;
  }
  if (fmt == "float-quantized") {
    if (strategy == "block") {
      p.method = QuantMethod::kFp8Block;
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
  }
  throw Error(ErrorCode::kUnsupported, file, "",
              "compressed-tensors format \"" + fmt + "\" with weights " + w.dump() +
                  " is not supported. Supported: " + supported_formats_text());
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
  if (up == "FP8") {
    p.method = QuantMethod::kModeloptFp8;
    p.bits = 8;
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
      {"fp8", normalize_fp8},
  };
  return rows;
}

}  // namespace

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
  if (regular_file_or_missing(path) == PathKind::kMissing)
    throw Error(ErrorCode::kBadConfig, path, "", "config.json not found");
  return hf_config_from_json(read_json_file(path), path, dir);
}

HfConfig hf_config_from_json(nlohmann::json raw, const std::string& path, const std::string& dir) {
  HfConfig c;
  c.raw = std::move(raw);
  if (!c.raw.is_object()) throw Error(ErrorCode::kBadConfig, path, "", "not a JSON object");
  c.text = c.raw;
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
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"})
    if (c.num_experts == 0) c.num_experts = get_dim(c.text, key, path, where, &c.num_experts_key);
  for (const char* key : {"num_experts_per_tok", "experts_per_token"})
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

}  // namespace moepack
