#include "model/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "io/json_file.h"
#include "io/safetensors_index.h"

namespace moepack {

namespace {
// A vLLM FusedMoE parameter name after "<module>.experts.": w13_*/w2_*, directly (vLLM 2026-05) or
// under the runner's routed_experts child (vLLM 0.33), as moepack writes them.
bool is_fused_moe_param(std::string rest) {
  const std::string child = "routed_experts.";
  if (rest.rfind(child, 0) == 0) rest = rest.substr(child.size());
  return (rest.rfind("w13_", 0) == 0 || rest.rfind("w2_", 0) == 0) &&
         rest.find('.') == std::string::npos;
}
}  // namespace

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

const char* const kIndexName = kSafetensorsIndexName;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t layer_number(const std::string& module) {
  const auto pos = module.rfind("layers.");
  if (pos == std::string::npos) return -1;
  size_t i = pos + 7;
  int64_t v = 0;
  int digits = 0;
  while (i < module.size() && std::isdigit(static_cast<unsigned char>(module[i]))) {
    if (++digits > 9) return -1;  // no real model has a billion layers; never overflow
    v = v * 10 + (module[i] - '0');
    ++i;
  }
  return digits ? v : -1;
}

int proj_of(const std::string& name) {
  if (name == "gate_proj" || name == "w1") return kGate;
  if (name == "up_proj" || name == "w3") return kUp;
  if (name == "down_proj" || name == "w2") return kDown;
  return -1;
}

// The index and the shards it names agree exactly, in both directions: every weight_map entry
// is in the shard it names, and every tensor of those shards is in weight_map. A loader that
// follows the index would otherwise miss a tensor or look for one that is not there.
void check_index_agrees(const std::map<std::string, std::string>& index_map,
                        const std::map<std::string, std::string>& where,
                        const std::vector<std::string>& order, const std::string& index_path,
                        const std::string& dir) {
  for (const auto& [tensor, shard] : index_map) {
    auto it = where.find(tensor);
    if (it == where.end())
      throw Error(ErrorCode::kMissingTensor, (fs::path(dir) / shard).string(), tensor,
                  "listed in " + std::string(kIndexName) + " but not in the shard");
    if (it->second != shard)
      throw Error(ErrorCode::kBadConfig, index_path, tensor,
                  "index says " + shard + " but the tensor is in " + it->second);
  }
  for (const auto& tensor : order)
    if (!index_map.count(tensor))
      throw Error(ErrorCode::kBadConfig, index_path, tensor,
                  "stored in " + where.at(tensor) + " but not listed in weight_map");
}

// The source names a file "moepack.json": a converted checkpoint (convert it from its source),
// or a stray manifest that an output would then carry next to its own.
void refuse_reserved_files(const std::vector<std::string>& other_files, const std::string& dir) {
  for (const auto& rel : other_files)
    if (rel == "moepack.json")
      throw Error(ErrorCode::kBadConfig, (fs::path(dir) / rel).string(), "",
                  "a source holds no moepack.json (the name of a converted checkpoint's "
                  "manifest): convert from the original checkpoint, or remove the file");
}

}  // namespace

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  auto c = std::unique_ptr<Checkpoint>(new Checkpoint());
  c->dir_ = dir;
  {
    std::error_code ec;
    const fs::file_status st = fs::status(dir, ec);
    if (ec && ec.value() == ELOOP)
      throw Error(ErrorCode::kBadConfig, dir, "", "symlink loop (" + ec.message() + ")");
    if (st.type() != fs::file_type::directory)
      throw Error(ErrorCode::kIo, dir, "",
                  ec && st.type() != fs::file_type::not_found ? "cannot stat: " + ec.message()
                                                              : "not a directory");
  }
  c->config_ = load_hf_config(dir);

  const std::string index_path = (fs::path(dir) / kIndexName).string();
  std::map<std::string, std::string> index_map;
  if (regular_file_or_missing(index_path) == PathKind::kRegular) {
    c->indexed_ = true;
    const SafetensorsIndex idx = read_safetensors_index(index_path);
    index_map = idx.weight_map;
    c->shard_names_ = idx.shard_names;
  } else if (regular_file_or_missing((fs::path(dir) / "model.safetensors").string()) ==
             PathKind::kRegular) {
    c->shard_names_ = {"model.safetensors"};
  } else {
    throw Error(ErrorCode::kMissingTensor, dir, "",
                "no model.safetensors and no model.safetensors.index.json");
  }

  for (const auto& s : c->shard_names_) {
    const std::string p = (fs::path(dir) / s).string();
    if (regular_file_or_missing(p) == PathKind::kMissing) {
      // The index is what is wrong (or the checkpoint is incomplete): an input error, never an
      // environment error a pipeline would retry.
      std::string tensor;
      for (const auto& [t, shard] : index_map)
        if (shard == s) tensor = t;
      throw Error(ErrorCode::kBadConfig, index_path, tensor,
                  "weight_map names shard " + s + ", which does not exist in " + dir);
    }
    c->add_shard(s, SafetensorsFile::open(p));
  }
  if (c->indexed_) check_index_agrees(index_map, c->where_, c->tensor_order_, index_path, dir);

  // Files to carry over: everything that is not a weight shard, the index or config.json.
  // Symlinks to directories are not followed (no loops); a symlink loop is named, a dangling
  // symlink, FIFO, socket or device is not a file to carry.
  std::error_code ec;
  auto it = fs::recursive_directory_iterator(dir, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const auto rel = it->path().lexically_relative(dir).string();
    std::error_code sec;
    const fs::file_status st = it->status(sec);
    if (sec && sec.value() == ELOOP)
      throw Error(ErrorCode::kBadConfig, it->path().string(), "",
                  "symlink loop (" + sec.message() + ")");
    if (st.type() == fs::file_type::directory) {
      if (!rel.empty() && rel[0] == '.') it.disable_recursion_pending();
      continue;
    }
    if (st.type() != fs::file_type::regular) continue;
    if (rel.empty() || rel[0] == '.' || ends_with(rel, ".safetensors") || rel == kIndexName ||
        rel == "config.json" || c->shards_.count(rel))
      continue;
    c->other_files_.push_back(rel);
  }
  if (ec)
    throw Error(ec.value() == ELOOP ? ErrorCode::kBadConfig : ErrorCode::kIo, dir, "",
                "cannot list the checkpoint directory: " + ec.message());
  std::sort(c->other_files_.begin(), c->other_files_.end());
  // A converted checkpoint holds its own manifest (convert refuses it as a source by its config,
  // inspect and verify read it).
  if (c->config_.moepack_quant.is_null()) refuse_reserved_files(c->other_files_, dir);

  // The experts' scheme, resolved per module as the producer's config assigns it (regex targets,
  // dynamic overrides): every routed expert Linear must resolve to the same one.
  std::vector<std::string> expert_linears;
  {
    std::set<std::string> seen;
    for (const auto& name : c->tensor_order_) {
      const auto pos = name.find(".experts.");
      if (pos == std::string::npos || pos + 9 >= name.size() ||
          !std::isdigit(static_cast<unsigned char>(name[pos + 9])))
        continue;
      const std::string linear = name.substr(0, name.rfind('.'));
      if (seen.insert(linear).second) expert_linears.push_back(linear);
    }
  }
  c->config_.quant = quant_for_modules(c->config_, expert_linears);

  c->discover_moe();
  c->check_routing();
  return c;
}

void Checkpoint::add_shard(const std::string& name, SafetensorsFile file) {
  const std::string p = (fs::path(dir_) / name).string();
  auto [sit, fresh] = shards_.emplace(name, std::move(file));
  if (!fresh) throw Error(ErrorCode::kDuplicateTensor, p, "", "shard listed twice");
  for (const auto& e : sit->second.entries()) {
    auto [it, inserted] = where_.emplace(e.name, name);
    if (!inserted)
      throw Error(ErrorCode::kDuplicateTensor, p, e.name,
                  "tensor also present in shard " + it->second);
    tensor_order_.push_back(e.name);
  }
}

std::unique_ptr<Checkpoint> Checkpoint::from_shards(
    const std::string& dir, HfConfig config,
    std::vector<std::pair<std::string, SafetensorsFile>> shards) {
  auto c = std::unique_ptr<Checkpoint>(new Checkpoint());
  c->dir_ = dir;
  c->config_ = std::move(config);
  for (auto& [name, file] : shards) {
    c->shard_names_.push_back(name);
    c->add_shard(name, std::move(file));
  }
  c->discover_moe();
  c->check_routing();
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

namespace {

// A canonical non-negative decimal of at most 9 digits ("0", "17"; never "01", "+1", "1a" or a
// 20-digit number): an expert or layer id. -1 when `s` is not one.
int64_t canonical_id(const std::string& s) {
  if (s.empty() || s.size() > 9 || (s.size() > 1 && s[0] == '0')) return -1;
  int64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return -1;
    v = v * 10 + (ch - '0');
  }
  return v;
}

const char* kExpertNameForms =
    "expected <module>.experts.<id>.<gate_proj|up_proj|down_proj|w1|w3|w2>.<tensor> with <id> a "
    "canonical decimal (0, 1, ... without leading zeros), or <module>.experts.<gate_up_proj|"
    "down_proj>[_blocks|_scales|_bias] for fused experts";

}  // namespace

