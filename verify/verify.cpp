#include "verify/verify.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/half.h"
#include "core/sha256.h"
#include "core/threads.h"
#include "formats/mxfp8.h"
#include "kernels/moepack_cuda.h"
#include "model/checkpoint.h"
#include "pipeline/manifest.h"
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

Output open_output(const std::string& dir, const Manifest& manifest, VerifyReport& r) {
  Output o;
  std::set<std::string> listed;
  for (const auto& s : manifest.shards) listed.insert(s.name);
  for (const auto& name : listed) {
    const std::string p = (fs::path(dir) / name).string();
    o.shards.emplace(name, SafetensorsFile::open(p));
    for (const auto& e : o.shards.at(name).entries()) o.where[e.name] = name;
  }
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  IntegrityCheck ic;
  ic.name = "index matches shards";
  if (listed.size() > 1) {
    std::ifstream in(index);
    if (!in) {
      ic.detail = "sharded output without model.safetensors.index.json";
    } else {
      const json idx = json::parse(in, nullptr, false);
      uint64_t total = 0;
      for (const auto& [n, f] : o.shards)
        for (const auto& e : f.entries()) total += e.end - e.begin;
      if (idx.is_discarded() || !idx.contains("weight_map")) {
        ic.detail = "index is not valid JSON with a weight_map";
      } else if (idx["weight_map"].size() != o.where.size()) {
        ic.detail = "index lists " + std::to_string(idx["weight_map"].size()) +
                    " tensors, shards hold " + std::to_string(o.where.size());
      } else if (idx.value("/metadata/total_size"_json_pointer, uint64_t{0}) != total) {
        ic.detail = "metadata.total_size differs from the shards' tensor bytes";
      } else {
        ic.passed = true;
        for (auto& [t, f] : idx["weight_map"].items())
          if (!o.where.count(t) || o.where[t] != f.get<std::string>()) {
            ic.passed = false;
            ic.detail =
                "tensor " + t + " is mapped to " + f.get<std::string>() + " but lives elsewhere";
            break;
          }
      }
    }
  } else {
    ic.passed = !fs::exists(index);
    if (!ic.passed) ic.detail = "single-file output has a stray index";
  }
  r.integrity.push_back(ic);
  return o;
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

template <typename T>
RoundTripCheck compare_per_expert(const std::string& name, int64_t layer, const std::vector<T>& got,
                                  const std::vector<T>& want, int64_t experts,
                                  int64_t elem_per_unit) {
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
  c.compared = static_cast<int64_t>(got.size()) / std::max<int64_t>(1, elem_per_unit);
  const int64_t per_expert = experts ? static_cast<int64_t>(got.size()) / experts : 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      if (++c.mismatches == 1) {
        RoundTripMismatch m;
        m.layer = layer;
        m.expert = per_expert ? static_cast<int64_t>(i) / per_expert : -1;
        m.tensor = name;
        m.index = (per_expert ? static_cast<int64_t>(i) % per_expert : static_cast<int64_t>(i)) /
                  elem_per_unit;
        std::ostringstream g, w;
        g << "0x" << std::hex << +got[i];
        w << "0x" << std::hex << +want[i];
        m.got = g.str();
        m.want = w.str();
        c.first_mismatch = m;
      }
    }
  c.passed = c.mismatches == 0;
  return c;
}

void compare_quant(VerifyReport& r, int64_t layer, const std::string& which, const QuantTensor& got,
                   const QuantTensor& want) {
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
    r.round_trip.push_back(c);
    return;
  }
  r.round_trip.push_back(
      compare_per_expert(base + "codes", layer, got.codes, want.codes, got.experts, 1));
  const auto want_scales = scales_as(want, got.scale_dtype);
  r.round_trip.push_back(compare_per_expert(base + "scales", layer, got.scales, want_scales,
                                            got.experts, got.scale_bytes()));
  if (!want.symmetric || !got.symmetric)
    r.round_trip.push_back(
        compare_per_expert(base + "zeros", layer, got.zeros, want.zeros, got.experts, 1));
  if (!want.g_idx.empty() || !got.g_idx.empty())
    r.round_trip.push_back(compare_per_expert(base + "g_idx", layer, explicit_g_idx(got),
                                              explicit_g_idx(want), got.experts, 1));
}

}  // namespace

