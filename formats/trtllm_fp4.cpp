// FlashInfer TRT-LLM-Gen FP4 MoE layouts (formats/trtllm_fp4.h, docs/trtllm_fp4.md). Every
// transform is a row map (out[r] = in[src[r]], -1 = a padding row) applied by one gather per
// projection; scales take the same rows, then the 128x4 interleave. unpack applies the same maps
// backwards and checks that the padding is what vLLM's zero-initialised parameters hold.
#include "formats/trtllm_fp4.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/half.h"
#include "core/threads.h"
#include "formats/fp4.h"
#include "formats/fp8.h"
#include "formats/layout/trtllm_layout.h"
#include "formats/moe_reader.h"
#include "formats/trtllm_mxfp8.h"

namespace moepack {
namespace {

constexpr int64_t kMxBlock = 32;
constexpr int64_t kNvBlock = 16;

std::string num(int64_t v) {
  return std::to_string(v);
}

std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

std::string param(const LayoutOptions& o, const char* name) {
  return o.prefix + name;
}

// The layout family: its name, its scale block and the code spec it takes.
enum class Family { kMxfp4, kNvfp4 };

struct FamilyInfo {
  const char* layout;
  int64_t block;  // columns per block scale
};

FamilyInfo info(Family f) {
  if (f == Family::kNvfp4) return {"trtllm-nvfp4", kNvBlock};
  return {"trtllm-mxfp4", kMxBlock};
}

// vLLM 0.33's padded sizes for the family. MXFP4: mxfp4_round_up_hidden_size_and_intermediate_size
// (TRTLLM backends: H to 256, I to 128). NVFP4: align_fp4_moe_hidden_dim_for_fi (H to 256,
// trtllm_nvfp4_hidden_alignment for static activation scales) and align_fp4_moe_weights_for_fi
// (I to 64 gated, so that 2 Ip is a multiple of 128, else 128), each w13 half padded on its own.
int64_t padded_hidden(Family, int64_t hidden) {
  return round_up(hidden, 256);
}
int64_t padded_inter(Family f, int64_t inter, bool gated) {
  if (f == Family::kNvfp4) return round_up(inter, gated ? 64 : 128);
  return round_up(inter, 128);
}

// One projection: logical (n, k), physical (np, kp) and the physical -> logical row map.
struct ProjGeom {
  int64_t n = 0, k = 0, np = 0, kp = 0;
  std::vector<int32_t> src;
  int64_t scale_cols(int64_t block) const { return kp / block; }
};

struct Geometry {
  int64_t experts = 0, hidden = 0, inter = 0, hp = 0, ip = 0;
  ProjGeom proj[2];  // w13, w2
};

Geometry geometry(Family f, int64_t experts, int64_t hidden, int64_t inter, bool gated) {
  Geometry g;
  g.experts = experts;
  g.hidden = hidden;
  g.inter = inter;
  g.hp = padded_hidden(f, hidden);
  g.ip = padded_inter(f, inter, gated);
  const int64_t shards = gated ? 2 : 1;
  ProjGeom& w13 = g.proj[0];
  w13.n = shards * inter;
  w13.k = hidden;
  w13.np = shards * g.ip;
  w13.kp = g.hp;
  w13.src = trtllm_fp4_w13_rows(w13.np, inter, gated);
  ProjGeom& w2 = g.proj[1];
  w2.n = hidden;
  w2.k = inter;
  w2.np = g.hp;
  w2.kp = g.ip;
  w2.src = trtllm_fp4_w2_rows(g.hp, hidden);
  return g;
}

void not_fp4_reasons(Family f, const ProjShape& s, const char* what,
                     std::vector<std::string>* out) {
  const QuantSpec& q = s.quant;
  const std::string w = what;
  if (q.kind != CodeKind::kFp4E2M1 || q.bits != 4)
    out->push_back(w + " codes are not float4_e2m1 (" + info(f).layout + " takes FP4)");
  if (q.group_size != info(f).block)
    out->push_back(w + " group_size " + num(q.group_size) + ", " + info(f).layout + " needs " +
                   num(info(f).block));
  if (q.scale_block_n != 1)
    out->push_back(w + " scale_block_n " + num(q.scale_block_n) + ", not 1");
  if (f == Family::kMxfp4 &&
      (!is_scale_byte_dtype(q.scale_dtype) || q.global_scale != GlobalScale::kNone))
    out->push_back(w + " scale dtype " + dtype_name(q.scale_dtype) +
                   ", MXFP4 needs U8/F8_E8M0 (E8M0 codes) and no global scale");
  if (f == Family::kNvfp4 &&
      (q.scale_dtype != DType::kF8_E4M3 || q.global_scale == GlobalScale::kNone))
    out->push_back(w + " scale dtype " + dtype_name(q.scale_dtype) +
                   ", NVFP4 needs F8_E4M3 block scales and a global scale");
  if (f == Family::kNvfp4 && q.input_global_scale == GlobalScale::kNone)
    out->push_back(w +
                   " has no activation global scale: weight-only NVFP4 (NVFP4A16, "
                   "W4A16_NVFP4) never reaches TrtLlmNvFp4Experts, which takes NVFP4 "
                   "activations only (kNvfp4Dynamic); vLLM 0.33 takes a later backend");
  if (!q.symmetric) out->push_back(w + " has zero points");
  if (s.act_order) out->push_back(w + " has g_idx (act-order)");
}

std::vector<std::string> nvfp4_unsupported_reasons(const LayoutOptions& o, const MoeShape& x) {
  std::vector<std::string> why = moe_shape_problems(o, x);
  if (o.vllm_target != VllmTarget::kV0_33)
    why.push_back(std::string("trtllm-nvfp4 follows vLLM 0.33.0's "
                              "prepare_nvfp4_moe_layer_for_fi_or_cutlass; --vllm-target ") +
                  vllm_target_name(o.vllm_target) + " is not written");
  if (o.source_method != QuantMethod::kModeloptNvfp4 && o.source_method != QuantMethod::kCtNvfp4)
    why.push_back(std::string("source method ") + quant_method_name(o.source_method) +
                  ": trtllm-nvfp4 writes what ModelOptNvFp4FusedMoE and "
                  "CompressedTensorsW4A4Nvfp4MoEMethod hold");
  not_fp4_reasons(Family::kNvfp4, x.w13, "w13", &why);
  not_fp4_reasons(Family::kNvfp4, x.w2, "w2", &why);
  const int64_t H = x.hidden(), I = x.inter();
  if (H % kNvBlock != 0)
    why.push_back("H=" + num(H) + " is not a multiple of 16 (NVFP4 blocks along w13's K)");
  if (I % kNvBlock != 0)
    why.push_back("I=" + num(I) + " is not a multiple of 16 (NVFP4 blocks along w2's K)");
  return why;
}

std::vector<std::string> unsupported_reasons(Family f, const LayoutOptions& o, const MoeShape& x) {
  if (f == Family::kNvfp4) return nvfp4_unsupported_reasons(o, x);
  std::vector<std::string> why = moe_shape_problems(o, x);
  const char* layout = info(f).layout;
  if (o.vllm_target != VllmTarget::kV0_33)
    why.push_back(std::string(layout) +
                  " follows vLLM 0.33.0's convert_gpt_oss_weight_to_mxfp4_moe_kernel_format; "
                  "--vllm-target " +
                  vllm_target_name(o.vllm_target) + " is not written");
  if (o.source_method != QuantMethod::kGptOssMxfp4)
    why.push_back(std::string("source method ") + quant_method_name(o.source_method) +
                  ": vLLM 0.33 runs FlashInfer's TRT-LLM MXFP4 MoE for gpt-oss only "
                  "(GptOssMxfp4MoEMethod; compressed-tensors MXFP4 takes CUTLASS MXFP4 or Marlin)");
  if (o.act_dtype != DType::kBF16)
    why.push_back(std::string("activation dtype ") + dtype_name(o.act_dtype) +
                  ": FLASHINFER_TRTLLM_MXFP4_BF16 takes bf16 hidden states");
  not_fp4_reasons(f, x.w13, "w13", &why);
  not_fp4_reasons(f, x.w2, "w2", &why);
  if (!o.gated)
    why.push_back("non-gated layer: gpt-oss' experts are gated (w13 = gate and up, SwiGLU)");
  const int64_t H = x.hidden(), I = x.inter();
  if (H % kMxBlock != 0)
    why.push_back("H=" + num(H) + " is not a multiple of 32 (MXFP4 blocks along w13's K)");
  if (I % kMxBlock != 0)
    why.push_back("I=" + num(I) + " is not a multiple of 32 (MXFP4 blocks along w2's K)");
  return why;
}

void refuse(Family f, const LayoutOptions& o, const MoeExperts& x) {
  check_moe_structure(o, x);
  const std::vector<std::string> why = unsupported_reasons(f, o, moe_shape_of(x));
  if (why.empty()) return;
  std::string msg;
  for (const auto& w : why) msg += (msg.empty() ? "" : "; ") + w;
  throw Error(ErrorCode::kUnsupported, "", param(o, "w13_weight"),
              std::string(info(f).layout) + ": " + msg);
}

// ---- pack ---------------------------------------------------------------------------------------

// One expert's codes [n, k] (one per byte) and scales [n, k/block] into the physical weight
// [np, kp/2] and the 128x4-interleaved scales of [np, kp/block] (both zero-filled).
void pack_expert(const ProjGeom& g, int64_t block, const uint8_t* codes, const uint8_t* scales,
                 uint8_t* out_w, uint8_t* out_s) {
  const int64_t cols = g.scale_cols(block), real_cols = g.k / block, row_bytes = g.kp / 2;
  for (int64_t r = 0; r < g.np; ++r) {
    const int64_t lr = g.src[static_cast<size_t>(r)];
    if (lr < 0) continue;
    const uint8_t* c = codes + lr * g.k;
    uint8_t* w = out_w + r * row_bytes;
    for (int64_t j = 0; j < g.k / 2; ++j)
      w[j] = static_cast<uint8_t>((c[2 * j] & 15) | (c[2 * j + 1] & 15) << 4);
    for (int64_t b = 0; b < real_cols; ++b)
      out_s[trtllm::scale_128x4_offset(r, b, cols)] = scales[lr * real_cols + b];
  }
}

// The bf16 biases of one projection [E, n] as float32 [E, np] in physical row order.
Tensor pack_biases(const std::string& name, const MoeExperts& x, MoeProj p, const ProjGeom& g,
                   int64_t E) {
  const std::vector<uint8_t>& src = required_bf16_biases(x, p, g.n, name);
  Tensor t(name, DType::kF32, {E, g.np});
  float* out = t.as<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < g.np; ++r) {
      const int64_t lr = g.src[static_cast<size_t>(r)];
      if (lr < 0) continue;
      uint16_t h = 0;
      std::memcpy(&h, src.data() + (e * g.n + lr) * 2, 2);
      out[e * g.np + r] = bf16_to_float(h);
    }
  return t;
}

// Both projections' shuffled weights and interleaved block scales: {w13, w2} of each.
struct PackedCodes {
  std::vector<Tensor> weights, scales;
};

PackedCodes pack_codes(Family f, const LayoutOptions& o, const MoeExperts& x, const Geometry& G) {
  const int64_t E = x.w13.experts, block = info(f).block;
  const QuantTensor* q[2] = {&x.w13, &x.w2};
  const char* names[2][2] = {{"w13_weight", "w13_weight_scale"}, {"w2_weight", "w2_weight_scale"}};
  PackedCodes out;
  std::vector<Tensor>& weights = out.weights;
  std::vector<Tensor>& scales = out.scales;
  for (int i = 0; i < 2; ++i) {
    const ProjGeom& g = G.proj[i];
    Tensor w(param(o, names[i][0]), DType::kU8, {E, g.np, g.kp / 2});
    Tensor s(param(o, names[i][1]), DType::kF8_E4M3, {E, g.np, g.scale_cols(block)});
    const int64_t in_s = g.n * (g.k / block), out_s = g.np * g.scale_cols(block);
    parallel_for(E, o.threads, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e)
        pack_expert(g, block, q[i]->codes.data() + e * g.n * g.k, q[i]->scales.data() + e * in_s,
                    w.data.data() + e * g.np * (g.kp / 2), s.data.data() + e * out_s);
    });
    weights.push_back(std::move(w));
    scales.push_back(std::move(s));
  }
  return out;
}

