// moepack.json as a typed Manifest: the struct written is byte for byte what a conversion writes
// (build -> to_json -> parse -> to_json is the identity on real manifests), quantisation
// parameters round-trip, and every defect of a hostile moepack.json -- a missing key, a wrong
// type, a negative size, an unknown dtype or method, a dangling reference, a file that is not a
// regular file -- is kBadConfig naming the file and the field, never a JSON library exception.
#include "pipeline/manifest.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/sha256.h"
#include "model/checkpoint.h"
#include "pipeline/execute.h"
#include "pipeline/parts.h"
#include "synth/synth.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::expect_error;

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Manifest, QuantParamsRoundTripEveryMethod) {
  for (int m = 0; m <= static_cast<int>(QuantMethod::kFp8Block); ++m) {
    QuantParams q;
    q.method = static_cast<QuantMethod>(m);
    q.bits = 4 + m % 5;
    q.group_size = m % 2 ? -1 : 32 << (m % 3);
    q.symmetric = m % 3 != 0;
    q.act_order = m % 2 == 0;
    q.gptq_format = m % 2 ? GptqFormat::kV2 : GptqFormat::kV1;
    q.actorder = m % 2 ? "weight" : "group";
    q.block_n = 64 + m;
    q.block_k = 128 + m;
    q.dtype = m % 2 ? DType::kF16 : DType::kBF16;
    q.dynamic_input = m % 4 != 1;
    SCOPED_TRACE(quant_method_name(q.method));
    EXPECT_EQ(parse_quant_method(quant_method_name(q.method)), q.method);
    // Through text, as it goes through moepack.json.
    const QuantParams r =
        quant_params_from_json(json::parse(quant_params_json(q).dump()), "moepack.json");
    EXPECT_EQ(r.method, q.method);
    EXPECT_EQ(r.bits, q.bits);
    EXPECT_EQ(r.group_size, q.group_size);
    EXPECT_EQ(r.symmetric, q.symmetric);
    EXPECT_EQ(r.act_order, q.act_order);
    EXPECT_EQ(r.gptq_format, q.gptq_format);
    EXPECT_EQ(r.actorder, q.actorder);
    EXPECT_EQ(r.block_n, q.block_n);
    EXPECT_EQ(r.block_k, q.block_k);
    EXPECT_EQ(r.dtype, q.dtype);
    EXPECT_EQ(r.dynamic_input, q.dynamic_input);
  }
  EXPECT_EQ(parse_quant_method("unknown"), std::nullopt);
  EXPECT_EQ(parse_quant_method("GPTQ"), std::nullopt);
}

TEST(Manifest, MalformedQuantParamsAreBadConfigNamingTheField) {
  struct Case {
    std::function<void(json&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["method"] = "bitsandbytes"; }, "method: unknown quantization method"},
      {[](json& j) { j.erase("bits"); }, "bits: missing"},
      {[](json& j) { j.erase("group_size"); }, "group_size: missing"},
      {[](json& j) { j.erase("dtype"); }, "dtype: missing"},
      {[](json& j) { j.erase("block"); }, "block: missing"},
      {[](json& j) { j["dtype"] = "F12"; }, "dtype: unknown dtype \"F12\""},
      {[](json& j) { j["bits"] = "4"; }, "bits: expected an integer, got \"4\""},
      {[](json& j) { j["bits"] = 0; }, "bits: must be between 1 and 64"},
      {[](json& j) { j["group_size"] = 0; }, "group_size: must be -1"},
      {[](json& j) { j["group_size"] = -2; }, "group_size: must be >= -1"},
      {[](json& j) { j["block"] = {128}; }, "block: expected [block_n, block_k]"},
      {[](json& j) {
         j["block"] = {128, -1};
       },
       "block[1]: must be >= 1"},
      {[](json& j) { j["gptq_format"] = "gptq_v3"; }, "gptq_format: expected"},
      {[](json& j) { j["symmetric"] = 1; }, "symmetric: expected true or false, got 1"},
      {[](json& j) { j = json::array(); }, "top level: expected an object"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    json j = quant_params_json(QuantParams{});
    c.mutate(j);
    const Error e =
        expect_error([&] { quant_params_from_json(j, "x/moepack.json"); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), "x/moepack.json");
    EXPECT_EQ(e.message().rfind(c.field, 0), 0u) << e.message();
  }
}

