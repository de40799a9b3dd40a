// trtllm-mxfp4 (formats/trtllm_fp4.h): the row maps against the steps vLLM 0.33 takes, the reader
// against the canonical dequantisation, mutants a layout bug would produce, the refusals and the
// unpack checks of vLLM's zero padding. (Byte-exactness against vLLM / FlashInfer themselves:
// tests/golden/trtllm_fp4.cpp; pack∘unpack, param_specs and the reader over the legal space:
// tests/unit/registry_suite.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "core/half.h"
#include "formats/codec.h"
#include "formats/trtllm_fp4.h"
#include "formats/trtllm_mxfp8.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::Rng;

// gpt-oss' steps on its interleaved rows (row 2j gate j, 2j + 1 up j, then padding):
// swap_every_two_rows, then get_w2_permute_indices_with_cache(., 128) = shuffle_matrix_a's rows.
// Logical rows are [gate; up] (gate j = j, up j = I + j).
std::vector<int32_t> steps_w13(int64_t rows, int64_t inter) {
  std::vector<int32_t> interleaved(static_cast<size_t>(rows), -1);  // loader row -> logical
  for (int64_t j = 0; j < inter; ++j) {
    interleaved[static_cast<size_t>(2 * j)] = static_cast<int32_t>(j);
    interleaved[static_cast<size_t>(2 * j + 1)] = static_cast<int32_t>(inter + j);
  }
  std::vector<int32_t> swapped(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) swapped[static_cast<size_t>(r)] = interleaved[r ^ 1];
  const std::vector<int32_t> shuffle = shuffle_matrix_a_rows(rows, 128);
  std::vector<int32_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    out[static_cast<size_t>(r)] = swapped[static_cast<size_t>(shuffle[static_cast<size_t>(r)])];
  return out;
}

TEST(TrtllmFp4RowMaps, W13IsGptOssStepsAndMxfp8sW31MapWithoutPadding) {
  for (const auto& [rows, inter] :
       std::vector<std::pair<int64_t, int64_t>>{{256, 128}, {256, 32}, {512, 160}, {256, 96}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows, I=" + std::to_string(inter));
    const std::vector<int32_t> got = trtllm_fp4_w13_rows(rows, inter, true);
    EXPECT_EQ(got, steps_w13(rows, inter));
    if (rows == 2 * inter) {
      EXPECT_EQ(got, trtllm_w13_rows(rows, true));  // W31 swap + reorder
    }
    int64_t padding = 0;
    for (int32_t s : got) padding += s < 0;
    EXPECT_EQ(padding, rows - 2 * inter);
  }
  const std::vector<int32_t> w2 = trtllm_fp4_w2_rows(256, 200);
  const std::vector<int32_t> shuffle = shuffle_matrix_a_rows(256, 128);
  for (size_t r = 0; r < w2.size(); ++r) EXPECT_EQ(w2[r], shuffle[r] < 200 ? shuffle[r] : -1);
}

LayoutOptions gpt_oss_options(int64_t H, int64_t I) {
  LayoutOptions o;
  o.source_method = QuantMethod::kGptOssMxfp4;
  o.act_dtype = DType::kBF16;
  o.gated = true;
  o.vllm_target = VllmTarget::kV0_33;
  o.prefix = "model.layers.0.mlp.experts.";
  o.hidden = H;
  o.inter = I;
  return o;
}

MoeExperts random_gpt_oss(Rng& rng, int64_t E, int64_t H, int64_t I, const LayoutOptions& o) {
  QuantParams q;
  q.method = QuantMethod::kGptOssMxfp4;
  const MoeShape s = moe_shape_for(q, E, H, I, true);
  MoeExperts x = test::random_moe_experts(rng, s, test::RandomTensorOptions{});
  test::add_declared_biases(rng, trtllm_mxfp4_param_specs(o, s), &x);
  return x;
}

TensorMap by_name(std::vector<Tensor> ts) {
  TensorMap m;
  for (auto& t : ts) m.emplace(t.name, std::move(t));
  return m;
}

// max |reader matmul - canonical matmul| / max |canonical| over three random rows.
double matmul_error(const LayoutOptions& o, const TensorMap& params, const MoeExperts& x,
                    MoeProj proj, int64_t e, Rng& rng) {
  const QuantTensor& q = proj == MoeProj::kW13 ? x.w13 : x.w2;
  const int64_t m = 3;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> xin(static_cast<size_t>(m * q.k));
  for (auto& v : xin) v = nd(rng);
  std::vector<float> y(static_cast<size_t>(m * q.n), NAN);
  test::layout_matmul(trtllm_mxfp4_make_reader, o, params, proj, e, xin.data(), m, y.data());
  const std::vector<float> w = dequantize_expert(q, e);
  double num = 0, den = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = 0; n < q.n; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < q.k; ++k)
        ref += double(xin[static_cast<size_t>(i * q.k + k)]) * w[static_cast<size_t>(n * q.k + k)];
      num = std::max(num, std::fabs(y[static_cast<size_t>(i * q.n + n)] - ref));
      den = std::max(den, std::fabs(ref));
    }
  EXPECT_GT(den, 0.0);
  return num / den;
}

