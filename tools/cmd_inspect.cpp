// moepack inspect DIR [--target-arch sm90] [--backend auto] [--vllm-target 0.33] [--tensors]
// [--json]
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "core/threads.h"
#include "io/json_file.h"
#include "model/checkpoint.h"
#include "pipeline/artifact.h"
#include "pipeline/execute.h"
#include "pipeline/manifest.h"
#include "pipeline/oracle.h"
#include "pipeline/servability.h"
#include "tools/cli.h"
#include "tools/flags.h"

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
  bool require_servable = false;
};

// The params that mean something for the checkpoint's format (its codec row's params_shown): a
// compressed-tensors checkpoint shows no GPTQ zero convention, an FP8 block one no symmetry or
// act-order. (moepack.json keeps every field: verify reads them back.)
json format_params_json(const QuantParams& q) {
  const json all = quant_params_json(q);
  std::vector<const char*> keys = {"method", "bits", "dtype"};
  if (const SourceCodec* codec = find_source_codec(q.method))
    keys.insert(keys.end(), codec->params_shown.begin(), codec->params_shown.end());
  json out = json::object();
  for (const char* k : keys) {
    const json& v = all.at(k);
    if (!(v.is_string() && v.get<std::string>().empty())) out[k] = v;
  }
  return out;
}

// What the checkpoint is: model, source format and the config's sizes.
json checkpoint_json(const std::string& dir, const HfConfig& cfg) {
  json j;
  j["schema"] = "moepack.inspect/1";
  j["path"] = dir;
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
  return j;
}

// A checkpoint converted by moepack, as its moepack.json describes it.
json converted_json(const Manifest& m) {
  json layers = json::array();
  for (const auto& l : m.layers) layers.push_back(to_json(l));
  return {{"backend", m.backend},
          {"layout", {{"name", m.layout.name}, {"version", m.layout.version}}},
          {"target_arch", target_arch_name(m.target_arch)},
          {"vllm_target", vllm_target_name(m.vllm_target)},
          {"act_dtype", dtype_name(m.act_dtype)},
          {"source_format", m.source.format},
          {"moe_layers", m.layers.size()},
          {"layers", layers},
          {"deviations_from_vllm", m.deviations_from_vllm}};
}

// Whether a converted checkpoint is still what convert wrote, as far as reading headers tells:
// config.json bound to moepack.json (pipeline/artifact.h), every shard of the recorded size, every
// tensor where and as the manifest lists it. Hashing every tensor is verify's.
json intact_json(const std::string& dir, const Checkpoint& ckpt, const Manifest& m) {
  auto verdict = [](const std::string& problem, const std::string& ok) {
    return json{{"ok", problem.empty()}, {"detail", problem.empty() ? ok : problem}};
  };
  std::string problem = config_binding_problem(dir, m, ckpt.config().raw);
  if (!problem.empty()) return verdict(problem, "");
  const auto& shards = ckpt.shard_names();
  for (const auto& s : m.shards) {
    if (std::find(shards.begin(), shards.end(), s.name) == shards.end())
      return verdict(s.name + ": missing (the manifest lists it)", "");
    if (ckpt.shard(s.name).file_size() != s.file_bytes)
      return verdict(s.name + ": " + std::to_string(ckpt.shard(s.name).file_size()) +
                         " bytes, the manifest records " + std::to_string(s.file_bytes),
                     "");
  }
  if (shards.size() != m.shards.size())
    return verdict(std::to_string(shards.size()) + " shards, the manifest lists " +
                       std::to_string(m.shards.size()),
                   "");
  for (const auto& [name, t] : m.tensors) {
    if (!ckpt.has_tensor(name)) return verdict(name + ": missing (the manifest lists it)", "");
    const TensorView v = ckpt.view(name);
    if (ckpt.shard_of(name) != t.shard || v.dtype != t.dtype || v.shape != t.shape)
      return verdict(name + ": not where or as the manifest records it", "");
  }
  if (ckpt.tensor_names().size() != m.tensors.size())
    return verdict(std::to_string(ckpt.tensor_names().size()) + " tensors, the manifest lists " +
                       std::to_string(m.tensors.size()),
                   "");
  const std::string bound = m.manifest_version >= 3
                                ? "config.json bound to moepack.json field by field"
                                : "config.json names moepack.json's digest (manifest_version " +
                                      std::to_string(m.manifest_version) +
                                      ": its fields are not bound)";
  return verdict("", bound + "; " + std::to_string(m.tensors.size()) + " tensors in " +
                         std::to_string(m.shards.size()) +
                         " shard(s) as recorded (verify checks their SHA-256)");
}