VerifyReport run_verify(const VerifyOptions& opts) {
  VerifyReport r;
  r.tool_version = moepack_version_string();
  r.destination = opts.dst;
  r.source = opts.source;
  r.seed = opts.seed;
  r.tokens = opts.tokens;
  r.tolerance = opts.tolerance;
  if (opts.device == "cuda") {
    if (!cuda_device_info().available)
      throw Error(ErrorCode::kNoCuda,
                  "--device cuda: no CUDA device (or moepack was built without CUDA)");
    throw Error(ErrorCode::kUnsupported,
                "--device cuda: the CUDA fused-MoE verification runtime is not in this build; use "
                "--device cpu");
  }
  if (opts.device != "cpu") throw Error(ErrorCode::kUsage, "--device must be cpu or cuda");
  if (opts.tokens < 1) throw Error(ErrorCode::kUsage, "--tokens must be >= 1");

  const Manifest manifest = read_manifest(opts.dst);
  const std::string mpath = manifest_path(opts.dst);
  const std::string& backend = manifest.backend;
  r.backend = backend;
  const TargetLayout* layout = find_target_layout(backend);
  if (!layout) throw Error(ErrorCode::kUnsupported, mpath, "", "unknown backend " + backend);
  const HfConfig cfg = load_hf_config(opts.dst);
  r.model = cfg.architecture.empty() ? cfg.model_type : cfg.architecture;

  // 1. Integrity.
  Output out = open_output(opts.dst, manifest, r);
  {
    IntegrityCheck all;
    all.name = "manifest tensors present with dtype, shape and sha256";
    all.passed = true;
    int64_t checked = 0;
    for (const auto& [name, t] : manifest.tensors) {
      auto it = out.where.find(name);
      std::string problem;
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
        else if (sha256_hex(v.data, v.nbytes) != t.sha256)
          problem = "sha256 differs";
      }
      if (!problem.empty() && all.passed) {
        all.passed = false;
        all.detail = name + ": " + problem;
      }
      ++checked;
    }
    if (out.where.size() != static_cast<size_t>(checked) && all.passed) {
      all.passed = false;
      all.detail = "shards hold " + std::to_string(out.where.size()) + " tensors, manifest lists " +
                   std::to_string(checked);
    }
    if (all.passed) all.detail = std::to_string(checked) + " tensors";
    r.integrity.push_back(all);
  }

  // 2 + 3 per layer.
  std::unique_ptr<Checkpoint> src;
  if (!opts.source.empty()) src = Checkpoint::open(opts.source);
  const QuantParams& target_q = manifest.target_quant_params;
  const bool quantized_from_dense = manifest.quantize.has_value();
  const QuantizeRecipe* recipe =
      quantized_from_dense
          ? &find_quantize_recipe(manifest.quantize->format, manifest.quantize->recipe)
          : nullptr;
  const ref::RouterConfig router = ref::router_config_from_hf(cfg.text);
  const int threads = resolve_threads(opts.threads);

  if (src) {
    // Copy-through tensors are the source's bytes.
    IntegrityCheck ct;
    ct.name = "copied tensors equal the source";
    ct.passed = true;
    int64_t n = 0;
    for (const auto& [name, t] : manifest.tensors) {
      if (t.converted) continue;
      ++n;
      if (!src->has_tensor(name)) {
        ct.passed = false;
        ct.detail = name + " not in the source";
        break;
      }
      const TensorView a = src->view(name), b = out.view(name);
      if (a.nbytes != b.nbytes || a.dtype != b.dtype || a.shape != b.shape ||
          std::memcmp(a.data, b.data, a.nbytes) != 0) {
        ct.passed = false;
        ct.detail = name + " differs from the source";
        break;
      }
    }
    if (ct.passed) ct.detail = std::to_string(n) + " tensors";
    r.integrity.push_back(ct);
  }

  bool rounded_note = false;
  for (const ManifestLayer& ml : manifest.layers) {
    const std::string& module = ml.module;
    const int64_t layer_no = ml.layer;
    const LayoutOptions lo =
        LayoutOptions::for_layer(target_q.method, manifest.act_dtype, ml.gated,
                                 manifest.options.vllm_w13_scale_size_k, ml.param_prefix, threads);
    TensorMap params;
    for (const auto& p : ml.params) params.emplace(p, Tensor::from_view(out.view(p)));

    MoeExperts decoded;
    try {
      decoded = layout->unpack(lo, params);
    } catch (const Error& e) {
      RoundTripCheck c;
      c.name = "layer " + std::to_string(layer_no) + " decode";
      c.mismatches = 1;
      RoundTripMismatch m;
      m.layer = layer_no;
      m.tensor = e.tensor();
      m.got = e.message();
      c.first_mismatch = m;
      r.round_trip.push_back(c);
      continue;
    }
    // The reference experts: the source's (re-quantised when the conversion quantised), or the
    // decoded layout when no source was given.
    MoeExperts reference = decoded;
    const MoeLayer* src_layer = nullptr;
    if (src) {
      for (const auto& L : src->moe_layers())
        if (L.module == module) src_layer = &L;
      if (!src_layer)
        throw Error(ErrorCode::kBadConfig, opts.source, module, "source has no such MoE layer");
      if (quantized_from_dense) {
        const DenseExperts d = load_dense_experts(*src, *src_layer);
        reference.w13 =
            recipe->quantize(d.w13.data(), d.experts, d.gated ? 2 * d.inter : d.inter, d.hidden);
        reference.w2 = recipe->quantize(d.w2.data(), d.experts, d.hidden, d.inter);
      } else {
        reference = load_moe_experts(*src, *src_layer, threads);
      }
      compare_quant(r, layer_no, "w13", decoded.w13, reference.w13);
      compare_quant(r, layer_no, "w2", decoded.w2, reference.w2);
      // The served model computes with scales in the layout's dtype (vLLM's loader rounds an
      // fp16 checkpoint's scales to bf16 for bf16 serving); the reference does the same, so
      // the tolerance measures layout faithfulness, not that rounding.
      for (auto* pair : {&reference.w13, &reference.w2}) {
        const QuantTensor& d = pair == &reference.w13 ? decoded.w13 : decoded.w2;
        if (pair->scale_dtype != d.scale_dtype) {
          if (!rounded_note) {
            r.notes.push_back(std::string("source scales ") + dtype_name(pair->scale_dtype) +
                              " are served as " + dtype_name(d.scale_dtype) +
                              "; the reference uses the same rounding");
            rounded_note = true;
          }
          pair->scales = scales_as(*pair, d.scale_dtype);
          pair->scale_dtype = d.scale_dtype;
        }
      }
    }

    // 3. Numerical: the real router on random hidden states.
    ref::MoeSpec spec;
    spec.experts = ml.experts;
    spec.hidden = ml.hidden;
    spec.intermediate = ml.inter;
    spec.gated = lo.gated;
    spec.activation = ref::activation_from_hf(cfg.hidden_act);
    spec.threads = threads;
    const std::string router_prefix = module + ".gate.";
    std::string rw_name = router_prefix + "weight", rb_name,
                cb_name = router_prefix + "e_score_correction_bias";
    if (!out.where.count(rw_name)) {
      rw_name = module + ".router.weight";
      rb_name = module + ".router.bias";
    }
    const std::vector<float> router_w = to_floats(out.view(rw_name));
    const std::vector<float> router_b = !rb_name.empty() && out.where.count(rb_name)
                                            ? to_floats(out.view(rb_name))
                                            : std::vector<float>{};
    const std::vector<float> corr =
        out.where.count(cb_name) ? to_floats(out.view(cb_name)) : std::vector<float>{};
    const std::vector<float> x = ref::random_hidden_states(
        opts.tokens, spec.hidden, opts.seed + static_cast<uint64_t>(layer_no));
    auto weights = [&](int64_t e, MoeProj p) {
      return dequantize_expert(p == MoeProj::kW13 ? reference.w13 : reference.w2, e);
    };
    auto matmul = [&](int e, MoeProj p, const float* xs, int64_t m, float* y) {
      layout->expert_matmul(lo, params, p, e, xs, m, y);
    };
    const ref::MoeLayerCheck check = ref::check_moe_layer(
        spec, router, x.data(), opts.tokens, router_w, router_b, corr, weights, matmul);
    r.layers.push_back(make_layer_result(layer_no, backend, opts.tokens, router.top_k,
                                         check.comparison, opts.tolerance));
  }
  if (quantized_from_dense)
    r.notes.push_back(
        "experts were quantised to MXFP8 by moepack: the reference re-quantises the source with "
        "the same recipe");
  if (!src)
    r.notes.push_back(
        "no --source: the reference is the decoded layout itself (no round-trip check)");
  r.finalize();
  return r;
}

}  // namespace moepack
