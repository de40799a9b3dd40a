// trtllm-nvfp4 (formats/trtllm_fp4.h): pack∘unpack over the legal shape space (ModelOpt and
// compressed-tensors, gated and relu2, H / I padded or not) equal to what vLLM keeps of the
// experts; the folded scales' inverse (trtllm::unfold_global); the reader against the canonical
// dequantisation, bit for bit; the NVFP4 activation quantiser against a scalar statement of
// TRT-LLM's; mutants; every refusal, and unpack refusing parameters vLLM would not have computed.
// (Byte-exactness against vLLM / FlashInfer themselves: tests/golden/trtllm_nvfp4.cpp.)
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>

#include "formats/codec.h"
#include "formats/fp4.h"
#include "formats/fp8.h"
#include "formats/layout/moe_reader.h"
#include "formats/moe_reader.h"
#include "formats/trtllm_fp4.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::expect_error;
using test::Rng;

LayoutOptions nvfp4_options(QuantMethod m, int64_t H, int64_t I, bool gated) {
  LayoutOptions o;
  o.source_method = m;
  o.act_dtype = DType::kBF16;
  o.gated = gated;
  o.vllm_target = VllmTarget::kV0_33;
  o.prefix = "model.layers.1.mlp.experts.";
  o.hidden = H;
  o.inter = I;
  return o;
}

QuantParams w4a4(QuantMethod m, bool dynamic_input = false) {
  QuantParams q;
  q.method = m;
  q.bits = 4;
  q.group_size = 16;
  q.dynamic_input = dynamic_input;
  return q;
}

// Random W4A4 experts with scales in the producers' ranges (moderate), w13's global and
// activation scales per gate / up shard as load_moe_experts stacks them.
MoeExperts random_w4a4(Rng& rng, QuantMethod m, int64_t E, int64_t H, int64_t I, bool gated) {
  const MoeShape s = moe_shape_for(w4a4(m), E, H, I, gated);
  test::RandomTensorOptions opts;
  MoeExperts x;
  opts.global_shards = gated ? 2 : 1;
  x.w13 = test::random_quant_tensor(rng, s.w13.quant, E, s.w13.n, H, opts);
  opts.global_shards = 1;
  x.w2 = test::random_quant_tensor(rng, s.w2.quant, E, H, I, opts);
  if (gated)  // the gate's and up's global scales agree (vLLM serves the gate's for both)
    for (int64_t e = 0; e < E; ++e) x.w13.global_scales[2 * e + 1] = x.w13.global_scales[2 * e];
  return x;
}

