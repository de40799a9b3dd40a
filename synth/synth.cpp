#include "synth/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "formats/codec.h"
#include "formats/fp4.h"
#include "formats/fp8_scaled.h"
#include "formats/mxfp8.h"
#include "formats/quantize.h"
#include "io/atomic_dir.h"
#include "io/shard_writer.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string>& synth_families() {
  static const std::vector<std::string> f = {"qwen3", "mixtral", "deepseek", "fused3d", "gpt_oss"};
  return f;
}

namespace {

// ---- per-method pieces the generator rows below are made of ----

QuantParams base_params(const SynthOptions& o, QuantMethod m, int default_bits,
                        int64_t default_group) {
  QuantParams p;
  p.method = m;
  p.dtype = o.dtype;
  p.bits = o.bits ? o.bits : default_bits;
  p.group_size = o.group_size ? o.group_size : default_group;
  return p;
}

json gptq_config(const SynthOptions&, const QuantParams& p) {
  return {{"quant_method", "gptq"},
          {"bits", p.bits},
          {"group_size", p.group_size},
          {"desc_act", p.act_order},
          {"sym", p.symmetric},
          {"damp_percent", 0.01},
          {"true_sequential", true},
          {"static_groups", false},
          {"checkpoint_format", "gptq"},
          {"dynamic",
           {{"-:.*(self_attn|shared_expert|mlp\\.gate$|mlp\\.(gate|up|down)_proj).*",
             json::object()}}}};
}

json awq_config(const SynthOptions&, const QuantParams& p) {
  const json not_converted = json::array({"lm_head", "self_attn", "mlp.gate", "shared_expert",
                                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"});
  return {{"quant_method", "awq"}, {"bits", p.bits},    {"group_size", p.group_size},
          {"zero_point", true},    {"version", "gemm"}, {"modules_to_not_convert", not_converted}};
}

// The compressed-tensors envelope llm-compressor writes around one config group for every Linear.
json ct_envelope(const char* format, json ignore, json weights, json input_activations) {
  return {{"quant_method", "compressed-tensors"},
          {"format", format},
          {"quantization_status", "compressed"},
          {"ignore", std::move(ignore)},
          {"config_groups",
           {{"group_0",
             {{"targets", json::array({"Linear"})},
              {"weights", std::move(weights)},
              {"input_activations", std::move(input_activations)},
              {"output_activations", nullptr}}}}}};
}

json ct_config(const QuantParams& p, bool w8a8) {
  json w = {{"num_bits", p.bits},
            {"type", "int"},
            {"symmetric", true},
            {"strategy", p.group_size > 0 ? "group" : "channel"},
            {"group_size", p.group_size > 0 ? json(p.group_size) : json(nullptr)},
            {"dynamic", false},
            {"actorder", nullptr},
            {"block_structure", nullptr},
            {"observer", "minmax"}};
  json a = w8a8 ? json{{"num_bits", 8},       {"type", "int"},   {"symmetric", true},
                       {"strategy", "token"}, {"dynamic", true}, {"observer", nullptr}}
                : json(nullptr);
  json cfg = ct_envelope(w8a8 ? "int-quantized" : "pack-quantized",
                         json::array({"lm_head", "re:.*self_attn.*", "re:.*mlp.gate$",
                                      "re:.*shared_expert.*", "re:.*mlp\\.(gate|up|down)_proj$"}),
                         std::move(w), std::move(a));
  cfg["kv_cache_scheme"] = nullptr;
  return cfg;
}

json modelopt_mxfp8_config(const SynthOptions&, const QuantParams&) {
  return {{"quant_method", "modelopt"},
          {"quant_algo", "MXFP8"},
          {"ignore", json::array({"lm_head", "*self_attn*", "*mlp.gate", "*shared_expert*"})},
          {"kv_cache_scheme", {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}}},
          {"producer", {{"name", "modelopt"}, {"version", "0.41.0"}}}};
}

json modelopt_nvfp4_config(const SynthOptions&, const QuantParams&) {
  return {{"quant_method", "modelopt"},
          {"quant_algo", "NVFP4"},
          {"group_size", 16},
          {"ignore", json::array({"lm_head", "*self_attn*", "*mlp.gate", "*shared_expert*"})},
          {"producer", {{"name", "modelopt"}, {"version", "0.41.0"}}}};
}

// llm-compressor's NVFP4A16 (nvfp4-pack-quantized, tensor_group 16, weights only) and MXFP4
// (mxfp4-pack-quantized, group 32) schemes.
json ct_fp4_config(bool nv, bool w4a4 = false) {
  const json w = {{"num_bits", 4},
                  {"type", "float"},
                  {"symmetric", true},
                  {"strategy", nv ? "tensor_group" : "group"},
                  {"group_size", nv ? 16 : 32},
                  {"dynamic", false},
                  {"observer", nv ? "static_minmax" : "minmax"}};
  // llm-compressor's NVFP4 (W4A4) scheme: 4-bit float activations, tensor_group 16, with a
  // calibrated global scale (input_global_scale) and block scales computed at run time.
  const json a = {{"num_bits", 4},
                  {"type", "float"},
                  {"symmetric", true},
                  {"group_size", 16},
                  {"strategy", "tensor_group"},
                  {"dynamic", "local"},
                  {"observer", "static_minmax"}};
  return ct_envelope(nv ? "nvfp4-pack-quantized" : "mxfp4-pack-quantized",
                     json::array({"lm_head", "re:.*mlp.gate$"}), w, w4a4 ? a : json(nullptr));
}
json ct_nvfp4_config(const SynthOptions&, const QuantParams&) {
  return ct_fp4_config(true);
}
json ct_nvfp4_w4a4_config(const SynthOptions&, const QuantParams&) {
  return ct_fp4_config(true, /*w4a4=*/true);
}
json ct_mxfp4_config(const SynthOptions&, const QuantParams&) {
  return ct_fp4_config(false);
}

// The published gpt-oss checkpoints' quantization_config (openai/gpt-oss-20b and -120b).
json gpt_oss_mxfp4_config(const SynthOptions&, const QuantParams&) {
  return {{"modules_to_not_convert",
           json::array({"model.layers.*.self_attn", "model.layers.*.mlp.router",
                        "model.embed_tokens", "lm_head"})},
          {"quant_method", "mxfp4"}};
}

json fp8_block_config(const SynthOptions&, const QuantParams&) {
  return {{"quant_method", "fp8"},
          {"fmt", "e4m3"},
          {"activation_scheme", "dynamic"},
          {"weight_block_size", json::array({128, 128})},
          {"ignored_layers", json::array({"lm_head"})}};
}

// llm-compressor's FP8_BLOCK recipe (compressed-tensors float-quantized, block strategy).
json ct_fp8_block_config(const SynthOptions&, const QuantParams&) {
  const json w = {{"num_bits", 8},         {"type", "float"},
                  {"symmetric", true},     {"strategy", "block"},
                  {"group_size", nullptr}, {"block_structure", json::array({128, 128})},
                  {"dynamic", false},      {"observer", "minmax"}};
  const json a = {{"num_bits", 8},       {"type", "float"},   {"symmetric", true},
                  {"strategy", "group"}, {"group_size", 128}, {"dynamic", true}};
  return ct_envelope("float-quantized", json::array({"lm_head", "re:.*mlp.gate$"}), w, a);
}

// llm-compressor's FP8_DYNAMIC (channel weights, dynamic per-token activations) and FP8 (tensor
// weights, static tensor activations) recipes (compressed-tensors float-quantized).
json ct_fp8_scaled_config(bool channel) {
  const json w = {{"num_bits", 8},     {"type", "float"},
                  {"symmetric", true}, {"strategy", channel ? "channel" : "tensor"},
                  {"dynamic", false},  {"observer", "minmax"}};
  const json a = {{"num_bits", 8},      {"type", "float"},
                  {"symmetric", true},  {"strategy", channel ? "token" : "tensor"},
                  {"dynamic", channel}, {"observer", channel ? json() : json("minmax")}};
  return ct_envelope("float-quantized", json::array({"lm_head", "re:.*mlp.gate$"}), w, a);
}
json ct_fp8_channel_config(const SynthOptions&, const QuantParams&) {
  return ct_fp8_scaled_config(true);
}
json ct_fp8_tensor_config(const SynthOptions&, const QuantParams&) {
  return ct_fp8_scaled_config(false);
}

json modelopt_fp8_config(const SynthOptions&, const QuantParams&) {
  return {{"quant_method", "modelopt"},
          {"quant_algo", "FP8"},
          {"ignore", json::array({"lm_head", "*self_attn*", "*mlp.gate", "*shared_expert*"})},
          {"producer", {{"name", "modelopt"}, {"version", "0.41.0"}}}};
}

const char* torch_dtype_name(DType d) {
  return d == DType::kF16 ? "float16" : d == DType::kF32 ? "float32" : "bfloat16";
}

// One thing synth writes: a dense tensor or one quantised Linear (several tensors).
struct Item {
  // kFusedExperts: gpt-oss' experts of one projection, every expert's W [n, k] in one tensor
  // (MXFP4: <name>_blocks [E, n, k/32, 16] and <name>_scales [E, n, k/32]; bf16: <name>
  // [E, k, n], transformers' parameter), written expert by expert (write_fused_experts).
  enum class Kind { kDense, kNorm, kBias, kLinear, kFusedExperts } kind = Kind::kDense;
  std::string name;  // tensor name, or the Linear's base name for kLinear
  Shape shape;       // dense: tensor shape; kLinear: {n, k}; kFusedExperts: {E, n, k}
  DType dtype = DType::kBF16;
  std::string order_label;  // act-order permutation shared by Linears with the same input
  float stddev = 0.02f;
  std::vector<SafetensorsEntry> outputs;
};

std::vector<float> random_matrix(uint64_t seed, const std::string& label, int64_t n, int64_t k,
                                 float stddev) {
  Rng rng(Rng::hash(seed, label));
  std::vector<float> w(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    // Per-row magnitude varies like trained weights; rare outliers stress the scales.
    const float row_scale = stddev * static_cast<float>(0.5 + rng.uniform());
    for (int64_t c = 0; c < k; ++c) {
      float v = rng.normal() * row_scale;
      if (rng.uniform() < 1e-3) v *= 8.0f;
      w[static_cast<size_t>(r * k + c)] = v;
    }
  }
  return w;
}

// random_matrix's distribution at a tenth of its cost, for the fused gpt-oss experts (120b holds
// 115 G weights): one 64-bit draw per value, three 16-bit uniforms summed (Irwin-Hall, variance
// 1/4, so times 2 for a unit normal's; tails end at 3 sigma) and a 10-bit field that makes one
// value in 1024 an outlier (x 8), as random_matrix's 1e-3.
std::vector<float> fast_random_matrix(uint64_t seed, const std::string& label, int64_t n, int64_t k,
                                      float stddev) {
  Rng rng(Rng::hash(seed, label));
  std::vector<float> w(static_cast<size_t>(n * k));
  constexpr float kUnit = 2.0f / 65536.0f;
  for (int64_t r = 0; r < n; ++r) {
    const float row_scale = stddev * static_cast<float>(0.5 + rng.uniform());
    float* row = w.data() + r * k;
    for (int64_t c = 0; c < k; ++c) {
      const uint64_t u = rng.next_u64();
      const float sum =
          static_cast<float>((u & 0xffff) + ((u >> 16) & 0xffff) + ((u >> 32) & 0xffff)) -
          1.5f * 65535.0f;
      const float outlier = ((u >> 48) & 0x3ff) == 0 ? 8.0f : 1.0f;
      row[c] = sum * kUnit * row_scale * outlier;
    }
  }
  return w;
}

std::vector<int32_t> act_order(uint64_t seed, const std::string& label, int64_t k) {
  // GPTQ processes columns by decreasing Hessian diagonal; any permutation is legal.
  Rng rng(Rng::hash(seed, label + "/order"));
  std::vector<double> importance(static_cast<size_t>(k));
  for (auto& v : importance) v = rng.uniform();
  std::vector<int32_t> order(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return importance[a] > importance[b]; });
  return order;
}

QuantTensor quantize_wna16_min_zero(const SynthOptions& o, const QuantParams& p, const float* w,
                                    int64_t n, int64_t k, const std::string& order_label,
                                    int min_zero) {
  IntQuantSpec spec;
  spec.bits = p.bits;
  spec.group_size = p.group_size;
  spec.symmetric = p.symmetric;
  // AutoGPTQ / AutoAWQ write fp16 scales, compressed-tensors the model dtype: the codec says.
  spec.scale_dtype = find_source_codec(p.method)->spec_for(p).scale_dtype;
  if (p.act_order) spec.order = act_order(o.seed, order_label, k);
  spec.min_zero = min_zero;
  return quantize_int(w, n, k, spec);
}

QuantTensor quantize_wna16(const SynthOptions& o, const QuantParams& p, const float* w, int64_t n,
                           int64_t k, const std::string& order_label) {
  return quantize_wna16_min_zero(o, p, w, n, k, order_label, 0);
}

// GPTQ v1 stores zero - 1 in unsigned fields, so an asymmetric zero can't be 0.
QuantTensor quantize_gptq(const SynthOptions& o, const QuantParams& p, const float* w, int64_t n,
                          int64_t k, const std::string& order_label) {
  const bool v1_asym = !p.symmetric && p.gptq_format == GptqFormat::kV1;
  return quantize_wna16_min_zero(o, p, w, n, k, order_label, v1_asym ? 1 : 0);
}

QuantTensor quantize_w8a8(const SynthOptions& o, const QuantParams&, const float* w, int64_t n,
                          int64_t k, const std::string&) {
  return quantize_int8_channel(w, n, k, o.dtype);
}

QuantTensor quantize_mxfp8_linear(const SynthOptions&, const QuantParams&, const float* w,
                                  int64_t n, int64_t k, const std::string&) {
  return quantize_mxfp8(w, 1, n, k, MxRecipe::kModelOpt);
}

QuantTensor quantize_fp8_block_linear(const SynthOptions&, const QuantParams& p, const float* w,
                                      int64_t n, int64_t k, const std::string&) {
  return quantize_fp8_block(w, n, k, p.block_n, p.block_k);
}

// NVFP4's per-tensor decode scale g = amax / (6 * 448) as the producers compute it, from a
// stand-in amax drawn per input label: gate and up share their input and so their global scale,
// as ModelOpt and llm-compressor fuse them (vLLM uses the gate's for both); down has its own.
float synth_nvfp4_global(const SynthOptions& o, const std::string& order_label) {
  Rng rng(Rng::hash(o.seed, order_label + "/global"));
  const float amax = static_cast<float>(1.5 + 1.5 * rng.uniform());
  return amax / (6.0f * 448.0f);
}
// W4A4's static activation scale a = amax / (6 * 448) of the Linear's input, from a stand-in
// activation amax per input label (gate and up share theirs), stored in the weight global
// scale's convention (ModelOpt input_scale a, compressed-tensors input_global_scale 1 / a).
QuantTensor with_input_scale(QuantTensor q, const SynthOptions& o, const QuantParams& p,
                             const std::string& order_label) {
  if (p.dynamic_input) return q;
  Rng rng(Rng::hash(o.seed, order_label + "/input"));
  const float a = static_cast<float>(4.0 + 8.0 * rng.uniform()) / (6.0f * 448.0f);
  q.input_global_scale = q.global_scale;
  q.input_scales = {q.global_scale == GlobalScale::kEncodeDivisor ? 1.0f / a : a};
  return q;
}
QuantTensor quantize_modelopt_nvfp4_linear(const SynthOptions& o, const QuantParams& p,
                                           const float* w, int64_t n, int64_t k,
                                           const std::string& order_label) {
  return with_input_scale(
      quantize_nvfp4(w, n, k, synth_nvfp4_global(o, order_label), GlobalScale::kDecodeMultiplier),
      o, p, order_label);
}
QuantTensor quantize_ct_nvfp4_linear(const SynthOptions& o, const QuantParams& p, const float* w,
                                     int64_t n, int64_t k, const std::string& order_label) {
  return with_input_scale(
      quantize_nvfp4(w, n, k, synth_nvfp4_global(o, order_label), GlobalScale::kEncodeDivisor), o,
      p, order_label);
}
QuantTensor quantize_mxfp4_linear(const SynthOptions&, const QuantParams&, const float* w,
                                  int64_t n, int64_t k, const std::string&) {
  return quantize_mxfp4(w, n, k);
}

// compressed-tensors stores FP8 block scales in the model dtype: the F32 scales rounded to it
// (the codes keep the F32 quantisation; dequantisation uses the stored scales either way).
QuantTensor quantize_ct_fp8_block_linear(const SynthOptions& o, const QuantParams& p,
                                         const float* w, int64_t n, int64_t k, const std::string&) {
  QuantTensor f32 = quantize_fp8_block(w, n, k, p.block_n, p.block_k);
  QuantTensor q = f32;
  q.scale_dtype = o.dtype == DType::kF32 ? DType::kF32 : o.dtype;
  q.scales = convert_scales(f32.scales, DType::kF32, q.scale_dtype, "weight_scale");
  return q;
}

// FP8 with one scale per output channel (block_n 1, block_k K) or per Linear (block N x K), the
// per-row canonical form of formats/fp8_scaled.h; scales as compressed-tensors stores them (the
// model dtype) or F32 (ModelOpt).
QuantTensor quantize_fp8_scaled(const SynthOptions& o, const QuantParams& p, const float* w,
                                int64_t n, int64_t k, bool per_tensor) {
  const QuantTensor f32 = quantize_fp8_block(w, n, k, per_tensor ? n : 1, k);
  QuantTensor q(fp8_scaled_spec_for(p), 1, n, k);
  q.codes = f32.codes;
  std::vector<uint8_t> rows(static_cast<size_t>(n * 4));
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(rows.data() + r * 4, f32.scales.data() + (per_tensor ? 0 : r * 4), 4);
  q.scale_dtype =
      p.method == QuantMethod::kModeloptFp8 || o.dtype == DType::kF32 ? DType::kF32 : o.dtype;
  q.scales = convert_scales(rows, DType::kF32, q.scale_dtype, "weight_scale");
  return q;
}
QuantTensor quantize_fp8_channel_linear(const SynthOptions& o, const QuantParams& p, const float* w,
                                        int64_t n, int64_t k, const std::string&) {
  return quantize_fp8_scaled(o, p, w, n, k, false);
}
QuantTensor quantize_fp8_tensor_linear(const SynthOptions& o, const QuantParams& p, const float* w,
                                       int64_t n, int64_t k, const std::string&) {
  return quantize_fp8_scaled(o, p, w, n, k, true);
}

// One synth generator per --format: the params a real producer would write, its
// quantization_config, any side file, and how it quantises a float matrix (a new source format
// adds one row; docs/architecture.md).
struct SynthGenerator {
  const char* format;
  QuantMethod method;  // kNone: written unquantized
  int bits;            // default; --bits overrides unless `fixed`
  int64_t group_size;  // default; --group-size overrides unless `fixed`
  bool fixed;          // the format has one bit width and group size
  bool act_order, symmetric;
  json (*quant_config)(const SynthOptions&, const QuantParams&) = nullptr;
  const char* side_file = nullptr;  // e.g. hf_quant_config.json
  json (*side_file_json)() = nullptr;
  QuantTensor (*quantize)(const SynthOptions&, const QuantParams&, const float* w, int64_t n,
                          int64_t k, const std::string& order_label) = nullptr;
  // false: the config quantises activations with a static scale every Linear carries
  // (QuantParams::dynamic_input; NVFP4 W4A4's input_scale / input_global_scale).
  bool dynamic_input = true;
};

// The params a generator row writes, with the flags applied.
QuantParams generator_params(const SynthGenerator& g, const SynthOptions& o) {
  QuantParams p;
  p.dtype = o.dtype;
  if (g.method == QuantMethod::kNone) return p;
  p = base_params(o, g.method, g.bits, g.group_size);
  if (g.fixed) {
    p.bits = g.bits;
    p.group_size = g.group_size;
  }
  p.act_order = g.act_order;
  p.symmetric = g.symmetric;
  p.dynamic_input = g.dynamic_input;
  return p;
}

json modelopt_side_file() {
  return {{"producer", {{"name", "modelopt"}, {"version", "0.41.0"}}},
          {"quantization",
           {{"quant_algo", "MXFP8"},
            {"kv_cache_quant_algo", "FP8"},
            {"group_size", 32},
            {"exclude_modules", json::array({"lm_head"})}}}};
}

json modelopt_fp8_side_file() {
  return {{"producer", {{"name", "modelopt"}, {"version", "0.41.0"}}},
          {"quantization",
           {{"quant_algo", "FP8"},
            {"kv_cache_quant_algo", nullptr},
            {"exclude_modules", json::array({"lm_head"})}}}};
}

json modelopt_nvfp4_side_file() {
  return {{"producer", {{"name", "modelopt"}, {"version", "0.41.0"}}},
          {"quantization",
           {{"quant_algo", "NVFP4"},
            {"kv_cache_quant_algo", nullptr},
            {"group_size", 16},
            {"exclude_modules", json::array({"lm_head"})}}}};
}

json ct_pack_config(const SynthOptions&, const QuantParams& p) {
  return ct_config(p, false);
}
json ct_int_config(const SynthOptions&, const QuantParams& p) {
  return ct_config(p, true);
}

std::vector<SynthGenerator> int_and_fp8_generators() {
  using M = QuantMethod;
  // Named fields (SynthGenerator's declaration order); hooks left out are nullptr.
  return {
      {.format = "bf16",
       .method = M::kNone,
       .bits = 16,
       .group_size = -1,
       .fixed = true,
       .act_order = false,
       .symmetric = true},
      {.format = "gptq",
       .method = M::kGptq,
       .bits = 4,
       .group_size = 128,
       .fixed = false,
       .act_order = false,
       .symmetric = true,
       .quant_config = gptq_config,
       .quantize = quantize_gptq},
      {.format = "gptq-actorder",
       .method = M::kGptq,
       .bits = 4,
       .group_size = 128,
       .fixed = false,
       .act_order = true,
       .symmetric = true,
       .quant_config = gptq_config,
       .quantize = quantize_gptq},
      {.format = "gptq-asym",
       .method = M::kGptq,
       .bits = 4,
       .group_size = 128,
       .fixed = false,
       .act_order = false,
       .symmetric = false,
       .quant_config = gptq_config,
       .quantize = quantize_gptq},
      {.format = "awq",
       .method = M::kAwq,
       .bits = 4,
       .group_size = 128,
       .fixed = false,
       .act_order = false,
       .symmetric = false,
       .quant_config = awq_config,
       .quantize = quantize_wna16},
      {.format = "ct-w4a16",
       .method = M::kCtPackQuantized,
       .bits = 4,
       .group_size = 128,
       .fixed = false,
       .act_order = false,
       .symmetric = true,
       .quant_config = ct_pack_config,
       .quantize = quantize_wna16},
      {.format = "ct-w8a16",
       .method = M::kCtPackQuantized,
       .bits = 8,
       .group_size = -1,
       .fixed = false,
       .act_order = false,
       .symmetric = true,
       .quant_config = ct_pack_config,
       .quantize = quantize_wna16},
      {.format = "ct-w8a8",
       .method = M::kCtIntQuantized,
       .bits = 8,
       .group_size = -1,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = ct_int_config,
       .quantize = quantize_w8a8},
      {.format = "modelopt-mxfp8",
       .method = M::kModeloptMxfp8,
       .bits = 8,
       .group_size = 32,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = modelopt_mxfp8_config,
       .side_file = "hf_quant_config.json",
       .side_file_json = modelopt_side_file,
       .quantize = quantize_mxfp8_linear},
      {.format = "fp8-block",
       .method = M::kFp8Block,
       .bits = 8,
       .group_size = 128,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = fp8_block_config,
       .quantize = quantize_fp8_block_linear},
      {.format = "ct-fp8-block",
       .method = M::kCtFp8Block,
       .bits = 8,
       .group_size = 128,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = ct_fp8_block_config,
       .quantize = quantize_ct_fp8_block_linear},
  };
}

// FP8 with per-channel or per-tensor scales (formats/fp8_scaled.h).
std::vector<SynthGenerator> fp8_scaled_generators() {
  using M = QuantMethod;
  return {
      {.format = "ct-fp8-channel",
       .method = M::kCtFp8Channel,
       .bits = 8,
       .group_size = -1,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = ct_fp8_channel_config,
       .quantize = quantize_fp8_channel_linear},
      {.format = "ct-fp8-tensor",
       .method = M::kCtFp8Tensor,
       .bits = 8,
       .group_size = -1,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = ct_fp8_tensor_config,
       .quantize = quantize_fp8_tensor_linear},
      {.format = "modelopt-fp8",
       .method = M::kModeloptFp8,
       .bits = 8,
       .group_size = -1,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = modelopt_fp8_config,
       .side_file = "hf_quant_config.json",
       .side_file_json = modelopt_fp8_side_file,
       .quantize = quantize_fp8_tensor_linear},
  };
}

// The FP4 formats (formats/fp4.h).
std::vector<SynthGenerator> fp4_generators() {
  using M = QuantMethod;
  return {
      {.format = "modelopt-nvfp4",
       .method = M::kModeloptNvfp4,
       .bits = 4,
       .group_size = 16,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = modelopt_nvfp4_config,
       .side_file = "hf_quant_config.json",
       .side_file_json = modelopt_nvfp4_side_file,
       .quantize = quantize_modelopt_nvfp4_linear,
       .dynamic_input = false},  // quant_algo NVFP4 is W4A4: input_scale on every Linear
      {.format = "ct-nvfp4",
       .method = M::kCtNvfp4,
       .bits = 4,
       .group_size = 16,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = ct_nvfp4_config,
       .quantize = quantize_ct_nvfp4_linear},
      {.format = "ct-nvfp4-w4a4",
       .method = M::kCtNvfp4,
       .bits = 4,
       .group_size = 16,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = ct_nvfp4_w4a4_config,
       .quantize = quantize_ct_nvfp4_linear,
       .dynamic_input = false},
      {.format = "ct-mxfp4",
       .method = M::kCtMxfp4,
       .bits = 4,
       .group_size = 32,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = ct_mxfp4_config,
       .quantize = quantize_mxfp4_linear},
      // gpt-oss' fused experts are written by write_fused_experts (--family gpt_oss only).
      {.format = "gpt-oss-mxfp4",
       .method = M::kGptOssMxfp4,
       .bits = 4,
       .group_size = 32,
       .fixed = true,
       .act_order = false,
       .symmetric = true,
       .quant_config = gpt_oss_mxfp4_config,
       .quantize = quantize_mxfp4_linear},
  };
}

const std::vector<SynthGenerator>& synth_generators() {
  static const std::vector<SynthGenerator> rows = [] {
    std::vector<SynthGenerator> v = int_and_fp8_generators();
    for (const SynthGenerator& g : fp8_scaled_generators()) v.push_back(g);
    for (const SynthGenerator& g : fp4_generators()) v.push_back(g);
    return v;
  }();
  return rows;
}

const SynthGenerator& synth_generator(const std::string& format) {
  for (const auto& g : synth_generators())
    if (format == g.format) return g;
  std::string list;
  for (const auto& s : synth_formats()) list += (list.empty() ? "" : ", ") + s;
  throw Error(ErrorCode::kUsage, "unknown --format \"" + format + "\" (supported: " + list + ")");
}

void fill_dense(const Item& it, uint64_t seed, std::vector<uint8_t>* bytes) {
  const int64_t count = numel(it.shape);
  bytes->assign(static_cast<size_t>(count * dtype_bits(it.dtype) / 8), 0);
  Rng rng(Rng::hash(seed, it.name));
  for (int64_t i = 0; i < count; ++i) {
    float v;
    if (it.kind == Item::Kind::kNorm)
      v = 1.0f + 0.05f * rng.normal();
    else if (it.kind == Item::Kind::kBias)
      v = 0.01f * rng.normal();
    else
      v = rng.normal() * it.stddev;
    uint8_t* out = bytes->data() + i * (dtype_bits(it.dtype) / 8);
    if (it.dtype == DType::kBF16) {
      const uint16_t h = float_to_bf16(v);
      std::memcpy(out, &h, 2);
    } else if (it.dtype == DType::kF16) {
      const uint16_t h = float_to_f16(v);
      std::memcpy(out, &h, 2);
    } else {
      std::memcpy(out, &v, 4);
    }
  }
}

// The options synth can make a checkpoint of; returns the format's codec (null: unquantized).
const SourceCodec* check_synth_options(const SynthOptions& o, const QuantParams& p) {
  const bool quantized = p.method != QuantMethod::kNone;
  if (std::find(synth_families().begin(), synth_families().end(), o.family) ==
      synth_families().end())
    throw Error(ErrorCode::kUsage, "unknown --family \"" + o.family +
                                       "\" (qwen3, mixtral, deepseek, fused3d, gpt_oss)");
  const bool gpt_oss_format = p.method == QuantMethod::kGptOssMxfp4;
  if ((o.family == "gpt_oss") != gpt_oss_format && (gpt_oss_format || quantized))
    throw Error(ErrorCode::kUsage,
                "--family gpt_oss is written as gpt-oss-mxfp4 (the published format) or bf16, "
                "and --format gpt-oss-mxfp4 only as --family gpt_oss");
  if (o.family == "gpt_oss" && o.dtype != DType::kBF16)
    throw Error(ErrorCode::kUsage, "--family gpt_oss is written in bf16 (--dtype bf16)");
  if (o.family == "fused3d" && quantized)
    throw Error(ErrorCode::kUsage,
                "--family fused3d is written unquantized (bf16): quantized "
                "Qwen3-VL-style checkpoints store per-expert Linears");
  if (o.layers < 1 || o.experts < 1 || o.hidden < 1 || o.inter < 1 || o.top_k < 1 ||
      o.top_k > o.experts)
    throw Error(ErrorCode::kUsage,
                "--layers, --experts, --hidden, --inter must be >= 1 and 1 <= top-k <= experts");
  if (o.dtype != DType::kBF16 && o.dtype != DType::kF16)
    throw Error(ErrorCode::kUsage, "--dtype must be bf16 or fp16");
  const SourceCodec* codec = quantized ? find_source_codec(p.method) : nullptr;
  if (quantized && !codec) throw Error(ErrorCode::kInternal, "no codec for synth format");
  // Shape constraints of the source formats themselves (not of any backend).
  if (quantized) {
    const int64_t pf = 32 / p.bits;
    const int64_t align = std::max<int64_t>({p.group_size > 0 ? p.group_size : 1, pf, 32});
    if (o.hidden % align || o.inter % align)
      throw Error(ErrorCode::kUsage, "--hidden and --inter must be multiples of " +
                                         std::to_string(align) + " for " + o.format);
  }
  return codec;
}

// Qwen3 and DeepSeek checkpoints of more than one layer start with a dense MLP layer.
bool synth_has_dense_layer(const SynthOptions& o) {
  return (o.family == "qwen3" || o.family == "deepseek") && o.layers > 1;
}

// gpt-oss' attention shape: head_dim 64 as published; 4 query and 2 key/value heads (the published
// models have 64 and 8: attention is not what moepack converts, only its tensors are written).
constexpr int64_t kGptOssHeadDim = 64, kGptOssHeads = 4, kGptOssKvHeads = 2;

// Every tensor of a gpt-oss checkpoint in the published layout (tests/gpt_oss/fixtures/mxfp4,
// docs/gpt-oss.md): attention with biases and sinks, the router with its bias, and per layer two
// fused expert projections -- gate_up [E, 2I, H] (rows interleaved: 2j gate j, 2j + 1 up j; the
// random rows are drawn row by row, so the interleave is the names') and down [E, H, I] -- with
// their BF16 biases.
std::vector<Item> synth_gpt_oss_items(const SynthOptions& o) {
  const int64_t H = o.hidden, I = o.inter, E = o.experts;
  const int64_t q_rows = kGptOssHeads * kGptOssHeadDim, kv_rows = kGptOssKvHeads * kGptOssHeadDim;
  std::vector<Item> items;
  auto add = [&](const std::string& name, Shape shape, Item::Kind kind, float stddev = 0.02f) {
    Item it;
    it.kind = kind;
    it.name = name;
    it.shape = std::move(shape);
    it.dtype = DType::kBF16;
    it.stddev = stddev;
    items.push_back(std::move(it));
  };
  using K = Item::Kind;
  add("model.embed_tokens.weight", {o.vocab, H}, K::kDense);
  for (int64_t L = 0; L < o.layers; ++L) {
    const std::string P = "model.layers." + std::to_string(L) + ".";
    add(P + "input_layernorm.weight", {H}, K::kNorm);
    for (const auto& [proj, rows] : {std::pair<const char*, int64_t>{"q_proj", q_rows},
                                     {"k_proj", kv_rows},
                                     {"v_proj", kv_rows}}) {
      add(P + "self_attn." + proj + ".weight", {rows, H}, K::kDense);
      add(P + "self_attn." + proj + ".bias", {rows}, K::kBias);
    }
    add(P + "self_attn.o_proj.weight", {H, q_rows}, K::kDense);
    add(P + "self_attn.o_proj.bias", {H}, K::kBias);
    add(P + "self_attn.sinks", {kGptOssHeads}, K::kDense, 1.0f);
    add(P + "post_attention_layernorm.weight", {H}, K::kNorm);
    add(P + "mlp.router.weight", {E, H}, K::kDense);
    add(P + "mlp.router.bias", {E}, K::kDense, 0.1f);
    add(P + "mlp.experts.gate_up_proj", {E, 2 * I, H}, K::kFusedExperts);
    add(P + "mlp.experts.gate_up_proj_bias", {E, 2 * I}, K::kDense, 0.1f);
    add(P + "mlp.experts.down_proj", {E, H, I}, K::kFusedExperts);
    add(P + "mlp.experts.down_proj_bias", {E, H}, K::kDense, 0.1f);
  }
  add("model.norm.weight", {H}, K::kNorm);
  add("lm_head.weight", {o.vocab, H}, K::kDense);
  return items;
}

// Every tensor of the model (a quantised Linear as one kLinear item), in file order: embeddings,
// per layer attention, norms and the MLP in the family's naming, final norm and head.
std::vector<Item> synth_items(const SynthOptions& o, bool quantized) {
  if (o.family == "gpt_oss") return synth_gpt_oss_items(o);
  const bool fused = o.family == "fused3d";
  const std::string root = fused ? "model.language_model." : "model.";
  const int64_t H = o.hidden, I = o.inter, E = o.experts;
  const int64_t dense_inter = 2 * I;
  const bool has_dense_layer = synth_has_dense_layer(o);

  std::vector<Item> items;
  auto dense = [&](const std::string& name, Shape shape, Item::Kind kind = Item::Kind::kDense,
                   DType dt = DType::kU8) {
    Item it;
    it.kind = kind;
    it.name = name;
    it.shape = std::move(shape);
    it.dtype = dt == DType::kU8 ? o.dtype : dt;
    items.push_back(std::move(it));
  };
  auto linear = [&](const std::string& base, int64_t n, int64_t k, const std::string& order_label) {
    if (!quantized) {
      dense(base + ".weight", {n, k});
      return;
    }
    Item it;
    it.kind = Item::Kind::kLinear;
    it.name = base;
    it.shape = {n, k};
    it.order_label = order_label;
    items.push_back(std::move(it));
  };

  dense(root + "embed_tokens.weight", {o.vocab, H});
  for (int64_t L = 0; L < o.layers; ++L) {
    const std::string P = root + "layers." + std::to_string(L) + ".";
    dense(P + "input_layernorm.weight", {H}, Item::Kind::kNorm);
    dense(P + "self_attn.q_proj.weight", {H, H});
    dense(P + "self_attn.k_proj.weight", {H / 2, H});
    dense(P + "self_attn.v_proj.weight", {H / 2, H});
    dense(P + "self_attn.o_proj.weight", {H, H});
    dense(P + "post_attention_layernorm.weight", {H}, Item::Kind::kNorm);
    if (has_dense_layer && L == 0) {
      dense(P + "mlp.gate_proj.weight", {dense_inter, H});
      dense(P + "mlp.up_proj.weight", {dense_inter, H});
      dense(P + "mlp.down_proj.weight", {H, dense_inter});
      continue;
    }
    if (o.family == "mixtral") {
      dense(P + "block_sparse_moe.gate.weight", {E, H});
      for (int64_t e = 0; e < E; ++e) {
        const std::string X = P + "block_sparse_moe.experts." + std::to_string(e) + ".";
        linear(X + "w1", I, H, X + "in13");
        linear(X + "w3", I, H, X + "in13");
        linear(X + "w2", H, I, X + "in2");
      }
      continue;
    }
    dense(P + "mlp.gate.weight", {E, H});
    if (o.family == "deepseek") {
      dense(P + "mlp.gate.e_score_correction_bias", {E}, Item::Kind::kBias, DType::kF32);
      dense(P + "mlp.shared_experts.gate_proj.weight", {I, H});
      dense(P + "mlp.shared_experts.up_proj.weight", {I, H});
      dense(P + "mlp.shared_experts.down_proj.weight", {H, I});
    }
    if (fused) {
      dense(P + "mlp.experts.gate_up_proj", {E, H, 2 * I});
      dense(P + "mlp.experts.down_proj", {E, I, H});
      continue;
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string X = P + "mlp.experts." + std::to_string(e) + ".";
      linear(X + "gate_proj", I, H, X + "in13");
      linear(X + "up_proj", I, H, X + "in13");
      linear(X + "down_proj", H, I, X + "in2");
    }
  }
  dense(root + "norm.weight", {H}, Item::Kind::kNorm);
  dense("lm_head.weight", {o.vocab, H});
  return items;
}

// Each item's output tensors: a dense one is itself; a quantised Linear's names, dtypes and
// shapes are probed once per (n, k) by packing a legal all-zero-weight quantisation through the
// format's own codec.
void plan_item_outputs(std::vector<Item>& items, const SynthGenerator& gen,
                       const SourceCodec* codec, const SynthOptions& o, const QuantParams& p) {
  std::map<std::pair<int64_t, int64_t>, std::vector<SafetensorsEntry>> probe;
  for (auto& it : items) {
    if (it.kind == Item::Kind::kFusedExperts) {
      const int64_t E = it.shape[0], n = it.shape[1], k = it.shape[2];
      if (codec)
        it.outputs = {{it.name + "_blocks", DType::kU8, {E, n, k / 32, 16}, 0, 0},
                      {it.name + "_scales", DType::kU8, {E, n, k / 32}, 0, 0}};
      else
        it.outputs = {{it.name, it.dtype, {E, k, n}, 0, 0}};
      continue;
    }
    if (it.kind != Item::Kind::kLinear) {
      it.outputs = {{it.name, it.dtype, it.shape, 0, 0}};
      continue;
    }
    const auto key = std::make_pair(it.shape[0], it.shape[1]);
    if (!probe.count(key)) {
      std::vector<float> zeros(static_cast<size_t>(key.first * key.second), 0.0f);
      zeros[0] = 1.0f;  // keep scales finite and non-degenerate
      const QuantTensor q = gen.quantize(o, p, zeros.data(), key.first, key.second, "probe");
      const TensorMap packed = codec->pack(p, q);
      for (const auto& [suffix, t] : packed) probe[key].push_back({suffix, t.dtype, t.shape, 0, 0});
    }
    for (auto e : probe[key]) {
      e.name = it.name + "." + e.name;
      it.outputs.push_back(e);
    }
  }
}

// One expert's tensors of a kFusedExperts item, in its outputs' order: the codec's blocks and
// scales of W [n, k] quantised to MXFP4, or (bf16) W^T [k, n] as transformers stores it.
std::vector<std::vector<uint8_t>> fused_expert_bytes(const Item& it, int64_t expert,
                                                     const SourceCodec* codec,
                                                     const SynthOptions& o, const QuantParams& p) {
  const int64_t n = it.shape[1], k = it.shape[2];
  const std::vector<float> w =
      fast_random_matrix(o.seed, it.name + "/" + std::to_string(expert), n, k, it.stddev);
  if (!codec) {
    std::vector<uint8_t> t(static_cast<size_t>(n * k * 2));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const uint16_t h = float_to_bf16(w[static_cast<size_t>(r * k + c)]);
        std::memcpy(t.data() + (c * n + r) * 2, &h, 2);
      }
    return {std::move(t)};
  }
  TensorMap packed = codec->pack(p, quantize_mxfp4(w.data(), n, k));
  return {std::move(packed.at("blocks").data), std::move(packed.at("scales").data)};
}

