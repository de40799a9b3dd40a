#include "pipeline/plan.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/threads.h"
#include "core/version.h"
#include "formats/parallel.h"
#include "pipeline/artifact.h"
#include "pipeline/servability.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* proj_name(MoeFamily f, int p) {
  if (f == MoeFamily::kMixtral) return p == kGate ? "w1" : p == kUp ? "w3" : "w2";
  return p == kGate ? "gate_proj" : p == kUp ? "up_proj" : "down_proj";
}

// Brace patterns naming a layer's source tensors compactly ("...experts.{0..127}.{gate_proj,
// up_proj}.{qweight,scales}"): a manifest listing every name would grow to megabytes.
std::vector<std::string> source_patterns(const MoeLayer& L, bool w13) {
  if (L.family == MoeFamily::kFused3d || L.family == MoeFamily::kGptOss) {
    std::vector<std::string> out;
    for (const auto& [s, n] : w13 ? L.fused_gate_up : L.fused_down) out.push_back(n);
    return out;
  }
  std::vector<int> projs;
  if (w13) {
    if (L.gated) projs.push_back(kGate);
    projs.push_back(kUp);
  } else {
    projs.push_back(kDown);
  }
  std::string proj_set, suffix_set;
  for (int p : projs) proj_set += std::string(proj_set.empty() ? "" : ",") + proj_name(L.family, p);
  for (const auto& [s, n] : L.experts[0][projs[0]])
    suffix_set += (suffix_set.empty() ? "" : ",") + s;
  auto braces = [](const std::string& s) {
    return s.find(',') == std::string::npos ? s : "{" + s + "}";
  };
  const std::string experts =
      L.num_experts == 1 ? "0" : "{0.." + std::to_string(L.num_experts - 1) + "}";
  return {L.param_prefix + experts + "." + braces(proj_set) + "." + braces(suffix_set)};
}

// Whether any expert's projection in `projs` carries a non-trivial act-order g_idx (the source
// codec row says how its tensors store one).
bool layer_has_act_order(const Checkpoint& ckpt, const MoeLayer& L,
                         std::initializer_list<int> projs) {
  const SourceCodec* codec = find_source_codec(ckpt.quant().method);
  if (!codec || !codec->has_act_order || L.experts.empty()) return false;
  for (const auto& ex : L.experts)
    for (int p : projs) {
      std::map<std::string, TensorView> views;
      for (const auto& [suffix, name] : ex[p]) views[suffix] = ckpt.view(name);
      if (codec->has_act_order(ckpt.quant(), views)) return true;
    }
  return false;
}

}  // namespace

int64_t experts_per_chunk(uint64_t chunk_bytes, int64_t experts, uint64_t bytes_per_expert) {
  const uint64_t fit = chunk_bytes / std::max<uint64_t>(1, bytes_per_expert);
  const int64_t budget =
      std::max<int64_t>(1, std::min<int64_t>(experts, static_cast<int64_t>(std::min<uint64_t>(
                                                          fit, static_cast<uint64_t>(INT64_MAX)))));
  return std::min(budget,
                  std::max<int64_t>(1, (experts + kMinChunksPerLayer - 1) / kMinChunksPerLayer));
}

uint64_t canonical_expert_bytes(int64_t w13_rows, int64_t hidden, int64_t inter, bool floats) {
  return static_cast<uint64_t>((w13_rows + inter) * hidden) * (floats ? 4 : 1);
}

