// triton-mxfp4 (formats/triton_mxfp4.h, docs/triton_mxfp4.md): vLLM 0.33.0's gpt-oss MXFP4
// experts for the OAI Triton kernels on Hopper, the index maps of
// formats/layout/triton_mxfp4_layout.h applied to the loader's padded, interleaved parameters.
#include "formats/triton_mxfp4.h"

#include <cstring>

#include "core/half.h"
#include "core/threads.h"
#include "formats/layout/triton_mxfp4_layout.h"
#include "formats/moe_reader.h"
#include "formats/wna16_util.h"

namespace moepack {
namespace {

constexpr const char* kLayout = "triton-mxfp4";
constexpr int64_t kMxBlock = 32;
// _swizzle_mxfp4's default, which convert_gpt_oss_weight_to_mxfp4_moe_kernel_format keeps; the
// kernel takes its warps from the scale layout (opt_flags_nvidia.compute_num_warps).
constexpr int64_t kNumWarps = 8;

std::string num(int64_t v) {
  return std::to_string(v);
}
int64_t round_up(int64_t v, int64_t unit) {
  return (v + unit - 1) / unit * unit;
}
const char* proj_name(MoeProj p) {
  return p == MoeProj::kW13 ? "w13" : "w2";
}
std::string weight_name(MoeProj p) {
  return std::string(proj_name(p)) + "_weight";
}
std::string scale_name(MoeProj p) {
  return std::string(proj_name(p)) + "_weight_scale";
}
std::string bias_name(MoeProj p) {
  return std::string(proj_name(p)) + "_bias";
}

// mxfp4_round_up_hidden_size_and_intermediate_size for Mxfp4MoeBackend.TRITON on CUDA (its last
// branch): I to a multiple of 64, H unchanged.
int64_t padded_inter_of(int64_t inter) {
  return round_up(inter, 64);
}

// One projection as vLLM holds it before the swizzle and as the swizzle pads it.
struct Geom {
  int64_t n = 0, k = 0;        // logical rows ([gate; up] for w13) and K
  int64_t rows = 0, cols = 0;  // the loader's parameter: 2Ip x H (w13), H x Ip (w2)
  int64_t mp = 0, kbp = 0;     // values: rows to 16, bytes per row (cols / 2) to 32
  int64_t msp = 0, gp = 0;     // scales: rows to 32 * num_warps, groups (cols / 32) to 4
  int64_t inter = 0;
  bool interleaved = false;  // w13: physical row 2j gate j, 2j + 1 up j, rows 2I.. zero
  // The logical row of physical row r (-1: padding).
  int64_t logical_row(int64_t r) const {
    if (!interleaved) return r < n ? r : -1;
    return r < 2 * inter ? (r % 2) * inter + r / 2 : -1;
  }
  int64_t value_bytes() const { return mp * kbp; }
  int64_t scale_bytes() const { return msp * gp; }
};

Geom geom(MoeProj p, int64_t hidden, int64_t inter, int64_t ip) {
  Geom g;
  g.inter = inter;
  if (p == MoeProj::kW13) {
    g.n = 2 * inter;
    g.k = hidden;
    g.rows = 2 * ip;
    g.cols = hidden;
    g.interleaved = true;
  } else {
    g.n = hidden;
    g.k = inter;
    g.rows = hidden;
    g.cols = ip;
  }
  g.mp = round_up(g.rows, 16);
  g.kbp = round_up(g.cols / 2, 32);
  g.msp = round_up(g.rows, 32 * kNumWarps);
  g.gp = round_up(round_up(g.cols / kMxBlock, 4), 2);
  return g;
}

void proj_reasons(const ProjShape& s, const char* what, std::vector<std::string>* why) {
  const QuantSpec& q = s.quant;
  if (q.kind != CodeKind::kFp4E2M1 || q.group_size != kMxBlock || q.scale_block_n != 1 ||
      q.global_scale != GlobalScale::kNone || dtype_bits(q.scale_dtype) != 8 || !q.symmetric)
    why->push_back(std::string(what) +
                   ": not MXFP4 (e2m1 codes, one E8M0 scale per 32 along K, no global scale)");
  if (s.act_order) why->push_back(std::string(what) + ": act-order g_idx (MXFP4 has none)");
}

}  // namespace

std::vector<std::string> triton_mxfp4_unsupported_reasons(const LayoutOptions& o,
                                                          const MoeShape& x) {
  std::vector<std::string> why = moe_shape_problems(o, x);
  if (o.vllm_target != VllmTarget::kV0_33)
    why.push_back(std::string(kLayout) + " follows vLLM 0.33.0's _swizzle_mxfp4; --vllm-target " +
                  vllm_target_name(o.vllm_target) + " is not written");
  if (o.source_method != QuantMethod::kGptOssMxfp4)
    why.push_back(std::string("source method ") + quant_method_name(o.source_method) +
                  " has no vLLM 0.33 OAI Triton MoE path (only gpt-oss' GptOssMxfp4MoEMethod "
                  "selects Mxfp4MoeBackend.TRITON)");
  if (o.target_arch != TargetArch::kSm90)
    why.push_back(std::string("target ") + target_arch_name(o.target_arch) +
                  ": moepack writes the Hopper swizzle (HopperMXValueLayout / HopperMXScaleLayout, "
                  "sm90); from sm100 on triton_kernels swizzle for Blackwell");
  if (o.act_dtype != DType::kBF16)
    why.push_back(std::string("activation dtype ") + dtype_name(o.act_dtype) +
                  ": vLLM 0.33's gpt-oss MXFP4 config takes bf16 activations only "
                  "(Mxfp4Config.get_supported_act_dtypes)");
  if (!o.gated)
    why.push_back(
        "non-gated layer: the OAI Triton MoE fuses gpt-oss' SwiGLU over interleaved gate/up "
        "rows (w13 = 2I rows)");
  proj_reasons(x.w13, "w13", &why);
  proj_reasons(x.w2, "w2", &why);
  const int64_t H = x.hidden(), I = x.inter();
  if (H <= 0 || I <= 0 || x.experts < 1) return why;
  if (H % kMxBlock != 0)
    why.push_back("H=" + num(H) + " is not a multiple of 32 (MXFP4 blocks along w13's K)");
  if (I % kMxBlock != 0)
    why.push_back("I=" + num(I) + " is not a multiple of 32 (MXFP4 blocks along w2's K)");
  for (auto& r : triton_mxfp4_kernel_failures(o, x)) why.push_back(std::move(r));
  return why;
}

std::vector<std::string> triton_mxfp4_kernel_failures(const LayoutOptions&, const MoeShape& x) {
  std::vector<std::string> why;
  const int64_t H = x.hidden(), I = x.inter();
  if (H <= 0 || I <= 0 || x.experts < 1) return why;
  // What vLLM 0.33's matmul_ogs runs on Hopper (checked on an H200, bench/gpu_triton_mxfp4.sh):
  // compute_block_n takes BLOCK_N = 256 only for N > 128, and the HOPPER_SCALE path asserts
  // BLOCK_N % (2 * num_warps * 2 * 8) == 0 (num_warps 8), so an N <= 128 does not compile; with
  // H % 64 != 0 (H = 96) w13's product came out wrong (norm error 0.68), with H % 64 == 0 right.
  const int64_t ip = padded_inter_of(I);
  if (2 * ip <= 128)
    why.push_back("w13 GEMM N = 2Ip = " + num(2 * ip) +
                  " <= 128: matmul_ogs on Hopper then takes BLOCK_N <= 128, which its Hopper scale "
                  "swizzle (num_warps 8) cannot read (static_assert BLOCK_N % 256 == 0)");
  if (H <= 128)
    why.push_back("w2 GEMM N = H = " + num(H) +
                  " <= 128: matmul_ogs on Hopper then takes BLOCK_N <= 128, which its Hopper scale "
                  "swizzle (num_warps 8) cannot read (static_assert BLOCK_N % 256 == 0)");
  if (H % 64 != 0)
    why.push_back("H=" + num(H) +
                  " is not a multiple of 64: matmul_ogs on Hopper reads w13's swizzled values in "
                  "K blocks of 64 and computes a wrong product (measured at H=96)");
  return why;
}

int64_t triton_mxfp4_padded_inter(const LayoutOptions&, const MoeShape& x) {
  return padded_inter_of(x.inter());
}

std::vector<ParamSpec> triton_mxfp4_param_specs(const LayoutOptions& o, const MoeShape& x) {
  const int64_t E = x.experts, H = x.hidden(), I = x.inter(), ip = padded_inter_of(I);
  std::vector<ParamSpec> out;
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2}) {
    const Geom g = geom(p, H, I, ip);
    out.push_back({o.prefix + weight_name(p),
                   DType::kU8,
                   {E, g.mp / 4, g.kbp * 4},
                   param_role_of(p, ParamRole::kW13Weight)});
  }
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2}) {
    const Geom g = geom(p, H, I, ip);
    out.push_back({o.prefix + scale_name(p),
                   DType::kU8,
                   {E, g.msp / 32, g.gp * 32},
                   param_role_of(p, ParamRole::kW13Scale)});
  }
  out.push_back(
      {o.prefix + bias_name(MoeProj::kW13), DType::kF32, {E, 2 * ip}, ParamRole::kW13Bias});
  out.push_back({o.prefix + bias_name(MoeProj::kW2), DType::kF32, {E, H}, ParamRole::kW2Bias});
  return out;
}

