#include "model/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

const char* moe_family_name(MoeFamily f) {
  switch (f) {
    case MoeFamily::kMixtral:
      return "mixtral";
    case MoeFamily::kPerExpert:
      return "per-expert";
    case MoeFamily::kFused3d:
      return "fused3d";
    case MoeFamily::kGptOss:
      return "gpt-oss";
  }
  return "unknown";
}

namespace {

const char* kIndexName = "model.safetensors.index.json";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t layer_number(const std::string& module) {
  const auto pos = module.rfind("layers.");
  if (pos == std::string::npos) return -1;
  size_t i = pos + 7;
  int64_t v = 0;
  bool any = false;
  while (i < module.size() && std::isdigit(static_cast<unsigned char>(module[i]))) {
    v = v * 10 + (module[i] - '0');
    ++i;
    any = true;
  }
  return any ? v : -1;
}

int proj_of(const std::string& name) {
  if (name == "gate_proj" || name == "w1") return kGate;
  if (name == "up_proj" || name == "w3") return kUp;
  if (name == "down_proj" || name == "w2") return kDown;
  return -1;
}

}  // namespace

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  auto c = std::unique_ptr<Checkpoint>(new Checkpoint());
  c->dir_ = dir;
  if (!fs::is_directory(dir)) throw Error(ErrorCode::kIo, dir, "", "not a directory");
  c->config_ = load_hf_config(dir);

  const std::string index_path = (fs::path(dir) / kIndexName).string();
  std::map<std::string, std::string> index_map;
  if (fs::exists(index_path)) {
    c->indexed_ = true;
    json idx;
    try {
      std::ifstream in(index_path);
      idx = json::parse(in);
    } catch (const json::exception& e) {
      throw Error(ErrorCode::kBadConfig, index_path, "", std::string("invalid JSON: ") + e.what());
    }
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
      throw Error(ErrorCode::kBadConfig, index_path, "", "missing weight_map object");
    std::set<std::string> shards;
    for (auto& [tensor, shard] : idx["weight_map"].items()) {
      if (!shard.is_string())
        throw Error(ErrorCode::kBadConfig, index_path, tensor, "weight_map value is not a string");
      const std::string s = shard.get<std::string>();
      if (s.find('/') != std::string::npos || s == ".." || s.empty())
        throw Error(ErrorCode::kBadConfig, index_path, tensor,
                    "shard name \"" + s + "\" is not a plain file name");
      index_map[tensor] = s;
      shards.insert(s);
    }
    c->shard_names_.assign(shards.begin(), shards.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    c->shard_names_ = {"model.safetensors"};
  } else {
    throw Error(ErrorCode::kMissingTensor, dir, "",
                "no model.safetensors and no model.safetensors.index.json");
  }

  for (const auto& s : c->shard_names_) {
    const std::string p = (fs::path(dir) / s).string();
    if (!fs::exists(p))
      throw Error(ErrorCode::kIo, p, "", "shard listed in the index does not exist");
    c->shards_.emplace(s, SafetensorsFile::open(p));
    for (const auto& e : c->shards_.at(s).entries()) {
      auto [it, inserted] = c->where_.emplace(e.name, s);
      if (!inserted)
        throw Error(ErrorCode::kDuplicateTensor, p, e.name,
                    "tensor also present in shard " + it->second);
      c->tensor_order_.push_back(e.name);
    }
  }
  for (const auto& [tensor, shard] : index_map) {
    auto it = c->where_.find(tensor);
    if (it == c->where_.end())
      throw Error(ErrorCode::kMissingTensor, (fs::path(dir) / shard).string(), tensor,
                  "listed in " + std::string(kIndexName) + " but not in the shard");
    if (it->second != shard)
      throw Error(ErrorCode::kBadConfig, index_path, tensor,
                  "index says " + shard + " but the tensor is in " + it->second);
  }

  // Files to carry over: everything that is not a weight shard, the index or config.json.
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
       ++it) {
    const auto rel = fs::relative(it->path(), dir).string();
    if (it->is_directory()) {
      if (!rel.empty() && rel[0] == '.') it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    if (rel[0] == '.' || ends_with(rel, ".safetensors") || rel == kIndexName ||
        rel == "config.json")
      continue;
    c->other_files_.push_back(rel);
  }
  std::sort(c->other_files_.begin(), c->other_files_.end());

  c->discover_moe();
  return c;
}

