// Shard-parallel conversion and merge (pipeline/parts.h, docs/scale-out.md).
#include "pipeline/parts.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <queue>
#include <set>

#include "core/error.h"
#include "core/sha256.h"
#include "core/threads.h"
#include "formats/parallel.h"
#include "io/atomic_dir.h"
#include "io/json_file.h"
#include "pipeline/artifact.h"
#include "pipeline/manifest.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// 2: no source path; source_tensors, the SHA-256 of every source tensor the task read.
constexpr int kPartFormatVersion = 2;
constexpr const char* kPartTensorsFile = "part.safetensors";
constexpr const char* kPartJsonFile = "part.json";
// part.json lists one entry per output tensor of a unit: far below this for any real model.
constexpr uint64_t kMaxPartJsonBytes = uint64_t{256} << 20;

// A parts/ entry name "i-of-n" -> (i, n); false for anything else.
bool parse_part_name(const std::string& name, int64_t* index, int64_t* count) {
  const size_t sep = name.find("-of-");
  if (sep == std::string::npos || sep == 0 || sep + 4 >= name.size()) return false;
  auto number = [](const std::string& s, int64_t* out) {
    if (s.empty() || s.size() > 9) return false;
    for (char c : s)
      if (c < '0' || c > '9') return false;
    *out = std::stoll(s);
    return true;
  };
  return number(name.substr(0, sep), index) && number(name.substr(sep + 4), count);
}

// The shard layout of one part: its tensors in plan order, in one file without a size limit.
ShardPlan part_shard_plan(const Plan& plan, const WorkUnit& unit) {
  std::vector<SafetensorsEntry> entries;
  for (size_t i : unit.tensors) {
    const PlannedTensor& t = plan.tensors[i];
    entries.push_back({t.name, t.dtype, t.shape, 0, 0});
  }
  ShardPlan sp = plan_shards(entries, 0);
  sp.shard_names = {kPartTensorsFile};
  return sp;
}

// SHA-256 of the first and the last kSampleBytes of a shard's data section: two checkpoints with
// the same architecture (same headers and sizes) but other weights -- another seed, another
// fine-tune -- differ here, at the cost of two small reads per shard instead of the whole file.
constexpr uint64_t kSampleBytes = 64 << 10;
std::string data_sample_digest(const SafetensorsFile& f) {
  if (f.entries().empty()) return "";
  const uint8_t* data = static_cast<const uint8_t*>(f.view(f.entries().front()).data);
  const uint64_t len = f.entries().back().end;
  const uint64_t n = std::min(len, kSampleBytes);
  Sha256 h;
  h.update(data, n);
  h.update(data + (len - n), n);
  return h.hex_digest();
}

json source_identity(const Checkpoint& ckpt) {
  json shards = json::array();
  for (const auto& name : ckpt.shard_names()) {
    const SafetensorsFile& f = ckpt.shard(name);
    json tensors = json::array();
    for (const auto& e : f.entries())
      tensors.push_back({e.name, dtype_name(e.dtype), e.shape, e.begin, e.end});
    shards.push_back({{"name", name},
                      {"file_bytes", f.file_size()},
                      {"metadata", f.metadata()},
                      {"tensors", tensors},
                      {"data_sample_sha256", data_sample_digest(f)}});
  }
  json files = json::array();
  for (const auto& rel : ckpt.other_files()) {
    std::error_code ec;
    const auto size = fs::file_size(fs::path(ckpt.dir()) / rel, ec);
    files.push_back({{"name", rel}, {"bytes", ec ? -1 : static_cast<int64_t>(size)}});
  }
  return {{"config", ckpt.config().raw}, {"shards", shards}, {"files", files}};
}

// ---- part.json ----

struct PartRecord {
  std::string dir, file;  // the part directory and its part.json
  int64_t unit = -1, units = 0;
  std::string digest;
  json options;
  std::vector<std::pair<std::string, std::string>> tensors;  // name, sha256, in file order
  std::map<std::string, std::string> source_tensors;         // what the task read: name -> sha256
};

[[noreturn]] void bad_part(const std::string& file, const std::string& message) {
  throw Error(ErrorCode::kBadConfig, file, "", message);
}

