// Golden: triton-mxfp4 (formats/triton_mxfp4.h) against vLLM 0.33.0 itself.
// tests/golden/triton_mxfp4/ holds cases made by vLLM 0.33.0's own
// convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(Mxfp4MoeBackend.TRITON) and the vendored
// triton_kernels' Hopper layouts (make_fixtures.py there; its README: versions, how, what).
// Each CASE.safetensors holds one gpt-oss MoE layer in the published format (gate_up_proj_blocks,
// ...) and what vLLM left for the OAI Triton kernels under `routed_experts.`.
//
// Per case: the source goes through the gpt-oss codec's unpack with w13's interleaved rows moved
// to moepack's [gate; up] (as load_moe_experts does), the row packs it for vLLM 0.33 on sm90, and
// every parameter must equal vLLM's byte for byte; vLLM's bytes unpack to the source exactly and
// the reader over them reads the source's dequantised weights bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "formats/codec.h"
#include "formats/moe_reader.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kSrc = "model.layers.0.mlp.experts.";
const std::string kOut = "model.layers.0.mlp.experts.routed_experts.";

std::string fixture_dir() {
  return test::source_dir() + "/tests/golden/triton_mxfp4";
}

std::vector<std::string> cases() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fixture_dir()))
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Expert e's slice of a fused [E, ...] tensor as a Tensor of the remaining dimensions.
Tensor expert_slice(const SafetensorsFile& f, const std::string& name, int64_t e,
                    const std::string& as) {
  const TensorView v = f.view(name);
  const Shape inner(v.shape.begin() + 1, v.shape.end());
  const uint64_t per = v.nbytes / static_cast<uint64_t>(v.shape[0]);
  Tensor t(as, v.dtype, inner);
  std::memcpy(t.data.data(), v.data + per * static_cast<uint64_t>(e), per);
  return t;
}

// The source layer in canonical form: each expert's blocks / scales through the gpt-oss codec,
// w13's physical rows (2j gate j, 2j + 1 up j) moved to [gate; up], the biases alike.
MoeExperts read_source(const SafetensorsFile& f, int64_t E, int64_t H, int64_t I) {
  const SourceCodec* codec = find_source_codec(QuantMethod::kGptOssMxfp4);
  const QuantParams q = codec->param_space().front();
  MoeExperts x;
  x.w13 = QuantTensor(codec->spec_for(q), E, 2 * I, H);
  x.w2 = QuantTensor(codec->spec_for(q), E, H, I);
  const int64_t G13 = H / 32;
  for (int64_t e = 0; e < E; ++e) {
    TensorMap up, down;
    up["blocks"] = expert_slice(f, kSrc + "gate_up_proj_blocks", e, "blocks");
    up["scales"] = expert_slice(f, kSrc + "gate_up_proj_scales", e, "scales");
    down["blocks"] = expert_slice(f, kSrc + "down_proj_blocks", e, "blocks");
    down["scales"] = expert_slice(f, kSrc + "down_proj_scales", e, "scales");
    const QuantTensor w13 = codec->unpack(q, up, 2 * I, H);
    const QuantTensor w2 = codec->unpack(q, down, H, I);
    for (int64_t r = 0; r < 2 * I; ++r) {
      const int64_t from = r < I ? 2 * r : 2 * (r - I) + 1;
      std::memcpy(&x.w13.codes[static_cast<size_t>((e * 2 * I + r) * H)],
                  &w13.codes[static_cast<size_t>(from * H)], static_cast<size_t>(H));
      std::memcpy(&x.w13.scales[static_cast<size_t>((e * 2 * I + r) * G13)],
                  &w13.scales[static_cast<size_t>(from * G13)], static_cast<size_t>(G13));
    }
    std::copy(w2.codes.begin(), w2.codes.end(), x.w2.codes.begin() + e * H * I);
    std::copy(w2.scales.begin(), w2.scales.end(), x.w2.scales.begin() + e * H * (I / 32));
  }
  const TensorView b13 = f.view(kSrc + "gate_up_proj_bias"), b2 = f.view(kSrc + "down_proj_bias");
  EXPECT_EQ(b13.dtype, DType::kBF16);
  x.bias_dtype = DType::kBF16;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < 2 * I; ++r) {
      const int64_t from = r < I ? 2 * r : 2 * (r - I) + 1;
      const uint8_t* p = b13.data + (e * 2 * I + from) * 2;
      x.w13_bias.insert(x.w13_bias.end(), p, p + 2);
    }
  x.w2_bias.assign(b2.data, b2.data + b2.nbytes);
  return x;
}

LayoutOptions options(int64_t H, int64_t I) {
  LayoutOptions o = LayoutOptions::for_layer(QuantMethod::kGptOssMxfp4, DType::kBF16, true, false,
                                             VllmTarget::kV0_33, kOut, I, 1);
  o.target_arch = TargetArch::kSm90;
  o.hidden = H;
  return o;
}

// Layers vLLM 0.33 converts but its matmul_ogs does not run on Hopper (an H200 run of
// bench/gpu_triton_mxfp4.sh: N <= 128 does not compile, H = 96 computed a wrong product).
bool kernel_refused(const std::string& c) {
  for (const char* r :
       {"E2_H64_I64", "E2_H96_I96", "E1_H32_I32", "E3_H160_I192", "E2_H128_I320", "E1_H2880_I64"})
    if (c == r) return true;
  return false;
}