const SafetensorsFile& Checkpoint::shard(const std::string& name) const {
  auto it = shards_.find(name);
  if (it == shards_.end()) throw Error(ErrorCode::kInternal, dir_, "", "unknown shard " + name);
  return it->second;
}

const std::string& Checkpoint::shard_of(const std::string& tensor) const {
  auto it = where_.find(tensor);
  if (it == where_.end()) throw Error(ErrorCode::kMissingTensor, dir_, tensor, "tensor not found");
  return it->second;
}

TensorView Checkpoint::view(const std::string& tensor) const {
  return shard(shard_of(tensor)).view(tensor);
}

uint64_t Checkpoint::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, f] : shards_)
    for (const auto& e : f.entries()) total += e.end - e.begin;
  return total;
}

void Checkpoint::discover_moe() {
  std::map<std::string, MoeLayer> by_module;
  std::map<std::string, std::map<int64_t, std::array<std::map<std::string, std::string>, 3>>>
      per_expert;
  std::set<std::string> expert_tensors;
  for (const auto& name : tensor_order_) {
    const auto pos = name.find(".experts.");
    if (pos == std::string::npos) continue;
    const std::string module = name.substr(0, pos);
    const std::string rest = name.substr(pos + 9);
    MoeLayer& L = by_module[module];
    L.module = module;
    L.layer = layer_number(module);
    L.param_prefix = module + ".experts.";
    if (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest[0]))) {
      const auto dot = rest.find('.');
      if (dot == std::string::npos) continue;
      const int64_t e = std::stoll(rest.substr(0, dot));
      const std::string tail = rest.substr(dot + 1);
      const auto dot2 = tail.find('.');
      const std::string proj_name = tail.substr(0, dot2);
      const int p = proj_of(proj_name);
      if (p < 0 || dot2 == std::string::npos) continue;
      const std::string suffix = tail.substr(dot2 + 1);
      per_expert[module][e][p][suffix] = name;
      L.family = proj_name[0] == 'w' ? MoeFamily::kMixtral : MoeFamily::kPerExpert;
    } else {
      // Fused 3-D experts: gate_up_proj[_blocks|_scales|_bias], down_proj[...]
      std::string base = rest, suffix;
      for (const char* s : {"_blocks", "_scales", "_bias"})
        if (ends_with(rest, s)) {
          suffix = s + 1;
          base = rest.substr(0, rest.size() - std::string(s).size());
        }
      if (base == "gate_up_proj")
        L.fused_gate_up[suffix] = name;
      else if (base == "down_proj")
        L.fused_down[suffix] = name;
      else
        continue;
      L.family = config_.model_type == "gpt_oss" ? MoeFamily::kGptOss : MoeFamily::kFused3d;
    }
    L.source_tensors.push_back(name);
    expert_tensors.insert(name);
  }

  for (auto& [module, L] : by_module) {
    if (L.source_tensors.empty()) continue;
    const std::string& shard_file = (fs::path(dir_) / shard_of(L.source_tensors.front())).string();
    if (L.family == MoeFamily::kFused3d || L.family == MoeFamily::kGptOss) {
      if (!L.fused_gate_up.count("") || !L.fused_down.count("")) {
        if (L.family == MoeFamily::kGptOss)
          throw Error(ErrorCode::kUnsupported, shard_file, L.param_prefix + "gate_up_proj_blocks",
                      "gpt-oss MXFP4 experts are recognised but not supported for conversion");
        throw Error(ErrorCode::kMissingTensor, shard_file, L.param_prefix + "gate_up_proj",
                    "fused experts need both gate_up_proj and down_proj");
      }
      const TensorView gu = view(L.fused_gate_up.at("")), dn = view(L.fused_down.at(""));
      if (gu.shape.size() != 3 || dn.shape.size() != 3)
        throw Error(ErrorCode::kBadShape, shard_file, gu.name,
                    "fused experts must be 3-D, got " + shape_str(gu.shape) + " and " +
                        shape_str(dn.shape));
      L.num_experts = gu.shape[0];
      L.hidden = gu.shape[1];
      L.inter = gu.shape[2] / 2;
      L.gated = true;
      if (gu.shape[2] % 2 || dn.shape[0] != L.num_experts || dn.shape[1] != L.inter ||
          dn.shape[2] != L.hidden)
        throw Error(ErrorCode::kBadShape, shard_file, dn.name,
                    "down_proj " + shape_str(dn.shape) + " does not match gate_up_proj " +
                        shape_str(gu.shape) + " ([E, H, 2I] and [E, I, H])");
    } else {
      auto& ex = per_expert[module];
      L.num_experts = static_cast<int64_t>(ex.size());
      if (ex.rbegin()->first != L.num_experts - 1)
        throw Error(ErrorCode::kMissingTensor, shard_file, L.param_prefix,
                    "expert ids are not contiguous from 0 (found " + std::to_string(ex.size()) +
                        " experts, highest id " + std::to_string(ex.rbegin()->first) + ")");
      // Gated when any expert has a gate: one without it is then a missing tensor, not a
      // reason to drop every other expert's gate.
      bool has_gate = false;
      for (const auto& [e, projs] : ex) has_gate |= !projs[kGate].empty();
      L.gated = has_gate;
      for (auto& [e, projs] : ex) {
        for (int p = 0; p < 3; ++p) {
          if (p == kGate && !has_gate) continue;
          if (projs[p].empty() || projs[p] != ex.begin()->second[p]) {
            const bool missing = projs[p].empty();
            std::set<std::string> want, have;
            for (auto& [s, n] : ex.begin()->second[p]) want.insert(s);
            for (auto& [s, n] : projs[p]) have.insert(s);
            if (missing || want != have)
              throw Error(ErrorCode::kMissingTensor, shard_file,
                          L.param_prefix + std::to_string(e) + "." +
                              (p == kGate ? "gate_proj"
                               : p == kUp ? "up_proj"
                                          : "down_proj"),
                          missing ? "projection missing" : "tensor suffixes differ from expert 0");
          }
        }
        L.experts.push_back(projs);
      }
      const auto gate_or_up = L.experts[0][has_gate ? kGate : kUp];
      const auto [n1, k1] = linear_shape(*this, config_.quant, gate_or_up);
      const auto [n2, k2] = linear_shape(*this, config_.quant, L.experts[0][kDown]);
      L.inter = n1;
      L.hidden = k1;
      if (n2 != L.hidden || k2 != L.inter)
        throw Error(ErrorCode::kBadShape, shard_file, L.experts[0][kDown].begin()->second,
                    "down projection is [" + std::to_string(n2) + ", " + std::to_string(k2) +
                        "], expected [H=" + std::to_string(L.hidden) +
                        ", I=" + std::to_string(L.inter) + "]");
    }
    if (config_.hidden_size && config_.hidden_size != L.hidden)
      throw Error(ErrorCode::kBadShape, shard_file, L.source_tensors.front(),
                  "experts have hidden size " + std::to_string(L.hidden) +
                      " but config.json says hidden_size " + std::to_string(config_.hidden_size));
    if (!config_.gated) L.gated = false;
    layers_.push_back(std::move(L));
  }
  std::sort(layers_.begin(), layers_.end(), [](const MoeLayer& a, const MoeLayer& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.module < b.module;
  });
  for (const auto& name : tensor_order_)
    if (!expert_tensors.count(name)) others_.push_back(name);
}