// Every field of a part.json (already read as JSON), checked.
PartRecord parse_part_record(const json& j, const std::string& dir, const std::string& file) {
  PartRecord r;
  r.dir = dir;
  r.file = file;
  const JsonField root(j, "", r.file);
  const JsonField version = root["moepack_part"];
  if (version.integer(INT64_MIN, INT64_MAX) != kPartFormatVersion)
    version.fail("unknown part format version " + json_excerpt(version.value()) +
                 " (this moepack reads " + std::to_string(kPartFormatVersion) + ")");
  r.unit = root["unit"].integer(0, kMaxShards - 1);
  r.units = root["units"].integer(1, kMaxShards);
  r.digest = root["plan_digest"].str();
  r.options = root["options"].value();
  const JsonField tensors = root["tensors"];
  for (size_t i = 0, n = tensors.array_size(); i < n; ++i) {
    const JsonField t = tensors.item(i);
    const std::string name = t["name"].str();
    const JsonField sha = t["sha256"];
    if (sha.str().size() != 64 ||
        sha.str().find_first_not_of("0123456789abcdef") != std::string::npos)
      throw Error(
          ErrorCode::kBadConfig, r.file, name,
          sha.path() + ": expected 64 lowercase hex digits, got " + json_excerpt(sha.value()));
    r.tensors.emplace_back(name, sha.str());
  }
  const JsonField sources = root["source_tensors"];
  sources.expect_object();
  for (auto it = sources.value().begin(); it != sources.value().end(); ++it) {
    const JsonField sha = sources.member(it.key());
    if (sha.str().size() != 64 ||
        sha.str().find_first_not_of("0123456789abcdef") != std::string::npos)
      throw Error(
          ErrorCode::kBadConfig, r.file, it.key(),
          sha.path() + ": expected 64 lowercase hex digits, got " + json_excerpt(sha.value()));
    r.source_tensors[it.key()] = sha.str();
  }
  return r;
}

PartRecord read_part_json(const std::string& dir) {
  const std::string file = dir + "/" + kPartJsonFile;
  const json j = read_json_file(
      file, {.if_missing = "missing: the part is incomplete (written by `convert --shard` last, "
                           "after its tensors)",
             .max_bytes = kMaxPartJsonBytes});
  return parse_part_record(j, dir, file);
}

void write_part_json(const std::string& path, const Plan& plan, const std::string& digest,
                     const ShardSpec& spec, const WorkUnit& unit,
                     const std::map<std::string, std::string>& sha,
                     const std::map<std::string, std::string>& source_sha) {
  json tensors = json::array();
  for (size_t i : unit.tensors) {
    const PlannedTensor& t = plan.tensors[i];
    tensors.push_back({{"name", t.name},
                       {"shard", plan.shards.shard_names[plan.shards.shard_of.at(t.name)]},
                       {"dtype", dtype_name(t.dtype)},
                       {"shape", t.shape},
                       {"bytes", t.bytes},
                       {"action", t.converted ? "convert" : "copy"},
                       {"codec", t.codec},
                       {"sha256", sha.at(t.name)}});
  }
  const json j = {{"moepack_part", kPartFormatVersion},
                  {"tool", {{"name", "moepack"}, {"version", moepack_version_string()}}},
                  {"plan_digest", digest},
                  {"options", part_options_json(plan.options)},
                  {"unit", spec.index},
                  {"units", spec.count},
                  {"tensor_bytes", unit.bytes},
                  {"layers", unit.modules},
                  {"tensors", tensors},
                  {"source_tensors", source_sha}};
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) throw Error(ErrorCode::kIo, path, "", "write failed");
}

// Whether DIR is a complete part of this plan and unit (cheap: part.json and file sizes; merge
// checks the bytes).
bool part_is_complete(const std::string& dir, const std::string& digest, const ShardSpec& spec,
                      const ShardPlan& layout) {
  try {
    const PartRecord r = read_part_json(dir);
    std::error_code ec;
    const auto size = fs::file_size(dir + "/" + kPartTensorsFile, ec);
    return r.digest == digest && r.unit == spec.index && r.units == spec.count && !ec &&
           size == layout.shard_file_bytes.at(0) && r.tensors.size() == layout.shard_of.size();
  } catch (const Error&) {
    return false;
  }
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

void validate_part_json(const json& j, const std::string& file) {
  const PartRecord r = parse_part_record(j, "", file);
  part_options_from_json(r.options, file);
}

ShardSpec parse_shard_spec(const std::string& text) {
  const size_t slash = text.find('/');
  auto number = [&](const std::string& s, int64_t* out) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
      return false;
    *out = std::stoll(s);
    return true;
  };
  ShardSpec spec;
  if (slash == std::string::npos || !number(text.substr(0, slash), &spec.index) ||
      !number(text.substr(slash + 1), &spec.count) || spec.count < 1 || spec.count > kMaxShards ||
      spec.index >= spec.count)
    throw Error(ErrorCode::kUsage, "--shard \"" + text + "\": expected I/N with 0 <= I < N <= " +
                                       std::to_string(kMaxShards) + " (e.g. 0/4)");
  return spec;
}