namespace {

using ExpertLinears = std::array<std::map<std::string, std::string>, 3>;  // proj -> suffix -> name

std::string file_of(const Checkpoint& ckpt, const std::string& tensor) {
  return (fs::path(ckpt.dir()) / ckpt.shard_of(tensor)).string();
}

// The expert tensors of a checkpoint grouped by MoE module, as the names say: per-expert families
// by expert id and projection, fused ones by tensor. Names are parsed strictly (kExpertNameForms)
// and a module keeps the naming family of its first expert tensor.
struct ExpertTensors {
  std::map<std::string, MoeLayer> by_module;  // module, family, fused tensors, source_tensors
  std::map<std::string, std::map<int64_t, ExpertLinears>> per_expert;  // module -> id -> linears
  std::set<std::string> names;                                         // every expert tensor
};

// Granite's fused experts: true when `name` is one ("<module>.input_linear.<tensor>" or
// output_linear, module ending in block_sparse_moe), recorded as a fused 3-D layer.
template <class CheckFamily>
bool add_granite_expert(const std::string& name, const CheckFamily& check_family,
                        ExpertTensors* out) {
  static const std::string kBlock = ".block_sparse_moe.";
  const size_t pos = name.find(kBlock);
  if (pos == std::string::npos) return false;
  const std::string module = name.substr(0, pos + kBlock.size() - 1);
  const std::string rest = name.substr(pos + kBlock.size());
  const bool in = rest.rfind("input_linear.", 0) == 0, outp = rest.rfind("output_linear.", 0) == 0;
  if (!in && !outp) return false;
  std::string suffix = rest.substr(rest.find('.') + 1);
  if (suffix == "weight") suffix = "";
  check_family(module, MoeFamily::kFused3d, name);
  MoeLayer& L = out->by_module[module];
  (in ? L.fused_gate_up : L.fused_down)[suffix] = name;
  L.source_tensors.push_back(name);
  out->names.insert(name);
  return true;
}

ExpertTensors group_expert_tensors(const Checkpoint& ckpt) {
  ExpertTensors out;
  std::map<std::string, std::string> first_of_module;  // module -> its first expert tensor
  auto bad_name = [&](const std::string& name, const std::string& why) {
    throw Error(ErrorCode::kBadConfig, file_of(ckpt, name), name, why + "; " + kExpertNameForms);
  };
  // One naming family per layer: the first expert tensor of a module fixes it.
  auto check_family = [&](const std::string& module, MoeFamily family, const std::string& name) {
    auto [first, fresh] = first_of_module.emplace(module, name);
    MoeLayer& L = out.by_module[module];
    if (fresh) {
      L.module = module;
      L.layer = layer_number(module);
      L.param_prefix = module + ".experts.";
      L.family = family;
    } else if (L.family != family) {
      throw Error(ErrorCode::kBadConfig, file_of(ckpt, name), name,
                  std::string("mixes naming families in one MoE layer: this tensor is ") +
                      moe_family_name(family) + ", " + first->second + " is " +
                      moe_family_name(L.family));
    }
  };
  const bool granite = ckpt.config().model_type.rfind("granitemoe", 0) == 0;
  for (const auto& name : ckpt.tensor_names()) {
    // Granite MoE: <module>.input_linear.weight [E, 2I, H] and output_linear.weight [E, H, I]
    // (module "...block_sparse_moe"), transformers' fused experts under their own names.
    if (granite && add_granite_expert(name, check_family, &out)) continue;
    const auto pos = name.find(".experts.");
    if (pos == std::string::npos) continue;
    const std::string module = name.substr(0, pos);
    const std::string rest = name.substr(pos + 9);
    if (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest[0]))) {
      const auto dot = rest.find('.');
      const std::string id_text = rest.substr(0, dot);
      const int64_t e = canonical_id(id_text);
      if (e < 0) bad_name(name, "expert id \"" + id_text + "\" is not a canonical decimal");
      if (dot == std::string::npos) bad_name(name, "no projection after the expert id");
      const std::string tail = rest.substr(dot + 1);
      const auto dot2 = tail.find('.');
      const std::string proj_name = tail.substr(0, dot2);
      const int p = proj_of(proj_name);
      if (p < 0) bad_name(name, "unknown expert projection \"" + proj_name + "\"");
      if (dot2 == std::string::npos || dot2 + 1 == tail.size())
        bad_name(name, "no tensor name after the projection");
      const std::string suffix = tail.substr(dot2 + 1);
      check_family(module, proj_name[0] == 'w' ? MoeFamily::kMixtral : MoeFamily::kPerExpert, name);
      auto& slot = out.per_expert[module][e][p];
      auto [it, inserted] = slot.emplace(suffix, name);
      if (!inserted)  // unreachable with one naming family and unique names; kept as a guard
        throw Error(ErrorCode::kDuplicateTensor, file_of(ckpt, name), name,
                    "expert " + std::to_string(e) + " " + proj_name + "." + suffix +
                        " is also given by " + it->second);
    } else if (is_fused_moe_param(rest)) {
      continue;  // a vLLM FusedMoE parameter (a moepack output): not a source expert tensor
    } else {
      // Fused 3-D experts: gate_up_proj[_blocks|_scales|_bias], down_proj[...]
      std::string base = rest, suffix;
      for (const char* sfx : {"_blocks", "_scales", "_bias"})
        if (ends_with(rest, sfx)) {
          suffix = sfx + 1;
          base = rest.substr(0, rest.size() - std::string(sfx).size());
        }
      const MoeFamily family =
          ckpt.config().model_type == "gpt_oss" ? MoeFamily::kGptOss : MoeFamily::kFused3d;
      if (base != "gate_up_proj" && base != "down_proj")
        bad_name(name, "unknown expert tensor \"" + rest + "\"");
      check_family(module, family, name);
      MoeLayer& L = out.by_module[module];
      if (base == "gate_up_proj")
        L.fused_gate_up[suffix] = name;
      else
        L.fused_down[suffix] = name;
    }
    out.by_module[module].source_tensors.push_back(name);
    out.names.insert(name);
  }
  return out;
}

// One tensor of a gpt-oss layer: present, of shape `want` and of one of `dtypes`; kMissingTensor,
// kBadShape or kBadDtype naming it and its shard.
TensorView gpt_oss_tensor(const Checkpoint& ckpt, const MoeLayer& L,
                          const std::map<std::string, std::string>& by_suffix,
                          const std::string& base, const std::string& suffix, const Shape& want,
                          const std::vector<DType>& dtypes, const std::string& what) {
  auto it = by_suffix.find(suffix);
  if (it == by_suffix.end())
    throw Error(ErrorCode::kMissingTensor, file_of(ckpt, L.source_tensors.front()),
                L.param_prefix + base + "_" + suffix,
                "gpt-oss MXFP4 experts need " + base +
                    "_blocks, _scales and _bias; this one is "
                    "missing (" +
                    what + ")");
  const TensorView v = ckpt.view(it->second);
  if (!want.empty() && v.shape != want)
    throw Error(
        ErrorCode::kBadShape, file_of(ckpt, v.name), v.name,
        "shape " + shape_str(v.shape) + ", expected " + shape_str(want) + " (" + what + ")");
  if (std::find(dtypes.begin(), dtypes.end(), v.dtype) == dtypes.end())
    throw Error(ErrorCode::kBadDtype, file_of(ckpt, v.name), v.name,
                std::string("dtype ") + dtype_name(v.dtype) + " (" + what + ")");
  return v;
}