TensorMap by_name(std::vector<Tensor> ts) {
  TensorMap m;
  for (auto& t : ts) m.emplace(t.name, std::move(t));
  return m;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

float next_up(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  ++u;
  std::memcpy(&f, &u, 4);
  return f;
}
float next_down(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  --u;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(TrtllmNvfp4, UnfoldGlobalIsTheSmallestFactorOfTheProduct) {
  Rng rng(3);
  std::uniform_real_distribution<float> d(-20.0f, 4.0f);
  int classes_wider_than_one = 0;
  for (int i = 0; i < 20000; ++i) {
    const float g = std::exp2(d(rng)), a = std::exp2(d(rng)) * 1.37f;
    const float p = g * a;
    const float u = trtllm::unfold_global(p, a);
    ASSERT_EQ(u * a, p) << g << " * " << a;
    ASSERT_LE(u, g);
    ASSERT_NE(next_down(u) * a, p) << "not the smallest of its class";
    classes_wider_than_one += u != g;
  }
  EXPECT_GT(classes_wider_than_one, 0) << "fl(g * a) is not injective: the test must see it";
  // A float no product with a rounds to (between two neighbouring products), and bad inputs.
  const float a = 3.0f;
  bool found_gap = false;
  for (float g = 1.0f; g < 1.001f && !found_gap; g = next_up(g)) {
    const float p = g * a, q = next_up(g) * a;
    if (next_up(p) != q) {
      EXPECT_TRUE(std::isnan(trtllm::unfold_global(next_up(p), a)));
      found_gap = true;
    }
  }
  EXPECT_TRUE(found_gap);
  EXPECT_TRUE(std::isnan(trtllm::unfold_global(0.0f, 1.0f)));
  EXPECT_TRUE(std::isnan(trtllm::unfold_global(1.0f, -1.0f)));
  EXPECT_TRUE(std::isnan(trtllm::unfold_global(INFINITY, 1.0f)));
}

// TRT-LLM's NVFP4 activation quantiser, restated with moepack's host codecs.
std::vector<float> nvfp4_act_reference(const std::vector<float>& x, float a) {
  std::vector<float> out(x.size());
  const float gs = 1.0f / a;
  for (size_t b0 = 0; b0 < x.size(); b0 += 16) {
    float amax = 0.0f;
    for (size_t i = b0; i < b0 + 16; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float sf = e4m3_to_float(float_to_e4m3_satfinite(gs * (amax * (1.0f / 6.0f))));
    const float inv = sf != 0.0f ? 1.0f / (sf * (1.0f / gs)) : 0.0f;
    for (size_t i = b0; i < b0 + 16; ++i) {
      const uint8_t c = float_to_e2m1(x[i] * inv);
      const float v =
          (c & 8 ? -1.0f : 1.0f) * std::array<float, 8>{0, 0.5f, 1, 1.5f, 2, 3, 4, 6}[c & 7];
      out[i] = v * sf * a;
    }
  }
  return out;
}

TEST(TrtllmNvfp4, ActivationQuantiserIsTrtllmsBlocksOf16) {
  Rng rng(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  reader::ProjReader r{};
  r.act = reader::ActQuant::kNvfp4Block16;
  r.k = 64;
  for (float a : {0.004f, 0.25f, 1.0f, 37.0f}) {
    std::vector<float> x(64);
    for (auto& v : x) v = nd(rng);
    for (int i = 16; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero block
    r.act_scale = a;
    std::vector<float> got(64);
    reader::quantize_activation_row(r, x.data(), got.data());
    const std::vector<float> want = nvfp4_act_reference(x, a);
    EXPECT_EQ(bits(got), bits(want)) << "a=" << a;
    double err = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err = std::max(err, std::fabs(double(got[i]) - x[i]));
      den = std::max(den, std::fabs(double(x[i])));
    }
    if (a <= 1.0f) {
      EXPECT_LT(err / den, 0.2) << "a=" << a;  // e2m1's spacing, not garbage
    }
  }
  std::vector<float> x(32, 1.0f), got(32);
  x[3] = NAN;
  r.k = 32;
  r.act_scale = 1.0f;
  reader::quantize_activation_row(r, x.data(), got.data());
  EXPECT_TRUE(std::isnan(got[0]) && std::isnan(got[15]));  // the NaN's block
  // The next block is its own: 1 / 6 rounds to the e4m3 0.171875, 1 to e2m1 6 of it.
  EXPECT_EQ(got[16], 6.0f * 0.171875f);
}

struct Case {
  QuantMethod m;
  int64_t E, H, I;
  bool gated;
};

TEST(TrtllmNvfp4, PackUnpackIsWhatVllmKeepsAndTheReaderMatches) {
  Rng rng(26);
  const TargetLayout* row = find_target_layout("trtllm-nvfp4");
  ASSERT_NE(row, nullptr);
  for (const Case& c : std::vector<Case>{{QuantMethod::kModeloptNvfp4, 2, 192, 96, true},
                                         {QuantMethod::kCtNvfp4, 3, 256, 128, true},
                                         {QuantMethod::kModeloptNvfp4, 1, 16, 16, true},
                                         {QuantMethod::kCtNvfp4, 2, 320, 48, false},
                                         {QuantMethod::kModeloptNvfp4, 2, 512, 160, false},
                                         {QuantMethod::kCtNvfp4, 4, 48, 64, true}}) {
    SCOPED_TRACE(std::string(quant_method_name(c.m)) + " E=" + std::to_string(c.E) + " H=" +
                 std::to_string(c.H) + " I=" + std::to_string(c.I) + (c.gated ? "" : " relu2"));
    LayoutOptions o = nvfp4_options(c.m, c.H, c.I, c.gated);
    const MoeExperts x = random_w4a4(rng, c.m, c.E, c.H, c.I, c.gated);
    const MoeShape shape = moe_shape_of(x);
    ASSERT_TRUE(trtllm_nvfp4_unsupported_reasons(o, shape).empty());
    EXPECT_EQ(trtllm_nvfp4_padded_inter(o, shape),
              (c.I + (c.gated ? 63 : 127)) / (c.gated ? 64 : 128) * (c.gated ? 64 : 128));
    o.layer_decisions = trtllm_nvfp4_decide_layer(o, shape, test::whole_layer(x, 1));
    const std::vector<Tensor> packed = pack_trtllm_nvfp4_moe(o, x);
    const std::vector<ParamSpec> specs = trtllm_nvfp4_param_specs(o, shape);
    ASSERT_EQ(packed.size(), specs.size());
    for (size_t i = 0; i < packed.size(); ++i) {
      EXPECT_EQ(packed[i].name, specs[i].name);
      EXPECT_EQ(packed[i].dtype, specs[i].dtype) << specs[i].name;
      EXPECT_EQ(packed[i].shape, specs[i].shape) << specs[i].name;
    }
    const TensorMap params = by_name(packed);
    const MoeExperts back = unpack_trtllm_nvfp4_moe(o, params);
    const MoeExperts kept = trtllm_nvfp4_vllm_loaded(o, x);
    for (const auto& [got, want, what] : {std::make_tuple(&back.w13, &kept.w13, "w13"),
                                          std::make_tuple(&back.w2, &kept.w2, "w2")}) {
      SCOPED_TRACE(what);
      EXPECT_TRUE(got->spec() == want->spec());
      EXPECT_TRUE(test::bytes_equal(got->codes, want->codes, 64, "codes"));
      EXPECT_TRUE(test::bytes_equal(got->scales, want->scales, 64, "scales"));
      EXPECT_EQ(bits(got->global_scales), bits(want->global_scales));
      EXPECT_EQ(bits(got->input_scales), bits(want->input_scales));
    }
    // What vLLM keeps packs to the same bytes (the loaded form is a fixed point).
    const std::vector<Tensor> again = pack_trtllm_nvfp4_moe(o, kept);
    for (size_t i = 0; i < packed.size(); ++i)
      EXPECT_TRUE(test::bytes_equal(again[i].data, packed[i].data, 64, packed[i].name));
    test::expect_reader_matches(rng, *row, o, params, back);
    // The reader's activation scale is the layer's, for each projection.
    const reader::ProjReader r13 = trtllm_nvfp4_make_reader(o, params, MoeProj::kW13, host_param);
    EXPECT_EQ(r13.act, reader::ActQuant::kNvfp4Block16);
    EXPECT_GT(r13.act_scale, 0.0f);
  }
}

TEST(TrtllmNvfp4, MatmulCatchesLayoutMutants) {
  Rng rng(41);
  const LayoutOptions base = nvfp4_options(QuantMethod::kModeloptNvfp4, 256, 128, true);
  LayoutOptions o = base;
  const MoeExperts x = random_w4a4(rng, QuantMethod::kModeloptNvfp4, 1, 256, 128, true);
  o.layer_decisions = trtllm_nvfp4_decide_layer(o, moe_shape_of(x), test::whole_layer(x, 1));
  const TensorMap good = by_name(pack_trtllm_nvfp4_moe(o, x));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> xin(3 * 256);
  for (auto& v : xin) v = nd(rng);
  const auto error = [&](const TensorMap& p) {
    std::vector<float> y(3 * 256);
    test::layout_matmul(trtllm_nvfp4_make_reader, o, p, MoeProj::kW13, 0, xin.data(), 3, y.data());
    return test::matmul_error(x.w13, 0, xin, 3, y);
  };
  EXPECT_LT(error(good), 1e-5);
  const std::string P = o.prefix;
  {  // gate/up pairs not interleaved: physical rows 0 and 1 swapped (TRT-LLM's up0, gate0)
    TensorMap m = good;
    Tensor& w = m.at(P + "w13_weight");
    std::vector<uint8_t> row0(w.data.begin(), w.data.begin() + 128);
    std::copy(w.data.begin() + 128, w.data.begin() + 256, w.data.begin());
    std::copy(row0.begin(), row0.end(), w.data.begin() + 128);
    EXPECT_GT(error(m), 1e-3);
  }
  {  // scales not interleaved: one 512-byte 128x4 tile read row-major
    TensorMap m = good;
    Tensor& s = m.at(P + "w13_weight_scale");
    std::swap(s.data[1], s.data[16]);
    std::swap(s.data[2], s.data[32]);
    EXPECT_GT(error(m), 1e-3);
  }
  {  // the activation scale not the one folded into w13_weight_scale_2 (unfolded wrong)
    TensorMap m = good;
    Tensor& in = m.at(P + "w13_input_scale");
    const float a = 2.0f * in.as<float>()[0];
    std::memcpy(in.data.data(), &a, 4);
    EXPECT_GT(error(m), 1e-3);
  }
}

TEST(TrtllmNvfp4, RefusalsNameTheirReason) {
  const auto reasons = [](const LayoutOptions& o, const QuantParams& q) {
    std::string all;
    for (const auto& r : trtllm_nvfp4_unsupported_reasons(o, moe_shape_for(q, 4, 256, 128, true)))
      all += r + "\n";
    return all;
  };
  const LayoutOptions o = nvfp4_options(QuantMethod::kModeloptNvfp4, 256, 128, true);
  EXPECT_EQ(reasons(o, w4a4(QuantMethod::kModeloptNvfp4)), "");
  EXPECT_NE(reasons(o, w4a4(QuantMethod::kModeloptNvfp4, /*dynamic_input=*/true))
                .find("weight-only NVFP4"),
            std::string::npos);
  LayoutOptions spec = o;
  spec.vllm_target = VllmTarget::kV2026_05;
  EXPECT_NE(reasons(spec, w4a4(QuantMethod::kModeloptNvfp4)).find("--vllm-target"),
            std::string::npos);
  LayoutOptions gptq = o;
  gptq.source_method = QuantMethod::kGptq;
  EXPECT_NE(reasons(gptq, w4a4(QuantMethod::kModeloptNvfp4)).find("source method gptq"),
            std::string::npos);
  QuantParams mx;
  mx.method = QuantMethod::kCtMxfp4;
  mx.bits = 4;
  mx.group_size = 32;
  EXPECT_NE(reasons(o, mx).find("group_size 32"), std::string::npos);
}

TEST(TrtllmNvfp4, UnpackRefusesWhatVllmWouldNotHaveComputed) {
  Rng rng(8);
  for (QuantMethod m : {QuantMethod::kModeloptNvfp4, QuantMethod::kCtNvfp4}) {
    SCOPED_TRACE(quant_method_name(m));
    LayoutOptions o = nvfp4_options(m, 256, 64, true);
    const MoeExperts x = random_w4a4(rng, m, 2, 256, 64, true);
    o.layer_decisions = trtllm_nvfp4_decide_layer(o, moe_shape_of(x), test::whole_layer(x, 2));
    const TensorMap good = by_name(pack_trtllm_nvfp4_moe(o, x));
    // ModelOpt keeps only the products: another w13_weight_scale_2 / w2_weight_scale_2 is
    // another checkpoint (verify's round trip against the source sees it), but g1_scale_c and the
    // input scales must agree with them. compressed-tensors keeps the factors: all are checked.
    std::vector<const char*> names = {"g1_scale_c"};
    if (m == QuantMethod::kModeloptNvfp4)
      names.push_back("w2_input_scale");
    else
      names.insert(names.end(), {"w13_weight_scale_2", "w2_weight_scale_2"});
    for (const char* name : names) {
      TensorMap bad = good;
      float* v = bad.at(o.prefix + name).as<float>();
      v[1] = next_up(v[1] * 1.5f);
      const Error e =
          expect_error([&] { (void)unpack_trtllm_nvfp4_moe(o, bad); }, ErrorCode::kBadValue);
      EXPECT_EQ(e.tensor(), o.prefix + name);
      EXPECT_NE(std::string(e.what()).find("expert 1"), std::string::npos) << e.what();
    }
    TensorMap nan = good;
    nan.at(o.prefix + "w13_weight_scale_2").as<float>()[0] = NAN;
    expect_error([&] { (void)unpack_trtllm_nvfp4_moe(o, nan); }, ErrorCode::kBadValue);
    TensorMap missing = good;
    missing.erase(o.prefix + "g1_scale_c");
    expect_error([&] { (void)unpack_trtllm_nvfp4_moe(o, missing); }, ErrorCode::kMissingTensor);
    LayoutOptions undecided = o;
    undecided.layer_decisions.clear();
    expect_error([&] { (void)pack_trtllm_nvfp4_moe(undecided, x); }, ErrorCode::kBadConfig);
    undecided.layer_decisions = {{"w13_input_scale", "1.5"}, {"w2_input_scale", "0x3f800000"}};
    expect_error([&] { (void)pack_trtllm_nvfp4_moe(undecided, x); }, ErrorCode::kBadConfig);
  }
}

}  // namespace
}  // namespace moepack