std::vector<WorkUnit> split_plan(const Plan& plan, int64_t count) {
  if (count < 1 || count > kMaxShards)
    throw Error(ErrorCode::kUsage, "number of shards must be in [1, " + std::to_string(kMaxShards) +
                                       "], got " + std::to_string(count));
  struct Item {
    uint64_t bytes = 0;
    size_t first = 0;  // plan order of the item's first tensor (ties)
    std::vector<size_t> tensors;
    int64_t layer = -1;  // index into plan.layers for a MoE layer item
  };
  std::vector<Item> items;
  // (PlannedTensor::layer, rank) -> items index: a parallel output fans out per rank.
  std::map<std::pair<int64_t, int>, size_t> item_of_layer;
  std::map<int64_t, size_t> planned_layer;  // PlannedTensor::layer -> plan.layers index
  for (size_t li = 0; li < plan.layers.size(); ++li) planned_layer[plan.layers[li].index] = li;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const PlannedTensor& t = plan.tensors[i];
    size_t k;
    if (t.converted) {
      auto it = item_of_layer.find({t.layer, t.rank});
      if (it == item_of_layer.end()) {
        it = item_of_layer.emplace(std::make_pair(t.layer, t.rank), items.size()).first;
        items.emplace_back();
        items.back().first = i;
        items.back().layer = static_cast<int64_t>(planned_layer.at(t.layer));
      }
      k = it->second;
    } else {
      k = items.size();
      items.emplace_back();
      items.back().first = i;
    }
    items[k].bytes += t.bytes;
    items[k].tensors.push_back(i);
  }
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].bytes != items[b].bytes) return items[a].bytes > items[b].bytes;
    return items[a].first < items[b].first;
  });
  std::vector<WorkUnit> units(static_cast<size_t>(count));
  for (size_t u = 0; u < units.size(); ++u) units[u].index = static_cast<int64_t>(u);
  // The unit with the fewest bytes so far, ties to the lowest index: a min-heap of (bytes, unit).
  std::priority_queue<std::pair<uint64_t, size_t>, std::vector<std::pair<uint64_t, size_t>>,
                      std::greater<>>
      lightest;
  for (size_t u = 0; u < units.size(); ++u) lightest.push({0, u});
  for (size_t k : order) {
    const size_t best = lightest.top().second;
    lightest.pop();
    WorkUnit& w = units[best];
    w.bytes += items[k].bytes;
    w.tensors.insert(w.tensors.end(), items[k].tensors.begin(), items[k].tensors.end());
    if (items[k].layer >= 0) w.layers.push_back(static_cast<size_t>(items[k].layer));
    lightest.push({w.bytes, best});
  }
  for (auto& w : units) {
    std::sort(w.tensors.begin(), w.tensors.end());
    std::sort(w.layers.begin(), w.layers.end());
    w.layers.erase(std::unique(w.layers.begin(), w.layers.end()), w.layers.end());
    for (size_t li : w.layers) w.modules.push_back(plan.layers[li].module);
  }
  return units;
}

json units_json(const Plan& plan, const std::vector<WorkUnit>& units) {
  json out = json::array();
  for (const auto& w : units) {
    uint64_t converted = 0;
    for (size_t i : w.tensors)
      if (plan.tensors[i].converted) converted += plan.tensors[i].bytes;
    out.push_back({{"unit", w.index},
                   {"part", part_dir_name(w.index, static_cast<int64_t>(units.size()))},
                   {"tensor_bytes", w.bytes},
                   {"converted_bytes", converted},
                   {"copied_bytes", w.bytes - converted},
                   {"tensors", w.tensors.size()},
                   {"layers", w.modules}});
  }
  return out;
}