// Real manifests: conversions of synthesised checkpoints covering the manifest's variants (one
// and several shards, --quantize, per-expert and Mixtral naming, a non-gated layout).
struct Converted {
  std::string name;
  std::unique_ptr<Checkpoint> ckpt;
  Plan plan;
  std::string dst;
};

class RealManifest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir;
    struct Spec {
      std::string format, family, arch, quantize;
      uint64_t max_shard_bytes;
    };
    for (const Spec& s : {Spec{"gptq-actorder", "qwen3", "sm90", "", 5000000000ull},
                          Spec{"awq", "mixtral", "sm90", "", 300000},
                          Spec{"bf16", "qwen3", "sm100", "mxfp8", 5000000000ull}}) {
      auto c = std::make_unique<Converted>();
      c->name = s.format + "-" + s.family;
      const std::string src = *tmp_ / (c->name + "-src");
      c->dst = *tmp_ / c->name;
      SynthOptions o;
      o.format = s.format;
      o.family = s.family;
      o.layers = 3;
      o.experts = 4;
      o.hidden = 256;
      o.inter = 128;
      o.vocab = 64;
      o.seed = 5;
      o.threads = 1;
      synth_checkpoint(src, o);
      c->ckpt = Checkpoint::open(src);
      ConvertOptions co;
      co.src = src;
      co.dst = c->dst;
      co.target_arch = parse_target_arch(s.arch);
      co.quantize = s.quantize;
      co.max_shard_bytes = s.max_shard_bytes;
      co.threads = 1;
      // Act-order MoE is the spec's vLLM's, not 0.33's (the default target).
      if (s.format == "gptq-actorder") co.vllm_target = VllmTarget::kV2026_05;
      c->plan = make_plan(*c->ckpt, co);
      execute_plan(c->plan, *c->ckpt);
      converted_.push_back(std::move(c));
    }
  }
  static void TearDownTestSuite() {
    converted_.clear();
    delete tmp_;
  }
  static const Converted& gptq() { return *converted_[0]; }
  static json gptq_json() { return json::parse(slurp(manifest_path(gptq().dst))); }

  static test::TempDir* tmp_;
  static std::vector<std::unique_ptr<Converted>> converted_;
};
test::TempDir* RealManifest::tmp_ = nullptr;
std::vector<std::unique_ptr<Converted>> RealManifest::converted_;

TEST_F(RealManifest, BuildToJsonParseToJsonIsTheFileByteForByte) {
  ASSERT_EQ(converted_.size(), 3u);
  bool sharded = false, quantized = false;
  for (const auto& c : converted_) {
    SCOPED_TRACE(c->name);
    const std::string path = manifest_path(c->dst);
    const std::string text = slurp(path);
    const Manifest read = read_manifest(c->dst);
    EXPECT_EQ(to_json(read).dump(2) + "\n", text);
    EXPECT_EQ(to_json(parse_manifest(to_json(read), path)).dump(2) + "\n", text);
    // build_manifest from the plan gives the same struct the conversion wrote.
    std::map<std::string, std::string> sha;
    for (const auto& [name, t] : read.tensors) sha[name] = t.sha256;
    // The source fingerprint is the SHA-256 of each source tensor's bytes, computed here apart
    // from convert's reader (which hashed them while reading the source).
    std::map<std::string, std::string> source_sha;
    for (const std::string& name : c->ckpt->tensor_names()) {
      const TensorView v = c->ckpt->view(name);
      source_sha[name] = sha256_hex(v.data, v.nbytes);
    }
    EXPECT_EQ(read.source.tensor_sha256, source_sha);
    EXPECT_EQ(to_json(build_manifest(c->plan, *c->ckpt, sha, source_sha)).dump(2) + "\n", text);

    EXPECT_EQ(read.manifest_version, kManifestVersion);
    EXPECT_EQ(read.backend, c->plan.backend);
    // The layout row's serving entry for the target and the experts' method, and a role for
    // exactly each parameter, as param_specs gives it.
    ASSERT_TRUE(read.serving.has_value());
    const VllmServing want =
        find_vllm_serving(*c->plan.layout, c->plan.vllm_target, c->plan.target_quant.method);
    EXPECT_EQ(read.serving->path, want.path);
    EXPECT_EQ(read.serving->kernel_builder, want.kernel_builder ? want.kernel_builder : "");
    EXPECT_EQ(read.serving->vllm_backend, want.vllm_backend ? want.vllm_backend : "");
    EXPECT_EQ(read.serving->archs.size(), c->plan.layout->archs.size());
    for (size_t i = 0; i < read.layers.size(); ++i) {
      const PlannedLayer& pl = c->plan.layers[i];
      std::map<std::string, ParamRole> roles;
      for (const ParamSpec& s : c->plan.layout->param_specs(pl.layout_options, pl.shape))
        roles[s.name] = s.role;
      EXPECT_EQ(read.layers[i].param_roles, roles);
      EXPECT_EQ(read.layers[i].param_roles.size(), read.layers[i].params.size());
    }
    EXPECT_EQ(read.layers.size(), c->plan.layers.size());
    EXPECT_EQ(read.tensors.size(), c->plan.tensors.size());
    EXPECT_EQ(read.act_dtype, DType::kBF16);
    for (const auto& l : read.layers)
      for (const auto& p : l.params) EXPECT_TRUE(read.tensors.at(p).converted) << p;
    sharded = sharded || read.shards.size() > 1;
    quantized = quantized || read.quantize.has_value();
    if (read.quantize) {
      EXPECT_EQ(read.quantize->recipe, "flashinfer");
    }
  }
  EXPECT_TRUE(sharded);
  EXPECT_TRUE(quantized);
}

