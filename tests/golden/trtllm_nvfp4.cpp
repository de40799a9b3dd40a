// Golden: moepack's trtllm-nvfp4 byte for byte against what vLLM 0.33.0's own NVFP4 MoE methods
// (ModelOptNvFp4FusedMoE, CompressedTensorsW4A4Nvfp4MoEMethod) leave on the layer for
// FLASHINFER_TRTLLM after process_weights_after_loading, with FlashInfer 0.7.2.post1's row
// indices and block-scale interleave (tests/trtllm_fp4/generate_nvfp4.py ran them on the CPU;
// versions in tests/trtllm_fp4/fixtures/manifest_nvfp4.json): every parameter the layer holds,
// in its order, on shapes with and without vLLM's H / I padding, gated and relu2. The checkpoint
// side is read through moepack's own source codecs, and vLLM's bytes decode back to what vLLM
// keeps of it (trtllm_nvfp4_vllm_loaded).
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "formats/fp4.h"
#include "formats/parallel.h"
#include "formats/trtllm_fp4.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

const std::string kDir = test::source_dir() + "/tests/trtllm_fp4/fixtures";

std::vector<uint8_t> bytes_of(const SafetensorsFile& f, const std::string& name) {
  const TensorView v = f.view(name);
  return std::vector<uint8_t>(v.data, v.data + v.nbytes);
}

// One Linear's tensors by suffix ("in.<e>.<proj>.<suffix>").
TensorMap linear(const SafetensorsFile& f, const std::string& prefix) {
  TensorMap m;
  for (const SafetensorsEntry& entry : f.entries())
    if (const std::string& name = entry.name; name.rfind(prefix, 0) == 0)
      m.emplace(name.substr(prefix.size()), Tensor::from_view(f.view(name)));
  return m;
}

// The checkpoint's experts through moepack's own codec, stacked as load_moe_experts stacks them
// (w13 = [gate; up], their global and activation scales side by side).
MoeExperts canonical_from_checkpoint(const SafetensorsFile& f, bool modelopt, int64_t E, int64_t H,
                                     int64_t I, bool gated) {
  QuantParams p;
  p.method = modelopt ? QuantMethod::kModeloptNvfp4 : QuantMethod::kCtNvfp4;
  p.bits = 4;
  p.group_size = 16;
  p.dynamic_input = false;  // W4A4
  const auto unpack = [&](const std::string& pre, int64_t n, int64_t k) {
    return modelopt ? unpack_modelopt_nvfp4(p, linear(f, pre), n, k)
                    : unpack_ct_nvfp4(p, linear(f, pre), n, k);
  };
  std::vector<QuantTensor> w13, w2;
  for (int64_t e = 0; e < E; ++e) {
    const std::string pre = "in." + std::to_string(e) + ".";
    std::vector<QuantTensor> shards = {unpack(pre + "w1.", I, H)};
    if (gated) shards.push_back(unpack(pre + "w3.", I, H));
    QuantTensor s = shards[0];
    s.n = static_cast<int64_t>(shards.size()) * I;
    s.global_shards = static_cast<int64_t>(shards.size());
    for (size_t j = 1; j < shards.size(); ++j) {
      s.codes.insert(s.codes.end(), shards[j].codes.begin(), shards[j].codes.end());
      s.scales.insert(s.scales.end(), shards[j].scales.begin(), shards[j].scales.end());
      s.global_scales.push_back(shards[j].global_scales[0]);
      s.input_scales.push_back(shards[j].input_scales[0]);
    }
    w13.push_back(s);
    w2.push_back(unpack(pre + "w2.", H, I));
  }
  MoeExperts x;
  x.w13 = concat_experts(w13);
  x.w2 = concat_experts(w2);
  return x;
}

