// HF config normalisation: every quantization_config shape moepack meets in real checkpoints
// (spec/checkpoints.md §3.3), the side files (hf_quant_config.json, quantize_config.json), the
// refusals (kUnsupported listing the supported formats, kBadConfig naming the file), and the
// text_config nesting of multimodal MoE models.
#include "model/hf_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::expect_error;

using nlohmann::json;
using test::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  ASSERT_TRUE(static_cast<bool>(f)) << path;
}

json base_config() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"hidden_size", 256},
          {"intermediate_size", 512},
          {"moe_intermediate_size", 128},
          {"num_experts", 8},
          {"num_experts_per_tok", 2},
          {"num_hidden_layers", 2},
          {"hidden_act", "silu"},
          {"torch_dtype", "bfloat16"}};
}

QuantParams norm(const json& qc, DType dtype = DType::kBF16) {
  return normalize_quant_config(qc, "config.json", dtype);
}

// Runs `fn`, expects a moepack::Error with `code`; returns it for further checks.
bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

// ---------------------------------------------------------------------------------------- GPTQ

TEST(HfConfigGptq, V1Symmetric) {
  const QuantParams p = norm({{"quant_method", "gptq"},
                              {"bits", 4},
                              {"group_size", 128},
                              {"desc_act", false},
                              {"sym", true},
                              {"damp_percent", 0.01},
                              {"true_sequential", true},
                              {"static_groups", false},
                              {"checkpoint_format", "gptq"}});
  EXPECT_EQ(p.method, QuantMethod::kGptq);
  EXPECT_EQ(p.bits, 4);
  EXPECT_EQ(p.group_size, 128);
  EXPECT_FALSE(p.act_order);
  EXPECT_TRUE(p.symmetric);
  EXPECT_EQ(p.gptq_format, GptqFormat::kV1);
  EXPECT_EQ(p.dtype, DType::kBF16);
}

TEST(HfConfigGptq, NoCheckpointFormatMeansV1) {
  const QuantParams p = norm({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 64}});
  EXPECT_EQ(p.gptq_format, GptqFormat::kV1);
  EXPECT_EQ(p.group_size, 64);
  EXPECT_TRUE(p.symmetric);  // AutoGPTQ's default
  EXPECT_FALSE(p.act_order);
}

TEST(HfConfigGptq, V2ViaCheckpointFormatOrGptqModelFormat) {
  EXPECT_EQ(norm({{"quant_method", "gptq"},
                  {"bits", 4},
                  {"group_size", 128},
                  {"checkpoint_format", "gptq_v2"}})
                .gptq_format,
            GptqFormat::kV2);
  // GPTQModel writes "format" (and "method") instead of checkpoint_format.
  EXPECT_EQ(norm({{"quant_method", "gptq"},
                  {"method", "gptq"},
                  {"bits", 4},
                  {"group_size", 128},
                  {"format", "gptq_v2"},
                  {"pack_dtype", "int32"}})
                .gptq_format,
            GptqFormat::kV2);
  // Upper case from hand-edited configs.
  EXPECT_EQ(norm({{"quant_method", "GPTQ"},
                  {"bits", 4},
                  {"group_size", 128},
                  {"checkpoint_format", "GPTQ_V2"}})
                .gptq_format,
            GptqFormat::kV2);
}

TEST(HfConfigGptq, DescActAsymAnd8Bit) {
  const QuantParams a = norm({{"quant_method", "gptq"},
                              {"bits", 4},
                              {"group_size", 128},
                              {"desc_act", true},
                              {"sym", true}});
  EXPECT_TRUE(a.act_order);
  const QuantParams b = norm({{"quant_method", "gptq"},
                              {"bits", 4},
                              {"group_size", 32},
                              {"desc_act", false},
                              {"sym", false}});
  EXPECT_FALSE(b.symmetric);
  EXPECT_EQ(b.group_size, 32);
  const QuantParams c = norm({{"quant_method", "gptq"},
                              {"bits", 8},
                              {"group_size", -1},
                              {"desc_act", true},
                              {"sym", true}},
                             DType::kF16);
  EXPECT_EQ(c.bits, 8);
  EXPECT_EQ(c.group_size, -1);
  EXPECT_TRUE(c.act_order);
  EXPECT_EQ(c.dtype, DType::kF16);
}

TEST(HfConfigGptq, QuantizeConfigJsonWithoutQuantMethod) {
  TempDir dir;
  write_text(dir / "config.json", base_config().dump());
  write_text(dir / "quantize_config.json", json({{"bits", 4},
                                                 {"group_size", 128},
                                                 {"desc_act", true},
                                                 {"sym", true},
                                                 {"damp_percent", 0.01},
                                                 {"model_file_base_name", "model"}})
                                               .dump());
  const HfConfig c = load_hf_config(dir.path);
  EXPECT_EQ(c.quant.method, QuantMethod::kGptq);
  EXPECT_EQ(c.quant.bits, 4);
  EXPECT_EQ(c.quant.group_size, 128);
  EXPECT_TRUE(c.quant.act_order);
  EXPECT_TRUE(contains(c.quant_file, "quantize_config.json")) << c.quant_file;
  EXPECT_EQ(c.quant_raw.value("bits", 0), 4);
}