namespace {

// One expert's swizzled values and scales from its canonical codes [n, k] and scales [n, k/32].
void pack_expert(const Geom& g, const uint8_t* codes, const uint8_t* scales, uint8_t* values,
                 uint8_t* swizzled_scales) {
  const int64_t G = g.k / kMxBlock;
  std::vector<uint32_t> words(static_cast<size_t>(g.value_bytes() / 4), 0u);
  for (int64_t r = 0; r < g.rows; ++r) {
    const int64_t lr = g.logical_row(r);
    if (lr < 0) continue;
    const uint8_t* row = codes + lr * g.k;
    for (int64_t c = 0; c < g.k; ++c) {
      const int64_t b = c >> 1;
      words[static_cast<size_t>(triton_mx::value_word(r, b, g.kbp))] |=
          triton_mx::value_bits(row[c] & 15u, triton_mx::value_slot(r, b), static_cast<int>(c & 1));
    }
    for (int64_t gi = 0; gi < G; ++gi)
      swizzled_scales[triton_mx::scale_offset(r, gi, g.gp, kNumWarps)] = scales[lr * G + gi];
  }
  for (size_t i = 0; i < words.size(); ++i) wna16::store_u32(values + 4 * i, words[i]);
}

// The biases of one projection as vLLM leaves them: the loader's physical rows (zeros in the
// padding), bf16 -> float32 (exact).
Tensor pack_biases(const LayoutOptions& o, const MoeExperts& x, MoeProj p, const Geom& g) {
  const int64_t E = p == MoeProj::kW13 ? x.w13.experts : x.w2.experts;
  const std::string name = o.prefix + bias_name(p);
  const std::vector<uint8_t>& src = required_bf16_biases(x, p, g.n, name);
  Tensor t(name, DType::kF32, {E, g.rows});
  float* out = reinterpret_cast<float*>(t.data.data());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < g.rows; ++r) {
      const int64_t lr = g.logical_row(r);
      uint16_t h = 0;
      if (lr >= 0) std::memcpy(&h, src.data() + (e * g.n + lr) * 2, 2);
      out[e * g.rows + r] = bf16_to_float(h);
    }
  return t;
}