std::string plan_digest(const Plan& plan, const Checkpoint& ckpt) {
  std::map<std::string, std::string> no_checksums, no_source_checksums;
  for (const auto& t : plan.tensors) no_checksums[t.name] = std::string(64, '0');
  for (const auto& name : ckpt.tensor_names()) no_source_checksums[name] = std::string(64, '0');
  const json identity = {
      {"manifest", to_json(build_manifest(plan, ckpt, no_checksums, no_source_checksums))},
      {"config", output_config(ckpt.config().raw, plan.config_patch)},
      {"source", source_identity(ckpt)}};
  const std::string text = identity.dump();
  return sha256_hex(text.data(), text.size());
}

json part_options_json(const ConvertOptions& o) {
  json j = {{"backend", o.backend},
            {"target_arch", target_arch_name(o.target_arch)},
            {"act_dtype", dtype_name(o.act_dtype)},
            {"quantize", o.quantize},
            {"mx_recipe", o.mx_recipe},
            {"vllm_w13_scale_size_k", o.vllm_w13_scale_size_k},
            {"vllm_target", vllm_target_name(o.vllm_target)},
            {"max_shard_bytes", o.max_shard_bytes}};
  if (!o.parallel.whole()) {  // parts of whole experts read the same as before parallel outputs
    j["tensor_parallel_size"] = o.parallel.tensor;
    j["expert_parallel_size"] = o.parallel.expert;
    j["expert_placement"] = expert_placement_name(o.parallel.placement);
  }
  // Only when given, as moepack.json's files_rule (parts written before them read the same).
  if (!o.files.is_default())
    j["files"] = {{"include", o.files.include}, {"exclude", o.files.exclude}};
  return j;
}

ConvertOptions part_options_from_json(const json& j, const std::string& file) {
  const JsonField options(j, "options", file);
  ConvertOptions o;
  o.backend = options["backend"].str();
  const JsonField arch = options["target_arch"];
  const std::optional<TargetArch> known_arch = target_arch_from_name(arch.str());
  if (!known_arch)
    arch.fail("expected one of " + target_arch_names("|") + ", got " + json_excerpt(arch.value()));
  o.target_arch = *known_arch;
  const JsonField act = options["act_dtype"];
  o.act_dtype = act.dtype();
  if (!is_act_dtype(o.act_dtype))
    act.fail("expected \"BF16\" or \"F16\", got " + json_excerpt(act.value()));
  o.quantize = options["quantize"].str();
  o.mx_recipe = options["mx_recipe"].str();
  o.vllm_w13_scale_size_k = options["vllm_w13_scale_size_k"].boolean();
  const JsonField target = options["vllm_target"];
  const std::optional<VllmTarget> known_target = vllm_target_from_name(target.str());
  if (!known_target)
    target.fail("expected one of " + vllm_target_names("|") + ", got " +
                json_excerpt(target.value()));
  o.vllm_target = *known_target;
  o.max_shard_bytes = options["max_shard_bytes"].size();
  if (options.has("files")) {
    o.files.include = options["files"]["include"].strings();
    o.files.exclude = options["files"]["exclude"].strings();
  }
  // Parts of a moepack without parallel outputs lack the three: whole experts.
  if (!options.has("tensor_parallel_size")) return o;
  o.parallel.tensor =
      static_cast<int>(options["tensor_parallel_size"].integer(1, kMaxParallelRanks));
  o.parallel.expert =
      static_cast<int>(options["expert_parallel_size"].integer(1, kMaxParallelRanks));
  const JsonField placement = options["expert_placement"];
  const std::optional<ExpertPlacement> known_placement =
      expert_placement_from_name(placement.str());
  if (!known_placement)
    placement.fail("expected \"linear\" or \"round_robin\", got " +
                   json_excerpt(placement.value()));
  o.parallel.placement = *known_placement;
  return o;
}