namespace {

// The plan's fields that do not depend on a layer: the options as the plan takes them, the
// source and target params, the source codec or the --quantize recipe. Throws kUsage for options
// that make no conversion, kUnsupported for a checkpoint that has nothing to convert.
Plan plan_options(const Checkpoint& ckpt, const ConvertOptions& opts) {
  Plan plan;
  plan.options = opts;
  plan.arch = opts.target_arch;
  plan.vllm_target = opts.vllm_target;
  plan.threads = resolve_threads(opts.threads);
  plan.writers = opts.writers > 0 ? resolve_threads(opts.writers) : plan.threads;
  plan.source_quant = ckpt.quant();
  plan.source_format = quant_method_name(plan.source_quant.method);
  plan.target_quant = plan.source_quant;
  if (!opts.quantize.empty()) {
    plan.quantize_recipe = &find_quantize_recipe(opts.quantize, opts.mx_recipe);
    if (plan.source_quant.method != QuantMethod::kNone)
      throw Error(ErrorCode::kUsage, ckpt.dir(), "",
                  "--quantize needs an unquantized (bf16/fp16) checkpoint; this one is " +
                      plan.source_format);
    plan.target_quant = plan.quantize_recipe->target_params(plan.source_quant.dtype);
  } else {
    plan.source_codec = find_source_codec(plan.source_quant.method);
  }
  if (!is_act_dtype(opts.act_dtype))
    throw Error(ErrorCode::kUsage, "--act-dtype must be bf16 or fp16");
  if (opts.chunk_bytes == 0) throw Error(ErrorCode::kUsage, "--chunk-size must be positive");
  if (!ckpt.config().moepack_quant.is_null())
    throw Error(ErrorCode::kUnsupported, ckpt.dir() + "/config.json", "quantization_config",
                "already a moepack output (quant_method \"moepack\"); convert its source instead");
  if (ckpt.moe_layers().empty())
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), "",
                "no MoE expert layers found in the checkpoint");
  const Parallelism& par = opts.parallel;
  if (par.tensor < 1 || par.expert < 1 || par.tensor > kMaxParallelRanks ||
      par.expert > kMaxParallelRanks)
    throw Error(ErrorCode::kUsage, "--tensor-parallel-size and --expert-parallel take 1.." +
                                       std::to_string(kMaxParallelRanks));
  if (!par.whole() && plan.vllm_target != VllmTarget::kV0_33)
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), "",
                par.describe() + " outputs follow vLLM 0.33's sharding; pass --vllm-target 0.33");
  return plan;
}

// Per-expert gpt-oss experts (gate_proj / up_proj / down_proj): the producers disagree on what
// gate_proj and up_proj hold. llm-compressor (compressed-tensors) and auto-round de-interleave
// gpt-oss' gate_up_proj ([..., ::2] gate, [..., 1::2] up) into the true gate and up; GPTQModel 7
// stores the first and second HALVES of the interleaved tensor under those names (its gate_proj
// is neither the gate nor the up). Read only from the producers known to de-interleave; refused
// otherwise (exit 4), naming the producer, until the halves can be re-interleaved exactly.
void refuse_ambiguous_gpt_oss(const Checkpoint& ckpt, const MoeLayer& L) {
  if (ckpt.config().model_type != "gpt_oss" ||
      (L.family != MoeFamily::kPerExpert && L.family != MoeFamily::kMixtral))
    return;
  const nlohmann::json& q = ckpt.config().quant_raw;
  std::string quantizer;
  if (q.is_object() && q.contains("meta") && q["meta"].is_object() &&
      q["meta"].contains("quantizer"))
    quantizer = q["meta"]["quantizer"].dump();
  const std::string method = q.is_object() ? q.value("quant_method", std::string()) : "";
  if (quantizer.find("gptqmodel") != std::string::npos)
    throw Error(ErrorCode::kUnsupported, ckpt.config().quant_file, L.param_prefix + "0.gate_proj",
                "gpt-oss experts written by GPTQModel (" + quantizer +
                    "): its gate_proj / up_proj are the first and second halves of gpt-oss' "
                    "interleaved gate_up_proj, not the gate and the up; moepack cannot read them "
                    "as either");
  const bool deinterleaved = method == "compressed-tensors" || q.contains("autoround_version");
  if (!deinterleaved)
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), L.param_prefix + "0.gate_proj",
                "per-expert gpt-oss experts from an unknown producer (quant_method \"" + method +
                    "\"): whether gate_proj / up_proj are gpt-oss' de-interleaved gate and up "
                    "(llm-compressor, auto-round) or halves of the interleaved gate_up_proj "
                    "(GPTQModel) cannot be told from the tensors");
  // The producers keep gpt-oss' expert biases as <proj>.bias: no layout carries them, and the
  // experts are never converted without them.
  for (const auto& ex : L.experts)
    for (const auto& by_suffix : ex)
      if (by_suffix.count("bias"))
        throw Error(ErrorCode::kUnsupported, ckpt.dir(), by_suffix.at("bias"),
                    "gpt-oss expert bias: no moepack layout carries expert biases, and the "
                    "experts are not converted without them (vLLM adds them to each projection)");
}

