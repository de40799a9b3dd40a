#include "pipeline/manifest.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/memory.h"
#include "core/sha256.h"
#include "core/threads.h"
#include "core/version.h"
#include "formats/parallel.h"
#include "io/json_file.h"
#include "model/checkpoint.h"
#include "pipeline/artifact.h"
#include "pipeline/oracle.h"
#include "pipeline/plan.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

std::string moepack_version_string() {
  return moepack_version();
}

// ---- writing ----

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

namespace {

// The layout row's serving entry for the plan's target and the experts' method (the target
// params: with --quantize, the method moepack quantised to).
ManifestServing serving_of(const Plan& plan) {
  const VllmServing s = find_vllm_serving(*plan.layout, plan.vllm_target, plan.target_quant.method);
  ManifestServing m;
  m.path = s.path;
  m.vllm_method = s.vllm_method ? s.vllm_method : "";
  m.vllm_backend = s.vllm_backend ? s.vllm_backend : "";
  m.kernel_builder = s.kernel_builder ? s.kernel_builder : "";
  m.reason = s.reason ? s.reason : "";
  for (TargetArch a : plan.layout->archs) m.archs.push_back(target_arch_name(a));
  return m;
}

// The "parallel" block of a manifest whose tensors are in: per rank its shard files, bytes,
// digest and (expert parallel) experts.
ManifestParallel manifest_parallel(const Plan& plan, const Checkpoint& ckpt, const Manifest& m) {
  ManifestParallel mp;
  mp.parallel = plan.options.parallel;
  const int ranks = mp.parallel.ranks();
  mp.ranks.resize(static_cast<size_t>(ranks));
  std::vector<std::map<std::string, std::string>> sha(static_cast<size_t>(ranks));
  std::vector<std::set<std::string>> shards(static_cast<size_t>(ranks));
  for (const auto& t : plan.tensors) {
    if (t.rank < 0) continue;
    const auto r = static_cast<size_t>(t.rank);
    sha[r][t.name] = m.tensors.at(t.name).sha256;
    shards[r].insert(m.tensors.at(t.name).shard);
    mp.ranks[r].tensor_bytes += t.bytes;
  }
  const int64_t E = ckpt.moe_layers().front().num_experts;
  for (int r = 0; r < ranks; ++r) {
    ManifestRank& mr = mp.ranks[static_cast<size_t>(r)];
    mr.sha256 = rank_digest(sha[static_cast<size_t>(r)]);
    mr.shards.assign(shards[static_cast<size_t>(r)].begin(), shards[static_cast<size_t>(r)].end());
    if (mp.parallel.expert > 1) mr.experts = mp.parallel.rank_experts(E, r);
  }
  return mp;
}

}  // namespace