std::vector<Tensor> pack(Family f, const LayoutOptions& o, const MoeExperts& x) {
  refuse(f, o, x);
  const int64_t E = x.w13.experts;
  const Geometry G = geometry(f, E, x.w13.k, x.w2.k, o.gated);
  PackedCodes codes = pack_codes(f, o, x, G);
  // vLLM's order: both weights, both scales, then the biases.
  std::vector<Tensor> out;
  for (auto& t : codes.weights) out.push_back(std::move(t));
  for (auto& t : codes.scales) out.push_back(std::move(t));
  out.push_back(pack_biases(param(o, "w13_bias"), x, MoeProj::kW13, G.proj[0], E));
  out.push_back(pack_biases(param(o, "w2_bias"), x, MoeProj::kW2, G.proj[1], E));
  return out;
}

std::vector<ParamSpec> param_specs(Family f, const LayoutOptions& o, const MoeShape& x) {
  const int64_t E = x.experts, block = info(f).block;
  const Geometry G = geometry(f, E, x.hidden(), x.inter(), o.gated);
  const ProjGeom &a = G.proj[0], &b = G.proj[1];
  return {{param(o, "w13_weight"), DType::kU8, {E, a.np, a.kp / 2}, ParamRole::kW13Weight},
          {param(o, "w2_weight"), DType::kU8, {E, b.np, b.kp / 2}, ParamRole::kW2Weight},
          {param(o, "w13_weight_scale"),
           DType::kF8_E4M3,
           {E, a.np, a.scale_cols(block)},
           ParamRole::kW13Scale},
          {param(o, "w2_weight_scale"),
           DType::kF8_E4M3,
           {E, b.np, b.scale_cols(block)},
           ParamRole::kW2Scale},
          {param(o, "w13_bias"), DType::kF32, {E, a.np}, ParamRole::kW13Bias},
          {param(o, "w2_bias"), DType::kF32, {E, b.np}, ParamRole::kW2Bias}};
}