// A kFusedExperts item expert by expert: a batch of experts at a time on the threads, each
// tensor's slices then written in order, so that memory holds a batch, never the tensor.
void write_fused_experts(ShardedWriter& writer, const Item& it, const SourceCodec* codec,
                         const SynthOptions& o, const QuantParams& p, ProgressCounter& progress) {
  const int64_t E = it.shape[0];
  const int64_t batch = resolve_threads(o.threads);
  std::vector<uint64_t> written(it.outputs.size(), 0);
  for (int64_t e0 = 0; e0 < E; e0 += batch) {
    const int64_t count = std::min(batch, E - e0);
    std::vector<std::vector<std::vector<uint8_t>>> slices(static_cast<size_t>(count));
    parallel_for(count, o.threads, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        slices[static_cast<size_t>(i)] = fused_expert_bytes(it, e0 + i, codec, o, p);
    });
    for (const auto& expert : slices)
      for (size_t t = 0; t < it.outputs.size(); ++t) {
        writer.write_part(it.outputs[t].name, expert[t].data(), expert[t].size(), written[t]);
        written[t] += expert[t].size();
        progress.add(0, expert[t].size());
      }
  }
  progress.add(static_cast<int64_t>(it.outputs.size()), 0);
}

// The random values of every item (seeded by its name, and a fused item's experts by theirs:
// threads do not change them), quantised Linears packed by the format's codec.
void write_items(ShardedWriter& writer, const std::vector<Item>& items, const SynthGenerator& gen,
                 const SourceCodec* codec, const SynthOptions& o, const QuantParams& p) {
  int64_t tensors = 0;
  for (const Item& it : items) tensors += static_cast<int64_t>(it.outputs.size());
  ProgressCounter progress(o.progress, "tensors", tensors, writer.plan().total_tensor_bytes);
  for (const Item& it : items)
    if (it.kind == Item::Kind::kFusedExperts)
      write_fused_experts(writer, it, codec, o, p, progress);
  parallel_for(static_cast<int64_t>(items.size()), o.threads, [&](int64_t b, int64_t e) {
    std::vector<uint8_t> bytes;
    for (int64_t i = b; i < e; ++i) {
      const Item& it = items[static_cast<size_t>(i)];
      if (it.kind == Item::Kind::kFusedExperts) continue;
      if (it.kind != Item::Kind::kLinear) {
        fill_dense(it, o.seed, &bytes);
        writer.write(it.name, bytes.data(), bytes.size());
        progress.add(1, bytes.size());
        continue;
      }
      const int64_t n = it.shape[0], k = it.shape[1];
      const std::vector<float> w = random_matrix(o.seed, it.name, n, k, 0.02f);
      const QuantTensor q = gen.quantize(o, p, w.data(), n, k, it.order_label);
      for (const auto& [suffix, t] : codec->pack(p, q)) {
        writer.write(it.name + "." + suffix, t.data.data(), t.data.size());
        progress.add(1, t.data.size());
      }
    }
  });
  writer.finish();
}