Manifest build_manifest(const Plan& plan, const Checkpoint& ckpt,
                        const std::map<std::string, std::string>& sha,
                        const std::map<std::string, std::string>& source_sha) {
  Manifest m;
  m.tool = {"moepack", moepack_version_string()};
  m.source.format = plan.source_format;
  m.source.quant_params = plan.source_quant;
  m.source.quantization_config = ckpt.config().quant_raw;
  m.source.model_type = ckpt.config().model_type;
  m.source.tensor_bytes = ckpt.total_tensor_bytes();
  for (const std::string& name : ckpt.tensor_names()) {
    auto it = source_sha.find(name);
    if (it == source_sha.end())
      throw Error(ErrorCode::kInternal, "", name, "no SHA-256 of this source tensor recorded");
    m.source.tensor_sha256[name] = it->second;
  }
  m.target_quant_params = plan.target_quant;
  if (!plan.options.quantize.empty())
    m.quantize = ManifestQuantize{plan.options.quantize, plan.options.mx_recipe};
  m.backend = plan.backend;
  m.layout = {plan.layout_name, plan.layout_version};
  m.target_arch = plan.arch;
  m.vllm_target = plan.vllm_target;
  m.act_dtype = plan.options.act_dtype;
  m.options.vllm_w13_scale_size_k = plan.options.vllm_w13_scale_size_k;
  m.serving = serving_of(plan);
  m.deviations_from_vllm = plan.deviations;
  for (const auto& pl : plan.layers) {
    const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
    ManifestLayer ml;
    ml.module = L.module;
    ml.layer = L.layer;
    ml.family = moe_family_name(L.family);
    ml.param_prefix = pl.layout_options.prefix;  // the parameters', with the target's child
    ml.experts = L.num_experts;
    ml.hidden = L.hidden;
    ml.inter = L.inter;
    ml.inter_padded = pl.inter_padded;
    ml.gated = L.gated;
    for (const auto& t : plan.tensors)
      if (t.layer == pl.index) ml.params.push_back(t.name);
    for (const ParamSpec& spec : plan.layout->param_specs(pl.layout_options, pl.shape)) {
      if (plan.options.parallel.whole()) ml.param_roles[spec.name] = spec.role;
      // Every rank's parameter takes its name's role (the same names on every rank).
      for (const auto& name : ml.params)
        if (rank_tensor_name(name) == spec.name && name != spec.name)
          ml.param_roles[name] = spec.role;
    }
    ml.deviations_from_vllm = pl.deviations;
    ml.layout_decisions = pl.layout_options.layer_decisions;
    const Parallelism& par = plan.options.parallel;
    if (plan.layout->layer_config && par.whole())
      for (auto& [k, v] : plan.layout->layer_config(pl.layout_options, pl.shape))
        ml.layout_config[k] = std::move(v);
    // A parallel output: each rank's decisions and configuration (its options and shape).
    if (!par.whole() && (plan.layout->decide_layer || plan.layout->layer_config))
      for (int r = 0; r < par.ranks(); ++r) {
        ManifestLayer::RankLayout rl;
        const LayoutOptions lo = planned_rank_options(pl, par, r);
        rl.layout_decisions = lo.layer_decisions;
        if (plan.layout->layer_config)
          for (auto& [k, v] : plan.layout->layer_config(lo, rank_shape(pl.shape, par, r)))
            rl.layout_config[k] = std::move(v);
        ml.rank_layouts.push_back(std::move(rl));
      }
    m.layers.push_back(std::move(ml));
  }
  m.config = config_digests(output_config(ckpt.config().raw, plan.config_patch));
  for (size_t i = 0; i < plan.shards.shard_names.size(); ++i)
    m.shards.push_back({plan.shards.shard_names[i], plan.shards.shard_file_bytes[i]});
  m.files = plan.copied_files;
  m.files_include = plan.options.files.include;
  m.files_exclude = plan.options.files.exclude;
  for (const auto& f : plan.left_out_files) m.files_left_out.push_back(f.path);
  for (const auto& t : plan.tensors) {
    auto it = sha.find(t.name);
    if (it == sha.end()) throw Error(ErrorCode::kInternal, "", t.name, "no checksum recorded");
    ManifestTensor mt;
    mt.shard = plan.shards.shard_names[plan.shards.shard_of.at(t.name)];
    mt.dtype = t.dtype;
    mt.shape = t.shape;
    mt.bytes = t.bytes;
    mt.sha256 = it->second;
    mt.converted = t.converted;
    mt.codec = t.codec;
    mt.sources = t.sources;
    m.tensors[t.name] = std::move(mt);
  }
  if (!plan.options.parallel.whole()) m.parallel = manifest_parallel(plan, ckpt, m);
  return m;
}

LayoutOptions layout_options_of(const Manifest& m, const ManifestLayer& ml, int threads) {
  LayoutOptions lo = LayoutOptions::for_layer(m.target_quant_params.method, m.act_dtype, ml.gated,
                                              m.options.vllm_w13_scale_size_k, m.vllm_target,
                                              ml.param_prefix, ml.inter, threads);
  lo.target_arch = m.target_arch;
  lo.hidden = ml.hidden;
  lo.layer_decisions = ml.layout_decisions;
  return lo;
}

LayoutOptions rank_options_of(const Manifest& m, const ManifestLayer& ml, int rank, int threads) {
  LayoutOptions lo = layout_options_of(m, ml, threads);
  if (!m.parallel) return lo;
  lo = rank_layout_options(lo, m.parallel->parallel);
  if (rank >= 0 && static_cast<size_t>(rank) < ml.rank_layouts.size())
    lo.layer_decisions = ml.rank_layouts[static_cast<size_t>(rank)].layout_decisions;
  return lo;
}

std::string rank_digest(const std::map<std::string, std::string>& sha) {
  std::string text;
  for (const auto& [name, digest] : sha) text += name + " " + digest + "\n";
  return sha256_hex(text.data(), text.size());
}

int64_t Manifest::param_experts(const ManifestLayer& l, const std::string& param) const {
  if (!parallel) return l.experts;
  const int r = rank_of_tensor_key(param, parallel->parallel.ranks());
  return r < 0 ? l.experts : parallel->parallel.local_experts(l.experts, r);
}

json to_json(const ManifestLayer& l) {
  json j = {{"module", l.module},
            {"layer", l.layer},
            {"family", l.family},
            {"param_prefix", l.param_prefix},
            {"experts", l.experts},
            {"hidden", l.hidden},
            {"inter", l.inter},
            {"inter_padded", l.inter_padded},
            {"gated", l.gated},
            {"params", l.params},
            {"deviations_from_vllm", l.deviations_from_vllm}};
  if (!l.param_roles.empty()) {
    json roles = json::object();
    for (const auto& [name, role] : l.param_roles) roles[name] = param_role_name(role);
    j["param_roles"] = roles;
  }
  if (!l.layout_decisions.empty()) j["layout_decisions"] = l.layout_decisions;
  if (!l.layout_config.empty()) j["layout_config"] = l.layout_config;
  for (size_t r = 0; r < l.rank_layouts.size(); ++r) {
    json jr = {{"rank", r}};
    if (!l.rank_layouts[r].layout_decisions.empty())
      jr["layout_decisions"] = l.rank_layouts[r].layout_decisions;
    if (!l.rank_layouts[r].layout_config.empty())
      jr["layout_config"] = l.rank_layouts[r].layout_config;
    j["ranks"].push_back(std::move(jr));
  }
  return j;
}

