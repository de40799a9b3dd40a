// Every MoE family of issue 30 end to end through the real binary: a synth bf16 checkpoint
// rewritten into each family's own tensor names and config (routers under router.proj,
// router.layer, block_sparse_moe; experts per expert, fused [E, 2I, H] or Granite's
// input_linear / output_linear), converted and verified with the family's router and
// activation (the report names them); gpt-oss per producer, a model type without a row
// (convert, verify refusing without --skip-numerical), and fused arrangements moepack does not
// read (exit 4).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/moepack_cuda.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_cli;
using test::moepack_json;
using test::read_json_file;
using test::TempDir;

constexpr int64_t kE = 8, kH = 128, kI = 128;

// The synth checkpoint's pieces: experts per projection, the router, everything else.
struct Base {
  std::string dir;
  json config;
  std::string layer;  // "model.layers.0"
  std::vector<Tensor> rest, gate, up, down;
  Tensor router;
};

Base make_base(const std::string& dir) {
  EXPECT_EQ(moepack_cli("synth " + dir + " --format bf16 --layers 1 --experts " +
                        std::to_string(kE) + " --hidden " + std::to_string(kH) + " --inter " +
                        std::to_string(kI) + " --seed 3"),
            0);
  Base b;
  b.dir = dir;
  b.config = read_json_file(dir + "/config.json");
  const SafetensorsFile f = SafetensorsFile::open(dir + "/model.safetensors");
  std::map<std::string, Tensor> experts;
  for (const auto& e : f.entries()) {
    const size_t at = e.name.find(".mlp.");
    if (e.name.find(".mlp.experts.") != std::string::npos) {
      experts[e.name] = Tensor::from_view(f.view(e));
      b.layer = e.name.substr(0, at);
    } else if (e.name.size() > 16 && e.name.substr(e.name.size() - 16) == ".mlp.gate.weight") {
      b.router = Tensor::from_view(f.view(e));
    } else {
      b.rest.push_back(Tensor::from_view(f.view(e)));
    }
  }
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = b.layer + ".mlp.experts." + std::to_string(e) + ".";
    b.gate.push_back(experts.at(p + "gate_proj.weight"));
    b.up.push_back(experts.at(p + "up_proj.weight"));
    b.down.push_back(experts.at(p + "down_proj.weight"));
  }
  return b;
}

Tensor renamed(Tensor t, const std::string& name) {
  t.name = name;
  return t;
}

// [E, ...] from the experts' tensors one after the other (each [rows, cols]); with `second`, each
// expert's rows of `first` then of `second` ([gate; up]).
Tensor stacked(const std::string& name, const std::vector<Tensor>& first,
               const std::vector<Tensor>* second = nullptr) {
  const Shape s = first[0].shape;
  Tensor t(name, first[0].dtype, {kE, second ? 2 * s[0] : s[0], s[1]});
  size_t off = 0;
  for (int64_t e = 0; e < kE; ++e)
    for (const std::vector<Tensor>* part : {&first, second}) {
      if (!part) continue;
      const auto& d = (*part)[static_cast<size_t>(e)].data;
      std::memcpy(t.data.data() + off, d.data(), d.size());
      off += d.size();
    }
  return t;
}

// An F32 vector [n] (or [1, n]) of 1 + 0.2 * sin(3i + seed): finite, varied, near 1.
Tensor f32_vector(const std::string& name, int64_t n, int seed, bool row = false) {
  Tensor t(name, DType::kF32, row ? Shape{1, n} : Shape{n});
  for (int64_t i = 0; i < n; ++i) t.as<float>()[i] = 1.0f + 0.2f * std::sin(3.0f * i + seed);
  return t;
}

std::vector<Tensor> per_expert(const Base& b, const std::string& prefix, const char* g,
                               const char* u, const char* d) {
  std::vector<Tensor> out;
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = prefix + ".experts." + std::to_string(e) + ".";
    out.push_back(renamed(b.gate[static_cast<size_t>(e)], p + g + ".weight"));
    out.push_back(renamed(b.up[static_cast<size_t>(e)], p + u + ".weight"));
    out.push_back(renamed(b.down[static_cast<size_t>(e)], p + d + ".weight"));
  }
  return out;
}

// The base config without its Qwen MoE fields, plus `fields`.
json family_config(const Base& b, const json& fields) {
  json c = b.config;
  for (const char* k : {"num_experts", "num_experts_per_tok", "norm_topk_prob", "mlp_only_layers",
                        "decoder_sparse_step", "architectures"})
    c.erase(k);
  c.update(fields);
  return c;
}