// Layers the oracle judges alike: (experts, hidden, inter, gated, family) -> their modules.
using LayerKinds =
    std::map<std::tuple<int64_t, int64_t, int64_t, bool, std::string>, std::vector<std::string>>;

// The MoE layers as discovered, and into `kinds` the distinct kinds among them.
json moe_layers_json(const Checkpoint& ckpt, LayerKinds* kinds) {
  json layers = json::array();
  for (const auto& L : ckpt.moe_layers()) {
    layers.push_back({{"module", L.module},
                      {"layer", L.layer},
                      {"family", moe_family_name(L.family)},
                      {"experts", L.num_experts},
                      {"hidden", L.hidden},
                      {"inter", L.inter},
                      {"gated", L.gated},
                      {"param_prefix", L.param_prefix},
                      {"source_tensors", L.source_tensors.size()}});
    (*kinds)[{L.num_experts, L.hidden, L.inter, L.gated, moe_family_name(L.family)}].push_back(
        L.module);
  }
  return {{"layers", layers.size()}, {"layer_list", layers}};
}

// The oracle's decision and explanation for each kind of layer.
json oracle_kinds_json(const HfConfig& cfg, const LayerKinds& kinds, const InspectArgs& a,
                       TargetArch arch, VllmTarget target, DType act_dtype) {
  json oracle = json::array();
  for (const auto& [k, modules] : kinds) {
    OracleQuery q;
    q.quant = cfg.quant;
    std::tie(q.experts, q.hidden, q.inter, q.gated, std::ignore) = k;
    q.arch = arch;
    q.requested = a.backend;
    q.vllm_target = target;
    q.act_dtype = act_dtype;
    const OracleDecision d = choose_backend(q);
    json o = d.to_json();
    o["layers"] = modules;
    o["experts"] = q.experts;
    o["hidden"] = q.hidden;
    o["inter"] = q.inter;
    o["explanation"] = d.explain();
    oracle.push_back(o);
  }
  return oracle;
}

// inspect refuses what convert refuses: the plan convert would make for this target, and every
// expert read and packed as convert would (nothing written). Without a backend on the target,
// the experts are still read through the source codec. A converted checkpoint is verify's job.
// Returns the verdict line; sets j["conversion"] to the path convert would take.
// `opts`: the options convert would get for this target (flags parsed by run_inspect);
// `progress`: the layers read and their source bytes.
std::string validate_as_convert(const Checkpoint& ckpt, const InspectArgs& a,
                                const ConvertOptions& opts, bool converted, json& j,
                                const ProgressFn& progress) {
  if (converted) return "not validated here: converted by moepack (run moepack verify)";
  if (a.no_validate) return "not validated (--no-validate)";
  if (ckpt.moe_layers().empty()) return "validated: no MoE layers";
  bool every_kind_has_backend = ckpt.config().quant.method != QuantMethod::kNone;
  for (const auto& o : j["oracle"]["kinds"])
    every_kind_has_backend &= !o["chosen"].is_null() && !o["chosen"].get<std::string>().empty();
  if (!every_kind_has_backend) {
    validate_source(ckpt, resolve_threads(0), 1ull << 30, progress);
    return "validated: every expert read through the source codec";
  }
  const Plan plan = make_plan(ckpt, opts);
  validate_plan(plan, ckpt, progress);
  // The conversion path convert would take (formats/fast_path.h).
  const DirectPath* direct = nullptr;
  for (const auto& l : plan.layers)
    if (!direct) direct = l.direct;
  j["conversion"] =
      direct
          ? json{{"path", "direct"}, {"direct_path", direct->name}}
          : json{{"path", "canonical"},
                 {"why", plan.layers.empty() ? std::string() : plan.layers.front().canonical_why}};
  return "validated: every expert read and packed for " + plan.backend +
         (direct ? std::string(" (direct path ") + direct->name + ")"
                 : std::string(" (canonical path)"));
}

