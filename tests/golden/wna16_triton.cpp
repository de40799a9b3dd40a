// Triton WNA16 MoE layouts against the byte-exact fixtures in shared/golden/wna16/:
//   moe_wna16_gptq_int4, moe_wna16_awq_int4 (MoeWNA16Method's loader output for one matrix) and
//   moe_ct_int4 / moe_ct_int8 triton_w13_* (CompressedTensorsWNA16MoEMethod).
// The checkpoint -> canonical step is a small independent unpacker written here from spec §1.1-1.3
// (the real GPTQ/AWQ/CT codecs are tested on their own).
#include <gtest/gtest.h>

#include <random>

#include "core/half.h"
#include "formats/triton_wna16.h"
#include "tests/test_util.h"

using namespace moepack;
using moepack::test::bytes_equal;
using moepack::test::Golden;
using moepack::test::load_golden;

namespace {

const Tensor* find(const std::vector<Tensor>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name) return &t;
  ADD_FAILURE() << "output " << name << " missing";
  return nullptr;
}

// GPTQ qweight int32 [K/8, N]: code (k, n) = field k % 8 of word [k / 8, n] (spec §1.1).
std::vector<uint8_t> gptq_codes(const Golden& qw, int64_t* n, int64_t* k) {
  const auto w = qw.as<uint32_t>();
  *k = qw.shape[0] * 8;
  *n = qw.shape[1];
  std::vector<uint8_t> c(static_cast<size_t>(*n * *k));
  for (int64_t kk = 0; kk < *k; ++kk)
    for (int64_t nn = 0; nn < *n; ++nn)
      c[static_cast<size_t>(nn * *k + kk)] =
          (w[static_cast<size_t>((kk / 8) * *n + nn)] >> (4 * (kk % 8))) & 15;
  return c;
}

// GPTQ v1 qzeros int32 [G, N/8] packed along N: real zero = stored + 1 (spec §1.1).
std::vector<uint8_t> gptq_v1_zeros(const Golden& qz, int64_t n) {
  const auto w = qz.as<uint32_t>();
  const int64_t G = qz.shape[0];
  std::vector<uint8_t> z(static_cast<size_t>(n * G));
  for (int64_t g = 0; g < G; ++g)
    for (int64_t nn = 0; nn < n; ++nn)
      z[static_cast<size_t>(nn * G + g)] = static_cast<uint8_t>(
          ((w[static_cast<size_t>(g * (n / 8) + nn / 8)] >> (4 * (nn % 8))) & 15) + 1);
  return z;
}

// AWQ int32 [R, C/8] packed along the columns in AWQ order: column 8c + m sits in field F[m],
// F = (0, 4, 1, 5, 2, 6, 3, 7) (spec §1.2). Returns [R, C] row-major.
std::vector<uint8_t> awq_unpack(const Golden& t) {
  static const int F[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  const auto w = t.as<uint32_t>();
  const int64_t R = t.shape[0], C = t.shape[1] * 8;
  std::vector<uint8_t> v(static_cast<size_t>(R * C));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      v[static_cast<size_t>(r * C + c)] =
          (w[static_cast<size_t>(r * (C / 8) + c / 8)] >> (4 * F[c % 8])) & 15;
  return v;
}

// A random asymmetric int4 projection to complete the MoE layer around the fixture matrix.
QuantTensor random_partner(int64_t n, int64_t k, int64_t gs, int zmin, int zmax, uint32_t seed) {
  std::mt19937 rng(seed);
  QuantTensor q;
  q.experts = 1;
  q.n = n;
  q.k = k;
  q.bits = 4;
  q.group_size = gs;
  q.symmetric = false;
  q.scale_dtype = DType::kF16;
  q.codes.resize(static_cast<size_t>(n * k));
  for (auto& c : q.codes) c = static_cast<uint8_t>(rng() % 16);
  q.zeros.resize(static_cast<size_t>(n * q.groups()));
  for (auto& z : q.zeros) z = static_cast<uint8_t>(zmin + rng() % (zmax - zmin + 1));
  q.scales.resize(static_cast<size_t>(n * q.groups() * 2));
  for (size_t i = 0; i < q.scales.size(); i += 2) {
    const uint16_t h = float_to_f16(0.001f + static_cast<float>(rng() % 1000) * 1e-5f);
    std::memcpy(&q.scales[i], &h, 2);
  }
  return q;
}

struct Wna16Fixture {
  QuantTensor matrix;  // the fixture matrix in canonical form
  Golden out_qweight, out_qzeros, out_scales;
};

Wna16Fixture load_wna16(const std::string& c, bool awq) {
  Wna16Fixture f;
  const Golden qw = load_golden("wna16", c, "in_qweight");
  const Golden qz = load_golden("wna16", c, "in_qzeros");
  f.out_qweight = load_golden("wna16", c, "out_qweight");
  f.out_qzeros = load_golden("wna16", c, "out_qzeros");
  f.out_scales = load_golden("wna16", c, "out_scales");
  QuantTensor& q = f.matrix;
  q.experts = 1;
  q.bits = 4;
  q.symmetric = false;
  q.scale_dtype = DType::kF16;
  if (awq) {
    const auto kn = awq_unpack(qw);  // [K, N]
    q.k = qw.shape[0];
    q.n = qw.shape[1] * 8;
    q.codes.resize(static_cast<size_t>(q.n * q.k));
    for (int64_t k = 0; k < q.k; ++k)
      for (int64_t n = 0; n < q.n; ++n)
        q.codes[static_cast<size_t>(n * q.k + k)] = kn[static_cast<size_t>(k * q.n + n)];
    const auto gn = awq_unpack(qz);  // [G, N]
    const int64_t G = qz.shape[0];
    q.zeros.resize(static_cast<size_t>(q.n * G));
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < q.n; ++n)
        q.zeros[static_cast<size_t>(n * G + g)] = gn[static_cast<size_t>(g * q.n + n)];
  } else {
    q.codes = gptq_codes(qw, &q.n, &q.k);
    q.zeros = gptq_v1_zeros(qz, q.n);
  }
  const int64_t G = qz.shape[0];
  q.group_size = q.k / G;
  // The fixture has no input scales: moe_wna16 only transposes [G, N] -> [N, G] (no halving
  // here), so canonical [N, G] scales equal to the expected output make the check one of order.
  EXPECT_EQ(f.out_scales.shape, (Shape{q.n, G}));
  q.scales = f.out_scales.bytes;
  return f;
}

