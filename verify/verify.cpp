#include "verify/verify.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/half.h"
#include "core/memory.h"
#include "core/sha256.h"
#include "core/threads.h"
#include "formats/marlin.h"
#include "formats/moe_reader.h"
#include "formats/mxfp8.h"
#include "formats/parallel.h"
#include "io/json_file.h"
#include "kernels/moe_runtime.h"
#include "kernels/moepack_cuda.h"
#include "model/checkpoint.h"
#include "model/hf_hub.h"
#include "pipeline/artifact.h"
#include "pipeline/manifest.h"
#include "pipeline/plan.h"
#include "verify/layout_record.h"
#include "verify/moe_reference.h"
#include "verify/router.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The converted checkpoint's shards, opened and validated.
struct Output {
  std::map<std::string, SafetensorsFile> shards;
  std::map<std::string, std::string> where;
  TensorView view(const std::string& name) const {
    auto it = where.find(name);
    if (it == where.end())
      throw Error(ErrorCode::kMissingTensor, "", name, "not in the converted checkpoint");
    return shards.at(it->second).view(name);
  }
};

// The index as JSON, or a description of why it is not usable (io/json_file.h's rules: a
// regular file, through symlinks as a Hugging Face cache snapshot holds it; never blocks on a
// FIFO or device, never reads more than a manifest may hold, bounded nesting).
std::optional<json> read_index(const std::string& path, std::string* problem) {
  json j;
  try {
    j = read_json_file(path, {.max_bytes = kMaxManifestBytes});
  } catch (const Error& e) {
    *problem = "model.safetensors.index.json: " + e.message();
    return std::nullopt;
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    *problem = "index is not valid JSON with a weight_map object";
    return std::nullopt;
  }
  return j;
}

Output open_output(const std::string& dir, const Manifest& manifest, VerifyReport& r) {
  Output o;
  std::set<std::string> listed;
  for (const auto& s : manifest.shards) listed.insert(s.name);
  {
    // Every shard is the size the manifest says, and no safetensors file is unlisted (a loader
    // without the index reads every *.safetensors of the directory).
    IntegrityCheck sc;
    sc.name = "shard files as listed";
    sc.passed = true;
    for (const auto& s : manifest.shards) {
      std::error_code ec;
      const std::string p = (fs::path(dir) / s.name).string();
      const uint64_t size = fs::file_size(p, ec);
      if (ec) {
        sc.passed = false;
        sc.detail = s.name + ": " + ec.message();
        break;
      }
      if (size != s.file_bytes) {
        sc.passed = false;
        sc.detail = s.name + " is " + std::to_string(size) + " bytes, manifest says " +
                    std::to_string(s.file_bytes);
        break;
      }
    }
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; sc.passed && !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (it->path().extension() == ".safetensors" && !listed.count(n)) {
        sc.passed = false;
        sc.detail = n + " is not a shard of the manifest";
      }
    }
    if (sc.passed) sc.detail = std::to_string(manifest.shards.size()) + " shards";
    r.integrity.push_back(sc);
  }
  for (const auto& name : listed) {
    const std::string p = (fs::path(dir) / name).string();
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;  // reported above; its tensors are reported missing below
    o.shards.emplace(name, SafetensorsFile::open(p));
    for (const auto& e : o.shards.at(name).entries()) o.where[e.name] = name;
  }
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  IntegrityCheck ic;
  ic.name = "index matches shards";
  std::error_code ec;
  if (listed.size() > 1) {
    std::string problem;
    const std::optional<json> idx = read_index(index, &problem);
    uint64_t total = 0;
    for (const auto& [n, f] : o.shards)
      for (const auto& e : f.entries()) total += e.end - e.begin;
    if (!idx) {
      ic.detail = fs::exists(fs::symlink_status(index, ec))
                      ? problem
                      : "sharded output without model.safetensors.index.json";
    } else {
      const json& wm = (*idx)["weight_map"];
      const json* ts = nullptr;
      if (idx->contains("metadata") && (*idx)["metadata"].is_object() &&
          (*idx)["metadata"].contains("total_size"))
        ts = &(*idx)["metadata"]["total_size"];
      if (wm.size() != o.where.size()) {
        ic.detail = "index lists " + std::to_string(wm.size()) + " tensors, shards hold " +
                    std::to_string(o.where.size());
      } else if (!ts || !ts->is_number_unsigned() || ts->get<uint64_t>() != total) {
        ic.detail = "metadata.total_size differs from the shards' tensor bytes";
      } else {
        ic.passed = true;
        for (auto& [t, f] : wm.items())
          if (!f.is_string() || !o.where.count(t) || o.where[t] != f.get<std::string>()) {
            ic.passed = false;
            ic.detail = "tensor " + t + " is mapped to " +
                        (f.is_string() ? f.get<std::string>() : f.dump()) + " but lives elsewhere";
            break;
          }
      }
    }
  } else {
    ic.passed = !fs::exists(index, ec);
    if (!ic.passed) ic.detail = "single-file output has a stray index";
  }
  r.integrity.push_back(ic);
  return o;
}

// Whether two files have the same bytes (read in blocks; never blocks on a non-regular file).
// Symlinks are followed (a Hugging Face cache snapshot's files are links into blobs/); each must
// end at a regular file.
bool same_file_bytes(const std::string& a, const std::string& b, std::string* problem) {
  std::error_code ec;
  for (const std::string* p : {&a, &b})
    if (fs::status(*p, ec).type() != fs::file_type::regular) {
      *problem = *p + " is not a regular file";
      return false;
    }
  if (fs::file_size(a, ec) != fs::file_size(b, ec)) {
    *problem = "sizes differ";
    return false;
  }
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  std::vector<char> ba(1 << 16), bb(1 << 16);
  while (fa && fb) {
    fa.read(ba.data(), static_cast<std::streamsize>(ba.size()));
    fb.read(bb.data(), static_cast<std::streamsize>(bb.size()));
    if (fa.gcount() != fb.gcount() ||
        std::memcmp(ba.data(), bb.data(), static_cast<size_t>(fa.gcount())) != 0) {
      *problem = "bytes differ";
      return false;
    }
  }
  return true;
}

// The manifest against the source: every MoE layer with its experts and sizes, every tensor
// that is not a routed expert copied, every carried-over file. A manifest that does not describe
// a conversion of this source is a bad input (kBadConfig naming the manifest field), checked
// before any tensor is compared.
void check_manifest_covers_source(const Manifest& m, const std::string& mpath,
                                  const Checkpoint& src) {
  // Every mismatch names the source the artifact records, so a wrong --source is plain to see.
  const std::string recorded =
      "; the artifact was converted from a " + m.source.format + " checkpoint" +
      (m.source.name.empty() ? "" : " named \"" + m.source.name + "\"") + " (model_type " +
      m.source.model_type + ", " + std::to_string(m.source.tensor_bytes) +
      " tensor bytes): is --source " + src.dir() + " that checkpoint?";
  auto bad = [&](const std::string& what) {
    throw Error(ErrorCode::kBadConfig, mpath, "", what + recorded);
  };
  auto at = [](size_t i) { return "layers[" + std::to_string(i) + "]"; };
  std::map<std::string, size_t> listed;
  for (size_t i = 0; i < m.layers.size(); ++i) listed[m.layers[i].module] = i;
  for (const MoeLayer& L : src.moe_layers())
    if (!listed.count(L.module))
      bad("layers: the source's MoE layer " + L.module + " (" + std::to_string(L.num_experts) +
          " experts) is not listed: it was not verified");
  std::map<std::string, const MoeLayer*> by_module;
  for (const MoeLayer& L : src.moe_layers()) by_module[L.module] = &L;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const ManifestLayer& ml = m.layers[i];
    auto it = by_module.find(ml.module);
    if (it == by_module.end())
      bad(at(i) + ".module: \"" + ml.module + "\" is not an MoE layer of the source " + src.dir());
    const MoeLayer& L = *it->second;
    auto same = [&](const char* field, int64_t got, int64_t want) {
      if (got != want)
        bad(at(i) + "." + field + ": " + std::to_string(got) + ", but the source's " + L.module +
            " has " + std::to_string(want));
    };
    same("experts", ml.experts, L.num_experts);
    same("hidden", ml.hidden, L.hidden);
    same("inter", ml.inter, L.inter);
    same("layer", ml.layer, L.layer);
    if (ml.gated != L.gated)
      bad(at(i) + ".gated: " + (ml.gated ? "true" : "false") + ", but the source's " + L.module +
          " is " + (L.gated ? "gated" : "not gated"));
    if (ml.family != moe_family_name(L.family))
      bad(at(i) + ".family: \"" + ml.family + "\", but the source's " + L.module + " is \"" +
          moe_family_name(L.family) + "\"");
    // The parameters' prefix is the source module's with the target's child (routed_experts).
    const std::string want_prefix = vllm_param_prefix(m.vllm_target, L.param_prefix);
    if (ml.param_prefix != want_prefix)
      bad(at(i) + ".param_prefix: \"" + ml.param_prefix + "\", but for the source's " + L.module +
          " and vllm_target " + vllm_target_name(m.vllm_target) + " it is \"" + want_prefix + "\"");
  }
  for (const std::string& name : src.other_tensors()) {
    auto it = m.tensors.find(name);
    if (it == m.tensors.end())
      bad("tensors: the source tensor " + name + " is neither converted nor copied");
    if (it->second.converted)
      bad("tensors[\"" + name + "\"].action: \"convert\", but " + name +
          " is not a routed expert tensor of the source (it is copied through)");
  }
  if (m.source.tensor_bytes != src.total_tensor_bytes())
    bad("source.tensor_bytes: " + std::to_string(m.source.tensor_bytes) +
        ", but the source holds " + std::to_string(src.total_tensor_bytes()));
  // The files the conversion's rule (the defaults, its --include / --exclude) carries.
  const FileSelection sel = select_files(src.other_files(), {m.files_include, m.files_exclude});
  const std::set<std::string> want(sel.carried.begin(), sel.carried.end());
  const std::set<std::string> got(m.files.begin(), m.files.end());
  for (const auto& f : want)
    if (!got.count(f)) bad("files: the source's " + f + " is not listed");
  std::vector<std::string> left_out;
  for (const auto& f : sel.left_out) left_out.push_back(f.path);
  if (left_out != m.files_left_out)
    bad("files_left_out: " + json(m.files_left_out).dump() + ", but the rule leaves out " +
        json(left_out).dump() + " of the source");
  for (size_t i = 0; i < m.files.size(); ++i)
    if (!want.count(m.files[i]))
      bad("files[" + std::to_string(i) + "]: \"" + m.files[i] + "\" is not a file of the source");
}

// The source scales as the layout stores them (fp16 -> bf16 RNE etc.; formats' convert_scales,
// the same rule pack used), so that a faithful conversion compares bit for bit.
std::vector<uint8_t> scales_as(const QuantTensor& src, DType dt) {
  return convert_scales(src.scales, src.scale_dtype, dt, "scales");
}

std::vector<int32_t> explicit_g_idx(const QuantTensor& q) {
  if (!q.g_idx.empty()) return q.g_idx;
  std::vector<int32_t> g(static_cast<size_t>(q.experts * q.k));
  for (int64_t e = 0; e < q.experts; ++e)
    for (int64_t k = 0; k < q.k; ++k)
      g[static_cast<size_t>(e * q.k + k)] =
          static_cast<int32_t>(q.group_size > 0 ? k / q.group_size : 0);
  return g;
}

// One chunk of experts, [first_expert, first_expert + experts) of the layer.
template <typename T>
RoundTripCheck compare_per_expert(const std::string& name, int64_t layer, const std::vector<T>& got,
                                  const std::vector<T>& want, int64_t experts,
                                  int64_t elem_per_unit, int64_t first_expert) {
  RoundTripCheck c;
  c.name = name;
  if (got.size() != want.size()) {
    c.passed = false;
    c.mismatches = 1;
    RoundTripMismatch m;
    m.layer = layer;
    m.tensor = name;
    m.got = std::to_string(got.size()) + " elements";
    m.want = std::to_string(want.size()) + " elements";
    c.first_mismatch = m;
    return c;
  }
  // Counted per element (`elem_per_unit` values of T each: the bytes of one scale), so that
  // "M of N differ" compares like with like; the first mismatch shows the whole element.
  const int64_t unit = std::max<int64_t>(1, elem_per_unit);
  const int64_t units = static_cast<int64_t>(got.size()) / unit;
  c.compared = units;
  const int64_t per_expert = experts ? units / experts : 0;  // elements per expert
  const auto element = [&](const std::vector<T>& v, int64_t u) {
    std::ostringstream s;  // little-endian: the last value is the most significant
    s << "0x" << std::hex;
    for (int64_t b = unit - 1; b >= 0; --b) {
      s.width(b == unit - 1 ? 0 : static_cast<std::streamsize>(2 * sizeof(T)));
      s.fill('0');
      s << +v[static_cast<size_t>(u * unit + b)];
    }
    return s.str();
  };
  for (int64_t u = 0; u < units; ++u) {
    const auto first = got.begin() + u * unit;
    if (std::equal(first, first + unit, want.begin() + u * unit)) continue;
    if (++c.mismatches == 1) {
      RoundTripMismatch m;
      m.layer = layer;
      m.expert = per_expert ? first_expert + u / per_expert : -1;
      m.tensor = name;
      m.index = per_expert ? u % per_expert : u;
      m.got = element(got, u);
      m.want = element(want, u);
      c.first_mismatch = m;
    }
  }
  c.passed = c.mismatches == 0;
  return c;
}

