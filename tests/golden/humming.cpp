// Golden fixtures tests/golden/humming (README.md there): what vLLM 0.33.0's Humming
// post-processing, with humming-kernels 0.1.19's own CUDA weight kernels on an H100, left on 16
// small random MoE layers. moepack converts the same layer parameters -- decoded by its own
// source codecs, the recode decided by the layout row over the whole layer -- and must produce
// every output tensor byte for byte (SHA-256 of the device's bytes; gptq_w4_g32_e1 also stores
// them for a first-differing-block report) and every LayerConfig string exactly. Covers the
// padding edges (I = 96, 192; H = 320, 384), group sizes 32 / 64 / 128, int4 and int8 with bf16
// and fp16, symmetric and with zero points, a sublayer without code 0 (float4e0m3 / float8e0m7),
// E = 1..3, GPTQ, AWQ and compressed-tensors.
#include "formats/humming.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "core/sha256.h"
#include "formats/codec.h"
#include "formats/moe_reader.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using nlohmann::json;

std::string fixture_dir() {
  return std::string(MOEPACK_TEST_SOURCE_DIR) + "/tests/golden/humming";
}

// The 16 cases the directory holds (index.json of the device run, trimmed).
const char* kCases[] = {
    "gptq_w4_g128_i384",  "gptq_w4_g64_pad", "gptq_w4_g32_e1",      "gptq_w4_g128_nozero_w13",
    "gptq_w4_g128_fp16",  "gptq_w8_g128",    "gptq_w8_g128_nozero", "gptq_w8_g64_fp16",
    "awq_w4_g128",        "awq_w4_g64_pad",  "awq_w4_g32_nozero",   "ct_w4_g128_sym",
    "ct_w4_g32_asym_pad", "ct_w4_g32_h320",  "ct_w8_g128_sym",      "ct_w8_g64_asym",
};

struct Case {
  std::string name;
  json meta;
  QuantParams params;
  int64_t experts = 0, hidden = 0, inter = 0;
  DType act = DType::kBF16;
  MoeExperts experts_in;  // canonical, decoded by moepack's source codec
  std::map<std::string, Tensor> stored_out;
};

Tensor expert_slice(const TensorView& v, int64_t e) {
  Tensor t;
  t.name = v.name;
  t.dtype = v.dtype;
  t.shape = Shape(v.shape.begin() + 1, v.shape.end());
  const size_t per = static_cast<size_t>(v.nbytes / static_cast<uint64_t>(v.shape[0]));
  t.data.assign(v.data + per * e, v.data + per * (e + 1));
  return t;
}

// vLLM's stacked layer parameter `<sub>_<suffix>` -> one Linear per expert: gate|up stacked along
// N is one Linear of N = 2I in every format here (GPTQ and AWQ pack along K or in whole words of
// N, compressed-tensors' zero points in whole words of N).
QuantTensor decode(const SafetensorsFile& st, const Case& c, const std::string& sub,
                   const std::vector<std::string>& suffixes, int64_t n, int64_t k) {
  const SourceCodec* codec = find_source_codec(c.params.method);
  std::vector<QuantTensor> per;
  for (int64_t e = 0; e < c.experts; ++e) {
    TensorMap m;
    for (const auto& s : suffixes) {
      const std::string name = "in." + sub + "_" + s;
      bool found = false;
      for (const auto& entry : st.entries()) found = found || entry.name == name;
      if (found) m[s] = expert_slice(st.view(name), e);
    }
    per.push_back(codec->unpack(c.params, m, n, k));
  }
  QuantTensor out = per.front();
  out.experts = c.experts;
  for (size_t e = 1; e < per.size(); ++e) {
    out.codes.insert(out.codes.end(), per[e].codes.begin(), per[e].codes.end());
    out.scales.insert(out.scales.end(), per[e].scales.begin(), per[e].scales.end());
    out.zeros.insert(out.zeros.end(), per[e].zeros.begin(), per[e].zeros.end());
  }
  out.check_consistent(sub);
  return out;
}

Case load_case(const std::string& name) {
  Case c;
  c.name = name;
  std::ifstream f(fixture_dir() + "/" + name + ".json");
  c.meta = json::parse(f);
  const json& k = c.meta["case"];
  const std::string fmt = k["fmt"];
  c.params.method = fmt == "gptq"  ? QuantMethod::kGptq
                    : fmt == "awq" ? QuantMethod::kAwq
                                   : QuantMethod::kCtPackQuantized;
  c.params.bits = k["bits"];
  c.params.group_size = k["group"];
  c.params.symmetric = k["sym"];
  c.act = k["dtype"] == "fp16" ? DType::kF16 : DType::kBF16;
  c.params.dtype = c.act;
  c.experts = k["E"];
  c.hidden = k["H"];
  c.inter = k["I"];
  const SafetensorsFile st = SafetensorsFile::open(fixture_dir() + "/" + name + ".safetensors");
  std::vector<std::string> suffixes;
  if (fmt == "ct")
    suffixes = {"weight_packed", "weight_scale", "weight_zero_point"};
  else
    suffixes = {"qweight", "scales", "qzeros"};
  c.experts_in.w13 = decode(st, c, "w13", suffixes, 2 * c.inter, c.hidden);
  c.experts_in.w2 = decode(st, c, "w2", suffixes, c.hidden, c.inter);
  for (const auto& entry : st.entries())
    if (entry.name.rfind("out.", 0) == 0)
      c.stored_out[entry.name.substr(4)] = Tensor::from_view(st.view(entry));
  return c;
}