// gpt-oss MXFP4 experts (formats/fp4.h, docs/gpt-oss.md): gate_up_proj_blocks U8
// [E, 2I, H/32, 16] gives E, 2I and H; gate_up_proj_scales [E, 2I, H/32], gate_up_proj_bias
// [E, 2I], down_proj_blocks [E, H, I/32, 16], down_proj_scales [E, H, I/32] and down_proj_bias
// [E, H] must agree. The config must say quant_method mxfp4 and must not leave the experts
// unquantized (modules_to_not_convert): the tensors alone are not read as MXFP4.
void size_gpt_oss_mxfp4_layer(const Checkpoint& ckpt, MoeLayer& L) {
  const HfConfig& config = ckpt.config();
  const std::string config_path = (fs::path(ckpt.dir()) / "config.json").string();
  const std::string blocks_name = L.param_prefix + "gate_up_proj_blocks";
  const std::string experts_module = L.param_prefix.substr(0, L.param_prefix.size() - 1);
  const std::string key = module_not_converted(config, experts_module);
  if (L.fused_gate_up.count("") || L.fused_down.count("")) {
    const std::string plain =
        L.fused_gate_up.count("") ? L.fused_gate_up.at("") : L.fused_down.at("");
    const bool mx = L.fused_gate_up.count("blocks") || L.fused_down.count("blocks") ||
                    L.fused_gate_up.count("scales") || L.fused_down.count("scales");
    if (mx)
      throw Error(ErrorCode::kBadConfig, file_of(ckpt, plain), plain,
                  "gpt-oss experts of " + L.module +
                      " mix plain (bf16) and MXFP4 (_blocks / _scales) tensors");
    if (!key.empty())
      throw Error(ErrorCode::kUnsupported, config.quant_file, plain,
                  "quantization_config (quant_method \"mxfp4\") leaves " + experts_module +
                      " unquantized (modules_to_not_convert entry \"" + key +
                      "\"): moepack reads gpt-oss experts all MXFP4, or from a bf16 checkpoint "
                      "without quantization_config");
    throw Error(ErrorCode::kBadConfig, config_path, plain,
                "config.json says quant_method \"mxfp4\" and no modules_to_not_convert entry "
                "names " +
                    experts_module + ", but " + plain + " is a plain " +
                    dtype_name(ckpt.view(plain).dtype) +
                    " tensor (MXFP4 experts are _blocks / _scales)");
  }
  if (config.quant.method != QuantMethod::kGptOssMxfp4)
    throw Error(ErrorCode::kBadConfig, config_path, blocks_name,
                "the experts of " + L.module +
                    " are MXFP4 (_blocks / _scales) but config.json's quantization_config does "
                    "not say quant_method \"mxfp4\" (" +
                    (config.quant.method == QuantMethod::kNone
                         ? std::string("none")
                         : std::string(quant_method_name(config.quant.method))) +
                    ")");
  if (!key.empty())
    throw Error(ErrorCode::kBadConfig, config.quant_file, blocks_name,
                "quantization_config.modules_to_not_convert entry \"" + key + "\" leaves " +
                    experts_module + " unquantized, but its tensors are MXFP4");
  const std::vector<DType> u8 = {DType::kU8}, e8m0 = {DType::kU8, DType::kF8_E8M0},
                           floats = {DType::kBF16, DType::kF16, DType::kF32};
  const TensorView gb = gpt_oss_tensor(ckpt, L, L.fused_gate_up, "gate_up_proj", "blocks", {}, u8,
                                       "[E, 2I, H/32, 16] uint8, two e2m1 codes per byte");
  if (gb.shape.size() != 4 || gb.shape[3] != 16 || gb.shape[1] % 2 != 0)
    throw Error(ErrorCode::kBadShape, file_of(ckpt, gb.name), gb.name,
                "shape " + shape_str(gb.shape) +
                    ", expected [E, 2I, H/32, 16] (gate/up rows interleaved, 32 codes per block)");
  const int64_t E = gb.shape[0], I = gb.shape[1] / 2, H = gb.shape[2] * 32;
  if (I % 32 != 0)
    throw Error(ErrorCode::kBadShape, file_of(ckpt, gb.name), gb.name,
                "intermediate size " + std::to_string(I) + " (" + shape_str(gb.shape) +
                    ") is not a multiple of the MXFP4 block 32 that down_proj_blocks needs");
  gpt_oss_tensor(ckpt, L, L.fused_gate_up, "gate_up_proj", "scales", {E, 2 * I, H / 32}, e8m0,
                 "E8M0 scale per block of 32");
  gpt_oss_tensor(ckpt, L, L.fused_gate_up, "gate_up_proj", "bias", {E, 2 * I}, floats,
                 "interleaved gate/up bias");
  gpt_oss_tensor(ckpt, L, L.fused_down, "down_proj", "blocks", {E, H, I / 32, 16}, u8,
                 "[E, H, I/32, 16] uint8, two e2m1 codes per byte");
  gpt_oss_tensor(ckpt, L, L.fused_down, "down_proj", "scales", {E, H, I / 32}, e8m0,
                 "E8M0 scale per block of 32");
  gpt_oss_tensor(ckpt, L, L.fused_down, "down_proj", "bias", {E, H}, floats, "down bias");
  for (const auto* m : {&L.fused_gate_up, &L.fused_down})
    for (const auto& [suffix, name] : *m)
      if (suffix != "blocks" && suffix != "scales" && suffix != "bias")
        throw Error(ErrorCode::kUnsupported, file_of(ckpt, name), name,
                    "unexpected tensor beside gpt-oss MXFP4 experts");
  L.num_experts = E;
  L.hidden = H;
  L.inter = I;
  L.gated = true;
  L.fused_out_in = false;
  if (config.num_experts_key.size() && config.num_experts != E)
    throw Error(ErrorCode::kBadConfig, config_path, gb.name,
                config.num_experts_key + " is " + std::to_string(config.num_experts) + " but " +
                    gb.name + " holds " + std::to_string(E) + " experts " + shape_str(gb.shape));
}

// E, H and I of a fused 3-D layer from gate_up_proj [E, H, 2I] and down_proj [E, I, H].
void size_fused_layer(const Checkpoint& ckpt, MoeLayer& L) {
  const HfConfig& config = ckpt.config();
  const std::string shard_file = file_of(ckpt, L.source_tensors.front());
  if (L.family == MoeFamily::kGptOss &&
      (L.fused_gate_up.count("blocks") || L.fused_down.count("blocks") ||
       config.quant.method == QuantMethod::kGptOssMxfp4))
    return size_gpt_oss_mxfp4_layer(ckpt, L);
  if (!L.fused_gate_up.count("") || !L.fused_down.count(""))
    throw Error(ErrorCode::kMissingTensor, shard_file, L.param_prefix + "gate_up_proj",
                "fused experts need both gate_up_proj and down_proj");
  const TensorView gu = ckpt.view(L.fused_gate_up.at("")), dn = ckpt.view(L.fused_down.at(""));
  if (gu.shape.size() != 3 || dn.shape.size() != 3)
    throw Error(
        ErrorCode::kBadShape, shard_file, gu.name,
        "fused experts must be 3-D, got " + shape_str(gu.shape) + " and " + shape_str(dn.shape));
  // [E, H, 2I] + [E, I, H], or transformers' in-memory [E, 2I, H] + [E, H, I]: the shapes decide
  // (both at once would need I = 0). gpt-oss keeps its own [E, H, 2I] interleaved form.
  const bool in_out = gu.shape[2] % 2 == 0 && dn.shape[0] == gu.shape[0] &&
                      dn.shape[1] == gu.shape[2] / 2 && dn.shape[2] == gu.shape[1];
  const bool out_in = L.family == MoeFamily::kFused3d && gu.shape[1] % 2 == 0 &&
                      dn.shape[0] == gu.shape[0] && dn.shape[1] == gu.shape[2] &&
                      dn.shape[2] == gu.shape[1] / 2;
  // Same experts and the model's hidden size in each, in another arrangement: a layout moepack
  // does not read (exit 4), not a corrupt checkpoint.
  const int64_t Hc = config.hidden_size;
  const int64_t g_other = gu.shape[1] == Hc ? gu.shape[2] : gu.shape[1];  // 2I
  const int64_t d_other = dn.shape[1] == Hc ? dn.shape[2] : dn.shape[1];  // I
  const bool other_layout = !in_out && !out_in && Hc > 0 && dn.shape[0] == gu.shape[0] &&
                            (gu.shape[1] == Hc || gu.shape[2] == Hc) &&
                            (dn.shape[1] == Hc || dn.shape[2] == Hc) && g_other == 2 * d_other;
  if (other_layout)
    throw Error(ErrorCode::kUnsupported, shard_file, gu.name,
                "fused experts gate_up_proj " + shape_str(gu.shape) + " with down_proj " +
                    shape_str(dn.shape) + " (hidden_size " + std::to_string(Hc) +
                    "): this arrangement is not supported (supported: [E, H, 2I] with [E, I, H], "
                    "and transformers' [E, 2I, H] with [E, H, I])");
  if (!in_out && !out_in)
    throw Error(ErrorCode::kBadShape, shard_file, dn.name,
                "down_proj " + shape_str(dn.shape) + " does not match gate_up_proj " +
                    shape_str(gu.shape) +
                    " ([E, H, 2I] and [E, I, H], or [E, 2I, H] and [E, H, I])");
  L.fused_out_in = out_in;
  L.num_experts = gu.shape[0];
  L.hidden = out_in ? gu.shape[2] : gu.shape[1];
  L.inter = out_in ? gu.shape[1] / 2 : gu.shape[2] / 2;
  L.gated = true;
  if (config.num_experts_key.size() && config.num_experts != L.num_experts)
    throw Error(ErrorCode::kBadConfig, (fs::path(ckpt.dir()) / "config.json").string(), gu.name,
                config.num_experts_key + " is " + std::to_string(config.num_experts) + " but " +
                    gu.name + " holds " + std::to_string(L.num_experts) + " experts " +
                    shape_str(gu.shape));
}