// ---- the parameters as unpack and the reader check them -----------------------------------------

struct LayerView {
  Geometry geom;
  const Tensor* weight[2] = {nullptr, nullptr};
  const Tensor* scale[2] = {nullptr, nullptr};
  const Tensor* bias[2] = {nullptr, nullptr};
};

void expect(const Tensor& t, DType dtype, const Shape& shape) {
  if (t.dtype != dtype)
    throw Error(ErrorCode::kBadDtype, "", t.name,
                std::string("dtype ") + dtype_name(t.dtype) + ", expected " + dtype_name(dtype));
  if (t.shape != shape)
    throw Error(ErrorCode::kBadShape, "", t.name,
                "shape " + shape_str(t.shape) + ", expected " + shape_str(shape));
}

// The real size the layer's options give (0: the parameters' own), checked against the padded
// size the parameters carry.
int64_t real_size(int64_t want, int64_t carried, int64_t padded_of_want, const std::string& name,
                  const char* what, const char* layout) {
  if (want <= 0) return carried;
  if (want > carried || padded_of_want != carried)
    throw Error(ErrorCode::kBadShape, "", name,
                std::string("parameters carry ") + what + "=" + num(carried) +
                    ", which is not how vLLM 0.33 pads the layer's " + what + "=" + num(want) +
                    " for " + layout);
  return want;
}

LayerView read_layer(Family f, const LayoutOptions& o, const TensorMap& params) {
  const FamilyInfo fi = info(f);
  const std::string what = std::string(fi.layout) + " layout";
  LayerView L;
  const char* names[2][3] = {{"w13_weight", "w13_weight_scale", "w13_bias"},
                             {"w2_weight", "w2_weight_scale", "w2_bias"}};
  for (int i = 0; i < 2; ++i) {
    L.weight[i] = &require_tensor(params, param(o, names[i][0]), what);
    L.scale[i] = &require_tensor(params, param(o, names[i][1]), what);
    if (f == Family::kMxfp4) L.bias[i] = &require_tensor(params, param(o, names[i][2]), what);
  }
  const Tensor& w2 = *L.weight[1];
  if (w2.shape.size() != 3 || w2.shape[1] <= 0 || w2.shape[2] <= 0)
    throw Error(ErrorCode::kBadShape, "", w2.name,
                "shape " + shape_str(w2.shape) + ", expected [E, Hp, Ip/2]");
  const int64_t E = w2.shape[0], hp = w2.shape[1], ip = w2.shape[2] * 2;
  const int64_t ip_step = padded_inter(f, 1, o.gated);
  if (hp % 256 != 0 || ip % ip_step != 0)
    throw Error(ErrorCode::kBadShape, "", w2.name,
                "Hp=" + num(hp) + ", Ip=" + num(ip) + " are not " + fi.layout +
                    " extents (multiples of 256 and " + num(ip_step) + ")");
  const int64_t H =
      real_size(o.hidden, hp, padded_hidden(f, o.hidden), L.weight[0]->name, "H", fi.layout);
  const int64_t I =
      real_size(o.inter, ip, padded_inter(f, o.inter, o.gated), w2.name, "I", fi.layout);
  L.geom = geometry(f, E, H, I, o.gated);
  if (L.geom.hp != hp || L.geom.ip != ip)
    throw Error(ErrorCode::kBadShape, "", w2.name,
                "Hp=" + num(hp) + ", Ip=" + num(ip) +
                    " are not vLLM 0.33's padding of H=" + num(H) + ", I=" + num(I));
  for (int i = 0; i < 2; ++i) {
    const ProjGeom& g = L.geom.proj[i];
    expect(*L.weight[i], DType::kU8, {E, g.np, g.kp / 2});
    expect(*L.scale[i], DType::kF8_E4M3, {E, g.np, g.scale_cols(fi.block)});
    if (L.bias[i]) expect(*L.bias[i], DType::kF32, {E, g.np});
  }
  return L;
}

// ---- unpack -------------------------------------------------------------------------------------

[[noreturn]] void padding_not_zero(const Tensor& t, int64_t e, int64_t r, const char* what) {
  throw Error(ErrorCode::kBadValue, "", t.name,
              "expert " + num(e) + ": physical row " + num(r) + " holds " + what +
                  " in vLLM's zero padding");
}

