// MoE discovery on hand-built checkpoints of every naming family (spec/checkpoints.md §3.1):
// which layers are found, their family, shapes and vLLM parameter prefix; that routers, shared
// experts, dense layers and MTP layers are left for copy-through; the errors for broken
// checkpoints; and load_dense_experts' [gate; up] row order for fused and interleaved layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "formats/quantize.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "pipeline/plan.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::expect_error;

using nlohmann::json;
using test::TempDir;

bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

// Random bf16 values (never all zero); the test reads the expected floats back from the bytes.
Tensor bf16(const std::string& name, Shape shape) {
  Tensor t(name, DType::kBF16, std::move(shape));
  Rng rng(Rng::hash(7, name));
  uint16_t* p = t.as<uint16_t>();
  for (int64_t i = 0; i < numel(t.shape); ++i) p[i] = float_to_bf16(rng.normal());
  return t;
}
float bf16_at(const Tensor& t, int64_t i) {
  return bf16_to_float(t.as<uint16_t>()[i]);
}

// A checkpoint written by hand: config.json plus one or more shards (index when more than one,
// or when `force_index`).
struct Builder {
  json config;
  std::vector<std::vector<Tensor>> shards{1};
  std::map<std::string, std::string> extra_index_entries;  // tensor -> shard (for broken indexes)
  bool force_index = false;

  Tensor& add(Tensor t, size_t shard = 0) {
    if (shards.size() <= shard) shards.resize(shard + 1);
    shards[shard].push_back(std::move(t));
    return shards[shard].back();
  }
  const Tensor& find(const std::string& name) const {
    for (const auto& s : shards)
      for (const auto& t : s)
        if (t.name == name) return t;
    throw std::runtime_error("test bug: no tensor " + name);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& s : shards)
      for (const auto& t : s) out.push_back(t.name);
    return out;
  }
  std::string shard_name(size_t i) const {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    return buf;
  }
  void write(const std::string& dir) const {
    {
      std::ofstream f(dir + "/config.json");
      f << config.dump(2);
    }
    if (shards.size() == 1 && !force_index) {
      write_safetensors(dir + "/model.safetensors", shards[0]);
      return;
    }
    json idx;
    uint64_t total = 0;
    idx["weight_map"] = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      write_safetensors(dir + "/" + shard_name(i), shards[i]);
      for (const auto& t : shards[i]) {
        idx["weight_map"][t.name] = shard_name(i);
        total += t.data.size();
      }
    }
    for (const auto& [t, s] : extra_index_entries) idx["weight_map"][t] = s;
    idx["metadata"]["total_size"] = total;
    std::ofstream f(dir + "/model.safetensors.index.json");
    f << idx.dump(2);
  }
};

constexpr int64_t kH = 64, kI = 32, kE = 4;

json model_config(const std::string& model_type, int64_t layers = 2) {
  return {{"model_type", model_type}, {"hidden_size", kH},        {"moe_intermediate_size", kI},
          {"num_experts", kE},        {"num_experts_per_tok", 2}, {"num_hidden_layers", layers},
          {"torch_dtype", "bfloat16"}};
}

void add_attention(Builder& b, const std::string& P) {
  b.add(bf16(P + "input_layernorm.weight", {kH}));
  b.add(bf16(P + "self_attn.q_proj.weight", {kH, kH}));
  b.add(bf16(P + "self_attn.o_proj.weight", {kH, kH}));
  b.add(bf16(P + "post_attention_layernorm.weight", {kH}));
}

// Per-expert bf16 experts under `X` = "...experts." with projection names gate/up/down.
void add_experts(Builder& b, const std::string& X, const char* gate, const char* up,
                 const char* down, int64_t experts = kE) {
  for (int64_t e = 0; e < experts; ++e) {
    const std::string p = X + std::to_string(e) + ".";
    b.add(bf16(p + gate + ".weight", {kI, kH}));
    b.add(bf16(p + up + ".weight", {kI, kH}));
    b.add(bf16(p + down + ".weight", {kH, kI}));
  }
}

// Every tensor is either copied through (other_tensors) or a source of exactly one MoE layer.
void expect_partition(const Checkpoint& c) {
  std::map<std::string, int> seen;
  for (const auto& n : c.other_tensors()) ++seen[n];
  for (const auto& L : c.moe_layers())
    for (const auto& n : L.source_tensors) ++seen[n];
  EXPECT_EQ(seen.size(), c.tensor_names().size());
  for (const auto& n : c.tensor_names()) EXPECT_EQ(seen[n], 1) << n;
}

bool is_other(const Checkpoint& c, const std::string& name) {
  const auto& o = c.other_tensors();
  return std::find(o.begin(), o.end(), name) != o.end();
}

// -------------------------------------------------------------------------------- families