TEST(TrtllmMxfp4, ReaderMatchesPaddedAndUnpaddedLayers) {
  Rng rng(11);
  for (const auto& [E, H, I] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {2, 64, 64}, {1, 256, 128}, {2, 288, 96}}) {
    SCOPED_TRACE("E=" + std::to_string(E) + " H=" + std::to_string(H) + " I=" + std::to_string(I));
    const LayoutOptions o = gpt_oss_options(H, I);
    const MoeExperts x = random_gpt_oss(rng, E, H, I, o);
    ASSERT_TRUE(trtllm_mxfp4_unsupported_reasons(o, moe_shape_of(x)).empty());
    EXPECT_EQ(trtllm_mxfp4_padded_inter(o, moe_shape_of(x)), (I + 127) / 128 * 128);
    const TensorMap params = by_name(pack_trtllm_mxfp4_moe(o, x));
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_LT(matmul_error(o, params, x, MoeProj::kW13, e, rng), 1e-5);
      EXPECT_LT(matmul_error(o, params, x, MoeProj::kW2, e, rng), 1e-5);
    }
  }
}

// A physical row pair (r, r') swapped in the weight and its scales.
void swap_rows(TensorMap& p, const std::string& prefix, int64_t r, int64_t r2) {
  Tensor& w = p.at(prefix + "w13_weight");
  const int64_t bytes = w.shape[2];
  std::vector<uint8_t> tmp(static_cast<size_t>(bytes));
  std::memcpy(tmp.data(), w.data.data() + r * bytes, static_cast<size_t>(bytes));
  std::memcpy(w.data.data() + r * bytes, w.data.data() + r2 * bytes, static_cast<size_t>(bytes));
  std::memcpy(w.data.data() + r2 * bytes, tmp.data(), static_cast<size_t>(bytes));
}

TEST(TrtllmMxfp4, MatmulCatchesLayoutMutants) {
  Rng rng(5);
  const int64_t E = 1, H = 256, I = 128;
  const LayoutOptions o = gpt_oss_options(H, I);
  const MoeExperts x = random_gpt_oss(rng, E, H, I, o);
  const TensorMap good = by_name(pack_trtllm_mxfp4_moe(o, x));
  ASSERT_LT(matmul_error(o, good, x, MoeProj::kW13, 0, rng), 1e-5);
  const std::string& p = o.prefix;
  {  // gate and up of every pair not swapped (gpt-oss' interleave kept as the loader has it)
    TensorMap bad = good;
    const std::vector<int32_t> src = trtllm_fp4_w13_rows(2 * I, I, true);
    std::vector<int64_t> where(static_cast<size_t>(2 * I));
    for (int64_t r = 0; r < 2 * I; ++r) where[static_cast<size_t>(src[static_cast<size_t>(r)])] = r;
    for (int64_t j = 0; j < I; ++j)
      swap_rows(bad, p, where[static_cast<size_t>(j)], where[static_cast<size_t>(I + j)]);
    EXPECT_GT(matmul_error(o, bad, x, MoeProj::kW13, 0, rng), 1e-2);
  }
  {  // nibbles in the other order
    TensorMap bad = good;
    for (auto& b : bad.at(p + "w2_weight").data) b = static_cast<uint8_t>((b >> 4) | (b << 4));
    EXPECT_GT(matmul_error(o, bad, x, MoeProj::kW2, 0, rng), 1e-2);
  }
  {  // scales row-permuted but not 128x4-interleaved
    TensorMap bad = good;
    Tensor& s = bad.at(p + "w13_weight_scale");
    const int64_t rows = s.shape[1], cols = s.shape[2];
    s.data = scale_deinterleave_128x4(good.at(p + "w13_weight_scale").data.data(), rows, cols);
    EXPECT_GT(matmul_error(o, bad, x, MoeProj::kW13, 0, rng), 1e-2);
  }
  {  // w2 not shuffled: rows in logical order
    TensorMap bad = good;
    Tensor& w = bad.at(p + "w2_weight");
    const std::vector<int32_t> src = trtllm_fp4_w2_rows(H, H);
    const int64_t bytes = w.shape[2];
    for (int64_t r = 0; r < H; ++r)
      std::memcpy(w.data.data() + src[static_cast<size_t>(r)] * bytes,
                  good.at(p + "w2_weight").data.data() + r * bytes, static_cast<size_t>(bytes));
    EXPECT_GT(matmul_error(o, bad, x, MoeProj::kW2, 0, rng), 1e-2);
  }
}