std::vector<RoundTripCheck> compare_quant(int64_t layer, const std::string& which,
                                          const QuantTensor& got, const QuantTensor& want,
                                          int64_t first_expert) {
  const std::string base = "layer " + std::to_string(layer) + " " + which + " ";
  if (got.n != want.n || got.k != want.k || got.experts != want.experts) {
    RoundTripCheck c;
    c.name = base + "shape";
    c.mismatches = 1;
    RoundTripMismatch m;
    m.layer = layer;
    m.tensor = which;
    m.got = "[" + std::to_string(got.experts) + ", " + std::to_string(got.n) + ", " +
            std::to_string(got.k) + "]";
    m.want = "[" + std::to_string(want.experts) + ", " + std::to_string(want.n) + ", " +
             std::to_string(want.k) + "]";
    c.first_mismatch = m;
    return {c};
  }
  std::vector<RoundTripCheck> out;
  out.push_back(compare_per_expert(base + "codes", layer, got.codes, want.codes, got.experts, 1,
                                   first_expert));
  const auto want_scales = scales_as(want, got.scale_dtype);
  out.push_back(compare_per_expert(base + "scales", layer, got.scales, want_scales, got.experts,
                                   got.scale_bytes(), first_expert));
  if (!want.symmetric || !got.symmetric)
    out.push_back(compare_per_expert(base + "zeros", layer, got.zeros, want.zeros, got.experts, 1,
                                     first_expert));
  if (!want.g_idx.empty() || !got.g_idx.empty())
    out.push_back(compare_per_expert(base + "g_idx", layer, explicit_g_idx(got),
                                     explicit_g_idx(want), got.experts, 1, first_expert));
  // A layout that keeps the activation scales (trtllm-nvfp4) keeps what vLLM keeps of the
  // second-level scales beside them: both bit for bit (the source side as vllm_loaded gives it).
  if (!got.input_scales.empty()) {
    const auto bits = [](const std::vector<float>& v) {
      std::vector<uint32_t> b(v.size());
      if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * 4);
      return b;
    };
    out.push_back(compare_per_expert(base + "global_scales", layer, bits(got.global_scales),
                                     bits(want.global_scales), got.experts, 1, first_expert));
    out.push_back(compare_per_expert(base + "input_scales", layer, bits(got.input_scales),
                                     bits(want.input_scales), got.experts, 1, first_expert));
  }
  return out;
}

// The expert biases of a chunk, bit for bit (either side having them: one without is every
// element missing).
std::vector<RoundTripCheck> compare_biases(int64_t layer, const MoeExperts& got,
                                           const MoeExperts& want, int64_t first_expert) {
  std::vector<RoundTripCheck> out;
  if (!got.has_biases() && !want.has_biases()) return out;
  const std::string base = "layer " + std::to_string(layer) + " ";
  const int eb = dtype_bits(want.bias_dtype) / 8;
  if (got.bias_dtype != want.bias_dtype) {
    RoundTripCheck c;
    c.name = base + "bias dtype";
    c.mismatches = 1;
    RoundTripMismatch m;
    m.layer = layer;
    m.tensor = "biases";
    m.got = dtype_name(got.bias_dtype);
    m.want = dtype_name(want.bias_dtype);
    c.first_mismatch = m;
    return {c};
  }
  out.push_back(compare_per_expert(base + "w13 bias", layer, got.w13_bias, want.w13_bias,
                                   want.w13.experts, eb, first_expert));
  out.push_back(compare_per_expert(base + "w2 bias", layer, got.w2_bias, want.w2_bias,
                                   want.w2.experts, eb, first_expert));
  return out;
}

// Biases as float [E, N] / [E, H] (empty without).
std::vector<float> bias_floats(const std::vector<uint8_t>& raw, DType dt) {
  const int eb = dtype_bits(dt) / 8;
  std::vector<float> out(raw.size() / static_cast<size_t>(eb));
  for (size_t i = 0; i < out.size(); ++i) out[i] = element_as_float(raw.data() + i * eb, dt);
  return out;
}

// A layer's round-trip checks summed over its chunks of experts (first mismatch: the first
// chunk's that has one).
class LayerRoundTrip {
 public:
  void add(const std::vector<RoundTripCheck>& checks) {
    for (const RoundTripCheck& c : checks) {
      auto it = std::find_if(checks_.begin(), checks_.end(),
                             [&](const RoundTripCheck& k) { return k.name == c.name; });
      if (it == checks_.end()) {
        checks_.push_back(c);
        continue;
      }
      it->compared += c.compared;
      it->mismatches += c.mismatches;
      if (!it->first_mismatch) it->first_mismatch = c.first_mismatch;
    }
  }
  void report(VerifyReport& r) {
    for (RoundTripCheck& c : checks_) {
      c.passed = c.mismatches == 0;
      r.round_trip.push_back(std::move(c));
    }
    checks_.clear();
  }

 private:
  std::vector<RoundTripCheck> checks_;
};

// A layer whose converted tensors could not be decoded or evaluated: a failed round-trip check
// naming the layer and the reason, and a failed (non-finite) numerical result.
void report_broken_layer(VerifyReport& r, int64_t layer, const std::string& backend, int64_t tokens,
                         int top_k, int64_t experts, const std::string& stage, const Error& e) {
  RoundTripCheck c;
  c.name = "layer " + std::to_string(layer) + " " + stage;
  c.mismatches = 1;
  RoundTripMismatch m;
  m.layer = layer;
  m.tensor = e.tensor();
  m.got = e.message();
  c.first_mismatch = m;
  r.round_trip.push_back(c);
  LayerResult l;
  l.layer = layer;
  l.backend = backend;
  l.tokens = tokens;
  l.top_k = top_k;
  l.max_abs_err = l.norm_err = std::numeric_limits<double>::infinity();
  l.passed = false;
  l.expert_max_abs_err.assign(static_cast<size_t>(std::max<int64_t>(0, experts)), 0.0);
  l.expert_tokens.assign(static_cast<size_t>(std::max<int64_t>(0, experts)), 0);
  r.layers.push_back(l);
}

// Busy seconds of verify's stages (VerifyTiming), added from every thread.
struct StageClock {
  std::atomic<int64_t> read_ns{0}, decode_ns{0}, wait_ns{0}, evaluate_ns{0}, stage_ns{0};
  void record(VerifyTiming* t) const {
    t->read_hash_seconds = static_cast<double>(read_ns.load()) * 1e-9;
    t->stage_seconds = static_cast<double>(stage_ns.load()) * 1e-9;
    t->decode_seconds = static_cast<double>(decode_ns.load()) * 1e-9;
    t->wait_seconds = static_cast<double>(wait_ns.load()) * 1e-9;
    t->evaluate_seconds = static_cast<double>(evaluate_ns.load()) * 1e-9;
  }
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

// Adds the time from construction to destruction to `into`.
class StageTimer {
 public:
  explicit StageTimer(std::atomic<int64_t>* into) : into_(into), start_(StageClock::now_ns()) {}
  ~StageTimer() {
    if (into_) into_->fetch_add(StageClock::now_ns() - start_);
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

 private:
  std::atomic<int64_t>* into_;
  int64_t start_;
};

// Each converted parameter's SHA-256, computed from the mapped shard by hashing threads of their
// own while the layers are read (integrity 1 needs no pass over the bytes at the end): several
// tensors at once, each a megabyte at a time from the page cache, its pages dropped once hashed.
// A tensor's hash is sequential, so it is not tied to the chunks the layers take: the chunks are
// then prepared in any order, by any number of threads. The hashers keep within kLayersAhead
// layers of the layer loop (reached()), so that a model larger than RAM is hashed while its
// pages are in the page cache for the chunks too; the tensors that are no layer's parameters go
// with the first layer (plan_chunks). A tensor not hashed (no thread could start, or the run
// stopped) has no digest; integrity 1 hashes it at the end.
class TensorHasher {
 public:
  static constexpr size_t kLayersAhead = 4;
  // Before start(): tensors in the order of their layers; `releasable`: a read-only file
  // mapping whose hashed pages may be dropped.
  void track(const TensorView& v, bool releasable, size_t layer) {
    if (v.nbytes == 0 || index_.count(v.data)) return;
    index_[v.data] = items_.size();
    items_.push_back({v, releasable, layer, {}});
  }
  // `threads` hashing threads (those that start); their busy time is added to `busy_ns`. The
  // tensors are taken by layer, in the order tracked within a layer.
  void start(int threads, std::atomic<int64_t>* busy_ns) {
    busy_ns_ = busy_ns;
    std::stable_sort(items_.begin(), items_.end(),
                     [](const Item& a, const Item& b) { return a.layer < b.layer; });
    for (size_t i = 0; i < items_.size(); ++i) index_[items_[i].view.data] = i;
    for (int t = 0; t < threads; ++t) {
      try {
        threads_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        break;  // fewer hashers; what none hashes is hashed at the end
      }
    }
  }
  // The layer loop begins layer `layer`: tensors up to kLayersAhead layers after it may go.
  void reached(size_t layer) {
    {
      std::lock_guard<std::mutex> lock(m_);
      gate_ = std::max(gate_, layer + kLayersAhead);
    }
    cv_.notify_all();
  }
  // Every tracked tensor hashed (the gate opened); the threads joined.
  void finish() { stop_threads(false); }
  ~TensorHasher() { stop_threads(true); }
  // The SHA-256 of the whole tensor when a hasher hashed it, else empty. After finish().
  std::string digest(const TensorView& v) const {
    auto it = index_.find(v.data);
    if (v.nbytes == 0 || it == index_.end() || items_[it->second].view.nbytes != v.nbytes)
      return {};
    return items_[it->second].hex;
  }

 private:
  struct Item {
    TensorView view;
    bool releasable;
    size_t layer;
    std::string hex;
  };
  static constexpr size_t kPiece = size_t{1} << 20;

  // A tensor being hashed by a hashing thread: its bytes up to `off` are in `sha`.
  struct Stream {
    Item* item = nullptr;
    Sha256 sha;
    size_t off = 0;
    size_t left() const { return item->view.nbytes - off; }
  };

  // The next tensor into `s`, waiting for the layer gate where `wait`, else only if one is ready
  // now. False: none (the run stopped, everything is taken, or none is ready and !wait).
  bool take(Stream& s, bool wait) {
    std::unique_lock<std::mutex> lock(m_);
    const auto ready = [&] { return next_ < items_.size() && items_[next_].layer <= gate_; };
    if (wait) cv_.wait(lock, [&] { return stop_ || next_ >= items_.size() || ready(); });
    if (stop_ || !ready()) return false;
    s.item = &items_[next_++];
    s.sha = Sha256();
    s.off = 0;
    return true;
  }

  // The stream's next n bytes.
  static const uint8_t* piece(const Stream& s) { return s.item->view.data + s.off; }
  // n bytes of the stream hashed (by the caller) and their mapped pages dropped; a finished tensor
  // gets its digest and the stream is free.
  void advance(Stream& s, size_t n) {
    const Item& it = *s.item;
    if (it.releasable) release_mapped(it.view.data + s.off, n);
    s.off += n;
    if (s.left() == 0) {
      s.item->hex = s.sha.hex_digest();
      s.item = nullptr;
    }
  }

  // Each thread hashes two tensors at once where two are ready (Sha256::update_pair: the SHA
  // extensions' rounds of two messages interleaved), a megabyte of each at a time.
  void work() {
    Stream a, b;
    for (;;) {
      if (!a.item && !take(a, !b.item) && !b.item) return;
      if (!a.item) std::swap(a, b);
      if (!b.item) take(b, false);
      if (stop_.load(std::memory_order_relaxed)) return;  // no digest: hashed at the end
      StageTimer busy(busy_ns_);
      if (b.item) {
        const size_t n = std::min({kPiece, a.left(), b.left()});
        Sha256::update_pair(a.sha, piece(a), b.sha, piece(b), n);
        advance(a, n);
        advance(b, n);
        continue;
      }
      const size_t n = std::min(kPiece, a.left());
      a.sha.update(piece(a), n);
      advance(a, n);
    }
  }

  void stop_threads(bool abandon) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (abandon) stop_ = true;
      gate_ = std::numeric_limits<size_t>::max();
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  std::vector<Item> items_;
  std::map<const uint8_t*, size_t> index_;
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_;
  size_t next_ = 0, gate_ = kLayersAhead;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t>* busy_ns_ = nullptr;
};

// Buffers of the sizes of the parameters a chunk stages straight from the mapped shard
// (param_chunk's `direct`): a stand-in's bytes are never read, so a buffer freed by one chunk
// serves the next chunk's stand-in of its size, neither copied into nor zero-filled again. At
// most `kept` buffers wait for reuse (the chunks in flight hold the rest).
class StandInBuffers {
 public:
  explicit StandInBuffers(size_t kept) : kept_(kept) {}
  std::vector<uint8_t> take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(m_);
      const auto it = free_.find(bytes);
      if (it != free_.end()) {
        std::vector<uint8_t> v = std::move(it->second);
        free_.erase(it);
        return v;
      }
    }
    return std::vector<uint8_t>(bytes);  // the first of its size: filled once
  }
  void give(std::vector<uint8_t>&& v) {
    std::lock_guard<std::mutex> lock(m_);
    if (free_.size() < kept_) free_.emplace(v.size(), std::move(v));
  }

 private:
  std::mutex m_;
  std::multimap<size_t, std::vector<uint8_t>> free_;
  size_t kept_;
};

// Where the chunk's parameters named in param_chunk's `direct` are in the mapped shard (by name):
// the stage copies them from there (stage_device_chunk).
using MappedParams = std::map<std::string, const uint8_t*>;