void unpack_expert(const ProjGeom& g, int64_t block, const Tensor& wt, const Tensor& st, int64_t e,
                   uint8_t* codes, uint8_t* scales) {
  const int64_t cols = g.scale_cols(block), real_cols = g.k / block, row_bytes = g.kp / 2;
  const uint8_t* in_w = wt.data.data() + e * g.np * row_bytes;
  const uint8_t* in_s = st.data.data() + e * g.np * cols;
  for (int64_t r = 0; r < g.np; ++r) {
    const int64_t lr = g.src[static_cast<size_t>(r)];
    const uint8_t* w = in_w + r * row_bytes;
    for (int64_t j = lr < 0 ? 0 : g.k / 2; j < row_bytes; ++j)
      if (w[j] != 0) padding_not_zero(wt, e, r, "codes");
    for (int64_t b = lr < 0 ? 0 : real_cols; b < cols; ++b)
      if (in_s[trtllm::scale_128x4_offset(r, b, cols)] != 0) padding_not_zero(st, e, r, "scales");
    if (lr < 0) continue;
    uint8_t* c = codes + lr * g.k;
    for (int64_t j = 0; j < g.k / 2; ++j) {
      c[2 * j] = w[j] & 15;
      c[2 * j + 1] = w[j] >> 4;
    }
    for (int64_t b = 0; b < real_cols; ++b)
      scales[lr * real_cols + b] = in_s[trtllm::scale_128x4_offset(r, b, cols)];
  }
}

std::vector<uint8_t> unpack_biases(const Tensor& t, const ProjGeom& g, int64_t E) {
  std::vector<uint8_t> out(static_cast<size_t>(E * g.n * 2));
  const float* v = t.as<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < g.np; ++r) {
      const float b = v[e * g.np + r];
      const int64_t lr = g.src[static_cast<size_t>(r)];
      uint32_t bits = 0;
      std::memcpy(&bits, &b, 4);
      if (lr < 0) {
        if (bits != 0) padding_not_zero(t, e, r, "a bias");
        continue;
      }
      if ((bits & 0xffffu) != 0)
        throw Error(ErrorCode::kBadValue, "", t.name,
                    "expert " + num(e) + ": bias " + std::to_string(b) + " at physical row " +
                        num(r) + " is not a bf16 value (vLLM widens the bf16 biases to float32)");
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&out[static_cast<size_t>((e * g.n + lr) * 2)], &h, 2);
    }
  return out;
}

// Both projections' codes and block scales, into experts of `spec`.
void unpack_codes(Family f, const LayoutOptions& o, const LayerView& L, const QuantSpec& spec,
                  MoeExperts& x) {
  const int64_t E = L.geom.experts, block = info(f).block;
  QuantTensor* q[2] = {&x.w13, &x.w2};
  for (int i = 0; i < 2; ++i) {
    const ProjGeom& g = L.geom.proj[i];
    *q[i] = QuantTensor(spec, E, g.n, g.k);
    const int64_t per_s = g.n * (g.k / block);
    parallel_for(E, o.threads, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e)
        unpack_expert(g, block, *L.weight[i], *L.scale[i], e, q[i]->codes.data() + e * g.n * g.k,
                      q[i]->scales.data() + e * per_s);
    });
  }
}

MoeExperts unpack(Family f, const LayoutOptions& o, const TensorMap& params) {
  const LayerView L = read_layer(f, o, params);
  const int64_t E = L.geom.experts;
  MoeExperts x;
  unpack_codes(f, o, L, gpt_oss_mxfp4_spec_for(QuantParams{}), x);
  x.bias_dtype = DType::kBF16;
  x.w13_bias = unpack_biases(*L.bias[0], L.geom.proj[0], E);
  x.w2_bias = unpack_biases(*L.bias[1], L.geom.proj[1], E);
  return x;
}

reader::ProjReader make_reader(Family f, const LayoutOptions& o, const TensorMap& params,
                               MoeProj proj, const ParamLocator& locate) {
  const LayerView L = read_layer(f, o, params);
  const int i = proj == MoeProj::kW13 ? 0 : 1;
  const ProjGeom& g = L.geom.proj[i];
  reader::ProjReader r = blank_reader(reader::Kind::kTrtllmFp4, reader::ActQuant::kBf16);
  r.experts = L.geom.experts;
  r.n = g.n;
  r.k = g.k;
  reader::TrtllmFp4Params& t = r.trtllm_fp4;
  t.weight = static_cast<const uint8_t*>(locate_param(locate, params, L.weight[i]->name));
  t.weight_scale = static_cast<const uint8_t*>(locate_param(locate, params, L.scale[i]->name));
  t.global_scale = nullptr;
  t.global_shards = t.global_shard_rows = 1;
  t.scale_type = reader::kScaleE8m0;
  t.block = static_cast<int32_t>(info(f).block);
  t.gated_w13 = i == 0 && o.gated ? 1 : 0;
  t.np = g.np;
  t.kp = g.kp;
  t.scale_cols = g.scale_cols(info(f).block);
  t.inter = L.geom.inter;
  return r;
}

// ---- trtllm-nvfp4: the F32 parameters -----------------------------------------------------------
// vLLM 0.33 reduces each projection's activation scales to their maximum over the layer's experts
// (amax_for_moe_activation_quant, FlashInfer backends share one input scale), then
// TrtLlmNvFp4Experts folds it into the weights' second-level scales (g1_alphas = w * a13,
// g2_alphas = w * a2) and adds g1_scale_c = g1_alphas / a2 (non-gated: 1 / a2).

bool modelopt_source(const LayoutOptions& o) {
  return o.source_method == QuantMethod::kModeloptNvfp4;
}

// The decode value of a stored global or activation scale: ModelOpt stores it, compressed-tensors
// its reciprocal (vLLM computes 1.0 / tensor in float32).
float decode_of(float stored, bool modelopt) {
  return modelopt ? stored : 1.0f / stored;
}

const char* act_key(MoeProj p) {
  return p == MoeProj::kW13 ? "w13_input_scale" : "w2_input_scale";
}

std::string float_bits_text(float v) {
  uint32_t u = 0;
  std::memcpy(&u, &v, 4);
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", u);
  return buf;
}