// config.json as openai/gpt-oss-* publish it (their fields; experts_per_token beside
// num_experts_per_tok, the yarn rope_scaling, swiglu_limit 7.0), without quantization_config.
json gpt_oss_config_json(const SynthOptions& o) {
  json layer_types = json::array();
  for (int64_t L = 0; L < o.layers; ++L)
    layer_types.push_back(L % 2 == 0 ? "sliding_attention" : "full_attention");
  return {{"architectures", {"GptOssForCausalLM"}},
          {"attention_bias", true},
          {"attention_dropout", 0.0},
          {"eos_token_id", 1},
          {"experts_per_token", o.top_k},
          {"head_dim", kGptOssHeadDim},
          {"hidden_act", "silu"},
          {"hidden_size", o.hidden},
          {"initial_context_length", 4096},
          {"initializer_range", 0.02},
          {"intermediate_size", o.inter},
          {"layer_types", layer_types},
          {"max_position_embeddings", 131072},
          {"model_type", "gpt_oss"},
          {"num_attention_heads", kGptOssHeads},
          {"num_experts_per_tok", o.top_k},
          {"num_hidden_layers", o.layers},
          {"num_key_value_heads", kGptOssKvHeads},
          {"num_local_experts", o.experts},
          {"output_router_logits", false},
          {"pad_token_id", 0},
          {"rms_norm_eps", 1e-05},
          {"rope_scaling",
           {{"beta_fast", 32.0},
            {"beta_slow", 1.0},
            {"factor", 32.0},
            {"original_max_position_embeddings", 4096},
            {"rope_type", "yarn"},
            {"truncate", false}}},
          {"rope_theta", 150000},
          {"router_aux_loss_coef", 0.9},
          {"sliding_window", 128},
          {"swiglu_limit", 7.0},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"transformers_version", "4.55.0.dev0"},
          {"use_cache", true},
          {"vocab_size", o.vocab}};
}

