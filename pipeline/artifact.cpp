#include "pipeline/artifact.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/sha256.h"
#include "io/json_file.h"
#include "model/checkpoint.h"
#include "pipeline/manifest.h"
#include "pipeline/plan.h"
#include "pipeline/servability.h"

namespace moepack {
using nlohmann::json;

ConfigPatchInputs config_patch_inputs(const Plan& plan) {
  ConfigPatchInputs in;
  in.version = moepack_version_string();
  in.source_format = plan.source_format;
  in.backend = plan.backend;
  in.layout = plan.layout_name;
  in.layout_version = plan.layout_version;
  in.arch = plan.arch;
  in.act_dtype = plan.options.act_dtype;
  in.vllm_target = plan.vllm_target;
  in.parallel = plan.options.parallel;
  return in;
}

ConfigPatchInputs config_patch_inputs(const Manifest& m) {
  ConfigPatchInputs in;
  in.version = m.tool.version;
  in.source_format = m.source.format;
  in.backend = m.backend;
  in.layout = m.layout.name;
  in.layout_version = m.layout.version;
  in.arch = m.target_arch;
  in.act_dtype = m.act_dtype;
  in.vllm_target = m.vllm_target;
  if (m.parallel) in.parallel = m.parallel->parallel;
  return in;
}

// quant_method "moepack" is one no stock engine knows, so stock vLLM stops with "Unknown
// quantization method" instead of creating checkpoint-format parameters, dropping the
// kernel-format tensors it does not recognise and repacking uninitialised memory. The
// moepack-vllm plugin (integrations/vllm) claims exactly this block. The quantization the weights
// carry (the source's block, or the one --quantize wrote) is nested whole so the plugin can build
// the source method for the Linears that were copied through.
json config_patch(const ConfigPatchInputs& in, const json& weights_quantization_config) {
  json source = weights_quantization_config;
  if (source.is_object() && source.empty()) source = nullptr;  // unquantized source
  json patch;
  patch["quantization_config"] = {{"quant_method", "moepack"},
                                  {"moepack_version", in.version},
                                  {"source_format", in.source_format},
                                  {"source_quantization_config", source},
                                  {"backend", in.backend},
                                  {"layout", in.layout},
                                  {"layout_version", in.layout_version},
                                  {"target_arch", target_arch_name(in.arch)},
                                  {"act_dtype", dtype_name(in.act_dtype)},
                                  // The --vllm-target whose names and shapes the layouts wrote; the
                                  // plugin serves only artifacts written for its own vLLM line.
                                  {"vllm_target", vllm_target_name(in.vllm_target)},
                                  {"tensor_parallel_size", in.parallel.tensor},
                                  {"manifest", "moepack.json"},
                                  {"manifest_sha256", nullptr}};
  // Expert parallelism: the EP size and vLLM's placement the rank files follow (absent for a
  // tensor-parallel or whole output, whose config.json is as before).
  if (in.parallel.expert > 1) {
    patch["quantization_config"]["expert_parallel_size"] = in.parallel.expert;
    patch["quantization_config"]["expert_placement"] = expert_placement_name(in.parallel.placement);
  }
  patch["moepack"] = {{"version", in.version},
                      {"manifest", "moepack.json"},
                      {"backend", in.backend},
                      {"layout", in.layout},
                      {"layout_version", in.layout_version},
                      {"target_arch", target_arch_name(in.arch)},
                      {"vllm_target", vllm_target_name(in.vllm_target)},
                      {"act_dtype", dtype_name(in.act_dtype)}};
  return patch;
}

json mxfp8_quantization_config(const Checkpoint& ckpt, const std::string& version) {
  json ignore = json::array();
  for (const auto& n : ckpt.other_tensors()) {
    const auto v = ckpt.view(n);
    if (v.shape.size() == 2 && n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0)
      ignore.push_back(n.substr(0, n.size() - 7));
  }
  return {{"quant_method", "modelopt"},
          {"quant_algo", "MXFP8"},
          {"ignore", ignore},
          {"producer", {{"name", "moepack"}, {"version", version}}}};
}

json output_config(const json& source_config, const json& patch) {
  json cfg = source_config;
  for (const auto& [key, value] : patch.items()) cfg[key] = value;
  // A multimodal config's text_config may carry the source's block too; it now lives nested in
  // ours, and no reader may find the stale one.
  if (cfg.contains("text_config") && cfg["text_config"].is_object())
    cfg["text_config"].erase("quantization_config");
  return cfg;
}

namespace {

std::string digest_of(const json& v) {
  const std::string text = v.dump();
  return sha256_hex(text.data(), text.size());
}

// A field's value as recorded: manifest_sha256 binds the other way (config.json names the
// manifest), so it is not part of the quantization_config's record.
json recorded_value(const std::string& key, const json& v) {
  if (key != "quantization_config" || !v.is_object()) return v;
  json w = v;
  w.erase("manifest_sha256");
  return w;
}

}  // namespace

json config_digests(const json& config) {
  json out = json::object();
  if (!config.is_object()) return out;
  for (const auto& [key, raw] : config.items()) {
    const json v = recorded_value(key, raw);
    if (!v.is_object()) {
      out[key] = digest_of(v);
      continue;
    }
    json members = json::object();
    for (const auto& [m, mv] : v.items()) members[m] = digest_of(mv);
    out[key] = members;
  }
  return out;
}

std::string config_digest_mismatch(const json& config, const json& digests) {
  if (!config.is_object()) return "(top level): not a JSON object";
  for (const auto& [key, d] : digests.items())
    if (!config.contains(key)) return key + ": removed (convert wrote it)";
  for (const auto& [key, raw] : config.items()) {
    if (!digests.contains(key)) return key + ": added (convert did not write it)";
    const json v = recorded_value(key, raw);
    const json& d = digests[key];
    if (d.is_string()) {
      if (v.is_object() || digest_of(v) != d.get<std::string>())
        return key + ": differs from what convert wrote";
      continue;
    }
    if (!v.is_object() || !d.is_object()) return key + ": differs from what convert wrote";
    for (const auto& [m, md] : d.items())
      if (!v.contains(m)) return key + "." + m + ": removed (convert wrote it)";
    for (const auto& [m, mv] : v.items()) {
      if (!d.contains(m)) return key + "." + m + ": added (convert did not write it)";
      if (!d[m].is_string() || digest_of(mv) != d[m].get<std::string>())
        return key + "." + m + ": differs from what convert wrote";
    }
  }
  return "";
}

namespace {

std::string join_path(const std::string& base, const std::string& key) {
  return base.empty() ? key : base + "." + key;
}

std::string first_difference(const json& got, const json& want, const std::string& path) {
  if (got.type() != want.type() && !(got.is_number() && want.is_number()))
    return path.empty() ? "(top level)" : path;
  if (got.is_object()) {
    for (const auto& [k, v] : want.items())
      if (!got.contains(k)) return join_path(path, k);
    for (const auto& [k, v] : got.items()) {
      if (!want.contains(k)) return join_path(path, k);
      const std::string d = first_difference(v, want[k], join_path(path, k));
      if (!d.empty()) return d;
    }
    return "";
  }
  if (got.is_array()) {
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      const std::string d = first_difference(got[i], want[i], path + "[" + std::to_string(i) + "]");
      if (!d.empty()) return d;
    }
    if (got.size() != want.size()) return path.empty() ? "(top level)" : path;
    return "";
  }
  // Numbers compare as written (2 and 2.0 are different text in a config).
  if (got.dump() != want.dump()) return path.empty() ? "(top level)" : path;
  return "";
}

}  // namespace