void refuse(const LayoutOptions& o, const MoeExperts& x) {
  check_moe_structure(o, x);
  const std::vector<std::string> why = triton_mxfp4_unsupported_reasons(o, moe_shape_of(x));
  if (why.empty()) return;
  std::string msg;
  for (const auto& w : why) msg += (msg.empty() ? "" : "; ") + w;
  throw Error(ErrorCode::kUnsupported, "", o.prefix + "w13_weight",
              std::string(kLayout) + ": " + msg);
}

}  // namespace

std::vector<Tensor> pack_triton_mxfp4_moe(const LayoutOptions& o, const MoeExperts& x) {
  refuse(o, x);
  const int64_t E = x.w13.experts, H = x.w13.k, I = x.w2.k, ip = padded_inter_of(I);
  std::vector<Tensor> weights, scales;
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2}) {
    const Geom g = geom(p, H, I, ip);
    const QuantTensor& q = p == MoeProj::kW13 ? x.w13 : x.w2;
    Tensor w(o.prefix + weight_name(p), DType::kU8, {E, g.mp / 4, g.kbp * 4});
    Tensor s(o.prefix + scale_name(p), DType::kU8, {E, g.msp / 32, g.gp * 32});
    const int64_t G = g.k / kMxBlock;
    parallel_for(E, o.threads, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e)
        pack_expert(g, q.codes.data() + e * g.n * g.k, q.scales.data() + e * g.n * G,
                    w.data.data() + e * g.value_bytes(), s.data.data() + e * g.scale_bytes());
    });
    weights.push_back(std::move(w));
    scales.push_back(std::move(s));
  }
  // vLLM's order: both weights, both scales, both biases.
  std::vector<Tensor> out = {std::move(weights[0]), std::move(weights[1]), std::move(scales[0]),
                             std::move(scales[1])};
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2})
    out.push_back(pack_biases(o, x, p, geom(p, H, I, ip)));
  return out;
}