// One defect of a real manifest and the start of the message it must give.
struct Mutation {
  std::string what;
  std::function<void(json&)> apply;
  std::string message;  // the field path and what is wrong
};

const std::string kW13 = "model.layers.1.mlp.experts.w13_qweight";

// The defects of manifest_version 2's "serving" and "param_roles" (and a version below 1).
std::vector<Mutation> serving_and_role_mutations() {
  return {
      {"version zero", [](json& m) { m["manifest_version"] = 0; },
       "manifest_version: unsupported version 0"},
      {"no serving", [](json& m) { m.erase("serving"); }, "serving: missing"},
      {"serving path", [](json& m) { m["serving"]["path"] = "vllm"; },
       "serving.path: expected \"none\", \"vllm-method\" or \"kernel-builder\", got \"vllm\""},
      // (This manifest is for vLLM 2026-05, which the plugin does not serve: path "none".)
      {"none without a reason", [](json& m) { m["serving"].erase("reason"); },
       "serving.reason: missing"},
      {"kernel-builder without a builder", [](json& m) { m["serving"]["path"] = "kernel-builder"; },
       "serving.kernel_builder: missing"},
      {"empty kernel builder",
       [](json& m) {
         m["serving"]["path"] = "kernel-builder";
         m["serving"]["kernel_builder"] = "";
       },
       "serving.kernel_builder: must not be empty"},
      {"vllm-method without its method", [](json& m) { m["serving"]["path"] = "vllm-method"; },
       "serving.vllm_method: missing"},
      {"serving archs empty", [](json& m) { m["serving"]["archs"] = json::array(); },
       "serving.archs: empty"},
      {"serving arch", [](json& m) { m["serving"]["archs"][0] = "sm99"; },
       "serving.archs[0]: unknown target arch \"sm99\""},
      {"no param_roles", [](json& m) { m["layers"][0].erase("param_roles"); },
       "layers[0].param_roles: missing"},
      {"param_roles array", [](json& m) { m["layers"][0]["param_roles"] = json::array(); },
       "layers[0].param_roles: expected an object"},
      {"unknown role", [](json& m) { m["layers"][0]["param_roles"][kW13] = "w13_weights"; },
       "layers[0].param_roles[\"" + kW13 + "\"]: unknown parameter role \"w13_weights\""},
      {"role of no param", [](json& m) { m["layers"][0]["param_roles"]["model.x"] = "w2_zero"; },
       "layers[0].param_roles[\"model.x\"]: \"model.x\" is not in the layer's params"},
      {"param without role", [](json& m) { m["layers"][0]["param_roles"].erase(kW13); },
       "layers[0].param_roles: no role for \"" + kW13 + "\""},
  };
}

