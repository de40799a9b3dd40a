// gpt-oss' MoE on the CUDA runtime (kernels/moe_runtime.h) against the CPU definition
// (verify/moe_reference): the router with its bias (top-k, softmax over the chosen), the expert
// biases (w13's added to GEMM1's sums before the activation, w2's to GEMM2's before the top-k
// weighting) and the clamped SwiGLU (swigluoai: alpha 1.702, limit 7, up + 1), on random layers
// of every layout that carries gpt-oss' biases, several shapes each. Skips without a device.
//
//   routing     the device's routing of x (router logits with the bias) has the CPU's expert ids
//   reference   GPU fp64 MoE through canonical readers, activations as they are, with the
//               biases, vs CPU moe_reference with the biases: 1e-12 normalised (summation order)
//   fp32 side   GPU fp32 MoE through the same canonical readers and biases vs the CPU: 1e-5
//   layout      GPU fp32 MoE through the layout's readers with its own biases (as unpack decodes
//               them), bf16 activations as the serving kernel takes them, vs the GPU fp64
//               reference with the source's biases and the same activations: 5e-4 (as
//               moe_runtime_cuda.cpp's layout check)
//   no biases   the layout side without its biases is more than 10 x 5e-4 off: they matter here,
//               so the checks above could not pass with biases dropped on one side
//   the clamp   x is scaled so the gate's pre-activations are O(4): some gate / up values pass 7
//               (the clamp is exercised) and most do not (the SwiGLU is not saturated)
// A non-gated (relu2) layer with biases checks the w13 bias' indexing without an up half.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/half.h"
#include "core/tensor.h"
#include "formats/codec.h"
#include "formats/layout/activation.h"
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

constexpr int64_t kTokens = 64;