std::string parts_dir(const std::string& dst) {
  fs::path p = fs::path(dst).lexically_normal();
  while (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p.string() + ".parts";
}

std::string part_dir_name(int64_t index, int64_t count) {
  return std::to_string(index) + "-of-" + std::to_string(count);
}

PartResult execute_part(const Plan& plan, const Checkpoint& ckpt, const ShardSpec& spec,
                        const ProgressFn& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  PartResult r;
  const std::vector<WorkUnit> units = split_plan(plan, spec.count);
  r.unit = units.at(static_cast<size_t>(spec.index));
  r.dir = parts_dir(plan.options.dst) + "/" + part_dir_name(spec.index, spec.count);
  const std::string digest = plan_digest(plan, ckpt);
  const ShardPlan layout = part_shard_plan(plan, r.unit);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(r.dir, ec))) {
    if (part_is_complete(r.dir, digest, spec, layout)) {
      r.skipped = true;
      r.convert.dst = r.dir;
      return r;
    }
    if (!plan.options.force)
      throw Error(ErrorCode::kOutputExists, r.dir, "",
                  "a part exists here from another plan (source, flags or moepack version) or is "
                  "unreadable; use --force to replace it");
  }
  AtomicOutputDir out(r.dir, plan.options.force, {plan.options.src});
  ShardedWriter writer(out.path(), layout);
  const std::map<std::string, std::string> source_sha =
      write_planned_tensors(plan, ckpt, writer, r.unit.tensors, progress, r.convert.stage_seconds);
  const auto t_finish = std::chrono::steady_clock::now();
  writer.finish();
  write_part_json(out.path() + "/" + kPartJsonFile, plan, digest, spec, r.unit, writer.checksums(),
                  source_sha);
  out.commit();
  const auto t1 = std::chrono::steady_clock::now();
  r.convert.stage_seconds["finish"] += std::chrono::duration<double>(t1 - t_finish).count();
  r.convert.dst = r.dir;
  r.convert.bytes_written = r.unit.bytes;
  r.convert.tensors = static_cast<int64_t>(r.unit.tensors.size());
  r.convert.seconds = std::chrono::duration<double>(t1 - t0).count();
  return r;
}

namespace {

// What DST.parts/ holds: part directories by split (n -> i -> entry name), unfinished temporaries
// of killed or running tasks ("i-of-n" -> what its owner tag says) and anything else.
struct PartsListing {
  std::map<int64_t, std::map<int64_t, std::string>> by_count;
  std::map<std::string, std::string> unfinished;
  std::vector<std::string> stray;
};

PartsListing list_parts_dir(const std::string& root) {
  PartsListing out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t tmp = name.find(".moepack-");
    int64_t i = 0, n = 0;
    if (tmp != std::string::npos) {
      // The owner tag (io/atomic_dir.h) tells a task still running from a killed one.
      const size_t tag = name.find('-', tmp + 9);
      const auto owner =
          tag == std::string::npos ? std::nullopt : parse_owner_tag(name.substr(tag + 1));
      const OwnerState state = owner ? owner_state(*owner) : OwnerState::kUnknown;
      std::string& note = out.unfinished[name.substr(0, tmp)];
      if (note.empty() || state == OwnerState::kAlive)
        note = state == OwnerState::kAlive  ? "its task is still running"
               : state == OwnerState::kGone ? "its task was killed; run it again"
                                            : "its task was killed or is still running elsewhere";
    } else if (parse_part_name(name, &i, &n) && name == part_dir_name(i, n) && n >= 1 && i < n) {
      out.by_count[n][i] = name;
    } else {
      out.stray.push_back(name);
    }
  }
  if (ec) throw Error(ErrorCode::kIo, root, "", "cannot list: " + ec.message());
  return out;
}

// The one split DST.parts/ holds completely: its n and its parts (i -> entry name). Stray entries,
// no parts, parts of several splits or a missing part are kBadConfig naming them.
std::pair<int64_t, std::map<int64_t, std::string>> complete_split(const std::string& root,
                                                                  const std::string& dst) {
  const PartsListing l = list_parts_dir(root);
  if (!l.stray.empty())
    throw Error(ErrorCode::kBadConfig, root, "",
                "not parts of a moepack split (a duplicated or renamed part?): " + join(l.stray));
  if (l.by_count.empty()) {
    std::vector<std::string> names;
    for (const auto& [name, note] : l.unfinished) names.push_back(name + " (" + note + ")");
    throw Error(ErrorCode::kBadConfig, root, "",
                "no parts" + (names.empty() ? std::string()
                                            : ", only unfinished temporaries: " + join(names)));
  }
  if (l.by_count.size() > 1) {
    std::vector<std::string> splits;
    for (const auto& [n, parts] : l.by_count)
      splits.push_back(std::to_string(parts.size()) + " part(s) of a " + std::to_string(n) +
                       "-way split (" + parts.begin()->second + ", ...)");
    throw Error(
        ErrorCode::kBadConfig, root, "",
        "parts from different splits: " + join(splits) + "; remove the ones that do not belong");
  }
  const int64_t n = l.by_count.begin()->first;
  const auto& present = l.by_count.begin()->second;
  std::vector<std::string> missing;
  for (int64_t i = 0; i < n; ++i)
    if (!present.count(i)) {
      const std::string name = part_dir_name(i, n);
      const auto u = l.unfinished.find(name);
      missing.push_back(name + (u == l.unfinished.end()
                                    ? std::string()
                                    : " (only an unfinished temporary: " + u->second + ")"));
    }
  if (!missing.empty())
    throw Error(ErrorCode::kBadConfig, root, "",
                "missing part(s): " + join(missing) + "; run `moepack convert SRC " + dst +
                    " --shard I/" + std::to_string(n) + "` for each");
  return {n, present};
}

