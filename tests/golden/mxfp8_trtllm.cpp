// Golden: bf16 -> MXFP8 (FlashInfer recipe) -> FlashInfer TRT-LLM MXFP8 MoE layout, byte for
// byte against shared/golden/mxfp8 (produced by the upstream reference, see its README), and
// the exact inverse back to the checkpoint bytes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "formats/fp8.h"
#include "formats/mxfp8.h"
#include "formats/trtllm_mxfp8.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::bytes_equal;
using test::load_golden;

constexpr const char* kFolder = "mxfp8";

std::vector<float> bf16_floats(const test::Golden& g) {
  const auto bits = g.as<uint16_t>();
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(bits[i]);
  return out;
}

bool case_gated(const std::string& name) {
  const auto m = nlohmann::json::parse(test::golden_manifest_json(kFolder));
  EXPECT_TRUE(m.contains("gated") && m["gated"].contains(name)) << name;
  return m["gated"][name].get<bool>();
}

const Tensor& find(const std::vector<Tensor>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("missing output " + name);
}

class MxGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MxGolden, QuantizeFlashInferRecipeIsByteExact) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kFolder);
  const std::string c = GetParam();
  for (const std::string p : {"w13", "w2"}) {
    const auto src = load_golden(kFolder, c, p + "_bf16");
    ASSERT_EQ(src.shape.size(), 3u);
    const auto w = bf16_floats(src);
    const QuantTensor q =
        quantize_mxfp8(w.data(), src.shape[0], src.shape[1], src.shape[2], MxRecipe::kFlashInfer);
    const auto codes = load_golden(kFolder, c, p + "_weight");
    const auto scales = load_golden(kFolder, c, p + "_weight_scale");
    EXPECT_TRUE(bytes_equal(q.codes, codes.bytes, 32, c + " " + p + "_weight"));
    EXPECT_TRUE(bytes_equal(q.scales, scales.bytes, 1, c + " " + p + "_weight_scale"));
    // The golden inputs never hit a c == 0 block, so the ModelOpt recipe agrees too.
    const QuantTensor qm =
        quantize_mxfp8(w.data(), src.shape[0], src.shape[1], src.shape[2], MxRecipe::kModelOpt);
    EXPECT_TRUE(bytes_equal(qm.codes, codes.bytes, 32, c + " modelopt " + p + "_weight"));
  }
}

MoeExperts golden_experts(const std::string& c) {
  MoeExperts x;
  for (const std::string p : {"w13", "w2"}) {
    const auto codes = load_golden(kFolder, c, p + "_weight");
    const auto scales = load_golden(kFolder, c, p + "_weight_scale");
    QuantTensor& q = p == "w13" ? x.w13 : x.w2;
    q.experts = codes.shape[0];
    q.n = codes.shape[1];
    q.k = codes.shape[2];
    q.kind = CodeKind::kFp8E4M3;
    q.bits = 8;
    q.group_size = 32;
    q.scale_block_n = 1;
    q.symmetric = true;
    q.scale_dtype = DType::kU8;
    q.codes = codes.bytes;
    q.scales = scales.bytes;
  }
  return x;
}

TEST_P(MxGolden, PackIsByteExactAndUnpackInverts) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kFolder);
  const std::string c = GetParam();
  LayoutOptions opts;
  opts.gated = case_gated(c);
  opts.prefix = "model.layers.0.mlp.experts.";
  const MoeExperts x = golden_experts(c);
  EXPECT_TRUE(trtllm_mxfp8_unsupported_reasons(opts, moe_shape_of(x)).empty());
  for (int threads : {1, 3}) {
    opts.threads = threads;
    const auto params = pack_trtllm_mxfp8_moe(opts, x);
    ASSERT_EQ(params.size(), 4u);
    for (const std::string n : {"w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"}) {
      const auto g = load_golden(kFolder, c, "trtllm_" + n);
      const Tensor& t = find(params, opts.prefix + n);
      EXPECT_EQ(t.shape, g.shape) << n;
      EXPECT_EQ(t.dtype, n.find("scale") != std::string::npos ? DType::kU8 : DType::kF8_E4M3);
      EXPECT_TRUE(bytes_equal(t.data, g.bytes, 16, c + " " + n));
    }
    TensorMap by_name;
    for (const auto& t : params) by_name.emplace(t.name, t);
    const MoeExperts back = unpack_trtllm_mxfp8_moe(opts, by_name);
    EXPECT_TRUE(bytes_equal(back.w13.codes, x.w13.codes, 32, c + " unpack w13 codes"));
    EXPECT_TRUE(bytes_equal(back.w13.scales, x.w13.scales, 1, c + " unpack w13 scales"));
    EXPECT_TRUE(bytes_equal(back.w2.codes, x.w2.codes, 32, c + " unpack w2 codes"));
    EXPECT_TRUE(bytes_equal(back.w2.scales, x.w2.scales, 1, c + " unpack w2 scales"));
    EXPECT_EQ(back.w13.n, x.w13.n);
    EXPECT_EQ(back.w2.k, x.w2.k);
  }
}