json to_json(const ManifestServing& s) {
  json j = {{"path", serving_path_name(s.path)}};
  if (s.path == ServingPath::kVllmMethod) {
    j["vllm_method"] = s.vllm_method;
    j["vllm_backend"] = s.vllm_backend;
  }
  if (s.path == ServingPath::kKernelBuilder) j["kernel_builder"] = s.kernel_builder;
  if (s.path == ServingPath::kNone) j["reason"] = s.reason;
  j["archs"] = s.archs;
  return j;
}

json to_json(const Manifest& m) {
  json j;
  j["manifest_version"] = m.manifest_version;
  j["tool"] = {{"name", m.tool.name}, {"version", m.tool.version}};
  j["source"] = {{"format", m.source.format},
                 {"quant_params", quant_params_json(m.source.quant_params)},
                 {"quantization_config", m.source.quantization_config},
                 {"model_type", m.source.model_type},
                 {"tensor_bytes", m.source.tensor_bytes}};
  if (m.manifest_version < 3) j["source"]["name"] = m.source.name;
  if (m.manifest_version >= 4) j["source"]["tensor_sha256"] = m.source.tensor_sha256;
  j["target_quant_params"] = quant_params_json(m.target_quant_params);
  if (m.quantize) j["quantize"] = {{"format", m.quantize->format}, {"recipe", m.quantize->recipe}};
  j["backend"] = m.backend;
  j["layout"] = {{"name", m.layout.name}, {"version", m.layout.version}};
  j["target_arch"] = target_arch_name(m.target_arch);
  j["vllm_target"] = vllm_target_name(m.vllm_target);
  j["act_dtype"] = dtype_name(m.act_dtype);
  j["options"] = {{"vllm_w13_scale_size_k", m.options.vllm_w13_scale_size_k}};
  if (m.serving) j["serving"] = to_json(*m.serving);
  j["deviations_from_vllm"] = m.deviations_from_vllm;
  j["layers"] = json::array();
  for (const auto& l : m.layers) j["layers"].push_back(to_json(l));
  j["shards"] = json::array();
  for (const auto& s : m.shards)
    j["shards"].push_back({{"name", s.name}, {"file_bytes", s.file_bytes}});
  j["files"] = m.files;
  if (!m.files_include.empty() || !m.files_exclude.empty())
    j["files_rule"] = {{"include", m.files_include}, {"exclude", m.files_exclude}};
  if (!m.files_left_out.empty()) j["files_left_out"] = m.files_left_out;
  if (m.parallel) {
    const Parallelism& p = m.parallel->parallel;
    json par = {{"tensor_parallel_size", p.tensor}, {"expert_parallel_size", p.expert}};
    if (p.expert > 1) par["expert_placement"] = expert_placement_name(p.placement);
    par["ranks"] = json::array();
    for (size_t r = 0; r < m.parallel->ranks.size(); ++r) {
      const ManifestRank& mr = m.parallel->ranks[r];
      json jr = {{"rank", r},
                 {"shards", mr.shards},
                 {"tensor_bytes", mr.tensor_bytes},
                 {"sha256", mr.sha256}};
      if (p.expert > 1) jr["experts"] = mr.experts;
      par["ranks"].push_back(jr);
    }
    j["parallel"] = par;
  }
  j["tensors"] = json::object();
  for (const auto& [name, t] : m.tensors)
    j["tensors"][name] = {{"shard", t.shard},   {"dtype", dtype_name(t.dtype)},
                          {"shape", t.shape},   {"bytes", t.bytes},
                          {"sha256", t.sha256}, {"action", t.converted ? "convert" : "copy"},
                          {"codec", t.codec},   {"sources", t.sources}};
  if (!m.config.is_null()) j["config"] = m.config;
  return j;
}

std::string manifest_text(const Manifest& manifest) {
  return to_json(manifest).dump(2) + "\n";
}

void write_manifest(const std::string& path, const Manifest& manifest) {
  std::ofstream f(path);
  f << manifest_text(manifest);
  if (!f) throw Error(ErrorCode::kIo, path, "", "write failed");
}

// ---- reading: every field checked, every failure kBadConfig naming the field ----