// Defects of the provenance: the source (its fingerprint included), the target's parameters, the
// quantize recipe, the notes, the config.json digests.
std::vector<Mutation> provenance_mutations() {
  return {
      {"source format", [](json& m) { m["source"]["format"] = "q4_k_m"; },
       "source.format: unknown quantization method \"q4_k_m\""},
      {"source tensor_bytes", [](json& m) { m["source"]["tensor_bytes"] = -1; },
       "source.tensor_bytes: must be non-negative, got -1"},
      {"source fingerprint missing", [](json& m) { m["source"].erase("tensor_sha256"); },
       "source.tensor_sha256: missing"},
      {"source fingerprint not hex",
       [](json& m) { m["source"]["tensor_sha256"].begin().value() = "ABC"; },
       "source.tensor_sha256[\"lm_head.weight\"]: expected a SHA-256"},
      {"source fingerprint array", [](json& m) { m["source"]["tensor_sha256"] = json::array(); },
       "source.tensor_sha256: expected an object"},
      {"source quantization_config", [](json& m) { m["source"].erase("quantization_config"); },
       "source.quantization_config: missing"},
      {"source method", [](json& m) { m["source"]["quant_params"]["method"] = "int3"; },
       "source.quant_params.method: unknown quantization method \"int3\""},
      {"target method", [](json& m) { m["target_quant_params"]["method"] = 4; },
       "target_quant_params.method: expected a string, got 4"},
      {"target bits", [](json& m) { m["target_quant_params"]["bits"] = 4.5; },
       "target_quant_params.bits: expected an integer, got 4.5"},
      {"quantize recipe",
       [](json& m) {
         m["quantize"] = {{"format", "mxfp8"}, {"recipe", "x"}};
       },
       "quantize.recipe: expected one of mxfp8/flashinfer, mxfp8/modelopt"},
      {"quantize format",
       [](json& m) {
         m["quantize"] = {{"format", "nf4"}, {"recipe", "x"}};
       },
       "quantize.format: expected one of mxfp8/flashinfer, mxfp8/modelopt"},
      {"deviations", [](json& m) { m["deviations_from_vllm"] = {1}; },
       "deviations_from_vllm[0]: expected a string"},
      {"files", [](json& m) { m["files"] = "tokenizer.json"; }, "files: expected an array"},
      {"no config", [](json& m) { m.erase("config"); }, "config: missing"},
      {"config array", [](json& m) { m["config"] = json::array(); }, "config: expected an object"},
      {"config digest short", [](json& m) { m["config"]["model_type"] = "abc"; },
       "config[\"model_type\"]: expected a SHA-256 (64 lowercase hex digits) or an object of them"},
      {"config member digest", [](json& m) { m["config"]["quantization_config"]["backend"] = 1; },
       "config[\"quantization_config\"][\"backend\"]: expected a SHA-256"},
      {"config without quantization_config",
       [](json& m) { m["config"].erase("quantization_config"); }, "config: no quantization_config"},
  };
}