TEST(MoeDiscovery, Mixtral) {
  TempDir dir;
  Builder b;
  b.config = {{"model_type", "mixtral"}, {"hidden_size", kH},        {"intermediate_size", kI},
              {"num_local_experts", kE}, {"num_experts_per_tok", 2}, {"num_hidden_layers", 2}};
  b.add(bf16("model.embed_tokens.weight", {100, kH}));
  for (int L = 0; L < 2; ++L) {
    const std::string P = "model.layers." + std::to_string(L) + ".";
    add_attention(b, P);
    b.add(bf16(P + "block_sparse_moe.gate.weight", {kE, kH}));
    add_experts(b, P + "block_sparse_moe.experts.", "w1", "w3", "w2");
  }
  b.add(bf16("model.norm.weight", {kH}));
  b.add(bf16("lm_head.weight", {100, kH}));
  b.write(dir.path);

  const auto c = Checkpoint::open(dir.path);
  EXPECT_FALSE(c->indexed());
  ASSERT_EQ(c->moe_layers().size(), 2u);
  for (int L = 0; L < 2; ++L) {
    const MoeLayer& m = c->moe_layers()[L];
    const std::string P = "model.layers." + std::to_string(L) + ".block_sparse_moe";
    EXPECT_EQ(m.layer, L);
    EXPECT_EQ(m.family, MoeFamily::kMixtral);
    EXPECT_EQ(m.module, P);
    EXPECT_EQ(m.param_prefix, P + ".experts.");
    EXPECT_EQ(m.num_experts, kE);
    EXPECT_EQ(m.hidden, kH);
    EXPECT_EQ(m.inter, kI);
    EXPECT_TRUE(m.gated);
    ASSERT_EQ(m.experts.size(), static_cast<size_t>(kE));
    EXPECT_EQ(m.experts[2][kGate].at("weight"), P + ".experts.2.w1.weight");
    EXPECT_EQ(m.experts[2][kUp].at("weight"), P + ".experts.2.w3.weight");
    EXPECT_EQ(m.experts[2][kDown].at("weight"), P + ".experts.2.w2.weight");
    EXPECT_EQ(m.source_tensors.size(), static_cast<size_t>(3 * kE));
    EXPECT_TRUE(is_other(*c, P + ".gate.weight"));
  }
  EXPECT_EQ(c->other_tensors().size(), 1u + 2 * 5 + 2);
  expect_partition(*c);

  // w1 is the gate, w3 the up projection: w13 = [w1; w3].
  const DenseExperts d = load_dense_experts(*c, c->moe_layers()[1]);
  const std::string X = "model.layers.1.block_sparse_moe.experts.3.";
  const Tensor &w1 = b.find(X + "w1.weight"), &w3 = b.find(X + "w3.weight"),
               &w2 = b.find(X + "w2.weight");
  for (int64_t i = 0; i < kI * kH; ++i) {
    ASSERT_EQ(d.w13[(3 * 2 * kI) * kH + i], bf16_at(w1, i)) << i;
    ASSERT_EQ(d.w13[(3 * 2 * kI + kI) * kH + i], bf16_at(w3, i)) << i;
  }
  for (int64_t i = 0; i < kH * kI; ++i) ASSERT_EQ(d.w2[3 * kH * kI + i], bf16_at(w2, i)) << i;
}

TEST(MoeDiscovery, Qwen2MoeSharedExpertSingular) {
  TempDir dir;
  Builder b;
  b.config = model_config("qwen2_moe", 1);
  b.config["shared_expert_intermediate_size"] = 2 * kI;
  const std::string P = "model.layers.0.";
  add_attention(b, P);
  b.add(bf16(P + "mlp.gate.weight", {kE, kH}));
  add_experts(b, P + "mlp.experts.", "gate_proj", "up_proj", "down_proj");
  b.add(bf16(P + "mlp.shared_expert.gate_proj.weight", {2 * kI, kH}));
  b.add(bf16(P + "mlp.shared_expert.up_proj.weight", {2 * kI, kH}));
  b.add(bf16(P + "mlp.shared_expert.down_proj.weight", {kH, 2 * kI}));
  b.add(bf16(P + "mlp.shared_expert_gate.weight", {1, kH}));
  b.write(dir.path);

  const auto c = Checkpoint::open(dir.path);
  ASSERT_EQ(c->moe_layers().size(), 1u);
  const MoeLayer& m = c->moe_layers()[0];
  EXPECT_EQ(m.family, MoeFamily::kPerExpert);
  EXPECT_EQ(m.param_prefix, "model.layers.0.mlp.experts.");
  EXPECT_EQ(m.num_experts, kE);
  EXPECT_EQ(m.hidden, kH);
  EXPECT_EQ(m.inter, kI);  // the routed experts' I, not the shared expert's 2I
  for (const char* n :
       {"mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
        "mlp.shared_expert.down_proj.weight", "mlp.shared_expert_gate.weight", "mlp.gate.weight"})
    EXPECT_TRUE(is_other(*c, P + n)) << n;
  expect_partition(*c);
}

TEST(MoeDiscovery, Qwen3MoeWithDenseLayer) {
  TempDir dir;
  Builder b;
  b.config = model_config("qwen3_moe", 3);
  b.config["mlp_only_layers"] = {0};
  b.config["intermediate_size"] = 3 * kI;
  add_attention(b, "model.layers.0.");
  b.add(bf16("model.layers.0.mlp.gate_proj.weight", {3 * kI, kH}));
  b.add(bf16("model.layers.0.mlp.up_proj.weight", {3 * kI, kH}));
  b.add(bf16("model.layers.0.mlp.down_proj.weight", {kH, 3 * kI}));
  for (int L = 1; L < 3; ++L) {
    const std::string P = "model.layers." + std::to_string(L) + ".";
    add_attention(b, P);
    b.add(bf16(P + "mlp.gate.weight", {kE, kH}));
    add_experts(b, P + "mlp.experts.", "gate_proj", "up_proj", "down_proj");
  }
  b.write(dir.path);

  const auto c = Checkpoint::open(dir.path);
  ASSERT_EQ(c->moe_layers().size(), 2u);
  EXPECT_EQ(c->moe_layers()[0].layer, 1);
  EXPECT_EQ(c->moe_layers()[1].layer, 2);
  for (const auto& m : c->moe_layers()) {
    EXPECT_EQ(m.inter, kI);
    EXPECT_EQ(m.family, MoeFamily::kPerExpert);
  }
  for (const char* n : {"gate_proj", "up_proj", "down_proj"})
    EXPECT_TRUE(is_other(*c, std::string("model.layers.0.mlp.") + n + ".weight")) << n;
  expect_partition(*c);
}