// Experts no layout converts: quantized fused 3-D and gpt-oss experts, and unquantized expert
// tensors other than plain weights (load_dense_experts reads only those). Refused here, so that
// --dry-run says so too.
void refuse_unconvertible_experts(const Checkpoint& ckpt, const Plan& plan, const MoeLayer& L) {
  refuse_ambiguous_gpt_oss(ckpt, L);
  // gpt-oss' own MXFP4 experts are read (load_moe_experts); the oracle decides whether a layout
  // takes them (their scheme is their own: biases, interleaved gate/up, clamped SwiGLU).
  // Discovery took _blocks only with the config's gpt-oss MXFP4 (Checkpoint::open).
  const bool gpt_oss_mxfp4 =
      L.family == MoeFamily::kGptOss && L.fused_gate_up.count("blocks") && !plan.quantize_recipe;
  if (gpt_oss_mxfp4) return;
  if (plan.target_quant.method != QuantMethod::kNone &&
      plan.source_quant.method != QuantMethod::kNone &&
      (L.family == MoeFamily::kFused3d || L.family == MoeFamily::kGptOss)) {
    refuse_float_fused_experts(ckpt, L, plan.source_quant.method);
    throw Error(
        ErrorCode::kUnsupported, ckpt.dir(), L.param_prefix,
        std::string("quantized ") + moe_family_name(L.family) + " experts are not supported");
  }
  if (L.family == MoeFamily::kGptOss)
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), L.param_prefix,
                "gpt-oss experts (clamped SwiGLU with swiglu_limit, interleaved gate/up, expert "
                "biases) are recognised but not converted: no moepack layout models their "
                "activation");
  if (plan.source_quant.method != QuantMethod::kNone) return;
  std::vector<const std::map<std::string, std::string>*> maps = {&L.fused_gate_up, &L.fused_down};
  for (const auto& ex : L.experts)
    for (const auto& m : ex) maps.push_back(&m);
  for (const auto* m : maps)
    for (const auto& [suffix, name] : *m)
      if (suffix != "" && suffix != "weight")
        throw Error(ErrorCode::kUnsupported, ckpt.dir(), name,
                    "expert tensor '" + suffix +
                        "' (e.g. an expert bias) is not carried by "
                        "any moepack layout; refusing rather than dropping it");
}

// The oracle's decision for one layer, and the plan's backend: the first layer's choice, which
// every other layer must share.
void choose_layer_backend(const Checkpoint& ckpt, const MoeLayer& L, Plan& plan, PlannedLayer& pl) {
  const ConvertOptions& opts = plan.options;
  OracleQuery q;
  q.quant = plan.target_quant;
  q.experts = L.num_experts;
  q.hidden = L.hidden;
  q.inter = L.inter;
  q.gated = L.gated;
  q.act_order_w13 = pl.act_order_w13 ? 1 : 0;
  q.act_order_w2 = pl.act_order_w2 ? 1 : 0;
  q.arch = plan.arch;
  q.requested = opts.backend;
  q.act_dtype = opts.act_dtype;
  q.vllm_w13_scale_size_k = opts.vllm_w13_scale_size_k;
  q.vllm_target = plan.vllm_target;
  pl.decision = choose_backend(q);
  if (pl.decision.chosen.empty())
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), L.param_prefix,
                std::string("no backend can take this layer for ") + target_arch_name(plan.arch) +
                    ":\n" + pl.decision.explain());
  if (plan.backend.empty()) plan.backend = pl.decision.chosen;
  if (plan.backend != pl.decision.chosen)
    throw Error(ErrorCode::kUnsupported, ckpt.dir(), L.param_prefix,
                "layers would need different backends (" + plan.backend + " and " +
                    pl.decision.chosen + "); pass --backend explicitly");
  plan.layout = find_target_layout(plan.backend);
  plan.layout_name = plan.layout->name;
  plan.layout_version = plan.layout->layout_version;
}