TEST(HfConfigGptq, ConfigJsonWinsOverQuantizeConfigJson) {
  TempDir dir;
  json cfg = base_config();
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 8}, {"group_size", 64}};
  write_text(dir / "config.json", cfg.dump());
  write_text(dir / "quantize_config.json", json({{"bits", 4}, {"group_size", 128}}).dump());
  const HfConfig c = load_hf_config(dir.path);
  EXPECT_EQ(c.quant.bits, 8);
  EXPECT_EQ(c.quant.group_size, 64);
  EXPECT_TRUE(contains(c.quant_file, "config.json") && !contains(c.quant_file, "quantize_config"))
      << c.quant_file;
}

TEST(HfConfigGptq, LegacyMarlinRefused) {
  Error e = expect_error(
      [] {
        norm({{"quant_method", "gptq"},
              {"bits", 4},
              {"group_size", 128},
              {"checkpoint_format", "marlin"}});
      },
      ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.message(), "Marlin")) << e.message();
  e = expect_error(
      [] {
        norm({{"quant_method", "gptq"},
              {"bits", 4},
              {"group_size", 128},
              {"is_marlin_format", true}});
      },
      ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.message(), "Marlin")) << e.message();
}

TEST(HfConfigGptq, BadBitsAndUnknownFormat) {
  Error e = expect_error(
      [] {
        norm({{"quant_method", "gptq"}, {"bits", 3}, {"group_size", 128}});
      },
      ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.message(), "bits=3")) << e.message();
  e = expect_error(
      [] {
        norm({{"quant_method", "gptq"},
              {"bits", 4},
              {"group_size", 128},
              {"checkpoint_format", "exllama"}});
      },
      ErrorCode::kBadConfig);
  EXPECT_TRUE(contains(e.message(), "exllama")) << e.message();
}

// ----------------------------------------------------------------------------------------- AWQ

TEST(HfConfigAwq, GemmWithZeroPoints) {
  const QuantParams p = norm({{"quant_method", "awq"},
                              {"bits", 4},
                              {"group_size", 128},
                              {"zero_point", true},
                              {"version", "gemm"},
                              {"modules_to_not_convert", nullptr}},
                             DType::kF16);
  EXPECT_EQ(p.method, QuantMethod::kAwq);
  EXPECT_EQ(p.bits, 4);
  EXPECT_EQ(p.group_size, 128);
  EXPECT_FALSE(p.symmetric);
  EXPECT_EQ(p.dtype, DType::kF16);
}

TEST(HfConfigAwq, AutoAwqKeyNames) {
  // AutoAWQ's own quant_config.json spells them w_bit / q_group_size and "GEMM".
  const QuantParams p = norm({{"quant_method", "awq"},
                              {"w_bit", 4},
                              {"q_group_size", 64},
                              {"zero_point", true},
                              {"version", "GEMM"}});
  EXPECT_EQ(p.bits, 4);
  EXPECT_EQ(p.group_size, 64);
}

TEST(HfConfigAwq, OtherVersionsRefused) {
  for (const char* v : {"gemv", "gemv_fast", "exllama", "marlin", "ipex"}) {
    SCOPED_TRACE(v);
    const Error e = expect_error(
        [&] {
          norm({{"quant_method", "awq"},
                {"bits", 4},
                {"group_size", 128},
                {"zero_point", true},
                {"version", v}});
        },
        ErrorCode::kUnsupported);
    EXPECT_TRUE(contains(e.message(), v)) << e.message();
  }
}

TEST(HfConfigAwq, NoZeroPointReadsStoredZeros) {
  // auto-round's auto_awq export of a symmetric scheme says zero_point false and still stores
  // qzeros (2^(bits-1)); vLLM's AWQ path reads them like any others (issue 11, item 5).
  const QuantParams p = norm({{"quant_method", "awq"},
                              {"bits", 4},
                              {"group_size", 128},
                              {"zero_point", false},
                              {"version", "gemm"}});
  EXPECT_EQ(p.method, QuantMethod::kAwq);
  EXPECT_FALSE(p.symmetric);
}

TEST(HfConfigAwq, EightBitAndNoGroupRefused) {
  expect_error(
      [] {
        norm({{"quant_method", "awq"},
              {"bits", 8},
              {"group_size", 128},
              {"zero_point", true},
              {"version", "gemm"}});
      },
      ErrorCode::kUnsupported);
  expect_error(
      [] {
        norm({{"quant_method", "awq"},
              {"bits", 4},
              {"group_size", -1},
              {"zero_point", true},
              {"version", "gemm"}});
      },
      ErrorCode::kBadConfig);
}

// --------------------------------------------------------------------------- compressed-tensors

json ct_config(const std::string& format, json weights, json input_activations = nullptr) {
  return {{"quant_method", "compressed-tensors"},
          {"format", format},
          {"quantization_status", "compressed"},
          {"ignore", {"lm_head", "re:.*mlp.gate$"}},
          {"kv_cache_scheme", nullptr},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", std::move(weights)},
              {"input_activations", std::move(input_activations)},
              {"output_activations", nullptr}}}}}};
}

json int_weights(int bits, const std::string& strategy, json group_size, json actorder = nullptr,
                 bool symmetric = true) {
  return {{"num_bits", bits},         {"type", "int"},
          {"symmetric", symmetric},   {"strategy", strategy},
          {"group_size", group_size}, {"dynamic", false},
          {"actorder", actorder},     {"block_structure", nullptr},
          {"observer", "minmax"}};
}