TEST(MoeDiscovery, DeepseekV3SharedExpertsDenseLayerAndMtp) {
  TempDir dir;
  Builder b;
  b.config = model_config("deepseek_v3", 61);
  b.config.erase("num_experts");
  b.config["n_routed_experts"] = kE;
  b.config["n_shared_experts"] = 1;
  b.config["first_k_dense_replace"] = 1;
  b.config["num_nextn_predict_layers"] = 1;
  b.config["intermediate_size"] = 3 * kI;
  b.add(bf16("model.embed_tokens.weight", {100, kH}));
  add_attention(b, "model.layers.0.");
  b.add(bf16("model.layers.0.mlp.gate_proj.weight", {3 * kI, kH}));
  b.add(bf16("model.layers.0.mlp.up_proj.weight", {3 * kI, kH}));
  b.add(bf16("model.layers.0.mlp.down_proj.weight", {kH, 3 * kI}));
  auto moe_layer = [&](const std::string& P) {
    add_attention(b, P);
    b.add(bf16(P + "mlp.gate.weight", {kE, kH}));
    Tensor bias("x", DType::kF32, {kE});
    bias.name = P + "mlp.gate.e_score_correction_bias";
    for (int64_t e = 0; e < kE; ++e) bias.as<float>()[e] = 0.25f * static_cast<float>(e + 1);
    b.add(std::move(bias));
    b.add(bf16(P + "mlp.shared_experts.gate_proj.weight", {kI, kH}));
    b.add(bf16(P + "mlp.shared_experts.up_proj.weight", {kI, kH}));
    b.add(bf16(P + "mlp.shared_experts.down_proj.weight", {kH, kI}));
    add_experts(b, P + "mlp.experts.", "gate_proj", "up_proj", "down_proj");
  };
  moe_layer("model.layers.1.");
  // The MTP (NextN) layer sits after the last decoder layer; its own tensors must survive.
  const std::string M = "model.layers.61.";
  b.add(bf16(M + "enorm.weight", {kH}));
  b.add(bf16(M + "hnorm.weight", {kH}));
  b.add(bf16(M + "eh_proj.weight", {kH, 2 * kH}));
  b.add(bf16(M + "shared_head.norm.weight", {kH}));
  b.add(bf16(M + "shared_head.head.weight", {100, kH}));
  moe_layer(M);
  b.add(bf16("model.norm.weight", {kH}));
  b.add(bf16("lm_head.weight", {100, kH}));
  b.write(dir.path);

  const auto c = Checkpoint::open(dir.path);
  ASSERT_EQ(c->moe_layers().size(), 2u);
  EXPECT_EQ(c->moe_layers()[0].layer, 1);
  EXPECT_EQ(c->moe_layers()[1].layer, 61);
  EXPECT_EQ(c->moe_layers()[1].param_prefix, "model.layers.61.mlp.experts.");
  for (const auto& m : c->moe_layers()) {
    EXPECT_EQ(m.num_experts, kE);
    EXPECT_EQ(m.hidden, kH);
    EXPECT_EQ(m.inter, kI);
    EXPECT_EQ(m.source_tensors.size(), static_cast<size_t>(3 * kE));
  }
  for (const std::string P : {"model.layers.1.", "model.layers.61."}) {
    EXPECT_TRUE(is_other(*c, P + "mlp.gate.e_score_correction_bias"));
    EXPECT_TRUE(is_other(*c, P + "mlp.gate.weight"));
    for (const char* n : {"gate_proj", "up_proj", "down_proj"})
      EXPECT_TRUE(is_other(*c, P + "mlp.shared_experts." + n + ".weight")) << n;
  }
  for (const char* n : {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                        "shared_head.head.weight", "self_attn.q_proj.weight"})
    EXPECT_TRUE(is_other(*c, M + n)) << n;
  for (const char* n : {"gate_proj", "up_proj", "down_proj"})
    EXPECT_TRUE(is_other(*c, std::string("model.layers.0.mlp.") + n + ".weight")) << n;
  expect_partition(*c);
}

json fused_config() {
  return {{"architectures", {"Qwen3VLMoeForConditionalGeneration"}},
          {"model_type", "qwen3_vl_moe"},
          {"text_config",
           {{"model_type", "qwen3_vl_moe_text"},
            {"hidden_size", kH},
            {"moe_intermediate_size", kI},
            {"num_experts", kE},
            {"num_experts_per_tok", 2},
            {"num_hidden_layers", 2}}},
          {"vision_config", {{"hidden_size", 48}}}};
}

TEST(MoeDiscovery, Fused3dQwen3Vl) {
  TempDir dir;
  Builder b;
  b.config = fused_config();
  b.add(bf16("model.visual.blocks.0.attn.qkv.weight", {3 * 48, 48}));
  b.add(bf16("model.language_model.embed_tokens.weight", {100, kH}));
  for (int L = 0; L < 2; ++L) {
    const std::string P = "model.language_model.layers." + std::to_string(L) + ".";
    add_attention(b, P);
    b.add(bf16(P + "mlp.gate.weight", {kE, kH}));
    b.add(bf16(P + "mlp.experts.gate_up_proj", {kE, kH, 2 * kI}));
    b.add(bf16(P + "mlp.experts.down_proj", {kE, kI, kH}));
  }
  b.add(bf16("lm_head.weight", {100, kH}));
  b.write(dir.path);

  const auto c = Checkpoint::open(dir.path);
  ASSERT_EQ(c->moe_layers().size(), 2u);
  const MoeLayer& m = c->moe_layers()[1];
  const std::string P = "model.language_model.layers.1.mlp";
  EXPECT_EQ(m.layer, 1);
  EXPECT_EQ(m.family, MoeFamily::kFused3d);
  EXPECT_EQ(m.module, P);
  EXPECT_EQ(m.param_prefix, P + ".experts.");
  EXPECT_EQ(m.num_experts, kE);
  EXPECT_EQ(m.hidden, kH);
  EXPECT_EQ(m.inter, kI);
  EXPECT_TRUE(m.gated);
  EXPECT_TRUE(m.experts.empty());
  EXPECT_EQ(m.fused_gate_up.at(""), P + ".experts.gate_up_proj");
  EXPECT_EQ(m.fused_down.at(""), P + ".experts.down_proj");
  EXPECT_TRUE(is_other(*c, P + ".gate.weight"));
  EXPECT_TRUE(is_other(*c, "model.visual.blocks.0.attn.qkv.weight"));
  expect_partition(*c);

  // gate_up_proj [E, H, 2I]: columns [0, I) are the gate, [I, 2I) the up projection
  // (transformers' Qwen3VLMoeTextExperts: gate, up = (x @ gate_up_proj).chunk(2, -1)).
  const DenseExperts d = load_dense_experts(*c, m);
  EXPECT_EQ(d.experts, kE);
  EXPECT_TRUE(d.gated);
  const Tensor& gu = b.find(P + ".experts.gate_up_proj");
  const Tensor& dn = b.find(P + ".experts.down_proj");
  for (int64_t e = 0; e < kE; ++e)
    for (int64_t r = 0; r < 2 * kI; ++r)
      for (int64_t h = 0; h < kH; ++h)
        ASSERT_EQ(d.w13[(e * 2 * kI + r) * kH + h], bf16_at(gu, (e * kH + h) * 2 * kI + r))
            << e << " " << r << " " << h;
  for (int64_t e = 0; e < kE; ++e)
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t i = 0; i < kI; ++i)
        ASSERT_EQ(d.w2[(e * kH + h) * kI + i], bf16_at(dn, (e * kI + i) * kH + h));
}

