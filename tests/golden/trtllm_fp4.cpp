// Golden: moepack's TRT-LLM FP4 layouts byte for byte against what vLLM 0.33.0's own
// post-processing, with FlashInfer 0.7.2.post1's own row indices and block-scale interleave, leaves
// on the layer (tests/trtllm_fp4/generate.py ran them on the CPU; versions in
// tests/trtllm_fp4/fixtures/manifest.json), on shapes with and without vLLM's padding; and the
// exact inverse back to the checkpoint's codes, scales and biases.
//   trtllm-mxfp4: gpt-oss MXFP4, convert_gpt_oss_weight_to_mxfp4_moe_kernel_format
//                 (FLASHINFER_TRTLLM_MXFP4_BF16) on the loader's padded, interleaved layer.
#include "formats/trtllm_fp4.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "formats/fp4.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

const std::string kDir = test::source_dir() + "/tests/trtllm_fp4/fixtures";

std::vector<uint8_t> bytes_of(const SafetensorsFile& f, const std::string& name) {
  const TensorView v = f.view(name);
  return std::vector<uint8_t>(v.data, v.data + v.nbytes);
}

// The checkpoint's gpt-oss tensors (gate/up rows interleaved: row 2j gate j, 2j + 1 up j) as the
// canonical experts moepack converts from (w13 = [gate; up]), written out here from the format.
MoeExperts canonical_from_checkpoint(const SafetensorsFile& f, int64_t E, int64_t H, int64_t I) {
  MoeExperts x;
  const QuantSpec spec = gpt_oss_mxfp4_spec_for(QuantParams{});
  x.w13 = QuantTensor(spec, E, 2 * I, H);
  x.w2 = QuantTensor(spec, E, H, I);
  x.bias_dtype = DType::kBF16;
  x.w13_bias.resize(static_cast<size_t>(E * 2 * I * 2));
  x.w2_bias = bytes_of(f, "in.down_bias");
  const std::vector<uint8_t> b13 = bytes_of(f, "in.gate_up_blocks"),
                             s13 = bytes_of(f, "in.gate_up_scales"),
                             bias13 = bytes_of(f, "in.gate_up_bias"),
                             b2 = bytes_of(f, "in.down_blocks"), s2 = bytes_of(f, "in.down_scales");
  auto rows = [](QuantTensor& q, const std::vector<uint8_t>& blocks,
                 const std::vector<uint8_t>& scales, int64_t e, int64_t dst, int64_t src) {
    const int64_t k = q.k, n = q.n;
    for (int64_t j = 0; j < k / 2; ++j) {
      const uint8_t b = blocks[static_cast<size_t>((e * n + src) * (k / 2) + j)];
      q.codes[static_cast<size_t>((e * n + dst) * k + 2 * j)] = b & 15;
      q.codes[static_cast<size_t>((e * n + dst) * k + 2 * j + 1)] = b >> 4;
    }
    for (int64_t g = 0; g < k / 32; ++g)
      q.scales[static_cast<size_t>((e * n + dst) * (k / 32) + g)] =
          scales[static_cast<size_t>((e * n + src) * (k / 32) + g)];
  };
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < 2 * I; ++r) {
      const int64_t src = r < I ? 2 * r : 2 * (r - I) + 1;
      rows(x.w13, b13, s13, e, r, src);
      std::memcpy(&x.w13_bias[static_cast<size_t>((e * 2 * I + r) * 2)],
                  &bias13[static_cast<size_t>((e * 2 * I + src) * 2)], 2);
    }
    for (int64_t r = 0; r < H; ++r) rows(x.w2, b2, s2, e, r, r);
  }
  return x;
}

LayoutOptions mxfp4_options(int64_t H, int64_t I) {
  LayoutOptions o;
  o.source_method = QuantMethod::kGptOssMxfp4;
  o.act_dtype = DType::kBF16;
  o.gated = true;
  o.vllm_target = VllmTarget::kV0_33;
  o.prefix = "";
  o.hidden = H;
  o.inter = I;
  o.threads = 2;
  return o;
}

TEST(TrtllmFp4Golden, Mxfp4EqualsVllmAndFlashInferOnTheCpu) {
  const nlohmann::json m = test::read_json_file(kDir + "/manifest.json");
  EXPECT_EQ(m["versions"]["vllm"], "0.33.0");
  EXPECT_EQ(m["versions"]["flashinfer-python"], "0.7.2.post1");
  ASSERT_GE(m["mxfp4"].size(), 4u);
  int padded = 0;
  for (const auto& c : m["mxfp4"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const int64_t E = c["experts"], H = c["hidden"], I = c["inter"];
    padded += c["hidden_padded"] != H || c["inter_padded"] != I;
    const SafetensorsFile f = SafetensorsFile::open(kDir + "/mxfp4_" + name + ".safetensors");
    const MoeExperts x = canonical_from_checkpoint(f, E, H, I);
    const LayoutOptions o = mxfp4_options(H, I);
    ASSERT_TRUE(trtllm_mxfp4_unsupported_reasons(o, moe_shape_of(x)).empty());
    const std::vector<Tensor> packed = pack_trtllm_mxfp4_moe(o, x);
    const std::vector<ParamSpec> specs = trtllm_mxfp4_param_specs(o, moe_shape_of(x));
    ASSERT_EQ(packed.size(), 6u);
    TensorMap by_name;
    for (size_t i = 0; i < packed.size(); ++i) {
      const Tensor& t = packed[i];
      const TensorView want = f.view("out." + t.name);
      EXPECT_EQ(t.dtype, want.dtype) << t.name;
      EXPECT_EQ(t.shape, want.shape) << t.name;
      EXPECT_EQ(specs[i].name, t.name);
      EXPECT_EQ(specs[i].shape, t.shape) << t.name;
      EXPECT_TRUE(test::bytes_equal(t.data, bytes_of(f, "out." + t.name), 64, t.name));
      by_name.emplace(t.name, Tensor::from_view(want));
    }
    // vLLM's bytes decode back to the checkpoint exactly.
    const MoeExperts back = unpack_trtllm_mxfp4_moe(o, by_name);
    EXPECT_TRUE(test::bytes_equal(back.w13.codes, x.w13.codes, 64, "w13 codes"));
    EXPECT_TRUE(test::bytes_equal(back.w13.scales, x.w13.scales, 64, "w13 scales"));
    EXPECT_TRUE(test::bytes_equal(back.w2.codes, x.w2.codes, 64, "w2 codes"));
    EXPECT_TRUE(test::bytes_equal(back.w2.scales, x.w2.scales, 64, "w2 scales"));
    EXPECT_TRUE(test::bytes_equal(back.w13_bias, x.w13_bias, 16, "w13 bias"));
    EXPECT_TRUE(test::bytes_equal(back.w2_bias, x.w2_bias, 16, "w2 bias"));
  }
  EXPECT_GE(padded, 3) << "the fixtures must cover vLLM's H / I padding";
}

}  // namespace
}  // namespace moepack