std::vector<float> normal_floats(test::Rng& rng, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

std::vector<float> floats_of(const std::vector<uint8_t>& raw, DType dt) {
  const size_t eb = static_cast<size_t>(dtype_bits(dt) / 8);
  std::vector<float> out(raw.size() / eb);
  for (size_t i = 0; i < out.size(); ++i) out[i] = element_as_float(raw.data() + i * eb, dt);
  return out;
}

// Random BF16 biases in (-4, 4) for both projections (as gpt-oss' checkpoints hold them).
void random_biases(test::Rng& rng, MoeExperts* x) {
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  x->bias_dtype = DType::kBF16;
  for (auto [v, count] : {std::make_pair(&x->w13_bias, x->w13.experts * x->w13.n),
                          std::make_pair(&x->w2_bias, x->w2.experts * x->w2.n)}) {
    v->resize(static_cast<size_t>(count * 2));
    for (int64_t i = 0; i < count; ++i) {
      const uint16_t h = float_to_bf16(u(rng));
      std::memcpy(v->data() + i * 2, &h, 2);
    }
  }
}

bool declares_biases(const std::vector<ParamSpec>& specs) {
  for (const ParamSpec& p : specs)
    if (p.role == ParamRole::kW13Bias || p.role == ParamRole::kW2Bias) return true;
  return false;
}

ref::MoeOutput output_of(const std::vector<double>& out, const std::vector<double>& slots,
                         int64_t hidden, int top_k) {
  ref::MoeOutput o;
  o.tokens = kTokens;
  o.hidden = hidden;
  o.top_k = top_k;
  o.out = out;
  o.slot_out = slots;
  return o;
}

// One random gpt-oss layer: the source's experts (biases included), packed by a layout row
// (row null: canonical readers only), its router and hidden states.
struct Layer {
  const TargetLayout* row = nullptr;
  LayoutOptions o;
  int64_t E = 0, H = 0, I = 0;
  bool gated = true;
  MoeExperts experts;
  TensorMap packed;
  ref::RouterConfig router;
  std::vector<float> x, router_weight, router_bias;
};

// Draws extents (and a vLLM target) the row writes, up to 32 draws; false when none.
bool draw_extents(const TargetLayout* row, const QuantParams& params, test::Rng& rng, Layer* L) {
  for (int draw = 0; draw < 32; ++draw) {
    const test::LayerDims d = test::random_layer_dims(rng, 1).front();
    L->E = d.experts + 3;
    L->H = d.hidden;
    L->I = d.inter;
    L->o = LayoutOptions{};
    L->o.act_dtype = DType::kBF16;
    L->o.gated = L->gated;
    L->o.source_method = params.method;
    L->o.prefix = "model.layers.0.mlp.experts.";
    L->o.hidden = L->H;
    L->o.inter = L->I;
    if (!row) return true;
    // The vLLM target the row writes (the gpt-oss layouts: 0.33's).
    for (const VllmTargetRow& t : vllm_target_rows()) {
      L->o.vllm_target = t.target;
      if (row->unsupported_reasons(L->o, moe_shape_for(params, L->E, L->H, L->I, true)).empty())
        return true;
    }
  }
  return false;
}

// The root mean square of the gate's pre-activations x . W13[e][i] (no bias) over every token,
// expert and gate row, and how many gate / up values with the biases pass the clamp (gate > 7,
// |up| > 7) and how many do not.
struct GateStats {
  double rms = 0;
  int64_t clamped = 0, unclamped = 0;
};
GateStats gate_stats(const Layer& L, const std::vector<float>& x) {
  GateStats s;
  const std::vector<float> b13 = floats_of(L.experts.w13_bias, L.experts.bias_dtype);
  const int64_t N = L.gated ? 2 * L.I : L.I;
  double sq = 0;
  int64_t n = 0;
  for (int64_t e = 0; e < L.E; ++e) {
    const std::vector<float> w = dequantize_expert(L.experts.w13, e);
    for (int64_t t = 0; t < kTokens; ++t)
      for (int64_t r = 0; r < N; ++r) {
        double v = 0;
        for (int64_t h = 0; h < L.H; ++h)
          v += static_cast<double>(x[static_cast<size_t>(t * L.H + h)]) *
               w[static_cast<size_t>(r * L.H + h)];
        if (r < L.I) {
          sq += v * v;
          ++n;
        }
        const double vb = v + b13[static_cast<size_t>(e * N + r)];
        const bool over = r < L.I ? vb > kSwigluOaiLimit : std::fabs(vb) > kSwigluOaiLimit;
        ++(over ? s.clamped : s.unclamped);
      }
  }
  s.rms = std::sqrt(sq / static_cast<double>(std::max<int64_t>(n, 1)));
  return s;
}

// Fills L's experts, packing, router and hidden states (x scaled so the gate's pre-activations
// have an rms of 4). Returns the clamp statistics of the scaled x.
GateStats make_layer(test::Rng& rng, const QuantParams& params, Layer* L) {
  test::RandomTensorOptions ro;
  std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(params);
  L->experts = test::random_moe_experts(rng, moe_shape_for(params, L->E, L->H, L->I, L->gated), ro);
  random_biases(rng, &L->experts);
  if (L->row) {
    const MoeShape s = moe_shape_for(params, L->E, L->H, L->I, L->gated);
    if (L->row->decide_layer)
      L->o.layer_decisions = L->row->decide_layer(L->o, s, test::whole_layer(L->experts, 2));
    for (Tensor& t : L->row->pack(L->o, L->experts)) L->packed.emplace(t.name, std::move(t));
  }
  L->router.family = "gpt_oss";
  L->router.num_experts = L->E;
  L->router.top_k = 2;
  L->router.renormalize = true;
  L->router.has_router_bias = true;
  L->router_weight = normal_floats(rng, static_cast<size_t>(L->E * L->H), 0.05f);
  L->router_bias = normal_floats(rng, static_cast<size_t>(L->E), 0.5f);
  L->x = ref::random_hidden_states(kTokens, L->H, 7);
  const double scale = 4.0 / std::max(gate_stats(*L, L->x).rms, 1e-30);
  for (float& v : L->x) v = static_cast<float>(v * scale);
  return gate_stats(*L, L->x);
}

enum class GotSide { kLayout, kLayoutWithoutBiases, kCanonical };

struct DeviceRun {
  MoeDeviceRouting routing;
  MoeLayerOutputs out;
};

// The layer on the device in two chunks (the staging areas alternate, the expert offsets and the
// biases' chunk indexing are exercised): the reference side through canonical readers of the
// source's experts with `act`, the layout side as `got` says.
DeviceRun run_layer(MoeRuntime& rt, const Layer& L, reader::ActQuant act, GotSide got) {
  MoeLayerSpec spec;
  spec.experts = L.E;
  spec.hidden = L.H;
  spec.inter = L.I;
  spec.gated = L.gated;
  spec.relu2 = !L.gated;
  spec.activation = L.gated ? kActSwigluOai : kActRelu2;
  DeviceRun run;
  run.routing = rt.begin_layer(spec, ref::runtime_router_spec(L.router), L.x.data(), kTokens,
                               L.router_weight.data(), L.router_bias.data(), nullptr);
  const int64_t split = L.E / 2;
  for (auto [e0, e1] : {std::make_pair(int64_t{0}, split), std::make_pair(split, L.E)}) {
    rt.begin_chunk();
    const ParamLocator locate = [&rt](const std::string&, const Tensor& t) {
      return rt.upload(t.data.data(), t.data.size());
    };
    const BufferLocator locate_buffer = [&rt](const void* p, size_t n) { return rt.upload(p, n); };
    const auto up = [&rt](const std::vector<float>& v) -> const float* {
      return v.empty() ? nullptr : static_cast<const float*>(rt.upload(v.data(), v.size() * 4));
    };
    const MoeExperts src = test::slice_moe_experts(L.experts, e0, e1);
    MoeChunkBiases ref_b{up(floats_of(src.w13_bias, src.bias_dtype)),
                         up(floats_of(src.w2_bias, src.bias_dtype))};
    const reader::ProjReader ref13 = make_canonical_reader(src.w13, act, locate_buffer);
    const reader::ProjReader ref2 = make_canonical_reader(src.w2, act, locate_buffer);
    if (got == GotSide::kCanonical) {
      rt.run_chunk(e0, e1, make_canonical_reader(src.w13, act, locate_buffer),
                   make_canonical_reader(src.w2, act, locate_buffer), ref13, ref2, ref_b, ref_b);
      continue;
    }
    TensorMap part;
    for (const auto& [name, t] : L.packed) {
      Tensor c = t;
      c.shape[0] = e1 - e0;
      const size_t per = t.data.size() / static_cast<size_t>(L.E);
      c.data.assign(t.data.begin() + static_cast<int64_t>(per) * e0,
                    t.data.begin() + static_cast<int64_t>(per) * e1);
      part.emplace(name, std::move(c));
    }
    MoeChunkBiases got_b;
    if (got == GotSide::kLayout) {
      const MoeExperts dec = L.row->unpack(L.o, part);  // the layout's own biases
      EXPECT_TRUE(dec.has_biases()) << L.row->name << " lost the biases";
      got_b = {up(floats_of(dec.w13_bias, dec.bias_dtype)),
               up(floats_of(dec.w2_bias, dec.bias_dtype))};
    }
    rt.run_chunk(e0, e1, L.row->make_reader(L.o, part, MoeProj::kW13, locate),
                 L.row->make_reader(L.o, part, MoeProj::kW2, locate), ref13, ref2, got_b, ref_b);
  }
  run.out = rt.finish_layer();
  return run;
}

// The CPU's definition of the layer on the device's routing: moe_reference with the biases and
// the layer's activation.
ref::MoeOutput cpu_reference(const Layer& L, const ref::Routing& routing) {
  const std::vector<float> b13 = floats_of(L.experts.w13_bias, L.experts.bias_dtype);
  const std::vector<float> b2 = floats_of(L.experts.w2_bias, L.experts.bias_dtype);
  ref::MoeSpec spec;
  spec.experts = L.E;
  spec.hidden = L.H;
  spec.intermediate = L.I;
  spec.gated = L.gated;
  spec.activation = L.gated ? ref::Activation::kSwigluOai : ref::Activation::kRelu2;
  spec.w13_bias = b13.data();
  spec.w2_bias = b2.data();
  return ref::moe_reference(spec, routing, L.x.data(), [&](int64_t e, MoeProj p) {
    return dequantize_expert(p == MoeProj::kW13 ? L.experts.w13 : L.experts.w2, e);
  });
}

double norm_err(const ref::MoeOutput& want, const ref::MoeOutput& got, const ref::Routing& r,
                int64_t experts) {
  return ref::compare_moe(want, got, r, experts).norm_err;
}

// The device's routing, the canonical fp64 and fp32 sides against the CPU (activations as they
// are). Returns the routing.
ref::Routing expect_canonical_matches_cpu(MoeRuntime& rt, const Layer& L) {
  const DeviceRun run = run_layer(rt, L, reader::ActQuant::kNone, GotSide::kCanonical);
  const ref::Routing routing = ref::routing_from_device(run.routing);
  const std::vector<float> logits = ref::router_logits(
      L.x.data(), kTokens, L.H, L.router_weight.data(), L.E, L.router_bias.data());
  EXPECT_EQ(routing.expert_ids, ref::route(logits, {}, L.router).expert_ids);
  const ref::MoeOutput cpu = cpu_reference(L, routing);
  const int k = routing.top_k;
  const double ref_err =
      norm_err(cpu, output_of(run.out.ref_out, run.out.ref_slots, L.H, k), routing, L.E);
  const double f32_err =
      norm_err(cpu, output_of(run.out.got_out, run.out.got_slots, L.H, k), routing, L.E);
  EXPECT_LE(ref_err, 1e-12);
  EXPECT_LE(f32_err, 1e-5);
  std::cout << "  GPU fp64 vs CPU " << ref_err << ", GPU fp32 vs CPU " << f32_err << "\n";
  return routing;
}

const QuantParams& gpt_oss_params() {
  const SourceCodec* codec = find_source_codec(QuantMethod::kGptOssMxfp4);
  static const QuantParams p = codec->param_space().front();
  return p;
}

// Every layout row that carries gpt-oss' biases, three random layers each: the canonical checks
// above, the layout's readers and biases against the reference, and without its biases.
TEST(GptOssMoeCuda, BiasesRouterAndClampedSwigluMatchTheCpuOnEveryBiasedLayout) {
  SKIP_WITHOUT_CUDA();
  ASSERT_NE(find_source_codec(QuantMethod::kGptOssMxfp4), nullptr);
  MoeRuntime rt;
  test::Rng rng(2601);
  int rows = 0;
  int64_t clamped = 0, unclamped = 0;
  for (const TargetLayout& row : target_layouts()) {
    Layer probe;
    probe.row = &row;
    if (!draw_extents(&row, gpt_oss_params(), rng, &probe)) continue;
    const MoeShape s = moe_shape_for(gpt_oss_params(), probe.E, probe.H, probe.I, true);
    if (!declares_biases(row.param_specs(probe.o, s))) continue;
    ++rows;
    for (int layer = 0; layer < 3; ++layer) {
      Layer L;
      L.row = &row;
      ASSERT_TRUE(draw_extents(&row, gpt_oss_params(), rng, &L)) << row.name;
      std::ostringstream trace;
      trace << row.name << " E=" << L.E << " H=" << L.H << " I=" << L.I;
      SCOPED_TRACE(trace.str());
      std::cout << trace.str() << "\n";
      const GateStats st = make_layer(rng, gpt_oss_params(), &L);
      clamped += st.clamped;
      unclamped += st.unclamped;
      const ref::Routing routing = expect_canonical_matches_cpu(rt, L);
      const reader::ActQuant act = row.act_quant(L.o);
      const DeviceRun with = run_layer(rt, L, act, GotSide::kLayout);
      ASSERT_EQ(with.routing.expert_ids, routing.expert_ids);
      const ref::MoeOutput gpu_ref =
          output_of(with.out.ref_out, with.out.ref_slots, L.H, routing.top_k);
      const double err =
          norm_err(gpu_ref, output_of(with.out.got_out, with.out.got_slots, L.H, routing.top_k),
                   routing, L.E);
      EXPECT_LE(err, 5e-4);
      const DeviceRun without = run_layer(rt, L, act, GotSide::kLayoutWithoutBiases);
      const double dropped = norm_err(
          gpu_ref, output_of(without.out.got_out, without.out.got_slots, L.H, routing.top_k),
          routing, L.E);
      EXPECT_GT(dropped, 10 * 5e-4);
      std::cout << "  layout vs reference " << err << ", without its biases " << dropped << "\n";
    }
  }
  EXPECT_GE(rows, 3) << "marlin-mxfp4, triton-mxfp4 and trtllm-mxfp4 carry gpt-oss' biases";
  EXPECT_GT(clamped, 0) << "no gate / up value passed the clamp";
  EXPECT_GT(unclamped, clamped) << "the SwiGLU was mostly saturated";
}

// A non-gated layer (relu2) with biases, canonical readers: the w13 bias is [E, I] there.
TEST(GptOssMoeCuda, NonGatedBiasesMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  ASSERT_NE(find_source_codec(QuantMethod::kGptOssMxfp4), nullptr);
  MoeRuntime rt;
  test::Rng rng(2602);
  for (int layer = 0; layer < 3; ++layer) {
    Layer L;
    L.gated = false;
    ASSERT_TRUE(draw_extents(nullptr, gpt_oss_params(), rng, &L));
    SCOPED_TRACE("E=" + std::to_string(L.E) + " H=" + std::to_string(L.H) +
                 " I=" + std::to_string(L.I));
    make_layer(rng, gpt_oss_params(), &L);
    expect_canonical_matches_cpu(rt, L);
  }
}

}  // namespace
}  // namespace moepack