json gpt_oss_config() {
  return {{"architectures", {"GptOssForCausalLM"}},
          {"model_type", "gpt_oss"},
          {"hidden_size", kH},
          {"intermediate_size", kI},
          {"num_local_experts", kE},
          {"experts_per_token", 2},
          {"num_hidden_layers", 1},
          {"hidden_act", "silu"},
          {"swiglu_limit", 7.0}};
}

// The tensors of one gpt-oss MXFP4 layer as published (formats/fp4.h): blocks [E, N, K/32, 16],
// scales [E, N, K/32], biases; `skip` leaves one out, `bad` replaces one by a wrong shape.
void add_gpt_oss_mxfp4(Builder& b, const std::string& skip = "", const std::string& bad = "") {
  const std::string X = "model.layers.0.mlp.experts.";
  b.add(bf16("model.layers.0.mlp.router.weight", {kE, kH}));
  b.add(bf16("model.layers.0.mlp.router.bias", {kE}));
  auto add = [&](Tensor t) {
    const std::string suffix = t.name.substr(X.size());
    if (suffix == skip) return;
    if (suffix == bad) t = Tensor(t.name, t.dtype, {t.shape[0] + 1});
    b.add(std::move(t));
  };
  add(Tensor(X + "gate_up_proj_blocks", DType::kU8, {kE, 2 * kI, kH / 32, 16}));
  add(Tensor(X + "gate_up_proj_scales", DType::kU8, {kE, 2 * kI, kH / 32}));
  add(bf16(X + "gate_up_proj_bias", {kE, 2 * kI}));
  add(Tensor(X + "down_proj_blocks", DType::kU8, {kE, kH, kI / 32, 16}));
  add(Tensor(X + "down_proj_scales", DType::kU8, {kE, kH, kI / 32}));
  add(bf16(X + "down_proj_bias", {kE, kH}));
}