// Places the fixture matrix as w13 (N = 2I, K = H) or as w2 (N = H, K = I) of a one-expert layer.
void check_wna16(const std::string& c, bool awq, bool as_w2) {
  SCOPED_TRACE(c + (as_w2 ? " as w2" : " as w13"));
  Wna16Fixture f = load_wna16(c, awq);
  const QuantTensor& m = f.matrix;
  const int zmin = awq ? 0 : 1, zmax = awq ? 15 : 16;
  MoeExperts x;
  if (!as_w2) {
    x.w13 = m;
    x.w2 = random_partner(m.k, m.n / 2, m.group_size, zmin, zmax, 7);
  } else {
    x.w2 = m;
    x.w13 = random_partner(2 * m.k, m.n, m.group_size, zmin, zmax, 8);
  }
  LayoutOptions o;
  o.act_dtype = DType::kF16;
  o.source_method = awq ? QuantMethod::kAwq : QuantMethod::kGptq;
  o.prefix = "model.layers.0.mlp.experts.";
  const auto out = pack_triton_wna16_moe(o, x);
  const std::string p = o.prefix + (as_w2 ? "w2_" : "w13_");
  const Tensor* qw = find(out, p + "qweight");
  const Tensor* qz = find(out, p + "qzeros");
  const Tensor* sc = find(out, p + "scales");
  ASSERT_TRUE(qw && qz && sc);
  EXPECT_EQ(qw->shape, (Shape{1, f.out_qweight.shape[0], f.out_qweight.shape[1]}));
  EXPECT_EQ(qz->shape, (Shape{1, f.out_qzeros.shape[0], f.out_qzeros.shape[1]}));
  EXPECT_TRUE(bytes_equal(qw->data, f.out_qweight.bytes, 16, p + "qweight"));
  EXPECT_TRUE(bytes_equal(qz->data, f.out_qzeros.bytes, 4, p + "qzeros"));
  EXPECT_TRUE(bytes_equal(sc->data, f.out_scales.bytes, 8, p + "scales"));

  // And back: the fixture's bytes decode to the checkpoint's canonical matrix.
  TensorMap params;
  for (const auto& t : out) params[t.name] = t;
  params[p + "qweight"].data = f.out_qweight.bytes;
  params[p + "qzeros"].data = f.out_qzeros.bytes;
  const MoeExperts back = unpack_triton_wna16_moe(o, params);
  const QuantTensor& b = as_w2 ? back.w2 : back.w13;
  EXPECT_EQ(b.codes, m.codes);
  EXPECT_EQ(b.zeros, m.zeros);
  EXPECT_EQ(b.scales, m.scales);
  EXPECT_EQ(b.group_size, m.group_size);
}