// How the layer's chunks convert: the direct fast path whose row takes the (source method,
// layout) pair with the layer's refined params, options and shape, or the canonical path and why.
void choose_conversion_path(const Plan& plan, PlannedLayer& pl) {
  if (plan.quantize_recipe) {
    pl.canonical_why = "--quantize: the experts are quantised here";
  } else if (!plan.options.parallel.whole()) {
    pl.canonical_why = plan.options.parallel.describe() +
                       ": each rank's share of the canonical experts is packed on its own";
  } else if (plan.options.no_fast_path) {
    pl.canonical_why = "--no-fast-path";
  } else {
    std::vector<std::string> why;
    pl.direct = find_direct_path(pl.source_quant.method, plan.layout->name, pl.source_quant,
                                 pl.layout_options, pl.shape, &why);
    for (const auto& w : why) pl.canonical_why += (pl.canonical_why.empty() ? "" : "; ") + w;
  }
}

// Everything the plan decides for one MoE layer (after the checks of plan_options): refined
// source params, act-order, backend, layout options and shape, conversion path, deviations and
// chunks.
// Rank `rank`'s share of a planned layer for the layout's decide_layer: the tensor-parallel split
// of every chunk, or the rank's experts (a run of consecutive global ids loaded at a time: the
// whole share under linear placement, one expert under round_robin). Under tensor parallelism
// every rank reads the layer: a layout that reads all its experts to decide (marlin-nvfp4) reads
// the layer once per rank at plan time.
LayerExperts rank_layer_experts(const Plan& plan, const Checkpoint& ckpt, const PlannedLayer& pl,
                                int rank) {
  const Parallelism& par = plan.options.parallel;
  LayerExperts layer;
  layer.max_per_load = pl.experts_per_chunk;
  if (par.tensor > 1) {
    layer.experts = pl.shape.experts;
    layer.load = [&plan, &ckpt, &pl, rank](int64_t e0, int64_t e1) {
      return plan.layout->tensor_parallel.split(load_planned_experts(plan, ckpt, pl, e0, e1),
                                                pl.layout_options.gated,
                                                plan.options.parallel.tensor, rank);
    };
    return layer;
  }
  const std::vector<int64_t> ids = par.rank_experts(pl.shape.experts, rank);
  layer.experts = static_cast<int64_t>(ids.size());
  layer.load = [&plan, &ckpt, &pl, ids](int64_t a, int64_t b) {
    std::vector<QuantTensor> w13, w2;
    for (int64_t i = a; i < b;) {
      int64_t j = i + 1;
      while (j < b && ids[static_cast<size_t>(j)] == ids[static_cast<size_t>(j) - 1] + 1) ++j;
      MoeExperts run = load_planned_experts(plan, ckpt, pl, ids[static_cast<size_t>(i)],
                                            ids[static_cast<size_t>(j) - 1] + 1);
      w13.push_back(std::move(run.w13));
      w2.push_back(std::move(run.w2));
      i = j;
    }
    MoeExperts out;
    out.w13 = concat_experts(w13);
    out.w2 = concat_experts(w2);
    return out;
  };
  return layer;
}