json gpt_oss_mxfp4_quant() {
  return {
      {"quant_method", "mxfp4"},
      {"modules_to_not_convert",
       {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}};
}

TEST(MoeDiscovery, GptOssMxfp4AsPublished) {
  TempDir dir;
  Builder b;
  b.config = gpt_oss_config();
  b.config["quantization_config"] = gpt_oss_mxfp4_quant();
  add_gpt_oss_mxfp4(b);
  b.write(dir.path);
  const auto c = Checkpoint::open(dir.path);
  EXPECT_EQ(c->quant().method, QuantMethod::kGptOssMxfp4);
  ASSERT_EQ(c->moe_layers().size(), 1u);
  const MoeLayer& m = c->moe_layers()[0];
  EXPECT_EQ(m.family, MoeFamily::kGptOss);
  EXPECT_EQ(m.num_experts, kE);
  EXPECT_EQ(m.hidden, kH);
  EXPECT_EQ(m.inter, kI);
  EXPECT_TRUE(is_other(*c, "model.layers.0.mlp.router.weight"));
  expect_partition(*c);
  // Zero bytes decode (code 0, E8M0 0) to zeros; every expert's slice is read.
  const MoeExperts x = load_moe_experts(*c, m, 1);
  EXPECT_EQ(x.w13.experts, kE);
  EXPECT_EQ(x.w13.n, 2 * kI);
  EXPECT_EQ(x.w2.k, kI);
}

// What the tensors and the config must agree on; each disagreement exits 3 (or 4 where the
// checkpoint is consistent but not read) naming the file and the tensor or field.
TEST(MoeDiscovery, GptOssMxfp4DisagreementsAreNamed) {
  struct Case {
    const char* what;
    std::function<void(Builder&)> build;
    ErrorCode code;
    std::string tensor, message;
  };
  const std::string X = "model.layers.0.mlp.experts.";
  const std::vector<Case> cases = {
      {"MXFP4 tensors without the config's quant_method", [](Builder& b) { add_gpt_oss_mxfp4(b); },
       ErrorCode::kBadConfig, X + "gate_up_proj_blocks", "mxfp4"},
      {"experts listed in modules_to_not_convert",
       [](Builder& b) {
         b.config["quantization_config"]["modules_to_not_convert"] = {"model.layers.*.mlp"};
         add_gpt_oss_mxfp4(b);
       },
       ErrorCode::kBadConfig, X + "gate_up_proj_blocks", "modules_to_not_convert"},
      {"a missing scale tensor", [](Builder& b) { add_gpt_oss_mxfp4(b, "down_proj_scales"); },
       ErrorCode::kMissingTensor, X + "down_proj_scales", "missing"},
      {"a missing bias", [](Builder& b) { add_gpt_oss_mxfp4(b, "gate_up_proj_bias"); },
       ErrorCode::kMissingTensor, X + "gate_up_proj_bias", "missing"},
      {"scales of the wrong shape",
       [](Builder& b) { add_gpt_oss_mxfp4(b, "", "gate_up_proj_scales"); }, ErrorCode::kBadShape,
       X + "gate_up_proj_scales", "expected"},
      {"down_proj_blocks of the wrong shape",
       [](Builder& b) { add_gpt_oss_mxfp4(b, "", "down_proj_blocks"); }, ErrorCode::kBadShape,
       X + "down_proj_blocks", "expected"},
      {"num_local_experts against the tensors",
       [](Builder& b) {
         b.config["num_local_experts"] = kE + 1;
         add_gpt_oss_mxfp4(b);
       },
       ErrorCode::kBadConfig, X + "gate_up_proj_blocks", "num_local_experts"},
      {"intermediate_size against the tensors",
       [](Builder& b) {
         b.config["intermediate_size"] = kI + 32;
         add_gpt_oss_mxfp4(b);
       },
       ErrorCode::kBadConfig, "", "intermediate"},
      {"bf16 experts under quant_method mxfp4",
       [](Builder& b) {
         const std::string Y = "model.layers.0.mlp.experts.";
         b.add(bf16("model.layers.0.mlp.router.weight", {kE, kH}));
         b.add(bf16("model.layers.0.mlp.router.bias", {kE}));
         b.add(bf16(Y + "gate_up_proj", {kE, kH, 2 * kI}));
         b.add(bf16(Y + "down_proj", {kE, kI, kH}));
       },
       ErrorCode::kBadConfig, X + "gate_up_proj", "mxfp4"},
      {"mxfp4 on another model type",
       [](Builder& b) {
         b.config["model_type"] = "qwen3_moe";
         add_gpt_oss_mxfp4(b);
       },
       ErrorCode::kUnsupported, "", "gpt_oss"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    TempDir dir;
    Builder b;
    b.config = gpt_oss_config();
    if (std::string(k.what).find("without the config") == std::string::npos)
      b.config["quantization_config"] = gpt_oss_mxfp4_quant();
    k.build(b);
    b.write(dir.path);
    const Error e = expect_error([&] { Checkpoint::open(dir.path); }, k.code);
    if (!k.tensor.empty()) {
      EXPECT_EQ(e.tensor(), k.tensor) << e.what();
    }
    EXPECT_FALSE(e.file().empty()) << e.what();
    EXPECT_TRUE(contains(e.message(), k.message)) << e.what();
  }
}

TEST(MoeDiscovery, GptOssBf16InterleavedGateUp) {
  TempDir dir;
  Builder b;
  b.config = gpt_oss_config();
  const std::string X = "model.layers.0.mlp.experts.";
  b.add(bf16("model.layers.0.mlp.router.weight", {kE, kH}));
  b.add(bf16("model.layers.0.mlp.router.bias", {kE}));
  b.add(bf16(X + "gate_up_proj", {kE, kH, 2 * kI}));
  b.add(bf16(X + "down_proj", {kE, kI, kH}));
  b.write(dir.path);

  const auto c = Checkpoint::open(dir.path);
  ASSERT_EQ(c->moe_layers().size(), 1u);
  const MoeLayer& m = c->moe_layers()[0];
  EXPECT_EQ(m.family, MoeFamily::kGptOss);
  EXPECT_EQ(m.param_prefix, X);
  EXPECT_EQ(m.hidden, kH);
  EXPECT_EQ(m.inter, kI);
  EXPECT_TRUE(is_other(*c, "model.layers.0.mlp.router.weight"));
  EXPECT_TRUE(is_other(*c, "model.layers.0.mlp.router.bias"));
  expect_partition(*c);

  // Columns interleave gate and up: even = gate, odd = up (vLLM de-interleaves [..., ::2] and
  // [..., 1::2]). Logical w13 = [gate; up].
  const DenseExperts d = load_dense_experts(*c, m);
  const Tensor& gu = b.find(X + "gate_up_proj");
  for (int64_t e = 0; e < kE; ++e)
    for (int64_t j = 0; j < kI; ++j)
      for (int64_t h = 0; h < kH; ++h) {
        ASSERT_EQ(d.w13[(e * 2 * kI + j) * kH + h], bf16_at(gu, (e * kH + h) * 2 * kI + 2 * j))
            << "gate " << e << " " << j << " " << h;
        ASSERT_EQ(d.w13[(e * 2 * kI + kI + j) * kH + h],
                  bf16_at(gu, (e * kH + h) * 2 * kI + 2 * j + 1))
            << "up " << e << " " << j << " " << h;
      }
  const Tensor& dn = b.find(X + "down_proj");
  for (int64_t e = 0; e < kE; ++e)
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t i = 0; i < kI; ++i)
        ASSERT_EQ(d.w2[(e * kH + h) * kI + i], bf16_at(dn, (e * kI + i) * kH + h));
}

TEST(MoeDiscovery, GptOssExpertBiasesAreNotSilentlyDropped) {
  // gpt-oss experts carry gate_up_proj_bias / down_proj_bias. No moepack layout holds them, so
  // reading the experts must refuse rather than return weights without their biases.
  TempDir dir;
  Builder b;
  b.config = gpt_oss_config();
  const std::string X = "model.layers.0.mlp.experts.";
  b.add(bf16(X + "gate_up_proj", {kE, kH, 2 * kI}));
  b.add(bf16(X + "gate_up_proj_bias", {kE, 2 * kI}));
  b.add(bf16(X + "down_proj", {kE, kI, kH}));
  b.add(bf16(X + "down_proj_bias", {kE, kH}));
  b.add(bf16("model.layers.0.mlp.router.weight", {kE, kH}));
  b.add(bf16("model.layers.0.mlp.router.bias", {kE}));
  b.write(dir.path);
  const auto c = Checkpoint::open(dir.path);
  ASSERT_EQ(c->moe_layers().size(), 1u);
  expect_partition(*c);
  const Error e =
      expect_error([&] { load_dense_experts(*c, c->moe_layers()[0]); }, ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.tensor() + e.message(), "bias")) << e.what();
}

TEST(MoeDiscovery, PartnersSplitAcrossShards) {
  TempDir dir;
  Builder b;
  b.config = model_config("qwen3_moe", 1);
  const std::string X = "model.layers.0.mlp.experts.";
  add_attention(b, "model.layers.0.");
  b.add(bf16("model.layers.0.mlp.gate.weight", {kE, kH}));
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = X + std::to_string(e) + ".";
    b.add(bf16(p + "gate_proj.weight", {kI, kH}), 0);
    b.add(bf16(p + "up_proj.weight", {kI, kH}), 1);
    b.add(bf16(p + "down_proj.weight", {kH, kI}), e % 2 ? 0 : 1);
  }
  b.write(dir.path);

  const auto c = Checkpoint::open(dir.path);
  EXPECT_TRUE(c->indexed());
  ASSERT_EQ(c->shard_names().size(), 2u);
  EXPECT_EQ(c->shard_of(X + "1.gate_proj.weight"), b.shard_name(0));
  EXPECT_EQ(c->shard_of(X + "1.up_proj.weight"), b.shard_name(1));
  ASSERT_EQ(c->moe_layers().size(), 1u);
  const MoeLayer& m = c->moe_layers()[0];
  EXPECT_EQ(m.num_experts, kE);
  EXPECT_EQ(m.inter, kI);
  expect_partition(*c);

  const DenseExperts d = load_dense_experts(*c, m);
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = X + std::to_string(e) + ".";
    const Tensor &g = b.find(p + "gate_proj.weight"), &u = b.find(p + "up_proj.weight"),
                 &dn = b.find(p + "down_proj.weight");
    for (int64_t i = 0; i < kI * kH; ++i) {
      ASSERT_EQ(d.w13[e * 2 * kI * kH + i], bf16_at(g, i));
      ASSERT_EQ(d.w13[(e * 2 * kI + kI) * kH + i], bf16_at(u, i));
    }
    for (int64_t i = 0; i < kH * kI; ++i) ASSERT_EQ(d.w2[e * kH * kI + i], bf16_at(dn, i));
  }
}