std::string json_first_difference(const json& got, const json& want) {
  return first_difference(got, want, "");
}

std::string manifest_file_sha256(const std::string& dir) {
  const std::string path = manifest_path(dir);
  if (regular_file_or_missing(path) == PathKind::kMissing)
    throw Error(ErrorCode::kBadConfig, path, "",
                "no moepack.json: not a moepack-converted checkpoint");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(ErrorCode::kIo, path, "", "cannot read: " + ec.message());
  if (size > kMaxManifestBytes)
    throw Error(ErrorCode::kBadConfig, path, "", "larger than any manifest moepack writes");
  std::ifstream f(path, std::ios::binary);
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(f.gcount()));
  }
  if (f.bad()) throw Error(ErrorCode::kIo, path, "", "read failed");
  return h.hex_digest();
}

std::string config_binding_problem(const std::string& dir, const Manifest& m, const json& config) {
  const json* qc = config.is_object() && config.contains("quantization_config")
                       ? &config["quantization_config"]
                       : nullptr;
  const json* named = qc && qc->is_object() && qc->contains("manifest_sha256")
                          ? &(*qc)["manifest_sha256"]
                          : nullptr;
  const std::string digest = manifest_file_sha256(dir);
  if (m.manifest_version >= 3) {
    const std::string field = config_digest_mismatch(config, m.config);
    if (!field.empty()) return "config.json: " + field;
  }
  if (!named)
    return "config.json: quantization_config.manifest_sha256: missing (convert wrote the "
           "manifest's digest)";
  if (*named != json(digest))
    return "config.json: quantization_config.manifest_sha256: " + json_excerpt(*named) +
           ", but moepack.json's SHA-256 is " + digest +
           " (the config and the manifest are not from one conversion)";
  return "";
}

json expected_output_config(const Manifest& m, const Checkpoint& src,
                            const std::string& manifest_sha256) {
  const ConfigPatchInputs facts = config_patch_inputs(m);
  const json weights =
      m.quantize ? mxfp8_quantization_config(src, facts.version) : src.config().quant_raw;
  json cfg = output_config(src.config().raw, config_patch(facts, weights));
  cfg["quantization_config"]["manifest_sha256"] = manifest_sha256;
  return cfg;
}

}  // namespace moepack