// Expert ids are contiguous from 0 and as many as the config's expert count; errors name the
// tensors on both sides of the first missing id.
void check_expert_ids(const Checkpoint& ckpt, const MoeLayer& L,
                      const std::map<int64_t, ExpertLinears>& ex) {
  const HfConfig& config = ckpt.config();
  const std::string config_path = (fs::path(ckpt.dir()) / "config.json").string();
  auto any_tensor = [&](int64_t e) {  // a tensor of expert e, for messages
    for (const auto& m : ex.at(e))
      if (!m.empty()) return m.begin()->second;
    return std::string();
  };
  int64_t expect = 0;
  for (const auto& [e, projs] : ex) {
    if (e != expect) {
      const std::string after = any_tensor(e);
      if (expect == 0)
        throw Error(
            ErrorCode::kMissingTensor, file_of(ckpt, after), after,
            "expert ids do not start at 0: expert 0 is missing (first found: " + after + ")");
      const std::string before = any_tensor(expect - 1);
      throw Error(ErrorCode::kMissingTensor, file_of(ckpt, after), after,
                  "expert ids are not contiguous: expert " + std::to_string(expect) +
                      " is missing between " + before + " and " + after);
    }
    ++expect;
  }
  if (!config.num_experts_key.size() || config.num_experts == L.num_experts) return;
  const int64_t want = config.num_experts;
  if (L.num_experts > want) {
    const std::string extra = any_tensor(want);
    throw Error(ErrorCode::kBadConfig, file_of(ckpt, extra), extra,
                "expert " + std::to_string(want) + " is beyond " + config_path + " " +
                    config.num_experts_key + " = " + std::to_string(want) + " (" +
                    std::to_string(L.num_experts) + " experts found, the last " +
                    any_tensor(L.num_experts - 1) + ")");
  }
  const std::string last = any_tensor(L.num_experts - 1);
  throw Error(ErrorCode::kMissingTensor, file_of(ckpt, last),
              L.param_prefix + std::to_string(L.num_experts),
              config_path + " " + config.num_experts_key + " = " + std::to_string(want) +
                  " but only experts 0.." + std::to_string(L.num_experts - 1) +
                  " are present (the last found: " + last + "); expert " +
                  std::to_string(L.num_experts) + " is missing");
}

// Expert 0 carries every tensor its format needs (every expert has expert 0's suffixes, checked
// before): a missing one is named in full, with what the config made the format, before any
// shape is read from the others.
void check_required_suffixes(const Checkpoint& ckpt, const MoeLayer& L) {
  const HfConfig& config = ckpt.config();
  const QuantParams& q = config.quant;
  const SourceCodec* codec = find_source_codec(q.method);
  if (!codec && q.method != QuantMethod::kNone) return;  // refused by the plan, naming the method
  const std::vector<std::string> required =
      codec ? codec->required_suffixes(q) : std::vector<std::string>{"weight"};
  for (int p = 0; p < 3; ++p) {
    if (p == kGate && !L.gated) continue;
    const auto& have = L.experts[0][p];
    for (const auto& suffix : required) {
      if (have.count(suffix)) continue;
      const std::string first = have.begin()->second;
      // A float 'weight' where the declared format needs its own tensors: the producer left the
      // experts unquantized (GPTQModel 7.7 does for Granite MoE and MiniMax-M2 under
      // transformers 5.23), as refuse_float_fused_experts says for fused ones: unsupported, not
      // corrupt.
      const auto w = have.find("weight");
      const DType wd = w == have.end() ? DType::kU8 : ckpt.view(w->second).dtype;
      if (codec && (wd == DType::kBF16 || wd == DType::kF16 || wd == DType::kF32))
        throw Error(ErrorCode::kUnsupported, file_of(ckpt, w->second), w->second,
                    std::string("the expert Linears are ") + dtype_name(wd) +
                        " 'weight' tensors, not quantized, although " +
                        (config.quant_file.empty() ? "config.json" : config.quant_file) +
                        " declares " + quant_method_name(q.method) +
                        ": the producer left them unquantized, and moepack reads experts as the "
                        "config declares them");
      std::string found, wanted;
      for (const auto& [sfx, name] : have) found += (found.empty() ? "" : ", ") + sfx;
      for (const auto& r : required) wanted += (wanted.empty() ? "" : ", ") + r;
      const std::string why =
          codec ? std::string(quant_method_name(q.method)) + " experts (as " +
                      (config.quant_file.empty() ? "config.json" : config.quant_file) +
                      " declares them) need " + wanted
                : "no quantization config (config.json quantization_config, hf_quant_config.json "
                  "or quantize_config.json): the experts are read as unquantized and need "
                  "'weight'";
      throw Error(ErrorCode::kMissingTensor, file_of(ckpt, first),
                  first.substr(0, first.rfind('.') + 1) + suffix,
                  "required tensor missing: " + why + "; found " + found);
    }
  }
}