TEST(MoeDiscovery, NonWeightFilesCarriedOver) {
  TempDir dir;
  Builder b;
  b.config = model_config("qwen3_moe", 1);
  b.add(bf16("model.layers.0.mlp.gate.weight", {kE, kH}));
  add_experts(b, "model.layers.0.mlp.experts.", "gate_proj", "up_proj", "down_proj");
  b.write(dir.path);
  for (const char* f : {"tokenizer.json", "generation_config.json", "chat_template.jinja"}) {
    std::ofstream(dir / f) << "{}";
  }
  const auto c = Checkpoint::open(dir.path);
  const std::vector<std::string> want = {"chat_template.jinja", "generation_config.json",
                                         "tokenizer.json"};
  EXPECT_EQ(c->other_files(), want);
}

// ------------------------------------------------------------------- quantized linear shapes

struct LinearFormat {
  const char* label;
  json quant_config;
  std::function<void(Builder&, const std::string&, int64_t n, int64_t k)> add_linear;
  std::set<std::string> suffixes;
};

std::vector<LinearFormat> linear_formats() {
  const int64_t g = 32;
  std::vector<LinearFormat> f;
  f.push_back({"gptq-int4",
               {{"quant_method", "gptq"},
                {"bits", 4},
                {"group_size", g},
                {"desc_act", true},
                {"sym", true}},
               [=](Builder& b, const std::string& p, int64_t n, int64_t k) {
                 b.add(Tensor(p + "qweight", DType::kI32, {k / 8, n}));
                 b.add(Tensor(p + "qzeros", DType::kI32, {k / g, n / 8}));
                 b.add(Tensor(p + "scales", DType::kF16, {k / g, n}));
                 b.add(Tensor(p + "g_idx", DType::kI32, {k}));
               },
               {"qweight", "qzeros", "scales", "g_idx"}});
  f.push_back({"gptq-int8",
               {{"quant_method", "gptq"}, {"bits", 8}, {"group_size", -1}, {"sym", true}},
               [=](Builder& b, const std::string& p, int64_t n, int64_t k) {
                 b.add(Tensor(p + "qweight", DType::kI32, {k / 4, n}));
                 b.add(Tensor(p + "qzeros", DType::kI32, {1, n / 4}));
                 b.add(Tensor(p + "scales", DType::kF16, {1, n}));
               },
               {"qweight", "qzeros", "scales"}});
  f.push_back({"awq",
               {{"quant_method", "awq"},
                {"bits", 4},
                {"group_size", g},
                {"zero_point", true},
                {"version", "gemm"}},
               [=](Builder& b, const std::string& p, int64_t n, int64_t k) {
                 b.add(Tensor(p + "qweight", DType::kI32, {k, n / 8}));
                 b.add(Tensor(p + "qzeros", DType::kI32, {k / g, n / 8}));
                 b.add(Tensor(p + "scales", DType::kF16, {k / g, n}));
               },
               {"qweight", "qzeros", "scales"}});
  f.push_back({"ct-w4a16",
               {{"quant_method", "compressed-tensors"},
                {"format", "pack-quantized"},
                {"config_groups",
                 {{"group_0",
                   {{"targets", {"Linear"}},
                    {"weights",
                     {{"num_bits", 4},
                      {"type", "int"},
                      {"symmetric", true},
                      {"strategy", "group"},
                      {"group_size", g}}}}}}}},
               [=](Builder& b, const std::string& p, int64_t n, int64_t k) {
                 b.add(Tensor(p + "weight_packed", DType::kI32, {n, k / 8}));
                 b.add(Tensor(p + "weight_scale", DType::kBF16, {n, k / g}));
                 // compressed-tensors stores the true (N, K); the logical shape comes from it.
                 b.add(make_tensor<int32_t>(p + "weight_shape", DType::kI32, {2},
                                            {static_cast<int32_t>(n), static_cast<int32_t>(k)}));
               },
               {"weight_packed", "weight_scale", "weight_shape"}});
  f.push_back(
      {"ct-w8a8",
       {{"quant_method", "compressed-tensors"},
        {"format", "int-quantized"},
        {"config_groups",
         {{"group_0",
           {{"targets", {"Linear"}},
            {"weights",
             {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", "channel"}}},
            {"input_activations",
             {{"num_bits", 8}, {"type", "int"}, {"strategy", "token"}, {"dynamic", true}}}}}}}},
       [=](Builder& b, const std::string& p, int64_t n, int64_t k) {
         b.add(Tensor(p + "weight", DType::kI8, {n, k}));
         b.add(Tensor(p + "weight_scale", DType::kBF16, {n, 1}));
       },
       {"weight", "weight_scale"}});
  f.push_back({"modelopt-mxfp8",
               {{"quant_method", "modelopt"}, {"quant_algo", "MXFP8"}},
               [=](Builder& b, const std::string& p, int64_t n, int64_t k) {
                 b.add(Tensor(p + "weight", DType::kF8_E4M3, {n, k}));
                 b.add(Tensor(p + "weight_scale", DType::kU8, {n, k / 32}));
               },
               {"weight", "weight_scale"}});
  f.push_back(
      {"fp8-block",
       {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}},
       [=](Builder& b, const std::string& p, int64_t n, int64_t k) {
         b.add(Tensor(p + "weight", DType::kF8_E4M3, {n, k}));
         b.add(Tensor(p + "weight_scale_inv", DType::kF32, {(n + 127) / 128, (k + 127) / 128}));
       },
       {"weight", "weight_scale_inv"}});
  return f;
}

TEST(MoeDiscovery, QuantizedPerExpertLinearShapes) {
  // H != I and neither a multiple of the other's packing, so swapped axes would show.
  const int64_t H = 256, I = 96;
  for (const auto& fmt : linear_formats()) {
    SCOPED_TRACE(fmt.label);
    TempDir dir;
    Builder b;
    b.config = model_config("qwen3_moe", 1);
    b.config["hidden_size"] = H;
    b.config["moe_intermediate_size"] = I;
    b.config["torch_dtype"] = "float16";
    b.config["quantization_config"] = fmt.quant_config;
    b.add(bf16("model.layers.0.mlp.gate.weight", {kE, H}));
    for (int64_t e = 0; e < kE; ++e) {
      const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
      fmt.add_linear(b, p + "gate_proj.", I, H);
      fmt.add_linear(b, p + "up_proj.", I, H);
      fmt.add_linear(b, p + "down_proj.", H, I);
    }
    b.write(dir.path);
    const auto c = Checkpoint::open(dir.path);
    ASSERT_EQ(c->moe_layers().size(), 1u);
    const MoeLayer& m = c->moe_layers()[0];
    EXPECT_EQ(m.hidden, H);
    EXPECT_EQ(m.inter, I);
    EXPECT_EQ(m.num_experts, kE);
    std::set<std::string> got;
    for (const auto& [s, n] : m.experts[1][kUp]) got.insert(s);
    EXPECT_EQ(got, fmt.suffixes);
    EXPECT_EQ(linear_shape(*c, c->quant(), m.experts[3][kGate]), std::make_pair(I, H));
    EXPECT_EQ(linear_shape(*c, c->quant(), m.experts[3][kDown]), std::make_pair(H, I));
    EXPECT_EQ(m.source_tensors.size(), 3 * kE * fmt.suffixes.size());
    expect_partition(*c);
  }
}

// llm-compressor keeps gpt-oss' expert biases as <proj>.bias beside its de-interleaved per-expert
// Linears: the plan refuses the layer naming a bias rather than convert the experts without them.
TEST(MoeDiscovery, PerExpertGptOssBiasesRefusedByThePlan) {
  const int64_t H = 256, I = 96;
  for (const auto& fmt : linear_formats()) {
    if (std::string(fmt.label) != "ct-w4a16") continue;
    TempDir dir;
    Builder b;
    b.config = gpt_oss_config();
    b.config["hidden_size"] = H;
    b.config["intermediate_size"] = I;
    b.config["torch_dtype"] = "float16";
    b.config["quantization_config"] = fmt.quant_config;
    b.add(bf16("model.layers.0.mlp.router.weight", {kE, H}));
    b.add(bf16("model.layers.0.mlp.router.bias", {kE}));
    for (int64_t e = 0; e < kE; ++e) {
      const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
      fmt.add_linear(b, p + "gate_proj.", I, H);
      fmt.add_linear(b, p + "up_proj.", I, H);
      fmt.add_linear(b, p + "down_proj.", H, I);
      b.add(bf16(p + "gate_proj.bias", {I}));
      b.add(bf16(p + "up_proj.bias", {I}));
      b.add(bf16(p + "down_proj.bias", {H}));
    }
    b.write(dir.path);
    const auto c = Checkpoint::open(dir.path);
    ConvertOptions opts;
    opts.src = dir.path;
    const Error e = expect_error([&] { make_plan(*c, opts); }, ErrorCode::kUnsupported);
    EXPECT_TRUE(contains(e.tensor(), ".bias")) << e.what();
    EXPECT_TRUE(contains(e.message(), "bias")) << e.what();
    return;
  }
  FAIL() << "no ct-w4a16 format";
}

// -------------------------------------------------------------------------------- errors

Builder qwen3_experts_builder() {
  Builder b;
  b.config = model_config("qwen3_moe", 1);
  b.add(bf16("model.layers.0.mlp.gate.weight", {kE, kH}));
  return b;
}

TEST(MoeDiscoveryErrors, ExpertMissingAProjection) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  const std::string X = "model.layers.0.mlp.experts.";
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = X + std::to_string(e) + ".";
    b.add(bf16(p + "gate_proj.weight", {kI, kH}));
    if (e != 2) b.add(bf16(p + "up_proj.weight", {kI, kH}));
    b.add(bf16(p + "down_proj.weight", {kH, kI}));
  }
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kMissingTensor);
  EXPECT_EQ(e.tensor(), X + "2.up_proj") << e.what();
  EXPECT_TRUE(contains(e.file(), "model.safetensors")) << e.what();
}