// The layer's activation scale a of one projection (the decision decide_layer recorded).
float act_scale_decision(const LayoutOptions& o, MoeProj p) {
  const std::string key = act_key(p);
  const auto it = o.layer_decisions.find(key);
  if (it == o.layer_decisions.end())
    throw Error(ErrorCode::kBadConfig, "", "layout_decisions." + key,
                "no decision for " + key +
                    " (trtllm-nvfp4's activation scale is the maximum over all the layer's "
                    "experts: make_plan records it, moepack.json carries it)");
  const std::string& v = it->second;
  uint32_t u = 0;
  float a = 0.0f;
  const bool hex = v.size() == 10 && v.compare(0, 2, "0x") == 0 &&
                   std::all_of(v.begin() + 2, v.end(), ::isxdigit);
  if (hex) {
    u = static_cast<uint32_t>(std::stoul(v.substr(2), nullptr, 16));
    std::memcpy(&a, &u, 4);
  }
  if (!hex || !std::isfinite(a) || !(a > 0.0f))
    throw Error(ErrorCode::kBadConfig, "", "layout_decisions." + key,
                "\"" + v + "\" is not the bits of a positive finite float32 (0x%08x)");
  return a;
}

// The largest decoded activation scale of one projection's experts (0 when it has none).
float max_act_scale(const QuantTensor& q, bool modelopt) {
  float m = 0.0f;
  for (float v : q.input_scales) m = std::max(m, decode_of(v, modelopt));
  return m;
}

// vLLM's per-expert products: w13_weight_scale_2, w2_weight_scale_2 and g1_scale_c.
struct Folded {
  std::vector<float> ws13, ws2, g1c;
};

Folded fold_scales(const MoeExperts& x, float a13, float a2, bool modelopt, bool gated) {
  const int64_t E = x.w13.experts;
  Folded f;
  for (int64_t e = 0; e < E; ++e) {
    // The gate's global for all of w13 (layer.w13_weight_scale_2[:, 0]).
    const float g13 =
        decode_of(x.w13.global_scales[static_cast<size_t>(e * x.w13.global_shards)], modelopt);
    const float g2 =
        decode_of(x.w2.global_scales[static_cast<size_t>(e * x.w2.global_shards)], modelopt);
    f.ws13.push_back(g13 * a13);
    f.ws2.push_back(g2 * a2);
    f.g1c.push_back(gated ? f.ws13.back() * (1.0f / a2) : 1.0f / a2);
  }
  return f;
}

Tensor f32_tensor(const std::string& name, const Shape& shape, const std::vector<float>& v) {
  Tensor t(name, DType::kF32, shape);
  if (static_cast<int64_t>(v.size()) != numel(shape))
    throw Error(ErrorCode::kInternal, "", name, "value count does not match the shape");
  std::memcpy(t.data.data(), v.data(), v.size() * 4);
  return t;
}

// A canonical [E, global_shards] scale vector as vLLM's [E, shards] parameter (one shard stored
// for a gated w13: gate and up hold the same value).
std::vector<float> per_shard(const std::vector<float>& v, int64_t E, int64_t have, int64_t shards,
                             const std::string& name) {
  if (have == shards) return v;
  if (have != 1)
    throw Error(ErrorCode::kInternal, "", name,
                num(have) + " scale shards per expert, the parameter has " + num(shards));
  std::vector<float> out;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t j = 0; j < shards; ++j) out.push_back(v[static_cast<size_t>(e)]);
  return out;
}

std::vector<ParamSpec> nvfp4_param_specs(const LayoutOptions& o, const MoeShape& x) {
  const int64_t E = x.experts, sh = o.gated ? 2 : 1;
  const Geometry G = geometry(Family::kNvfp4, E, x.hidden(), x.inter(), o.gated);
  const ProjGeom &a = G.proj[0], &b = G.proj[1];
  using R = ParamRole;
  const ParamSpec w13{param(o, "w13_weight"), DType::kU8, {E, a.np, a.kp / 2}, R::kW13Weight};
  const ParamSpec w2{param(o, "w2_weight"), DType::kU8, {E, b.np, b.kp / 2}, R::kW2Weight};
  const ParamSpec s13{
      param(o, "w13_weight_scale"), DType::kF8_E4M3, {E, a.np, a.kp / kNvBlock}, R::kW13Scale};
  const ParamSpec s2{
      param(o, "w2_weight_scale"), DType::kF8_E4M3, {E, b.np, b.kp / kNvBlock}, R::kW2Scale};
  const ParamSpec g13{param(o, "w13_weight_scale_2"), DType::kF32, {E}, R::kW13GlobalScale};
  const ParamSpec g2{param(o, "w2_weight_scale_2"), DType::kF32, {E}, R::kW2GlobalScale};
  const ParamSpec c1{param(o, "g1_scale_c"), DType::kF32, {E}, R::kW13OutputScale};
  if (modelopt_source(o))
    return {w13,
            w2,
            s13,
            s2,
            g13,
            g2,
            {param(o, "w13_input_scale"), DType::kF32, {E}, R::kW13InputScale},
            {param(o, "w2_input_scale"), DType::kF32, {E}, R::kW2InputScale},
            c1};
  // CompressedTensorsW4A4Nvfp4MoEMethod: its loaded parameters stay, w13_weight / w2_weight are
  // registered anew after them, then the folded scales (replace_parameter registers new names).
  return {s13,
          s2,
          {param(o, "w13_weight_global_scale"), DType::kF32, {E, sh}, R::kW13SourceGlobalScale},
          {param(o, "w2_weight_global_scale"), DType::kF32, {E}, R::kW2SourceGlobalScale},
          {param(o, "w13_input_global_scale"), DType::kF32, {E, sh}, R::kW13InputScale},
          {param(o, "w2_input_global_scale"), DType::kF32, {E}, R::kW2InputScale},
          w13,
          w2,
          g13,
          g2,
          c1};
}