// E, H and I of a per-expert layer, and its experts: every one with expert 0's projections,
// tensor suffixes and logical Linear shapes (shape metadata only, no bytes).
void size_per_expert_layer(const Checkpoint& ckpt, MoeLayer& L,
                           const std::map<int64_t, ExpertLinears>& ex) {
  const QuantParams& quant = ckpt.config().quant;
  const std::string shard_file = file_of(ckpt, L.source_tensors.front());
  L.num_experts = static_cast<int64_t>(ex.size());
  check_expert_ids(ckpt, L, ex);
  // Gated when any expert has a gate: one without it is then a missing tensor, not a reason to
  // drop every other expert's gate.
  bool has_gate = false;
  for (const auto& [e, projs] : ex) has_gate |= !projs[kGate].empty();
  L.gated = has_gate;
  for (const auto& [e, projs] : ex) {
    for (int p = 0; p < 3; ++p) {
      if (p == kGate && !has_gate) continue;
      if (projs[p].empty() || projs[p] != ex.begin()->second[p]) {
        const bool missing = projs[p].empty();
        std::set<std::string> want, have;
        for (auto& [sfx, n] : ex.begin()->second[p]) want.insert(sfx);
        for (auto& [sfx, n] : projs[p]) have.insert(sfx);
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
  check_required_suffixes(ckpt, L);
  const auto [n1, k1] = linear_shape(ckpt, quant, L.experts[0][has_gate ? kGate : kUp]);
  const auto [n2, k2] = linear_shape(ckpt, quant, L.experts[0][kDown]);
  L.inter = n1;
  L.hidden = k1;
  if (n2 != L.hidden || k2 != L.inter)
    throw Error(
        ErrorCode::kBadShape, shard_file, L.experts[0][kDown].begin()->second,
        "down projection is [" + std::to_string(n2) + ", " + std::to_string(k2) +
            "], expected [H=" + std::to_string(L.hidden) + ", I=" + std::to_string(L.inter) +
            "] (logical shapes read as " + quant_method_name(quant.method) +
            " bits=" + std::to_string(quant.bits) + " from " +
            (ckpt.config().quant_file.empty() ? "config.json" : ckpt.config().quant_file) + ")");
  for (size_t e = 1; e < L.experts.size(); ++e)
    for (int p = 0; p < 3; ++p) {
      if (p == kGate && !has_gate) continue;
      const auto nk = linear_shape(ckpt, quant, L.experts[e][p]);
      const std::pair<int64_t, int64_t> want = p == kDown
                                                   ? std::pair<int64_t, int64_t>{L.hidden, L.inter}
                                                   : std::pair<int64_t, int64_t>{L.inter, L.hidden};
      if (nk != want) {
        const std::string& t = L.experts[e][p].begin()->second;
        throw Error(ErrorCode::kBadShape, file_of(ckpt, t), t.substr(0, t.rfind('.')),
                    "expert " + std::to_string(e) + " is [" + std::to_string(nk.first) + ", " +
                        std::to_string(nk.second) + "] where expert 0 is [" +
                        std::to_string(want.first) + ", " + std::to_string(want.second) + "]");
      }
    }
}

// Every extent positive, and the config's hidden size, intermediate size and top-k agree with
// the experts.
void check_layer_against_config(const Checkpoint& ckpt, const MoeLayer& L) {
  const HfConfig& config = ckpt.config();
  const std::string config_path = (fs::path(ckpt.dir()) / "config.json").string();
  const std::string& first = L.source_tensors.front();
  if (L.num_experts <= 0 || L.hidden <= 0 || L.inter <= 0)
    throw Error(ErrorCode::kBadShape, file_of(ckpt, first), first,
                "experts of " + L.module + " have E=" + std::to_string(L.num_experts) +
                    " H=" + std::to_string(L.hidden) + " I=" + std::to_string(L.inter) +
                    ": every extent must be positive");
  if (config.hidden_size && config.hidden_size != L.hidden)
    throw Error(ErrorCode::kBadConfig, config_path, first,
                config.hidden_size_key + " is " + std::to_string(config.hidden_size) +
                    " but the experts of " + L.module + " have hidden size " +
                    std::to_string(L.hidden) + " (" + first + ")");
  if (config.moe_intermediate_size && config.moe_intermediate_size != L.inter)
    throw Error(ErrorCode::kBadConfig, config_path, first,
                config.moe_intermediate_size_key + " is " +
                    std::to_string(config.moe_intermediate_size) + " but the experts of " +
                    L.module + " have intermediate size " + std::to_string(L.inter) + " (" + first +
                    ")");
  if (!config.top_k_key.empty() && (config.top_k < 1 || config.top_k > L.num_experts))
    throw Error(ErrorCode::kBadConfig, config_path, L.param_prefix,
                config.top_k_key + " is " + std::to_string(config.top_k) + ": must be in [1, " +
                    std::to_string(L.num_experts) + "], the " + std::to_string(L.num_experts) +
                    " experts of " + L.module);
}

// One MoE block per decoder layer: "layers.3.mlp.experts.*" next to
// "layers.3.block_sparse_moe.experts.*" are two naming families for one layer's experts.
// `layers` is sorted by (layer, module).
void check_one_block_per_decoder_layer(const Checkpoint& ckpt,
                                       const std::vector<MoeLayer>& layers) {
  const auto decoder_layer = [](const std::string& m) {
    const auto pos = m.rfind("layers.");
    const auto end = pos == std::string::npos ? pos : m.find('.', pos + 7);
    return end == std::string::npos ? m : m.substr(0, end);
  };
  for (size_t i = 1; i < layers.size(); ++i) {
    const MoeLayer &a = layers[i - 1], &b = layers[i];
    if (a.layer >= 0 && a.layer == b.layer && decoder_layer(a.module) == decoder_layer(b.module))
      throw Error(ErrorCode::kBadConfig, file_of(ckpt, b.source_tensors.front()),
                  b.source_tensors.front(),
                  "mixes naming families in one decoder layer: experts under " + a.module + " (" +
                      a.source_tensors.front() + ") and under " + b.module);
  }
}

}  // namespace

void Checkpoint::discover_moe() {
  if (config_.quant.method == QuantMethod::kGptOssMxfp4 && config_.model_type != "gpt_oss")
    throw Error(ErrorCode::kUnsupported, config_.quant_file, "",
                "quant_method \"mxfp4\" is gpt-oss' own format (fused _blocks / _scales experts); "
                "moepack reads it for model_type gpt_oss only, this is \"" +
                    config_.model_type + "\"");
  ExpertTensors found = group_expert_tensors(*this);
  for (auto& [module, L] : found.by_module) {
    if (L.source_tensors.empty()) continue;
    if (L.family == MoeFamily::kFused3d || L.family == MoeFamily::kGptOss)
      size_fused_layer(*this, L);
    else
      size_per_expert_layer(*this, L, found.per_expert[module]);
    check_layer_against_config(*this, L);
    if (!config_.gated) L.gated = false;
    layers_.push_back(std::move(L));
  }
  std::sort(layers_.begin(), layers_.end(), [](const MoeLayer& a, const MoeLayer& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.module < b.module;
  });
  check_one_block_per_decoder_layer(*this, layers_);
  for (const auto& name : tensor_order_)
    if (!found.names.count(name)) others_.push_back(name);
}

namespace {

// One router tensor: of the shape the experts need, float, every value finite (verify computes
// the router's logits from it; a NaN would route nowhere). A vector [n] may also be stored [1, n]
// (ERNIE-4.5's moe_statics).
void check_router_tensor(const Checkpoint& ckpt, const std::string& name, const Shape& want,
                         const std::string& what, const MoeLayer& L) {
  const std::string file = (fs::path(ckpt.dir()) / ckpt.shard_of(name)).string();
  const TensorView v = ckpt.view(name);
  const bool row_vector = want.size() == 1 && v.shape == Shape{1, want[0]};
  if (v.shape != want && !row_vector)
    throw Error(ErrorCode::kBadShape, file, name,
                what + " is " + shape_str(v.shape) + ", expected " +
                    (want.size() == 2
                         ? "[E=" + std::to_string(want[0]) + ", H=" + std::to_string(want[1]) + "]"
                         : "[" + std::to_string(want[0]) + "]") +
                    " for the experts of " + L.module);
  if (v.dtype != DType::kBF16 && v.dtype != DType::kF16 && v.dtype != DType::kF32)
    throw Error(ErrorCode::kBadDtype, file, name,
                what + " is " + dtype_name(v.dtype) + ", expected BF16, F16 or F32 values");
  const std::vector<float> values = to_floats(v);
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      throw Error(ErrorCode::kBadValue, file, name,
                  what + " holds a non-finite value at index " + std::to_string(i));
}

// The router is read by vLLM's MoE block as a plain float weight and by verify to route tokens:
// a quantized one would be copied through as bytes nothing can load. Refused under every name a
// router goes by in any family (router_tensor_prefixes: gate., router., router.layer.,
// router.proj.), exit 4.
void refuse_quantized_router(const Checkpoint& ckpt, const MoeLayer& L) {
  static const char* kQuantSuffixes[] = {"qweight",
                                         "qzeros",
                                         "scales",
                                         "g_idx",
                                         "weight_packed",
                                         "weight_scale",
                                         "weight_zero_point",
                                         "weight_scale_inv",
                                         "weight_shape",
                                         "weight_global_scale",
                                         "input_scale",
                                         "weight_scale_2",
                                         "biases",
                                         "weight"};
  for (const std::string& prefix : router_tensor_prefixes(L.module))
    for (const char* suffix : kQuantSuffixes) {
      const std::string name = prefix + suffix;
      if (!ckpt.has_tensor(name)) continue;
      const DType d = ckpt.view(name).dtype;
      if (std::string(suffix) == "weight" &&
          (d == DType::kBF16 || d == DType::kF16 || d == DType::kF32))
        continue;
      throw Error(ErrorCode::kUnsupported, file_of(ckpt, name), name,
                  "the MoE router " + prefix.substr(0, prefix.size() - 1) + " is quantized (" +
                      suffix + " " + dtype_name(d) +
                      "); vLLM's MoE block and moepack verify read an unquantized router weight. "
                      "Leave the router out of quantization (ignore / dynamic \"-:\")");
    }
}

// The tensors that route L's experts, as verify reads them and vLLM loads them
// (router_tensor_names, by the family's row): the weight always, the bias, the correction bias
// and Gemma-4's scales exactly when the config's router uses them, each float and finite; one the
// router does not use is refused (vLLM would not load it).
void check_router(const Checkpoint& ckpt, const MoeLayer& L, const RouterConfig& router,
                  const std::string& config_path) {
  const auto exists = [&](const std::string& n) { return ckpt.has_tensor(n); };
  std::vector<std::string> unused;
  const RouterTensorNames names = router_tensor_names(L.module, router, exists, &unused);
  const std::string first_file =
      (fs::path(ckpt.dir()) / ckpt.shard_of(L.source_tensors.front())).string();
  if (names.weight.empty()) {
    const RouterTensorNames any =
        router_tensor_names(L.module, router, [](const std::string&) { return true; });
    throw Error(ErrorCode::kMissingTensor, first_file, any.weight,
                "the router of " + L.module + " is missing: expected " + any.weight + " [E=" +
                    std::to_string(L.num_experts) + ", H=" + std::to_string(L.hidden) + "] (" +
                    (router.family.empty() ? std::string("this model_type") : router.family) + ")");
  }
  check_router_tensor(ckpt, names.weight, {L.num_experts, L.hidden}, "router weight", L);
  const std::string model_type = router.family.empty() ? "this model_type" : router.family;
  struct Used {
    std::string name, what;
    int64_t size;
  };
  for (const std::string& u : unused)
    check_router_tensor(ckpt, u, {L.num_experts}, "router bias", L);
  for (const Used& u : {Used{names.bias, "router bias", L.num_experts},
                        Used{names.correction_bias, "correction bias", L.num_experts},
                        Used{names.per_expert_scale, "per-expert scale", L.num_experts},
                        Used{names.input_scale, "router input scale", L.hidden}}) {
    if (u.name.empty()) continue;
    if (!ckpt.has_tensor(u.name))
      throw Error(ErrorCode::kMissingTensor, first_file, u.name,
                  u.what + " missing: " + config_path + " makes the router of " + L.module + " (" +
                      model_type + ") use " + u.name + " [" + std::to_string(u.size) + "]");
    check_router_tensor(ckpt, u.name, {u.size},
                        u.what == "correction bias" ? "router bias" : u.what, L);
  }
  if (!unused.empty())
    throw Error(ErrorCode::kBadConfig, (fs::path(ckpt.dir()) / ckpt.shard_of(unused[0])).string(),
                unused[0],
                "is not used by the router " + config_path + " describes (" + model_type +
                    (router.has_router_bias ? "" : ": its router has no bias") +
                    (router.has_correction_bias ? "" : "; topk_method is not noaux_tc") +
                    "): vLLM would not load it");
}

// The config makes every layer holding experts an MoE layer, and every other decoder layer below
// num_hidden_layers a dense one (rule: model/routing.h). Layers at or past num_hidden_layers
// (DeepSeek's MTP layer) are not the decoder's.
void check_layer_plan(const Checkpoint& ckpt, const std::vector<MoeLayer>& layers,
                      const MoeLayerRule& rule, const std::string& config_path) {
  const int64_t decoder_layers = ckpt.config().num_layers;
  auto in_decoder = [&](int64_t i) {
    return i >= 0 && (decoder_layers == 0 || i < decoder_layers);
  };
  std::set<int64_t> moe;
  for (const MoeLayer& L : layers) {
    moe.insert(L.layer);
    if (!in_decoder(L.layer) || rule.is_moe_layer(L.layer)) continue;
    throw Error(ErrorCode::kBadConfig, config_path, L.source_tensors.front(),
                rule.dense_because(L.layer) + " makes layer " + std::to_string(L.layer) +
                    " a dense layer, but " + L.module + " stores " + std::to_string(L.num_experts) +
                    " routed experts (" + L.source_tensors.front() + ")");
  }
  // Decoder layers present in the checkpoint (any tensor under "<prefix>layers.<i>.", the prefix
  // of the MoE layers) that the config makes MoE layers must hold experts.
  const std::string& m = layers.front().module;
  const size_t at = m.rfind("layers.");
  if (at == std::string::npos) return;
  const std::string prefix = m.substr(0, at + 7);
  std::map<int64_t, std::string> present;  // layer -> one of its tensors
  for (const auto& name : ckpt.tensor_names()) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) continue;
    const int64_t i = canonical_id(name.substr(prefix.size(), dot - prefix.size()));
    if (i >= 0) present.emplace(i, name);
  }
  for (const auto& [i, tensor] : present)
    if (in_decoder(i) && !moe.count(i) && rule.is_moe_layer(i))
      throw Error(ErrorCode::kBadConfig, config_path, tensor,
                  "makes layer " + std::to_string(i) + " an MoE layer (" +
                      (rule.where.empty() ? "" : rule.where) +
                      "mlp_only_layers / decoder_sparse_step / first_k_dense_replace / "
                      "moe_layer_freq as the model_type reads them), but " +
                      prefix + std::to_string(i) + " stores no routed experts (" + tensor + ")");
}

// Without an expert count in the config, a router [R, H] with more rows than the layer has
// experts says how many it was trained with: the missing experts are the culprit, named.
void check_router_rows(const Checkpoint& ckpt, const MoeLayer& L) {
  if (!ckpt.config().num_experts_key.empty()) return;  // the config's count was checked
  for (const char* child : {".gate.weight", ".router.weight"}) {
    const std::string w = L.module + child;
    if (!ckpt.has_tensor(w)) continue;
    const TensorView v = ckpt.view(w);
    if (v.shape.size() != 2 || v.shape[1] != L.hidden || v.shape[0] <= L.num_experts) return;
    const std::string missing = L.param_prefix + std::to_string(L.num_experts);
    throw Error(ErrorCode::kMissingTensor, file_of(ckpt, L.source_tensors.back()), missing,
                "expert " + std::to_string(L.num_experts) + " is missing (no " + missing +
                    ".* tensors): the router " + w + " has " + std::to_string(v.shape[0]) +
                    " rows, one per expert, and only experts 0.." +
                    std::to_string(L.num_experts - 1) + " are stored");
  }
}

}  // namespace