// Whether moepack-vllm serves the checkpoint (converted: as its moepack.json records it) or what
// convert would write from it (the backend the oracle picks for each kind of layer, for the
// target inspect judges): the first kind that is not servable, else the first kind's.
json serving_json(const Checkpoint& ckpt, const std::optional<Manifest>& manifest, json& oracle,
                  VllmTarget target) {
  std::optional<Servability> first, unserved;
  if (manifest) first = servability(*manifest);
  for (auto& o : oracle["kinds"]) {
    const std::string chosen = o["chosen"].is_string() ? o["chosen"].get<std::string>() : "";
    const TargetLayout* layout = find_target_layout(chosen);
    if (!layout) continue;
    const Servability s = servability(*layout, target, ckpt.config().quant.method);
    o["serving"] = s.to_json();
    if (!first) first = s;
    if (!s.servable && !unserved) unserved = s;
  }
  if (!manifest && unserved) first = unserved;
  if (!first)
    return {{"servable", false},
            {"plugin", "moepack-vllm"},
            {"reason", "no MoE layer has a backend here, so convert writes nothing to serve"},
            {"text", "NOT servable by moepack-vllm: no MoE layer has a backend here"}};
  json j = first->to_json();
  j["text"] = first->to_text();
  return j;
}

json tensors_json(const Checkpoint& ckpt) {
  json tensors = json::array();
  for (const auto& name : ckpt.tensor_names()) {
    const TensorView v = ckpt.view(name);
    tensors.push_back({{"name", name},
                       {"dtype", dtype_name(v.dtype)},
                       {"shape", v.shape},
                       {"bytes", v.nbytes},
                       {"shard", ckpt.shard_of(name)}});
  }
  return tensors;
}