TEST(HfConfigCt, PackQuantizedGroup) {
  const QuantParams p = norm(ct_config("pack-quantized", int_weights(4, "group", 128)));
  EXPECT_EQ(p.method, QuantMethod::kCtPackQuantized);
  EXPECT_EQ(p.bits, 4);
  EXPECT_EQ(p.group_size, 128);
  EXPECT_TRUE(p.symmetric);
  EXPECT_FALSE(p.act_order);
  EXPECT_EQ(p.actorder, "");
}

TEST(HfConfigCt, PackQuantizedChannelW8A16) {
  const QuantParams p = norm(ct_config("pack-quantized", int_weights(8, "channel", nullptr)));
  EXPECT_EQ(p.method, QuantMethod::kCtPackQuantized);
  EXPECT_EQ(p.bits, 8);
  EXPECT_EQ(p.group_size, -1);
}

TEST(HfConfigCt, ActorderValues) {
  struct Case {
    json value;
    std::string actorder;
    bool act_order;
  };
  const Case cases[] = {{"group", "group", true},
                        {"weight", "weight", false},
                        {nullptr, "", false},
                        {true, "group", true},  // older compressed-tensors wrote a bool
                        {false, "", false}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.value.dump());
    const QuantParams p = norm(ct_config("pack-quantized", int_weights(4, "group", 32, c.value)));
    EXPECT_EQ(p.actorder, c.actorder);
    EXPECT_EQ(p.act_order, c.act_order);
    EXPECT_EQ(p.group_size, 32);
  }
}

TEST(HfConfigCt, Asymmetric) {
  const QuantParams p =
      norm(ct_config("pack-quantized", int_weights(4, "group", 128, nullptr, /*symmetric=*/false)));
  EXPECT_FALSE(p.symmetric);
  EXPECT_EQ(p.method, QuantMethod::kCtPackQuantized);
}

TEST(HfConfigCt, FormatInsideTheGroup) {
  // Mixed-format checkpoints put "format" into the scheme and "mixed-precision" at the top.
  json qc = ct_config("mixed-precision", int_weights(4, "group", 128));
  qc["config_groups"]["group_0"]["format"] = "pack-quantized";
  EXPECT_EQ(norm(qc).method, QuantMethod::kCtPackQuantized);
}

TEST(HfConfigCt, PackQuantizedWithActivationsRefused) {
  const json act = {{"num_bits", 8},
                    {"type", "int"},
                    {"symmetric", true},
                    {"strategy", "token"},
                    {"dynamic", true}};
  expect_error([&] { norm(ct_config("pack-quantized", int_weights(4, "group", 128), act)); },
               ErrorCode::kUnsupported);
}

TEST(HfConfigCt, PackQuantizedBadBitsAndStrategy) {
  expect_error([] { norm(ct_config("pack-quantized", int_weights(2, "group", 128))); },
               ErrorCode::kUnsupported);
  const Error e =
      expect_error([] { norm(ct_config("pack-quantized", int_weights(4, "tensor", nullptr))); },
                   ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.message(), "tensor")) << e.message();
}

TEST(HfConfigCt, IntQuantizedW8A8Dynamic) {
  const json act = {{"num_bits", 8},       {"type", "int"},   {"symmetric", true},
                    {"strategy", "token"}, {"dynamic", true}, {"observer", nullptr}};
  const QuantParams p = norm(ct_config("int-quantized", int_weights(8, "channel", nullptr), act));
  EXPECT_EQ(p.method, QuantMethod::kCtIntQuantized);
  EXPECT_EQ(p.bits, 8);
  EXPECT_EQ(p.group_size, -1);
  EXPECT_TRUE(p.dynamic_input);
}

TEST(HfConfigCt, IntQuantizedW8A8Static) {
  const json act = {{"num_bits", 8},        {"type", "int"},    {"symmetric", true},
                    {"strategy", "tensor"}, {"dynamic", false}, {"observer", "minmax"}};
  const QuantParams p = norm(ct_config("int-quantized", int_weights(8, "channel", nullptr), act));
  EXPECT_EQ(p.method, QuantMethod::kCtIntQuantized);
  EXPECT_FALSE(p.dynamic_input);
}

TEST(HfConfigCt, IntQuantizedFourBitRefused) {
  expect_error([] { norm(ct_config("int-quantized", int_weights(4, "channel", nullptr))); },
               ErrorCode::kUnsupported);
}

TEST(HfConfigCt, Mxfp8Quantized) {
  const json w = {{"num_bits", 8},       {"type", "float"},  {"symmetric", true},
                  {"strategy", "group"}, {"group_size", 32}, {"dynamic", false}};
  const QuantParams p = norm(ct_config("mxfp8-quantized", w));
  EXPECT_EQ(p.method, QuantMethod::kCtMxfp8);
  EXPECT_EQ(p.bits, 8);
  EXPECT_EQ(p.group_size, 32);
}

TEST(HfConfigCt, FloatQuantizedBlock) {
  const json w = {{"num_bits", 8},
                  {"type", "float"},
                  {"symmetric", true},
                  {"strategy", "block"},
                  {"block_structure", {128, 128}},
                  {"dynamic", false}};
  const json act = {{"num_bits", 8},
                    {"type", "float"},
                    {"strategy", "group"},
                    {"group_size", 128},
                    {"dynamic", true}};
  const QuantParams p = norm(ct_config("float-quantized", w, act));
  EXPECT_EQ(p.method, QuantMethod::kCtFp8Block);  // weight_scale BF16, not weight_scale_inv
  EXPECT_EQ(p.bits, 8);
  EXPECT_EQ(p.block_n, 128);
  EXPECT_EQ(p.block_k, 128);
  EXPECT_EQ(p.group_size, 128);
}