void Checkpoint::check_routing() {
  if (layers_.empty()) return;
  const std::string config_path = (fs::path(dir_) / "config.json").string();
  for (const MoeLayer& L : layers_) check_router_rows(*this, L);
  for (const MoeLayer& L : layers_) refuse_quantized_router(*this, L);
  // A model type without a row converts (convert does not route); verify refuses to compute its
  // MoE unless told --skip-numerical (model/routing.h, verify/verify.cpp).
  if (!has_moe_family(config_.raw)) return;
  router_ = router_config_from_hf(config_.raw, config_path);
  for (const MoeLayer& L : layers_)
    if (L.num_experts != router_.num_experts)
      throw Error(ErrorCode::kBadConfig, config_path, L.source_tensors.front(),
                  router_.num_experts_key + " is " + std::to_string(router_.num_experts) +
                      " (the router's expert count), but " + L.module + " stores " +
                      std::to_string(L.num_experts) + " experts");
  check_layer_plan(*this, layers_, moe_layer_rule_from_hf(config_.raw, config_path), config_path);
  for (const MoeLayer& L : layers_) check_router(*this, L, router_, config_path);
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

QuantParams refined_source_params(const Checkpoint& ckpt, const MoeLayer& layer) {
  const QuantParams& q = ckpt.quant();
  const SourceCodec* codec = find_source_codec(q.method);
  if (!codec || !codec->refine || layer.experts.empty()) return q;
  std::map<std::string, TensorView> first;
  for (const auto& [suffix, name] : layer.experts[0][layer.gated ? kGate : kUp])
    first[suffix] = ckpt.view(name);
  return codec->refine(q, first);
}

namespace {

// The chunk's Linears [e0, e1) unpacked through the codec, `threads` workers over experts:
// parts[e - e0][proj] (no gate when the layer is not gated). Each Linear must have the codec's
// required suffixes and no unknown one; errors name the real tensor and shard.
std::vector<std::array<QuantTensor, 3>> unpack_linears(const Checkpoint& ckpt,
                                                       const MoeLayer& layer,
                                                       const SourceCodec& codec,
                                                       const QuantParams& q, int threads,
                                                       int64_t e0, int64_t e1) {
  const std::set<std::string> required = [&] {
    auto v = codec.required_suffixes(q);
    return std::set<std::string>(v.begin(), v.end());
  }();
  const std::set<std::string> known = [&] {
    auto v = codec.optional_suffixes(q);
    std::set<std::string> s(v.begin(), v.end());
    s.insert(required.begin(), required.end());
    return s;
  }();
  const int64_t H = layer.hidden, I = layer.inter;
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
                    "unexpected tensor '" + suffix + "' for " + codec.name + " experts");
      tensors.emplace(suffix, Tensor::from_view(ckpt.view(name)));
    }
    const int64_t n = p == kDown ? H : I, k = p == kDown ? I : H;
    try {
      return codec.unpack(q, tensors, n, k);
    } catch (const Error& err) {
      if (!err.file().empty()) throw;
      const std::string t = err.tensor().empty()            ? linear
                            : by_suffix.count(err.tensor()) ? by_suffix.at(err.tensor())
                                                            : linear + "." + err.tensor();
      throw Error(err.code(), file, t, err.message());
    }
  };
  std::vector<std::array<QuantTensor, 3>> parts(static_cast<size_t>(e1 - e0));
  parallel_for(e1 - e0, threads, [&](int64_t b, int64_t end) {
    for (int64_t e = b; e < end; ++e)
      for (int p = 0; p < 3; ++p) {
        if (p == kGate && !layer.gated) continue;
        parts[static_cast<size_t>(e)][p] = unpack_one(e0 + e, p);
      }
  });
  return parts;
}