// Experts [first, last) of each parameter (every layout parameter leads with the expert
// dimension), copied out of the mapped shard, whose pages are dropped after (the hashers read
// them on their own, TensorHasher): only the chunk is ever held. The parameters on up to
// `threads` threads. A parameter named in `direct` is not copied: its tensor is a stand-in of
// its size from `stand_ins` (whose bytes are not the parameter's) and `mapped` says where its
// bytes are, for the device path to stage them from the mapping in one copy (the host reads only
// the shape and size of the Marlin codes it decodes on the device: LayerJob::device_codes).
TensorMap param_chunk(const std::vector<TensorView>& views, int64_t experts, int64_t first,
                      int64_t last, int threads, const std::set<std::string>* direct = nullptr,
                      StandInBuffers* stand_ins = nullptr, MappedParams* mapped = nullptr) {
  TensorMap out;
  std::vector<std::pair<const TensorView*, Tensor*>> work;
  for (const TensorView& v : views) {
    Tensor t;
    t.name = v.name;
    t.dtype = v.dtype;
    t.shape = v.shape;
    t.shape[0] = last - first;
    const uint64_t per = v.nbytes / static_cast<uint64_t>(experts);
    if (direct && direct->count(v.name)) {
      t.data = stand_ins->take(static_cast<size_t>(per * static_cast<uint64_t>(last - first)));
      (*mapped)[v.name] = v.data + per * static_cast<uint64_t>(first);
      out.emplace(t.name, std::move(t));
      continue;
    }
    work.emplace_back(&v, &out.emplace(t.name, std::move(t)).first->second);
  }
  parallel_for(static_cast<int64_t>(work.size()), threads, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const TensorView& v = *work[static_cast<size_t>(i)].first;
      Tensor& t = *work[static_cast<size_t>(i)].second;
      const uint64_t per = v.nbytes / static_cast<uint64_t>(experts);
      const uint8_t* from = v.data + per * static_cast<uint64_t>(first);
      const size_t n = static_cast<size_t>(per * static_cast<uint64_t>(last - first));
      if (n == 0) continue;
      t.data.assign(from, from + n);  // one pass: no zero fill before the copy
      release_mapped(from, n);
    }
  });
  return out;
}

class DeviceStartup;

// The reading side of one run: what both devices' layer loops share.
struct LayerRun {
  const Output* out;
  const Checkpoint* src;
  const TargetLayout* layout;
  const QuantizeRecipe* recipe;  // the conversion quantised (MXFP8 from dense), else null
  const Manifest* manifest;
  int threads;
  const VerifyOptions* opts;
  ref::RouterConfig router;
  ref::Activation activation;
  VerifyReport* report;
  TensorHasher* hasher;
  StageClock* clock;
  DeviceStartup* device = nullptr;      // --device cuda: the runtime, made from verify's start
  StandInBuffers* stand_ins = nullptr;  // --device cuda: LayerJob::staged_direct's stand-ins
  // Threads within one chunk (its copy, unpack, the source's load): all of them where the loop
  // prepares its chunks (0), threads / workers beside a pool of workers, which already keeps
  // every core busy (more would only start threads per chunk).
  int chunk_threads = 0;
  int within_chunk() const { return chunk_threads > 0 ? chunk_threads : threads; }
  // --device cuda without --source: the reference's codes of the Marlin rows decoded on the
  // device (LayerJob::device_codes), unless MOEPACK_VERIFY_HOST_DECODE is set (not "0": decoded
  // and packed on the host as for every other row).
  bool device_codes = false;
  bool rounded_note = false;
  bool requant_note = false;
  // Progress: each layer's parameter bytes and the bytes of the layers before it.
  std::vector<uint64_t> layer_bytes = {}, bytes_before = {};
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  // Each layer's parameter bytes for progress; the clock starts.
  void count_layer_bytes() {
    for (const ManifestLayer& ml : manifest->layers) {
      uint64_t bytes = 0;
      for (const std::string& p : ml.params) bytes += manifest->tensors.at(p).bytes;
      bytes_before.push_back(bytes_before.empty() ? 0 : bytes_before.back() + layer_bytes.back());
      layer_bytes.push_back(bytes);
    }
    start = std::chrono::steady_clock::now();
  }

  // Layer `li` checked up to its expert `experts_done` (li == layers: all done).
  void progress(size_t li, int64_t experts_done) const {
    if (!opts->progress) return;
    const size_t n = layer_bytes.size();
    ConvertProgress p;
    p.layers_total = static_cast<int64_t>(n);
    p.layers_done = static_cast<int64_t>(li);
    p.bytes_total = n ? bytes_before[n - 1] + layer_bytes[n - 1] : 0;
    p.bytes_done = p.bytes_total;
    if (li < n) {
      const int64_t e = manifest->layers[li].experts;
      if (experts_done >= e) p.layers_done = static_cast<int64_t>(li) + 1;
      p.bytes_done = bytes_before[li] + static_cast<uint64_t>(static_cast<double>(layer_bytes[li]) *
                                                              static_cast<double>(experts_done) /
                                                              static_cast<double>(e));
    }
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    opts->progress(p);
  }

  void broken(const ManifestLayer& ml, const std::string& stage, const Error& e) const {
    report_broken_layer(*report, ml.layer, manifest->backend, opts->tokens, router.top_k,
                        ml.experts, stage, e);
  }
};

// One manifest layer, ready to evaluate: options, parameter views, spec and chunking. The
// parameters are as DST holds them: anything wrong with them is this layer failing (exit 1).
struct LayerJob {
  const ManifestLayer* ml = nullptr;
  LayoutOptions lo;
  const MoeLayer* src_layer = nullptr;
  ref::MoeSpec spec;
  std::vector<TensorView> views;
  // A parallel output (Manifest::parallel): each rank's parameter views (views stays empty) and
  // the options its layout was packed with (the rank's I and its own recorded decisions).
  const Parallelism* par = nullptr;
  std::vector<std::vector<TensorView>> rank_views;
  std::vector<LayoutOptions> rank_lo;
  int64_t chunk = 1;
  // A Marlin row evaluated on the device without a source: its chunks are decoded without the
  // codes (unpack_marlin_moe_without_codes) and the reference's codes decoded on the device
  // (stage_device_chunk, device_reference_codes).
  bool device_codes = false;
  // The parameters staged straight from the mapped shard (param_chunk's `direct`): the Marlin
  // codes (qweight) of a device_codes job, which the host never reads. Empty elsewhere.
  std::set<std::string> staged_direct;
  // The router and the hidden states; the experts' input where the router changes it
  // (route_layer: Llama-4 scales it by the weight), else empty.
  ref::RouterTensors router;
  std::vector<float> x, expert_x;
};

// Expert biases (gpt-oss' gate_up_proj_bias / down_proj_bias, vLLM's w13_bias / w2_bias) are
// computed where the layout carries them (parameters of the bias roles, which unpack decodes and
// verify adds to each projection's output). Elsewhere the MoE such experts serve cannot be
// computed as vLLM computes it (the reference would run without them): refused (exit 4), never
// verified with the wrong MoE -- a source whose experts have biases converted to a layout without
// them, or bias tensors beside converted experts that are not the layout's parameters.
bool layout_carries_biases(const ManifestLayer& ml) {
  for (const auto& nr : ml.param_roles)
    if (nr.second == ParamRole::kW13Bias || nr.second == ParamRole::kW2Bias) return true;
  return false;
}

void refuse_expert_biases(const Output& out, const Manifest& manifest, const Checkpoint* src,
                          const ManifestLayer& ml) {
  if (layout_carries_biases(ml)) return;
  if (src)
    for (const auto& L : src->moe_layers())
      if (L.module == ml.module && !load_expert_biases(*src, L).empty())
        throw Error(ErrorCode::kUnsupported, src->dir(), L.param_prefix + "gate_up_proj_bias",
                    "the source's experts of " + ml.module + " carry biases, which the layout " +
                        manifest.backend +
                        " does not carry: the MoE they serve cannot be computed as vLLM does");
  for (const char* suffix : {"gate_up_proj_bias", "down_proj_bias", "w13_bias", "w2_bias",
                             "routed_experts.w13_bias", "routed_experts.w2_bias"}) {
    const std::string name = ml.module + ".experts." + suffix;
    if (out.where.count(name))
      throw Error(ErrorCode::kUnsupported, "", name,
                  "expert biases beside the converted experts of " + ml.module + ", which " +
                      manifest.backend + " does not carry: moepack computes no MoE with them");
  }
}

// Every layer: refuse_expert_biases. Both paths add the biases a layout carries (the CPU's
// ref::ChunkBiases, the CUDA runtime's MoeChunkBiases: kernels/moe_runtime.h).
void refuse_unverifiable_biases(const Output& out, const Manifest& manifest,
                                const Checkpoint* src) {
  for (const ManifestLayer& ml : manifest.layers) refuse_expert_biases(out, manifest, src, ml);
}

// The Marlin codes (qweight) of a device_codes job, by name, where the host never reads them
// (marlin_without_codes_reads_codes: not where the padded I is cropped): the device path stages
// them straight from the mapped shard. Empty when a name or shape is not the layout's (unpack
// then names what is wrong, from the copied parameters).
std::set<std::string> marlin_codes_staged_direct(const LayerJob& job) {
  std::set<std::string> names;
  for (const MoeProj proj : {MoeProj::kW13, MoeProj::kW2}) {
    const std::string name = job.lo.prefix + marlin_param_names(job.lo.source_method, proj).qweight;
    const auto v = std::find_if(job.views.begin(), job.views.end(),
                                [&name](const TensorView& t) { return t.name == name; });
    if (v == job.views.end() || v->shape.size() != 3) return {};
    if (proj == MoeProj::kW2 && marlin_without_codes_reads_codes(job.lo, v->shape)) return {};
    names.insert(name);
  }
  return names;
}

// The layer's job without its router and hidden states (load_layer_inputs). Throws Error for
// parameters that do not lead with the layer's experts.
LayerJob make_layer_job(const LayerRun& run, const ManifestLayer& ml) {
  const Manifest& manifest = *run.manifest;
  LayerJob job;
  job.ml = &ml;
  job.lo = layout_options_of(manifest, ml, run.within_chunk());
  if (run.src)
    for (const auto& L : run.src->moe_layers())
      if (L.module == ml.module) job.src_layer = &L;
  job.spec.experts = ml.experts;
  job.spec.hidden = ml.hidden;
  job.spec.intermediate = ml.inter;
  job.spec.gated = job.lo.gated;
  job.spec.activation = run.activation;
  job.spec.threads = run.threads;
  job.device_codes = run.device_codes && !job.src_layer && !manifest.parallel &&
                     run.layout->unpack == &unpack_marlin_moe;
  // Expert chunks by convert's rule (--chunk-size, and at least kMinChunksPerLayer chunks a
  // layer, as make_plan): the packed chunk, its decoding and the source's chunk are all that is
  // held (the mapped shards are read, not copied). With a source verify holds two canonical
  // forms where convert holds one, so it takes half the experts convert takes: its peak stays
  // within convert's for the same --chunk-size.
  const int64_t convert_chunk = experts_per_chunk(
      run.opts->chunk_bytes, ml.experts,
      canonical_expert_bytes(job.spec.w13_rows(), ml.hidden, ml.inter, run.recipe != nullptr));
  job.chunk = run.src ? std::max<int64_t>(1, convert_chunk / 2) : convert_chunk;
  if (manifest.parallel) {
    job.par = &manifest.parallel->parallel;
    for (int r = 0; r < job.par->ranks(); ++r)
      job.rank_lo.push_back(rank_options_of(manifest, ml, r, run.within_chunk()));
    job.rank_views.resize(static_cast<size_t>(job.par->ranks()));
  }
  for (const auto& p : ml.params) {
    const TensorView v = run.out->view(p);
    const int64_t experts = manifest.param_experts(ml, p);
    if (v.shape.empty() || v.shape[0] != experts)
      throw Error(ErrorCode::kBadShape, "", p,
                  "shape " + shape_str(v.shape) + " does not lead with the " +
                      std::to_string(experts) + " experts it holds of the layer");
    if (job.par)
      job.rank_views[static_cast<size_t>(rank_of_tensor_key(p, job.par->ranks()))].push_back(v);
    else
      job.views.push_back(v);
  }
  if (job.device_codes && run.stand_ins) job.staged_direct = marlin_codes_staged_direct(job);
  return job;
}

void load_layer_inputs(const LayerRun& run, LayerJob* job) {
  const Output& out = *run.out;
  const std::string& module = job->ml->module;
  // The tensors convert checked (model/routing.h), by the same names.
  const RouterTensorNames names = router_tensor_names(
      module, run.router, [&](const std::string& n) { return out.where.count(n) != 0; });
  if (names.weight.empty())
    throw Error(ErrorCode::kMissingTensor, "", module + ".gate.weight",
                "the router of " + module + " is not in the converted checkpoint");
  auto floats = [&](const std::string& n) {
    return n.empty() ? std::vector<float>{} : to_floats(out.view(n));
  };
  job->router.weight = floats(names.weight);
  job->router.bias = floats(names.bias);
  job->router.correction_bias = floats(names.correction_bias);
  job->router.per_expert_scale = floats(names.per_expert_scale);
  job->router.input_scale = floats(names.input_scale);
  job->x = ref::random_hidden_states(run.opts->tokens, job->spec.hidden,
                                     run.opts->seed + static_cast<uint64_t>(job->ml->layer));
}

// A chunk staged for the device by the worker that prepared it (stage_device_chunk): its slot of
// pinned staging, filled, and the readers and biases over the device addresses it will have.
struct DeviceChunk {
  MoeChunkStage stage;
  reader::ProjReader w13, w2, ref_w13, ref_w2;
  MoeChunkBiases biases, ref_biases;
};