// A float-quantized strategy moepack reads no codec for (FP8 groups along K: vLLM 0.33 has no
// MoE method for them) is refused with the list of what is read.
TEST(HfConfigCt, FloatQuantizedGroupRefusedWithList) {
  const json w = {{"num_bits", 8},
                  {"type", "float"},
                  {"symmetric", true},
                  {"strategy", "group"},
                  {"group_size", 128}};
  const Error e =
      expect_error([&] { norm(ct_config("float-quantized", w)); }, ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.message(), supported_formats_text())) << e.message();
}

// llm-compressor's FP8_DYNAMIC (channel weights, dynamic per-token activations) and FP8 (tensor
// weights, static tensor activations): their own codecs (formats/fp8_scaled.h).
TEST(HfConfigCt, FloatQuantizedChannelAndTensor) {
  const json ch = {
      {"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", "channel"}};
  const json token = {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}};
  const QuantParams c = norm(ct_config("float-quantized", ch, token));
  EXPECT_EQ(c.method, QuantMethod::kCtFp8Channel);
  EXPECT_EQ(c.bits, 8);
  EXPECT_EQ(c.group_size, -1);
  EXPECT_TRUE(c.dynamic_input);
  const json te = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", "tensor"}};
  const json stat = {
      {"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}};
  const QuantParams t = norm(ct_config("float-quantized", te, stat));
  EXPECT_EQ(t.method, QuantMethod::kCtFp8Tensor);
  EXPECT_FALSE(t.dynamic_input);
  const json w4 = {{"num_bits", 4}, {"type", "float"}, {"strategy", "channel"}};
  expect_error([&] { norm(ct_config("float-quantized", w4)); }, ErrorCode::kBadConfig);
}

TEST(HfConfigCt, Fp4PackQuantized) {
  // llm-compressor's NVFP4A16 (weights only) and NVFP4 (W4A4, "dynamic": "local" activations).
  const json w = {{"num_bits", 4},     {"type", "float"},
                  {"symmetric", true}, {"strategy", "tensor_group"},
                  {"group_size", 16},  {"dynamic", false}};
  const QuantParams a16 = norm(ct_config("nvfp4-pack-quantized", w));
  EXPECT_EQ(a16.method, QuantMethod::kCtNvfp4);
  EXPECT_EQ(a16.bits, 4);
  EXPECT_EQ(a16.group_size, 16);
  const json act = {{"num_bits", 4},     {"type", "float"},
                    {"symmetric", true}, {"strategy", "tensor_group"},
                    {"group_size", 16},  {"dynamic", "local"}};
  EXPECT_TRUE(a16.dynamic_input);  // weight-only: no activation global scale
  const QuantParams w4a4 = norm(ct_config("nvfp4-pack-quantized", w, act));
  EXPECT_EQ(w4a4.method, QuantMethod::kCtNvfp4);
  EXPECT_FALSE(w4a4.dynamic_input);  // W4A4: input_global_scale on every Linear
  json mx = w;
  mx["strategy"] = "group";
  mx["group_size"] = 32;
  const QuantParams m = norm(ct_config("mxfp4-pack-quantized", mx));
  EXPECT_EQ(m.method, QuantMethod::kCtMxfp4);
  EXPECT_EQ(m.group_size, 32);
  // Malformed: a group size the format does not have, int weights, the wrong strategy.
  json g32 = w;
  g32["group_size"] = 32;
  expect_error([&] { norm(ct_config("nvfp4-pack-quantized", g32)); }, ErrorCode::kBadConfig);
  json integer = w;
  integer["type"] = "int";
  expect_error([&] { norm(ct_config("nvfp4-pack-quantized", integer)); }, ErrorCode::kBadConfig);
  json strat = mx;
  strat["strategy"] = "tensor_group";
  expect_error([&] { norm(ct_config("mxfp4-pack-quantized", strat)); }, ErrorCode::kBadConfig);
}

TEST(HfConfigCt, AsymmetricNvFp4Refused) {
  const json w = {{"num_bits", 4},
                  {"type", "float"},
                  {"symmetric", false},
                  {"strategy", "tensor_group"},
                  {"group_size", 16}};
  const Error e =
      expect_error([&] { norm(ct_config("nvfp4-pack-quantized", w)); }, ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.message(), "nvfp4-pack-quantized")) << e.message();
  EXPECT_TRUE(contains(e.message(), "asymmetric")) << e.message();
}