TEST(MoeDiscoveryErrors, FirstExpertMissingGateIsNotAnUngatedLayer) {
  // Expert 0 lacks gate_proj while the others have one: a broken checkpoint, not an ungated MoE
  // (the other experts' gates would otherwise be silently dropped).
  TempDir dir;
  Builder b = qwen3_experts_builder();
  const std::string X = "model.layers.0.mlp.experts.";
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = X + std::to_string(e) + ".";
    if (e != 0) b.add(bf16(p + "gate_proj.weight", {kI, kH}));
    b.add(bf16(p + "up_proj.weight", {kI, kH}));
    b.add(bf16(p + "down_proj.weight", {kH, kI}));
  }
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kMissingTensor);
  EXPECT_EQ(e.tensor(), X + "0.gate_proj") << e.what();
}

TEST(MoeDiscoveryErrors, ExpertWithDifferentSuffixes) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  add_experts(b, "model.layers.0.mlp.experts.", "gate_proj", "up_proj", "down_proj");
  b.add(bf16("model.layers.0.mlp.experts.3.down_proj.bias", {kH}));
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kMissingTensor);
  EXPECT_TRUE(contains(e.tensor(), "experts.3.down_proj")) << e.what();
}

TEST(MoeDiscoveryErrors, NonContiguousExpertIds) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  for (int64_t e : {0, 1, 3}) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    b.add(bf16(p + "gate_proj.weight", {kI, kH}));
    b.add(bf16(p + "up_proj.weight", {kI, kH}));
    b.add(bf16(p + "down_proj.weight", {kH, kI}));
  }
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kMissingTensor);
  EXPECT_TRUE(contains(e.message(), "3")) << e.what();
}

TEST(MoeDiscoveryErrors, IndexPointsToMissingTensor) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  add_experts(b, "model.layers.0.mlp.experts.", "gate_proj", "up_proj", "down_proj");
  b.force_index = true;
  b.extra_index_entries["model.layers.0.mlp.experts.9.up_proj.weight"] = b.shard_name(0);
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kMissingTensor);
  EXPECT_EQ(e.tensor(), "model.layers.0.mlp.experts.9.up_proj.weight") << e.what();
}

