// The CUDA fused-MoE runtime (kernels/moe_runtime.h) against the CPU definitions: the router
// kernels against verify/router.cpp, the token sort against the CPU's slots per expert, and the
// fused MoE read through every layout's readers against verify/moe_reference on random legal
// layers of every registry row (the registry suite's generators). Skips without a device.
//
// Tolerances, and why:
//   routing     expert ids equal; weights within 1e-12 relative (both in double; the device's
//               exp may differ from glibc's in the last bit)
//   logits      within 4 float ulps of the CPU's (both sum in double then round; the CPU's
//               blocked GEMM sums in another order)
//   reference   GPU fp64 MoE vs CPU fp64 moe_reference, same routing and weights: 1e-12
//               normalised (summation order only) when the layout takes activations unquantised
//   layout      GPU fp32 layout MoE vs GPU fp64 reference MoE: 5e-4 normalised. Both sides take
//               the activations the layout's kernel takes (bf16-rounded for Marlin, int8/fp8
//               quantised for W8A8/FP8), the intermediate re-quantised too, so a fp32-vs-fp64
//               difference sometimes flips one intermediate element by a quantisation step:
//               measured up to ~8e-5 where fp32 accumulation alone gives ~1e-6; a layout bug
//               gives O(1)
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <sstream>

#include "core/half.h"
#include "formats/codec.h"
#include "formats/moe_reader.h"
#include "kernels/moe_runtime.h"
#include "kernels/moepack_cuda.h"
#include "tests/test_util.h"
#include "verify/moe_reference.h"
#include "verify/router.h"

