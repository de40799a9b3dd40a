#include "formats/triton_wna16.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/half.h"
#include "formats/moe_reader.h"

namespace moepack {
namespace {

bool is_ct(const LayoutOptions& o) {
  return o.source_method == QuantMethod::kCtPackQuantized;
}
bool is_gptq(const LayoutOptions& o) {
  return o.source_method == QuantMethod::kGptq;
}

struct Names {
  std::string qweight, scales, qzeros;
};

Names names_for(const LayoutOptions& o, MoeProj p) {
  const std::string w = o.prefix + (p == MoeProj::kW13 ? "w13_" : "w2_");
  if (is_ct(o)) return {w + "weight_packed", w + "weight_scale", ""};
  return {w + "qweight", w + "scales", w + "qzeros"};
}

std::string num(int64_t v) {
  return std::to_string(v);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// g_idx that only restates k / group_size carries no act-order and is dropped.
bool g_idx_is_trivial(const QuantTensor& q) {
  if (q.g_idx.empty()) return true;
  if (q.group_size <= 0) return false;
  for (int64_t e = 0; e < q.experts; ++e)
    for (int64_t k = 0; k < q.k; ++k)
      if (q.g_idx[static_cast<size_t>(e * q.k + k)] != k / q.group_size) return false;
  return true;
}

// Canonical scale -> the activation dtype: convert_scale's rounding and overflow rule.
uint16_t scale_to_act(const uint8_t* p, DType from, DType act, const std::string& what) {
  uint16_t h = 0;
  convert_scale(p, from, act, reinterpret_cast<uint8_t*>(&h), what);
  return h;
}

void projection_reasons(const LayoutOptions& o, const ProjShape& s, const std::string& w,
                        std::vector<std::string>* r) {
  const QuantSpec& q = s.quant;
  if (q.kind != CodeKind::kUint) {
    r->push_back(w + ": codes are not unsigned integer codes (GPTQ/AWQ/CT int4/int8 only)");
    return;
  }
  if (q.bits != 4 && q.bits != 8) {
    r->push_back(w + ": " + num(q.bits) + "-bit codes (the kernel reads 4 or 8 bits)");
    return;
  }
  if (q.scale_block_n != 1) r->push_back(w + ": scales shared by several output rows");
  if (q.scale_dtype != DType::kF16 && q.scale_dtype != DType::kBF16 && q.scale_dtype != DType::kF32)
    r->push_back(w + std::string(": scale dtype ") + dtype_name(q.scale_dtype) +
                 " (expected F16, BF16 or F32)");
  if (q.group_size <= 0)
    r->push_back(w + ": channelwise scales (group_size -1); " +
                 (is_ct(o) ? std::string("CompressedTensorsWNA16MoEMethod asserts strategy group")
                           : std::string("moe_wna16 sizes scales K // group_size")));
  if (s.act_order)
    r->push_back(w + ": act-order (g_idx is not k / group_size); " +
                 (is_ct(o) ? std::string("CT Triton MoE rejects actorder group")
                           : std::string("moe_wna16 does not take desc_act checkpoints")));
  if (q.bits == 4 && s.k % 2 != 0)
    r->push_back(w + ": K " + num(s.k) + " is odd (two int4 codes per byte)");
  if (o.source_method == QuantMethod::kAwq && q.bits != 4)
    r->push_back(w + ": AWQ with " + num(q.bits) + " bits (moe_wna16's AWQ loader asserts int4)");
  if (q.symmetric) return;
  if (is_ct(o)) {
    r->push_back(w + ": asymmetric; CT MoE methods are symmetric-only");
    return;
  }
  if (q.bits == 8) {
    r->push_back(w +
                 ": 8-bit zero points; vLLM's moe_wna16 loader cannot load 8-bit asymmetric "
                 "GPTQ (w13_qzeros slice of I/2 rows for an I-row tensor, spec §5.3)");
    return;
  }
  if (s.n % 2 != 0) r->push_back(w + ": N " + num(s.n) + " is odd (two zero nibbles per byte)");
}

// What the bytes add to the shape's reasons: zero points the packed nibbles cannot express.
void zero_point_reasons(const LayoutOptions& o, const QuantTensor& q, const std::string& w,
                        std::vector<std::string>* r) {
  if (q.symmetric || is_ct(o) || q.kind != CodeKind::kUint || q.bits != 4) return;
  int lo = 255, hi = 0;
  for (uint8_t z : q.zeros) {
    lo = std::min<int>(lo, z);
    hi = std::max<int>(hi, z);
  }
  if (is_gptq(o)) {
    if (lo < 1)
      r->push_back(w +
                   ": a GPTQ zero point of 0; vLLM's loader adds 1 to the stored (v1) zero, "
                   "so it cannot express 0 (a GPTQ v2 checkpoint)");
    if (hi > 16) r->push_back(w + ": GPTQ int4 zero point " + num(hi) + " > 16");
  } else if (hi > 15) {
    r->push_back(w + ": AWQ int4 zero point " + num(hi) + " > 15");
  }
}

}  // namespace

bool triton_wna16_halve_group_size(int64_t group_size, int64_t intermediate, int64_t hidden,
                                   int64_t* effective, int64_t* factor) {
  int64_t g = group_size, f = 1;
  if (g <= 0) return false;
  while (intermediate % g != 0 || hidden % g != 0) {
    g /= 2;
    f *= 2;
    if (g < 32) return false;
  }
  *effective = g;
  *factor = f;
  return true;
}

std::vector<std::string> triton_wna16_unsupported_reasons(const LayoutOptions& o,
                                                          const MoeShape& x) {
  std::vector<std::string> r = moe_shape_problems(o, x);
  const QuantMethod sm = o.source_method;
  if (sm != QuantMethod::kGptq && sm != QuantMethod::kAwq && sm != QuantMethod::kCtPackQuantized)
    r.push_back(std::string("source method ") + quant_method_name(sm) +
                " has no Triton WNA16 MoE method (gptq, awq or compressed-tensors pack-quantized)");
  if (o.act_dtype != DType::kF16 && o.act_dtype != DType::kBF16)
    r.push_back(std::string("activation dtype ") + dtype_name(o.act_dtype) +
                " (moe_wna16 supports F16 and BF16)");
  if (!o.gated && !is_ct(o))
    r.push_back("non-gated MoE: moe_wna16 allocates w13 as 2 x intermediate rows (SiLU-and-mul)");
  projection_reasons(o, x.w13, "w13", &r);
  projection_reasons(o, x.w2, "w2", &r);
  const QuantSpec &q13 = x.w13.quant, &q2 = x.w2.quant;
  if (q13.bits != q2.bits) r.push_back("w13 and w2 have different bit widths");
  if (q13.group_size != q2.group_size) r.push_back("w13 and w2 have different group sizes");
  if (q13.symmetric != q2.symmetric) r.push_back("only one of w13 / w2 has zero points");
  const int64_t gs = q13.group_size, hidden = x.w13.k, inter = x.w2.k;
  if (gs <= 0 || q13.group_size != q2.group_size || hidden <= 0 || inter <= 0) return r;
  if (is_ct(o)) {
    if (hidden % gs != 0 || inter % gs != 0)
      r.push_back("CT group size " + num(gs) + " does not divide hidden " + num(hidden) +
                  " and intermediate " + num(inter) + " (scales are sized K // group_size)");
    return r;
  }
  int64_t eff = 0, f = 0;
  if (!triton_wna16_halve_group_size(gs, inter, hidden, &eff, &f)) {
    r.push_back("group size " + num(gs) + " cannot be halved to one >= 32 dividing intermediate " +
                num(inter) + " and hidden " + num(hidden) + " (moe_wna16 create_weights assert)");
    return r;
  }
  if (eff * f != gs)
    r.push_back("halving group size " + num(gs) + " to " + num(eff) +
                " rounds down: the kernel's group k / " + num(eff) +
                " would no longer map onto the checkpoint's groups");
  if (!q13.symmetric && inter % gs != 0)
    r.push_back("zero points with intermediate " + num(inter) + " not a multiple of group size " +
                num(gs) + ": vLLM sizes w2_qzeros I // " + num(eff) + " but loads ceil(I/" +
                num(gs) + ") x " + num(f) + " columns");
  if (!q13.symmetric && q13.bits == 4 && inter % 2 != 0)
    r.push_back("zero points with odd intermediate " + num(inter) +
                " (the loader splits w13_qzeros at I/2 rows)");
  return r;
}

std::vector<std::string> triton_wna16_deviations_from_vllm(const LayoutOptions& o,
                                                           const MoeShape& x) {
  std::vector<std::string> d;
  if (is_ct(o)) {
    d.push_back(
        "w13/w2_weight_shape, w13/w2_weight_g_idx and w13/w2_g_idx_sort_indices are not "
        "written: vLLM registers them (the g_idx ones uninitialised) but the Triton kernel "
        "never reads them");
    return d;
  }
  if (is_gptq(o))
    d.push_back(std::string("w13_g_idx/w2_g_idx") +
                (x.w13.quant.symmetric ? " and w13_qzeros/w2_qzeros" : "") +
                " are not written: vLLM registers them as empty int32 [0] placeholders");
  int64_t eff = 0, f = 0;
  const int64_t gs = x.w13.quant.group_size, hidden = x.w13.k, inter = x.w2.k;
  if (gs > 0 && triton_wna16_halve_group_size(gs, inter, hidden, &eff, &f) && f > 1 &&
      hidden % gs != 0)
    d.push_back("group size " + num(gs) + " halved to " + num(eff) + " with hidden " + num(hidden) +
                " not a multiple of it: w13 scales have the parameter's " + num(hidden / eff) +
                " columns, but vLLM's loader copies ceil(H/" + num(gs) + ") x " + num(f) + " = " +
                num(ceil_div(hidden, gs) * f) + " repeated columns into them and cannot load it");
  return d;
}

namespace {

// f: the halving factor; eff: the halved group size gs' (dividing K). vLLM's parameters hold
// K / gs' columns: the loader repeats each checkpoint group f times and narrows the result to
// the parameter, which drops the repeats past K when gs does not divide K.
void pack_projection(const LayoutOptions& o, const QuantTensor& q, const Names& nm, int64_t f,
                     int64_t eff, std::vector<Tensor>* out) {
  const int64_t E = q.experts, N = q.n, K = q.k, G = q.groups(), Gp = K / eff;
  const int64_t kb = K * q.bits / 8;
  const int max_code = (1 << q.bits) - 1;
  Tensor qw(nm.qweight, DType::kU8, {E, N, kb});
  for (int64_t row = 0; row < E * N; ++row) {
    const uint8_t* src = q.codes.data() + row * K;
    uint8_t* dst = qw.data.data() + row * kb;
    for (int64_t k = 0; k < K; ++k)
      if (src[k] > max_code)
        throw Error(ErrorCode::kBadValue, "", nm.qweight,
                    "code " + num(src[k]) + " at row " + num(row) + ", k " + num(k) + " exceeds " +
                        num(q.bits) + " bits");
    if (q.bits == 8) {
      std::memcpy(dst, src, static_cast<size_t>(K));
    } else {
      for (int64_t b = 0; b < kb; ++b)
        dst[b] = static_cast<uint8_t>(src[2 * b] | (src[2 * b + 1] << 4));
    }
  }
  out->push_back(std::move(qw));

  Tensor sc(nm.scales, o.act_dtype, {E, N, Gp});
  uint16_t* sd = sc.as<uint16_t>();
  const int sb = q.scale_bytes();
  for (int64_t row = 0; row < E * N; ++row)
    for (int64_t c = 0; c < Gp; ++c)
      sd[row * Gp + c] = scale_to_act(q.scales.data() + (row * G + c / f) * sb, q.scale_dtype,
                                      o.act_dtype, nm.scales);
  out->push_back(std::move(sc));

  if (q.symmetric) return;
  // int4 only (8-bit zero points are refused): byte [n/2, c] = z_even + 16 z_odd, in uint8
  // arithmetic like vLLM's loader, so a GPTQ zero of 16 wraps.
  Tensor zt(nm.qzeros, DType::kU8, {E, N / 2, Gp});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n2 = 0; n2 < N / 2; ++n2)
      for (int64_t c = 0; c < Gp; ++c) {
        const int z0 = q.zeros[static_cast<size_t>((e * N + 2 * n2) * G + c / f)];
        const int z1 = q.zeros[static_cast<size_t>((e * N + 2 * n2 + 1) * G + c / f)];
        zt.data[static_cast<size_t>((e * (N / 2) + n2) * Gp + c)] =
            static_cast<uint8_t>((z0 + 16 * z1) & 0xff);
      }
  out->push_back(std::move(zt));
}

}  // namespace

std::vector<Tensor> pack_triton_wna16_moe(const LayoutOptions& o, const MoeExperts& x) {
  x.w13.check_consistent("w13");
  x.w2.check_consistent("w2");
  MoeShape shape = moe_shape_of(x);
  const auto shapes = moe_shape_problems(o, x);
  if (!shapes.empty()) throw Error(ErrorCode::kBadShape, "", "w13/w2", shapes.front());
  // An explicit g_idx that only restates k / group_size is no act-order for this layout.
  shape.w13.act_order = !g_idx_is_trivial(x.w13);
  shape.w2.act_order = !g_idx_is_trivial(x.w2);
  auto reasons = triton_wna16_unsupported_reasons(o, shape);
  zero_point_reasons(o, x.w13, "w13", &reasons);
  zero_point_reasons(o, x.w2, "w2", &reasons);
  if (!reasons.empty()) {
    std::string msg = "Triton WNA16 MoE layout cannot hold these experts:";
    for (const auto& s : reasons) msg += "\n  - " + s;
    throw Error(ErrorCode::kUnsupported, "", o.prefix + "w13", msg);
  }
  int64_t eff = x.w13.group_size, f = 1;
  if (!is_ct(o)) triton_wna16_halve_group_size(x.w13.group_size, x.w2.k, x.w13.k, &eff, &f);
  std::vector<Tensor> out;
  pack_projection(o, x.w13, names_for(o, MoeProj::kW13), f, eff, &out);
  pack_projection(o, x.w2, names_for(o, MoeProj::kW2), f, eff, &out);
  return out;
}

namespace {

void need_rank3(const Tensor& t, DType dt) {
  if (t.shape.size() != 3)
    throw Error(ErrorCode::kBadShape, "", t.name, "expected rank 3, got " + shape_str(t.shape));
  if (t.dtype != dt)
    throw Error(ErrorCode::kBadDtype, "", t.name,
                std::string("expected ") + dtype_name(dt) + ", got " + dtype_name(t.dtype));
  if (static_cast<int64_t>(t.data.size()) != numel(t.shape) * dtype_bits(dt) / 8)
    throw Error(ErrorCode::kBadShape, "", t.name, "byte size does not match its shape");
}

// Shapes of the layer as read back from the parameters.
struct Geometry {
  int64_t experts = 0, hidden = 0, inter = 0, n13 = 0;
  int bits = 0;
  bool has_zp = false;
  int64_t g13 = 0, g2 = 0;  // scale columns
  const Tensor *qw13 = nullptr, *qw2 = nullptr, *s13 = nullptr, *s2 = nullptr;
  const Tensor *z13 = nullptr, *z2 = nullptr;
};

Geometry read_geometry(const LayoutOptions& o, const TensorMap& m) {
  Geometry g;
  const Names a = names_for(o, MoeProj::kW13), b = names_for(o, MoeProj::kW2);
  g.qw13 = &require_tensor(m, a.qweight);
  g.qw2 = &require_tensor(m, b.qweight);
  g.s13 = &require_tensor(m, a.scales);
  g.s2 = &require_tensor(m, b.scales);
  need_rank3(*g.qw13, DType::kU8);
  need_rank3(*g.qw2, DType::kU8);
  need_rank3(*g.s13, o.act_dtype);
  need_rank3(*g.s2, o.act_dtype);
  const int64_t shards = o.gated ? 2 : 1;
  g.experts = g.qw13->shape[0];
  g.n13 = g.qw13->shape[1];
  g.hidden = g.qw2->shape[1];
  g.inter = g.n13 / shards;
  const auto bad = [&](const std::string& t, const std::string& msg) {
    throw Error(ErrorCode::kBadShape, "", t, msg);
  };
  if (g.qw2->shape[0] != g.experts || g.s13->shape[0] != g.experts || g.s2->shape[0] != g.experts)
    bad(b.qweight, "expert counts of the parameters differ");
  if (g.inter <= 0 || g.n13 % shards != 0 || g.hidden <= 0)
    bad(a.qweight, "w13 rows " + num(g.n13) + " do not make an intermediate size");
  const int64_t kb2 = g.qw2->shape[2], kb13 = g.qw13->shape[2];
  if (kb2 * 8 == g.inter * 4)
    g.bits = 4;
  else if (kb2 == g.inter)
    g.bits = 8;
  else
    bad(b.qweight,
        "row of " + num(kb2) + " bytes is neither int4 nor int8 for intermediate " + num(g.inter));
  if (kb13 * 8 != g.hidden * g.bits)
    bad(a.qweight, "row of " + num(kb13) + " bytes does not hold " + num(g.hidden) + " " +
                       num(g.bits) + "-bit codes");
  if (g.s13->shape[1] != g.n13) bad(a.scales, "rows != w13 rows");
  if (g.s2->shape[1] != g.hidden) bad(b.scales, "rows != hidden");
  g.g13 = g.s13->shape[2];
  g.g2 = g.s2->shape[2];
  if (g.g13 < 1 || g.g2 < 1) bad(a.scales, "no scale groups");
  if (!is_ct(o)) {
    const bool h13 = m.count(a.qzeros) != 0, h2 = m.count(b.qzeros) != 0;
    if (h13 != h2)
      throw Error(ErrorCode::kMissingTensor, "", h13 ? b.qzeros : a.qzeros,
                  "zero points for only one projection");
    g.has_zp = h13;
    if (g.has_zp) {
      g.z13 = &require_tensor(m, a.qzeros);
      g.z2 = &require_tensor(m, b.qzeros);
      need_rank3(*g.z13, DType::kU8);
      need_rank3(*g.z2, DType::kU8);
      if (g.bits != 4) bad(a.qzeros, "zero points are only supported with int4");
      if (g.z13->shape != Shape{g.experts, g.n13 / 2, g.g13})
        bad(a.qzeros, "expected " + shape_str({g.experts, g.n13 / 2, g.g13}) + ", got " +
                          shape_str(g.z13->shape));
      if (g.z2->shape != Shape{g.experts, g.hidden / 2, g.g2})
        bad(b.qzeros, "expected " + shape_str({g.experts, g.hidden / 2, g.g2}) + ", got " +
                          shape_str(g.z2->shape));
    }
  }
  return g;
}

struct GroupChoice {
  int64_t group_size, effective, factor;
};

std::vector<int64_t> divisors(int64_t v) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= v; ++i)
    if (v % i == 0) {
      d.push_back(i);
      if (i != v / i) d.push_back(v / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

// Every checkpoint group size whose moe_wna16 parameters have these shapes, largest first.
std::vector<GroupChoice> shape_candidates(const Geometry& g) {
  std::vector<GroupChoice> c;
  const int64_t gmax = std::max(g.g13, g.g2);
  const auto ds = divisors(std::gcd(g.hidden, g.inter));
  for (int64_t f = 1; f <= gmax; f *= 2)
    for (int64_t d : ds) {
      const int64_t gs = d * f;
      int64_t eff = 0, ff = 0;
      if (!triton_wna16_halve_group_size(gs, g.inter, g.hidden, &eff, &ff)) continue;
      if (eff != d || ff != f) continue;
      if (g.hidden / eff != g.g13 || g.inter / eff != g.g2) continue;
      c.push_back({gs, eff, f});
    }
  std::sort(c.begin(), c.end(),
            [](const GroupChoice& a, const GroupChoice& b) { return a.group_size > b.group_size; });
  return c;
}

// Whether every run of `f` scale (and zero) columns repeats its first.
bool columns_repeat(const Tensor& t, int64_t f, int elem_bytes) {
  if (f == 1) return true;
  const int64_t rows = t.shape[0] * t.shape[1], cols = t.shape[2];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (std::memcmp(t.data.data() + (r * cols + c) * elem_bytes,
                      t.data.data() + (r * cols + c - c % f) * elem_bytes, elem_bytes) != 0)
        return false;
  return true;
}

bool data_repeats(const Geometry& g, int64_t f) {
  if (!columns_repeat(*g.s13, f, 2) || !columns_repeat(*g.s2, f, 2)) return false;
  if (g.has_zp && (!columns_repeat(*g.z13, f, 1) || !columns_repeat(*g.z2, f, 1))) return false;
  return true;
}

// Shapes alone can admit several checkpoint group sizes (e.g. H = I = 64 with two columns: gs 32,
// or gs 128 halved to 64 with a padding repeat); the repeated columns decide, and any choice they
// allow reads the same scale for every k.
GroupChoice choose_group(const LayoutOptions& o, const Geometry& g, int64_t group_size) {
  const std::string scales = names_for(o, MoeProj::kW13).scales;
  if (is_ct(o)) {
    if (g.hidden % g.g13 != 0 || g.inter % g.g2 != 0 || g.hidden / g.g13 != g.inter / g.g2)
      throw Error(ErrorCode::kBadShape, "", scales,
                  "scale columns " + num(g.g13) + " / " + num(g.g2) +
                      " do not give one group size for hidden " + num(g.hidden) +
                      " and intermediate " + num(g.inter));
    const int64_t gs = g.hidden / g.g13;
    if (group_size > 0 && group_size != gs)
      throw Error(ErrorCode::kBadShape, "", scales,
                  "group size " + num(group_size) + " but the scales imply " + num(gs));
    return {gs, gs, 1};
  }
  if (group_size > 0) {
    int64_t eff = 0, f = 0;
    if (!triton_wna16_halve_group_size(group_size, g.inter, g.hidden, &eff, &f) ||
        eff * f != group_size)
      throw Error(ErrorCode::kUnsupported, "", scales,
                  "group size " + num(group_size) + " has no moe_wna16 layout here");
    if (g.hidden / eff != g.g13 || g.inter / eff != g.g2)
      throw Error(ErrorCode::kBadShape, "", scales,
                  "scale columns " + num(g.g13) + " / " + num(g.g2) + " do not match group size " +
                      num(group_size) + " (halved to " + num(eff) + ")");
    if (!data_repeats(g, f))
      throw Error(ErrorCode::kBadValue, "", scales,
                  "group size " + num(group_size) + " was halved " + num(f) +
                      "x but the repeated scale/zero columns differ");
    return {group_size, eff, f};
  }
  const auto cands = shape_candidates(g);
  if (cands.empty())
    throw Error(ErrorCode::kBadShape, "", scales,
                "no group size gives " + num(g.g13) + " / " + num(g.g2) +
                    " scale columns for hidden " + num(g.hidden) + " and intermediate " +
                    num(g.inter));
  for (const auto& c : cands)
    if (data_repeats(g, c.factor)) return c;
  throw Error(ErrorCode::kBadValue, "", scales,
              "repeated scale/zero columns differ for every group size the shapes allow");
}

QuantTensor unpack_projection(const LayoutOptions& o, const Geometry& g, const GroupChoice& gc,
                              MoeProj p) {
  const bool w13 = p == MoeProj::kW13;
  const Tensor& qw = w13 ? *g.qw13 : *g.qw2;
  const Tensor& sc = w13 ? *g.s13 : *g.s2;
  const Tensor* zt = w13 ? g.z13 : g.z2;
  QuantSpec encoding;
  encoding.kind = CodeKind::kUint;
  encoding.bits = g.bits;
  encoding.group_size = gc.group_size;
  encoding.scale_block_n = 1;
  encoding.symmetric = !g.has_zp;
  encoding.scale_dtype = o.act_dtype;
  QuantTensor q(encoding, g.experts, w13 ? g.n13 : g.hidden, w13 ? g.hidden : g.inter);
  const int64_t E = q.experts, N = q.n, K = q.k, G = q.groups(), Gp = sc.shape[2], f = gc.factor;
  const int64_t kb = qw.shape[2];
  q.codes.resize(static_cast<size_t>(E * N * K));
  for (int64_t row = 0; row < E * N; ++row) {
    const uint8_t* src = qw.data.data() + row * kb;
    uint8_t* dst = q.codes.data() + row * K;
    if (g.bits == 8) {
      std::memcpy(dst, src, static_cast<size_t>(K));
    } else {
      for (int64_t k = 0; k < K; ++k) dst[k] = (src[k / 2] >> (4 * (k % 2))) & 15;
    }
  }
  q.scales.resize(static_cast<size_t>(E * N * G * 2));
  for (int64_t row = 0; row < E * N; ++row)
    for (int64_t gi = 0; gi < G; ++gi)
      std::memcpy(q.scales.data() + (row * G + gi) * 2, sc.data.data() + (row * Gp + gi * f) * 2,
                  2);
  if (g.has_zp) {
    const bool gptq = is_gptq(o);
    q.zeros.resize(static_cast<size_t>(E * N * G));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t n2 = 0; n2 < N / 2; ++n2)
        for (int64_t gi = 0; gi < G; ++gi) {
          const int b = zt->data[static_cast<size_t>((e * (N / 2) + n2) * Gp + gi * f)];
          // Inverse of (z0 + 16 z1) mod 256; GPTQ zeros are 1..16, so nibble 0 means 16.
          int z0 = b & 15;
          if (gptq && z0 == 0) z0 = 16;
          int z1 = ((b - z0) & 0xff) >> 4;
          if (gptq && z1 == 0) z1 = 16;
          q.zeros[static_cast<size_t>((e * N + 2 * n2) * G + gi)] = static_cast<uint8_t>(z0);
          q.zeros[static_cast<size_t>((e * N + 2 * n2 + 1) * G + gi)] = static_cast<uint8_t>(z1);
        }
  }
  return q;
}

MoeExperts unpack_impl(const LayoutOptions& o, const TensorMap& m, int64_t group_size) {
  const Geometry g = read_geometry(o, m);
  const GroupChoice gc = choose_group(o, g, group_size);
  MoeExperts x;
  x.w13 = unpack_projection(o, g, gc, MoeProj::kW13);
  x.w2 = unpack_projection(o, g, gc, MoeProj::kW2);
  return x;
}

}  // namespace

TritonWna16LayerView triton_wna16_read_layer(const LayoutOptions& o, const TensorMap& m) {
  const Geometry g = read_geometry(o, m);
  const GroupChoice gc = choose_group(o, g, 0);
  TritonWna16LayerView v;
  v.experts = g.experts;
  v.kernel_group_size = gc.effective;
  v.bits = g.bits;
  v.zero_points = g.has_zp;
  for (int i = 0; i < 2; ++i) {
    const Names nm = names_for(o, i == 0 ? MoeProj::kW13 : MoeProj::kW2);
    TritonWna16LayerView::Proj& p = v.proj[i];
    p.qweight = nm.qweight;
    p.scales = nm.scales;
    p.qzeros = g.has_zp ? nm.qzeros : "";
    p.n = i == 0 ? g.n13 : g.hidden;
    p.k = i == 0 ? g.hidden : g.inter;
    p.row_bytes = (i == 0 ? g.qw13 : g.qw2)->shape[2];
    p.scale_cols = i == 0 ? g.g13 : g.g2;
  }
  return v;
}

MoeExperts unpack_triton_wna16_moe(const LayoutOptions& o, const TensorMap& m) {
  return unpack_impl(o, m, 0);
}

MoeExperts unpack_triton_wna16_moe_with_group_size(const LayoutOptions& o, const TensorMap& m,
                                                   int64_t group_size) {
  if (group_size <= 0)
    throw Error(ErrorCode::kUnsupported, "", o.prefix + "w13",
                "group size " + num(group_size) + ": this layout needs a real group size");
  return unpack_impl(o, m, group_size);
}

reader::ActQuant triton_wna16_act_quant(const LayoutOptions& o) {
  return act_quant_16bit(o);
}

reader::ProjReader triton_wna16_make_reader(const LayoutOptions& o, const TensorMap& m,
                                            MoeProj proj, const ParamLocator& locate) {
  const TritonWna16LayerView L = triton_wna16_read_layer(o, m);
  const TritonWna16LayerView::Proj& v = L.proj[proj == MoeProj::kW13 ? 0 : 1];
  reader::ProjReader r = blank_reader(reader::Kind::kTritonWna16, triton_wna16_act_quant(o));
  r.experts = L.experts;
  r.n = v.n;
  r.k = v.k;
  reader::TritonWna16Params& t = r.triton_wna16;
  t.qweight = static_cast<const uint8_t*>(locate_param(locate, m, v.qweight));
  t.scales = static_cast<const uint16_t*>(locate_param(locate, m, v.scales));
  if (!v.qzeros.empty()) t.qzeros = static_cast<const uint8_t*>(locate_param(locate, m, v.qzeros));
  t.bits = L.bits;
  t.scale_type = o.act_dtype == DType::kF16 ? reader::kScaleF16 : reader::kScaleBf16;
  t.row_bytes = v.row_bytes;
  t.scale_cols = v.scale_cols;
  t.group_size = L.kernel_group_size;
  return r;
}

std::vector<ParamSpec> triton_wna16_param_specs(const LayoutOptions& o, const MoeShape& x) {
  int64_t eff = x.w13.quant.group_size, f = 1;
  if (!is_ct(o)) triton_wna16_halve_group_size(eff, x.w2.k, x.w13.k, &eff, &f);
  std::vector<ParamSpec> out;
  for (const ProjShape* s : {&x.w13, &x.w2}) {
    const MoeProj p = s == &x.w13 ? MoeProj::kW13 : MoeProj::kW2;
    const Names nm = names_for(o, p);
    const int64_t Gp = s->k / eff;  // narrowed as vLLM's loader narrows the repeats
    out.push_back({nm.qweight,
                   DType::kU8,
                   {x.experts, s->n, s->k * s->quant.bits / 8},
                   param_role_of(p, ParamRole::kW13Weight)});
    out.push_back(
        {nm.scales, o.act_dtype, {x.experts, s->n, Gp}, param_role_of(p, ParamRole::kW13Scale)});
    if (!s->quant.symmetric)
      out.push_back({nm.qzeros,
                     DType::kU8,
                     {x.experts, s->n / 2, Gp},
                     param_role_of(p, ParamRole::kW13Zero)});
  }
  return out;
}

}  // namespace moepack