LayoutOptions options_for(const Case& c) {
  LayoutOptions o;
  o.act_dtype = c.act;
  o.gated = true;
  o.vllm_target = VllmTarget::kV0_33;
  o.source_method = c.params.method;
  o.hidden = c.hidden;
  o.inter = c.inter;
  const MoeShape s = moe_shape_of(c.experts_in);
  o.layer_decisions = humming_decide_layer(o, s, test::whole_layer(c.experts_in, 1));
  return o;
}

// "b_dtype=uint4" from vLLM's repr of the final HummingWeightSchema.
std::string repr_field(const std::string& repr, const std::string& field) {
  const std::regex re(field + "=([^,)]+)");
  std::smatch m;
  return std::regex_search(repr, m, re) ? m[1].str() : "";
}

class HummingGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(HummingGolden, PackEqualsHummingsOwnTransform) {
  const Case c = load_case(GetParam());
  ASSERT_EQ(c.meta["versions"]["ops"], "cuda");
  ASSERT_EQ(c.meta["versions"]["humming-kernels"], kHummingKernelsVersion);
  const LayoutOptions o = options_for(c);
  const MoeShape s = moe_shape_of(c.experts_in);
  ASSERT_TRUE(humming_unsupported_reasons(o, s).empty());
  const std::vector<Tensor> packed = pack_humming_moe(o, c.experts_in);
  EXPECT_EQ(humming_param_specs(o, s).size(), packed.size());

  // Every tensor vLLM left on the layer, and nothing else.
  const json& outs = c.meta["outputs"];
  EXPECT_EQ(outs.size(), packed.size());
  for (const Tensor& t : packed) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(outs.contains(t.name)) << "moepack writes a tensor vLLM does not leave";
    const json& want = outs[t.name];
    const std::string want_dtype = want["dtype"];
    EXPECT_EQ(want_dtype, t.dtype == DType::kI32    ? "int32"
                          : t.dtype == DType::kBF16 ? "bfloat16"
                                                    : "float16");
    EXPECT_EQ(want["shape"].get<Shape>(), t.shape);
    EXPECT_EQ(want["sha256"].get<std::string>(), sha256_hex(t.data.data(), t.data.size()));
    auto it = c.stored_out.find(t.name);
    if (it != c.stored_out.end()) {
      EXPECT_TRUE(test::bytes_equal(t.data, it->second.data, 64, t.name));
    }
  }

  // The LayerConfig strings vLLM passes to the kernel, and the final weight schemas.
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2}) {
    const std::string sub = p == MoeProj::kW13 ? "w13" : "w2";
    const json& want = c.meta["sublayers"][sub];
    EXPECT_EQ(humming_layer_config_json(o, s, p), want["layer_config_str"].get<std::string>())
        << sub;
    std::map<std::string, std::string> cfg;
    for (const auto& [k, v] : humming_layer_config(o, s)) cfg[k] = v;
    const json schema = json::parse(cfg.at(sub + "_weight_schema"));
    const std::string repr = want["weight_schema"];
    EXPECT_EQ(schema["b_dtype"].get<std::string>(), repr_field(repr, "b_dtype")) << sub;
    EXPECT_EQ(schema["bs_dtype"].is_null() ? "None" : schema["bs_dtype"].get<std::string>(),
              repr_field(repr, "bs_dtype"))
        << sub;
    EXPECT_EQ(std::to_string(schema["weight_scale_group_size"].get<int64_t>()),
              repr_field(repr, "weight_scale_group_size"))
        << sub;
    EXPECT_EQ(schema["has_zero_point"].get<bool>() ? "True" : "False",
              repr_field(repr, "has_zero_point"))
        << sub;
    EXPECT_EQ(cfg.at("input_schema"), "{}");
    EXPECT_NE(want["input_schema"].get<std::string>().find("a_dtype=None"), std::string::npos);
  }

  // Read back: unpack recovers the source, and the reader reads what unpack decodes.
  TensorMap params;
  for (const Tensor& t : packed) params[t.name] = t;
  const MoeExperts back = unpack_humming_moe(o, params);
  EXPECT_TRUE(test::bytes_equal(back.w13.codes, c.experts_in.w13.codes, 64, "w13 codes"));
  EXPECT_TRUE(test::bytes_equal(back.w2.codes, c.experts_in.w2.codes, 64, "w2 codes"));
  EXPECT_TRUE(test::bytes_equal(back.w13.zeros, c.experts_in.w13.zeros, 64, "w13 zeros"));
  EXPECT_TRUE(test::bytes_equal(back.w13.scales, c.experts_in.w13.scales, 64, "w13 scales"));
  test::Rng rng(7);
  const TargetLayout* row = find_target_layout("humming");
  ASSERT_NE(row, nullptr);
  test::ReaderCheck how;
  how.whole_expert = true;
  test::expect_reader_matches(rng, *row, o, params, back, how);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HummingGolden, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param);
                         });

// The decision the fixtures record: which sublayers were recoded by vLLM.
TEST(HummingGolden, RecodeDecisionMatchesTheFixtures) {
  const std::map<std::string, std::pair<std::string, std::string>> want = {
      {"gptq_w4_g128_nozero_w13", {"float4e0m3", "uint4"}},
      {"gptq_w8_g128_nozero", {"float8e0m7", "float8e0m7"}},
      {"awq_w4_g32_nozero", {"uint4", "uint4"}},  // zero points: never recoded
      {"gptq_w4_g128_i384", {"uint4", "uint4"}},
  };
  for (const auto& [name, b] : want) {
    const LayoutOptions o = options_for(load_case(name));
    EXPECT_EQ(o.layer_decisions.at("w13_b_dtype"), b.first) << name;
    EXPECT_EQ(o.layer_decisions.at("w2_b_dtype"), b.second) << name;
  }
}

}  // namespace
}  // namespace moepack