void write_family(const Base& b, const std::string& dir, const std::vector<Tensor>& tensors,
                  const json& config) {
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(b.dir)) {
    const std::string name = e.path().filename().string();
    if (name != "model.safetensors" && name != "config.json")
      fs::copy_file(e.path(), fs::path(dir) / name);
  }
  std::vector<Tensor> all = b.rest;
  all.insert(all.end(), tensors.begin(), tensors.end());
  write_safetensors(dir + "/model.safetensors", all);
  std::ofstream(dir + "/config.json") << config.dump(1);
}

struct Family {
  std::string name;        // model_type
  std::string router;      // the start of the report's router line
  std::string activation;  // the report's activation
  std::function<std::vector<Tensor>(const Base&)> tensors;
  json fields;
};

std::vector<Family> families() {
  auto fused = [](const std::string& prefix) {
    return [prefix](const Base& b) {
      const std::string p = b.layer + prefix;
      return std::vector<Tensor>{stacked(p + "gate_up_proj", b.gate, &b.up),
                                 stacked(p + "down_proj", b.down)};
    };
  };
  return {
      {"olmoe",
       "olmoe: softmax top-2",
       "silu",
       [](const Base& b) {
         auto t = per_expert(b, b.layer + ".mlp", "gate_proj", "up_proj", "down_proj");
         t.push_back(renamed(b.router, b.layer + ".mlp.gate.weight"));
         return t;
       },
       {{"model_type", "olmoe"}, {"num_experts", kE}, {"num_experts_per_tok", 2}}},
      {"phimoe",
       "phimoe: sparsemixer top-2",
       "silu",
       [](const Base& b) {
         auto t = per_expert(b, b.layer + ".block_sparse_moe", "w1", "w3", "w2");
         t.push_back(renamed(b.router, b.layer + ".block_sparse_moe.gate.weight"));
         return t;
       },
       {{"model_type", "phimoe"},
        {"num_local_experts", kE},
        {"num_experts_per_tok", 2},
        {"router_jitter_noise", 0.3}}},
      {"ernie4_5_moe",
       "ernie4_5_moe: softmax top-2, correction bias",
       "silu",
       [](const Base& b) {
         auto t = per_expert(b, b.layer + ".mlp", "gate_proj", "up_proj", "down_proj");
         t.push_back(renamed(b.router, b.layer + ".mlp.gate.weight"));
         t.push_back(f32_vector(b.layer + ".mlp.moe_statics.e_score_correction_bias", kE, 1, true));
         return t;
       },
       {{"model_type", "ernie4_5_moe"},
        {"moe_num_experts", kE},
        {"moe_k", 2},
        {"moe_layer_start_index", 0}}},
      {"llama4_text",
       "llama4_text: sigmoid top-1",
       "silu",
       [](const Base& b) {
         auto t = per_expert(b, b.layer + ".feed_forward", "gate_proj", "up_proj", "down_proj");
         t.push_back(renamed(b.router, b.layer + ".feed_forward.router.weight"));
         return t;
       },
       {{"model_type", "llama4_text"}, {"num_local_experts", kE}, {"num_experts_per_tok", 1}}},
      {"minimax_m2",
       "minimax_m2: sigmoid top-2, correction bias",
       "silu",
       [](const Base& b) {
         auto t = per_expert(b, b.layer + ".block_sparse_moe", "w1", "w3", "w2");
         t.push_back(renamed(b.router, b.layer + ".block_sparse_moe.gate.weight"));
         t.push_back(f32_vector(b.layer + ".block_sparse_moe.e_score_correction_bias", kE, 2));
         return t;
       },
       {{"model_type", "minimax_m2"}, {"num_local_experts", kE}, {"num_experts_per_tok", 2}}},
      {"granitemoe",
       "granitemoe: softmax top-2",
       "silu",
       [](const Base& b) {
         const std::string p = b.layer + ".block_sparse_moe.";
         return std::vector<Tensor>{stacked(p + "input_linear.weight", b.gate, &b.up),
                                    stacked(p + "output_linear.weight", b.down),
                                    renamed(b.router, p + "router.layer.weight")};
       },
       {{"model_type", "granitemoe"}, {"num_local_experts", kE}, {"num_experts_per_tok", 2}}},
      {"mistral4",
       "mistral4: softmax top-2 of 1/2 groups (sum_top2)",
       "silu",
       [fused](const Base& b) {
         auto t = fused(".mlp.experts.")(b);
         t.push_back(renamed(b.router, b.layer + ".mlp.gate.weight"));
         return t;
       },
       {{"model_type", "mistral4"},
        {"n_routed_experts", kE},
        {"num_experts_per_tok", 2},
        {"n_group", 2},
        {"topk_group", 1}}},
      {"glm4_moe_lite",
       "glm4_moe_lite: sigmoid top-2, correction bias",
       "silu",
       [](const Base& b) {
         auto t = per_expert(b, b.layer + ".mlp", "gate_proj", "up_proj", "down_proj");
         t.push_back(renamed(b.router, b.layer + ".mlp.gate.weight"));
         t.push_back(f32_vector(b.layer + ".mlp.gate.e_score_correction_bias", kE, 3));
         return t;
       },
       {{"model_type", "glm4_moe_lite"},
        {"n_routed_experts", kE},
        {"num_experts_per_tok", 2},
        {"mlp_layer_types", {"sparse"}}}},
      {"gemma4_text",
       "gemma4_text: softmax top-2, renormalised, per-expert scale",
       "gelu_tanh",
       [fused](const Base& b) {
         auto t = fused(".experts.")(b);
         t.push_back(renamed(b.router, b.layer + ".router.proj.weight"));
         t.push_back(f32_vector(b.layer + ".router.scale", kH, 4));
         t.push_back(f32_vector(b.layer + ".router.per_expert_scale", kE, 5));
         return t;
       },
       {{"model_type", "gemma4_text"},
        {"num_experts", kE},
        {"top_k_experts", 2},
        {"moe_intermediate_size", kI},
        {"hidden_activation", "gelu_pytorch_tanh"}}},
  };
}