std::vector<Tensor> pack_nvfp4(const LayoutOptions& o, const MoeExperts& x) {
  refuse(Family::kNvfp4, o, x);
  if (x.has_biases())
    throw Error(ErrorCode::kUnsupported, "", param(o, "w13_weight"),
                "trtllm-nvfp4: NVFP4 experts carry no biases in vLLM 0.33");
  const int64_t E = x.w13.experts, sh = o.gated ? 2 : 1;
  const bool mo = modelopt_source(o);
  const float a13 = act_scale_decision(o, MoeProj::kW13), a2 = act_scale_decision(o, MoeProj::kW2);
  const Geometry G = geometry(Family::kNvfp4, E, x.w13.k, x.w2.k, o.gated);
  PackedCodes c = pack_codes(Family::kNvfp4, o, x, G);
  const Folded f = fold_scales(x, a13, a2, mo, o.gated);
  std::vector<Tensor> out;
  const auto add = [&](Tensor t) { out.push_back(std::move(t)); };
  if (mo) {
    add(std::move(c.weights[0]));
    add(std::move(c.weights[1]));
    add(std::move(c.scales[0]));
    add(std::move(c.scales[1]));
  } else {
    add(std::move(c.scales[0]));
    add(std::move(c.scales[1]));
    const std::string g13 = param(o, "w13_weight_global_scale");
    const std::string i13 = param(o, "w13_input_global_scale");
    add(f32_tensor(g13, {E, sh}, per_shard(x.w13.global_scales, E, x.w13.global_shards, sh, g13)));
    add(f32_tensor(param(o, "w2_weight_global_scale"), {E}, x.w2.global_scales));
    add(f32_tensor(i13, {E, sh}, per_shard(x.w13.input_scales, E, x.w13.global_shards, sh, i13)));
    add(f32_tensor(param(o, "w2_input_global_scale"), {E}, x.w2.input_scales));
    add(std::move(c.weights[0]));
    add(std::move(c.weights[1]));
  }
  add(f32_tensor(param(o, "w13_weight_scale_2"), {E}, f.ws13));
  add(f32_tensor(param(o, "w2_weight_scale_2"), {E}, f.ws2));
  if (mo) {
    add(f32_tensor(param(o, "w13_input_scale"), {E}, std::vector<float>(E, a13)));
    add(f32_tensor(param(o, "w2_input_scale"), {E}, std::vector<float>(E, a2)));
  }
  add(f32_tensor(param(o, "g1_scale_c"), {E}, f.g1c));
  return out;
}

// ---- trtllm-nvfp4: reading the F32 parameters back ----------------------------------------------

const float* f32_param(const TensorMap& params, const LayoutOptions& o, const char* name,
                       const Shape& shape) {
  const Tensor& t = require_tensor(params, param(o, name), "trtllm-nvfp4 layout");
  expect(t, DType::kF32, shape);
  return t.as<float>();
}

[[noreturn]] void bad_scale(const LayoutOptions& o, const char* name, int64_t e, float v,
                            const std::string& why) {
  throw Error(ErrorCode::kBadValue, "", param(o, name),
              "expert " + num(e) + ": " + float_text(v) + " " + why);
}

void check_positive(const LayoutOptions& o, const char* name, const float* v, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(v[i]) || !(v[i] > 0.0f))
      bad_scale(o, name, i, v[i], "is not a positive finite scale");
}

void check_equal(const LayoutOptions& o, const char* name, int64_t e, float got, float want,
                 const std::string& rule) {
  if (std::memcmp(&got, &want, 4) != 0)
    bad_scale(o, name, e, got, "is not " + rule + " = " + float_text(want) + " (vLLM 0.33's fold)");
}

// What the F32 parameters hold: the activation scales a13, a2 and, per expert, the canonical
// second-level and activation scales [E, shards] as stored.
struct Nvfp4Scalars {
  float a13 = 0.0f, a2 = 0.0f;
  std::vector<float> g13, g2, in13, in2;  // canonical global_scales / input_scales
  const float* fold13 = nullptr;          // the kernel's w13_weight_scale_2 [E]
  const float* fold2 = nullptr;
  const float* raw13 = nullptr;  // compressed-tensors' w13_weight_global_scale [E, shards]
  const float* raw2 = nullptr;
};

// ModelOpt: the folded products hold the canonical global scales (unfold_global); every input
// scale is the layer's maximum. compressed-tensors: the checkpoint's scales are kept; the folded
// products are checked against them.
Nvfp4Scalars read_nvfp4_scalars(const LayoutOptions& o, const TensorMap& params, int64_t E) {
  const bool mo = modelopt_source(o);
  const int64_t sh = o.gated ? 2 : 1;
  Nvfp4Scalars s;
  s.fold13 = f32_param(params, o, "w13_weight_scale_2", {E});
  s.fold2 = f32_param(params, o, "w2_weight_scale_2", {E});
  const float* g1c = f32_param(params, o, "g1_scale_c", {E});
  check_positive(o, "w13_weight_scale_2", s.fold13, E);
  check_positive(o, "w2_weight_scale_2", s.fold2, E);
  MoeExperts x;  // the canonical scales, for fold_scales' checks
  x.w13.experts = x.w2.experts = E;
  x.w13.global_shards = sh;
  if (mo) {
    const float* in13 = f32_param(params, o, "w13_input_scale", {E});
    const float* in2 = f32_param(params, o, "w2_input_scale", {E});
    check_positive(o, "w13_input_scale", in13, E);
    check_positive(o, "w2_input_scale", in2, E);
    s.a13 = E > 0 ? in13[0] : 1.0f;
    s.a2 = E > 0 ? in2[0] : 1.0f;
    for (int64_t e = 0; e < E; ++e) {
      check_equal(o, "w13_input_scale", e, in13[e], s.a13, "the layer's one w13 input scale");
      check_equal(o, "w2_input_scale", e, in2[e], s.a2, "the layer's one w2 input scale");
      const float g13 = trtllm::unfold_global(s.fold13[e], s.a13);
      const float g2 = trtllm::unfold_global(s.fold2[e], s.a2);
      if (!std::isfinite(g13))
        bad_scale(o, "w13_weight_scale_2", e, s.fold13[e], "is no float32 product with a13");
      if (!std::isfinite(g2))
        bad_scale(o, "w2_weight_scale_2", e, s.fold2[e], "is no float32 product with a2");
      for (int64_t j = 0; j < sh; ++j) {
        s.g13.push_back(g13);
        s.in13.push_back(s.a13);
      }
      s.g2.push_back(g2);
      s.in2.push_back(s.a2);
    }
  } else {
    s.raw13 = f32_param(params, o, "w13_weight_global_scale", {E, sh});
    s.raw2 = f32_param(params, o, "w2_weight_global_scale", {E});
    const float* i13 = f32_param(params, o, "w13_input_global_scale", {E, sh});
    const float* i2 = f32_param(params, o, "w2_input_global_scale", {E});
    check_positive(o, "w13_weight_global_scale", s.raw13, E * sh);
    check_positive(o, "w2_weight_global_scale", s.raw2, E);
    check_positive(o, "w13_input_global_scale", i13, E * sh);
    check_positive(o, "w2_input_global_scale", i2, E);
    s.g13.assign(s.raw13, s.raw13 + E * sh);
    s.g2.assign(s.raw2, s.raw2 + E);
    s.in13.assign(i13, i13 + E * sh);
    s.in2.assign(i2, i2 + E);
    // The layer's maximum (these experts' own where no decision is given: a whole layer).
    x.w13.input_scales = s.in13;
    x.w2.input_scales = s.in2;
    const bool decided = o.layer_decisions.count(act_key(MoeProj::kW13)) > 0;
    s.a13 = decided ? act_scale_decision(o, MoeProj::kW13) : max_act_scale(x.w13, false);
    s.a2 = decided ? act_scale_decision(o, MoeProj::kW2) : max_act_scale(x.w2, false);
  }
  x.w13.global_scales = s.g13;
  x.w2.global_scales = s.g2;
  const Folded f = fold_scales(x, s.a13, s.a2, mo, o.gated);
  for (int64_t e = 0; e < E; ++e) {
    check_equal(o, "w13_weight_scale_2", e, s.fold13[e], f.ws13[static_cast<size_t>(e)],
                "w13's global scale times a13");
    check_equal(o, "w2_weight_scale_2", e, s.fold2[e], f.ws2[static_cast<size_t>(e)],
                "w2's global scale times a2");
    check_equal(o, "g1_scale_c", e, g1c[e], f.g1c[static_cast<size_t>(e)],
                o.gated ? "w13_weight_scale_2 / a2" : "1 / a2");
  }
  return s;
}