PlannedLayer plan_layer(const Checkpoint& ckpt, Plan& plan, size_t li) {
  const MoeLayer& L = ckpt.moe_layers()[li];
  const ConvertOptions& opts = plan.options;
  refuse_unconvertible_experts(ckpt, plan, L);
  PlannedLayer pl;
  pl.index = static_cast<int64_t>(li);
  pl.module = L.module;
  pl.param_prefix = L.param_prefix;
  // The codec's refine runs here, once per layer; execution takes the result.
  pl.source_quant = plan.source_codec ? refined_source_params(ckpt, L) : plan.source_quant;
  // Act-order is the layer's (vLLM creates g_idx for every projection from the config flag):
  // declared with a real group size, or carried by any expert's g_idx.
  const bool layer_act_order = (plan.target_quant.act_order && plan.target_quant.group_size > 0) ||
                               layer_has_act_order(ckpt, L, {kGate, kUp, kDown});
  pl.act_order_w13 = pl.act_order_w2 = layer_act_order;
  choose_layer_backend(ckpt, L, plan, pl);
  pl.layout_options = LayoutOptions::for_layer(
      plan.target_quant.method, opts.act_dtype, L.gated, opts.vllm_w13_scale_size_k,
      plan.vllm_target, vllm_param_prefix(plan.vllm_target, L.param_prefix), L.inter, plan.threads);
  pl.layout_options.target_arch = plan.arch;
  pl.layout_options.hidden = L.hidden;
  const LayoutOptions& lo = pl.layout_options;
  pl.shape = moe_shape_for(plan.target_quant, L.num_experts, L.hidden, L.inter, L.gated,
                           pl.act_order_w13 ? 1 : 0, pl.act_order_w2 ? 1 : 0);
  pl.inter_padded =
      plan.layout->padded_inter ? plan.layout->padded_inter(lo, pl.shape) : pl.shape.inter();
  if (!opts.parallel.whole()) {
    const std::vector<std::string> why =
        parallel_reasons(*plan.layout, lo, pl.shape, opts.parallel);
    if (!why.empty()) {
      std::string text = plan.layout_name + " cannot be written for " + opts.parallel.describe() +
                         " as vLLM 0.33 shards it:";
      for (const auto& w : why) text += "\n  - " + w;
      throw Error(ErrorCode::kUnsupported, ckpt.dir(), L.param_prefix, text);
    }
  }
  choose_conversion_path(plan, pl);
  // Where vLLM's loader differs, on the shape a rank post-processes (I / tp under tensor
  // parallelism: e.g. Marlin's w13 scale permutation for group >= I / tp).
  const bool tp = opts.parallel.tensor > 1;
  pl.deviations =
      plan.layout->deviations_from_vllm(tp ? rank_layout_options(lo, opts.parallel) : lo,
                                        tp ? rank_shape(pl.shape, opts.parallel, 0) : pl.shape);
  // Experts per chunk: canonical bytes (one code per byte), or a float per weight when
  // quantising.
  pl.experts_per_chunk = experts_per_chunk(
      opts.chunk_bytes, L.num_experts,
      canonical_expert_bytes(pl.shape.w13.n, L.hidden, L.inter, plan.quantize_recipe != nullptr));
  pl.chunks = (L.num_experts + pl.experts_per_chunk - 1) / pl.experts_per_chunk;
  // Decisions of the whole layer (all its experts), made here once so that every chunk packs
  // alike: the layout reads experts, at most a chunk at a time. A parallel output's are each
  // rank's, over its share (vLLM 0.33 post-processes each rank's slice alone).
  if (plan.layout->decide_layer && !opts.parallel.whole()) {
    for (int r = 0; r < opts.parallel.ranks(); ++r)
      pl.rank_decisions.push_back(plan.layout->decide_layer(rank_layout_options(lo, opts.parallel),
                                                            rank_shape(pl.shape, opts.parallel, r),
                                                            rank_layer_experts(plan, ckpt, pl, r)));
  } else if (plan.layout->decide_layer) {
    LayerExperts layer;
    layer.experts = L.num_experts;
    layer.max_per_load = pl.experts_per_chunk;
    layer.load = [&](int64_t e0, int64_t e1) {
      return load_planned_experts(plan, ckpt, pl, e0, e1);
    };
    pl.layout_options.layer_decisions = plan.layout->decide_layer(lo, pl.shape, layer);
  }
  return pl;
}

// The layer's output parameters as the layout's param_specs give them, with their sources.
std::vector<PlannedTensor> layer_param_tensors(const Checkpoint& ckpt, const Plan& plan,
                                               const PlannedLayer& pl) {
  const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
  const ConvertOptions& opts = plan.options;
  const std::string src_codec = plan.quantize_recipe
                                    ? std::string(dtype_name(ckpt.config().dtype)) + "->" +
                                          opts.quantize + "(" + opts.mx_recipe + ")"
                                    : plan.source_codec->name;
  std::vector<PlannedTensor> out;
  const Parallelism& par = opts.parallel;
  const int ranks = par.whole() ? 1 : par.ranks();
  for (int r = 0; r < ranks; ++r) {
    const LayoutOptions lo = planned_rank_options(pl, par, r);
    const MoeShape shape = par.whole() ? pl.shape : rank_shape(pl.shape, par, r);
    for (const ParamSpec& t : plan.layout->param_specs(lo, shape)) {
      PlannedTensor pt;
      pt.name = par.whole() ? t.name : rank_tensor_key(r, ranks, t.name);
      pt.rank = par.whole() ? -1 : r;
      pt.dtype = t.dtype;
      pt.shape = t.shape;
      pt.bytes = *dtype_bytes(pt.dtype, static_cast<uint64_t>(numel(pt.shape)));
      pt.converted = true;
      pt.layer = pl.index;
      pt.codec = src_codec + "->" + plan.backend;
      const std::string local = t.name.substr(pl.layout_options.prefix.size());
      pt.sources = source_patterns(L, local.rfind("w2_", 0) != 0);
      out.push_back(pt);
    }
  }
  return out;
}