// One chunk of experts [e0, e1) of a layer: the layout's parameters, their decoding, the
// reference experts (the source's, re-quantised when the conversion quantised, scales rounded as
// the layout serves them; or the decoding itself without a source) and the exact round trip.
struct PreparedChunk {
  int64_t e0 = 0, e1 = 0;
  TensorMap params;
  MappedParams mapped;  // where the job's staged_direct parameters are (params holds stand-ins)
  // A parallel output: each rank's parameters of the chunk (its experts among [e0, e1), by the
  // layout's names) and their decoding; `decoded` is then the ranks' reassembled.
  std::vector<TensorMap> rank_params;
  std::vector<MoeExperts> rank_decoded;
  MoeExperts decoded, source;
  bool has_source = false;
  std::vector<std::vector<RoundTripCheck>> checks;
  std::string rounded_from, rounded_to;  // the source scales' dtype and the served one
  bool vllm_changed = false;  // layout->vllm_loaded changed the source's codes (vLLM requantises)
  std::optional<Error> failure;  // the decode failed
  // --device cuda: staged by its worker (then params, decoded and source are dropped: the device
  // reads the stage), or what staging it threw, which the loop treats as its evaluation failing.
  std::unique_ptr<DeviceChunk> device;
  std::optional<Error> stage_failure;
  const MoeExperts& reference() const { return has_source ? source : decoded; }
};

// The chunk's expert biases as floats: the reference's (the source's) and the layout's as unpack
// decodes them (empty where a side has none), for both paths' numerical check.
ref::ChunkBiases chunk_biases(const PreparedChunk& c) {
  const MoeExperts& reference = c.reference();
  return {bias_floats(reference.w13_bias, reference.bias_dtype),
          bias_floats(reference.w2_bias, reference.bias_dtype),
          bias_floats(c.decoded.w13_bias, c.decoded.bias_dtype),
          bias_floats(c.decoded.w2_bias, c.decoded.bias_dtype)};
}

// Rank r's parameters of the chunk [c.e0, c.e1) (its experts among them, renamed to the layout's
// names), decoded with the rank's options; c.decoded is the ranks' reassembled chunk (tensor
// parallel: tp_canonical_merge; expert parallel: each expert from its owner).
void decode_rank_chunks(const LayerRun& run, const LayerJob& job, PreparedChunk& c) {
  const Parallelism& par = *job.par;
  const int64_t E = job.ml->experts;
  const int ranks = par.ranks();
  c.rank_params.resize(static_cast<size_t>(ranks));
  c.rank_decoded.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const int64_t local = par.local_experts(E, r);
    const int64_t b = par.local_before(E, r, c.e0), e = par.local_before(E, r, c.e1);
    if (e == b) continue;  // expert parallel: none of this rank's experts in the chunk
    TensorMap named;
    {
      StageTimer t(&run.clock->read_ns);
      named = param_chunk(job.rank_views[static_cast<size_t>(r)], local, b, e, run.within_chunk());
    }
    TensorMap& mine = c.rank_params[static_cast<size_t>(r)];
    for (auto& [key, t] : named) {
      t.name = rank_tensor_name(key);
      mine.emplace(t.name, std::move(t));
    }
    StageTimer t(&run.clock->decode_ns);
    c.rank_decoded[static_cast<size_t>(r)] =
        run.layout->unpack(job.rank_lo[static_cast<size_t>(r)], mine);
  }
  if (par.tensor > 1) {
    c.decoded = tp_canonical_merge(c.rank_decoded, job.lo.gated);
    return;
  }
  // Expert parallel: global expert g of the chunk from its owner's decoding.
  std::vector<QuantTensor*> outs = {&c.decoded.w13, &c.decoded.w2};
  for (int proj = 0; proj < 2; ++proj) {
    std::vector<std::pair<size_t, int64_t>> where;  // (part, index) per global expert
    for (int64_t g = c.e0; g < c.e1; ++g) {
      const auto [owner, local] = par.expert_owner(E, g);
      where.push_back({static_cast<size_t>(owner), local - par.local_before(E, owner, c.e0)});
    }
    std::vector<QuantTensor> singles;
    for (const auto& [owner, index] : where) {
      const MoeExperts& d = c.rank_decoded[owner];
      singles.push_back(select_experts(proj == 0 ? d.w13 : d.w2, {index}));
    }
    *outs[static_cast<size_t>(proj)] = concat_experts(singles);
  }
}

// The source's experts [range.begin, range.end) of a layer, loaded and done with: their mapped
// pages dropped (core/memory.h), so the source held follows the chunks, not the layer (a fused
// family's layer is one tensor per parameter, every expert in it: gpt-oss' gate_up_proj_blocks
// [E, 2I, H/32, 16] is 1 GB a layer at gpt-oss-120b's shape). Per-expert families drop the
// range's experts' tensors, fused ones the range's rows of each tensor that leads with the
// experts (the rest when the layer is done, release_source_layer).
void release_source_experts(const Checkpoint& src, const MoeLayer& L, const ExpertRange& range) {
  const int64_t E = L.num_experts, end = range.end < 0 ? E : range.end;
  const auto release = [&src](const std::string& name, int64_t e0, int64_t e1, int64_t experts) {
    if (!src.has_tensor(name) || !src.shard(src.shard_of(name)).mapped()) return;
    const TensorView v = src.view(name);
    if (experts > 1 && (v.shape.empty() || v.shape[0] != experts)) return;
    const uint64_t per = v.nbytes / static_cast<uint64_t>(experts);
    release_mapped(v.data + per * static_cast<uint64_t>(e0), per * static_cast<uint64_t>(e1 - e0));
  };
  for (int64_t e = range.begin; e < end && static_cast<size_t>(e) < L.experts.size(); ++e)
    for (const auto& proj : L.experts[static_cast<size_t>(e)])
      for (const auto& [suffix, name] : proj) release(name, 0, 1, 1);
  for (const auto* fused : {&L.fused_gate_up, &L.fused_down})
    for (const auto& [suffix, name] : *fused) release(name, range.begin, end, E);
}

// Errors reading the source propagate (input errors); a layout that does not decode is
// `failure`.
PreparedChunk prepare_chunk(const LayerRun& run, const LayerJob& job, int64_t e0, int64_t e1) {
  PreparedChunk c;
  c.e0 = e0;
  c.e1 = e1;
  const int64_t E = job.ml->experts, layer_no = job.ml->layer;
  try {
    if (job.par) {
      decode_rank_chunks(run, job, c);
    } else {
      {
        StageTimer t(&run.clock->read_ns);
        c.params = param_chunk(job.views, E, e0, e1, run.within_chunk(),
                               job.staged_direct.empty() ? nullptr : &job.staged_direct,
                               run.stand_ins, &c.mapped);
      }
      StageTimer t(&run.clock->decode_ns);
      c.decoded = job.device_codes ? unpack_marlin_moe_without_codes(job.lo, c.params)
                                   : run.layout->unpack(job.lo, c.params);
    }
  } catch (const Error& e) {
    c.failure = e;
    return c;
  }
  if (!job.src_layer) return c;
  StageTimer timer(&run.clock->decode_ns);
  ExpertRange range;
  range.begin = e0;
  range.end = e1;
  if (run.recipe) {
    const DenseExperts d = load_dense_experts(*run.src, *job.src_layer, range);
    c.source.w13 =
        run.recipe->quantize(d.w13.data(), d.experts, d.gated ? 2 * d.inter : d.inter, d.hidden);
    c.source.w2 = run.recipe->quantize(d.w2.data(), d.experts, d.hidden, d.inter);
  } else {
    c.source = load_moe_experts(*run.src, *job.src_layer, run.within_chunk(), range);
  }
  release_source_experts(*run.src, *job.src_layer, range);
  c.has_source = true;
  // What vLLM's MoE method serves where it changes the source's values before the layout's
  // transform (per-tensor FP8: w13 requantised to one scale per expert): the reference is that.
  if (run.layout->vllm_loaded) {
    MoeExperts served = run.layout->vllm_loaded(job.lo, c.source);
    c.vllm_changed = served.w13.codes != c.source.w13.codes || served.w2.codes != c.source.w2.codes;
    c.source = std::move(served);
  }
  if (job.par) {
    // Every rank's bytes exactly: its decoding against its share of the source (vLLM 0.33's
    // split of the source chunk for tensor parallel, its experts for expert parallel).
    for (size_t r = 0; r < c.rank_decoded.size(); ++r) {
      const MoeExperts want = rank_share_of(*run.layout, *job.par, job.lo.gated, job.ml->experts,
                                            c.source, static_cast<int>(r), e0, e1);
      if (want.w13.experts == 0 && c.rank_params[r].empty()) continue;  // none of its experts
      const std::string rank = rank_dir_name(static_cast<int>(r), job.par->ranks()) + " ";
      c.checks.push_back(compare_quant(layer_no, rank + "w13", c.rank_decoded[r].w13, want.w13,
                                       job.par->tensor > 1 ? e0 : 0));
      c.checks.push_back(compare_quant(layer_no, rank + "w2", c.rank_decoded[r].w2, want.w2,
                                       job.par->tensor > 1 ? e0 : 0));
    }
  } else {
    c.checks.push_back(compare_quant(layer_no, "w13", c.decoded.w13, c.source.w13, e0));
    c.checks.push_back(compare_quant(layer_no, "w2", c.decoded.w2, c.source.w2, e0));
    c.checks.push_back(compare_biases(layer_no, c.decoded, c.source, e0));
  }
  // The served model computes with scales in the layout's dtype (vLLM's loader rounds an
  // fp16 checkpoint's scales to bf16 for bf16 serving); the reference does the same, so
  // the tolerance measures layout faithfulness, not that rounding.
  for (auto* pair : {&c.source.w13, &c.source.w2}) {
    const QuantTensor& d = pair == &c.source.w13 ? c.decoded.w13 : c.decoded.w2;
    if (pair->scale_dtype != d.scale_dtype) {
      if (c.rounded_from.empty()) {
        c.rounded_from = dtype_name(pair->scale_dtype);
        c.rounded_to = dtype_name(d.scale_dtype);
      }
      pair->scales = scales_as(*pair, d.scale_dtype);
      pair->scale_dtype = d.scale_dtype;
    }
  }
  return c;
}

void note_rounding(LayerRun& run, const PreparedChunk& c) {
  if (c.vllm_changed && !run.requant_note) {
    run.report->notes.push_back(
        "vLLM requantises the source's w13 to one scale per expert (per-tensor FP8: "
        "process_fp8_weight_tensor_strategy_moe); the reference uses the same codes");
    run.requant_note = true;
  }
  if (c.rounded_from.empty() || run.rounded_note) return;
  run.report->notes.push_back("source scales " + c.rounded_from + " are served as " + c.rounded_to +
                              "; the reference uses the same rounding");
  run.rounded_note = true;
}

std::string experts_label(const std::string& stage, int64_t e0, int64_t e1) {
  return stage + " (experts " + std::to_string(e0) + ".." + std::to_string(e1 - 1) + ")";
}

// One chunk of one layer, in the order the layers' loops take them.
struct ChunkItem {
  size_t layer;
  int64_t e0, e1;
};

// How many threads hash the converted parameters beside the layer loop: five eighths of them, at
// most 12. SHA-256 is the largest CPU cost of verify: on the H100 host's Xeon the SHA extensions
// hash 0.9 GB/s a core (two messages at once no faster there), so a 9.75 GB model is ~11 busy-s;
// with half of 16 threads hashing, the hashers were the critical path (the loop waited for them
// at the end) while the workers waited for free chunk stages (2026-11-26, bench/RESULTS.md).
int hashing_threads(int threads) {
  return std::clamp(threads * 5 / 8, 1, 12);
}

// How many threads prepare chunks ahead of the layer loop (read, decode, compare with the
// source; on the device path also stage them into pinned memory): every thread the hashers
// (TensorHasher) and the loop leave, at least 1 and at most 16. The loop itself only takes the
// prepared chunks (the device path: it issues the copies up and the kernels), so it gets no
// core of its own beyond its one thread.
int pipeline_workers(int threads) {
  return std::clamp(threads - hashing_threads(threads) - 1, 1, 16);
}

// Into how many chunks a chunk of the rule is split for `workers` workers: one each, and at
// most 8, so that a chunk of a 128-expert layer keeps at least 4 experts (the device's kernels
// run a chunk's experts at once) while the chunks in flight (workers + 2) hold at most about two
// chunks of the rule.
int chunk_shares(int workers) {
  return std::clamp(workers, 1, 8);
}

// Every layer's job first (views only, no bytes; a layer whose job fails gets its error and no
// chunks), then the chunk list across layers. With `workers` threads preparing chunks each chunk
// holds 1 / chunk_shares(workers) of the chunk rule's experts, so that the chunks in flight
// (workers + 2) hold about what one chunk of the rule holds, and at most what two hold (one
// worker; 16 workers: 18 / 8).
std::vector<ChunkItem> plan_chunks(const LayerRun& run, int workers, std::vector<LayerJob>* jobs,
                                   std::vector<std::optional<Error>>* job_error) {
  const std::vector<ManifestLayer>& layers = run.manifest->layers;
  jobs->assign(layers.size(), LayerJob{});
  job_error->assign(layers.size(), std::nullopt);
  std::vector<ChunkItem> items;
  for (size_t i = 0; i < layers.size(); ++i) {
    LayerJob& job = (*jobs)[i];
    try {
      job = make_layer_job(run, layers[i]);
    } catch (const Error& e) {
      (*job_error)[i] = e;
      continue;
    }
    job.chunk = std::max<int64_t>(1, job.chunk / chunk_shares(workers));
    for (const TensorView& v : job.views) run.hasher->track(v, true, i);
    for (const auto& views : job.rank_views)
      for (const TensorView& v : views) run.hasher->track(v, true, i);
    for (int64_t e0 = 0; e0 < layers[i].experts; e0 += job.chunk)
      items.push_back({i, e0, std::min(layers[i].experts, e0 + job.chunk)});
  }
  // The other tensors (embeddings, attention, norms, the router, what a layer failed to take)
  // with the first layer: hashed while the first chunks are prepared and the device starts, not
  // after the last layer (H100, 9.75 GB model: their 1.2 GB took 0.27 s of a 2.0 s run there).
  for (const auto& [name, shard] : run.out->where)
    run.hasher->track(run.out->view(name), run.out->shards.at(shard).mapped(), 0);
  return items;
}