std::vector<Mutation> mutations(const json& good) {
  const std::string t = "tensors[\"" + kW13 + "\"]";
  const std::string first_param = good["layers"][0]["params"][0];
  const std::string params = std::to_string(good["layers"][0]["params"].size());
  return {
      {"not an object",
       [](json& m) {
         m = json::array({1, 2});
       },
       "top level: expected an object"},
      {"a string", [](json& m) { m = "moepack"; }, "top level: expected an object"},
      {"no version", [](json& m) { m.erase("manifest_version"); }, "manifest_version: missing"},
      {"future version", [](json& m) { m["manifest_version"] = kManifestVersion + 1; },
       "manifest_version: unsupported version " + std::to_string(kManifestVersion + 1) +
           " (this moepack reads 1 to " + std::to_string(kManifestVersion) + ")"},
      {"version as text", [](json& m) { m["manifest_version"] = "1"; },
       "manifest_version: expected an integer"},
      {"no backend", [](json& m) { m.erase("backend"); }, "backend: missing"},
      {"backend number", [](json& m) { m["backend"] = 7; }, "backend: expected a string, got 7"},
      {"tool null", [](json& m) { m["tool"] = nullptr; }, "tool: expected an object, got null"},
      {"tool version", [](json& m) { m["tool"]["version"] = false; },
       "tool.version: expected a string"},
      {"no options", [](json& m) { m.erase("options"); }, "options: missing"},
      {"option not bool", [](json& m) { m["options"]["vllm_w13_scale_size_k"] = 1; },
       "options.vllm_w13_scale_size_k: expected true or false, got 1"},
      {"act_dtype Q99", [](json& m) { m["act_dtype"] = "Q99"; },
       "act_dtype: unknown dtype \"Q99\""},
      {"act_dtype F32", [](json& m) { m["act_dtype"] = "F32"; },
       "act_dtype: expected \"BF16\" or \"F16\""},
      {"act_dtype lower case", [](json& m) { m["act_dtype"] = "bf16"; }, "act_dtype: unknown"},
      {"target arch", [](json& m) { m["target_arch"] = "sm99"; },
       "target_arch: unknown target arch \"sm99\""},
      {"vllm target", [](json& m) { m["vllm_target"] = "0.1"; },
       "vllm_target: expected one of 0.33, 2026-05, got \"0.1\""},
      {"vllm target number", [](json& m) { m["vllm_target"] = 33; },
       "vllm_target: expected a string, got 33"},
      {"inter_padded below inter", [](json& m) { m["layers"][0]["inter_padded"] = 64; },
       "layers[0].inter_padded: must be >= 128, got 64"},
      {"layout version", [](json& m) { m["layout"]["version"] = -1; },
       "layout.version: must be between 0 and"},
      {"empty layers", [](json& m) { m["layers"] = json::array(); }, "layers: empty"},
      {"layers object", [](json& m) { m["layers"] = json::object(); },
       "layers: expected an array, got an object"},
      {"layer not object", [](json& m) { m["layers"][0] = 5; },
       "layers[0]: expected an object, got 5"},
      {"experts text", [](json& m) { m["layers"][0]["experts"] = "x"; },
       "layers[0].experts: expected an integer, got \"x\""},
      {"experts negative", [](json& m) { m["layers"][1]["experts"] = -4; },
       "layers[1].experts: must be >= 1, got -4"},
      {"experts zero", [](json& m) { m["layers"][0]["experts"] = 0; },
       "layers[0].experts: must be >= 1, got 0"},
      {"experts huge", [](json& m) { m["layers"][0]["experts"] = UINT64_MAX; },
       "layers[0].experts: must be >= 1, got 18446744073709551615"},
      {"hidden missing", [](json& m) { m["layers"][0].erase("hidden"); },
       "layers[0].hidden: missing"},
      {"inter float", [](json& m) { m["layers"][0]["inter"] = 128.0; },
       "layers[0].inter: expected an integer"},
      {"gated text", [](json& m) { m["layers"][0]["gated"] = "yes"; },
       "layers[0].gated: expected true or false"},
      {"family", [](json& m) { m["layers"][0]["family"] = "llama"; },
       "layers[0].family: unknown MoE family \"llama\""},
      {"module empty", [](json& m) { m["layers"][0]["module"] = ""; },
       "layers[0].module: must not be empty"},
      {"param not in tensors", [](json& m) { m["layers"][0]["params"].push_back("model.nope"); },
       "layers[0].params[" + params + "]: \"model.nope\" is not in tensors"},
      {"param's tensor removed", [=](json& m) { m["tensors"].erase(first_param); },
       "layers[0].params[0]: \"" + first_param + "\" is not in tensors"},
      {"no params", [](json& m) { m["layers"][0]["params"] = json::array(); },
       "layers[0].params: empty"},
      {"no shards key", [](json& m) { m.erase("shards"); }, "shards: missing"},
      {"shard not listed", [&](json& m) { m["tensors"][kW13]["shard"] = "model-2.safetensors"; },
       t + ".shard: \"model-2.safetensors\" is not listed in shards"},
      {"shard listed twice", [](json& m) { m["shards"].push_back(m["shards"][0]); },
       "shards[1].name: \"model.safetensors\" is listed twice"},
      {"shard path", [](json& m) { m["shards"][0]["name"] = "../model.safetensors"; },
       "shards[0].name: expected a file name inside the checkpoint"},
      {"shard bytes", [](json& m) { m["shards"][0]["file_bytes"] = -8; },
       "shards[0].file_bytes: must be non-negative"},
      {"tensors array", [](json& m) { m["tensors"] = json::array(); },
       "tensors: expected an object, got an array"},
      {"tensor not object", [](json& m) { m["tensors"][kW13] = "x"; },
       t + ": expected an object, got \"x\""},
      {"empty tensor name", [](json& m) { m["tensors"][""] = m["tensors"][kW13]; },
       "tensors: a tensor has an empty name"},
      {"dtype", [](json& m) { m["tensors"][kW13]["dtype"] = "I33"; },
       t + ".dtype: unknown dtype \"I33\""},
      {"shape text", [](json& m) { m["tensors"][kW13]["shape"] = "[4, 16, 256]"; },
       t + ".shape: expected an array"},
      {"shape negative", [](json& m) { m["tensors"][kW13]["shape"][1] = -16; },
       t + ".shape[1]: must be >= 0, got -16"},
      {"shape overflow",
       [](json& m) {
         m["tensors"][kW13]["shape"] = {INT64_MAX, INT64_MAX, INT64_MAX};
       },
       t + ".shape: [9223372036854775807, 9223372036854775807, 9223372036854775807] of I32: the"},
      {"bytes", [](json& m) { m["tensors"][kW13]["bytes"] = 1; }, t + ".bytes: 1, but shape"},
      {"bytes negative", [](json& m) { m["tensors"][kW13]["bytes"] = -1; },
       t + ".bytes: must be non-negative"},
      {"sha short", [](json& m) { m["tensors"][kW13]["sha256"] = "abc"; },
       t + ".sha256: expected 64 lowercase hex digits, got \"abc\""},
      {"sha upper case",
       [](json& m) {
         std::string s = m["tensors"][kW13]["sha256"];
         for (auto& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
         m["tensors"][kW13]["sha256"] = s;
       },
       t + ".sha256: expected 64 lowercase hex digits"},
      {"sha not hex", [](json& m) { m["tensors"][kW13]["sha256"] = std::string(64, 'g'); },
       t + ".sha256: expected 64 lowercase hex digits"},
      {"action", [](json& m) { m["tensors"][kW13]["action"] = "move"; },
       t + ".action: expected \"convert\" or \"copy\", got \"move\""},
      {"sources", [](json& m) { m["tensors"][kW13]["sources"] = {nullptr}; },
       t + ".sources[0]: expected a string, got null"},
      {"codec missing", [](json& m) { m["tensors"][kW13].erase("codec"); }, t + ".codec: missing"},
      {"non-ASCII value, long",
       [](json& m) { m["layers"][0]["experts"] = std::string(200, 'x') + "\xc3\xa9"; },
       "layers[0].experts: expected an integer, got \"xxxxxxxx"},
  };
}

// A manifest from before --vllm-target followed vLLM@9aaf83ef and padded nothing.
TEST_F(RealManifest, WithoutVllmTargetReadsAs2026_05Unpadded) {
  json m = gptq_json();
  EXPECT_EQ(m["vllm_target"], "2026-05");  // converted with --vllm-target 2026-05 (act-order)
  m.erase("vllm_target");
  for (auto& l : m["layers"]) l.erase("inter_padded");
  const Manifest got = parse_manifest(m, "d/moepack.json");
  EXPECT_EQ(got.vllm_target, VllmTarget::kV2026_05);
  for (const auto& l : got.layers) EXPECT_EQ(l.inter_padded, l.inter);
  m["vllm_target"] = "0.33";
  EXPECT_EQ(parse_manifest(m, "d/moepack.json").vllm_target, VllmTarget::kV0_33);
}

// --vllm-target and --target-arch travel as enums (ConvertOptions, Plan, Manifest) and as names
// only where they are written -- moepack.json, config.json's blocks, part.json -- each read back
// by its one reader (vllm_target_from_name / target_arch_from_name): every target and arch round
// trips, and a name no row has (an alias too: aliases are for the flag) is refused naming the
// field.
TEST_F(RealManifest, VllmTargetAndArchRoundTripThroughManifestConfigAndPartJson) {
  const Converted& c = gptq();
  const json cfg = json::parse(slurp(c.dst + "/config.json"));
  for (const json& block : {cfg["moepack"], cfg["quantization_config"]}) {
    EXPECT_EQ(block["vllm_target"], vllm_target_name(c.plan.vllm_target));
    EXPECT_EQ(block["target_arch"], target_arch_name(c.plan.arch));
  }
  EXPECT_EQ(c.plan.vllm_target, VllmTarget::kV2026_05);  // converted with --vllm-target 2026-05
  int cases = 0;
  for (const VllmTargetRow& row : vllm_target_rows())
    for (const TargetArch arch : all_target_archs()) {
      SCOPED_TRACE(std::string(row.name) + " " + target_arch_name(arch));
      json m = gptq_json();
      m["vllm_target"] = row.name;
      m["target_arch"] = target_arch_name(arch);
      const Manifest got = parse_manifest(m, "d/moepack.json");
      EXPECT_EQ(got.vllm_target, row.target);
      EXPECT_EQ(got.target_arch, arch);
      EXPECT_EQ(to_json(got)["vllm_target"], row.name);
      EXPECT_EQ(to_json(got)["target_arch"], target_arch_name(arch));

      ConvertOptions o;
      o.vllm_target = row.target;
      o.target_arch = arch;
      const json part = part_options_json(o);
      EXPECT_EQ(part["vllm_target"], row.name);
      EXPECT_EQ(part["target_arch"], target_arch_name(arch));
      const ConvertOptions back = part_options_from_json(part, "p/part.json");
      EXPECT_EQ(back.vllm_target, row.target);
      EXPECT_EQ(back.target_arch, arch);
      ++cases;
    }
  EXPECT_GE(cases, 10);

  const json part = part_options_json(ConvertOptions());
  for (const auto& [key, bad] : {std::pair<const char*, const char*>{"target_arch", "sm90a"},
                                 {"target_arch", "sm75"},
                                 {"vllm_target", "0.34"}}) {
    SCOPED_TRACE(std::string(key) + " " + bad);
    json p = part;
    p[key] = bad;
    const Error e =
        expect_error([&] { part_options_from_json(p, "p/part.json"); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), "p/part.json");
    EXPECT_NE(e.message().find(std::string("options.") + key), std::string::npos) << e.message();
    json m = gptq_json();
    m[key] = bad;
    const Error me =
        expect_error([&] { parse_manifest(m, "d/moepack.json"); }, ErrorCode::kBadConfig);
    EXPECT_EQ(me.message().rfind(key, 0), 0u) << me.message();
  }
}

// A manifest written before version 2 (no serving, no param_roles) still reads, and writes back
// as it was.
TEST_F(RealManifest, Version1ReadsWithoutServingAndRoles) {
  for (const auto& c : converted_) {
    SCOPED_TRACE(c->name);
    json m = json::parse(slurp(manifest_path(c->dst)));
    m["manifest_version"] = 1;
    m.erase("serving");
    m.erase("config");
    m["source"].erase("tensor_sha256");
    m["source"]["name"] = "src";
    for (auto& l : m["layers"]) l.erase("param_roles");
    const Manifest got = parse_manifest(m, "v1/moepack.json");
    EXPECT_EQ(got.manifest_version, 1);
    EXPECT_FALSE(got.serving.has_value());
    EXPECT_TRUE(got.config.is_null());
    for (const auto& l : got.layers) EXPECT_TRUE(l.param_roles.empty());
    EXPECT_EQ(to_json(got).dump(2), m.dump(2));
  }
}

// A manifest written before version 3 (source.name, no "config") still reads and writes back as
// it was; it needs source.name, which version 3 dropped (bytes depend only on the source's bytes).
TEST_F(RealManifest, Version2ReadsWithSourceNameWithoutConfig) {
  json m = gptq_json();
  EXPECT_FALSE(m["source"].contains("name"));
  m["manifest_version"] = 2;
  m.erase("config");
  m["source"].erase("tensor_sha256");
  m["source"]["name"] = "Qwen3-30B-A3B-GPTQ";
  const Manifest got = parse_manifest(m, "v2/moepack.json");
  EXPECT_EQ(got.source.name, "Qwen3-30B-A3B-GPTQ");
  EXPECT_TRUE(got.config.is_null());
  EXPECT_EQ(to_json(got).dump(2), m.dump(2));
  m["source"].erase("name");
  try {
    parse_manifest(m, "v2/moepack.json");
    ADD_FAILURE() << "a version 2 manifest without source.name was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "source.name: missing") << e.message();
  }
}

// A manifest written before version 4 (no source fingerprint) still reads and writes back as it
// was; version 4 requires it.
TEST_F(RealManifest, Version3ReadsWithoutSourceFingerprint) {
  json m = gptq_json();
  ASSERT_TRUE(m["source"]["tensor_sha256"].is_object());
  EXPECT_FALSE(m["source"]["tensor_sha256"].empty());
  m["manifest_version"] = 3;
  m["source"].erase("tensor_sha256");
  const Manifest got = parse_manifest(m, "v3/moepack.json");
  EXPECT_TRUE(got.source.tensor_sha256.empty());
  EXPECT_EQ(to_json(got).dump(2), m.dump(2));
}

TEST_F(RealManifest, EveryDefectIsBadConfigNamingTheField) {
  const json good = gptq_json();
  ASSERT_TRUE(good["tensors"].contains(kW13));
  ASSERT_EQ(good["tensors"][kW13]["dtype"], "I32");
  ASSERT_EQ(good["layers"].size(), 2u);
  ASSERT_EQ(good["shards"].size(), 1u);
  ASSERT_FALSE(good.contains("quantize"));
  test::TempDir dir;
  std::vector<Mutation> all = mutations(good);
  for (Mutation& mu : serving_and_role_mutations()) all.push_back(std::move(mu));
  for (Mutation& mu : provenance_mutations()) all.push_back(std::move(mu));
  for (const Mutation& mu : all) {
    SCOPED_TRACE(mu.what);
    json m = good;
    mu.apply(m);
    ASSERT_TRUE(m.dump() != good.dump()) << "the mutation changed nothing";
    const Error e =
        expect_error([&] { parse_manifest(m, "d/moepack.json"); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), "d/moepack.json");
    EXPECT_EQ(e.message().rfind(mu.message, 0), 0u)
        << "message: " << e.message() << "\nexpected it to start with: " << mu.message;
    // The same through the file, as verify and inspect read it.
    std::ofstream(manifest_path(dir.path)) << m.dump(2) << "\n";
    const Error f = expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_EQ(f.file(), manifest_path(dir.path));
    EXPECT_EQ(f.message(), e.message());
  }
}

TEST_F(RealManifest, UnknownKeysAreIgnored) {
  json m = gptq_json();
  m["written_by_a_newer_moepack"] = {{"x", 1}};
  m["layers"][0]["note"] = "extra";
  const Manifest parsed = parse_manifest(m, "moepack.json");
  EXPECT_EQ(to_json(parsed), gptq_json());
}

TEST(Manifest, ReadManifestFileErrors) {
  test::TempDir dir;
  const std::string path = manifest_path(dir.path);
  EXPECT_EQ(path, dir / "moepack.json");
  {  // missing
    const Error e = expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(e.message().find("not a moepack-converted checkpoint"), std::string::npos);
  }
  {  // not JSON; truncated JSON
    for (const char* text : {"", "not json", "{\"manifest_version\": 1,", "{} trailing"}) {
      std::ofstream(path) << text;
      const Error e = expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
      EXPECT_EQ(e.file(), path);
      EXPECT_EQ(e.message().rfind("invalid JSON", 0), 0u) << e.message();
    }
  }
  {  // valid JSON, nearly empty
    std::ofstream(path) << "{\"manifest_version\": " << kManifestVersion << "}";
    const Error e = expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.message(), "tool: missing");
    std::ofstream(path) << "{\"manifest_version\": 99}";
    expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
  }
  {  // nested deeper than any manifest: refused while parsing, no stack overflow later
    std::ofstream(path) << std::string(1000000, '[') << std::string(1000000, ']');
    const Error e = expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_NE(e.message().find("nested more than"), std::string::npos) << e.message();
  }
  {  // larger than the cap: refused from its size (a sparse file, no disk used)
    fs::remove(path);
    std::ofstream(path).close();
    fs::resize_file(path, kMaxManifestBytes + 1);
    const Error e = expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_NE(e.message().find("larger than"), std::string::npos) << e.message();
    fs::remove(path);
  }
  {  // a directory
    fs::create_directory(path);
    const Error e = expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(e.message().find("directory"), std::string::npos) << e.message();
    fs::remove(path);
  }
  {  // a FIFO with no writer: refused without blocking
    ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
    const Error e = expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(e.message().find("not a regular file"), std::string::npos) << e.message();
    fs::remove(path);
  }
  {  // a symlink to a regular file is followed; a dangling one is missing
    fs::create_symlink(dir / "nowhere.json", path);
    expect_error([&] { read_manifest(dir.path); }, ErrorCode::kBadConfig);
    fs::remove(path);
  }
  if (::geteuid() != 0) {  // unreadable (root reads anything)
    std::ofstream(path) << "{}";
    fs::permissions(path, fs::perms::none);
    const Error e = expect_error([&] { read_manifest(dir.path); }, ErrorCode::kIo);
    EXPECT_EQ(e.file(), path);
    fs::permissions(path, fs::perms::owner_all);
  }
}

}  // namespace
}  // namespace moepack