// plan.tensors in output order -- a layer's parameters take the place of its first source
// tensor, every other tensor is copied through in source order -- and the shards holding them.
void plan_output_tensors(const Checkpoint& ckpt,
                         const std::map<int64_t, std::vector<PlannedTensor>>& layer_params,
                         Plan& plan) {
  std::map<std::string, int64_t> layer_of_tensor;
  for (const PlannedLayer& pl : plan.layers)
    for (const auto& n : ckpt.moe_layers()[static_cast<size_t>(pl.index)].source_tensors)
      layer_of_tensor[n] = pl.index;
  std::set<int64_t> emitted;
  for (const auto& name : ckpt.tensor_names()) {
    auto it = layer_of_tensor.find(name);
    if (it != layer_of_tensor.end()) {
      if (emitted.insert(it->second).second)
        for (const auto& pt : layer_params.at(it->second)) plan.tensors.push_back(pt);
      continue;
    }
    const TensorView v = ckpt.view(name);
    PlannedTensor pt;
    pt.name = name;
    pt.dtype = v.dtype;
    pt.shape = v.shape;
    pt.bytes = v.nbytes;
    pt.codec = "copy";
    pt.sources = {name};
    plan.tensors.push_back(pt);
  }
  std::set<std::string> names;
  for (const auto& t : plan.tensors)
    if (!names.insert(t.name).second)
      throw Error(ErrorCode::kUnsupported, ckpt.dir(), t.name,
                  "an output parameter would collide with a copied tensor of the same name");
  // The tensors every rank reads, then each rank's in shard files of its own
  // (model-rankRR-of-NN*.safetensors): a rank opens its files and the shared ones, nothing else.
  const Parallelism& par = plan.options.parallel;
  const int ranks = par.whole() ? 0 : par.ranks();
  std::vector<std::vector<SafetensorsEntry>> groups(static_cast<size_t>(ranks) + 1);
  for (const auto& t : plan.tensors)
    groups[static_cast<size_t>(t.rank + 1)].push_back({t.name, t.dtype, t.shape, 0, 0});
  plan.shards = plan_shards(groups[0], plan.options.max_shard_bytes);
  for (int r = 0; r < ranks; ++r)
    append_shards(plan.shards,
                  plan_shards(groups[static_cast<size_t>(r) + 1], plan.options.max_shard_bytes,
                              "model-" + rank_dir_name(r, ranks)));
}

}  // namespace

MoeExperts load_planned_experts(const Plan& plan, const Checkpoint& ckpt, const PlannedLayer& pl,
                                int64_t e0, int64_t e1) {
  const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
  ExpertRange range;
  range.begin = e0;
  range.end = e1;
  range.g_idx_w13 = pl.act_order_w13 ? 1 : 0;
  range.g_idx_w2 = pl.act_order_w2 ? 1 : 0;
  if (!plan.quantize_recipe) return load_moe_experts(ckpt, L, pl.source_quant, plan.threads, range);
  const DenseExperts d = load_dense_experts(ckpt, L, range);
  MoeExperts experts;
  experts.w13 = plan.quantize_recipe->quantize(d.w13.data(), d.experts, pl.shape.w13.n, d.hidden);
  experts.w2 = plan.quantize_recipe->quantize(d.w2.data(), d.experts, d.hidden, d.inter);
  return experts;
}

LayoutOptions planned_rank_options(const PlannedLayer& pl, const Parallelism& par, int rank) {
  if (par.whole()) return pl.layout_options;
  LayoutOptions lo = rank_layout_options(pl.layout_options, par);
  if (rank >= 0 && static_cast<size_t>(rank) < pl.rank_decisions.size())
    lo.layer_decisions = pl.rank_decisions[static_cast<size_t>(rank)];
  return lo;
}

MoeExperts rank_share_of(const TargetLayout& row, const Parallelism& par, bool gated,
                         int64_t layer_experts, const MoeExperts& experts, int rank, int64_t e0,
                         int64_t e1) {
  if (par.tensor > 1) return row.tensor_parallel.split(experts, gated, par.tensor, rank);
  std::vector<int64_t> ids;
  for (int64_t g : par.rank_experts(layer_experts, rank))
    if (g >= e0 && g < e1) ids.push_back(g - e0);
  MoeExperts out;
  out.w13.experts = out.w2.experts = 0;
  if (ids.empty()) return out;
  out.w13 = select_experts(experts.w13, ids);
  out.w2 = select_experts(experts.w2, ids);
  return out;
}