class FamilyConvertVerify : public ::testing::TestWithParam<size_t> {};

TEST_P(FamilyConvertVerify, WithItsRouterAndActivation) {
  const Family f = families()[GetParam()];
  TempDir tmp;
  const Base b = make_base(tmp / "base");
  const std::string src = tmp / f.name, dst = tmp / "out";
  write_family(b, src, f.tensors(b), family_config(b, f.fields));
  const json ins = moepack_json("inspect " + src + " --target-arch sm100", 0);
  EXPECT_EQ(ins["moe"]["layers"], 1) << ins.dump(1);
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --target-arch sm100 --quantize mxfp8"), 0);
  const json v = moepack_json("verify " + dst + " --source " + src + " --tokens 32", 0);
  EXPECT_EQ(v["passed"], true) << v.dump(1);
  EXPECT_EQ(v["numerical_skipped"], false);
  EXPECT_EQ(v["router"].get<std::string>().rfind(f.router, 0), 0u) << v["router"];
  EXPECT_EQ(v["activation"], f.activation);
  ASSERT_EQ(v["layers"].size(), 1u);
  EXPECT_EQ(v["layers"][0]["passed"], true);
}

// The same on the GPU: the routers the device's kernels compute, the others routed on the host
// and uploaded (begin_layer_routed), the activation in the device's gemm1 (gelu_tanh for
// Gemma-4); the device's outputs against the CPU path's router choices.
TEST_P(FamilyConvertVerify, OnTheDevice) {
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const Family f = families()[GetParam()];
  TempDir tmp;
  const Base b = make_base(tmp / "base");
  const std::string src = tmp / f.name, dst = tmp / "out";
  write_family(b, src, f.tensors(b), family_config(b, f.fields));
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --target-arch sm100 --quantize mxfp8"), 0);
  const json cpu = moepack_json("verify " + dst + " --source " + src + " --tokens 32", 0);
  const json gpu =
      moepack_json("verify " + dst + " --source " + src + " --tokens 32 --device cuda", 0);
  EXPECT_EQ(gpu["passed"], true) << gpu.dump(1);
  EXPECT_EQ(gpu["activation"], f.activation);
  ASSERT_EQ(gpu["layers"].size(), 1u);
  // The same routing on both devices: the same tokens per expert.
  EXPECT_EQ(gpu["layers"][0]["expert_tokens"], cpu["layers"][0]["expert_tokens"]);
}

INSTANTIATE_TEST_SUITE_P(Issue30, FamilyConvertVerify,
                         ::testing::Range<size_t>(0, families().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return families()[i.param].name;
                         });