// gpt-oss' own MXFP4 (openai/gpt-oss-20b's quantization_config, verbatim).
TEST(HfConfigGptOss, Mxfp4) {
  const json qc = {
      {"modules_to_not_convert",
       {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
      {"quant_method", "mxfp4"}};
  const QuantParams p = norm(qc);
  EXPECT_EQ(p.method, QuantMethod::kGptOssMxfp4);
  EXPECT_EQ(p.bits, 4);
  EXPECT_EQ(p.group_size, 32);
  EXPECT_EQ(norm({{"quant_method", "MXFP4"}}).method, QuantMethod::kGptOssMxfp4);
  const Error e = expect_error(
      [&] {
        norm({{"quant_method", "mxfp4"}, {"modules_to_not_convert", "lm_head"}});
      },
      ErrorCode::kBadConfig);
  EXPECT_TRUE(contains(e.message() + e.tensor(), "modules_to_not_convert")) << e.what();
  expect_error(
      [&] {
        norm({{"quant_method", "mxfp4"}, {"modules_to_not_convert", {1}}});
      },
      ErrorCode::kBadConfig);
}

// modules_to_not_convert as transformers' should_convert_module matches it: a regex at the start
// followed by a dot, the whole regex at the start, or the name ending with the entry.
TEST(HfConfigGptOss, ModulesToNotConvert) {
  HfConfig c;
  c.quant_raw = {{"quant_method", "mxfp4"},
                 {"modules_to_not_convert", {"model.layers.*.self_attn", "lm_head", "experts"}}};
  c.quant_file = "config.json";
  EXPECT_EQ(module_not_converted(c, "model.layers.3.self_attn"), "model.layers.*.self_attn");
  EXPECT_EQ(module_not_converted(c, "model.layers.3.self_attn.q_proj"), "model.layers.*.self_attn");
  EXPECT_EQ(module_not_converted(c, "lm_head"), "lm_head");
  EXPECT_EQ(module_not_converted(c, "model.layers.0.mlp.experts"), "experts");
  c.quant_raw["modules_to_not_convert"] = {"model.layers.*.self_attn", "lm_head"};
  EXPECT_EQ(module_not_converted(c, "model.layers.0.mlp.experts"), "");
  c.quant_raw["modules_to_not_convert"] = {"model.layers.*.mlp"};
  EXPECT_EQ(module_not_converted(c, "model.layers.0.mlp.experts"), "model.layers.*.mlp");
  c.quant_raw.erase("modules_to_not_convert");
  EXPECT_EQ(module_not_converted(c, "model.layers.0.mlp.experts"), "");
}

TEST(HfConfigCt, MissingConfigGroups) {
  json qc = ct_config("pack-quantized", int_weights(4, "group", 128));
  qc.erase("config_groups");
  Error e = expect_error([&] { norm(qc); }, ErrorCode::kBadConfig);
  EXPECT_TRUE(contains(e.message(), "config_groups")) << e.message();
  qc["config_groups"] = json::object();
  expect_error([&] { norm(qc); }, ErrorCode::kBadConfig);
}

TEST(HfConfigCt, MissingNumBitsIsBadConfig) {
  json w = int_weights(4, "group", 128);
  w.erase("num_bits");
  const Error e =
      expect_error([&] { norm(ct_config("pack-quantized", w)); }, ErrorCode::kBadConfig);
  EXPECT_TRUE(contains(e.message(), "num_bits")) << e.message();
  EXPECT_EQ(e.file(), "config.json");
}

TEST(HfConfigCt, MalformedBlockStructureIsBadConfig) {
  const json w = {
      {"num_bits", 8}, {"type", "float"}, {"strategy", "block"}, {"block_structure", {"128", "x"}}};
  expect_error([&] { norm(ct_config("float-quantized", w)); }, ErrorCode::kBadConfig);
  const json w2 = {
      {"num_bits", 8}, {"type", "float"}, {"strategy", "block"}, {"block_structure", {128, 0}}};
  expect_error([&] { norm(ct_config("float-quantized", w2)); }, ErrorCode::kBadConfig);
}

TEST(HfConfigCt, NullWeightsIsBadConfig) {
  json qc = ct_config("pack-quantized", nullptr);
  expect_error([&] { norm(qc); }, ErrorCode::kBadConfig);
}

// ------------------------------------------------------------------------------------ ModelOpt

TEST(HfConfigModelopt, FlatConfigJson) {
  TempDir dir;
  json cfg = base_config();
  cfg["quantization_config"] = {
      {"quant_method", "modelopt"},
      {"quant_algo", "MXFP8"},
      {"ignore", {"lm_head"}},
      {"kv_cache_scheme", {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}}},
      {"producer", {{"name", "modelopt"}, {"version", "0.41.0"}}}};
  write_text(dir / "config.json", cfg.dump());
  const HfConfig c = load_hf_config(dir.path);
  EXPECT_EQ(c.quant.method, QuantMethod::kModeloptMxfp8);
  EXPECT_EQ(c.quant.bits, 8);
  EXPECT_EQ(c.quant.group_size, 32);
  EXPECT_TRUE(contains(c.quant_file, "config.json")) << c.quant_file;
}

TEST(HfConfigModelopt, NestedQuantization) {
  const QuantParams p =
      norm({{"quant_method", "modelopt"},
            {"quantization",
             {{"quant_algo", "MXFP8"}, {"kv_cache_quant_algo", "FP8"}, {"group_size", 32}}}});
  EXPECT_EQ(p.method, QuantMethod::kModeloptMxfp8);
  EXPECT_EQ(p.group_size, 32);
}

TEST(HfConfigModelopt, HfQuantConfigSideFile) {
  TempDir dir;
  write_text(dir / "config.json", base_config().dump());  // no quantization_config
  write_text(dir / "hf_quant_config.json",
             json({{"producer", {{"name", "modelopt"}, {"version", "0.37.0"}}},
                   {"quantization",
                    {{"quant_algo", "MXFP8"},
                     {"kv_cache_quant_algo", "FP8"},
                     {"group_size", 32},
                     {"exclude_modules", {"lm_head"}}}}})
                 .dump());
  const HfConfig c = load_hf_config(dir.path);
  EXPECT_EQ(c.quant.method, QuantMethod::kModeloptMxfp8);
  EXPECT_EQ(c.quant.group_size, 32);
  EXPECT_TRUE(contains(c.quant_file, "hf_quant_config.json")) << c.quant_file;
  EXPECT_TRUE(c.quant_raw.contains("producer"));
}

TEST(HfConfigModelopt, VllmMethodNames) {
  EXPECT_EQ(norm({{"quant_method", "modelopt_mxfp8"}}).method, QuantMethod::kModeloptMxfp8);
  EXPECT_EQ(norm({{"quant_method", "modelopt_fp8"}}).method, QuantMethod::kModeloptFp8);
}

TEST(HfConfigModelopt, Fp8AlgoRecognised) {
  const QuantParams a = norm({{"quant_method", "modelopt"}, {"quant_algo", "FP8"}});
  EXPECT_FALSE(a.dynamic_input);  // ModelOpt FP8 calibrates static input scales
  EXPECT_EQ(a.method, QuantMethod::kModeloptFp8);
  EXPECT_EQ(a.bits, 8);
  const QuantParams b =
      norm({{"producer", {{"name", "modelopt"}}},
            {"quantization", {{"quant_algo", "FP8"}, {"kv_cache_quant_algo", nullptr}}}});
  EXPECT_EQ(b.method, QuantMethod::kModeloptFp8);
}

TEST(HfConfigModelopt, Nvfp4) {
  for (const char* algo : {"NVFP4", "W4A16_NVFP4", "nvfp4"}) {
    const QuantParams p =
        norm({{"quant_method", "modelopt"}, {"quant_algo", algo}, {"group_size", 16}});
    EXPECT_EQ(p.method, QuantMethod::kModeloptNvfp4) << algo;
    EXPECT_EQ(p.group_size, 16) << algo;
    // NVFP4 is W4A4 (input_scale per Linear), W4A16_NVFP4 weight-only.
    EXPECT_EQ(p.dynamic_input, std::string(algo) == "W4A16_NVFP4") << algo;
  }
  const QuantParams side = norm({{"producer", {{"name", "modelopt"}}},
                                 {"quantization", {{"quant_algo", "NVFP4"}, {"group_size", 16}}}});
  EXPECT_EQ(side.method, QuantMethod::kModeloptNvfp4);
  EXPECT_EQ(norm({{"quant_method", "modelopt_fp4"}}).method, QuantMethod::kModeloptNvfp4);
  expect_error(
      [] {
        norm({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 32}});
      },
      ErrorCode::kBadConfig);
}

