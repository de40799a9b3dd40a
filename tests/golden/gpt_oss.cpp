// gpt-oss against transformers on a tiny checkpoint in the published on-disk format
// (tests/gpt_oss/generate.py; versions in tests/gpt_oss/fixtures/versions.json): the MXFP4
// experts as moepack decodes them against transformers' own dequantisation of the same files
// (Mxfp4Config(dequantize=True)), bit for bit, and the whole MoE block -- router with bias, top-k
// then softmax, expert biases, the clamped SwiGLU on interleaved gate/up -- against
// GptOssMLP's output in float32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/moe_reader.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/routing.h"
#include "tests/test_util.h"
#include "verify/moe_reference.h"
#include "verify/router.h"

namespace moepack {
namespace {

const std::string kDir = std::string(MOEPACK_TEST_SOURCE_DIR) + "/tests/gpt_oss/fixtures";
constexpr int64_t kE = 4, kH = 64, kI = 64, kT = 24;

// gate_up[..., ::2] is the gate, [..., 1::2] the up: logical [gate; up] row r's column.
int64_t interleaved(int64_t r) {
  return r < kI ? 2 * r : 2 * (r - kI) + 1;
}

struct Fixture {
  SafetensorsFile expected = SafetensorsFile::open(kDir + "/expected.safetensors");
  std::unique_ptr<Checkpoint> ckpt = Checkpoint::open(kDir + "/mxfp4");
  std::vector<float> get(const MoeLayer& L, const std::string& name) const {
    return to_floats(expected.view(std::to_string(L.layer) + "." + name));
  }
};

TEST(GptOssFixture, OpensAsPublished) {
  Fixture f;
  const Checkpoint& c = *f.ckpt;
  EXPECT_EQ(c.quant().method, QuantMethod::kGptOssMxfp4);
  EXPECT_EQ(c.quant().group_size, 32);
  ASSERT_EQ(c.moe_layers().size(), 2u);
  for (const MoeLayer& L : c.moe_layers()) {
    EXPECT_EQ(L.family, MoeFamily::kGptOss);
    EXPECT_EQ(L.num_experts, kE);
    EXPECT_EQ(L.hidden, kH);
    EXPECT_EQ(L.inter, kI);
    EXPECT_TRUE(L.gated);
  }
  EXPECT_EQ(c.router().top_k, 2);
  EXPECT_TRUE(c.router().has_router_bias);
  EXPECT_TRUE(c.router().renormalize);
  EXPECT_EQ(expert_activation_from_hf(c.config().raw), Activation::kSwigluOai);
}

TEST(GptOssFixture, DecodeEqualsTransformersDequantisation) {
  Fixture f;
  for (const MoeLayer& L : f.ckpt->moe_layers()) {
    const std::vector<float> gu = f.get(L, "gate_up_proj"), dn = f.get(L, "down_proj");
    const std::vector<float> gub = f.get(L, "gate_up_proj_bias"), dnb = f.get(L, "down_proj_bias");
    ASSERT_EQ(gu.size(), static_cast<size_t>(kE * kH * 2 * kI));
    const MoeExperts m = load_moe_experts(*f.ckpt, L, 2);
    EXPECT_EQ(m.w13.kind, CodeKind::kFp4E2M1);
    EXPECT_EQ(m.w13.scale_dtype, DType::kU8);
    int64_t nonzero = 0;
    std::set<uint8_t> codes;
    for (int64_t e = 0; e < kE; ++e) {
      const std::vector<float> w13 = dequantize_expert(m.w13, e), w2 = dequantize_expert(m.w2, e);
      for (int64_t r = 0; r < 2 * kI; ++r)
        for (int64_t h = 0; h < kH; ++h) {
          const float want = gu[static_cast<size_t>((e * kH + h) * 2 * kI + interleaved(r))];
          const float got = w13[static_cast<size_t>(r * kH + h)];
          ASSERT_EQ(std::signbit(got), std::signbit(want)) << L.layer << " e" << e << " r" << r;
          ASSERT_EQ(got, want) << "layer " << L.layer << " expert " << e << " row " << r << " h "
                               << h;
          nonzero += want != 0.0f;
        }
      for (int64_t h = 0; h < kH; ++h)
        for (int64_t i = 0; i < kI; ++i)
          ASSERT_EQ(w2[static_cast<size_t>(h * kI + i)],
                    dn[static_cast<size_t>((e * kI + i) * kH + h)])
              << "layer " << L.layer << " expert " << e << " h " << h << " i " << i;
    }
    for (uint8_t c : m.w13.codes) codes.insert(c);
    EXPECT_EQ(codes.size(), 16u);  // every e2m1 code, -0 included
    EXPECT_GT(nonzero, kE * 2 * kI * kH / 2);
    // Biases, gate/up de-interleaved like the rows.
    const ExpertBiases b = load_expert_biases(*f.ckpt, L);
    ASSERT_EQ(b.w13.size(), static_cast<size_t>(kE * 2 * kI));
    ASSERT_EQ(b.w2.size(), static_cast<size_t>(kE * kH));
    for (int64_t e = 0; e < kE; ++e) {
      for (int64_t r = 0; r < 2 * kI; ++r)
        ASSERT_EQ(b.w13[static_cast<size_t>(e * 2 * kI + r)],
                  gub[static_cast<size_t>(e * 2 * kI + interleaved(r))]);
      for (int64_t h = 0; h < kH; ++h)
        ASSERT_EQ(b.w2[static_cast<size_t>(e * kH + h)], dnb[static_cast<size_t>(e * kH + h)]);
    }
    // A chunk of experts reads the same bytes as the whole layer.
    ExpertRange range;
    range.begin = 1;
    range.end = 3;
    const MoeExperts part = load_moe_experts(*f.ckpt, L, 1, range);
    for (int64_t e = 1; e < 3; ++e) {
      EXPECT_EQ(dequantize_expert(part.w13, e - 1), dequantize_expert(m.w13, e));
      EXPECT_EQ(dequantize_expert(part.w2, e - 1), dequantize_expert(m.w2, e));
    }
    const ExpertBiases pb = load_expert_biases(*f.ckpt, L, range);
    EXPECT_TRUE(std::equal(pb.w13.begin(), pb.w13.end(), b.w13.begin() + 2 * kI));
    EXPECT_TRUE(std::equal(pb.w2.begin(), pb.w2.end(), b.w2.begin() + kH));
  }
}

// max |got - want| / (1 + max |want|) over the block's output.
double relative_error(const std::vector<double>& got, const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(got[i] - static_cast<double>(want[i])));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return err / (1.0 + scale);
}

TEST(GptOssFixture, MoeEqualsTransformersGptOssMlp) {
  Fixture f;
  const Checkpoint& c = *f.ckpt;
  constexpr double kTol = 2e-6;  // transformers runs float32, moepack's reference float64
  for (const MoeLayer& L : c.moe_layers()) {
    const std::vector<float> x = f.get(L, "x"), want = f.get(L, "out");
    ASSERT_EQ(x.size(), static_cast<size_t>(kT * kH));
    const RouterTensorNames names = router_tensor_names(
        L.module, c.router(), [&](const std::string& n) { return c.has_tensor(n); });
    ASSERT_EQ(names.weight, L.module + ".router.weight");
    ASSERT_EQ(names.bias, L.module + ".router.bias");
    ref::RouterTensors rt;
    rt.weight = to_floats(c.view(names.weight));
    rt.bias = to_floats(c.view(names.bias));
    const ref::LayerRouting lr = ref::route_layer(c.router(), x.data(), kT, kH, rt);
    // The router's choice is transformers' (as sets: both take the top 2 of the logits).
    const TensorView ids = f.expected.view(std::to_string(L.layer) + ".router_ids");
    const int32_t* want_ids = ids.as<int32_t>();
    for (int64_t t = 0; t < kT; ++t) {
      std::set<int64_t> got_set, want_set;
      for (int k = 0; k < 2; ++k) {
        got_set.insert(lr.routing.expert(t, k));
        want_set.insert(want_ids[t * 2 + k]);
      }
      ASSERT_EQ(got_set, want_set) << "token " << t;
    }
    const MoeExperts m = load_moe_experts(c, L, 2);
    const ExpertBiases b = load_expert_biases(c, L);
    ref::MoeSpec spec;
    spec.experts = kE;
    spec.hidden = kH;
    spec.intermediate = kI;
    spec.activation = expert_activation_from_hf(c.config().raw);
    spec.w13_bias = b.w13.data();
    spec.w2_bias = b.w2.data();
    auto weights = [&](int64_t e, MoeProj p) {
      return dequantize_expert(p == MoeProj::kW13 ? m.w13 : m.w2, e);
    };
    const ref::MoeOutput ref_out =
        ref::moe_reference(spec, lr.routing, lr.expert_input.data(), weights);
    EXPECT_LT(relative_error(ref_out.out, want), kTol) << "layer " << L.layer;
    // The same through the canonical readers (the float path verify runs a layout through).
    const reader::ProjReader r13 =
        make_canonical_reader(m.w13, reader::ActQuant::kNone, host_buffer);
    const reader::ProjReader r2 = make_canonical_reader(m.w2, reader::ActQuant::kNone, host_buffer);
    const ref::MoeOutput via = ref::moe_via_expert_matmul(spec, lr.routing, lr.expert_input.data(),
                                                          ref::reader_matmul(r13, r2));
    EXPECT_LT(relative_error(via.out, want), 1e-5) << "layer " << L.layer;

    // Each part of gpt-oss' MoE matters on this fixture: the check fails without it.
    ref::MoeSpec no_bias = spec;
    no_bias.w13_bias = nullptr;
    EXPECT_GT(relative_error(ref::moe_reference(no_bias, lr.routing, x.data(), weights).out, want),
              1e-3);
    no_bias = spec;
    no_bias.w2_bias = nullptr;
    EXPECT_GT(relative_error(ref::moe_reference(no_bias, lr.routing, x.data(), weights).out, want),
              1e-3);
    ref::MoeSpec silu = spec;
    silu.activation = Activation::kSilu;
    EXPECT_GT(relative_error(ref::moe_reference(silu, lr.routing, x.data(), weights).out, want),
              1e-3);
    // Rows read as [gate; up] where they are interleaved.
    std::vector<float> raw_gu = f.get(L, "gate_up_proj");
    auto not_deinterleaved = [&](int64_t e, MoeProj p) {
      if (p == MoeProj::kW2) return weights(e, p);
      std::vector<float> w(static_cast<size_t>(2 * kI * kH));
      for (int64_t r = 0; r < 2 * kI; ++r)
        for (int64_t h = 0; h < kH; ++h)
          w[static_cast<size_t>(r * kH + h)] =
              raw_gu[static_cast<size_t>((e * kH + h) * 2 * kI + r)];
      return w;
    };
    EXPECT_GT(
        relative_error(ref::moe_reference(spec, lr.routing, x.data(), not_deinterleaved).out, want),
        1e-3);
    // The clamp is exercised: some gate or up value of a routed token passes 7.
    int clamped = 0;
    for (int64_t t = 0; t < kT; ++t)
      for (int k = 0; k < 2; ++k) {
        const int64_t e = lr.routing.expert(t, k);
        const std::vector<float> w13 = weights(e, MoeProj::kW13);
        for (int64_t r = 0; r < 2 * kI; ++r) {
          double h = b.w13[static_cast<size_t>(e * 2 * kI + r)];
          for (int64_t j = 0; j < kH; ++j)
            h += static_cast<double>(w13[static_cast<size_t>(r * kH + j)]) * x[t * kH + j];
          clamped += r < kI ? h > 7.0 : std::fabs(h) > 7.0;
        }
      }
    EXPECT_GT(clamped, 20) << "layer " << L.layer;
  }
}

// The bf16 variant (as the -BF16 re-uploads store gpt-oss): the same experts as plain
// [E, H, 2I] / [E, I, H] tensors, read as such, with the same biases.
TEST(GptOssFixture, Bf16VariantHoldsTheSameExperts) {
  Fixture f;
  const auto c = Checkpoint::open(kDir + "/bf16");
  EXPECT_EQ(c->quant().method, QuantMethod::kNone);
  ASSERT_EQ(c->moe_layers().size(), 2u);
  for (const MoeLayer& L : c->moe_layers()) {
    EXPECT_EQ(L.family, MoeFamily::kGptOss);
    EXPECT_EQ(L.inter, kI);
    const ExpertBiases b = load_expert_biases(*c, L), bq = load_expert_biases(*f.ckpt, L);
    EXPECT_EQ(b.w13, bq.w13);
    EXPECT_EQ(b.w2, bq.w2);
    EXPECT_EQ(to_floats(c->view(L.param_prefix + "gate_up_proj")), f.get(L, "gate_up_proj"));
    EXPECT_EQ(to_floats(c->view(L.param_prefix + "down_proj")), f.get(L, "down_proj"));
    // Weights without their biases are never handed out.
    test::expect_error([&] { load_dense_experts(*c, L); }, ErrorCode::kUnsupported);
  }
}

}  // namespace
}  // namespace moepack