Plan make_plan(const Checkpoint& ckpt, const ConvertOptions& opts) {
  Plan plan = plan_options(ckpt, opts);
  std::map<int64_t, std::vector<PlannedTensor>> layer_params;
  std::set<std::string> deviations;
  for (size_t li = 0; li < ckpt.moe_layers().size(); ++li) {
    PlannedLayer pl = plan_layer(ckpt, plan, li);
    deviations.insert(pl.deviations.begin(), pl.deviations.end());
    layer_params[pl.index] = layer_param_tensors(ckpt, plan, pl);
    plan.layers.push_back(std::move(pl));
  }
  if (plan.layout->option_deviations)
    for (const auto& d : plan.layout->option_deviations(plan.layers.front().layout_options))
      deviations.insert(d);
  plan.deviations.assign(deviations.begin(), deviations.end());

  const ConfigPatchInputs facts = config_patch_inputs(plan);
  plan.config_patch =
      config_patch(facts, plan.quantize_recipe ? mxfp8_quantization_config(ckpt, facts.version)
                                               : ckpt.config().quant_raw);
  plan_output_tensors(ckpt, layer_params, plan);
  FileSelection files = select_files(ckpt.other_files(), opts.files);
  plan.copied_files = std::move(files.carried);
  plan.left_out_files = std::move(files.left_out);
  return plan;
}

json Plan::to_json() const {
  json j;
  j["source"] = options.src;
  j["destination"] = options.dst;
  j["source_format"] = source_format;
  j["backend"] = backend;
  j["layout"] = {{"name", layout_name}, {"version", layout_version}};
  j["target_arch"] = target_arch_name(arch);
  j["vllm_target"] = {{"name", vllm_target_name(vllm_target)},
                      {"follows", vllm_target_row(vllm_target).follows}};
  j["act_dtype"] = dtype_name(options.act_dtype);
  j["threads"] = threads;  // resolved: --threads 0 is the CPUs this process may use
  j["writers"] = writers;
  if (!options.quantize.empty())
    j["quantize"] = {{"format", options.quantize}, {"recipe", options.mx_recipe}};
  j["deviations_from_vllm"] = deviations;
  j["layers"] = json::array();
  for (const auto& l : layers)
    j["layers"].push_back(
        {{"module", l.module},
         {"backend", l.decision.chosen},
         {"oracle", l.decision.to_json()},
         {"experts_per_chunk", l.experts_per_chunk},
         {"chunks", l.chunks},
         {"inter", l.shape.inter()},
         {"inter_padded", l.inter_padded},
         {"conversion", l.direct ? json{{"path", "direct"}, {"direct_path", l.direct->name}}
                                 : json{{"path", "canonical"}, {"why", l.canonical_why}}},
         {"deviations_from_vllm", l.deviations}});
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i].layout_options.layer_decisions.empty())
      j["layers"][i]["layout_decisions"] = layers[i].layout_options.layer_decisions;
    for (const auto& d : layers[i].rank_decisions)  // a parallel output: each rank's
      j["layers"][i]["rank_layout_decisions"].push_back(d);
  }
  j["tensors"] = json::array();
  uint64_t converted = 0, copied = 0;
  for (const auto& t : tensors) {
    const size_t shard = shards.shard_of.at(t.name);
    j["tensors"].push_back({{"name", t.name},
                            {"action", t.converted ? "convert" : "copy"},
                            {"codec", t.codec},
                            {"dtype", dtype_name(t.dtype)},
                            {"shape", t.shape},
                            {"bytes", t.bytes},
                            {"shard", shards.shard_names[shard]},
                            {"sources", t.sources}});
    (t.converted ? converted : copied) += t.bytes;
  }
  j["shards"] = json::array();
  for (size_t i = 0; i < shards.shard_names.size(); ++i)
    j["shards"].push_back({{"name", shards.shard_names[i]},
                           {"tensors", shards.shards[i].size()},
                           {"file_bytes", shards.shard_file_bytes[i]}});
  j["copied_files"] = copied_files;
  j["left_out_files"] = json::array();
  for (const auto& f : left_out_files)
    j["left_out_files"].push_back({{"path", f.path}, {"why", f.why}});
  j["totals"] = {{"tensor_bytes", total_bytes()},
                 {"converted_bytes", converted},
                 {"copied_bytes", copied},
                 {"tensors", tensors.size()},
                 {"shards", shards.shard_names.size()}};
  return j;
}