std::pair<int64_t, int64_t> linear_shape(const Checkpoint& ckpt, const QuantParams& q,
                                         const std::map<std::string, std::string>& by_suffix) {
  std::map<std::string, TensorView> views;
  for (const auto& [suffix, name] : by_suffix) views[suffix] = ckpt.view(name);
  const SourceCodec* codec = find_source_codec(q.method);
  try {
    if (codec) return codec->logical_shape(q, views);
    const Shape& s = linear_tensor_shape(views, "weight");  // unquantized: weight [N, K]
    return {s[0], s[1]};
  } catch (const Error& e) {
    // Name the real tensor and its shard instead of the suffix.
    auto it = by_suffix.find(e.tensor());
    if (it != by_suffix.end())
      throw Error(e.code(), ckpt.shard_of(it->second), it->second, e.message());
    throw Error(e.code(), ckpt.dir(), by_suffix.empty() ? "" : by_suffix.begin()->second,
                e.message());
  }
}

MoeExperts load_moe_experts(const Checkpoint& ckpt, const MoeLayer& layer, int threads,
                            const ExpertRange& range) {
  QuantParams q = ckpt.quant();
  const SourceCodec* codec = find_source_codec(q.method);
  if (!codec)
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), layer.param_prefix,
                std::string("no codec for ") + quant_method_name(q.method));
  if (layer.family == MoeFamily::kFused3d || layer.family == MoeFamily::kGptOss)
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), layer.param_prefix,
                "quantized fused 3-D experts are not supported");
  if (codec->refine) {
    std::map<std::string, TensorView> first;
    for (const auto& [suffix, name] : layer.experts[0][layer.gated ? kGate : kUp])
      first[suffix] = ckpt.view(name);
    q = codec->refine(q, first);
  }
  const std::set<std::string> required = [&] {
    auto v = codec->required_suffixes(q);
    return std::set<std::string>(v.begin(), v.end());
  }();
  const std::set<std::string> known = [&] {
    auto v = codec->optional_suffixes(q);
    std::set<std::string> s(v.begin(), v.end());
    s.insert(required.begin(), required.end());
    return s;
  }();

  const int64_t e0 = range.begin, e1 = range.end < 0 ? layer.num_experts : range.end;
  if (e0 < 0 || e1 > layer.num_experts || e0 >= e1)
    throw Error(ErrorCode::kInternal, ckpt.dir(), layer.param_prefix, "bad expert range");
  const int64_t E = e1 - e0, H = layer.hidden, I = layer.inter;
  const int64_t rows13 = layer.gated ? 2 * I : I;
  std::vector<std::array<QuantTensor, 3>> parts(static_cast<size_t>(E));  // local index e - e0

  auto unpack_one = [&](int64_t e, int p) {
    const auto& by_suffix = layer.experts[static_cast<size_t>(e)][p];
    const std::string first = by_suffix.begin()->second;
    const std::string linear = first.substr(0, first.rfind('.'));
    const std::string file = (fs::path(ckpt.dir()) / ckpt.shard_of(first)).string();
    for (const auto& s : required)
      if (!by_suffix.count(s))
        throw Error(ErrorCode::kMissingTensor, file, linear + "." + s, "required tensor missing");
    TensorMap tensors;
    for (const auto& [suffix, name] : by_suffix) {
      if (!known.count(suffix))
        throw Error(ErrorCode::kUnsupported, file, name,
                    "unexpected tensor '" + suffix + "' for " + codec->name + " experts");
      tensors.emplace(suffix, Tensor::from_view(ckpt.view(name)));
    }
    const int64_t n = p == kDown ? H : I, k = p == kDown ? I : H;
    try {
      return codec->unpack(q, tensors, n, k);
    } catch (const Error& err) {
      if (!err.file().empty()) throw;
      const std::string t = err.tensor().empty()            ? linear
                            : by_suffix.count(err.tensor()) ? by_suffix.at(err.tensor())
                                                            : linear + "." + err.tensor();
      throw Error(err.code(), file, t, err.message());
    }
  };
  parallel_for(E, threads, [&](int64_t b, int64_t end) {
    for (int64_t e = b; e < end; ++e)
      for (int p = 0; p < 3; ++p) {
        if (p == kGate && !layer.gated) continue;
        parts[static_cast<size_t>(e)][p] = unpack_one(e0 + e, p);
      }
  });

  auto stack = [&](std::initializer_list<int> projs, int64_t n, int64_t k, int force_g_idx) {
    const QuantTensor& t0 = parts[0][*projs.begin()];
    QuantTensor out;
    out.experts = E;
    out.n = n;
    out.k = k;
    out.kind = t0.kind;
    out.bits = t0.bits;
    out.group_size = t0.group_size;
    out.scale_block_n = t0.scale_block_n;
    out.symmetric = t0.symmetric;
    out.scale_dtype = t0.scale_dtype;
    bool any_g_idx = force_g_idx == 1;
    for (int64_t e = 0; e < E; ++e)
      for (int p : projs) any_g_idx |= !parts[static_cast<size_t>(e)][p].g_idx.empty();
    if (force_g_idx == 0 && any_g_idx)
      throw Error(ErrorCode::kInternal, ckpt.dir(), layer.param_prefix,
                  "act-order g_idx in experts planned without them");
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<int32_t>* first_g = nullptr;
      for (int p : projs) {
        const QuantTensor& t = parts[static_cast<size_t>(e)][p];
        const std::string what = layer.param_prefix + std::to_string(e0 + e);
        if (t.kind != out.kind || t.bits != out.bits || t.group_size != out.group_size ||
            t.scale_dtype != out.scale_dtype || t.symmetric != out.symmetric)
          throw Error(ErrorCode::kBadValue, ckpt.dir(), what,
                      "projections of one layer disagree in quantization parameters");
        if (t.scale_block_n > 1 && t.n % t.scale_block_n != 0 && projs.size() > 1)
          throw Error(ErrorCode::kUnsupported, ckpt.dir(), what,
                      "block-scaled gate/up rows (" + std::to_string(t.n) +
                          ") are not a multiple of the block size " +
                          std::to_string(t.scale_block_n));
        out.codes.insert(out.codes.end(), t.codes.begin(), t.codes.end());
        out.scales.insert(out.scales.end(), t.scales.begin(), t.scales.end());
        out.zeros.insert(out.zeros.end(), t.zeros.begin(), t.zeros.end());
        if (any_g_idx) {
          std::vector<int32_t> g = t.g_idx;
          if (g.empty()) {  // trivial g_idx made explicit so gate and up compare equal
            g.resize(static_cast<size_t>(t.k));
            for (int64_t i = 0; i < t.k; ++i)
              g[static_cast<size_t>(i)] =
                  static_cast<int32_t>(t.group_size > 0 ? i / t.group_size : 0);
          }
          if (!first_g) {
            out.g_idx.insert(out.g_idx.end(), g.begin(), g.end());
            first_g = &t.g_idx;
          } else if (!std::equal(g.begin(), g.end(),
                                 out.g_idx.end() - static_cast<int64_t>(g.size())))
            throw Error(ErrorCode::kUnsupported, ckpt.dir(), what + ".up_proj.g_idx",
                        "gate and up projections have different act-order g_idx; vLLM's fused w13 "
                        "keeps one per expert");
        }
      }
    }
    out.check_consistent(layer.param_prefix);
    return out;
  };
  MoeExperts m;
  if (layer.gated)
    m.w13 = stack({kGate, kUp}, rows13, H, range.g_idx_w13);
  else
    m.w13 = stack({kUp}, rows13, H, range.g_idx_w13);
  m.w2 = stack({kDown}, H, I, range.g_idx_w2);
  return m;
}