// config.json like the real producers write it, without its quantization_config.
json synth_config_json(const SynthOptions& o) {
  if (o.family == "gpt_oss") return gpt_oss_config_json(o);
  const int64_t H = o.hidden, I = o.inter, E = o.experts;
  const int64_t dense_inter = 2 * I;
  const bool has_dense_layer = synth_has_dense_layer(o);
  json cfg;
  const int64_t heads = 4, kv_heads = 2;
  json text = {{"hidden_size", H},
               {"num_hidden_layers", o.layers},
               {"num_attention_heads", heads},
               {"num_key_value_heads", kv_heads},
               {"head_dim", H / heads},
               {"vocab_size", o.vocab},
               {"hidden_act", "silu"},
               {"rms_norm_eps", 1e-6},
               {"max_position_embeddings", 4096},
               {"rope_theta", 1000000.0},
               {"tie_word_embeddings", false},
               {"torch_dtype", torch_dtype_name(o.dtype)}};
  if (o.family == "mixtral") {
    cfg = text;
    cfg["architectures"] = {"MixtralForCausalLM"};
    cfg["model_type"] = "mixtral";
    cfg["intermediate_size"] = I;
    cfg["num_local_experts"] = E;
    cfg["num_experts_per_tok"] = o.top_k;
    cfg["router_aux_loss_coef"] = 0.02;
  } else if (o.family == "deepseek") {
    cfg = text;
    cfg["architectures"] = {"DeepseekV3ForCausalLM"};
    cfg["model_type"] = "deepseek_v3";
    cfg["intermediate_size"] = dense_inter;
    cfg["moe_intermediate_size"] = I;
    cfg["n_routed_experts"] = E;
    cfg["n_shared_experts"] = 1;
    cfg["num_experts_per_tok"] = o.top_k;
    cfg["first_k_dense_replace"] = has_dense_layer ? 1 : 0;
    cfg["moe_layer_freq"] = 1;
    cfg["scoring_func"] = "sigmoid";
    cfg["topk_method"] = "noaux_tc";
    cfg["n_group"] = E % 2 == 0 && E >= 4 ? 2 : 1;
    cfg["topk_group"] = 1;
    cfg["norm_topk_prob"] = true;
    cfg["routed_scaling_factor"] = 2.5;
  } else {
    text["moe_intermediate_size"] = I;
    text["intermediate_size"] = dense_inter;
    text["num_experts"] = E;
    text["num_experts_per_tok"] = o.top_k;
    text["norm_topk_prob"] = true;
    text["decoder_sparse_step"] = 1;
    text["mlp_only_layers"] = has_dense_layer ? json::array({0}) : json::array();
    if (o.family == "fused3d") {
      text["model_type"] = "qwen3_vl_moe_text";
      cfg = {{"architectures", {"Qwen3VLMoeForConditionalGeneration"}},
             {"model_type", "qwen3_vl_moe"},
             {"text_config", text},
             {"torch_dtype", torch_dtype_name(o.dtype)},
             {"tie_word_embeddings", false}};
    } else {
      cfg = text;
      cfg["architectures"] = {"Qwen3MoeForCausalLM"};
      cfg["model_type"] = "qwen3_moe";
    }
  }
  cfg["transformers_version"] = "4.57.1";
  return cfg;
}

}  // namespace