namespace {

std::string json_quoted(const std::string& s) {
  return json_excerpt(json(s));
}

std::string known_quant_methods() {
  std::string out;
  for (int i = 0; i <= UINT8_MAX; ++i) {
    const std::string n = quant_method_name(static_cast<QuantMethod>(i));
    if (n != "unknown") out += (out.empty() ? "" : ", ") + n;
  }
  return out;
}

QuantMethod parse_method_field(const JsonField& f) {
  const auto m = parse_quant_method(f.str());
  if (!m)
    f.fail("unknown quantization method " + json_excerpt(f.value()) + " (" + known_quant_methods() +
           ")");
  return *m;
}

QuantParams parse_quant_params(const JsonField& f) {
  f.expect_object();
  QuantParams q;
  q.method = parse_method_field(f["method"]);
  q.bits = static_cast<int>(f["bits"].integer(1, 64));
  const JsonField group = f["group_size"];
  q.group_size = group.integer(-1, INT64_MAX);
  if (q.group_size == 0) group.fail("must be -1 (one group) or positive, got 0");
  q.symmetric = f["symmetric"].boolean();
  q.act_order = f["act_order"].boolean();
  const JsonField format = f["gptq_format"];
  const std::string fmt = format.str();
  if (fmt != "gptq" && fmt != "gptq_v2")
    format.fail("expected \"gptq\" or \"gptq_v2\", got " + json_excerpt(format.value()));
  q.gptq_format = fmt == "gptq_v2" ? GptqFormat::kV2 : GptqFormat::kV1;
  q.actorder = f["actorder"].str();
  const JsonField block = f["block"];
  if (block.array_size() != 2)
    block.fail("expected [block_n, block_k], got " + std::to_string(block.array_size()) +
               " elements");
  q.block_n = block.item(0).integer(1, INT64_MAX);
  q.block_k = block.item(1).integer(1, INT64_MAX);
  q.dtype = f["dtype"].dtype();
  q.dynamic_input = f["dynamic_input"].boolean();
  return q;
}

bool is_hex_digest(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// A shard is opened as DIR/name: a plain file name, never a path out of DIR.
bool is_plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

bool is_moe_family(const std::string& s) {
  for (int i = 0; i <= UINT8_MAX; ++i) {
    const std::string n = moe_family_name(static_cast<MoeFamily>(i));
    if (n == s && n != "unknown") return true;
  }
  return false;
}

ManifestTensor parse_tensor(const JsonField& f, const std::set<std::string>& shards) {
  ManifestTensor t;
  const JsonField shard = f["shard"];
  t.shard = shard.str();
  if (!shards.count(t.shard)) shard.fail(json_quoted(t.shard) + " is not listed in shards");
  t.dtype = f["dtype"].dtype();
  const JsonField shape = f["shape"];
  t.shape.resize(shape.array_size());
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    t.shape[i] = shape.item(i).integer(0, INT64_MAX);
    overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(t.shape[i]), &numel);
  }
  const auto expect = overflow ? std::nullopt : dtype_bytes(t.dtype, numel);
  if (!expect)
    shape.fail(shape_str(t.shape) + " of " + dtype_name(t.dtype) +
               (overflow ? ": the element count overflows" : " is not a whole byte count"));
  const JsonField bytes = f["bytes"];
  t.bytes = bytes.size();
  if (t.bytes != *expect)
    bytes.fail(std::to_string(t.bytes) + ", but shape " + shape_str(t.shape) + " of " +
               dtype_name(t.dtype) + " holds " + std::to_string(*expect));
  const JsonField sha = f["sha256"];
  t.sha256 = sha.str();
  if (!is_hex_digest(t.sha256))
    sha.fail("expected 64 lowercase hex digits, got " + json_excerpt(sha.value()));
  const JsonField action = f["action"];
  const std::string a = action.str();
  if (a != "convert" && a != "copy")
    action.fail("expected \"convert\" or \"copy\", got " + json_excerpt(action.value()));
  t.converted = a == "convert";
  t.codec = f["codec"].str();
  t.sources = f["sources"].strings();
  return t;
}

// 1 (before "serving" and "param_roles") up to kManifestVersion.
int parse_manifest_version(const JsonField& v) {
  if (!v.value().is_number_integer()) v.fail("expected an integer, got " + json_excerpt(v.value()));
  if (v.value() < 1 || v.value() > kManifestVersion)
    v.fail("unsupported version " + json_excerpt(v.value()) + " (this moepack reads 1 to " +
           std::to_string(kManifestVersion) + ")");
  return v.value().get<int>();
}