TEST(MoeDiscoveryErrors, IndexPointsToMissingShard) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  add_experts(b, "model.layers.0.mlp.experts.", "gate_proj", "up_proj", "down_proj");
  b.force_index = true;
  b.extra_index_entries["lm_head.weight"] = "model-00002-of-00002.safetensors";
  b.write(dir.path);
  // The index is wrong (an input error, exit 3), not the file system (exit 5, retried forever).
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kBadConfig);
  EXPECT_TRUE(contains(e.file(), "model.safetensors.index.json")) << e.what();
  EXPECT_EQ(e.tensor(), "lm_head.weight") << e.what();
  EXPECT_TRUE(contains(e.message(), "model-00002-of-00002.safetensors")) << e.what();
}

TEST(MoeDiscoveryErrors, TensorInShardButNotInIndex) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  add_experts(b, "model.layers.0.mlp.experts.", "gate_proj", "up_proj", "down_proj");
  b.add(bf16("lm_head.weight", {100, kH}), 1);
  b.add(bf16("model.norm.weight", {kH}), 1);
  b.write(dir.path);
  // Drop one tensor of shard 2 from the index: the shard still holds it.
  json idx = test::read_json_file(dir / "model.safetensors.index.json");
  idx["weight_map"].erase("model.norm.weight");
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump(2);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kBadConfig);
  EXPECT_EQ(e.tensor(), "model.norm.weight") << e.what();
  EXPECT_TRUE(contains(e.message(), "not listed in weight_map")) << e.what();
}

TEST(MoeDiscoveryErrors, IndexNamesTheWrongShard) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  add_experts(b, "model.layers.0.mlp.experts.", "gate_proj", "up_proj", "down_proj");
  b.add(bf16("lm_head.weight", {100, kH}), 1);
  b.add(bf16("model.norm.weight", {kH}), 1);  // keeps shard 2 in the index
  b.extra_index_entries["lm_head.weight"] = b.shard_name(0);
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kBadConfig);
  EXPECT_EQ(e.tensor(), "lm_head.weight") << e.what();
}

TEST(MoeDiscoveryErrors, TensorInTwoShards) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  add_experts(b, "model.layers.0.mlp.experts.", "gate_proj", "up_proj", "down_proj");
  b.add(bf16("model.layers.0.mlp.experts.1.up_proj.weight", {kI, kH}), 1);
  b.add(bf16("lm_head.weight", {100, kH}), 1);
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kDuplicateTensor);
  EXPECT_EQ(e.tensor(), "model.layers.0.mlp.experts.1.up_proj.weight") << e.what();
}

TEST(MoeDiscoveryErrors, DownProjShapeMismatch) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  const std::string X = "model.layers.0.mlp.experts.";
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = X + std::to_string(e) + ".";
    b.add(bf16(p + "gate_proj.weight", {kI, kH}));
    b.add(bf16(p + "up_proj.weight", {kI, kH}));
    b.add(bf16(p + "down_proj.weight", {kH, 2 * kI}));
  }
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kBadShape);
  EXPECT_TRUE(contains(e.tensor(), "down_proj")) << e.what();
  EXPECT_TRUE(contains(e.message(), std::to_string(2 * kI))) << e.what();
}

TEST(MoeDiscoveryErrors, LaterExpertShapeMismatchCaughtWhenLoading) {
  // Only expert 0 decides H and I at discovery; a later expert with another shape must still be
  // refused (by name) before any output is written.
  TempDir dir;
  Builder b = qwen3_experts_builder();
  const std::string X = "model.layers.0.mlp.experts.";
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = X + std::to_string(e) + ".";
    b.add(bf16(p + "gate_proj.weight", {e == 2 ? kI / 2 : kI, kH}));
    b.add(bf16(p + "up_proj.weight", {kI, kH}));
    b.add(bf16(p + "down_proj.weight", {kH, kI}));
  }
  b.write(dir.path);
  try {
    const auto c = Checkpoint::open(dir.path);
    ASSERT_EQ(c->moe_layers().size(), 1u);
    const Error e =
        expect_error([&] { load_dense_experts(*c, c->moe_layers()[0]); }, ErrorCode::kBadShape);
    EXPECT_EQ(e.tensor(), X + "2.gate_proj.weight") << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadShape) << e.what();  // refusing at discovery is fine too
  }
}

TEST(MoeDiscoveryErrors, FusedDownProjShapeMismatch) {
  TempDir dir;
  Builder b;
  b.config = fused_config();
  const std::string P = "model.language_model.layers.0.mlp.experts.";
  b.add(bf16(P + "gate_up_proj", {kE, kH, 2 * kI}));
  // [E, H, I + 1]: no I fits both. ([E, H, I] is no longer a mismatch here: with H = 2I the pair
  // is transformers' in-memory [E, 2I, H] + [E, H, I], read since issue 30.)
  b.add(bf16(P + "down_proj", {kE, kH, kI + 1}));
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kBadShape);
  EXPECT_EQ(e.tensor(), P + "down_proj") << e.what();
}

TEST(MoeDiscoveryErrors, FusedWithoutDownProj) {
  TempDir dir;
  Builder b;
  b.config = fused_config();
  b.add(bf16("model.language_model.layers.0.mlp.experts.gate_up_proj", {kE, kH, 2 * kI}));
  b.write(dir.path);
  expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kMissingTensor);
}

TEST(MoeDiscoveryErrors, HiddenSizeDisagreesWithConfig) {
  TempDir dir;
  Builder b = qwen3_experts_builder();
  b.config["hidden_size"] = 2 * kH;
  add_experts(b, "model.layers.0.mlp.experts.", "gate_proj", "up_proj", "down_proj");
  b.write(dir.path);
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kBadConfig);
  EXPECT_TRUE(contains(e.message(), "hidden_size is 128")) << e.what();
  EXPECT_EQ(e.file(), dir.path + "/config.json");
}

TEST(MoeDiscoveryErrors, NoWeights) {
  TempDir dir;
  std::ofstream(dir / "config.json") << model_config("qwen3_moe").dump();
  const Error e = expect_error([&] { Checkpoint::open(dir.path); }, ErrorCode::kMissingTensor);
  EXPECT_EQ(e.file(), dir.path);
}

}  // namespace
}  // namespace moepack