SynthResult synth_checkpoint(const std::string& out_dir, const SynthOptions& opts) {
  SynthOptions o = opts;
  if (o.family.empty()) o.family = o.format == "gpt-oss-mxfp4" ? "gpt_oss" : "qwen3";
  const SynthGenerator& gen = synth_generator(o.format);
  const QuantParams p = generator_params(gen, o);
  const SourceCodec* codec = check_synth_options(o, p);
  std::vector<Item> items = synth_items(o, codec != nullptr);
  plan_item_outputs(items, gen, codec, o, p);
  std::vector<SafetensorsEntry> all;
  for (const auto& it : items) all.insert(all.end(), it.outputs.begin(), it.outputs.end());
  ShardPlan plan = plan_shards(all, o.max_shard_bytes);

  AtomicOutputDir out(out_dir, o.force, {});
  ShardedWriter writer(out.path(), plan);
  write_items(writer, items, gen, codec, o, p);
  json cfg = synth_config_json(o);
  if (gen.quant_config) cfg["quantization_config"] = gen.quant_config(o, p);
  auto write_json = [&](const std::string& name, const json& j) {
    const std::string path = out.path() + "/" + name;
    std::ofstream f(path);
    f << j.dump(2) << "\n";
    if (!f) throw Error(ErrorCode::kIo, path, "", "write failed");
  };
  write_json("config.json", cfg);
  if (gen.side_file) write_json(gen.side_file, gen.side_file_json());
  write_json("generation_config.json",
             {{"do_sample", false}, {"eos_token_id", 1}, {"bos_token_id", 0}});
  out.commit();

  SynthResult r;
  r.dir = out_dir;
  r.family = o.family;
  r.tensors = static_cast<int64_t>(all.size());
  r.shards = static_cast<int64_t>(plan.shard_names.size());
  r.bytes = plan.total_tensor_bytes;
  return r;
}

const std::vector<std::string>& synth_formats() {
  static const std::vector<std::string> f = [] {
    std::vector<std::string> v;
    for (const auto& g : synth_generators()) v.push_back(g.format);
    return v;
  }();
  return f;
}

}  // namespace moepack