LayoutOptions nvfp4_options(bool modelopt, int64_t H, int64_t I, bool gated) {
  LayoutOptions o;
  o.source_method = modelopt ? QuantMethod::kModeloptNvfp4 : QuantMethod::kCtNvfp4;
  o.act_dtype = DType::kBF16;
  o.gated = gated;
  o.vllm_target = VllmTarget::kV0_33;
  o.prefix = "";
  o.hidden = H;
  o.inter = I;
  o.threads = 2;
  return o;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

TEST(TrtllmNvfp4Golden, EqualsVllmAndFlashInferOnTheCpu) {
  const nlohmann::json m = test::read_json_file(kDir + "/manifest_nvfp4.json");
  EXPECT_EQ(m["versions"]["vllm"], "0.33.0");
  EXPECT_EQ(m["versions"]["flashinfer-python"], "0.7.2.post1");
  ASSERT_GE(m["nvfp4"].size(), 8u);
  int padded = 0, sources[2] = {0, 0}, relu2 = 0;
  for (const auto& c : m["nvfp4"]) {
    const std::string src = c["source"], name = c["name"];
    SCOPED_TRACE(src + " " + name);
    const bool mo = src == "modelopt", gated = c["gated"];
    const int64_t E = c["experts"], H = c["hidden"], I = c["inter"];
    padded += c["hidden_padded"] != H || c["inter_padded"] != I;
    ++sources[mo ? 0 : 1];
    relu2 += !gated;
    const SafetensorsFile f =
        SafetensorsFile::open(kDir + "/nvfp4_" + src + "_" + name + ".safetensors");
    const MoeExperts x = canonical_from_checkpoint(f, mo, E, H, I, gated);
    LayoutOptions o = nvfp4_options(mo, H, I, gated);
    const MoeShape shape = moe_shape_of(x);
    ASSERT_TRUE(trtllm_nvfp4_unsupported_reasons(o, shape).empty());
    // Decided over chunks of one expert: the maximum is the layer's, not a chunk's.
    o.layer_decisions = trtllm_nvfp4_decide_layer(o, shape, test::whole_layer(x, 1));
    const std::vector<Tensor> packed = pack_trtllm_nvfp4_moe(o, x);
    const std::vector<ParamSpec> specs = trtllm_nvfp4_param_specs(o, shape);
    ASSERT_EQ(packed.size(), c["params"].size());
    ASSERT_EQ(specs.size(), packed.size());
    TensorMap by_name;
    for (size_t i = 0; i < packed.size(); ++i) {
      const Tensor& t = packed[i];
      EXPECT_EQ(t.name, c["params"][i]["name"].get<std::string>()) << "vLLM's parameter order";
      const TensorView want = f.view("out." + t.name);
      EXPECT_EQ(t.dtype, want.dtype) << t.name;
      EXPECT_EQ(t.shape, want.shape) << t.name;
      EXPECT_EQ(specs[i].name, t.name);
      EXPECT_EQ(specs[i].dtype, t.dtype) << t.name;
      EXPECT_EQ(specs[i].shape, t.shape) << t.name;
      EXPECT_TRUE(test::bytes_equal(t.data, bytes_of(f, "out." + t.name), 64, t.name));
      by_name.emplace(t.name, Tensor::from_view(want));
    }
    // vLLM's bytes decode back to what vLLM keeps of the checkpoint, exactly.
    const MoeExperts kept = trtllm_nvfp4_vllm_loaded(o, x);
    const MoeExperts back = unpack_trtllm_nvfp4_moe(o, by_name);
    EXPECT_TRUE(test::bytes_equal(back.w13.codes, x.w13.codes, 64, "w13 codes"));
    EXPECT_TRUE(test::bytes_equal(back.w13.scales, x.w13.scales, 64, "w13 scales"));
    EXPECT_TRUE(test::bytes_equal(back.w2.codes, x.w2.codes, 64, "w2 codes"));
    EXPECT_TRUE(test::bytes_equal(back.w2.scales, x.w2.scales, 64, "w2 scales"));
    for (const auto& [got, want, what] : {std::make_tuple(&back.w13, &kept.w13, "w13"),
                                          std::make_tuple(&back.w2, &kept.w2, "w2")}) {
      EXPECT_EQ(bits(got->global_scales), bits(want->global_scales)) << what;
      EXPECT_EQ(bits(got->input_scales), bits(want->input_scales)) << what;
    }
    // ... and that is the checkpoint itself where vLLM keeps it (compressed-tensors).
    if (!mo) {
      EXPECT_EQ(bits(back.w13.global_scales), bits(x.w13.global_scales));
      EXPECT_EQ(bits(back.w13.input_scales), bits(x.w13.input_scales));
    }
  }
  EXPECT_GE(padded, 6) << "the fixtures must cover vLLM's H / I padding";
  EXPECT_GE(sources[0], 4);
  EXPECT_GE(sources[1], 4);
  EXPECT_GE(relu2, 2);
}

}  // namespace
}  // namespace moepack