// ---- read back ----------------------------------------------------------------------------------

namespace {

struct LayerView {
  int64_t experts = 0, hidden = 0, inter = 0, ip = 0;
  const Tensor* weight[2] = {nullptr, nullptr};
  const Tensor* scales[2] = {nullptr, nullptr};
  const Tensor* biases[2] = {nullptr, nullptr};
  Geom g[2];
};

// The parameters as the kernel reads them, validated (unpack and the reader share it). H comes
// from w2_bias [E, H], Ip from w13_bias [E, 2Ip]; every other shape must follow from them.
LayerView read_layer(const LayoutOptions& o, const TensorMap& params) {
  if (o.source_method != QuantMethod::kGptOssMxfp4)
    throw Error(ErrorCode::kUnsupported, "", o.prefix + "w13_weight",
                std::string("no ") + kLayout + " parameters for source method " +
                    quant_method_name(o.source_method));
  LayerView L;
  for (int i = 0; i < 2; ++i) {
    const MoeProj p = i == 0 ? MoeProj::kW13 : MoeProj::kW2;
    L.weight[i] = &require_tensor(params, o.prefix + weight_name(p), kLayout);
    L.scales[i] = &require_tensor(params, o.prefix + scale_name(p), kLayout);
    L.biases[i] = &require_tensor(params, o.prefix + bias_name(p), kLayout);
    wna16::expect_dtype(*L.weight[i], L.weight[i]->name, {DType::kU8});
    wna16::expect_dtype(*L.scales[i], L.scales[i]->name, {DType::kU8, DType::kF8_E8M0});
    wna16::expect_dtype(*L.biases[i], L.biases[i]->name, {DType::kF32});
    if (L.weight[i]->shape.size() != 3 || L.scales[i]->shape.size() != 3 ||
        L.biases[i]->shape.size() != 2)
      throw Error(ErrorCode::kBadShape, "", L.weight[i]->name,
                  "weight " + shape_str(L.weight[i]->shape) + ", scales " +
                      shape_str(L.scales[i]->shape) + " and bias " + shape_str(L.biases[i]->shape) +
                      " must be [E, ...] (3-D, 3-D, 2-D)");
  }
  const int64_t E = L.weight[0]->shape[0], H = L.biases[1]->shape[1],
                two_ip = L.biases[0]->shape[1];
  if (H <= 0 || H % kMxBlock != 0 || two_ip <= 0 || two_ip % 128 != 0)
    throw Error(ErrorCode::kBadShape, "", L.biases[0]->name,
                "H=" + num(H) + ", 2Ip=" + num(two_ip) + " are not " + kLayout +
                    " extents (H % 32 == 0, Ip % 64 == 0)");
  const int64_t ip = two_ip / 2;
  int64_t I = ip;
  if (o.inter > 0 && o.inter != ip) {
    if (o.inter > ip || padded_inter_of(o.inter) != ip)
      throw Error(ErrorCode::kBadShape, "", L.weight[1]->name,
                  "parameters carry I=" + num(ip) + ", which is not how vLLM 0.33 pads the " +
                      "layer's I=" + num(o.inter) + " for " + kLayout + " (to a multiple of 64)");
    I = o.inter;
  }
  if (o.hidden > 0 && o.hidden != H)
    throw Error(ErrorCode::kBadShape, "", L.biases[1]->name,
                "parameters carry H=" + num(H) + ", the layer has H=" + num(o.hidden) + " (" +
                    kLayout + " does not pad H)");
  L.experts = E;
  L.hidden = H;
  L.inter = I;
  L.ip = ip;
  for (int i = 0; i < 2; ++i) {
    const Geom g = geom(i == 0 ? MoeProj::kW13 : MoeProj::kW2, H, I, ip);
    wna16::expect_shape(*L.weight[i], L.weight[i]->name, {E, g.mp / 4, g.kbp * 4});
    wna16::expect_shape(*L.scales[i], L.scales[i]->name, {E, g.msp / 32, g.gp * 32});
    wna16::expect_shape(*L.biases[i], L.biases[i]->name, {E, g.rows});
    L.g[i] = g;
  }
  return L;
}

[[noreturn]] void padding_error(const std::string& name, int64_t e, const std::string& where) {
  throw Error(ErrorCode::kBadValue, "", name,
              "expert " + num(e) + ": " + where +
                  " is not zero (vLLM's loader and the swizzle pad with zeros)");
}

// One expert's codes [n, k] and scales [n, k/32] back; every padding code and scale must be 0
// (the maps are bijections onto the buffers, so this checks every padding bit).
void unpack_expert(const Geom& g, const LayerView& L, int i, int64_t e, uint8_t* codes,
                   uint8_t* scales) {
  const uint8_t* v = L.weight[i]->data.data() + e * g.value_bytes();
  const uint8_t* s = L.scales[i]->data.data() + e * g.scale_bytes();
  const int64_t G = g.k / kMxBlock;
  for (int64_t r = 0; r < g.mp; ++r) {
    const int64_t lr = r < g.rows ? g.logical_row(r) : -1;
    for (int64_t b = 0; b < g.kbp; ++b) {
      const uint32_t w = triton_mx::load_word(v, triton_mx::value_word(r, b, g.kbp));
      const int slot = triton_mx::value_slot(r, b);
      for (int h = 0; h < 2; ++h) {
        const int64_t c = 2 * b + h;
        const uint32_t code = triton_mx::value_code(w, slot, h);
        if (lr >= 0 && c < g.k)
          codes[lr * g.k + c] = static_cast<uint8_t>(code);
        else if (code != 0)
          padding_error(L.weight[i]->name, e,
                        "the code of padding (row " + num(r) + ", column " + num(c) + ")");
      }
    }
  }
  for (int64_t r = 0; r < g.msp; ++r) {
    const int64_t lr = r < g.rows ? g.logical_row(r) : -1;
    for (int64_t gi = 0; gi < g.gp; ++gi) {
      const uint8_t b = s[triton_mx::scale_offset(r, gi, g.gp, kNumWarps)];
      if (lr >= 0 && gi < G)
        scales[lr * G + gi] = b;
      else if (b != 0)
        padding_error(L.scales[i]->name, e,
                      "the scale of padding (row " + num(r) + ", group " + num(gi) + ")");
    }
  }
}

// The float32 biases back to bf16 [E, n] in logical row order: each must be a bf16 value (what
// .to(torch.float32) of vLLM's bf16 parameter writes), the padding zero.
std::vector<uint8_t> unpack_biases(const Tensor& t, const Geom& g, int64_t E) {
  std::vector<uint8_t> out(static_cast<size_t>(E * g.n * 2));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < g.rows; ++r) {
      uint32_t bits;
      std::memcpy(&bits, t.data.data() + (e * g.rows + r) * 4, 4);
      const int64_t lr = g.logical_row(r);
      if (lr < 0) {
        if (bits != 0) padding_error(t.name, e, "the bias of padding row " + num(r));
        continue;
      }
      if ((bits & 0xFFFFu) != 0)
        throw Error(ErrorCode::kBadValue, "", t.name,
                    "expert " + num(e) + ", row " + num(r) + ": float32 bits " + num(bits) +
                        " are no bf16 value (vLLM widens its bf16 bias exactly)");
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&out[static_cast<size_t>((e * g.n + lr) * 2)], &h, 2);
    }
  return out;
}

}  // namespace

