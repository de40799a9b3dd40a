// FlashInfer TRT-LLM-Gen FP4 MoE layouts (formats/trtllm_fp4.h, docs/trtllm_fp4.md). Every
// transform is a row map (out[r] = in[src[r]], -1 = a padding row) applied by one gather per
// projection; scales take the same rows, then the 128x4 interleave. unpack applies the same maps
// backwards and checks that the padding is what vLLM's zero-initialised parameters hold.
#include "formats/trtllm_fp4.h"

#include <cstring>

#include "core/half.h"
#include "core/threads.h"
#include "formats/fp4.h"
#include "formats/layout/trtllm_layout.h"
#include "formats/moe_reader.h"
#include "formats/trtllm_mxfp8.h"

namespace moepack {
namespace {

constexpr int64_t kMxBlock = 32;

std::string num(int64_t v) {
  return std::to_string(v);
}

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

std::string param(const LayoutOptions& o, const char* name) {
  return o.prefix + name;
}

// The layout family: its name, its scale block and the code spec it takes.
enum class Family { kMxfp4 };

struct FamilyInfo {
  const char* layout;
  int64_t block;  // columns per block scale
};

FamilyInfo info(Family) {
  return {"trtllm-mxfp4", kMxBlock};
}

// vLLM 0.33's padded sizes for the family: mxfp4_round_up_hidden_size_and_intermediate_size
// (TRTLLM backends: H to 256, I to 128).
int64_t padded_hidden(Family, int64_t hidden) {
  return round_up(hidden, 256);
}
int64_t padded_inter(Family, int64_t inter, bool) {
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
  if (!is_scale_byte_dtype(q.scale_dtype) || q.global_scale != GlobalScale::kNone)
    out->push_back(w + " scale dtype " + dtype_name(q.scale_dtype) +
                   ", MXFP4 needs U8/F8_E8M0 (E8M0 codes) and no global scale");
  if (!q.symmetric) out->push_back(w + " has zero points");
  if (s.act_order) out->push_back(w + " has g_idx (act-order)");
}

std::vector<std::string> unsupported_reasons(Family f, const LayoutOptions& o, const MoeShape& x) {
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

std::vector<Tensor> pack(Family f, const LayoutOptions& o, const MoeExperts& x) {
  refuse(f, o, x);
  const int64_t E = x.w13.experts, block = info(f).block;
  const Geometry G = geometry(f, E, x.w13.k, x.w2.k, o.gated);
  const QuantTensor* q[2] = {&x.w13, &x.w2};
  const char* names[2][2] = {{"w13_weight", "w13_weight_scale"}, {"w2_weight", "w2_weight_scale"}};
  std::vector<Tensor> weights, scales;
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
  // vLLM's order: both weights, both scales, then the biases.
  std::vector<Tensor> out;
  for (auto& t : weights) out.push_back(std::move(t));
  for (auto& t : scales) out.push_back(std::move(t));
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
    L.bias[i] = &require_tensor(params, param(o, names[i][2]), what);
  }
  const Tensor& w2 = *L.weight[1];
  if (w2.shape.size() != 3 || w2.shape[1] <= 0 || w2.shape[2] <= 0)
    throw Error(ErrorCode::kBadShape, "", w2.name,
                "shape " + shape_str(w2.shape) + ", expected [E, Hp, Ip/2]");
  const int64_t E = w2.shape[0], hp = w2.shape[1], ip = w2.shape[2] * 2;
  if (hp % 256 != 0 || ip % 128 != 0)
    throw Error(ErrorCode::kBadShape, "", w2.name,
                "Hp=" + num(hp) + ", Ip=" + num(ip) + " are not " + fi.layout +
                    " extents (multiples of 256 and 128)");
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
    expect(*L.bias[i], DType::kF32, {E, g.np});
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

MoeExperts unpack(Family f, const LayoutOptions& o, const TensorMap& params) {
  const LayerView L = read_layer(f, o, params);
  const int64_t E = L.geom.experts, block = info(f).block;
  MoeExperts x;
  QuantTensor* q[2] = {&x.w13, &x.w2};
  for (int i = 0; i < 2; ++i) {
    const ProjGeom& g = L.geom.proj[i];
    *q[i] = QuantTensor(gpt_oss_mxfp4_spec_for(QuantParams{}), E, g.n, g.k);
    const int64_t per_s = g.n * (g.k / block);
    parallel_for(E, o.threads, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e)
        unpack_expert(g, block, *L.weight[i], *L.scale[i], e, q[i]->codes.data() + e * g.n * g.k,
                      q[i]->scales.data() + e * per_s);
    });
  }
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
  t.scale_type = reader::kScaleE8m0;
  t.block = static_cast<int32_t>(info(f).block);
  t.gated_w13 = i == 0 && o.gated ? 1 : 0;
  t.np = g.np;
  t.kp = g.kp;
  t.scale_cols = g.scale_cols(info(f).block);
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

}  // namespace moepack