// The source's tensors of a layer, done with: their mapped pages dropped (core/memory.h).
void release_source_layer(const Checkpoint& src, const MoeLayer& L) {
  for (const std::string& name : L.source_tensors) {
    if (!src.has_tensor(name) || !src.shard(src.shard_of(name)).mapped()) continue;
    const TensorView v = src.view(name);
    release_mapped(v.data, v.nbytes);
  }
}

// The chunks of a run, prepared ahead of their use by `workers` threads: each takes the next
// chunk in the loop's order (layer after layer, experts in order) and prepares it while the
// others prepare the following ones, at most `workers + 2` chunks taken and not yet used (being
// prepared or ready: every worker busy and two ready), so a layer's chunks are prepared by every
// worker at once and what is held is bounded by the chunk rule, not the model. The consumer takes a
// layer's chunks in order. After a chunk that failed (a decode failure or an error) no later chunk
// of its layer is started (the loops never read past it); chunks of a layer the consumer is done
// with are dropped. With no worker (the CPU MoE path, whose evaluation takes every thread; or no
// thread could start) each chunk is prepared when the loop asks for it.
class ChunkPipeline {
 public:
  // What the worker that prepared a chunk does next with it (--device cuda: stage it), unless
  // it failed to decode; errors it throws are the chunk's (rethrown by next()).
  using StageFn = std::function<void(const LayerJob&, PreparedChunk&)>;

  ChunkPipeline(const LayerRun& run, const std::vector<LayerJob>& jobs,
                const std::vector<ChunkItem>& items, int workers, StageFn stage = {})
      : run_(run),
        jobs_(jobs),
        stage_(std::move(stage)),
        items_(items),
        slots_(items.size()),
        window_(static_cast<size_t>(std::max(0, workers)) + 2),
        range_(jobs.size(), {items.size(), items.size()}),
        cursor_(jobs.size(), 0),
        closed_(jobs.size(), 0),
        finished_(jobs.size(), 0) {
    for (size_t i = 0; i < items.size(); ++i) {
      auto& r = range_[items[i].layer];
      if (r.first == items.size()) r.first = i;
      r.second = i + 1;
    }
    for (size_t l = 0; l < jobs.size(); ++l) cursor_[l] = range_[l].first;
    for (int w = 0; w < workers; ++w) {
      try {
        threads_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        break;  // fewer workers (a process at its limits); none: prepared by next()
      }
    }
  }
  ~ChunkPipeline() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  // How many chunks layer `layer` has.
  size_t chunks(size_t layer) const { return range_[layer].second - range_[layer].first; }

  // The next chunk of `layer` (the layers are taken in order); rethrows what preparing it threw.
  PreparedChunk next(size_t layer) {
    StageTimer waiting(&run_.clock->wait_ns);
    const size_t i = cursor_[layer]++;
    if (i >= range_[layer].second)
      throw Error(ErrorCode::kInternal, "", "verify", "chunk pipeline: no chunk left");
    if (threads_.empty()) return prepared(layer, i);
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock,
             [&] { return slots_[i].state == State::kReady || slots_[i].state == State::kDone; });
    if (slots_[i].state != State::kReady)
      throw Error(ErrorCode::kInternal, "", "verify", "chunk pipeline: chunk dropped");
    Slot taken = std::move(slots_[i]);
    slots_[i] = Slot{};
    slots_[i].state = State::kDone;
    --held_;
    lock.unlock();
    cv_.notify_all();
    if (taken.error) std::rethrow_exception(taken.error);
    return std::move(taken.chunk);
  }

  // The consumer is done with `layer` (every chunk taken, or the rest dropped): what is prepared
  // of it is dropped, nothing more of it is started, and the source's pages of it are dropped.
  void finish_layer(size_t layer) {
    {
      std::lock_guard<std::mutex> lock(m_);
      finished_[layer] = closed_[layer] = 1;
      for (size_t i = range_[layer].first; i < range_[layer].second; ++i)
        if (slots_[i].state == State::kReady) {
          slots_[i] = Slot{};
          slots_[i].state = State::kDone;
          --held_;
        }
    }
    cv_.notify_all();
    const LayerJob& job = jobs_[layer];
    if (run_.src && job.src_layer) release_source_layer(*run_.src, *job.src_layer);
  }

 private:
  enum class State { kTodo, kBusy, kReady, kDone };
  struct Slot {
    State state = State::kTodo;
    PreparedChunk chunk;
    std::exception_ptr error;
  };

  void work() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || take_ >= items_.size() || held_ < window_; });
      if (stop_ || take_ >= items_.size()) return;
      const size_t i = take_++;
      const size_t layer = items_[i].layer;
      if (closed_[layer]) {
        slots_[i].state = State::kDone;
        cv_.notify_all();
        continue;
      }
      slots_[i].state = State::kBusy;
      ++held_;
      lock.unlock();
      Slot done;
      try {
        done.chunk = prepared(layer, i);
      } catch (...) {
        done.error = std::current_exception();
      }
      lock.lock();
      if (done.error || done.chunk.failure || done.chunk.stage_failure) closed_[layer] = 1;
      if (finished_[layer]) {
        slots_[i].state = State::kDone;
        --held_;
      } else {
        done.state = State::kReady;
        slots_[i] = std::move(done);
      }
      cv_.notify_all();
    }
  }

  // Item i of `layer` prepared and, unless it failed to decode, staged.
  PreparedChunk prepared(size_t layer, size_t i) const {
    PreparedChunk c = prepare_chunk(run_, jobs_[layer], items_[i].e0, items_[i].e1);
    if (stage_ && !c.failure) stage_(jobs_[layer], c);
    return c;
  }

  const LayerRun& run_;
  const std::vector<LayerJob>& jobs_;
  const StageFn stage_;
  const std::vector<ChunkItem> items_;
  std::vector<Slot> slots_;
  const size_t window_;
  std::vector<std::pair<size_t, size_t>> range_;  // per layer: its items [first, second)
  std::vector<size_t> cursor_;                    // per layer: the next item the consumer takes
  // Per layer: no chunk of it is started any more (a chunk failed, or the consumer is done with
  // it); the consumer is done with it.
  std::vector<char> closed_, finished_;
  std::mutex m_;
  std::condition_variable cv_;
  size_t take_ = 0, held_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// A parallel output's MoE as its ranks compute it, through each rank's readers of the chunk:
// tensor parallel, w13's output is every rank's [gate_r; up_r] put back in place and w2's is the
// sum over ranks of each rank's partial output on its I / tp columns (what vLLM's all-reduce
// adds, in rank order); expert parallel, each expert on the rank that owns it.
ref::ExpertMatmulFn rank_matmul(const LayerRun& run, const LayerJob& job, const PreparedChunk& c) {
  const Parallelism par = *job.par;
  const int64_t E = job.ml->experts, e0 = c.e0, I = job.ml->inter;
  const int64_t shards = job.lo.gated ? 2 : 1, H = job.ml->hidden;
  std::vector<std::pair<reader::ProjReader, reader::ProjReader>> readers(c.rank_params.size());
  std::vector<int64_t> first(c.rank_params.size(), 0);
  for (size_t r = 0; r < c.rank_params.size(); ++r) {
    if (c.rank_params[r].empty()) continue;
    const LayoutOptions& lo = job.rank_lo[r];
    readers[r] = {run.layout->make_reader(lo, c.rank_params[r], MoeProj::kW13, host_param),
                  run.layout->make_reader(lo, c.rank_params[r], MoeProj::kW2, host_param)};
    first[r] = par.local_before(E, static_cast<int>(r), e0);
  }
  return [=](int e, MoeProj p, const float* x, int64_t m, float* y) {
    if (par.tensor == 1) {
      const auto [owner, local] = par.expert_owner(E, e);
      const auto& rd = readers[static_cast<size_t>(owner)];
      reader_expert_matmul(p == MoeProj::kW13 ? rd.first : rd.second,
                           local - first[static_cast<size_t>(owner)], x, m, y);
      return;
    }
    const int64_t ip = I / par.tensor;
    if (p == MoeProj::kW13) {
      std::vector<float> part(static_cast<size_t>(m * shards * ip));
      for (int r = 0; r < par.tensor; ++r) {
        reader_expert_matmul(readers[static_cast<size_t>(r)].first, e - e0, x, m, part.data());
        for (int64_t t = 0; t < m; ++t)
          for (int64_t s = 0; s < shards; ++s)
            std::copy_n(part.data() + t * shards * ip + s * ip, ip,
                        y + t * shards * I + s * I + r * ip);
      }
      return;
    }
    std::fill(y, y + m * H, 0.0f);
    std::vector<float> xr(static_cast<size_t>(m * ip)), part(static_cast<size_t>(m * H));
    for (int r = 0; r < par.tensor; ++r) {
      for (int64_t t = 0; t < m; ++t) std::copy_n(x + t * I + r * ip, ip, xr.data() + t * ip);
      reader_expert_matmul(readers[static_cast<size_t>(r)].second, e - e0, xr.data(), m,
                           part.data());
      for (int64_t i = 0; i < m * H; ++i) y[i] += part[static_cast<size_t>(i)];
    }
  };
}

// The CPU path: each chunk read and hashed, decoded and compared (ChunkPipeline, in turn) and
// evaluated (verify/moe_reference).
void verify_layers_cpu(LayerRun& run) {
  VerifyReport& r = *run.report;
  std::vector<LayerJob> jobs;
  std::vector<std::optional<Error>> job_error;
  // One chunk at a time, prepared when it is needed: the MoE evaluation takes every thread, on
  // whole chunks of experts, and reading ahead would only hold a second chunk.
  const std::vector<ChunkItem> items = plan_chunks(run, 1, &jobs, &job_error);
  run.hasher->start(hashing_threads(run.threads), &run.clock->read_ns);
  ChunkPipeline chunks(run, jobs, items, 0);
  run.report->timing.lanes = 1;  // the loop prepares its chunks itself
  for (const ManifestLayer& ml : run.manifest->layers) {
    const size_t li = static_cast<size_t>(&ml - run.manifest->layers.data());
    run.progress(li, 0);
    run.hasher->reached(li);
    LayerJob& job = jobs[li];
    std::unique_ptr<ref::ChunkedMoeLayerCheck> numeric;
    try {
      if (job_error[li]) throw *job_error[li];
      load_layer_inputs(run, &job);
      job.spec.validate();
      ref::check_router_shapes(job.spec, run.router, job.router.weight, job.router.bias);
      ref::LayerRouting lr =
          ref::route_layer(run.router, job.x.data(), run.opts->tokens, job.spec.hidden, job.router);
      job.expert_x = std::move(lr.expert_input);
      numeric = std::make_unique<ref::ChunkedMoeLayerCheck>(job.spec, std::move(lr.routing),
                                                            job.expert_x.data());
    } catch (const Error& e) {
      run.broken(ml, "parameters", e);
      chunks.finish_layer(li);
      continue;
    }
    LayerRoundTrip round_trip;
    bool ok = true;
    for (size_t i = 0, n = chunks.chunks(li); ok && i < n; ++i) {
      const PreparedChunk c = chunks.next(li);
      const int64_t e0 = c.e0, e1 = c.e1;
      if (c.failure) {
        run.broken(ml, experts_label("decode", e0, e1), *c.failure);
        ok = false;
        break;
      }
      for (const auto& checks : c.checks) round_trip.add(checks);
      note_rounding(run, c);
      StageTimer evaluating(&run.clock->evaluate_ns);
      const MoeExperts& reference = c.reference();
      // The numerical check of this chunk's experts: the real router on random hidden states.
      auto weights = [&](int64_t e, MoeProj p) {
        return dequantize_expert(p == MoeProj::kW13 ? reference.w13 : reference.w2, e - e0);
      };
      const ref::ChunkBiases biases = chunk_biases(c);
      try {
        // The layout's readers over this chunk, built once (each validates the whole chunk).
        if (job.par) {
          numeric->evaluate(e0, e1, weights, rank_matmul(run, job, c), &biases);
          continue;
        }
        const reader::ProjReader w13 =
            run.layout->make_reader(job.lo, c.params, MoeProj::kW13, host_param);
        const reader::ProjReader w2 =
            run.layout->make_reader(job.lo, c.params, MoeProj::kW2, host_param);
        numeric->evaluate(e0, e1, weights, ref::reader_matmul(w13, w2, e0), &biases);
        run.progress(li, e1);
      } catch (const Error& e) {
        run.broken(ml, experts_label("evaluation", e0, e1), e);
        ok = false;
      }
    }
    chunks.finish_layer(li);
    round_trip.report(r);
    if (!ok) continue;
    const ref::MoeLayerCheck check = numeric->finish();
    r.layers.push_back(make_layer_result(ml.layer, run.manifest->backend, run.opts->tokens,
                                         run.router.top_k, check.comparison, run.opts->tolerance));
  }
}