// Scale dtypes may differ between the tensors of one layer (F16 here, F32 there): vLLM copies
// each into its parameter's dtype, so widen them all to F32 -- exact for F16, BF16 and F32 -- and
// let the layout convert from there as it would from either. Returns the stacked scale dtype.
DType widen_mixed_float_scales(std::vector<std::array<QuantTensor, 3>>& parts,
                               std::initializer_list<int> projs, DType first,
                               const std::string& prefix, int64_t e0) {
  const auto is_float_scale = [](DType d) {
    return d == DType::kF16 || d == DType::kBF16 || d == DType::kF32;
  };
  bool widen = false;
  for (const auto& ex : parts)
    for (int p : projs)
      widen |=
          ex[p].scale_dtype != first && is_float_scale(ex[p].scale_dtype) && is_float_scale(first);
  if (!widen) return first;
  for (size_t e = 0; e < parts.size(); ++e)
    for (int p : projs) {
      QuantTensor& t = parts[e][p];
      if (t.scale_dtype == DType::kF32 || !is_float_scale(t.scale_dtype)) continue;
      t.scales = convert_scales(t.scales, t.scale_dtype, DType::kF32,
                                prefix + std::to_string(e0 + static_cast<int64_t>(e)));
      t.scale_dtype = DType::kF32;
    }
  return DType::kF32;
}

// The chunk's projections `projs` (gate and up, or down) stacked into one QuantTensor [E, n, k]
// as vLLM's fused parameters hold them. force_g_idx: ExpertRange's g_idx_w13 / g_idx_w2.
QuantTensor stack_projections(const Checkpoint& ckpt, const MoeLayer& layer,
                              std::vector<std::array<QuantTensor, 3>>& parts,
                              std::initializer_list<int> projs, int64_t n, int64_t k,
                              int force_g_idx, int64_t e0) {
  const int64_t E = static_cast<int64_t>(parts.size());
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
  out.scale_dtype = widen_mixed_float_scales(parts, projs, t0.scale_dtype, layer.param_prefix, e0);
  // Each projection's global scale stays its own (gate's and up's side by side, as stored):
  // check_gate_up_global_scales has refused those vLLM would not treat as one; which one a
  // kernel reads is the target layout's to decide.
  out.global_scale = t0.global_scale;
  out.input_global_scale = t0.input_global_scale;  // the activation scales stay as stored too
  out.global_shards =
      out.global_scale == GlobalScale::kNone ? 1 : static_cast<int64_t>(projs.size());
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
          t.scale_dtype != out.scale_dtype || t.symmetric != out.symmetric ||
          t.global_scale != out.global_scale || t.global_shards != 1 ||
          t.input_global_scale != out.input_global_scale)
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
      out.global_scales.insert(out.global_scales.end(), t.global_scales.begin(),
                               t.global_scales.end());
      out.input_scales.insert(out.input_scales.end(), t.input_scales.begin(), t.input_scales.end());
      if (!any_g_idx) continue;
      std::vector<int32_t> g = t.g_idx;
      if (g.empty()) {  // trivial g_idx made explicit so gate and up compare equal
        g.resize(static_cast<size_t>(t.k));
        for (int64_t i = 0; i < t.k; ++i)
          g[static_cast<size_t>(i)] = static_cast<int32_t>(t.group_size > 0 ? i / t.group_size : 0);
      }
      if (!first_g) {
        out.g_idx.insert(out.g_idx.end(), g.begin(), g.end());
        first_g = &t.g_idx;
      } else if (!std::equal(g.begin(), g.end(),
                             out.g_idx.end() - static_cast<int64_t>(g.size()))) {
        throw Error(ErrorCode::kUnsupported, ckpt.dir(), what + ".up_proj.g_idx",
                    "gate and up projections have different act-order g_idx; vLLM's fused w13 "
                    "keeps one per expert");
      }
    }
  }
  out.check_consistent(layer.param_prefix);
  return out;
}

// A float as stored, to 9 significant digits.
std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// vLLM 0.33's NVFP4 MoE methods keep one w13 global scale per expert, the gate's
// (ModelOptNvFp4FusedMoE and CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading:
// `w13_weight_scale_2[:, 0]`, `w13_weight_global_scale[:, 0]`), and when
// `torch.allclose(gate, up)` fails they only log "... must match ... Accuracy may be affected":
// the up half is then served with the gate's scale, wrong by the ratio of the two. Such a
// checkpoint is refused here (exit 3 naming the up projection's global scale tensor). Within
// allclose's tolerance (float32 |gate - up| <= 1e-8 + |1e-5 * up|) vLLM's rule stands: the
// canonical form keeps both as stored and a layout writes the gate's (docs/nvfp4.md).
void check_gate_up_global_scales(const Checkpoint& ckpt, const MoeLayer& layer,
                                 const SourceCodec& codec,
                                 const std::vector<std::array<QuantTensor, 3>>& parts, int64_t e0) {
  if (!layer.gated || parts.empty() || parts[0][kGate].global_scale == GlobalScale::kNone) return;
  for (size_t e = 0; e < parts.size(); ++e) {
    const float g = parts[e][kGate].global_scales.at(0), u = parts[e][kUp].global_scales.at(0);
    if (std::fabs(g - u) <= 1e-8f + std::fabs(1e-5f * u)) continue;
    const auto& up = layer.experts[static_cast<size_t>(e0) + e][kUp];
    const std::string suffix = codec.global_scale_suffix ? codec.global_scale_suffix : "";
    const auto it = up.find(suffix);
    const std::string name = it != up.end() ? it->second : up.begin()->second;
    throw Error(ErrorCode::kBadValue, (fs::path(ckpt.dir()) / ckpt.shard_of(name)).string(), name,
                "up's global scale " + float_text(u) + " differs from the gate's " + float_text(g) +
                    " beyond torch.allclose (rtol 1e-05, atol 1e-08): vLLM 0.33 keeps the gate's "
                    "for both halves of w13 (it only logs 'Accuracy may be affected') and would "
                    "serve this up projection's weights scaled wrongly; quantize gate and up "
                    "with one global scale, as ModelOpt and llm-compressor do");
  }
}

}  // namespace

void refuse_float_fused_experts(const Checkpoint& ckpt, const MoeLayer& layer,
                                QuantMethod declared) {
  if (layer.family != MoeFamily::kFused3d && layer.family != MoeFamily::kGptOss) return;
  for (const std::string& t : layer.source_tensors) {
    const DType d = ckpt.view(t).dtype;
    if (d == DType::kBF16 || d == DType::kF16 || d == DType::kF32)
      throw Error(ErrorCode::kUnsupported, ckpt.dir(), t,
                  std::string("the experts are fused 3-D ") + dtype_name(d) +
                      " tensors, not quantized, although the config declares " +
                      quant_method_name(declared) +
                      ": the producer left them unquantized, and moepack reads experts as the "
                      "config declares them");
  }
}

namespace {

// The logical [gate; up] row r of gpt-oss' interleaved gate_up rows (gate_up[..., ::2] is the
// gate, [..., 1::2] the up: transformers GptOssExperts._apply_gate, vLLM swigluoai).
int64_t gpt_oss_interleaved_row(int64_t r, int64_t inter) {
  return r < inter ? 2 * r : 2 * (r - inter) + 1;
}

// Expert e's slice of a fused [E, ...] tensor as an owned tensor without the expert axis, named
// by `suffix` for the codec.
Tensor expert_slice(const TensorView& v, int64_t e, const std::string& suffix) {
  Tensor t(suffix, v.dtype, Shape(v.shape.begin() + 1, v.shape.end()));
  std::memcpy(t.data.data(), v.data + static_cast<uint64_t>(e) * t.data.size(), t.data.size());
  return t;
}

// The raw BF16 biases of experts [e0, e1) into m (w13's de-interleaved into [gate; up]), each
// value checked finite; discovery checked both tensors' dtype and shape (size_gpt_oss_mxfp4_layer).
void load_gpt_oss_bias_bytes(const Checkpoint& ckpt, const MoeLayer& layer, int64_t e0, int64_t e1,
                             MoeExperts* m) {
  const int64_t E = e1 - e0, H = layer.hidden, I = layer.inter;
  m->bias_dtype = DType::kBF16;
  for (int p = 0; p < 2; ++p) {
    const TensorView v = ckpt.view((p == 0 ? layer.fused_gate_up : layer.fused_down).at("bias"));
    const int64_t n = p == 0 ? 2 * I : H;
    if (v.dtype != DType::kBF16 || v.shape != Shape{layer.num_experts, n})
      throw Error(ErrorCode::kBadShape, file_of(ckpt, v.name), v.name,
                  std::string(dtype_name(v.dtype)) + " " + shape_str(v.shape) + ", expected BF16 " +
                      shape_str(Shape{layer.num_experts, n}));
    std::vector<uint8_t>& out = p == 0 ? m->w13_bias : m->w2_bias;
    out.resize(static_cast<size_t>(E * n * 2));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = 0; r < n; ++r) {
        const int64_t src = (e0 + e) * n + (p == 0 ? gpt_oss_interleaved_row(r, I) : r);
        const uint8_t* b = v.data + src * 2;
        if (!std::isfinite(bf16_to_float(static_cast<uint16_t>(b[0] | (b[1] << 8)))))
          throw Error(ErrorCode::kBadValue, file_of(ckpt, v.name), v.name,
                      "non-finite bias at index " + std::to_string(src));
        std::memcpy(&out[static_cast<size_t>((e * n + r) * 2)], b, 2);
      }
  }
}