// "serving" (manifest_version >= 2): a known path with the fields it needs, known archs.
ManifestServing parse_serving(const JsonField& f) {
  ManifestServing s;
  const JsonField path = f["path"];
  const auto p = parse_serving_path(path.str());
  if (!p)
    path.fail("expected \"none\", \"vllm-method\" or \"kernel-builder\", got " +
              json_excerpt(path.value()));
  s.path = *p;
  if (s.path == ServingPath::kVllmMethod) {
    s.vllm_method = f["vllm_method"].nonempty_str();
    s.vllm_backend = f["vllm_backend"].nonempty_str();
  }
  if (s.path == ServingPath::kKernelBuilder) s.kernel_builder = f["kernel_builder"].nonempty_str();
  if (s.path == ServingPath::kNone) s.reason = f["reason"].nonempty_str();
  const JsonField archs = f["archs"];
  s.archs = archs.strings();
  if (s.archs.empty()) archs.fail("empty: a layout's kernel runs on at least one arch");
  for (size_t i = 0; i < s.archs.size(); ++i)
    if (!target_arch_from_name(s.archs[i]))
      archs.item(i).fail("unknown target arch " + json_quoted(s.archs[i]));
  return s;
}

// A layer's "param_roles" (manifest_version >= 2): a known role for exactly each of its params.
std::map<std::string, ParamRole> parse_param_roles(const JsonField& layer,
                                                   const std::vector<std::string>& params) {
  const JsonField roles = layer["param_roles"];
  roles.expect_object();
  std::map<std::string, ParamRole> out;
  for (auto it = roles.value().begin(); it != roles.value().end(); ++it) {
    const JsonField r = roles.member(it.key());
    const auto role = parse_param_role(r.str());
    if (!role) r.fail("unknown parameter role " + json_excerpt(r.value()));
    if (std::find(params.begin(), params.end(), it.key()) == params.end())
      r.fail(json_quoted(it.key()) + " is not in the layer's params");
    out[it.key()] = *role;
  }
  for (const auto& p : params)
    if (!out.count(p)) roles.fail("no role for " + json_quoted(p));
  return out;
}

// Optional member KEY: an object of strings (absent: empty).
std::map<std::string, std::string> parse_string_map(const JsonField& f, const char* key) {
  std::map<std::string, std::string> out;
  if (!f.has(key)) return out;
  const JsonField m = f[key];
  m.expect_object();
  for (const auto& item : m.value().items()) out[item.key()] = m.member(item.key()).str();
  return out;
}

ManifestLayer parse_layer(const JsonField& f,
                          const std::map<std::string, ManifestTensor>& tensors) {
  f.expect_object();
  ManifestLayer l;
  l.module = f["module"].nonempty_str();
  l.layer = f["layer"].integer(-1, INT64_MAX);
  const JsonField family = f["family"];
  l.family = family.str();
  if (!is_moe_family(l.family)) family.fail("unknown MoE family " + json_excerpt(family.value()));
  l.param_prefix = f["param_prefix"].str();
  l.experts = f["experts"].integer(1, INT64_MAX);
  l.hidden = f["hidden"].integer(1, INT64_MAX);
  l.inter = f["inter"].integer(1, INT64_MAX);
  l.inter_padded = f.has("inter_padded") ? f["inter_padded"].integer(l.inter, INT64_MAX) : l.inter;
  l.gated = f["gated"].boolean();
  const JsonField params = f["params"];
  l.params = params.strings();
  if (l.params.empty()) params.fail("empty: a converted layer has parameters");
  for (size_t i = 0; i < l.params.size(); ++i)
    if (!tensors.count(l.params[i]))
      params.item(i).fail(json_quoted(l.params[i]) + " is not in tensors");
  l.deviations_from_vllm = f["deviations_from_vllm"].strings();
  l.layout_decisions = parse_string_map(f, "layout_decisions");
  l.layout_config = parse_string_map(f, "layout_config");
  if (f.has("ranks")) {  // a parallel output's per-rank records (counted against "parallel")
    const JsonField ranks = f["ranks"];
    for (size_t r = 0; r < ranks.array_size(); ++r) {
      const JsonField jr = ranks.item(r);
      jr.expect_object();
      if (jr["rank"].integer(0, kMaxParallelRanks) != static_cast<int64_t>(r))
        jr["rank"].fail("expected " + std::to_string(r));
      l.rank_layouts.push_back(
          {parse_string_map(jr, "layout_decisions"), parse_string_map(jr, "layout_config")});
    }
  }
  return l;
}