// The layout from the golden bytes alone: unpack(golden trtllm_*) == golden checkpoint bytes.
TEST_P(MxGolden, UnpackOfGoldenLayoutGivesCheckpoint) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kFolder);
  const std::string c = GetParam();
  LayoutOptions opts;
  opts.gated = case_gated(c);
  TensorMap params;
  for (const std::string n : {"w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"}) {
    const auto g = load_golden(kFolder, c, "trtllm_" + n);
    Tensor t(n, n.find("scale") != std::string::npos ? DType::kU8 : DType::kF8_E4M3, g.shape);
    t.data = g.bytes;
    params.emplace(n, std::move(t));
  }
  const MoeExperts back = unpack_trtllm_mxfp8_moe(opts, params);
  const MoeExperts x = golden_experts(c);
  EXPECT_TRUE(bytes_equal(back.w13.codes, x.w13.codes, 32, c + " w13 codes"));
  EXPECT_TRUE(bytes_equal(back.w13.scales, x.w13.scales, 1, c + " w13 scales"));
  EXPECT_TRUE(bytes_equal(back.w2.codes, x.w2.codes, 32, c + " w2 codes"));
  EXPECT_TRUE(bytes_equal(back.w2.scales, x.w2.scales, 1, c + " w2 scales"));
}

// Through the checkpoint codec: unpack_mxfp8 of each expert's Linear and pack back.
TEST_P(MxGolden, SourceCodecRoundTrip) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kFolder);
  const std::string c = GetParam();
  const MoeExperts x = golden_experts(c);
  QuantParams p;
  p.method = QuantMethod::kModeloptMxfp8;
  for (const QuantTensor* q : {&x.w13, &x.w2}) {
    for (int64_t e = 0; e < q->experts; ++e) {
      TensorMap lin;
      Tensor w("weight", DType::kF8_E4M3, {q->n, q->k});
      std::copy(q->codes.begin() + e * q->n * q->k, q->codes.begin() + (e + 1) * q->n * q->k,
                w.data.begin());
      Tensor s("weight_scale", DType::kF8_E8M0, {q->n, q->k / 32});
      const int64_t sb = q->n * q->k / 32;
      std::copy(q->scales.begin() + e * sb, q->scales.begin() + (e + 1) * sb, s.data.begin());
      lin.emplace("weight", w);
      lin.emplace("weight_scale", s);
      const QuantTensor u = unpack_mxfp8(p, lin, q->n, q->k);
      EXPECT_EQ(u.scale_dtype, DType::kU8);
      const TensorMap back = pack_mxfp8(p, u);
      EXPECT_TRUE(bytes_equal(back.at("weight").data, w.data, 32, c + " weight"));
      EXPECT_TRUE(bytes_equal(back.at("weight_scale").data, s.data, 1, c + " weight_scale"));
      EXPECT_EQ(back.at("weight_scale").dtype, DType::kU8);
    }
  }
}

// Guards against a vacuous pass when the manifest yields no cases (or cannot be read: then the
// instantiation below has none, and this test reports why). Without the fixtures it is the one
// test of this file that is listed, and it skips.
TEST(MxGoldenManifest, HasGatedAndNonGatedCases) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kFolder);
  const auto names = test::golden_cases(kFolder);
  ASSERT_GE(names.size(), 3u);
  int gated = 0, nongated = 0;
  for (const auto& n : names) (case_gated(n) ? gated : nongated)++;
  EXPECT_GE(gated, 1);
  EXPECT_GE(nongated, 1);
}

// Case names from the manifest; none without the fixtures (MxGoldenManifest then skips).
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MxGolden);
INSTANTIATE_TEST_SUITE_P(Cases, MxGolden,
                         ::testing::ValuesIn(test::golden_cases_if_present(kFolder)),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param;
                         });

}  // namespace
}  // namespace moepack