TEST(HfConfigModelopt, OtherAlgosRefused) {
  const Error e = expect_error(
      [] {
        norm({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4_AWQ"}, {"group_size", 16}});
      },
      ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.message(), "NVFP4_AWQ")) << e.message();
  EXPECT_TRUE(contains(e.message(), supported_formats_text())) << e.message();
  expect_error([] { norm({{"quant_method", "modelopt"}}); }, ErrorCode::kBadConfig);
  expect_error(
      [] {
        norm({{"quant_method", "modelopt"}, {"quant_algo", "MXFP8"}, {"group_size", 16}});
      },
      ErrorCode::kBadConfig);
}

// ----------------------------------------------------------------------------------- FP8 block

TEST(HfConfigFp8, BlockScaled) {
  const QuantParams p = norm({{"quant_method", "fp8"},
                              {"fmt", "e4m3"},
                              {"activation_scheme", "dynamic"},
                              {"weight_block_size", {128, 128}}});
  EXPECT_EQ(p.method, QuantMethod::kFp8Block);
  EXPECT_EQ(p.block_n, 128);
  EXPECT_EQ(p.block_k, 128);
  EXPECT_EQ(p.group_size, 128);
  EXPECT_EQ(p.bits, 8);
  EXPECT_TRUE(p.dynamic_input);
}

TEST(HfConfigFp8, NonSquareBlockAndStaticActivations) {
  const QuantParams p = norm(
      {{"quant_method", "fp8"}, {"activation_scheme", "static"}, {"weight_block_size", {64, 128}}});
  EXPECT_EQ(p.block_n, 64);
  EXPECT_EQ(p.block_k, 128);
  EXPECT_FALSE(p.dynamic_input);
}

TEST(HfConfigFp8, PerTensorRefusedAndMalformedBlock) {
  const Error e = expect_error(
      [] {
        norm({{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}});
      },
      ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(e.message(), "weight_block_size")) << e.message();
  expect_error(
      [] {
        norm({{"quant_method", "fp8"}, {"weight_block_size", {128}}});
      },
      ErrorCode::kBadConfig);
  expect_error(
      [] {
        norm({{"quant_method", "fp8"}, {"weight_block_size", {128, 0}}});
      },
      ErrorCode::kBadConfig);
  expect_error(
      [] {
        norm({{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}});
      },
      ErrorCode::kBadConfig);
}

// ---------------------------------------------------------------------- unknown and malformed

TEST(HfConfigErrors, UnknownQuantMethodListsSupportedFormats) {
  // (mxfp4, gpt-oss' own, is read since issue 26: HfConfigGptOss.Mxfp4.)
  for (const char* m : {"bitsandbytes", "quark", "hqq", "exl2"}) {
    SCOPED_TRACE(m);
    const Error e = expect_error(
        [&] {
          norm({{"quant_method", m}, {"bits", 4}});
        },
        ErrorCode::kUnsupported);
    EXPECT_TRUE(contains(e.message(), m)) << e.message();
    for (const char* fmt : {"gptq", "awq", "compressed-tensors", "modelopt", "fp8"})
      EXPECT_TRUE(contains(e.message(), fmt)) << fmt << " missing from: " << e.message();
    EXPECT_EQ(e.exit_code(), ExitCode::kUnsupported);
  }
}

TEST(HfConfigErrors, NotAnObjectNamesTheFile) {
  TempDir dir;
  json cfg = base_config();
  cfg["quantization_config"] = "gptq";
  write_text(dir / "config.json", cfg.dump());
  const Error e = expect_error([&] { load_hf_config(dir.path); }, ErrorCode::kBadConfig);
  EXPECT_EQ(e.file(), dir / "config.json");
  EXPECT_TRUE(contains(e.what(), dir / "config.json")) << e.what();
  EXPECT_EQ(e.exit_code(), ExitCode::kInvalidInput);
}

TEST(HfConfigErrors, BitsMissingNamesFileAndKey) {
  TempDir dir;
  json cfg = base_config();
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"group_size", 128}};
  write_text(dir / "config.json", cfg.dump());
  const Error e = expect_error([&] { load_hf_config(dir.path); }, ErrorCode::kBadConfig);
  EXPECT_EQ(e.file(), dir / "config.json");
  EXPECT_TRUE(contains(e.message(), "bits")) << e.message();
}