// A model type moepack has no router for converts (convert does not route); verify refuses to
// compute its MoE, naming --skip-numerical, which then checks integrity and the round trip and
// says what it did not check.
TEST(Families, ModelTypeWithoutARouterNeedsSkipNumerical) {
  TempDir tmp;
  const Base b = make_base(tmp / "base");
  const std::string src = tmp / "mystery", dst = tmp / "out";
  auto t = per_expert(b, b.layer + ".mlp", "gate_proj", "up_proj", "down_proj");
  t.push_back(renamed(b.router, b.layer + ".mlp.gate.weight"));
  write_family(
      b, src, t,
      family_config(
          b, {{"model_type", "mystery_moe"}, {"num_experts", kE}, {"num_experts_per_tok", 2}}));
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --target-arch sm100 --quantize mxfp8"), 0);
  std::string out, err;
  EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src, &out, &err), 4);
  EXPECT_NE(err.find("mystery_moe"), std::string::npos) << err;
  EXPECT_NE(err.find("--skip-numerical"), std::string::npos) << err;
  const json v = moepack_json("verify " + dst + " --source " + src + " --skip-numerical", 0);
  EXPECT_EQ(v["passed"], true) << v.dump(1);
  EXPECT_EQ(v["numerical_skipped"], true);
  EXPECT_TRUE(v["layers"].empty());
  EXPECT_GT(v["summary"]["round_trip_total"].get<int>(), 0);
  EXPECT_NE(v["numerical_skipped_because"].get<std::string>().find("mystery_moe"),
            std::string::npos);
}

// gpt-oss by its model type: per-expert names from a producer whose gate_proj / up_proj may be
// halves of the interleaved gate_up_proj (GPTQModel), or from an unknown one, are refused.
TEST(Families, PerExpertGptOssRefusedUnlessTheProducerDeinterleaves) {
  TempDir tmp;
  const Base b = make_base(tmp / "base");
  auto t = per_expert(b, b.layer + ".mlp", "gate_proj", "up_proj", "down_proj");
  t.push_back(renamed(b.router, b.layer + ".mlp.router.weight"));
  t.push_back(f32_vector(b.layer + ".mlp.router.bias", kE, 6));
  const json cfg = family_config(
      b, {{"model_type", "gpt_oss"}, {"num_local_experts", kE}, {"num_experts_per_tok", 2}});
  const std::string src = tmp / "gpt_oss";
  write_family(b, src, t, cfg);
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert " + src + " " + tmp / "out" +
                            " --target-arch sm100 --quantize "
                            "mxfp8",
                        &out, &err),
            4);
  EXPECT_NE(err.find("cannot be told from the tensors"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// A quantized router is refused under any name a router goes by (here Gemma-4's router.proj),
// never copied through.
TEST(Families, QuantizedRouterUnderAnyNameIsRefused) {
  TempDir tmp;
  const Base b = make_base(tmp / "base");
  const std::string p = b.layer + ".experts.";
  Tensor w(b.layer + ".router.proj.weight", DType::kI8, {kE, kH});
  std::vector<Tensor> t = {stacked(p + "gate_up_proj", b.gate, &b.up),
                           stacked(p + "down_proj", b.down),
                           w,
                           f32_vector(b.layer + ".router.proj.weight_scale", kE, 7),
                           f32_vector(b.layer + ".router.scale", kH, 4),
                           f32_vector(b.layer + ".router.per_expert_scale", kE, 5)};
  const std::string src = tmp / "gemma";
  write_family(b, src, t,
               family_config(b, {{"model_type", "gemma4_text"},
                                 {"num_experts", kE},
                                 {"top_k_experts", 2},
                                 {"moe_intermediate_size", kI}}));
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert " + src + " " + tmp / "out" +
                            " --target-arch sm100 --quantize "
                            "mxfp8",
                        &out, &err),
            4);
  EXPECT_NE(err.find("router.proj"), std::string::npos) << err;
  EXPECT_NE(err.find("is quantized"), std::string::npos) << err;
}