bool is_sha256_hex(const json& v) {
  if (!v.is_string() || v.get_ref<const std::string&>().size() != 64) return false;
  for (char c : v.get_ref<const std::string&>())
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// manifest_version, tool and source: what wrote the manifest, and from what.
void parse_provenance(const JsonField& root, Manifest& m) {
  m.manifest_version = parse_manifest_version(root["manifest_version"]);
  const JsonField tool = root["tool"];
  m.tool.name = tool["name"].str();
  m.tool.version = tool["version"].str();

  const JsonField source = root["source"];
  if (m.manifest_version < 3) m.source.name = source["name"].str();  // version 3 dropped it
  const JsonField format = source["format"];
  parse_method_field(format);
  m.source.format = format.str();
  m.source.quant_params = parse_quant_params(source["quant_params"]);
  m.source.quantization_config = source["quantization_config"].value();
  m.source.model_type = source["model_type"].str();
  m.source.tensor_bytes = source["tensor_bytes"].size();
  if (m.manifest_version >= 4) {
    const JsonField digests = source["tensor_sha256"];
    digests.expect_object();
    for (auto it = digests.value().begin(); it != digests.value().end(); ++it) {
      if (!is_sha256_hex(it.value()))
        digests.member(it.key()).fail("expected a SHA-256 (64 lowercase hex digits)");
      m.source.tensor_sha256[it.key()] = it.value().get<std::string>();
    }
  }
}

// target_quant_params, quantize, backend, layout, target_arch, vllm_target, act_dtype, options
// and deviations: what the conversion was for.
void parse_target(const JsonField& root, Manifest& m) {
  m.target_quant_params = parse_quant_params(root["target_quant_params"]);
  if (root.has("quantize")) {
    const JsonField q = root["quantize"];
    const JsonField qf = q["format"], qr = q["recipe"];
    ManifestQuantize mq{qf.str(), qr.str()};
    bool format_known = false, recipe_known = false;
    std::string recipes;
    for (const auto& r : quantize_recipes()) {
      format_known |= mq.format == r.format;
      if (mq.format == r.format) recipe_known |= mq.recipe == r.recipe;
      recipes += std::string(recipes.empty() ? "" : ", ") + r.format + "/" + r.recipe;
    }
    if (!format_known) qf.fail("expected one of " + recipes + ", got " + json_excerpt(qf.value()));
    if (!recipe_known) qr.fail("expected one of " + recipes + ", got " + json_excerpt(qr.value()));
    m.quantize = mq;
  }

  m.backend = root["backend"].nonempty_str();
  const JsonField layout = root["layout"];
  m.layout.name = layout["name"].nonempty_str();
  m.layout.version = static_cast<int>(layout["version"].integer(0, INT_MAX));
  {
    const JsonField arch = root["target_arch"];
    const std::optional<TargetArch> known = target_arch_from_name(arch.str());
    if (!known) arch.fail("unknown target arch " + json_excerpt(arch.value()));
    m.target_arch = *known;
  }
  if (root.has("vllm_target")) {
    const JsonField target = root["vllm_target"];
    const std::optional<VllmTarget> known = vllm_target_from_name(target.str());
    if (!known)
      target.fail("expected one of " + vllm_target_names() + ", got " +
                  json_excerpt(target.value()));
    m.vllm_target = *known;
  }
  {
    const JsonField act = root["act_dtype"];
    m.act_dtype = act.dtype();
    if (!is_act_dtype(m.act_dtype))
      act.fail("expected \"BF16\" or \"F16\", got " + json_excerpt(act.value()));
  }
  m.options.vllm_w13_scale_size_k = root["options"]["vllm_w13_scale_size_k"].boolean();
  if (m.manifest_version >= 2) m.serving = parse_serving(root["serving"]);
  m.deviations_from_vllm = root["deviations_from_vllm"].strings();
}

// shards, files, tensors and layers: what the converted checkpoint holds.
void parse_contents(const JsonField& root, Manifest& m) {
  const JsonField shards = root["shards"];
  std::set<std::string> shard_names;
  for (size_t i = 0, n = shards.array_size(); i < n; ++i) {
    const JsonField s = shards.item(i);
    const JsonField name = s["name"];
    ManifestShard ms{name.str(), s["file_bytes"].size()};
    if (!is_plain_file_name(ms.name))
      name.fail("expected a file name inside the checkpoint, got " + json_excerpt(name.value()));
    if (!shard_names.insert(ms.name).second) name.fail(json_quoted(ms.name) + " is listed twice");
    m.shards.push_back(std::move(ms));
  }
  m.files = root["files"].strings();
  if (root.has("files_rule")) {
    const JsonField rule = root["files_rule"];
    m.files_include = rule["include"].strings();
    m.files_exclude = rule["exclude"].strings();
  }
  if (root.has("files_left_out")) m.files_left_out = root["files_left_out"].strings();

  const JsonField tensors = root["tensors"];
  tensors.expect_object();
  for (auto it = tensors.value().begin(); it != tensors.value().end(); ++it) {
    if (it.key().empty()) tensors.fail("a tensor has an empty name");
    m.tensors.emplace(it.key(), parse_tensor(tensors.member(it.key()), shard_names));
  }
  const JsonField layers = root["layers"];
  const size_t n = layers.array_size();
  if (n == 0) layers.fail("empty: a converted checkpoint has at least one MoE layer");
  for (size_t i = 0; i < n; ++i) m.layers.push_back(parse_layer(layers.item(i), m.tensors));
}

// "config" (manifest_version >= 3): config_digests of config.json -- per field a SHA-256, or per
// member of an object field an object of them; quantization_config among them.
json parse_config_digests(const JsonField& f) {
  f.expect_object();
  for (auto it = f.value().begin(); it != f.value().end(); ++it) {
    const JsonField d = f.member(it.key());
    if (is_sha256_hex(d.value())) continue;
    if (!d.value().is_object())
      d.fail("expected a SHA-256 (64 lowercase hex digits) or an object of them");
    for (auto mt = d.value().begin(); mt != d.value().end(); ++mt)
      if (!is_sha256_hex(mt.value()))
        d.member(mt.key()).fail("expected a SHA-256 (64 lowercase hex digits)");
  }
  if (!f.value().contains("quantization_config") || !f.value()["quantization_config"].is_object())
    f.fail("no quantization_config: convert always writes one");
  return f.value();
}

// "parallel": sizes in range, one placement, one entry per rank whose shards are listed, and every
// converted tensor a parameter of one rank ("rankRR-of-NN/..."), each rank's digest well formed.
ManifestParallel parse_parallel(const JsonField& f, const Manifest& m) {
  f.expect_object();
  ManifestParallel mp;
  Parallelism& p = mp.parallel;
  p.tensor = static_cast<int>(f["tensor_parallel_size"].integer(1, kMaxParallelRanks));
  p.expert = static_cast<int>(f["expert_parallel_size"].integer(1, kMaxParallelRanks));
  if (p.whole() || (p.tensor > 1 && p.expert > 1))
    f.fail("expected exactly one of tensor_parallel_size and expert_parallel_size above 1");
  if (p.expert > 1) {
    const JsonField pl = f["expert_placement"];
    const auto placement = expert_placement_from_name(pl.str());
    if (!placement)
      pl.fail("expected \"linear\" or \"round_robin\", got " + json_excerpt(pl.value()));
    p.placement = *placement;
  }
  const JsonField ranks = f["ranks"];
  if (ranks.array_size() != static_cast<size_t>(p.ranks()))
    ranks.fail("expected " + std::to_string(p.ranks()) + " ranks, got " +
               std::to_string(ranks.array_size()));
  std::set<std::string> shards;
  for (const auto& s : m.shards) shards.insert(s.name);
  for (size_t r = 0; r < ranks.array_size(); ++r) {
    const JsonField jr = ranks.item(r);
    if (jr["rank"].integer(0, kMaxParallelRanks) != static_cast<int64_t>(r))
      jr["rank"].fail("expected " + std::to_string(r));
    ManifestRank mr;
    mr.shards = jr["shards"].strings();
    for (size_t k = 0; k < mr.shards.size(); ++k)
      if (!shards.count(mr.shards[k]))
        jr["shards"].item(k).fail(json_quoted(mr.shards[k]) + " is not listed in shards");
    mr.tensor_bytes = jr["tensor_bytes"].size();
    mr.sha256 = jr["sha256"].str();
    if (!is_hex_digest(mr.sha256)) jr["sha256"].fail("expected 64 lowercase hex digits");
    if (p.expert > 1) {
      const JsonField ex = jr["experts"];
      for (size_t k = 0; k < ex.array_size(); ++k)
        mr.experts.push_back(ex.item(k).integer(0, INT64_MAX));
    }
    mp.ranks.push_back(std::move(mr));
  }
  for (const auto& [name, t] : m.tensors)
    if (t.converted && rank_of_tensor_key(name, p.ranks()) < 0)
      f.fail("converted tensor " + json_quoted(name) + " belongs to no rank");
  return mp;
}

// Layers and converted tensors describe each other exactly: each converted tensor is a
// parameter of one layer, led by that layer's expert count; each layer appears once.
void check_layers_cover_tensors(const JsonField& root, const Manifest& m) {
  const JsonField tensors = root["tensors"];
  const JsonField layers = root["layers"];
  const size_t n = m.layers.size();
  std::map<std::string, size_t> layer_of_module, layer_of_param;
  for (size_t i = 0; i < n; ++i) {
    const ManifestLayer& l = m.layers[i];
    const JsonField item = layers.item(i);
    if (!layer_of_module.emplace(l.module, i).second)
      item["module"].fail(json_quoted(l.module) + " is also layers[" +
                          std::to_string(layer_of_module[l.module]) + "]");
    for (size_t k = 0; k < l.params.size(); ++k) {
      const JsonField param = item["params"].item(k);
      const ManifestTensor& t = m.tensors.at(l.params[k]);
      if (!t.converted)
        param.fail(json_quoted(l.params[k]) + " is a copied tensor (\"action\": \"copy\")");
      if (!layer_of_param.emplace(l.params[k], i).second)
        param.fail(json_quoted(l.params[k]) + " is also a parameter of layers[" +
                   std::to_string(layer_of_param[l.params[k]]) + "]");
      const int64_t experts = m.param_experts(l, l.params[k]);
      if (t.shape.empty() || t.shape[0] != experts)
        tensors.member(l.params[k])["shape"].fail(shape_str(t.shape) + " does not lead with the " +
                                                  std::to_string(experts) + " experts of layers[" +
                                                  std::to_string(i) + "]" +
                                                  (experts != l.experts ? " on its rank" : ""));
    }
  }
  for (const auto& [name, t] : m.tensors)
    if (t.converted && !layer_of_param.count(name))
      tensors.member(name)["action"].fail("\"convert\", but no layer lists " + json_quoted(name) +
                                          " in its params");
}

// Each layer's param_roles (manifest_version >= 2), once its params are known to be its own.
void parse_layer_roles(const JsonField& root, Manifest& m) {
  const JsonField layers = root["layers"];
  for (size_t i = 0; i < m.layers.size(); ++i)
    m.layers[i].param_roles = parse_param_roles(layers.item(i), m.layers[i].params);
}

Manifest parse_fields(const JsonField& root) {
  root.expect_object();
  Manifest m;
  parse_provenance(root, m);
  parse_target(root, m);
  parse_contents(root, m);
  if (root.has("parallel")) m.parallel = parse_parallel(root["parallel"], m);
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const size_t n = m.layers[i].rank_layouts.size();
    const size_t want = m.parallel ? static_cast<size_t>(m.parallel->parallel.ranks()) : 0;
    if (n != 0 && n != want)
      root["layers"].item(i)["ranks"].fail("expected " + std::to_string(want) +
                                           " entries (one per rank of \"parallel\"), got " +
                                           std::to_string(n));
  }
  check_layers_cover_tensors(root, m);
  if (m.manifest_version >= 2) parse_layer_roles(root, m);
  if (m.manifest_version >= 3) m.config = parse_config_digests(root["config"]);
  return m;
}

}  // namespace