class TritonMxfp4Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(TritonMxfp4Golden, PackEqualsVllmByteForByte) {
  const std::string c = GetParam();
  const json j = test::read_json_file(fixture_dir() + "/" + c + ".json");
  ASSERT_EQ(j["versions"]["vllm"], "0.33.0");
  ASSERT_EQ(j["backend"], "Mxfp4MoeBackend.TRITON");
  const int64_t E = j["experts"], H = j["hidden"], I = j["inter"];
  const SafetensorsFile f = SafetensorsFile::open(fixture_dir() + "/" + c + ".safetensors");
  const MoeExperts x = read_source(f, E, H, I);
  const TargetLayout* row = find_target_layout("triton-mxfp4");
  ASSERT_NE(row, nullptr);
  const LayoutOptions o = options(H, I);
  const MoeShape s = moe_shape_of(x);
  EXPECT_EQ(row->padded_inter(o, s), j["inter_padded"].get<int64_t>());
  EXPECT_EQ(H, j["hidden_padded"].get<int64_t>()) << "vLLM's TRITON path pads H";
  const std::vector<ParamSpec> specs = row->param_specs(o, s);
  ASSERT_EQ(specs.size(), j["outputs"].size()) << "moepack writes other parameters than vLLM holds";
  const std::vector<std::string> why = row->unsupported_reasons(o, s);
  if (kernel_refused(c)) {
    // vLLM converts the layer, but its matmul_ogs cannot run it on Hopper: refused.
    EXPECT_FALSE(why.empty()) << c << ": the kernel does not run it, the row must refuse it";
    EXPECT_THROW(row->pack(o, x), Error);
  } else {
    ASSERT_TRUE(why.empty()) << why.front();
    const std::vector<Tensor> got = row->pack(o, x);
    ASSERT_EQ(got.size(), specs.size());
    for (const Tensor& t : got) {
      SCOPED_TRACE(t.name);
      ASSERT_TRUE(f.contains(t.name)) << "vLLM holds no " << t.name;
      const TensorView want = f.view(t.name);
      EXPECT_EQ(t.dtype, want.dtype);
      EXPECT_EQ(t.shape, want.shape);
      EXPECT_TRUE(test::bytes_equal(
          t.data, std::vector<uint8_t>(want.data, want.data + want.nbytes), 16, c + " " + t.name));
    }
  }

  // vLLM's own bytes back to the source, exactly, and through the reader bit for bit (refused
  // shapes too: the maps hold there).
  TensorMap params;
  for (const ParamSpec& sp : specs) {
    ASSERT_TRUE(f.contains(sp.name)) << "vLLM holds no " << sp.name;
    params[sp.name] = Tensor::from_view(f.view(sp.name));
    EXPECT_EQ(params[sp.name].shape, sp.shape) << sp.name;
  }
  const MoeExperts back = row->unpack(o, params);
  EXPECT_EQ(back.w13.codes, x.w13.codes);
  EXPECT_EQ(back.w13.scales, x.w13.scales);
  EXPECT_EQ(back.w2.codes, x.w2.codes);
  EXPECT_EQ(back.w2.scales, x.w2.scales);
  EXPECT_EQ(back.w13_bias, x.w13_bias);
  EXPECT_EQ(back.w2_bias, x.w2_bias);
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2}) {
    const reader::ProjReader r = row->make_reader(o, params, p, host_param);
    const QuantTensor& q = p == MoeProj::kW13 ? x.w13 : x.w2;
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<float> want = dequantize_expert(q, e);
      std::vector<float> w(static_cast<size_t>(q.k));
      int64_t bad = 0;
      for (int64_t n = 0; n < q.n; ++n) {
        reader::weight_row(r, e, n, w.data());
        for (int64_t k = 0; k < q.k; ++k)
          bad += std::memcmp(&w[static_cast<size_t>(k)], &want[static_cast<size_t>(n * q.k + k)],
                             4) != 0;
      }
      EXPECT_EQ(bad, 0) << c << (p == MoeProj::kW13 ? " w13" : " w2") << " expert " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vllm033, TritonMxfp4Golden, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return p.param; });

// The fixtures are what the README says: vLLM 0.33.0's TRITON path with Hopper's layouts.
TEST(TritonMxfp4Golden, FixturesAreVllmsHopperLayouts) {
  ASSERT_GE(cases().size(), 10u);
  for (const std::string& c : cases()) {
    const json j = test::read_json_file(fixture_dir() + "/" + c + ".json");
    SCOPED_TRACE(c);
    for (const char* w : {"w13_weight", "w2_weight"}) {
      EXPECT_EQ(j["outputs"][w]["layout"], "HopperMXValueLayout");
      EXPECT_EQ(j["outputs"][w]["layout_mx_axis"], 1);
    }
    for (const char* s : {"w13_weight_scale", "w2_weight_scale"}) {
      EXPECT_EQ(j["outputs"][s]["layout"], "HopperMXScaleLayout");
      EXPECT_EQ(j["outputs"][s]["layout_num_warps"], 8);
    }
    EXPECT_EQ(j["outputs"]["w13_bias"]["dtype"], "torch.float32");
  }
}

}  // namespace
}  // namespace moepack