MoeExperts unpack_triton_mxfp4_moe(const LayoutOptions& o, const TensorMap& params) {
  const LayerView L = read_layer(o, params);
  MoeExperts x;
  QuantTensor* qs[2] = {&x.w13, &x.w2};
  QuantSpec spec;
  spec.kind = CodeKind::kFp4E2M1;
  spec.bits = 4;
  spec.group_size = kMxBlock;
  spec.scale_dtype = DType::kU8;
  for (int i = 0; i < 2; ++i) {
    const Geom& g = L.g[i];
    *qs[i] = QuantTensor(spec, L.experts, g.n, g.k);
    const int64_t G = g.k / kMxBlock;
    parallel_for(L.experts, o.threads, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e)
        unpack_expert(g, L, i, e, qs[i]->codes.data() + e * g.n * g.k,
                      qs[i]->scales.data() + e * g.n * G);
    });
    (i == 0 ? x.w13_bias : x.w2_bias) = unpack_biases(*L.biases[i], g, L.experts);
  }
  x.bias_dtype = DType::kBF16;
  return x;
}

reader::ProjReader triton_mxfp4_make_reader(const LayoutOptions& o, const TensorMap& params,
                                            MoeProj proj, const ParamLocator& locate) {
  const LayerView L = read_layer(o, params);
  const int i = proj == MoeProj::kW13 ? 0 : 1;
  const Geom& g = L.g[i];
  reader::ProjReader r = blank_reader(reader::Kind::kTritonMxfp4, triton_mxfp4_act_quant(o));
  r.experts = L.experts;
  r.n = g.n;
  r.k = g.k;
  reader::TritonMxfp4Params& t = r.triton_mxfp4;
  t.weight = static_cast<const uint8_t*>(locate_param(locate, params, L.weight[i]->name));
  t.scales = static_cast<const uint8_t*>(locate_param(locate, params, L.scales[i]->name));
  t.interleaved_w13 = g.interleaved ? 1 : 0;
  t.inter = L.inter;
  t.kbp = g.kbp;
  t.gp = g.gp;
  t.num_warps = kNumWarps;
  t.value_bytes = g.value_bytes();
  t.scale_bytes = g.scale_bytes();
  return r;
}

reader::ActQuant triton_mxfp4_act_quant(const LayoutOptions& o) {
  return act_quant_16bit(o);
}

std::vector<std::string> triton_mxfp4_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  // Byte-identical to convert_gpt_oss_weight_to_mxfp4_moe_kernel_format (TRITON) on sm90
  // (tests/golden/triton_mxfp4.cpp, fixtures made by vLLM 0.33.0's own _swizzle_mxfp4).
  return {};
}

}  // namespace moepack