void check_source_fingerprint(const Checkpoint& ckpt,
                              const std::map<std::string, std::string>& recorded, int threads,
                              const std::string& recorded_by) {
  const std::vector<std::string>& names = ckpt.tensor_names();
  for (const std::string& name : names)
    if (!recorded.count(name))
      throw Error(ErrorCode::kBadConfig, recorded_by, name,
                  "no SHA-256 recorded for this source tensor: not the source that was converted");
  for (const auto& [name, sha] : recorded)
    if (!ckpt.has_tensor(name))
      throw Error(ErrorCode::kBadConfig, recorded_by, name,
                  "recorded as a source tensor, but the source " + ckpt.dir() + " has none");
  std::vector<std::string> got(names.size());
  parallel_for(static_cast<int64_t>(names.size()), threads, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const std::string& name = names[static_cast<size_t>(i)];
      const TensorView v = ckpt.view(name);
      // Read once: its mapped pages stop counting as resident as they are hashed (verify
      // streams), a piece at a time, so a thread holds a piece, not a whole fused expert tensor.
      got[static_cast<size_t>(i)] =
          sha256_hex_read_once(v.data, v.nbytes, ckpt.shard(ckpt.shard_of(name)).mapped());
    }
  });
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& want = recorded.at(names[i]);
    if (got[i] != want)
      throw Error(ErrorCode::kBadValue, (fs::path(ckpt.dir()) / ckpt.shard_of(names[i])).string(),
                  names[i],
                  "bytes differ from the source that was converted: SHA-256 " +
                      got[i].substr(0, 16) + "..., " + recorded_by + " recorded " +
                      want.substr(0, 16) + "... (the source was edited since, or is another copy)");
  }
}

std::string manifest_path(const std::string& dir) {
  return (fs::path(dir) / "moepack.json").string();
}

QuantParams quant_params_from_json(const json& j, const std::string& file) {
  try {
    return parse_quant_params(JsonField(j, "", file));
  } catch (const json::exception& e) {  // not expected: every access is checked first
    throw Error(ErrorCode::kBadConfig, file, "",
                std::string("malformed quant params: ") + e.what());
  }
}

Manifest parse_manifest(const json& j, const std::string& file) {
  try {
    return parse_fields(JsonField(j, "", file));
  } catch (const json::exception& e) {  // not expected: every access is checked first
    throw Error(ErrorCode::kBadConfig, file, "", std::string("malformed manifest: ") + e.what());
  }
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = manifest_path(dir);
  const json j =
      read_json_file(path, {.if_missing = "no moepack.json: not a moepack-converted checkpoint",
                            .max_bytes = kMaxManifestBytes});
  return parse_manifest(j, path);
}

}  // namespace moepack