// The text report: the same facts as the JSON `j`, for a person, and the validation's `summary`
// line ("" when nothing was read).
void print_inspect_text(const InspectArgs& a, const Checkpoint& ckpt,
                        const std::optional<Manifest>& manifest, const json& j,
                        const std::string& summary) {
  const HfConfig& cfg = ckpt.config();
  std::cout << a.dir << "\n"
            << "  model          " << cfg.architecture << " (" << cfg.model_type << "), "
            << dtype_name(cfg.dtype) << "\n"
            << "  format         " << quant_method_name(cfg.quant.method);
  if (cfg.quant.method != QuantMethod::kNone)
    std::cout << "  bits=" << cfg.quant.bits << " group_size=" << cfg.quant.group_size
              << (cfg.quant.symmetric ? " sym" : " asym")
              << (cfg.quant.act_order ? " act-order" : "");
  std::cout << "\n  validation     " << j["validation"].get<std::string>();
  std::cout << "\n  serving        " << j["serving"]["text"].get<std::string>();
  std::cout << "\n  tensors        " << j["tensors"].size() << " in " << ckpt.shard_names().size()
            << " shard(s), " << human_bytes(ckpt.total_tensor_bytes()) << "\n";
  if (manifest) {
    const Manifest& m = *manifest;
    std::cout << "  converted by moepack: backend " << m.backend << ", target "
              << target_arch_name(m.target_arch) << ", vLLM " << vllm_target_name(m.vllm_target)
              << ", activations " << dtype_name(m.act_dtype) << ", from " << m.source.format
              << "\n";
    const json& intact = j["moepack"]["intact"];
    std::cout << "  intact         " << (intact["ok"].get<bool>() ? "yes: " : "NO: ")
              << intact["detail"].get<std::string>() << "\n";
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
  const json& layers = j["moe"]["layer_list"];
  std::cout << "  MoE layers     " << layers.size()
            << (manifest ? " (unconverted expert tensors)" : "") << "\n";
  for (const auto& l : layers)
    std::cout << "    " << l["module"].get<std::string>() << "  " << l["family"].get<std::string>()
              << "  E=" << l["experts"] << " H=" << l["hidden"] << " I=" << l["inter"]
              << (l["gated"].get<bool>() ? " gated" : " non-gated") << "\n";
  const json& oracle = j["oracle"];
  if (!oracle["kinds"].empty()) {
    std::cout << "  oracle for " << oracle["target_arch"].get<std::string>() << ", vLLM "
              << oracle["vllm_target"].get<std::string>() << " (--backend " << a.backend << "):\n";
    for (const auto& o : oracle["kinds"]) {
      std::cout << "    layers E=" << o["experts"] << " H=" << o["hidden"] << " I=" << o["inter"]
                << " (" << o["layers"].size() << " layers):\n";
      std::istringstream lines(o["explanation"].get<std::string>());
      for (std::string line; std::getline(lines, line);) std::cout << "      " << line << "\n";
    }
  }
  if (a.tensors) {
    std::cout << "  tensors:\n";
    for (const auto& t : j["tensors"])
      std::cout << "    " << t["name"].get<std::string>() << "  " << t["dtype"].get<std::string>()
                << " " << t["shape"].dump() << "  " << t["shard"].get<std::string>() << "\n";
  }
  std::cout << summary;
}

// Opens DIR as a checkpoint. A converted checkpoint whose config.json was edited may no longer
// open as one (its quantization_config replaced by the source's makes it a source holding a
// moepack.json): the refusal then says first that the artifact is not intact, naming the field.
std::unique_ptr<Checkpoint> open_checkpoint(const std::string& dir) {
  try {
    return Checkpoint::open(dir);
  } catch (const Error& e) {
    std::string problem;
    try {
      if (regular_file_or_missing(manifest_path(dir)) == PathKind::kRegular)
        problem = config_binding_problem(
            dir, read_manifest(dir),
            read_json_file((std::filesystem::path(dir) / "config.json").string()));
    } catch (const Error&) {
      // The manifest or the config is unreadable: the original refusal says enough.
    }
    if (problem.empty()) throw;
    throw Error(e.code(), e.file(), e.tensor(),
                "a converted checkpoint that is not intact (" + problem + "): " + e.message());
  }
}

int run_inspect(InspectArgs& a, const Globals& g) {
  // The flags first: a bad value is a usage error whatever the checkpoint.
  const TargetArch arch = parse_target_arch(a.target_arch);
  const VllmTarget target = parse_vllm_target(a.vllm_target);
  const DType act_dtype = parse_act_dtype(a.act_dtype);
  a.dir = resolve_checkpoint_arg(a.dir, g);
  const auto ckpt = open_checkpoint(a.dir);
  const HfConfig& cfg = ckpt->config();
  json j = checkpoint_json(a.dir, cfg);
  std::optional<Manifest> manifest;
  if (std::filesystem::exists(manifest_path(a.dir))) manifest = read_manifest(a.dir);
  if (manifest) {
    j["moepack"] = converted_json(*manifest);
    j["moepack"]["intact"] = intact_json(a.dir, *ckpt, *manifest);
  }
  LayerKinds kinds;
  j["moe"] = moe_layers_json(*ckpt, &kinds);
  j["oracle"] = {{"target_arch", target_arch_name(arch)},
                 {"vllm_target", vllm_target_name(target)},
                 {"vllm_follows", vllm_target_row(target).follows},
                 {"requested", a.backend},
                 {"kinds", oracle_kinds_json(cfg, kinds, a, arch, target, act_dtype)}};
  ConvertOptions as_convert;
  as_convert.src = a.dir;
  as_convert.backend = a.backend;
  as_convert.target_arch = arch;
  as_convert.vllm_target = target;
  as_convert.act_dtype = act_dtype;
  CommandRun run(g.progress, stderr_is_terminal(), g.json, "inspect");
  j["validation"] = validate_as_convert(*ckpt, a, as_convert, manifest.has_value(), j, run.fn());
  RunSummary sum = run.finish();
  if (run.last().layers_total > 0) {  // experts were read: the validation's summary
    sum.what = "read " + human_bytes(run.last().bytes_total) + " of experts in " +
               std::to_string(run.last().layers_total) + " MoE layer(s), nothing written,";
    sum.source_bytes = sum.rate_bytes = run.last().bytes_total;
    sum.verdict = "validated";
    j["run"] = summary_json(sum);
  }
  j["serving"] = serving_json(*ckpt, manifest, j["oracle"], target);
  const json tensors = tensors_json(*ckpt);
  j["totals"] = {{"tensors", tensors.size()},
                 {"tensor_bytes", ckpt->total_tensor_bytes()},
                 {"shards", ckpt->shard_names().size()},
                 {"copy_through_tensors", ckpt->other_tensors().size()},
                 {"other_files", ckpt->other_files()}};
  j["tensors"] = tensors;
  if (g.json)
    print_json(j);
  else
    print_inspect_text(a, *ckpt, manifest, j, j.contains("run") ? summary_line(sum) : "");
  if (a.require_servable && !j["serving"]["servable"].get<bool>()) {
    std::cerr << "moepack: --require-servable: " << j["serving"]["text"].get<std::string>() << "\n";
    return static_cast<int>(ExitCode::kUnsupported);
  }
  return 0;
}
}  // namespace

Runner add_inspect(CLI::App& app, Globals& g) {
  auto a = std::make_shared<InspectArgs>();
  app.add_option("dir", a->dir,
                 "Checkpoint directory, a Hugging Face cache snapshot or repo root, or a hub id "
                 "org/name in the local cache")
      ->required();
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
  app.add_flag("--require-servable", a->require_servable,
               "Exit 4 when the moepack-vllm plugin would not serve the checkpoint (converted) or "
               "what convert would write from it");
  return [a, &g] { return run_inspect(*a, g); };
}

}  // namespace moepack::cli
