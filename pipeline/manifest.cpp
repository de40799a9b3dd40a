#include "pipeline/manifest.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/version.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

std::string moepack_version_string() {
  return moepack_version();
}

json quant_params_json(const QuantParams& q) {
  return {{"method", quant_method_name(q.method)},
          {"bits", q.bits},
          {"group_size", q.group_size},
          {"symmetric", q.symmetric},
          {"act_order", q.act_order},
          {"gptq_format", q.gptq_format == GptqFormat::kV2 ? "gptq_v2" : "gptq"},
          {"actorder", q.actorder},
          {"block", {q.block_n, q.block_k}},
          {"dtype", dtype_name(q.dtype)},
          {"dynamic_input", q.dynamic_input}};
}

QuantParams quant_params_from_json(const json& j, const std::string& file) {
  QuantParams q;
  try {
    const std::string m = j.at("method").get<std::string>();
    bool found = false;
    for (int i = 0; i <= static_cast<int>(QuantMethod::kFp8Block); ++i)
      if (m == quant_method_name(static_cast<QuantMethod>(i))) {
        q.method = static_cast<QuantMethod>(i);
        found = true;
      }
    if (!found) throw Error(ErrorCode::kBadConfig, file, "", "unknown method " + m);
    q.bits = j.at("bits").get<int>();
    q.group_size = j.at("group_size").get<int64_t>();
    q.symmetric = j.at("symmetric").get<bool>();
    q.act_order = j.at("act_order").get<bool>();
    q.gptq_format =
        j.at("gptq_format").get<std::string>() == "gptq_v2" ? GptqFormat::kV2 : GptqFormat::kV1;
    q.actorder = j.at("actorder").get<std::string>();
    q.block_n = j.at("block").at(0).get<int64_t>();
    q.block_k = j.at("block").at(1).get<int64_t>();
    const std::string dtype = j.at("dtype").get<std::string>();
    const auto parsed = parse_dtype(dtype);
    if (!parsed) throw Error(ErrorCode::kBadConfig, file, "", "unknown dtype " + dtype);
    q.dtype = *parsed;
    q.dynamic_input = j.at("dynamic_input").get<bool>();
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kBadConfig, file, "",
                std::string("malformed quant params: ") + e.what());
  }
  return q;
}

json build_manifest(const Plan& plan, const Checkpoint& ckpt,
                    const std::map<std::string, std::string>& sha) {
  json m;
  m["manifest_version"] = kManifestVersion;
  m["tool"] = {{"name", "moepack"}, {"version", moepack_version_string()}};
  m["source"] = {{"name", fs::path(plan.options.src).filename().string()},
                 {"format", plan.source_format},
                 {"quant_params", quant_params_json(plan.source_quant)},
                 {"quantization_config", ckpt.config().quant_raw},
                 {"model_type", ckpt.config().model_type},
                 {"tensor_bytes", ckpt.total_tensor_bytes()}};
  m["target_quant_params"] = quant_params_json(plan.target_quant);
  if (!plan.options.quantize.empty())
    m["quantize"] = {{"format", plan.options.quantize}, {"recipe", plan.options.mx_recipe}};
  m["backend"] = plan.backend;
  m["layout"] = {{"name", plan.layout_name}, {"version", plan.layout_version}};
  m["target_arch"] = target_arch_name(plan.arch);
  m["act_dtype"] = dtype_name(plan.options.act_dtype);
  m["options"] = {{"vllm_w13_scale_size_k", plan.options.vllm_w13_scale_size_k}};
  m["deviations_from_vllm"] = plan.deviations;
  m["layers"] = json::array();
  for (const auto& pl : plan.layers) {
    const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
    json params = json::array();
    for (const auto& t : plan.tensors)
      if (t.layer == pl.index) params.push_back(t.name);
    m["layers"].push_back({{"module", L.module},
                           {"layer", L.layer},
                           {"family", moe_family_name(L.family)},
                           {"param_prefix", L.param_prefix},
                           {"experts", L.num_experts},
                           {"hidden", L.hidden},
                           {"inter", L.inter},
                           {"gated", L.gated},
                           {"params", params},
                           {"deviations_from_vllm", pl.deviations}});
  }
  m["shards"] = json::array();
  for (size_t i = 0; i < plan.shards.shard_names.size(); ++i)
    m["shards"].push_back(
        {{"name", plan.shards.shard_names[i]}, {"file_bytes", plan.shards.shard_file_bytes[i]}});
  m["files"] = plan.copied_files;
  m["tensors"] = json::object();
  for (const auto& t : plan.tensors) {
    auto it = sha.find(t.name);
    if (it == sha.end()) throw Error(ErrorCode::kInternal, "", t.name, "no checksum recorded");
    m["tensors"][t.name] = {{"shard", plan.shards.shard_names[plan.shards.shard_of.at(t.name)]},
                            {"dtype", dtype_name(t.dtype)},
                            {"shape", t.shape},
                            {"bytes", t.bytes},
                            {"sha256", it->second},
                            {"action", t.converted ? "convert" : "copy"},
                            {"codec", t.codec},
                            {"sources", t.sources}};
  }
  return m;
}

void write_manifest(const std::string& path, const json& manifest) {
  std::ofstream f(path);
  f << manifest.dump(2) << "\n";
  if (!f) throw Error(ErrorCode::kIo, path, "", "write failed");
}

json read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "moepack.json").string();
  std::ifstream in(path);
  if (!in)
    throw Error(ErrorCode::kBadConfig, path, "",
                "no moepack.json: not a moepack-converted checkpoint");
  try {
    json m = json::parse(in);
    if (!m.is_object() || m.value("manifest_version", 0) != kManifestVersion)
      throw Error(ErrorCode::kBadConfig, path, "", "unsupported manifest_version");
    return m;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kBadConfig, path, "", std::string("invalid JSON: ") + e.what());
  }
}

}  // namespace moepack