TEST(TritonWna16Golden, GptqInt4AsW13) {
  MOEPACK_SKIP_WITHOUT_GOLDEN("wna16");
  check_wna16("moe_wna16_gptq_int4", false, false);
}
TEST(TritonWna16Golden, GptqInt4AsW2) {
  MOEPACK_SKIP_WITHOUT_GOLDEN("wna16");
  check_wna16("moe_wna16_gptq_int4", false, true);
}
TEST(TritonWna16Golden, AwqInt4AsW13) {
  MOEPACK_SKIP_WITHOUT_GOLDEN("wna16");
  check_wna16("moe_wna16_awq_int4", true, false);
}
TEST(TritonWna16Golden, AwqInt4AsW2) {
  MOEPACK_SKIP_WITHOUT_GOLDEN("wna16");
  check_wna16("moe_wna16_awq_int4", true, true);
}

// compressed-tensors weight_packed int32 [E, N, K/pf] packed along K (spec §1.3) -> canonical.
QuantTensor ct_canonical(const std::string& c, const std::string& proj, int bits) {
  const Golden wp = load_golden("wna16", c, "disk_" + proj + "_weight_packed");
  const Golden ws = load_golden("wna16", c, "disk_" + proj + "_weight_scale");
  const int pf = 32 / bits;
  QuantTensor q;
  q.experts = wp.shape[0];
  q.n = wp.shape[1];
  q.k = wp.shape[2] * pf;
  q.bits = bits;
  q.symmetric = true;
  q.scale_dtype = DType::kF16;
  const int64_t G = ws.shape[2];
  q.group_size = q.k / G;
  const auto w = wp.as<uint32_t>();
  q.codes.resize(static_cast<size_t>(q.experts * q.n * q.k));
  for (int64_t r = 0; r < q.experts * q.n; ++r)
    for (int64_t k = 0; k < q.k; ++k)
      q.codes[static_cast<size_t>(r * q.k + k)] = static_cast<uint8_t>(
          (w[static_cast<size_t>(r * (q.k / pf) + k / pf)] >> (bits * (k % pf))) &
          ((1u << bits) - 1));
  q.scales = ws.bytes;
  return q;
}

void check_ct(const std::string& c, int bits) {
  SCOPED_TRACE(c);
  MoeExperts x;
  x.w13 = ct_canonical(c, "w13", bits);
  x.w2 = ct_canonical(c, "w2", bits);
  LayoutOptions o;
  o.act_dtype = DType::kF16;
  o.source_method = QuantMethod::kCtPackQuantized;
  EXPECT_TRUE(triton_wna16_unsupported_reasons(o, moe_shape_of(x)).empty());
  const auto out = pack_triton_wna16_moe(o, x);
  const Golden tw = load_golden("wna16", c, "triton_w13_weight_packed");
  const Golden ts = load_golden("wna16", c, "triton_w13_weight_scale");
  const Tensor* w13 = find(out, "w13_weight_packed");
  const Tensor* s13 = find(out, "w13_weight_scale");
  const Tensor* w2 = find(out, "w2_weight_packed");
  ASSERT_TRUE(w13 && s13 && w2);
  EXPECT_EQ(w13->shape, tw.shape);
  EXPECT_EQ(s13->shape, ts.shape);
  EXPECT_TRUE(bytes_equal(w13->data, tw.bytes, 16, "w13_weight_packed"));
  EXPECT_TRUE(bytes_equal(s13->data, ts.bytes, 8, "w13_weight_scale"));
  // Spec §9: the Triton bytes of each expert are the CT on-disk bytes (no fixture for w2's
  // Triton form, so check that identity against the disk fixture).
  const Golden d2 = load_golden("wna16", c, "disk_w2_weight_packed");
  EXPECT_TRUE(bytes_equal(w2->data, d2.bytes, 16, "w2_weight_packed vs disk"));
  TensorMap params;
  for (const auto& t : out) params[t.name] = t;
  const MoeExperts back = unpack_triton_wna16_moe(o, params);
  EXPECT_EQ(back.w13.codes, x.w13.codes);
  EXPECT_EQ(back.w2.codes, x.w2.codes);
  EXPECT_EQ(back.w13.scales, x.w13.scales);
  EXPECT_EQ(back.w2.scales, x.w2.scales);
  EXPECT_EQ(back.w13.group_size, x.w13.group_size);
}

TEST(TritonWna16Golden, CtInt4) {
  MOEPACK_SKIP_WITHOUT_GOLDEN("wna16");
  check_ct("moe_ct_int4", 4);
}
TEST(TritonWna16Golden, CtInt8) {
  MOEPACK_SKIP_WITHOUT_GOLDEN("wna16");
  check_ct("moe_ct_int8", 8);
}

}  // namespace