// --skip-numerical: each chunk decoded and (with a source) compared exactly; no MoE computed.
void verify_layers_round_trip(LayerRun& run) {
  std::vector<LayerJob> jobs;
  std::vector<std::optional<Error>> job_error;
  const int workers = pipeline_workers(run.threads);
  run.chunk_threads = std::max(1, run.threads / workers);
  const std::vector<ChunkItem> items = plan_chunks(run, workers, &jobs, &job_error);
  run.hasher->start(hashing_threads(run.threads), &run.clock->read_ns);
  ChunkPipeline chunks(run, jobs, items, workers);
  run.report->timing.lanes = workers;
  for (size_t li = 0; li < run.manifest->layers.size(); ++li) {
    const ManifestLayer& ml = run.manifest->layers[li];
    run.progress(li, 0);
    run.hasher->reached(li);
    if (job_error[li]) {
      run.broken(ml, "parameters", *job_error[li]);
      chunks.finish_layer(li);
      continue;
    }
    LayerRoundTrip round_trip;
    for (size_t i = 0, n = chunks.chunks(li); i < n; ++i) {
      const PreparedChunk c = chunks.next(li);
      if (c.failure) {
        run.broken(ml, experts_label("decode", c.e0, c.e1), *c.failure);
        break;
      }
      for (const auto& checks : c.checks) round_trip.add(checks);
      run.progress(li, c.e1);
    }
    chunks.finish_layer(li);
    round_trip.report(*run.report);
  }
}

// The layers' routers and hidden states (load_layer_inputs) loaded a layer ahead of the CUDA
// loop, on a thread of their own while the loop runs the layer before: drawing the hidden states
// is host work the device would otherwise wait for at every layer's start (H100 host, 64 tokens
// of H=2048: ~4 ms of a ~42 ms layer). take(li) waits for layer li's inputs (loading them itself
// where no thread had them) and rethrows what loading them threw, then starts layer li + 1's.
class LayerInputsAhead {
 public:
  LayerInputsAhead(const LayerRun& run, std::vector<LayerJob>& jobs,
                   const std::vector<std::optional<Error>>& job_error)
      : run_(run), jobs_(jobs), job_error_(job_error) {}
  ~LayerInputsAhead() {
    if (pending_.valid()) pending_.wait();  // the thread writes into jobs_
  }
  LayerInputsAhead(const LayerInputsAhead&) = delete;
  LayerInputsAhead& operator=(const LayerInputsAhead&) = delete;

  // Layer li's inputs loaded on a thread (nothing for a layer past the end or whose job failed).
  void start(size_t li) {
    if (li >= jobs_.size() || job_error_[li] || pending_.valid()) return;
    LayerJob* job = &jobs_[li];
    try {
      pending_ = std::async(std::launch::async, [this, job] { load_layer_inputs(run_, job); });
      pending_layer_ = li;
    } catch (const std::system_error&) {
      // no thread to spare: take() loads it
    }
  }
  void take(size_t li) {
    std::future<void> mine;
    if (pending_.valid() && pending_layer_ == li) mine = std::move(pending_);
    start(li + 1);
    if (mine.valid())
      mine.get();
    else
      load_layer_inputs(run_, &jobs_[li]);
  }

 private:
  const LayerRun& run_;
  std::vector<LayerJob>& jobs_;
  const std::vector<std::optional<Error>>& job_error_;
  std::future<void> pending_;
  size_t pending_layer_ = 0;
};

// The layer's router and hidden states (loaded: LayerInputsAhead), checked, and the device's
// routing of them (begins the layer on the device). Throws Error: a misshapen router is the layer
// failing; kNoCuda and kInternal are the device's.
MoeDeviceRouting begin_device_layer(const LayerRun& run, MoeRuntime& rt, LayerJob& job) {
  job.spec.validate();
  ref::check_router_shapes(job.spec, run.router, job.router.weight, job.router.bias);
  run.router.validate();
  if (run.router.has_correction_bias &&
      job.router.correction_bias.size() != static_cast<size_t>(run.router.num_experts))
    throw Error(ErrorCode::kMissingTensor, "", "e_score_correction_bias",
                "router needs a correction bias of " + std::to_string(run.router.num_experts) +
                    " values, got " + std::to_string(job.router.correction_bias.size()));
  const ManifestLayer& ml = *job.ml;
  MoeLayerSpec spec;
  spec.experts = ml.experts;
  spec.hidden = ml.hidden;
  spec.inter = ml.inter;
  spec.gated = job.spec.gated;
  spec.activation = static_cast<int>(job.spec.activation);
  if (!ref::device_routable(run.router)) {
    // A router the device's kernels do not compute (sparsemixer, Gemma-4's input and scales,
    // Llama-4's weighted input): routed on the host (route_layer), the routing uploaded.
    ref::LayerRouting lr =
        ref::route_layer(run.router, job.x.data(), run.opts->tokens, ml.hidden, job.router);
    job.expert_x = std::move(lr.expert_input);
    MoeDeviceRouting given;
    given.tokens = lr.routing.tokens;
    given.top_k = lr.routing.top_k;
    given.expert_ids = std::move(lr.routing.expert_ids);
    given.weights = std::move(lr.routing.weights);
    return rt.begin_layer_routed(spec, run.router.num_experts, given, job.expert_x.data());
  }
  const ref::RouterTensors& t = job.router;
  return rt.begin_layer(spec, ref::runtime_router_spec(run.router), job.x.data(), run.opts->tokens,
                        t.weight.data(), t.bias.empty() ? nullptr : t.bias.data(),
                        t.correction_bias.empty() ? nullptr : t.correction_bias.data());
}

// --device cuda: the runtime (CUDA context, streams, the pool of chunk stages) made on a thread of
// its own from verify's start, while the checkpoint is opened, the integrity checks run and the
// chunk workers read and decode the first chunks. runtime() waits for it and rethrows what
// making it threw (kNoCuda); the destructor waits for the thread.
constexpr const char* kNoCudaDevice =
    "--device cuda: no CUDA device (or moepack was built without CUDA)";

class DeviceStartup {
 public:
  using Clock = std::chrono::steady_clock;
  DeviceStartup(int stage_slots, Clock::time_point verify_start)
      : verify_start_(verify_start),
        available_(found_.get_future().share()),
        ready_(made_.get_future().share()) {
    try {
      thread_ = std::thread([this, stage_slots] { make(stage_slots); });
    } catch (const std::system_error&) {
      make(stage_slots);  // no thread to spare: made here
    }
  }
  ~DeviceStartup() {
    if (thread_.joinable()) thread_.join();
  }
  DeviceStartup(const DeviceStartup&) = delete;
  DeviceStartup& operator=(const DeviceStartup&) = delete;

  MoeRuntime& runtime() const { return *ready_.get(); }
  // Whether a CUDA device is there (cuda_device_info on the startup thread).
  bool available() const { return available_.get(); }
  // For the chunk workers (each waits on its own copy).
  std::shared_future<MoeRuntime*> ready() const { return ready_; }
  // The loop launches the first chunk's kernels now (the first call counts).
  void launching() {
    if (first_launch_ < 0) first_launch_ = seconds_since(verify_start_);
  }
  // After runtime(): making it took `make_seconds`, ready `ready_at` seconds after verify began;
  // the first chunk's kernels were launched `first_launch` seconds after it began (< 0: none).
  double make_seconds() const { return make_seconds_; }
  double ready_at() const { return ready_at_; }
  double first_launch() const { return first_launch_; }

 private:
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  void make(int stage_slots) {
    const Clock::time_point t0 = Clock::now();
    const bool available = cuda_device_info().available;
    found_.set_value(available);
    try {
      if (!available) throw Error(ErrorCode::kNoCuda, kNoCudaDevice);
      runtime_ = std::make_unique<MoeRuntime>();
      runtime_->make_stages(stage_slots);
      make_seconds_ = seconds_since(t0);
      ready_at_ = seconds_since(verify_start_);
      made_.set_value(runtime_.get());
    } catch (...) {
      made_.set_exception(std::current_exception());
    }
  }

  const Clock::time_point verify_start_;
  std::promise<bool> found_;
  std::shared_future<bool> available_;
  std::promise<MoeRuntime*> made_;
  std::shared_future<MoeRuntime*> ready_;
  std::unique_ptr<MoeRuntime> runtime_;
  double make_seconds_ = 0, ready_at_ = 0, first_launch_ = -1;
  std::thread thread_;  // last: started once everything it uses is constructed
};

// How many chunk stages the CUDA path's pool holds: one per chunk the pipeline may hold at once
// (`workers` preparing, two ready) and the one the loop evaluates, so a worker never waits for a
// slot that no one will give back (ChunkPipeline, stage_device_chunk).
int device_stage_slots(int workers) {
  return workers + 3;
}

// Chunk c on its way to the device, on the worker that prepared it: a slot of the runtime's
// pinned staging taken (acquire_stage: the kernels that read it last have finished), the layout's
// readers built over it (make_reader's locator copies each parameter into the slot: a stand-in's
// bytes from the mapped shard, LayerJob::staged_direct) and the
// reference's canonical readers beside them (its codes of <= 4 bits packed two per byte into the
// slot, half the canonical bytes), the expert biases (gpt-oss) of both sides after them. The loop
// thread then only issues the slot's copy up and the kernels (MoeRuntime::run_staged_chunk). The
// chunk's host bytes are dropped here, on the worker: the device reads the slot. What building
// the readers throws is c.stage_failure, handled by the loop where evaluating fails.
// The reference's codes of one projection where unpack left them empty
// (unpack_marlin_moe_without_codes: a Marlin row, no padded I cropped), decoded on the device from
// the layout's qweight already in the stage (`located`: each staged parameter's device address by
// name) through the code map (formats/marlin.h marlin_code_map), act-order columns through the
// inverse of the sort indices unpack validated. Null where unpack held the codes (the host packs
// them, as for every other row).
const uint8_t* device_reference_codes(const LayoutOptions& lo, const PreparedChunk& c, MoeProj proj,
                                      const QuantTensor& q, MoeChunkStage& st,
                                      const std::map<std::string, const void*>& located) {
  if (!q.codes.empty() || q.experts * q.n * q.k == 0) return nullptr;
  const MarlinParamNames names = marlin_param_names(lo.source_method, proj);
  const std::string qname = lo.prefix + names.qweight;
  const auto at = located.find(qname);
  if (at == located.end())
    throw Error(ErrorCode::kInternal, "", qname, "the reference's codes: qweight not staged");
  std::vector<int32_t> inverse;
  if (!q.g_idx.empty()) {
    const std::string sname = lo.prefix + names.sort_indices;
    const Tensor& sort = require_tensor(c.params, sname);
    const int64_t K = q.k, count = q.experts * q.k;
    if (static_cast<int64_t>(sort.data.size()) != count * 4)
      throw Error(ErrorCode::kInternal, "", sname, "sort indices do not match the codes");
    inverse.assign(static_cast<size_t>(count), -1);
    const int32_t* s = sort.as<int32_t>();
    for (int64_t e = 0; e < q.experts; ++e)
      for (int64_t k = 0; k < K; ++k) {
        const int32_t j = s[e * K + k];  // a permutation: unpack checked it (read_sort)
        if (j < 0 || j >= K)
          throw Error(ErrorCode::kInternal, "", sname, "sort index outside [0, K)");
        inverse[static_cast<size_t>(e * K + j)] = static_cast<int32_t>(k);
      }
  }
  const MarlinCodeMap map = marlin_code_map(q.bits, lo.a8);
  MarlinCodeDecode d;
  d.qweight = at->second;
  d.experts = q.experts;
  d.n = q.n;
  d.k = q.k;
  d.map = &map;
  d.inverse_sort = inverse.empty() ? nullptr : inverse.data();
  return st.decode_marlin_codes(d);
}

void stage_device_chunk(const LayerRun& run, MoeRuntime& rt, const LayerJob& job,
                        PreparedChunk& c) {
  StageTimer staging(&run.clock->stage_ns);
  try {
    auto d = std::make_unique<DeviceChunk>();
    d->stage = rt.acquire_stage();
    MoeChunkStage& st = d->stage;
    std::map<std::string, const void*> located;  // each staged parameter's device address
    // A stand-in's bytes come from the mapping (one copy: mapped page cache -> pinned slot),
    // whose pages are dropped after as param_chunk drops those it copies.
    const ParamLocator locate_param = [&st, &located, &c](const std::string& name,
                                                          const Tensor& t) {
      const auto direct = c.mapped.find(name);
      const uint8_t* from = direct == c.mapped.end() ? t.data.data() : direct->second;
      const void* at = st.upload(from, t.data.size());
      if (direct != c.mapped.end()) release_mapped(from, t.data.size());
      located[name] = at;
      return at;
    };
    const BufferLocator locate_buffer = [&st](const void* p, size_t bytes) {
      return st.upload(p, bytes);
    };
    d->w13 = run.layout->make_reader(job.lo, c.params, MoeProj::kW13, locate_param);
    d->w2 = run.layout->make_reader(job.lo, c.params, MoeProj::kW2, locate_param);
    const MoeExperts& reference = c.reference();
    const auto packed = [&st](const QuantTensor& q) -> NibbleLocator {
      const bool signed_codes = q.kind == CodeKind::kInt;
      return [&st, signed_codes](const uint8_t* codes, size_t count) {
        return st.upload_nibbles(codes, count, signed_codes);
      };
    };
    // The reference quantises activations as the layout's readers do (NVFP4's activation scale).
    // Codes unpack left to the device (job.device_codes) are decoded there, after the copy up.
    d->ref_w13 = make_reference_reader(
        d->w13, reference.w13, locate_buffer, packed(reference.w13),
        device_reference_codes(job.lo, c, MoeProj::kW13, reference.w13, st, located));
    d->ref_w2 = make_reference_reader(
        d->w2, reference.w2, locate_buffer, packed(reference.w2),
        device_reference_codes(job.lo, c, MoeProj::kW2, reference.w2, st, located));
    // Expert biases (gpt-oss), each side's, as the CPU path adds them (ref::ChunkBiases).
    const ref::ChunkBiases biases = chunk_biases(c);
    ref::check_chunk_biases(job.spec, c.e0, c.e1, biases);
    const auto up = [&st](const std::vector<float>& v) -> const float* {
      return v.empty() ? nullptr : static_cast<const float*>(st.upload(v.data(), v.size() * 4));
    };
    d->biases = {up(biases.got_w13), up(biases.got_w2)};
    d->ref_biases = {up(biases.ref_w13), up(biases.ref_w2)};
    c.device = std::move(d);
  } catch (const Error& e) {
    c.stage_failure = e;
  }
  for (const auto& [name, from] : c.mapped) {
    const auto t = c.params.find(name);
    if (t != c.params.end()) run.stand_ins->give(std::move(t->second.data));
  }
  c.params = TensorMap{};
  c.mapped.clear();
  c.decoded = MoeExperts{};
  c.source = MoeExperts{};
}

