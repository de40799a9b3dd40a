// moepack inspect DIR [--target-arch sm90] [--backend auto] [--vllm-target 0.33] [--tensors]
// [--json]
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "core/threads.h"
#include "model/checkpoint.h"
#include "pipeline/execute.h"
#include "pipeline/manifest.h"
#include "pipeline/oracle.h"
#include "tools/cli.h"

namespace moepack::cli {
using nlohmann::json;

namespace {
struct InspectArgs {
  std::string dir;
  std::string target_arch = "sm90";
  std::string backend = "auto";
  std::string act_dtype = "bf16";
  std::string vllm_target = vllm_target_name(newest_vllm_target());
  bool tensors = false;
  bool no_validate = false;
};

// The params that mean something for the checkpoint's scheme: a compressed-tensors checkpoint
// shows no GPTQ zero convention, an FP8 block one no symmetry or act-order. (moepack.json keeps
// every field: verify reads them back.)
json format_params_json(const QuantParams& q) {
  const json all = quant_params_json(q);
  const std::string scheme = scheme_of(q.method);
  std::vector<const char*> keys = {"method", "bits", "dtype"};
  if (scheme == "wna16") {
    for (const char* k : {"group_size", "symmetric", "act_order"}) keys.push_back(k);
    if (q.method == QuantMethod::kGptq) keys.push_back("gptq_format");
    if (!q.actorder.empty()) keys.push_back("actorder");
  } else if (scheme == "w8a8-int8") {
    for (const char* k : {"group_size", "symmetric", "dynamic_input"}) keys.push_back(k);
  } else if (scheme == "mxfp8") {
    keys.push_back("group_size");
  } else if (scheme == "fp8-block") {
    for (const char* k : {"block", "dynamic_input"}) keys.push_back(k);
  }
  json out = json::object();
  for (const char* k : keys) out[k] = all.at(k);
  return out;
}

int run_inspect(const InspectArgs& a, const Globals& g) {
  const auto ckpt = Checkpoint::open(a.dir);
  const HfConfig& cfg = ckpt->config();
  const TargetArch arch = parse_target_arch(a.target_arch);
  const VllmTarget target = parse_vllm_target(a.vllm_target);
  json j;
  j["schema"] = "moepack.inspect/1";
  j["path"] = a.dir;
  j["model_type"] = cfg.model_type;
  j["architecture"] = cfg.architecture;
  j["dtype"] = dtype_name(cfg.dtype);
  j["format"] = {{"method", quant_method_name(cfg.quant.method)},
                 {"params", format_params_json(cfg.quant)},
                 {"config_file", std::filesystem::path(cfg.quant_file).filename().string()},
                 {"quantization_config", cfg.quant_raw}};
  j["config"] = {
      {"hidden_size", cfg.hidden_size},      {"moe_intermediate_size", cfg.moe_intermediate_size},
      {"num_experts", cfg.num_experts},      {"num_experts_per_tok", cfg.top_k},
      {"num_hidden_layers", cfg.num_layers}, {"hidden_act", cfg.hidden_act}};
  std::optional<Manifest> manifest;
  if (std::filesystem::exists(manifest_path(a.dir))) manifest = read_manifest(a.dir);
  const bool converted = manifest.has_value();
  if (converted) {
    const Manifest& m = *manifest;
    json layers = json::array();
    for (const auto& l : m.layers) layers.push_back(to_json(l));
    j["moepack"] = {{"backend", m.backend},
                    {"layout", {{"name", m.layout.name}, {"version", m.layout.version}}},
                    {"target_arch", m.target_arch},
                    {"vllm_target", vllm_target_name(m.vllm_target)},
                    {"act_dtype", dtype_name(m.act_dtype)},
                    {"source_format", m.source.format},
                    {"moe_layers", m.layers.size()},
                    {"layers", layers},
                    {"deviations_from_vllm", m.deviations_from_vllm}};
  }
  json layers = json::array();
  std::map<std::tuple<int64_t, int64_t, int64_t, bool, std::string>, std::vector<std::string>>
      kinds;
  for (const auto& L : ckpt->moe_layers()) {
    layers.push_back({{"module", L.module},
                      {"layer", L.layer},
                      {"family", moe_family_name(L.family)},
                      {"experts", L.num_experts},
                      {"hidden", L.hidden},
                      {"inter", L.inter},
                      {"gated", L.gated},
                      {"param_prefix", L.param_prefix},
                      {"source_tensors", L.source_tensors.size()}});
    kinds[{L.num_experts, L.hidden, L.inter, L.gated, moe_family_name(L.family)}].push_back(
        L.module);
  }
  j["moe"] = {{"layers", layers.size()}, {"layer_list", layers}};
  json oracle = json::array();
  for (const auto& [k, modules] : kinds) {
    OracleQuery q;
    q.quant = cfg.quant;
    std::tie(q.experts, q.hidden, q.inter, q.gated, std::ignore) = k;
    q.arch = arch;
    q.requested = a.backend;
    q.vllm_target = target;
    q.act_dtype = *parse_dtype(a.act_dtype == "fp16" ? "F16" : "BF16");
    const OracleDecision d = choose_backend(q);
    json o = d.to_json();
    o["layers"] = modules;
    o["experts"] = q.experts;
    o["hidden"] = q.hidden;
    o["inter"] = q.inter;
    o["explanation"] = d.explain();
    oracle.push_back(o);
  }
  j["oracle"] = {{"target_arch", target_arch_name(arch)},
                 {"vllm_target", vllm_target_name(target)},
                 {"vllm_follows", vllm_target_row(target).follows},
                 {"requested", a.backend},
                 {"kinds", oracle}};
  // inspect refuses what convert refuses: the plan convert would make for this target, and every
  // expert read and packed as convert would (nothing written). Without a backend on the target,
  // the experts are still read through the source codec. A converted checkpoint is verify's job.
  std::string validation = "not validated (--no-validate)";
  if (converted) {
    validation = "not validated here: converted by moepack (run moepack verify)";
  } else if (!a.no_validate && !ckpt->moe_layers().empty()) {
    bool every_kind_has_backend = cfg.quant.method != QuantMethod::kNone;
    for (const auto& o : oracle)
      every_kind_has_backend &= !o["chosen"].is_null() && !o["chosen"].get<std::string>().empty();
    if (every_kind_has_backend) {
      ConvertOptions opts;
      opts.src = a.dir;
      opts.target_arch = a.target_arch;
      opts.backend = a.backend;
      opts.vllm_target = a.vllm_target;
      opts.act_dtype = *parse_dtype(a.act_dtype == "fp16" ? "F16" : "BF16");
      const Plan plan = make_plan(*ckpt, opts);
      validate_plan(plan, *ckpt);
      validation = "validated: every expert read and packed for " + plan.backend;
      // The conversion path convert would take (formats/fast_path.h).
      const DirectPath* direct = nullptr;
      for (const auto& l : plan.layers)
        if (!direct) direct = l.direct;
      j["conversion"] =
          direct ? json{{"path", "direct"}, {"direct_path", direct->name}}
                 : json{{"path", "canonical"},
                        {"why",
                         plan.layers.empty() ? std::string() : plan.layers.front().canonical_why}};
      validation += direct ? std::string(" (direct path ") + direct->name + ")"
                           : std::string(" (canonical path)");
    } else {
      validate_source(*ckpt, resolve_threads(0));
      validation = "validated: every expert read through the source codec";
    }
  } else if (!a.no_validate) {
    validation = "validated: no MoE layers";
  }
  j["validation"] = validation;
  json tensors = json::array();
  for (const auto& name : ckpt->tensor_names()) {
    const TensorView v = ckpt->view(name);
    tensors.push_back({{"name", name},
                       {"dtype", dtype_name(v.dtype)},
                       {"shape", v.shape},
                       {"bytes", v.nbytes},
                       {"shard", ckpt->shard_of(name)}});
  }
  j["totals"] = {{"tensors", tensors.size()},
                 {"tensor_bytes", ckpt->total_tensor_bytes()},
                 {"shards", ckpt->shard_names().size()},
                 {"copy_through_tensors", ckpt->other_tensors().size()},
                 {"other_files", ckpt->other_files()}};
  j["tensors"] = tensors;
  if (g.json) {
    print_json(j);
    return 0;
  }
  std::cout << a.dir << "\n"
            << "  model          " << cfg.architecture << " (" << cfg.model_type << "), "
            << dtype_name(cfg.dtype) << "\n"
            << "  format         " << quant_method_name(cfg.quant.method);
  if (cfg.quant.method != QuantMethod::kNone)
    std::cout << "  bits=" << cfg.quant.bits << " group_size=" << cfg.quant.group_size
              << (cfg.quant.symmetric ? " sym" : " asym")
              << (cfg.quant.act_order ? " act-order" : "");
  std::cout << "\n  validation     " << validation;
  std::cout << "\n  tensors        " << tensors.size() << " in " << ckpt->shard_names().size()
            << " shard(s), " << human_bytes(ckpt->total_tensor_bytes()) << "\n";
  if (converted) {
    const Manifest& m = *manifest;
    std::cout << "  converted by moepack: backend " << m.backend << ", target " << m.target_arch
              << ", vLLM " << vllm_target_name(m.vllm_target) << ", activations "
              << dtype_name(m.act_dtype) << ", from " << m.source.format << "\n";
    // The experts are now backend parameters (w13_*, w2_*): describe them from the manifest.
    std::cout << "  converted MoE layers " << m.layers.size() << "\n";
    for (const auto& l : m.layers)
      std::cout << "    " << l.module << "  E=" << l.experts << " H=" << l.hidden
                << " I=" << l.inter
                << (l.inter_padded != l.inter
                        ? " (padded to " + std::to_string(l.inter_padded) + ")"
                        : std::string())
                << (l.gated ? " gated" : " non-gated") << ", " << l.params.size() << " parameters ("
                << l.param_prefix << "*)\n";
  }
  std::cout << "  MoE layers     " << layers.size()
            << (converted ? " (unconverted expert tensors)" : "") << "\n";
  for (const auto& l : layers)
    std::cout << "    " << l["module"].get<std::string>() << "  " << l["family"].get<std::string>()
              << "  E=" << l["experts"] << " H=" << l["hidden"] << " I=" << l["inter"]
              << (l["gated"].get<bool>() ? " gated" : " non-gated") << "\n";
  if (!kinds.empty()) {
    std::cout << "  oracle for " << target_arch_name(arch) << ", vLLM " << vllm_target_name(target)
              << " (--backend " << a.backend << "):\n";
    for (const auto& o : oracle) {
      std::cout << "    layers E=" << o["experts"] << " H=" << o["hidden"] << " I=" << o["inter"]
                << " (" << o["layers"].size() << " layers):\n";
      std::istringstream lines(o["explanation"].get<std::string>());
      for (std::string line; std::getline(lines, line);) std::cout << "      " << line << "\n";
    }
  }
  if (a.tensors) {
    std::cout << "  tensors:\n";
    for (const auto& t : tensors)
      std::cout << "    " << t["name"].get<std::string>() << "  " << t["dtype"].get<std::string>()
                << " " << t["shape"].dump() << "  " << t["shard"].get<std::string>() << "\n";
  }
  return 0;
}
}  // namespace

Runner add_inspect(CLI::App& app, Globals& g) {
  auto a = std::make_shared<InspectArgs>();
  app.add_option("dir", a->dir, "Checkpoint directory")->required();
  app.add_option("--target-arch", a->target_arch,
                 "Target GPU for the backend oracle: " + target_arch_names("|"))
      ->capture_default_str();
  app.add_option("--backend", a->backend,
                 "Evaluate this backend instead of auto: " + target_layout_names("|"))
      ->capture_default_str();
  app.add_option("--act-dtype", a->act_dtype, "Activation dtype bf16|fp16")->capture_default_str();
  app.add_option("--vllm-target", a->vllm_target,
                 "The vLLM the oracle judges for: " + vllm_target_names("|"))
      ->capture_default_str();
  app.add_flag("--tensors", a->tensors, "List every tensor (text mode)");
  app.add_flag("--no-validate", a->no_validate,
               "List the checkpoint without reading every expert as convert would (inspect "
               "otherwise refuses, with convert's exit code, what convert would refuse)");
  return [a, &g] { return run_inspect(*a, g); };
}

}  // namespace moepack::cli