namespace moepack {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device (or built without CUDA)"

std::vector<float> normal_floats(test::Rng& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

// The routers of the supported families (verify/router.h), small enough to test quickly.
std::vector<ref::RouterConfig> router_configs() {
  std::vector<ref::RouterConfig> v;
  ref::RouterConfig mixtral;
  mixtral.family = "mixtral";
  mixtral.num_experts = 8;
  mixtral.top_k = 2;
  mixtral.renormalize = true;
  v.push_back(mixtral);
  ref::RouterConfig qwen = mixtral;
  qwen.family = "qwen3_moe (no norm_topk_prob)";
  qwen.num_experts = 128;
  qwen.top_k = 8;
  qwen.renormalize = false;
  v.push_back(qwen);
  ref::RouterConfig v2 = qwen;
  v2.family = "deepseek_v2 group_limited_greedy";
  v2.num_experts = 64;
  v2.top_k = 6;
  v2.n_group = 8;
  v2.topk_group = 3;
  v2.group_score = ref::GroupScore::kMax;
  v2.routed_scaling_factor = 16.0;
  v.push_back(v2);
  ref::RouterConfig v3;
  v3.family = "deepseek_v3 noaux_tc";
  v3.scoring = ref::RouterScoring::kSigmoid;
  v3.num_experts = 256;
  v3.top_k = 8;
  v3.renormalize = true;
  v3.n_group = 8;
  v3.topk_group = 4;
  v3.group_score = ref::GroupScore::kSumTop2;
  v3.routed_scaling_factor = 2.5;
  v3.has_correction_bias = true;
  v.push_back(v3);
  ref::RouterConfig gpt = mixtral;
  gpt.family = "gpt_oss (router bias)";
  gpt.num_experts = 32;
  gpt.top_k = 4;
  gpt.has_router_bias = true;
  v.push_back(gpt);
  return v;
}

TEST(MoeRuntimeCuda, RouterKernelsEqualRouterCpp) {
  SKIP_WITHOUT_CUDA();
  MoeRuntime rt;
  test::Rng rng(1201);
  for (const ref::RouterConfig& cfg : router_configs()) {
    SCOPED_TRACE(cfg.family);
    const int64_t T = 97, H = 256, E = cfg.num_experts;
    const std::vector<float> x = normal_floats(rng, static_cast<size_t>(T * H), 1.0f);
    const std::vector<float> w = normal_floats(rng, static_cast<size_t>(E * H), 0.05f);
    const std::vector<float> bias = cfg.has_router_bias
                                        ? normal_floats(rng, static_cast<size_t>(E), 0.5f)
                                        : std::vector<float>{};
    const std::vector<float> corr = cfg.has_correction_bias
                                        ? normal_floats(rng, static_cast<size_t>(E), 0.1f)
                                        : std::vector<float>{};
    const std::vector<float> want_logits =
        ref::router_logits(x.data(), T, H, w.data(), E, bias.empty() ? nullptr : bias.data());
    const std::vector<float> got_logits =
        rt.router_logits(x.data(), T, H, w.data(), E, bias.empty() ? nullptr : bias.data());
    ASSERT_EQ(got_logits.size(), want_logits.size());
    for (size_t i = 0; i < got_logits.size(); ++i)
      ASSERT_LE(std::fabs(got_logits[i] - want_logits[i]),
                4 * std::numeric_limits<float>::epsilon() * std::fabs(want_logits[i]) + 1e-30)
          << "logit " << i;
    // The routing of the same logits.
    const ref::Routing want = ref::route(want_logits, corr, cfg);
    const MoeDeviceRouting got =
        rt.route(want_logits, corr.empty() ? nullptr : corr.data(), ref::runtime_router_spec(cfg));
    ASSERT_EQ(got.expert_ids, want.expert_ids);
    for (size_t i = 0; i < want.weights.size(); ++i)
      ASSERT_NEAR(got.weights[i], want.weights[i], 1e-12 * std::fabs(want.weights[i]))
          << "slot " << i;
    // Non-finite logits are refused naming the first (as ref::route).
    std::vector<float> bad = want_logits;
    bad[static_cast<size_t>(5 * E + 3)] = std::nanf("");
    bad[static_cast<size_t>(9 * E + 1)] = INFINITY;
    const Error e = test::expect_error(
        [&] { rt.route(bad, corr.empty() ? nullptr : corr.data(), ref::runtime_router_spec(cfg)); },
        ErrorCode::kBadValue);
    EXPECT_NE(std::string(e.what()).find("token 5, expert 3"), std::string::npos) << e.what();
  }
}

TEST(MoeRuntimeCuda, SortGroupsSlotsByExpertInTokenOrder) {
  SKIP_WITHOUT_CUDA();
  MoeRuntime rt;
  test::Rng rng(1202);
  for (const ref::RouterConfig& cfg : router_configs()) {
    SCOPED_TRACE(cfg.family);
    const int64_t T = 61, H = 128, E = cfg.num_experts;
    const std::vector<float> x = normal_floats(rng, static_cast<size_t>(T * H), 1.0f);
    const std::vector<float> w = normal_floats(rng, static_cast<size_t>(E * H), 0.05f);
    const std::vector<float> bias(static_cast<size_t>(E), 0.25f);
    const std::vector<float> corr = normal_floats(rng, static_cast<size_t>(E), 0.1f);
    MoeLayerSpec layer;
    layer.experts = E;
    layer.hidden = H;
    layer.inter = 64;
    const MoeDeviceRouting routing =
        rt.begin_layer(layer, ref::runtime_router_spec(cfg), x.data(), T, w.data(),
                       cfg.has_router_bias ? bias.data() : nullptr,
                       cfg.has_correction_bias ? corr.data() : nullptr);
    std::vector<int32_t> offsets, sorted;
    rt.sorted_slots(&offsets, &sorted);
    ASSERT_EQ(offsets.size(), static_cast<size_t>(E + 1));
    ASSERT_EQ(offsets.back(), T * cfg.top_k);
    for (int64_t e = 0; e < E; ++e) {
      std::vector<int32_t> want;
      for (int64_t s = 0; s < T * cfg.top_k; ++s)
        if (routing.expert_ids[static_cast<size_t>(s)] == e)
          want.push_back(static_cast<int32_t>(s));
      const std::vector<int32_t> got(sorted.begin() + offsets[static_cast<size_t>(e)],
                                     sorted.begin() + offsets[static_cast<size_t>(e + 1)]);
      ASSERT_EQ(got, want) << "expert " << e;
    }
    rt.finish_layer();
  }
}

ref::MoeOutput output_of(const std::vector<double>& out, const std::vector<double>& slots,
                         int64_t tokens, int64_t hidden, int top_k) {
  ref::MoeOutput o;
  o.tokens = tokens;
  o.hidden = hidden;
  o.top_k = top_k;
  o.out = out;
  o.slot_out = slots;
  return o;
}

double norm_err(const ref::MoeOutput& ref, const ref::MoeOutput& got, const ref::Routing& routing,
                int64_t experts) {
  return ref::compare_moe(ref, got, routing, experts).norm_err;
}

bool takes_scheme(const TargetLayout& row, const char* scheme) {
  return std::find(row.schemes.begin(), row.schemes.end(), std::string(scheme)) !=
         row.schemes.end();
}

// Sets o.vllm_target to the spec's, or else the first target the row writes this layer for
// (Humming: 0.33 only); false when it writes it for none.
bool writable_for_some_target(const TargetLayout& row, LayoutOptions& o, const MoeShape& s) {
  for (const VllmTargetRow& t : vllm_target_rows()) {
    if (row.unsupported_reasons(o, s).empty()) return true;
    o.vllm_target = t.target;
  }
  return row.unsupported_reasons(o, s).empty();
}

// Draws random layers until the row takes one (some rows, MXFP4 Marlin: no padding, group 32,
// refuse many random shapes): its dims, expert count, shape and options; false after 16 draws.
bool draw_writable_layer(const TargetLayout& row, const QuantParams& params, bool gated,
                         test::Rng& rng, test::LayerDims& d, int64_t& E, MoeShape& s,
                         LayoutOptions& o) {
  for (int draw = 0; draw < 16; ++draw) {
    d = test::random_layer_dims(rng, 1).front();
    E = d.experts + 3;
    s = moe_shape_for(params, E, d.hidden, d.inter, gated);
    o = LayoutOptions{};
    o.act_dtype = DType::kBF16;
    o.gated = gated;
    o.source_method = params.method;
    o.prefix = "model.layers.0.mlp.experts.";
    o.hidden = d.hidden;
    o.inter = d.inter;
    if (writable_for_some_target(row, o, s)) return true;
  }
  return false;
}

class LayoutRowsCuda : public ::testing::TestWithParam<TargetLayout> {};

// The second chunk's (first > 0) reference codes uploaded packed two per byte, as verify uploads
// them (upload_nibbles; codes of <= 4 bits); the first chunk's one per byte (no locator).
NibbleLocator nibbles(MoeRuntime& rt, const QuantTensor& q, int64_t first) {
  if (first == 0) return {};
  const bool signed_codes = q.kind == CodeKind::kInt;
  return [&rt, signed_codes](const uint8_t* codes, size_t count) {
    return rt.upload_nibbles(codes, count, signed_codes);
  };
}

// The layer's experts through the runtime in two chunks, as verify runs them: the staging areas
// alternate and the expert offsets are exercised; the second's reference codes go up packed
// (nibbles).
void run_in_two_chunks(MoeRuntime& rt, const TargetLayout& row, const LayoutOptions& o,
                       const TensorMap& packed, int64_t E) {
  const int64_t split = E / 2;
  for (auto [e0, e1] : {std::make_pair(int64_t{0}, split), std::make_pair(split, E)}) {
    rt.begin_chunk();
    TensorMap part;
    for (const auto& [name, t] : packed) {
      Tensor c = t;
      c.shape[0] = e1 - e0;
      const size_t per = t.data.size() / static_cast<size_t>(E);
      c.data.assign(t.data.begin() + static_cast<int64_t>(per) * e0,
                    t.data.begin() + static_cast<int64_t>(per) * e1);
      part.emplace(name, std::move(c));
    }
    const MoeExperts dec = row.unpack(o, part);
    const ParamLocator locate = [&rt](const std::string&, const Tensor& t) {
      return rt.upload(t.data.data(), t.data.size());
    };
    const BufferLocator locate_buffer = [&rt](const void* p, size_t n) { return rt.upload(p, n); };
    const reader::ProjReader w13 = row.make_reader(o, part, MoeProj::kW13, locate);
    const reader::ProjReader w2 = row.make_reader(o, part, MoeProj::kW2, locate);
    rt.run_chunk(e0, e1, w13, w2,
                 make_reference_reader(w13, dec.w13, locate_buffer, nibbles(rt, dec.w13, e0)),
                 make_reference_reader(w2, dec.w2, locate_buffer, nibbles(rt, dec.w2, e0)));
  }
}

// Every layout row, every codec it takes, random legal layers (gated and relu2): the fused MoE
// through the layout's readers on the GPU against the CPU definitions.
TEST_P(LayoutRowsCuda, FusedMoeThroughReadersMatchesTheCpu) {
  SKIP_WITHOUT_CUDA();
  const TargetLayout& row = GetParam();
  ASSERT_NE(row.make_reader, nullptr) << row.name << " has no reader";
  MoeRuntime rt;
  test::Rng rng(1203);
  int cases = 0;
  double worst_layout = 0.0, worst_reference = 0.0;
  for (const SourceCodec& codec : source_codecs()) {
    if (!takes_scheme(row, codec.scheme)) continue;
    for (const QuantParams& params : codec.param_space()) {
      test::RandomTensorOptions ro;
      std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(params);
      if (params.method == QuantMethod::kGptq) {
        ro.zero_lo = std::max(ro.zero_lo, 1);
        ro.zero_hi = std::min(ro.zero_hi, (1 << params.bits) - 1);
      }
      // Each gating twice: a row with one codec of one parameter set that takes gated layers
      // only (marlin-mxfp4) would have a single layer otherwise.
      for (bool gated : {true, false, true, false}) {
        test::LayerDims d;
        int64_t E = 0;
        MoeShape s;
        LayoutOptions o;
        if (!draw_writable_layer(row, params, gated, rng, d, E, s, o)) continue;
        std::ostringstream trace;
        trace << row.name << " <- " << codec.name << " {" << test::describe_params(params)
              << "} E=" << E << " H=" << d.hidden << " I=" << d.inter
              << (gated ? " gated" : " relu2");
        SCOPED_TRACE(trace.str());
        ++cases;
        MoeExperts experts = test::random_moe_experts(rng, s, ro);
        // A layout that carries expert biases (gpt-oss) packs them; the readers compared here
        // read the weights, without biases (gpt_oss_moe_cuda.cpp adds them).
        test::add_declared_biases(rng, row.param_specs(o, s), &experts);
        // A decision over the whole layer, as make_plan makes it.
        if (row.decide_layer)
          o.layer_decisions = row.decide_layer(o, s, test::whole_layer(experts, 2));
        TensorMap packed;
        for (Tensor& t : row.pack(o, experts)) packed.emplace(t.name, std::move(t));
        const MoeExperts decoded = row.unpack(o, packed);
        ref::RouterConfig router;
        router.num_experts = E;
        router.top_k = 2;
        router.renormalize = true;
        ref::MoeSpec spec;
        spec.experts = E;
        spec.hidden = d.hidden;
        spec.intermediate = d.inter;
        spec.gated = gated;
        spec.activation = gated ? ref::Activation::kSilu : ref::Activation::kRelu2;
        const int64_t T = 37;
        const std::vector<float> x = ref::random_hidden_states(T, d.hidden, 7);
        const std::vector<float> rw = normal_floats(rng, static_cast<size_t>(E * d.hidden), 0.05f);
        MoeLayerSpec layer;
        layer.experts = E;
        layer.hidden = d.hidden;
        layer.inter = d.inter;
        layer.gated = gated;
        layer.relu2 = !gated;
        const MoeDeviceRouting dr = rt.begin_layer(layer, ref::runtime_router_spec(router),
                                                   x.data(), T, rw.data(), nullptr, nullptr);
        run_in_two_chunks(rt, row, o, packed, E);
        const reader::ActQuant act = row.act_quant(o);
        const MoeLayerOutputs out = rt.finish_layer();
        ref::Routing routing;
        routing.tokens = T;
        routing.top_k = router.top_k;
        routing.expert_ids = dr.expert_ids;
        routing.weights = dr.weights;
        const ref::MoeOutput gpu_ref =
            output_of(out.ref_out, out.ref_slots, T, d.hidden, router.top_k);
        const ref::MoeOutput gpu_got =
            output_of(out.got_out, out.got_slots, T, d.hidden, router.top_k);
        const double layout_err = norm_err(gpu_ref, gpu_got, routing, E);
        EXPECT_LE(layout_err, 5e-4);
        worst_layout = std::max(worst_layout, layout_err);
        if (act == reader::ActQuant::kNone) {
          const ref::MoeOutput cpu_ref =
              ref::moe_reference(spec, routing, x.data(), [&](int64_t e, MoeProj p) {
                return dequantize_expert(p == MoeProj::kW13 ? decoded.w13 : decoded.w2, e);
              });
          const double ref_err = norm_err(cpu_ref, gpu_ref, routing, E);
          EXPECT_LE(ref_err, 1e-12);
          worst_reference = std::max(worst_reference, ref_err);
          const ref::MoeOutput cpu_got = ref::moe_via_expert_matmul(
              spec, routing, x.data(),
              ref::reader_matmul(row.make_reader(o, packed, MoeProj::kW13, host_param),
                                 row.make_reader(o, packed, MoeProj::kW2, host_param)));
          EXPECT_LE(norm_err(cpu_ref, cpu_got, routing, E), 1e-4);
        }
      }
    }
  }
  EXPECT_GE(cases, 2) << row.name;
  std::cout << "[ " << row.name << " ] " << cases << " layers; worst GPU layout-vs-reference "
            << worst_layout << ", worst GPU-vs-CPU reference " << worst_reference << "\n";
}

INSTANTIATE_TEST_SUITE_P(Registry, LayoutRowsCuda, ::testing::ValuesIn(target_layouts()),
                         [](const ::testing::TestParamInfo<TargetLayout>& p) {
                           std::string n = p.param.name;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// ---- the kernels' edge cases -------------------------------------------------------------------

// A routing of T = 23 tokens, top 2, over E = 7 experts that gives expert 0 no token, expert 1 one
// token and expert 2 19 (more than two of the kernels' row tiles of 8, the last one partial); the
// others share the rest.
MoeDeviceRouting edge_routing(test::Rng& rng) {
  MoeDeviceRouting r;
  r.tokens = 23;
  r.top_k = 2;
  std::uniform_real_distribution<double> w(0.1, 1.0);
  for (int32_t t = 0; t < 23; ++t) {
    const int32_t first = t < 19 ? 2 : 3 + t % 4;
    const int32_t second = t == 0 ? 1 : (t < 19 ? 3 + t % 4 : 3 + (t + 1) % 4);
    r.expert_ids.push_back(first);
    r.expert_ids.push_back(second);
    r.weights.push_back(w(rng));
    r.weights.push_back(w(rng));
  }
  return r;
}

// Both MoEs of the edge routing over chunks of 3 and 4 experts (odd counts; the first chunk holds
// the expert without tokens), each chunk's readers made by make_readers(e0, e1).
MoeLayerOutputs run_edge_layer(
    MoeRuntime& rt, const MoeLayerSpec& layer, const MoeDeviceRouting& routing,
    const std::vector<float>& x,
    const std::function<std::array<reader::ProjReader, 4>(int64_t, int64_t)>& make_readers) {
  rt.begin_layer_routed(layer, layer.experts, routing, x.data());
  for (auto [e0, e1] :
       {std::make_pair(int64_t{0}, int64_t{3}), std::make_pair(int64_t{3}, int64_t{7})}) {
    rt.begin_chunk();
    const std::array<reader::ProjReader, 4> r = make_readers(e0, e1);
    rt.run_chunk(e0, e1, r[0], r[1], r[2], r[3]);
  }
  return rt.finish_layer();
}

// Per routed slot: ||got - want|| / ||want|| over its H outputs; the worst slot.
double worst_slot_error(const std::vector<double>& got, const std::vector<double>& want,
                        int64_t slots, int64_t hidden) {
  double worst = 0.0;
  for (int64_t s = 0; s < slots; ++s) {
    double d = 0.0, n = 0.0;
    for (int64_t h = 0; h < hidden; ++h) {
      const double a = got[static_cast<size_t>(s * hidden + h)];
      const double b = want[static_cast<size_t>(s * hidden + h)];
      d += (a - b) * (a - b);
      n += b * b;
    }
    EXPECT_GT(n, 0.0) << "slot " << s << " is all zero on the CPU";
    worst = std::max(worst, std::isfinite(d) ? std::sqrt(d / n) : INFINITY);
  }
  return worst;
}

// The canonical reader on both sides, activations unquantised, at sizes below a warp's step of
// columns (H = 40, I = 24: each lane takes 2, 1 or no column: the short counts) with groups of
// 24 that a lane's columns cross, asymmetric codes
// packed two per byte on the reference side and act-order g_idx on one projection: the GPU's
// reference MoE equals the CPU's moe_reference (1e-12) slot by slot, the fp32 side within 1e-5.
TEST(MoeRuntimeCuda, KernelEdgeCasesCanonicalTailSpans) {
  SKIP_WITHOUT_CUDA();
  MoeRuntime rt;
  test::Rng rng(1204);
  const int64_t E = 7, H = 40, I = 24;
  QuantSpec spec;
  spec.kind = CodeKind::kUint;
  spec.bits = 4;
  spec.group_size = 24;
  spec.symmetric = false;
  spec.scale_dtype = DType::kBF16;
  test::RandomTensorOptions ro;
  ro.act_order = true;
  const QuantTensor w13 = test::random_quant_tensor(rng, spec, E, 2 * I, H, ro);
  ro.act_order = false;
  const QuantTensor w2 = test::random_quant_tensor(rng, spec, E, H, I, ro);
  ASSERT_FALSE(w13.g_idx.empty());
  const MoeDeviceRouting routing = edge_routing(rng);
  const std::vector<float> x = ref::random_hidden_states(routing.tokens, H, 11);
  MoeLayerSpec layer;
  layer.experts = E;
  layer.hidden = H;
  layer.inter = I;
  const MoeLayerOutputs out = run_edge_layer(rt, layer, routing, x, [&](int64_t e0, int64_t e1) {
    const BufferLocator up = [&rt](const void* p, size_t n) { return rt.upload(p, n); };
    const NibbleLocator packed = [&rt](const uint8_t* codes, size_t count) {
      return rt.upload_nibbles(codes, count, false);
    };
    const QuantTensor a = test::slice_experts(w13, e0, e1), b = test::slice_experts(w2, e0, e1);
    return std::array<reader::ProjReader, 4>{
        make_canonical_reader(a, reader::ActQuant::kNone, up),
        make_canonical_reader(b, reader::ActQuant::kNone, up),
        make_canonical_reader(a, reader::ActQuant::kNone, up, packed),
        make_canonical_reader(b, reader::ActQuant::kNone, up, packed)};
  });
  ref::MoeSpec ms;
  ms.experts = E;
  ms.hidden = H;
  ms.intermediate = I;
  const ref::MoeOutput cpu = ref::moe_reference(
      ms, ref::routing_from_device(routing), x.data(),
      [&](int64_t e, MoeProj p) { return dequantize_expert(p == MoeProj::kW13 ? w13 : w2, e); });
  const int64_t slots = routing.tokens * routing.top_k;
  EXPECT_LE(worst_slot_error(out.ref_slots, cpu.slot_out, slots, H), 1e-12);
  EXPECT_LE(worst_slot_error(out.got_slots, cpu.slot_out, slots, H), 1e-5);
  EXPECT_LE(worst_slot_error(out.ref_out, cpu.out, routing.tokens, H), 1e-12);
}

// The hot path (Marlin's strided decoder, bf16 activations) at the smallest sizes the marlin row
// writes, for every GPTQ parameter set it takes (int4 / int8, groups, act-order): the layout side
// within 5e-4 of the reference side, and each routed slot of the reference side within 1e-2 of the
// CPU's moe_reference on the bf16-rounded tokens (the GPU also rounds the intermediate to bf16:
// ~1e-3; a row, token or expert the kernels skipped or misplaced is O(1)).
TEST(MoeRuntimeCuda, KernelEdgeCasesMarlinSmallestShapes) {
  SKIP_WITHOUT_CUDA();
  const TargetLayout* row = find_target_layout("marlin");
  ASSERT_NE(row, nullptr);
  MoeRuntime rt;
  test::Rng rng(1205);
  const MoeDeviceRouting routing = edge_routing(rng);
  const int64_t E = 7, slots = routing.tokens * routing.top_k;
  int cases = 0;
  for (const SourceCodec& codec : source_codecs()) {
    if (std::string(codec.name) != "gptq") continue;
    for (const QuantParams& params : codec.param_space()) {
      LayoutOptions o;
      MoeShape s;
      bool found = false;
      for (int64_t hidden : {64, 128, 256}) {
        for (int64_t inter : {64, 128, 256}) {
          s = moe_shape_for(params, E, hidden, inter, true);
          o = LayoutOptions{};
          o.act_dtype = DType::kBF16;
          o.gated = true;
          o.source_method = params.method;
          o.prefix = "model.layers.0.mlp.experts.";
          o.hidden = hidden;
          o.inter = inter;
          if ((found = writable_for_some_target(*row, o, s))) break;
        }
        if (found) break;
      }
      if (!found) continue;
      SCOPED_TRACE(test::describe_params(params) + " H=" + std::to_string(o.hidden) +
                   " I=" + std::to_string(o.inter));
      ++cases;
      test::RandomTensorOptions ro;
      std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(params);
      ro.zero_lo = std::max(ro.zero_lo, 1);
      ro.zero_hi = std::min(ro.zero_hi, (1 << params.bits) - 1);
      const MoeExperts experts = test::random_moe_experts(rng, s, ro);
      if (row->decide_layer)
        o.layer_decisions = row->decide_layer(o, s, test::whole_layer(experts, 2));
      TensorMap packed;
      for (Tensor& t : row->pack(o, experts)) packed.emplace(t.name, std::move(t));
      const MoeExperts decoded = row->unpack(o, packed);
      const int64_t H = o.hidden, I = o.inter;
      const std::vector<float> x = ref::random_hidden_states(routing.tokens, H, 13);
      MoeLayerSpec layer;
      layer.experts = E;
      layer.hidden = H;
      layer.inter = I;
      const MoeLayerOutputs out =
          run_edge_layer(rt, layer, routing, x, [&](int64_t e0, int64_t e1) {
            TensorMap part;
            for (const auto& [name, t] : packed) {
              Tensor c = t;
              c.shape[0] = e1 - e0;
              const size_t per = t.data.size() / static_cast<size_t>(E);
              c.data.assign(t.data.begin() + static_cast<int64_t>(per) * e0,
                            t.data.begin() + static_cast<int64_t>(per) * e1);
              part.emplace(name, std::move(c));
            }
            const MoeExperts dec = row->unpack(o, part);
            const ParamLocator locate = [&rt](const std::string&, const Tensor& t) {
              return rt.upload(t.data.data(), t.data.size());
            };
            const BufferLocator up = [&rt](const void* p, size_t n) { return rt.upload(p, n); };
            const reader::ProjReader a = row->make_reader(o, part, MoeProj::kW13, locate);
            const reader::ProjReader b = row->make_reader(o, part, MoeProj::kW2, locate);
            return std::array<reader::ProjReader, 4>{a, b, make_reference_reader(a, dec.w13, up),
                                                     make_reference_reader(b, dec.w2, up)};
          });
      const ref::Routing hr = ref::routing_from_device(routing);
      EXPECT_LE(norm_err(output_of(out.ref_out, out.ref_slots, routing.tokens, H, 2),
                         output_of(out.got_out, out.got_slots, routing.tokens, H, 2), hr, E),
                5e-4);
      std::vector<float> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_to_float(float_to_bf16(x[i]));
      ref::MoeSpec ms;
      ms.experts = E;
      ms.hidden = H;
      ms.intermediate = I;
      const ref::MoeOutput cpu = ref::moe_reference(ms, hr, xb.data(), [&](int64_t e, MoeProj p) {
        return dequantize_expert(p == MoeProj::kW13 ? decoded.w13 : decoded.w2, e);
      });
      EXPECT_LE(worst_slot_error(out.ref_slots, cpu.slot_out, slots, H), 1e-2);
    }
  }
  EXPECT_GE(cases, 4);
}

// Without a device (or built without CUDA) the runtime says so: kNoCuda, exit 4.
TEST(MoeRuntimeCuda, WithoutADeviceTheRuntimeIsNoCuda) {
  if (cuda_device_info().available) GTEST_SKIP() << "a CUDA device is present";
  test::expect_error([] { MoeRuntime rt; }, ErrorCode::kNoCuda);
}

}  // namespace
}  // namespace moepack