QuantSpec nvfp4_spec(const LayoutOptions& o) {
  QuantParams p;
  p.dynamic_input = false;
  return modelopt_source(o) ? modelopt_nvfp4_spec_for(p) : ct_nvfp4_spec_for(p);
}

MoeExperts unpack_nvfp4(const LayoutOptions& o, const TensorMap& params) {
  const LayerView L = read_layer(Family::kNvfp4, o, params);
  const int64_t E = L.geom.experts;
  const Nvfp4Scalars s = read_nvfp4_scalars(o, params, E);
  MoeExperts x;
  unpack_codes(Family::kNvfp4, o, L, nvfp4_spec(o), x);
  x.w13.global_shards = o.gated ? 2 : 1;
  x.w13.global_scales = s.g13;
  x.w13.input_scales = s.in13;
  x.w2.global_scales = s.g2;
  x.w2.input_scales = s.in2;
  x.w13.check_consistent(param(o, "w13_weight"));
  x.w2.check_consistent(param(o, "w2_weight"));
  return x;
}

reader::ProjReader make_nvfp4_reader(const LayoutOptions& o, const TensorMap& params, MoeProj proj,
                                     const ParamLocator& locate) {
  const LayerView L = read_layer(Family::kNvfp4, o, params);
  const Nvfp4Scalars s = read_nvfp4_scalars(o, params, L.geom.experts);
  const int i = proj == MoeProj::kW13 ? 0 : 1;
  const ProjGeom& g = L.geom.proj[i];
  reader::ProjReader r = blank_reader(reader::Kind::kTrtllmFp4, reader::ActQuant::kNvfp4Block16);
  r.experts = L.geom.experts;
  r.n = g.n;
  r.k = g.k;
  r.act_scale = i == 0 ? s.a13 : s.a2;
  reader::TrtllmFp4Params& t = r.trtllm_fp4;
  t.weight = static_cast<const uint8_t*>(locate_param(locate, params, L.weight[i]->name));
  t.weight_scale = static_cast<const uint8_t*>(locate_param(locate, params, L.scale[i]->name));
  const bool mo = modelopt_source(o);
  // ModelOpt: the kernel's folded scale, unfolded by the reader; compressed-tensors: the kept
  // checkpoint scales (an encode divisor per gate / up shard).
  const char* global = mo ? (i == 0 ? "w13_weight_scale_2" : "w2_weight_scale_2")
                          : (i == 0 ? "w13_weight_global_scale" : "w2_weight_global_scale");
  t.global_scale = static_cast<const float*>(locate_param(locate, params, param(o, global)));
  t.global_type = mo ? reader::kGlobalDecode : reader::kGlobalEncode;
  t.global_shards = !mo && i == 0 && o.gated ? 2 : 1;
  t.global_shard_rows = g.n / t.global_shards;
  t.global_fold = mo ? r.act_scale : 0.0f;
  t.scale_type = reader::kScaleE4m3;
  t.block = static_cast<int32_t>(kNvBlock);
  t.gated_w13 = i == 0 && o.gated ? 1 : 0;
  t.np = g.np;
  t.kp = g.kp;
  t.scale_cols = g.scale_cols(kNvBlock);
  t.inter = L.geom.inter;
  return r;
}

}  // namespace

std::vector<int32_t> trtllm_fp4_w13_rows(int64_t rows, int64_t inter, bool gated) {
  std::vector<int32_t> src = shuffle_matrix_a_rows(rows, 128);
  for (auto& s : src) {
    const int64_t pre = s;
    if (gated)
      s = pre < 2 * inter ? static_cast<int32_t>(pre % 2 == 0 ? inter + pre / 2 : pre / 2) : -1;
    else
      s = pre < inter ? static_cast<int32_t>(pre) : -1;
  }
  return src;
}

std::vector<int32_t> trtllm_fp4_w2_rows(int64_t rows, int64_t real_rows) {
  std::vector<int32_t> src = shuffle_matrix_a_rows(rows, 128);
  for (auto& s : src)
    if (s >= real_rows) s = -1;
  return src;
}

// ---- trtllm-mxfp4 -------------------------------------------------------------------------------