// Fused experts left in float under a config that declares them quantized (auto-round 0.15.1
// on Llama4ForCausalLM writes its 4-bit config and leaves experts.gate_up_proj / down_proj in
// BF16): exit 4 naming the tensor, its dtype and the method, not "quantized fused 3-D experts".
TEST(Families, FloatFusedExpertsUnderAQuantizedConfigAreNamed) {
  TempDir tmp;
  const Base b = make_base(tmp / "base");
  const std::string p = b.layer + ".experts.";
  const std::vector<Tensor> t = {stacked(p + "gate_up_proj", b.gate, &b.up),
                                 stacked(p + "down_proj", b.down),
                                 renamed(b.router, b.layer + ".router.proj.weight"),
                                 f32_vector(b.layer + ".router.scale", kH, 4),
                                 f32_vector(b.layer + ".router.per_expert_scale", kE, 5)};
  const std::string src = tmp / "gemma";
  write_family(b, src, t,
               family_config(b, {{"model_type", "gemma4_text"},
                                 {"num_experts", kE},
                                 {"top_k_experts", 2},
                                 {"moe_intermediate_size", kI},
                                 {"quantization_config",
                                  {{"quant_method", "auto-round"},
                                   {"packing_format", "auto_round:auto_gptq"},
                                   {"bits", 4},
                                   {"group_size", 32},
                                   {"sym", true},
                                   {"data_type", "int"}}}}));
  for (const std::string& cmd : {"inspect " + src, "convert " + src + " " + tmp / "out"}) {
    std::string out, err;
    EXPECT_EQ(moepack_cli(cmd, &out, &err), 4) << cmd << "\n" << err;
    EXPECT_NE(err.find(p + "gate_up_proj"), std::string::npos) << err;
    EXPECT_NE(err.find("fused 3-D BF16 tensors, not quantized"), std::string::npos) << err;
  }
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// Per-expert Linears left in float under a config that declares them quantized (GPTQModel 7.7.0
// on Granite MoE and MiniMax-M2 under transformers 5.23 quantizes attention only and saves each
// expert's BF16 'weight' under its 4-bit quantize_config.json; fixtures
// gptqmodel-v1-sym-granitemoe / -minimax_m2): exit 4 naming the tensor, its dtype and the
// method, as for fused experts, not "required tensor missing" (exit 3).
TEST(Families, FloatPerExpertLinearsUnderAQuantizedConfigAreNamed) {
  TempDir tmp;
  const Base b = make_base(tmp / "base");
  const std::string p = b.layer + ".mlp.experts.";
  std::vector<Tensor> t = {renamed(b.router, b.layer + ".mlp.gate.weight")};
  for (int64_t e = 0; e < kE; ++e) {
    const std::string x = p + std::to_string(e) + ".";
    t.push_back(renamed(b.gate[e], x + "gate_proj.weight"));
    t.push_back(renamed(b.up[e], x + "up_proj.weight"));
    t.push_back(renamed(b.down[e], x + "down_proj.weight"));
  }
  const std::string src = tmp / "minimax";
  write_family(b, src, t,
               family_config(b, {{"model_type", "minimax_m2"},
                                 {"num_local_experts", kE},
                                 {"num_experts_per_tok", 2},
                                 {"quantization_config",
                                  {{"quant_method", "gptq"},
                                   {"checkpoint_format", "gptq"},
                                   {"bits", 4},
                                   {"group_size", 32},
                                   {"sym", true},
                                   {"desc_act", false}}}}));
  for (const std::string& cmd : {"inspect " + src, "convert " + src + " " + tmp / "out"}) {
    std::string out, err;
    EXPECT_EQ(moepack_cli(cmd, &out, &err), 4) << cmd << "\n" << err;
    EXPECT_NE(err.find(p + "0."), std::string::npos) << err;
    EXPECT_NE(err.find("BF16 'weight' tensors, not quantized"), std::string::npos) << err;
    EXPECT_NE(err.find("config.json declares gptq"), std::string::npos) << err;
  }
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// transformers' in-memory orientation is read (the families above); another arrangement of
// the same experts is a layout moepack does not read: exit 4 naming it, not "corrupt" (exit 3).
TEST(Families, FusedArrangementNotReadIsUnsupported) {
  TempDir tmp;
  const Base b = make_base(tmp / "base");
  const std::string p = b.layer + ".mlp.experts.";
  // gate_up [E, H, 2I] (in, out) with down [E, H, I] (out, in), I = 2H.
  const std::vector<Tensor> t = {Tensor(p + "gate_up_proj", DType::kBF16, {kE, kH, 4 * kH}),
                                 Tensor(p + "down_proj", DType::kBF16, {kE, kH, 2 * kH}),
                                 renamed(b.router, b.layer + ".mlp.gate.weight")};
  const std::string src = tmp / "mixed";
  write_family(b, src, t,
               family_config(b, {{"model_type", "mistral4"},
                                 {"n_routed_experts", kE},
                                 {"num_experts_per_tok", 2},
                                 {"moe_intermediate_size", 2 * kH}}));
  std::string out, err;
  EXPECT_EQ(moepack_cli("inspect " + src, &out, &err), 4) << err;
  EXPECT_NE(err.find("arrangement is not supported"), std::string::npos) << err;
}

}  // namespace
}  // namespace moepack