// Every part's part.json, each describing its own place in the split, all with the same flags.
std::vector<PartRecord> read_part_records(const std::string& root, int64_t n,
                                          const std::map<int64_t, std::string>& present) {
  std::vector<PartRecord> records;
  for (const auto& [i, name] : present) {
    PartRecord r = read_part_json(root + "/" + name);
    if (r.unit != i || r.units != n)
      bad_part(r.file, "describes part " + part_dir_name(r.unit, r.units) + ", not " + name +
                           " (a copied or duplicated part?)");
    records.push_back(std::move(r));
  }
  for (const auto& r : records)
    if (r.options != records.front().options)
      bad_part(r.file, "converted with other flags than " + records.front().file + " (" +
                           r.options.dump() + " vs " + records.front().options.dump() + ")");
  return records;
}

// The plan the source and the recorded flags `co` give now; every part must come from it (its
// digest).
Plan plan_of_parts(const std::vector<PartRecord>& records, const ConvertOptions& co,
                   const Checkpoint& ckpt) {
  const Plan plan = [&] {
    try {
      return make_plan(ckpt, co);
    } catch (const Error& e) {
      // Flags convert accepted cannot be bad usage now: the recorded ones were altered.
      if (e.code() != ErrorCode::kUsage) throw;
      throw Error(ErrorCode::kBadConfig, records.front().file, "",
                  "recorded options are not valid convert flags: " + e.message());
    }
  }();
  const std::string digest = plan_digest(plan, ckpt);
  for (const auto& r : records)
    if (r.digest != digest)
      bad_part(r.file, "from another plan: its digest " + r.digest.substr(0, 16) +
                           "... differs from " + digest.substr(0, 16) + "... of " + co.src +
                           " with the recorded flags (source, flags or moepack version changed)");
  return plan;
}

// The source fingerprint the parts recorded together (a source tensor read by several tasks -- the
// ranks of one layer of a parallel output -- with one SHA-256), checked
// against the source merge reads now: tasks that read different copies of SRC, or a source edited
// in the middle of a tensor since, are refused naming the source file and the tensor.
std::map<std::string, std::string> check_parts_read_this_source(
    const std::vector<PartRecord>& records, const Checkpoint& ckpt, int threads) {
  std::map<std::string, std::string> all;
  std::map<std::string, const PartRecord*> reader;
  for (const PartRecord& r : records)
    for (const auto& [name, sha] : r.source_tensors) {
      // Parts of a parallel output may share a layer (one rank each): they read its tensors alike.
      auto seen = all.find(name);
      if (seen != all.end() && seen->second != sha)
        throw Error(ErrorCode::kBadValue, r.file, name,
                    "source_tensors: also read by " + reader[name]->file +
                        " with another SHA-256: the tasks read different copies of the source");
      if (seen != all.end()) continue;
      reader[name] = &r;
      all[name] = sha;
    }
  try {
    check_source_fingerprint(ckpt, all, threads,
                             fs::path(records.front().dir).parent_path().string());
  } catch (const Error& e) {
    auto it = reader.find(e.tensor());
    const std::string by = it == reader.end() ? "" : " (read by " + it->second->dir + ")";
    throw Error(e.code(), e.file(), e.tensor(), e.message() + by);
  }
  return all;
}

// One output tensor to copy from a part, with the SHA-256 its part recorded.
struct MergeTask {
  size_t part;
  const PlannedTensor* tensor;
  std::string sha;
};