namespace {
float read_float(const TensorView& v, int64_t i) {
  return element_as_float(v.data + i * (dtype_bits(v.dtype) / 8), v.dtype, v.name);
}
}  // namespace

DenseExperts load_dense_experts(const Checkpoint& ckpt, const MoeLayer& layer,
                                const ExpertRange& range) {
  DenseExperts d;
  const int64_t e0 = range.begin, e1 = range.end < 0 ? layer.num_experts : range.end;
  if (e0 < 0 || e1 > layer.num_experts || e0 >= e1)
    throw Error(ErrorCode::kInternal, ckpt.dir(), layer.param_prefix, "bad expert range");
  const int64_t E = e1 - e0, E_all = layer.num_experts, H = layer.hidden, I = layer.inter;
  d.experts = E;
  d.hidden = H;
  d.inter = I;
  d.gated = layer.gated;
  const int64_t rows13 = layer.gated ? 2 * I : I;
  d.w13.resize(static_cast<size_t>(E * rows13 * H));
  d.w2.resize(static_cast<size_t>(E * H * I));
  auto check = [&](const TensorView& v, const Shape& want) {
    if (v.shape != want)
      throw Error(ErrorCode::kBadShape, (fs::path(ckpt.dir()) / ckpt.shard_of(v.name)).string(),
                  v.name, "shape " + shape_str(v.shape) + ", expected " + shape_str(want));
  };
  // Only plain weights are read: refuse extra expert tensors (gpt-oss biases) rather than
  // return the experts without them.
  auto refuse_extra = [&](const std::map<std::string, std::string>& by_suffix) {
    for (const auto& [suffix, name] : by_suffix)
      if (suffix != "" && suffix != "weight")
        throw Error(ErrorCode::kUnsupported, (fs::path(ckpt.dir()) / ckpt.shard_of(name)).string(),
                    name,
                    "expert tensor '" + suffix +
                        "' (e.g. an expert bias) is not carried by any "
                        "moepack layout; refusing rather than dropping it");
  };
  if (layer.family == MoeFamily::kFused3d || layer.family == MoeFamily::kGptOss) {
    refuse_extra(layer.fused_gate_up);
    refuse_extra(layer.fused_down);
    const TensorView gu = ckpt.view(layer.fused_gate_up.at(""));
    const TensorView dn = ckpt.view(layer.fused_down.at(""));
    check(gu, {E_all, H, 2 * I});
    check(dn, {E_all, I, H});
    const bool interleaved = layer.family == MoeFamily::kGptOss;  // even = gate, odd = up
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < 2 * I; ++c) {
          const int64_t row = interleaved ? (c % 2) * I + c / 2 : c;  // logical [gate; up] row
          d.w13[static_cast<size_t>((e * rows13 + row) * H + h)] =
              read_float(gu, ((e0 + e) * H + h) * 2 * I + c);
        }
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < I; ++i)
        for (int64_t h = 0; h < H; ++h)
          d.w2[static_cast<size_t>((e * H + h) * I + i)] =
              read_float(dn, ((e0 + e) * I + i) * H + h);
    return d;
  }
  for (int64_t e = 0; e < E; ++e) {
    const auto& ex = layer.experts[static_cast<size_t>(e0 + e)];
    for (const auto& by_suffix : ex) refuse_extra(by_suffix);
    int64_t row = 0;
    for (int p : {kGate, kUp}) {
      if (p == kGate && !layer.gated) continue;
      const TensorView v = ckpt.view(ex[p].at("weight"));
      check(v, {I, H});
      for (int64_t i = 0; i < I * H; ++i)
        d.w13[static_cast<size_t>((e * rows13 + row) * H + i)] = read_float(v, i);
      row += I;
    }
    const TensorView v = ckpt.view(ex[kDown].at("weight"));
    check(v, {H, I});
    for (int64_t i = 0; i < H * I; ++i) d.w2[static_cast<size_t>(e * H * I + i)] = read_float(v, i);
  }
  return d;
}

}  // namespace moepack