std::vector<std::string> trtllm_mxfp4_unsupported_reasons(const LayoutOptions& o,
                                                          const MoeShape& x) {
  return unsupported_reasons(Family::kMxfp4, o, x);
}
std::vector<ParamSpec> trtllm_mxfp4_param_specs(const LayoutOptions& o, const MoeShape& x) {
  return param_specs(Family::kMxfp4, o, x);
}
std::vector<Tensor> pack_trtllm_mxfp4_moe(const LayoutOptions& o, const MoeExperts& x) {
  return pack(Family::kMxfp4, o, x);
}
MoeExperts unpack_trtllm_mxfp4_moe(const LayoutOptions& o, const TensorMap& params) {
  return unpack(Family::kMxfp4, o, params);
}
reader::ProjReader trtllm_mxfp4_make_reader(const LayoutOptions& o, const TensorMap& params,
                                            MoeProj proj, const ParamLocator& locate) {
  return make_reader(Family::kMxfp4, o, params, proj, locate);
}
reader::ActQuant trtllm_mxfp4_act_quant(const LayoutOptions&) {
  return reader::ActQuant::kBf16;
}
std::vector<std::string> trtllm_mxfp4_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  // Byte-identical to GptOssMxfp4MoEMethod's FLASHINFER_TRTLLM_MXFP4_BF16 post-processing for
  // every shape it takes (tests/golden/trtllm_fp4.cpp against FlashInfer 0.7.2.post1's own rows
  // and interleave).
  return {};
}
int64_t trtllm_mxfp4_padded_inter(const LayoutOptions& o, const MoeShape& x) {
  return padded_inter(Family::kMxfp4, x.inter(), o.gated);
}

// ---- trtllm-nvfp4 -------------------------------------------------------------------------------

std::vector<std::string> trtllm_nvfp4_unsupported_reasons(const LayoutOptions& o,
                                                          const MoeShape& x) {
  return unsupported_reasons(Family::kNvfp4, o, x);
}
std::vector<ParamSpec> trtllm_nvfp4_param_specs(const LayoutOptions& o, const MoeShape& x) {
  return nvfp4_param_specs(o, x);
}
std::vector<Tensor> pack_trtllm_nvfp4_moe(const LayoutOptions& o, const MoeExperts& x) {
  return pack_nvfp4(o, x);
}
MoeExperts unpack_trtllm_nvfp4_moe(const LayoutOptions& o, const TensorMap& params) {
  return unpack_nvfp4(o, params);
}
reader::ProjReader trtllm_nvfp4_make_reader(const LayoutOptions& o, const TensorMap& params,
                                            MoeProj proj, const ParamLocator& locate) {
  return make_nvfp4_reader(o, params, proj, locate);
}
reader::ActQuant trtllm_nvfp4_act_quant(const LayoutOptions&) {
  return reader::ActQuant::kNvfp4Block16;
}
std::vector<std::string> trtllm_nvfp4_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  // Byte-identical to ModelOptNvFp4FusedMoE's / CompressedTensorsW4A4Nvfp4MoEMethod's
  // FLASHINFER_TRTLLM post-processing (tests/golden/trtllm_nvfp4.cpp against vLLM 0.33.0's own
  // functions and FlashInfer 0.7.2.post1's interleave).
  return {};
}
int64_t trtllm_nvfp4_padded_inter(const LayoutOptions& o, const MoeShape& x) {
  return padded_inter(Family::kNvfp4, x.inter(), o.gated);
}

std::map<std::string, std::string> trtllm_nvfp4_decide_layer(const LayoutOptions& o,
                                                             const MoeShape&,
                                                             const LayerExperts& layer) {
  const bool mo = modelopt_source(o);
  float a[2] = {0.0f, 0.0f};
  const int64_t step = std::max<int64_t>(1, layer.max_per_load);
  for (int64_t e = 0; e < layer.experts; e += step) {
    const MoeExperts chunk = layer.load(e, std::min(layer.experts, e + step));
    a[0] = std::max(a[0], max_act_scale(chunk.w13, mo));
    a[1] = std::max(a[1], max_act_scale(chunk.w2, mo));
  }
  for (int i = 0; i < 2; ++i)
    if (!std::isfinite(a[i]) || !(a[i] > 0.0f))
      throw Error(ErrorCode::kBadValue, "", param(o, i == 0 ? "w13_weight" : "w2_weight"),
                  "trtllm-nvfp4: the experts' largest activation scale is " + float_text(a[i]) +
                      ", not a positive finite float");
  return {{act_key(MoeProj::kW13), float_bits_text(a[0])},
          {act_key(MoeProj::kW2), float_bits_text(a[1])}};
}

MoeExperts trtllm_nvfp4_vllm_loaded(const LayoutOptions& o, const MoeExperts& x) {
  MoeExperts out = x;
  // vLLM's w13 scales are [E, 2] for gated experts: one stored per expert stands for both.
  QuantTensor& w13 = out.w13;
  if (o.gated && w13.global_shards == 1 && w13.global_scale != GlobalScale::kNone) {
    const int64_t E = w13.experts;
    w13.global_scales = per_shard(w13.global_scales, E, 1, 2, param(o, "w13_weight"));
    if (!w13.input_scales.empty())
      w13.input_scales = per_shard(w13.input_scales, E, 1, 2, param(o, "w13_weight"));
    w13.global_shards = 2;
  }
  if (!modelopt_source(o)) return out;  // compressed-tensors: vLLM keeps the loaded scales
  const float a[2] = {act_scale_decision(o, MoeProj::kW13), act_scale_decision(o, MoeProj::kW2)};
  QuantTensor* q[2] = {&out.w13, &out.w2};
  for (int i = 0; i < 2; ++i) {
    const int64_t sh = q[i]->global_shards;
    if (q[i]->global_scales.empty()) continue;
    for (int64_t e = 0; e < q[i]->experts; ++e) {
      // vLLM keeps fl(g_gate * a): the class of g that product stands for, for every shard.
      const float g =
          trtllm::unfold_global(q[i]->global_scales[static_cast<size_t>(e * sh)] * a[i], a[i]);
      for (int64_t j = 0; j < sh; ++j) {
        q[i]->global_scales[static_cast<size_t>(e * sh + j)] = g;
        if (!q[i]->input_scales.empty()) q[i]->input_scales[static_cast<size_t>(e * sh + j)] = a[i];
      }
    }
  }
  return out;
}

}  // namespace moepack