std::string Plan::to_text() const {
  std::ostringstream s;
  uint64_t converted = 0, copied = 0;
  int64_t nconv = 0;
  for (const auto& t : tensors) {
    if (t.converted) {
      converted += t.bytes;
      ++nconv;
    } else {
      copied += t.bytes;
    }
  }
  s << "plan: " << options.src << " -> " << options.dst << "\n"
    << "  source format   " << source_format << "\n"
    << "  backend         " << backend << " (layout " << layout_name << " v" << layout_version
    << ")\n"
    << "  target arch     " << target_arch_name(arch) << ", activations "
    << dtype_name(options.act_dtype) << "\n"
    << "  vLLM target     " << vllm_target_name(vllm_target) << " ("
    << vllm_target_row(vllm_target).follows << ")\n"
    << "  MoE layers      " << layers.size() << "\n"
    << "  converted       " << nconv << " tensors, " << converted << " bytes\n"
    << "  copied through  " << tensors.size() - nconv << " tensors, " << copied << " bytes\n"
    << "  output          " << shards.shard_names.size() << " shard(s), " << total_bytes()
    << " tensor bytes\n";
  for (size_t i = 0; i < shards.shard_names.size(); ++i)
    s << "    " << shards.shard_names[i] << "  " << shards.shards[i].size() << " tensors, "
      << shards.shard_file_bytes[i] << " bytes\n";
  if (!copied_files.empty()) {
    s << "  other files     ";
    for (size_t i = 0; i < copied_files.size(); ++i) s << (i ? ", " : "") << copied_files[i];
    s << "\n";
  }
  for (const auto& f : left_out_files) s << "  left out        " << f.path << ": " << f.why << "\n";
  for (const auto& d : deviations) s << "  deviation from vLLM's loader: " << d << "\n";
  if (!layers.empty()) {
    int64_t chunked = 0;
    for (const auto& l : layers) chunked += l.chunks > 1;
    s << "  chunking        " << layers.front().experts_per_chunk << " experts at a time ("
      << layers.front().chunks << " chunk(s) in " << layers.front().module << "; " << chunked
      << " of " << layers.size() << " layers in more than one)\n";
    int64_t direct = 0;
    const DirectPath* first_direct = nullptr;
    for (const auto& l : layers) {
      direct += l.direct != nullptr;
      if (!first_direct) first_direct = l.direct;
    }
    s << "  conversion      ";
    if (first_direct)
      s << "direct " << first_direct->name << " (" << direct << " of " << layers.size()
        << " layers; --no-fast-path forces the canonical form)\n";
    else
      s << "canonical (" << layers.front().canonical_why << ")\n";
    // Layout decisions from each layer's codes (Humming's recode), counted per distinct value.
    // A parallel output's are per rank: counted per (layer, rank).
    std::map<std::string, int64_t> decided;
    size_t made = 0;
    for (const auto& l : layers) {
      made += l.rank_decisions.empty() ? 1 : l.rank_decisions.size();
      for (const auto& [k, v] : l.layout_options.layer_decisions) ++decided[k + " " + v];
      for (const auto& d : l.rank_decisions)
        for (const auto& [k, v] : d) ++decided[k + " " + v];
    }
    const bool per_rank = !layers.front().rank_decisions.empty();
    for (const auto& [kv, n] : decided)
      s << "  layout decision " << kv << " (" << n << " of " << made
        << (per_rank ? " layer ranks)\n" : " layers)\n");
    s << "  oracle (" << layers.front().module << "):\n" << layers.front().decision.explain();
  }
  s << "  converted tensors:\n";
  for (const auto& t : tensors)
    if (t.converted)
      s << "    " << t.name << "  " << dtype_name(t.dtype) << " " << shape_str(t.shape) << "  "
        << t.bytes << " B  " << t.codec << "  <- " << (t.sources.empty() ? "" : t.sources[0])
        << "\n";
  return s.str();
}

}  // namespace moepack