TEST(HfConfigErrors, GroupSizeZeroOrInvalid) {
  TempDir dir;
  write_text(dir / "config.json", base_config().dump());
  write_text(dir / "quantize_config.json", json({{"bits", 4}, {"group_size", 0}}).dump());
  const Error e = expect_error([&] { load_hf_config(dir.path); }, ErrorCode::kBadConfig);
  EXPECT_EQ(e.file(), dir / "quantize_config.json");
  EXPECT_TRUE(contains(e.message(), "group_size")) << e.message();
  expect_error(
      [] {
        norm({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", -7}});
      },
      ErrorCode::kBadConfig);
  expect_error(
      [] {
        norm({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", "128"}});
      },
      ErrorCode::kBadConfig);
  expect_error(
      [] {
        norm({{"quant_method", "gptq"}, {"bits", "4"}, {"group_size", 128}});
      },
      ErrorCode::kBadConfig);
}

TEST(HfConfigErrors, WrongTypedFlagsAreBadConfig) {
  // Never a bare nlohmann exception (which main() would report as an internal bug).
  expect_error(
      [] {
        norm({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"desc_act", "yes"}});
      },
      ErrorCode::kBadConfig);
  expect_error(
      [] {
        norm({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"sym", 1}});
      },
      ErrorCode::kBadConfig);
  expect_error(
      [] {
        norm({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"zero_point", "true"}});
      },
      ErrorCode::kBadConfig);
  json w = int_weights(4, "group", 128);
  w["symmetric"] = "true";
  expect_error([&] { norm(ct_config("pack-quantized", w)); }, ErrorCode::kBadConfig);
  // null means "not given": the defaults apply.
  const QuantParams p = norm({{"quant_method", "gptq"},
                              {"bits", 4},
                              {"group_size", 128},
                              {"desc_act", nullptr},
                              {"sym", nullptr}});
  EXPECT_FALSE(p.act_order);
  EXPECT_TRUE(p.symmetric);
}

TEST(HfConfigErrors, NoQuantMethodIsBadConfig) {
  expect_error([] { norm(json::object({{"foo", 1}})); }, ErrorCode::kBadConfig);
}

TEST(HfConfigErrors, MalformedConfigFiles) {
  {
    TempDir dir;  // no config.json
    const Error e = expect_error([&] { load_hf_config(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_TRUE(contains(e.file(), "config.json")) << e.file();
  }
  {
    TempDir dir;
    write_text(dir / "config.json", "{\"hidden_size\": 256,");
    const Error e = expect_error([&] { load_hf_config(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), dir / "config.json");
  }
  {
    TempDir dir;
    write_text(dir / "config.json", "[1, 2]");
    expect_error([&] { load_hf_config(dir.path); }, ErrorCode::kBadConfig);
  }
  {
    TempDir dir;
    json cfg = base_config();
    cfg["torch_dtype"] = "int3";
    write_text(dir / "config.json", cfg.dump());
    expect_error([&] { load_hf_config(dir.path); }, ErrorCode::kBadConfig);
  }
  {
    TempDir dir;
    write_text(dir / "config.json", base_config().dump());
    write_text(dir / "hf_quant_config.json", "{not json");
    const Error e = expect_error([&] { load_hf_config(dir.path); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), dir / "hf_quant_config.json");
  }
}

// ------------------------------------------------------------------------- model fields, dtype

TEST(HfConfigModel, Qwen3MoeFields) {
  TempDir dir;
  write_text(dir / "config.json", base_config().dump());
  const HfConfig c = load_hf_config(dir.path);
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.moe_intermediate_size, 128);  // not the dense intermediate_size
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_TRUE(c.gated);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.quant.method, QuantMethod::kNone);
  EXPECT_EQ(c.quant.bits, 16);
  EXPECT_EQ(c.quant_file, "");
  EXPECT_TRUE(c.quant_raw.is_object() && c.quant_raw.empty());
}

TEST(HfConfigModel, NullQuantizationConfigIsUnquantized) {
  TempDir dir;
  json cfg = base_config();
  cfg["quantization_config"] = nullptr;
  write_text(dir / "config.json", cfg.dump());
  EXPECT_EQ(load_hf_config(dir.path).quant.method, QuantMethod::kNone);
}

TEST(HfConfigModel, MixtralDeepseekGptOssFieldNames) {
  {
    TempDir dir;
    write_text(dir / "config.json", json({{"model_type", "mixtral"},
                                          {"hidden_size", 512},
                                          {"intermediate_size", 1024},
                                          {"num_local_experts", 8},
                                          {"num_experts_per_tok", 2},
                                          {"torch_dtype", "float16"}})
                                        .dump());
    const HfConfig c = load_hf_config(dir.path);
    EXPECT_EQ(c.moe_intermediate_size, 1024);
    EXPECT_EQ(c.num_experts, 8);
    EXPECT_EQ(c.dtype, DType::kF16);
  }
  {
    TempDir dir;
    write_text(dir / "config.json", json({{"model_type", "deepseek_v3"},
                                          {"hidden_size", 7168},
                                          {"intermediate_size", 18432},
                                          {"moe_intermediate_size", 2048},
                                          {"n_routed_experts", 256},
                                          {"num_experts_per_tok", 8},
                                          {"first_k_dense_replace", 3}})
                                        .dump());
    const HfConfig c = load_hf_config(dir.path);
    EXPECT_EQ(c.moe_intermediate_size, 2048);
    EXPECT_EQ(c.num_experts, 256);
    EXPECT_EQ(c.dtype, DType::kBF16);  // no torch_dtype: bf16
  }
  {
    TempDir dir;
    // transformers v5 writes "dtype"; gpt-oss spells top-k experts_per_token.
    write_text(dir / "config.json", json({{"model_type", "gpt_oss"},
                                          {"hidden_size", 2880},
                                          {"intermediate_size", 2880},
                                          {"num_local_experts", 32},
                                          {"experts_per_token", 4},
                                          {"dtype", "float32"}})
                                        .dump());
    const HfConfig c = load_hf_config(dir.path);
    EXPECT_EQ(c.top_k, 4);
    EXPECT_EQ(c.num_experts, 32);
    EXPECT_EQ(c.dtype, DType::kF32);
  }
}

TEST(HfConfigModel, Relu2IsNotGated) {
  TempDir dir;
  json cfg = base_config();
  cfg["hidden_act"] = "relu2";
  write_text(dir / "config.json", cfg.dump());
  EXPECT_FALSE(load_hf_config(dir.path).gated);
}

TEST(HfConfigModel, TextConfigNesting) {
  // Qwen3-VL-MoE: the language model's fields live in text_config; vision_config has its own
  // hidden_size that must not be picked up.
  TempDir dir;
  json cfg = {{"architectures", {"Qwen3VLMoeForConditionalGeneration"}},
              {"model_type", "qwen3_vl_moe"},
              {"hidden_size", 9999},
              {"text_config",
               {{"model_type", "qwen3_vl_moe_text"},
                {"hidden_size", 2048},
                {"intermediate_size", 6144},
                {"moe_intermediate_size", 768},
                {"num_experts", 128},
                {"num_experts_per_tok", 8},
                {"num_hidden_layers", 48},
                {"hidden_act", "silu"},
                {"torch_dtype", "float16"}}},
              {"vision_config", {{"hidden_size", 1152}, {"depth", 27}}},
              {"torch_dtype", "bfloat16"}};
  write_text(dir / "config.json", cfg.dump());
  const HfConfig c = load_hf_config(dir.path);
  EXPECT_EQ(c.architecture, "Qwen3VLMoeForConditionalGeneration");
  EXPECT_EQ(c.model_type, "qwen3_vl_moe_text");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_EQ(c.num_layers, 48);
  EXPECT_EQ(c.dtype, DType::kF16);  // text_config's torch_dtype wins
  EXPECT_EQ(c.quant.method, QuantMethod::kNone);
}

TEST(HfConfigModel, QuantizationConfigInsideTextConfig) {
  TempDir dir;
  json cfg = {{"model_type", "qwen3_vl_moe"},
              {"text_config",
               {{"hidden_size", 2048},
                {"moe_intermediate_size", 768},
                {"num_experts", 128},
                {"quantization_config",
                 {{"quant_method", "awq"},
                  {"bits", 4},
                  {"group_size", 128},
                  {"zero_point", true},
                  {"version", "gemm"}}}}}};
  write_text(dir / "config.json", cfg.dump());
  const HfConfig c = load_hf_config(dir.path);
  EXPECT_EQ(c.quant.method, QuantMethod::kAwq);
  EXPECT_EQ(c.quant_raw.value("quant_method", ""), "awq");
}

TEST(HfConfigModel, TorchDtypeNames) {
  EXPECT_EQ(parse_torch_dtype("bfloat16", "x"), DType::kBF16);
  EXPECT_EQ(parse_torch_dtype("float16", "x"), DType::kF16);
  EXPECT_EQ(parse_torch_dtype("float32", "x"), DType::kF32);
  const Error e =
      expect_error([] { parse_torch_dtype("float8", "cfg.json"); }, ErrorCode::kBadConfig);
  EXPECT_EQ(e.file(), "cfg.json");
}

}  // namespace
}  // namespace moepack