// The chunk's staged kernels launched (the loop thread): rethrows what staging it threw.
void run_device_chunk(MoeRuntime& rt, DeviceStartup& device, PreparedChunk& c) {
  if (c.stage_failure) throw *c.stage_failure;
  if (!c.device) throw Error(ErrorCode::kInternal, "", "verify", "a chunk was not staged");
  DeviceChunk& d = *c.device;
  device.launching();
  rt.run_staged_chunk(d.stage, c.e0, c.e1, d.w13, d.w2, d.ref_w13, d.ref_w2, d.biases,
                      d.ref_biases);
}

// The layer's device outputs compared on the host with the CPU path's metrics.
LayerResult device_layer_result(const LayerRun& run, const ManifestLayer& ml,
                                const MoeLayerOutputs& o, const MoeDeviceRouting& routing) {
  const ref::Routing routing_host = ref::routing_from_device(routing);
  ref::MoeOutput ref_out, got_out;
  for (ref::MoeOutput* m : {&ref_out, &got_out}) {
    m->tokens = run.opts->tokens;
    m->hidden = ml.hidden;
    m->top_k = routing.top_k;
  }
  ref_out.out = o.ref_out;
  ref_out.slot_out = o.ref_slots;
  got_out.out = o.got_out;
  got_out.slot_out = o.got_slots;
  const ref::MoeComparison cmp = ref::compare_moe(ref_out, got_out, routing_host, ml.experts);
  return make_layer_result(ml.layer, run.manifest->backend, run.opts->tokens, run.router.top_k, cmp,
                           run.opts->tolerance);
}

// MOEPACK_VERIFY_PROFILE (kernels/moe_runtime.h kernel_profile): where the device path's time
// went, per kernel and upload, on stderr (a debugging aid; the report is unchanged).
void print_device_profile(const MoeRuntime& rt, const DeviceStartup& device) {
  const std::vector<MoeProfileEntry> profile = rt.kernel_profile();
  if (profile.empty()) return;
  std::ostringstream o;
  o << "moepack: verify profile (MOEPACK_VERIFY_PROFILE): " << rt.uploaded_bytes()
    << " bytes uploaded; device kernels " << rt.kernel_seconds() << " s\n";
  o << "moepack: verify profile: start-up: the CUDA runtime and its chunk stages made in "
    << device.make_seconds() << " s on their own thread, ready " << device.ready_at()
    << " s after verify began; the first chunk's kernels launched at " << device.first_launch()
    << " s\n";
  for (const MoeProfileEntry& e : profile)
    o << "moepack: verify profile: " << e.name << ": " << e.seconds << " s over " << e.count
      << "\n";
  std::fputs(o.str().c_str(), stderr);
}

// Errors the device path never turns into a failed layer: no device, a bug.
bool device_error(const Error& e) {
  return e.code() == ErrorCode::kNoCuda || e.code() == ErrorCode::kInternal;
}

// The CUDA path: the same chunks, read, decoded and compared on the CPU (shared code above)
// ahead of their use by ChunkPipeline's workers, the parameters hashed beside (TensorHasher); each
// chunk's layout parameters and reference experts staged into pinned memory by the worker that
// prepared it (stage_device_chunk), copied up and evaluated on the device by the loop
// (kernels/moe_runtime.h): routing, sort, the layout's MoE through its readers (fp32) and the
// reference's through canonical readers (fp64); outputs compared on the host with the CPU path's
// metrics (ref::compare_moe). Host memory: the chunks in flight (workers + 2, each 1 / workers of
// the chunk rule's, their host bytes dropped once staged), the pool of stages (workers + 3 slots,
// each a chunk's packed and reference bytes).
// The host's comparison of a layer's outputs (compare_moe, device_layer_result) on a thread of its
// own while the loop starts the next layer on the device, which would otherwise wait for it (H100,
// 28 layers of 64 tokens: ~6 ms of a layer's ~46). Results enter the report in the loop's order:
// a pending one before any later entry (flush()).
class PendingLayerResult {
 public:
  explicit PendingLayerResult(VerifyReport* report) : report_(report) {}
  ~PendingLayerResult() {
    if (pending_.valid()) pending_.wait();  // the thread reads the caller's run and manifest
  }
  void start(const LayerRun& run, const ManifestLayer& ml, MoeLayerOutputs outputs,
             MoeDeviceRouting routing) {
    flush();
    auto compute = [&run, &ml, o = std::move(outputs), rt = std::move(routing)] {
      return device_layer_result(run, ml, o, rt);
    };
    try {
      pending_ = std::async(std::launch::async, std::move(compute));
    } catch (const std::system_error&) {
      report_->layers.push_back(compute());  // no thread to spare: compared here
    }
  }
  void flush() {
    if (pending_.valid()) report_->layers.push_back(pending_.get());
  }

 private:
  VerifyReport* report_;
  std::future<LayerResult> pending_;
};

void verify_layers_cuda(LayerRun& run) {
  VerifyReport& r = *run.report;
  DeviceStartup& device = *run.device;
  PendingLayerResult result(&r);
  const std::vector<ManifestLayer>& layers = run.manifest->layers;
  std::vector<LayerJob> jobs;
  std::vector<std::optional<Error>> job_error;
  const int workers = pipeline_workers(run.threads);
  run.chunk_threads = std::max(1, run.threads / workers);
  const char* host_decode = std::getenv("MOEPACK_VERIFY_HOST_DECODE");
  run.device_codes = !run.src && !(host_decode && *host_decode && std::string(host_decode) != "0");
  StandInBuffers stand_ins(2 * static_cast<size_t>(device_stage_slots(workers)));
  run.stand_ins = &stand_ins;
  const std::vector<ChunkItem> items = plan_chunks(run, workers, &jobs, &job_error);
  run.hasher->start(hashing_threads(run.threads), &run.clock->read_ns);
  const auto stage = [&run, ready = device.ready()](const LayerJob& job, PreparedChunk& c) {
    MoeRuntime* rt = nullptr;
    try {
      const std::shared_future<MoeRuntime*> mine = ready;  // each worker waits on its own copy
      rt = mine.get();
    } catch (const Error& e) {
      c.stage_failure = e;  // the loop rethrows it (kNoCuda) when it takes the runtime
      return;
    }
    stage_device_chunk(run, *rt, job, c);
  };
  ChunkPipeline chunks(run, jobs, items, workers, stage);
  run.report->timing.lanes = workers;
  LayerInputsAhead inputs(run, jobs, job_error);
  inputs.start(0);
  // The workers read and decode the first chunks while the runtime is made.
  MoeRuntime& rt = device.runtime();
  for (size_t li = 0; li < layers.size(); ++li) {
    const ManifestLayer& ml = layers[li];
    LayerJob& job = jobs[li];
    run.progress(li, 0);
    run.hasher->reached(li);
    if (job_error[li]) {
      result.flush();
      run.broken(ml, "parameters", *job_error[li]);
      chunks.finish_layer(li);
      continue;
    }
    MoeDeviceRouting routing;
    try {
      inputs.take(li);
      routing = begin_device_layer(run, rt, job);
    } catch (const Error& e) {
      if (device_error(e)) throw;
      result.flush();
      run.broken(ml, "parameters", e);
      chunks.finish_layer(li);  // what was prepared of it is dropped (the CPU path reads none)
      continue;
    }
    LayerRoundTrip round_trip;
    bool ok = true;
    for (size_t i = 0, n = chunks.chunks(li); ok && i < n; ++i) {
      PreparedChunk c = chunks.next(li);
      if (c.failure) {
        result.flush();
        run.broken(ml, experts_label("decode", c.e0, c.e1), *c.failure);
        ok = false;
        break;
      }
      for (const auto& checks : c.checks) round_trip.add(checks);
      note_rounding(run, c);
      try {
        StageTimer evaluating(&run.clock->evaluate_ns);
        run_device_chunk(rt, device, c);
        run.progress(li, c.e1);
      } catch (const Error& e) {
        if (device_error(e)) throw;
        // A layout variant the device cannot check (a builder's kUnsupported): exit 4, the
        // layer did not fail.
        if (e.code() == ErrorCode::kUnsupported)
          throw Error(ErrorCode::kUnsupported, e.file(), e.tensor(),
                      "--device cuda: " + e.message() + "; use --device cpu");
        result.flush();
        run.broken(ml, experts_label("evaluation", c.e0, c.e1), e);
        ok = false;
        break;
      }
    }
    chunks.finish_layer(li);
    round_trip.report(r);
    if (!ok) continue;
    StageTimer evaluating(&run.clock->evaluate_ns);
    result.start(run, ml, rt.finish_layer(), std::move(routing));
  }
  result.flush();
  r.timing.device_seconds = rt.kernel_seconds();
  print_device_profile(rt, device);
}

// The manifest's backend as a layout row this moepack reads (kBadConfig naming the manifest
// field for an unknown backend or a layout name that does not match it; kUnsupported for another
// layout version).
const TargetLayout& manifest_layout(const Manifest& manifest, const std::string& mpath) {
  const std::string& backend = manifest.backend;
  const TargetLayout* layout = find_target_layout(backend);
  if (!layout)
    throw Error(ErrorCode::kBadConfig, mpath, "",
                "backend: unknown backend \"" + backend + "\" (" + target_layout_names() + ")");
  if (manifest.layout.name != layout->name)
    throw Error(ErrorCode::kBadConfig, mpath, "",
                "layout.name: \"" + manifest.layout.name + "\", but backend " + backend +
                    " writes layout \"" + layout->name + "\"");
  if (manifest.layout.version != layout->layout_version)
    throw Error(ErrorCode::kUnsupported, mpath, "",
                "layout.version: " + std::to_string(manifest.layout.version) + " of " + backend +
                    ", this moepack reads version " + std::to_string(layout->layout_version) +
                    " (convert again with this moepack)");
  return *layout;
}

// Integrity 1: every manifest tensor present in its shard with its dtype, shape and sha256, and
// nothing else in the shards. The converted parameters' checksums were computed by the hashers
// while the layers were read (TensorHasher, the other tensors with the first layer); any tensor
// no hasher hashed is hashed here on all threads from the mapping (its pages dropped after). The
// first problem in the manifest's order is reported.
IntegrityCheck check_manifest_tensors(const Manifest& manifest, const Output& out, int threads,
                                      TensorHasher& digests) {
  digests.finish();  // every parameter the hashers had is hashed
  IntegrityCheck all;
  all.name = "manifest tensors present with dtype, shape and sha256";
  all.passed = true;
  std::vector<std::pair<const std::string*, const ManifestTensor*>> listed;
  for (const auto& [name, t] : manifest.tensors) listed.emplace_back(&name, &t);
  std::vector<std::string> problems(listed.size());
  const auto sha_of = [&digests](const TensorView& v, const SafetensorsFile& shard) {
    std::string sha = digests.digest(v);
    if (!sha.empty()) return sha;
    return sha256_hex_read_once(v.data, v.nbytes, shard.mapped());
  };
  parallel_for(static_cast<int64_t>(listed.size()), threads, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const std::string& name = *listed[static_cast<size_t>(i)].first;
      const ManifestTensor& t = *listed[static_cast<size_t>(i)].second;
      std::string& problem = problems[static_cast<size_t>(i)];
      auto it = out.where.find(name);
      if (it == out.where.end()) {
        problem = "missing";
      } else if (it->second != t.shard) {
        problem = "in " + it->second + ", manifest says " + t.shard;
      } else {
        const TensorView v = out.view(name);
        if (v.dtype != t.dtype)
          problem = std::string("dtype ") + dtype_name(v.dtype);
        else if (v.shape != t.shape)
          problem = "shape " + shape_str(v.shape);
        else if (sha_of(v, out.shards.at(it->second)) != t.sha256)
          problem = "sha256 differs";
      }
    }
  });
  const int64_t checked = static_cast<int64_t>(listed.size());
  for (size_t i = 0; i < listed.size() && all.passed; ++i)
    if (!problems[i].empty()) {
      all.passed = false;
      all.detail = *listed[i].first + ": " + problems[i];
    }
  if (out.where.size() != static_cast<size_t>(checked) && all.passed) {
    all.passed = false;
    all.detail = "shards hold " + std::to_string(out.where.size()) + " tensors, manifest lists " +
                 std::to_string(checked);
  }
  if (all.passed) all.detail = std::to_string(checked) + " tensors";
  return all;
}