ErrorCode code_of(const std::function<void()>& f, std::string* msg = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (msg) *msg = e.message();
    return e.code();
  }
  return ErrorCode::kInternal;
}

bool any_contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

TEST(TrtllmMxfp4, Refusals) {
  Rng rng(3);
  const LayoutOptions good = gpt_oss_options(64, 64);
  const MoeExperts x = random_gpt_oss(rng, 1, 64, 64, good);
  const MoeShape s = moe_shape_of(x);
  ASSERT_TRUE(trtllm_mxfp4_unsupported_reasons(good, s).empty());
  LayoutOptions o = good;
  o.act_dtype = DType::kF16;
  EXPECT_TRUE(any_contains(trtllm_mxfp4_unsupported_reasons(o, s), "bf16"));
  o = good;
  o.vllm_target = VllmTarget::kV2026_05;
  EXPECT_TRUE(any_contains(trtllm_mxfp4_unsupported_reasons(o, s), "--vllm-target 2026-05"));
  o = good;
  o.source_method = QuantMethod::kCtMxfp4;
  EXPECT_TRUE(any_contains(trtllm_mxfp4_unsupported_reasons(o, s), "gpt-oss only"));
  QuantParams q;
  q.method = QuantMethod::kGptOssMxfp4;
  o = good;
  o.gated = false;
  EXPECT_TRUE(any_contains(trtllm_mxfp4_unsupported_reasons(o, moe_shape_for(q, 1, 64, 64, false)),
                           "non-gated"));
  EXPECT_TRUE(any_contains(
      trtllm_mxfp4_unsupported_reasons(good, moe_shape_for(q, 1, 48, 64, true)), "H=48"));
  std::string msg;
  o = good;
  o.act_dtype = DType::kF16;
  EXPECT_EQ(code_of([&] { pack_trtllm_mxfp4_moe(o, x); }, &msg), ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("trtllm-mxfp4"), std::string::npos) << msg;
  MoeExperts no_bias = x;
  no_bias.w2_bias.clear();
  EXPECT_EQ(code_of([&] { pack_trtllm_mxfp4_moe(good, no_bias); }, &msg), ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("biases"), std::string::npos) << msg;
}

// vLLM's parameters are zero-initialised and its biases are bf16 values widened to float32:
// anything else in the bytes is not what vLLM leaves, and unpack says where.
TEST(TrtllmMxfp4, UnpackRefusesWhatVllmNeverWrites) {
  Rng rng(9);
  const LayoutOptions o = gpt_oss_options(64, 64);  // Hp = 256, Ip = 128: padding everywhere
  const MoeExperts x = random_gpt_oss(rng, 2, 64, 64, o);
  const TensorMap good = by_name(pack_trtllm_mxfp4_moe(o, x));
  const MoeExperts back = unpack_trtllm_mxfp4_moe(o, good);
  EXPECT_TRUE(test::bytes_equal(back.w13.codes, x.w13.codes, 64, "w13 codes"));
  EXPECT_TRUE(test::bytes_equal(back.w13_bias, x.w13_bias, 16, "w13 bias"));
  const std::string& p = o.prefix;
  const std::vector<int32_t> src = trtllm_fp4_w13_rows(256, 64, true);
  int64_t pad_row = 0;
  while (src[static_cast<size_t>(pad_row)] >= 0) ++pad_row;
  auto refused = [&](const std::function<void(TensorMap&)>& edit, const std::string& tensor) {
    TensorMap bad = good;
    edit(bad);
    std::string msg;
    EXPECT_EQ(code_of([&] { unpack_trtllm_mxfp4_moe(o, bad); }, &msg), ErrorCode::kBadValue)
        << tensor;
  };
  refused([&](TensorMap& m) { m.at(p + "w13_weight").data[pad_row * 128] = 0x11; }, "pad row");
  refused([&](TensorMap& m) { m.at(p + "w2_weight").data[63] = 0x10; }, "pad column");  // I/2 = 32
  refused([&](TensorMap& m) { m.at(p + "w2_weight_scale").data.back() = 1; }, "pad scale");
  refused([&](TensorMap& m) { m.at(p + "w13_bias").as<float>()[pad_row] = 1.0f; }, "pad bias");
  refused(
      [&](TensorMap& m) {
        float* b = m.at(p + "w2_bias").as<float>();
        b[0] = std::nextafter(b[0], 1e9f);
      },
      "bias not bf16");
  // Padding the layer's own sizes would not produce: kBadShape.
  LayoutOptions wrong = o;
  wrong.hidden = 300;  // pads to 512, not 256
  EXPECT_EQ(code_of([&] { unpack_trtllm_mxfp4_moe(wrong, good); }), ErrorCode::kBadShape);
}

}  // namespace
}  // namespace moepack