// gpt-oss MXFP4 experts [e0, e1): each expert's slices of <proj>_blocks / _scales through the
// codec, then w13's interleaved gate/up rows (codes and scale rows) into [gate; up].
MoeExperts load_gpt_oss_mxfp4(const Checkpoint& ckpt, const MoeLayer& layer,
                              const SourceCodec& codec, const QuantParams& q, int threads,
                              int64_t e0, int64_t e1) {
  const int64_t E = e1 - e0, H = layer.hidden, I = layer.inter;
  MoeExperts m;
  m.w13 = QuantTensor(codec.spec_for(q), E, 2 * I, H);
  m.w2 = QuantTensor(codec.spec_for(q), E, H, I);
  const std::map<std::string, std::string>* maps[2] = {&layer.fused_gate_up, &layer.fused_down};
  parallel_for(E, threads, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i)
      for (int p = 0; p < 2; ++p) {
        const auto& by_suffix = *maps[p];
        const int64_t n = p == 0 ? 2 * I : H, k = p == 0 ? H : I, g = k / 32;
        TensorMap tm;
        for (const char* sfx : {"blocks", "scales"})
          tm.emplace(sfx, expert_slice(ckpt.view(by_suffix.at(sfx)), e0 + i, sfx));
        QuantTensor t;
        try {
          t = codec.unpack(q, tm, n, k);
        } catch (const Error& err) {
          const auto it = by_suffix.find(err.tensor());
          const std::string name = it != by_suffix.end() ? it->second : by_suffix.at("blocks");
          throw Error(err.code(), file_of(ckpt, name), name,
                      "expert " + std::to_string(e0 + i) + ": " + err.message());
        }
        QuantTensor& dst = p == 0 ? m.w13 : m.w2;
        for (int64_t r = 0; r < n; ++r) {
          const int64_t src = p == 0 ? gpt_oss_interleaved_row(r, I) : r;
          std::memcpy(&dst.codes[static_cast<size_t>((i * n + r) * k)],
                      &t.codes[static_cast<size_t>(src * k)], static_cast<size_t>(k));
          std::memcpy(&dst.scales[static_cast<size_t>((i * n + r) * g)],
                      &t.scales[static_cast<size_t>(src * g)], static_cast<size_t>(g));
        }
      }
  });
  m.w13.check_consistent(layer.param_prefix + "gate_up_proj");
  m.w2.check_consistent(layer.param_prefix + "down_proj");
  load_gpt_oss_bias_bytes(ckpt, layer, e0, e1, &m);
  return m;
}

}  // namespace

MoeExperts load_moe_experts(const Checkpoint& ckpt, const MoeLayer& layer, const QuantParams& q,
                            int threads, const ExpertRange& range) {
  const SourceCodec* codec = find_source_codec(q.method);
  if (!codec)
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), layer.param_prefix,
                std::string("no codec for ") + quant_method_name(q.method));
  const bool gpt_oss_mxfp4 =
      layer.family == MoeFamily::kGptOss && q.method == QuantMethod::kGptOssMxfp4;
  if ((layer.family == MoeFamily::kFused3d || layer.family == MoeFamily::kGptOss) &&
      !gpt_oss_mxfp4) {
    refuse_float_fused_experts(ckpt, layer, q.method);
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), layer.param_prefix,
                "quantized fused 3-D experts are not supported");
  }
  if (!gpt_oss_mxfp4 && q.method == QuantMethod::kGptOssMxfp4)
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), layer.param_prefix,
                "gpt-oss MXFP4 is read from gpt-oss' fused experts only");
  const int64_t e0 = range.begin, e1 = range.end < 0 ? layer.num_experts : range.end;
  if (e0 < 0 || e1 > layer.num_experts || e0 >= e1)
    throw Error(ErrorCode::kInternal, ckpt.dir(), layer.param_prefix, "bad expert range");
  if (gpt_oss_mxfp4) return load_gpt_oss_mxfp4(ckpt, layer, *codec, q, threads, e0, e1);
  const int64_t H = layer.hidden, I = layer.inter;
  std::vector<std::array<QuantTensor, 3>> parts =
      unpack_linears(ckpt, layer, *codec, q, threads, e0, e1);
  check_gate_up_global_scales(ckpt, layer, *codec, parts, e0);
  MoeExperts m;
  const int64_t rows13 = layer.gated ? 2 * I : I;
  if (layer.gated)
    m.w13 = stack_projections(ckpt, layer, parts, {kGate, kUp}, rows13, H, range.g_idx_w13, e0);
  else
    m.w13 = stack_projections(ckpt, layer, parts, {kUp}, rows13, H, range.g_idx_w13, e0);
  m.w2 = stack_projections(ckpt, layer, parts, {kDown}, H, I, range.g_idx_w2, e0);
  return m;
}

MoeExperts load_moe_experts(const Checkpoint& ckpt, const MoeLayer& layer, int threads,
                            const ExpertRange& range) {
  return load_moe_experts(ckpt, layer, refined_source_params(ckpt, layer), threads, range);
}

namespace {
float read_float(const TensorView& v, int64_t i) {
  return element_as_float(v.data + i * (dtype_bits(v.dtype) / 8), v.dtype, v.name);
}
}  // namespace

ExpertBiases load_expert_biases(const Checkpoint& ckpt, const MoeLayer& layer,
                                const ExpertRange& range) {
  ExpertBiases b;
  const bool fused = layer.family == MoeFamily::kFused3d || layer.family == MoeFamily::kGptOss;
  if (!fused || (!layer.fused_gate_up.count("bias") && !layer.fused_down.count("bias"))) return b;
  const int64_t e0 = range.begin, e1 = range.end < 0 ? layer.num_experts : range.end;
  if (e0 < 0 || e1 > layer.num_experts || e0 >= e1)
    throw Error(ErrorCode::kInternal, ckpt.dir(), layer.param_prefix, "bad expert range");
  const int64_t E = e1 - e0, H = layer.hidden, I = layer.inter, N = layer.gated ? 2 * I : I;
  const bool interleaved = layer.family == MoeFamily::kGptOss;
  for (const auto* m : {&layer.fused_gate_up, &layer.fused_down})
    if (!m->count("bias"))
      throw Error(
          ErrorCode::kMissingTensor, ckpt.dir(),
          layer.param_prefix + (m == &layer.fused_gate_up ? "gate_up" : "down") + "_proj_bias",
          "the experts of " + layer.module + " have a bias on one projection only");
  const TensorView gu = ckpt.view(layer.fused_gate_up.at("bias"));
  const TensorView dn = ckpt.view(layer.fused_down.at("bias"));
  for (const auto& [v, want] : {std::make_pair(gu, Shape{layer.num_experts, N}),
                                std::make_pair(dn, Shape{layer.num_experts, H})})
    if (v.shape != want)
      throw Error(ErrorCode::kBadShape, file_of(ckpt, v.name), v.name,
                  "shape " + shape_str(v.shape) + ", expected " + shape_str(want));
  b.w13.resize(static_cast<size_t>(E * N));
  b.w2.resize(static_cast<size_t>(E * H));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < N; ++r)
      b.w13[static_cast<size_t>(e * N + r)] =
          read_float(gu, (e0 + e) * N + (interleaved ? gpt_oss_interleaved_row(r, I) : r));
    for (int64_t h = 0; h < H; ++h)
      b.w2[static_cast<size_t>(e * H + h)] = read_float(dn, (e0 + e) * H + h);
  }
  for (const auto& [name, values] :
       {std::make_pair(gu.name, &b.w13), std::make_pair(dn.name, &b.w2)})
    for (size_t i = 0; i < values->size(); ++i)
      if (!std::isfinite((*values)[i]))
        throw Error(ErrorCode::kBadValue, file_of(ckpt, name), name,
                    "non-finite bias at index " + std::to_string(i));
  return b;
}

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
    if (layer.fused_out_in) {  // [E, 2I, H] rows [gate; up] and [E, H, I]: the canonical form
      check(gu, {E_all, 2 * I, H});
      check(dn, {E_all, H, I});
      for (int64_t i = 0; i < E * 2 * I * H; ++i)
        d.w13[static_cast<size_t>(i)] = read_float(gu, e0 * 2 * I * H + i);
      for (int64_t i = 0; i < E * H * I; ++i)
        d.w2[static_cast<size_t>(i)] = read_float(dn, e0 * H * I + i);
      return d;
    }
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