// Integrity 1b (a parallel output): each rank's digest over its parameters' checksums (those
// integrity 1 checked against the bytes), and each rank's shard files holding its parameters
// only: a rank that reads its files reads nothing of another's.
IntegrityCheck check_rank_digests(const Manifest& manifest) {
  IntegrityCheck c;
  c.name = "per-rank checksums and files";
  const ManifestParallel& mp = *manifest.parallel;
  const int ranks = mp.parallel.ranks();
  std::vector<std::map<std::string, std::string>> sha(static_cast<size_t>(ranks));
  std::map<std::string, int> rank_of_shard;
  for (int r = 0; r < ranks; ++r)
    for (const auto& f : mp.ranks[static_cast<size_t>(r)].shards) rank_of_shard[f] = r;
  for (const auto& [name, t] : manifest.tensors) {
    const int r = rank_of_tensor_key(name, ranks);
    const auto it = rank_of_shard.find(t.shard);
    const int file_rank = it == rank_of_shard.end() ? -1 : it->second;
    if (r != file_rank) {
      c.detail = name + " is in " + t.shard +
                 (file_rank < 0 ? ", a shared file" : ", another rank's file");
      return c;
    }
    if (r >= 0) sha[static_cast<size_t>(r)][name] = t.sha256;
  }
  for (int r = 0; r < ranks; ++r)
    if (rank_digest(sha[static_cast<size_t>(r)]) != mp.ranks[static_cast<size_t>(r)].sha256) {
      c.detail = rank_dir_name(r, ranks) + ": digest differs from the manifest's";
      return c;
    }
  c.passed = true;
  c.detail = std::to_string(ranks) + " ranks";
  return c;
}

// Integrity 2 (with a source): copy-through tensors are the source's bytes.
IntegrityCheck check_copied_tensors(const Manifest& manifest, const Output& out,
                                    const Checkpoint& src) {
  IntegrityCheck ct;
  ct.name = "copied tensors equal the source";
  ct.passed = true;
  int64_t n = 0;
  for (const auto& [name, t] : manifest.tensors) {
    if (t.converted) continue;
    ++n;
    if (!src.has_tensor(name)) {
      ct.passed = false;
      ct.detail = name + " not in the source";
      break;
    }
    if (!out.where.count(name)) continue;  // reported missing by the integrity check
    const TensorView a = src.view(name), b = out.view(name);
    const bool same = a.nbytes == b.nbytes && a.dtype == b.dtype && a.shape == b.shape &&
                      std::memcmp(a.data, b.data, a.nbytes) == 0;
    // Both read once: their mapped pages stop counting as resident.
    if (src.shard(src.shard_of(name)).mapped()) release_mapped(a.data, a.nbytes);
    if (out.shards.at(out.where.at(name)).mapped()) release_mapped(b.data, b.nbytes);
    if (!same) {
      ct.passed = false;
      ct.detail = name + " differs from the source";
      break;
    }
  }
  if (ct.passed) ct.detail = std::to_string(n) + " tensors";
  return ct;
}

// Integrity 3: carried-over files are present (and, with the source, its bytes).
IntegrityCheck check_carried_files(const Manifest& manifest, const std::string& dst,
                                   const Checkpoint* src) {
  IntegrityCheck fc;
  fc.name = "carried-over files present" + std::string(src ? " and equal the source" : "");
  fc.passed = true;
  for (const std::string& f : manifest.files) {
    const std::string p = (fs::path(dst) / f).string();
    std::error_code ec;
    std::string problem;
    if (fs::status(p, ec).type() != fs::file_type::regular)  // through symlinks, as above
      problem = "missing or not a regular file";
    else if (src && !same_file_bytes(p, (fs::path(src->dir()) / f).string(), &problem))
      problem = "differs from the source: " + problem;
    if (!problem.empty()) {
      fc.passed = false;
      fc.detail = f + ": " + problem;
      break;
    }
  }
  if (fc.passed) fc.detail = std::to_string(manifest.files.size()) + " files";
  return fc;
}

// Integrity 0: config.json is the one convert wrote -- bound to moepack.json (artifact.h) and,
// with the source, exactly what convert writes from it. Every later check reads the router and
// the quantization from config.json, so nothing else is checked when this fails.
IntegrityCheck check_config_bound(const Manifest& m, const std::string& dst,
                                  const Checkpoint* src) {
  IntegrityCheck c;
  c.name = "config.json is the one convert wrote" + std::string(src ? " from the source" : "");
  const json config = read_json_file((fs::path(dst) / "config.json").string());
  c.detail = config_binding_problem(dst, m, config);
  if (c.detail.empty() && src && m.manifest_version >= 3) {
    const json want = expected_output_config(m, *src, manifest_file_sha256(dst));
    const std::string field = json_first_difference(config, want);
    if (!field.empty())
      c.detail = "config.json: " + field + ": differs from what convert writes from the source";
  }
  c.passed = c.detail.empty();
  if (c.passed)
    c.detail = m.manifest_version >= 3
                   ? "every field as recorded" + std::string(src ? " and as the source gives" : "")
                   : "manifest_version " + std::to_string(m.manifest_version) +
                         ": only the manifest's digest is bound (re-convert to bind every field)";
  return c;
}

// The source fingerprint (manifest_version >= 4): --source holds the bytes convert read (exit 3
// naming the source file and tensor otherwise); the report names the source by it.
void check_source_bytes(const Manifest& manifest, const std::string& mpath, const Checkpoint& src,
                        int threads, VerifyReport& r) {
  if (manifest.manifest_version < 4) {
    r.source_identity = "given (manifest_version " + std::to_string(manifest.manifest_version) +
                        " records no source fingerprint)";
    return;
  }
  check_source_fingerprint(src, manifest.source.tensor_sha256, threads,
                           mpath + " (source.tensor_sha256)");
  const std::string all = json(manifest.source.tensor_sha256).dump();
  r.source_identity = "the " + std::to_string(manifest.source.tensor_sha256.size()) +
                      " tensors convert read (SHA-256 of their SHA-256s " +
                      sha256_hex(all.data(), all.size()) + ")";
}

// --source, opened and checked against the manifest: every tensor and file covered, and its
// bytes the ones convert read. Null without --source.
std::unique_ptr<Checkpoint> open_source(const VerifyOptions& opts, const Manifest& manifest,
                                        const std::string& mpath, VerifyReport& r) {
  if (opts.source.empty()) return nullptr;
  std::unique_ptr<Checkpoint> src = Checkpoint::open(opts.source);
  check_manifest_covers_source(manifest, mpath, *src);
  check_source_bytes(manifest, mpath, *src, resolve_threads(opts.threads), r);
  return src;
}

// "olmoe: softmax top-4 renormalised", for the report.
std::string describe_router(const ref::RouterConfig& c) {
  std::string s = c.family + ": ";
  if (c.kind == RouterKind::kSparseMixer) return s + "sparsemixer top-2";
  s += std::string(router_scoring_name(c.scoring)) + " top-" + std::to_string(c.top_k);
  if (c.group_score != GroupScore::kNone && c.topk_group < c.n_group)
    s += " of " + std::to_string(c.topk_group) + "/" + std::to_string(c.n_group) + " groups (" +
         group_score_name(c.group_score) + ")";
  if (c.has_correction_bias) s += ", correction bias";
  if (c.renormalize) s += ", renormalised";
  if (c.routed_scaling_factor != 1.0) s += ", x " + json(c.routed_scaling_factor).dump();
  if (c.has_per_expert_scale) s += ", per-expert scale";
  if (c.input == RouterInput::kRmsNormScaled) s += ", on rms_norm(x) * scale";
  if (c.weights_on_input) s += ", weight on the expert input";
  return s;
}

}  // namespace

// The note a parallel output's report carries: every rank checked, the MoE combined as vLLM does.
std::string parallel_note(const Manifest& manifest, const VerifyOptions& opts) {
  // Every rank's parameters through its layout's readers, the ranks combined as vLLM combines
  // them (rank_matmul): on the CPU whatever --device says.
  return manifest.parallel->parallel.describe() + ": " +
         std::to_string(manifest.parallel->parallel.ranks()) +
         " ranks checked, each rank's bytes against its share of the source, the "
         "MoE through every rank's readers (partial w2 outputs summed / experts "
         "routed to their owners)" +
         (opts.device == "cuda" ? "; on the CPU (the device path reads whole "
                                  "layers only)"
                                : "");
}

// The notes that say what the reference was and what was not checked.
void add_closing_notes(const VerifyOptions& opts, bool quantized_from_dense, bool has_source,
                       VerifyReport* report) {
  VerifyReport& r = *report;
  if (quantized_from_dense)
    r.notes.push_back(
        "experts were quantised to MXFP8 by moepack: the reference re-quantises the source with "
        "the same recipe");
  if (!has_source)
    r.notes.push_back(
        "no --source: the reference is the decoded layout itself (no round-trip check)");
  if (opts.skip_numerical)
    r.notes.push_back(
        "--skip-numerical: the MoE was not computed, so the router, the activation and the "
        "kernel's reading of the layout were NOT checked; integrity" +
        std::string(has_source ? " and the exact round trip against the source" : " and decoding") +
        " ran");
}

VerifyReport run_verify(const VerifyOptions& opts) {
  const auto verify_start = std::chrono::steady_clock::now();
  VerifyReport r;
  r.tool_version = moepack_version_string();
  r.destination = opts.dst;
  r.source = opts.source;
  r.seed = opts.seed;
  r.tokens = opts.tokens;
  r.tolerance = opts.tolerance;
  if (opts.device != "cpu" && opts.device != "cuda")
    throw Error(ErrorCode::kUsage, "--device must be cpu or cuda");
  if (opts.tokens < 1) throw Error(ErrorCode::kUsage, "--tokens must be >= 1");

  const int threads = resolve_threads(opts.threads);
  // The CUDA runtime is made on a thread of its own from verify's start (verify_layers_cuda):
  // CUDA's initialisation overlaps the manifest's reading; no device is exit 4 right after it.
  std::optional<DeviceStartup> device;
  if (opts.device == "cuda" && !opts.skip_numerical)
    device.emplace(device_stage_slots(pipeline_workers(threads)), verify_start);
  const Manifest manifest = read_manifest(opts.dst);
  if (opts.device == "cuda" && !(device ? device->available() : cuda_device_info().available))
    throw Error(ErrorCode::kNoCuda, kNoCudaDevice);
  if (manifest.parallel) device.reset();  // a parallel artifact is evaluated on the CPU
  const std::string mpath = manifest_path(opts.dst);
  r.backend = manifest.backend;
  const TargetLayout& layout = manifest_layout(manifest, mpath);
  check_layout_records(manifest, layout, mpath);
  const std::unique_ptr<Checkpoint> src = open_source(opts, manifest, mpath, r);
  r.artifact_identity = "moepack.json SHA-256 " + manifest_file_sha256(opts.dst);
  r.integrity.push_back(check_config_bound(manifest, opts.dst, src.get()));
  if (!r.integrity.back().passed) {
    r.notes.push_back(
        "config.json is not the one convert wrote: nothing else was checked (the router and the "
        "quantization are read from it)");
    r.finalize();
    return r;
  }
  const HfConfig cfg = load_hf_config(opts.dst);
  r.model = cfg.architecture.empty() ? cfg.model_type : cfg.architecture;

  // 1. Integrity.
  Output out = open_output(opts.dst, manifest, r);
  // Integrity 1 is filled in after the layers, which hash the parameters as they read them.
  const size_t tensors_check = r.integrity.size();
  r.integrity.emplace_back();
  if (manifest.parallel) r.integrity.push_back(check_rank_digests(manifest));

  // 2 + 3 per layer.
  const bool quantized_from_dense = manifest.quantize.has_value();
  const QuantizeRecipe* recipe =
      quantized_from_dense
          ? &find_quantize_recipe(manifest.quantize->format, manifest.quantize->recipe)
          : nullptr;
  // The router and what the experts compute, by the model type (never assumed from the tensor
  // names); --skip-numerical reads neither.
  ref::RouterConfig router;
  ref::Activation activation = ref::Activation::kSilu;
  if (opts.skip_numerical) {
    r.numerical_skipped = true;
    if (!has_moe_family(cfg.raw))
      r.skipped_because = "model_type \"" + cfg.model_type + "\" has no router moepack computes";
  } else {
    const std::string config_path = (fs::path(opts.dst) / "config.json").string();
    try {
      router = ref::router_config_from_hf(cfg.raw, config_path);
      activation = expert_activation_from_hf(cfg.raw, config_path);
      r.router = describe_router(router);
      r.activation = ref::activation_name(activation);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnsupported) throw;
      throw Error(
          e.code(), e.file(), e.tensor(),
          e.message() + "; --skip-numerical checks integrity and the exact round trip without it");
    }
  }
  if (src) r.integrity.push_back(check_copied_tensors(manifest, out, *src));
  r.integrity.push_back(check_carried_files(manifest, opts.dst, src.get()));

  refuse_unverifiable_biases(out, manifest, src.get());
  // 3. Per layer, by chunks of experts: read and hash, decode, exact round trip, numerical check.
  TensorHasher digests;
  StageClock clock;
  LayerRun run{&out,  src.get(), &layout,    recipe, &manifest, threads,
               &opts, router,    activation, &r,     &digests,  &clock};
  if (device) run.device = &*device;
  run.count_layer_bytes();
  if (manifest.parallel && !opts.skip_numerical) r.notes.push_back(parallel_note(manifest, opts));
  if (opts.skip_numerical)
    verify_layers_round_trip(run);
  else if (opts.device == "cuda" && !manifest.parallel)
    verify_layers_cuda(run);
  else
    verify_layers_cpu(run);
  {
    StageTimer reading(&clock.read_ns);
    r.integrity[tensors_check] = check_manifest_tensors(manifest, out, threads, digests);
  }
  clock.record(&r.timing);
  run.progress(manifest.layers.size(), 0);
  add_closing_notes(opts, quantized_from_dense, src != nullptr, &r);
  r.finalize();
  return r;
}

}  // namespace moepack