// Opens every part's tensors (into `files`) and checks that each holds exactly its unit's
// tensors, as planned; returns what to copy.
std::vector<MergeTask> merge_tasks(const Plan& plan, int64_t n,
                                   const std::vector<PartRecord>& records,
                                   std::vector<SafetensorsFile>& files) {
  const std::vector<WorkUnit> units = split_plan(plan, n);
  std::vector<MergeTask> tasks;
  for (size_t k = 0; k < records.size(); ++k) {
    const PartRecord& r = records[k];
    const WorkUnit& unit = units[k];
    files.push_back(SafetensorsFile::open(r.dir + "/" + kPartTensorsFile));
    const SafetensorsFile& f = files.back();
    if (f.entries().size() != unit.tensors.size() || r.tensors.size() != unit.tensors.size())
      bad_part(f.path(), "holds " + std::to_string(f.entries().size()) + " tensors (part.json " +
                             std::to_string(r.tensors.size()) + "), the plan gives this unit " +
                             std::to_string(unit.tensors.size()));
    for (size_t j = 0; j < unit.tensors.size(); ++j) {
      const PlannedTensor& t = plan.tensors[unit.tensors[j]];
      const SafetensorsEntry* e = f.find(t.name);
      if (!e || e->dtype != t.dtype || e->shape != t.shape || r.tensors[j].first != t.name)
        throw Error(ErrorCode::kBadConfig, f.path(), t.name,
                    "missing or not as planned (" + std::string(dtype_name(t.dtype)) + " " +
                        shape_str(t.shape) + ")");
      tasks.push_back({k, &t, r.tensors[j].second});
    }
  }
  return tasks;
}

}  // namespace

MergeResult merge_parts(const MergeOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  MergeResult res;
  res.dst = opts.dst;
  const std::string root = parts_dir(opts.dst);
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(root, ec)))
    throw Error(ErrorCode::kBadConfig, root, "",
                "no parts directory: run `moepack convert SRC " + opts.dst +
                    " --shard I/N` for every I first");
  if (opts.source.empty())
    throw Error(ErrorCode::kUsage,
                "merge needs --source SRC: the parts record no path (output bytes and parts do "
                "not depend on where SRC is), only the SHA-256 of every source tensor they read");
  const auto [n, present] = complete_split(root, opts.dst);
  const std::vector<PartRecord> records = read_part_records(root, n, present);
  res.source = opts.source;
  ConvertOptions co = part_options_from_json(records.front().options, records.front().file);
  co.src = res.source;
  co.dst = opts.dst;
  co.force = opts.force;
  co.threads = opts.threads;
  const auto ckpt = Checkpoint::open(res.source);
  const Plan plan = plan_of_parts(records, co, *ckpt);
  const std::map<std::string, std::string> source_sha =
      check_parts_read_this_source(records, *ckpt, plan.threads);
  std::vector<SafetensorsFile> files;
  const std::vector<MergeTask> tasks = merge_tasks(plan, n, records, files);

  AtomicOutputDir out(opts.dst, opts.force, {res.source, root});
  ShardedWriter writer(out.path(), plan.shards);
  ProgressCounter progress(opts.progress, "tensors", static_cast<int64_t>(tasks.size()),
                           plan.total_bytes());
  parallel_for(static_cast<int64_t>(tasks.size()), plan.threads, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const MergeTask& t = tasks[static_cast<size_t>(i)];
      const TensorView v = files[t.part].view(t.tensor->name);
      writer.write(t.tensor->name, v.data, v.nbytes);
      progress.add(1, v.nbytes);
    }
  });
  const auto sha = writer.checksums();
  for (const MergeTask& t : tasks)
    if (sha.at(t.tensor->name) != t.sha)
      throw Error(ErrorCode::kBadValue, files[t.part].path(), t.tensor->name,
                  "bytes differ from the SHA-256 recorded in part.json: the part is corrupted; "
                  "delete " +
                      records[t.part].dir + " and run its task again");
  writer.finish();
  write_config_and_files(plan, *ckpt, out.path(), sha, source_sha);
  out.commit();
  files.clear();
  if (opts.remove_parts) fs::remove_all(root, ec);

  res.parts = n;
  res.bytes_written = plan.total_bytes();
  res.tensors = static_cast<int64_t>(plan.tensors.size());
  res.shards = static_cast<int64_t>(plan.shards.shard_names.size());
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace moepack
