// Marlin MoE layout properties on random legal layers: pack/unpack identity, thread-count
// invariance, the kernel's-eye matmul against the canonical dequantisation (and its failure on
// mis-permuted parameters), cross-format identities, refusals, deviations, spec examples.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "core/half.h"
#include "formats/awq.h"
#include "formats/compressed_tensors.h"
#include "formats/gptq.h"
#include "formats/layout/marlin_layout.h"
#include "formats/marlin.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::matmul_error;

using Rng = std::mt19937_64;

uint16_t encode_scale(float v, DType d) {
  return d == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
}

// One projection [E, N, K] with random codes (never all zero), scales, zeros, act-order g_idx.
QuantTensor random_proj(Rng& rng, int64_t E, int64_t N, int64_t K, int bits, int64_t gs,
                        bool symmetric, bool act_order, DType scale_dtype) {
  QuantTensor q;
  q.experts = E;
  q.n = N;
  q.k = K;
  q.bits = bits;
  q.group_size = gs;
  q.symmetric = symmetric;
  q.scale_dtype = scale_dtype;
  const int64_t G = q.groups();
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1);
  q.codes.resize(static_cast<size_t>(E * N * K));
  for (auto& c : q.codes) c = static_cast<uint8_t>(code(rng));
  q.codes[0] = 1;  // never all-zero
  std::uniform_real_distribution<float> mag(0.001f, 0.05f);
  std::bernoulli_distribution neg(0.2);
  q.scales.resize(static_cast<size_t>(E * N * G * q.scale_bytes()));
  for (int64_t i = 0; i < E * N * G; ++i) {
    float v = mag(rng) * (neg(rng) ? -1.0f : 1.0f);
    if (scale_dtype == DType::kF32) {
      std::memcpy(q.scales.data() + i * 4, &v, 4);
    } else {
      const uint16_t h = encode_scale(v, scale_dtype);
      std::memcpy(q.scales.data() + i * 2, &h, 2);
    }
  }
  if (!symmetric) {
    q.zeros.resize(static_cast<size_t>(E * N * G));
    for (auto& z : q.zeros) z = static_cast<uint8_t>(code(rng));
  }
  if (act_order) {
    q.g_idx.resize(static_cast<size_t>(E * K));
    for (int64_t e = 0; e < E; ++e) {
      int32_t* g = q.g_idx.data() + e * K;
      for (int64_t k = 0; k < K; ++k) g[k] = static_cast<int32_t>(gs > 0 ? k / gs : 0);
      std::shuffle(g, g + K, rng);
    }
  }
  q.check_consistent("random");
  return q;
}

struct LayerSpec {
  int64_t E = 2, H = 256, I = 128;
  int bits = 4;
  int64_t gs = 64;
  bool act_order = false;
  QuantMethod method = QuantMethod::kGptq;
  DType scale_dtype = DType::kF16, act_dtype = DType::kF16;
  bool a8 = false, gated = true;
};

MoeExperts random_layer(Rng& rng, const LayerSpec& s) {
  const bool sym = s.method != QuantMethod::kAwq;
  MoeExperts x;
  x.w13 = random_proj(rng, s.E, s.gated ? 2 * s.I : s.I, s.H, s.bits, s.gs, sym, s.act_order,
                      s.scale_dtype);
  x.w2 = random_proj(rng, s.E, s.H, s.I, s.bits, s.gs, sym, s.act_order, s.scale_dtype);
  return x;
}

LayoutOptions options_for(const LayerSpec& s) {
  LayoutOptions o;
  o.act_dtype = s.act_dtype;
  o.source_method = s.method;
  o.a8 = s.a8;
  o.gated = s.gated;
  o.prefix = "model.layers.7.mlp.experts.";
  return o;
}

TensorMap by_name(const std::vector<Tensor>& ts) {
  TensorMap m;
  for (const auto& t : ts) m[t.name] = t;
  return m;
}

// Scales of q converted to dtype `to` the way vLLM's param copy_ does.
std::vector<uint8_t> converted_scales(const QuantTensor& q, DType to) {
  std::vector<uint8_t> out;
  const int64_t count = static_cast<int64_t>(q.scales.size()) / q.scale_bytes();
  out.resize(static_cast<size_t>(count * 2));
  for (int64_t i = 0; i < count; ++i) {
    uint16_t h;
    if (q.scale_dtype == to) {
      std::memcpy(&h, q.scales.data() + i * 2, 2);
    } else if (q.scale_dtype == DType::kF16) {
      uint16_t f;
      std::memcpy(&f, q.scales.data() + i * 2, 2);
      h = f16_to_bf16(f);
    } else {
      float v;
      if (q.scale_dtype == DType::kF32) {
        std::memcpy(&v, q.scales.data() + i * 4, 4);
      } else {
        uint16_t b;
        std::memcpy(&b, q.scales.data() + i * 2, 2);
        v = bf16_to_float(b);
      }
      h = encode_scale(v, to);
    }
    std::memcpy(out.data() + i * 2, &h, 2);
  }
  return out;
}

std::vector<float> random_x(Rng& rng, int64_t m, int64_t k) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = u(rng);
  return x;
}

// Kernel-view error of one projection/expert of a packed layer vs reference q.
double kernel_error(Rng& rng, const LayoutOptions& o, const TensorMap& params, const QuantTensor& q,
                    MoeProj proj, int64_t e) {
  const int64_t m = 2;
  const std::vector<float> x = random_x(rng, m, q.k);
  std::vector<float> y(static_cast<size_t>(m * q.n));
  test::layout_matmul(marlin_make_reader, o, params, proj, e, x.data(), m, y.data());
  return matmul_error(q, e, x, m, y);
}

// The reference the kernel should reproduce: q with its scales in the activation dtype.
QuantTensor in_act_dtype(const QuantTensor& q, DType act) {
  QuantTensor r = q;
  r.scales = converted_scales(q, act);
  r.scale_dtype = act;
  return r;
}

void expect_roundtrip(const LayerSpec& s, const MoeExperts& x, const MoeExperts& back,
                      const std::string& what) {
  const QuantTensor* in[2] = {&x.w13, &x.w2};
  const QuantTensor* out[2] = {&back.w13, &back.w2};
  const bool all_one_group = x.w13.groups() == 1 && x.w2.groups() == 1;
  for (int i = 0; i < 2; ++i) {
    const QuantTensor &a = *in[i], &b = *out[i];
    EXPECT_EQ(b.experts, a.experts) << what;
    EXPECT_EQ(b.n, a.n) << what;
    EXPECT_EQ(b.k, a.k) << what;
    EXPECT_EQ(b.bits, a.bits) << what;
    EXPECT_EQ(b.group_size, all_one_group ? -1 : a.group_size) << what;
    EXPECT_EQ(b.symmetric, a.symmetric) << what;
    EXPECT_EQ(b.scale_dtype, s.act_dtype) << what;
    EXPECT_TRUE(b.codes == a.codes) << what << " codes";
    EXPECT_TRUE(b.zeros == a.zeros) << what << " zeros";
    EXPECT_TRUE(b.g_idx == a.g_idx) << what << " g_idx";
    EXPECT_TRUE(b.scales == converted_scales(a, s.act_dtype)) << what << " scales";
  }
}

std::string describe(const LayerSpec& s) {
  return std::string(quant_method_name(s.method)) + " E=" + std::to_string(s.E) +
         " H=" + std::to_string(s.H) + " I=" + std::to_string(s.I) +
         " bits=" + std::to_string(s.bits) + " gs=" + std::to_string(s.gs) +
         " act_order=" + std::to_string(s.act_order) + " a8=" + std::to_string(s.a8) +
         " gated=" + std::to_string(s.gated) + " scale=" + dtype_name(s.scale_dtype) +
         " act=" + dtype_name(s.act_dtype);
}

LayerSpec random_spec(Rng& rng) {
  LayerSpec s;
  const QuantMethod methods[] = {QuantMethod::kGptq, QuantMethod::kAwq,
                                 QuantMethod::kCtPackQuantized};
  s.method = methods[rng() % 3];
  s.bits = s.method == QuantMethod::kAwq ? 4 : (rng() % 2 ? 8 : 4);
  const int64_t groups[] = {-1, 32, 64, 128};
  s.gs = s.method == QuantMethod::kAwq ? groups[1 + rng() % 3] : groups[rng() % 4];
  s.E = 1 + static_cast<int64_t>(rng() % 3);
  s.H = 128 * (1 + static_cast<int64_t>(rng() % 3));
  const int64_t step = std::max<int64_t>(64, s.gs);
  s.I = step * (1 + static_cast<int64_t>(rng() % (256 / step + 1)));
  s.a8 = rng() % 4 == 0;
  s.act_order = s.method != QuantMethod::kAwq && !s.a8 && s.gs > 0 && rng() % 2;
  s.gated = rng() % 5 != 0;
  const DType sd[] = {DType::kF16, DType::kBF16, DType::kF32};
  s.scale_dtype = sd[rng() % 3];
  s.act_dtype = rng() % 2 ? DType::kBF16 : DType::kF16;
  return s;
}

// ---- properties ----------------------------------------------------------------------------

TEST(MarlinMoe, RandomLayersRoundTripAndKernelView) {
  Rng rng(20260519);
  for (int trial = 0; trial < 40; ++trial) {
    const LayerSpec s = random_spec(rng);
    const std::string what = "trial " + std::to_string(trial) + ": " + describe(s);
    const MoeExperts x = random_layer(rng, s);
    LayoutOptions o = options_for(s);
    ASSERT_TRUE(marlin_unsupported_reasons(o, moe_shape_of(x)).empty()) << what;
    const std::vector<Tensor> params = pack_marlin_moe(o, x);
    const TensorMap m = by_name(params);
    expect_roundtrip(s, x, unpack_marlin_moe(o, m), what);
    for (int64_t e = 0; e < s.E; ++e) {
      EXPECT_LT(kernel_error(rng, o, m, in_act_dtype(x.w13, s.act_dtype), MoeProj::kW13, e), 1e-5)
          << what << " w13 e=" << e;
      EXPECT_LT(kernel_error(rng, o, m, in_act_dtype(x.w2, s.act_dtype), MoeProj::kW2, e), 1e-5)
          << what << " w2 e=" << e;
    }
    // Output bytes never depend on the thread count.
    for (int threads : {2, 5}) {
      o.threads = threads;
      const std::vector<Tensor> again = pack_marlin_moe(o, x);
      ASSERT_EQ(again.size(), params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(again[i].name, params[i].name);
        EXPECT_TRUE(again[i].data == params[i].data) << what << " threads=" << threads;
      }
      const MoeExperts back = unpack_marlin_moe(o, m);
      EXPECT_TRUE(back.w13.codes == x.w13.codes) << what << " unpack threads=" << threads;
    }
  }
}

TEST(MarlinMoe, EdgeCases) {
  Rng rng(7);
  std::vector<LayerSpec> specs;
  LayerSpec one_tile;  // E=1, K = one k-tile of 128 = group size, smallest legal I
  one_tile.E = 1;
  one_tile.H = 128;
  one_tile.I = 128;
  one_tile.gs = 128;
  specs.push_back(one_tile);
  LayerSpec ao = one_tile;
  ao.act_order = true;
  ao.gs = 32;
  ao.I = 64;
  specs.push_back(ao);
  LayerSpec cw = one_tile;  // channelwise
  cw.gs = -1;
  cw.bits = 8;
  cw.method = QuantMethod::kCtPackQuantized;
  specs.push_back(cw);
  LayerSpec awq = one_tile;
  awq.method = QuantMethod::kAwq;
  awq.I = 64;
  awq.gs = 64;
  awq.a8 = true;
  awq.scale_dtype = DType::kBF16;
  awq.act_dtype = DType::kBF16;
  specs.push_back(awq);
  for (const auto& s : specs) {
    const MoeExperts x = random_layer(rng, s);
    const LayoutOptions o = options_for(s);
    const TensorMap m = by_name(pack_marlin_moe(o, x));
    expect_roundtrip(s, x, unpack_marlin_moe(o, m), describe(s));
    EXPECT_LT(kernel_error(rng, o, m, in_act_dtype(x.w13, s.act_dtype), MoeProj::kW13, 0), 1e-5)
        << describe(s);
    EXPECT_LT(kernel_error(rng, o, m, in_act_dtype(x.w2, s.act_dtype), MoeProj::kW2, 0), 1e-5)
        << describe(s);
  }
}

// ---- the kernel view catches mis-laid-out parameters -----------------------------------------

TEST(MarlinMoe, KernelViewDetectsWrongScalePermutation) {
  // GPTQ, I = group_size = 128 < H: vLLM's size_k = I rule picks the single permutation for w13
  // while the kernel reads the grouped one (spec §4.3).
  Rng rng(11);
  LayerSpec s;
  s.H = 256;
  s.I = 128;
  s.gs = 128;
  const MoeExperts x = random_layer(rng, s);
  LayoutOptions o = options_for(s);
  const TensorMap good = by_name(pack_marlin_moe(o, x));
  o.vllm_w13_scale_size_k = true;
  const TensorMap vllm = by_name(pack_marlin_moe(o, x));
  const std::string sn = o.prefix + "w13_scales";
  EXPECT_FALSE(good.at(sn).data == vllm.at(sn).data);
  EXPECT_TRUE(good.at(o.prefix + "w2_scales").data == vllm.at(o.prefix + "w2_scales").data);
  // The vLLM bytes: single-permuted [G, N] scales.
  std::vector<uint8_t> single(x.w13.scales.size());
  const int64_t G = x.w13.groups(), N = x.w13.n;
  for (int64_t e = 0; e < s.E; ++e) {
    std::vector<uint8_t> t(static_cast<size_t>(G * N * 2));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g)
        std::memcpy(t.data() + (g * N + n) * 2, x.w13.scales.data() + ((e * N + n) * G + g) * 2, 2);
    marlin_permute_scales(t.data(), G, N, 2, false);
    std::memcpy(single.data() + e * G * N * 2, t.data(), t.size());
  }
  EXPECT_TRUE(vllm.at(sn).data == single);
  // unpack with the same option recovers the input; the kernel view shows the bug.
  expect_roundtrip(s, x, unpack_marlin_moe(o, vllm), "vllm rule");
  EXPECT_LT(kernel_error(rng, o, good, x.w13, MoeProj::kW13, 0), 1e-5);
  EXPECT_GT(kernel_error(rng, o, vllm, x.w13, MoeProj::kW13, 0), 1e-2);
  const auto dev_default = marlin_deviations_from_vllm(options_for(s), moe_shape_of(x));
  ASSERT_EQ(dev_default.size(), 1u);
  EXPECT_NE(dev_default[0].find("w13_scales"), std::string::npos);
  EXPECT_TRUE(marlin_deviations_from_vllm(o, moe_shape_of(x)).empty());
}

TEST(MarlinMoe, KernelViewDetectsMisplacedZerosAndUnsortedGidx) {
  Rng rng(12);
  LayerSpec awq;
  awq.method = QuantMethod::kAwq;
  awq.gs = 64;
  const MoeExperts xa = random_layer(rng, awq);
  const LayoutOptions oa = options_for(awq);
  TensorMap ma = by_name(pack_marlin_moe(oa, xa));
  EXPECT_LT(kernel_error(rng, oa, ma, xa.w2, MoeProj::kW2, 1), 1e-5);
  // Zeros packed with the a8 (no interleave) order instead: wrong product.
  {
    const int64_t G = xa.w2.groups(), N = xa.w2.n;
    std::vector<uint8_t> zp(static_cast<size_t>(G * N));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g)
        zp[static_cast<size_t>(g * N + n)] = xa.w2.zeros[static_cast<size_t>((N + n) * G + g)];
    const std::vector<uint32_t> bad = marlin_pack_zero_points(zp.data(), G, N, 4, true);
    Tensor& z = ma.at(oa.prefix + "w2_qzeros");
    std::memcpy(z.data.data() + G * (N / 8) * 4, bad.data(), bad.size() * 4);
    EXPECT_GT(kernel_error(rng, oa, ma, xa.w2, MoeProj::kW2, 1), 1e-3);
  }
  LayerSpec gq;
  gq.act_order = true;
  gq.gs = 32;
  const MoeExperts xg = random_layer(rng, gq);
  const LayoutOptions og = options_for(gq);
  TensorMap mg = by_name(pack_marlin_moe(og, xg));
  EXPECT_LT(kernel_error(rng, og, mg, xg.w13, MoeProj::kW13, 0), 1e-5);
  // The sorted g_idx is stored; replacing it by the unsorted one (what vLLM@9aaf83ef's GPTQ
  // loader returns) misreads groups.
  Tensor& gi = mg.at(og.prefix + "w13_g_idx");
  std::memcpy(gi.data.data(), xg.w13.g_idx.data(), gi.data.size());
  EXPECT_GT(kernel_error(rng, og, mg, xg.w13, MoeProj::kW13, 0), 1e-3);
  const auto dev = marlin_deviations_from_vllm(og, moe_shape_of(xg));
  ASSERT_EQ(dev.size(), 2u);
  EXPECT_NE(dev[0].find("sorted g_idx"), std::string::npos);
}

// ---- cross-format identities -----------------------------------------------------------------

TEST(MarlinMoe, SameCodesSameMarlinWeightsAcrossFormats) {
  Rng rng(13);
  for (int bits : {4, 8}) {
    LayerSpec s;
    s.bits = bits;
    s.gs = 64;
    const MoeExperts x = random_layer(rng, s);
    // Through the checkpoint codecs: GPTQ and compressed-tensors encodings of the same codes.
    QuantParams p;
    p.bits = bits;
    p.group_size = s.gs;
    MoeExperts via_gptq = x, via_ct = x;
    for (int i = 0; i < 2; ++i) {
      const QuantTensor& src = i == 0 ? x.w13 : x.w2;
      std::vector<QuantTensor> g, c;
      QuantTensor& dg = i == 0 ? via_gptq.w13 : via_gptq.w2;
      QuantTensor& dc = i == 0 ? via_ct.w13 : via_ct.w2;
      dg.codes.clear();
      dg.scales.clear();
      dc.codes.clear();
      dc.scales.clear();
      for (int64_t e = 0; e < src.experts; ++e) {
        QuantTensor one = src;
        one.experts = 1;
        one.codes.assign(src.codes.begin() + e * src.n * src.k,
                         src.codes.begin() + (e + 1) * src.n * src.k);
        const size_t sb = static_cast<size_t>(src.n * src.groups() * 2);
        one.scales.assign(src.scales.begin() + static_cast<long>(e * sb),
                          src.scales.begin() + static_cast<long>((e + 1) * sb));
        p.method = QuantMethod::kGptq;
        const QuantTensor a = unpack_gptq(p, pack_gptq(p, one), one.n, one.k);
        p.method = QuantMethod::kCtPackQuantized;
        const QuantTensor b = unpack_ct_pack(p, pack_ct_pack(p, one), one.n, one.k);
        dg.codes.insert(dg.codes.end(), a.codes.begin(), a.codes.end());
        dg.scales.insert(dg.scales.end(), a.scales.begin(), a.scales.end());
        dc.codes.insert(dc.codes.end(), b.codes.begin(), b.codes.end());
        dc.scales.insert(dc.scales.end(), b.scales.begin(), b.scales.end());
      }
    }
    LayoutOptions og = options_for(s), oc = options_for(s);
    oc.source_method = QuantMethod::kCtPackQuantized;
    const TensorMap mg = by_name(pack_marlin_moe(og, via_gptq));
    const TensorMap mc = by_name(pack_marlin_moe(oc, via_ct));
    EXPECT_TRUE(mg.at(og.prefix + "w13_qweight").data ==
                mc.at(oc.prefix + "w13_weight_packed").data);
    EXPECT_TRUE(mg.at(og.prefix + "w2_qweight").data == mc.at(oc.prefix + "w2_weight_packed").data);
    EXPECT_TRUE(mg.at(og.prefix + "w13_scales").data == mc.at(oc.prefix + "w13_weight_scale").data);
    if (bits == 4) {
      // AWQ with every zero at 8 holds the same codes; its Marlin qweight is identical too.
      MoeExperts as_awq = x;
      for (QuantTensor* q : {&as_awq.w13, &as_awq.w2}) {
        q->symmetric = false;
        q->zeros.assign(static_cast<size_t>(q->experts * q->n * q->groups()), 8);
      }
      LayoutOptions oa = options_for(s);
      oa.source_method = QuantMethod::kAwq;
      const TensorMap ma = by_name(pack_marlin_moe(oa, as_awq));
      EXPECT_TRUE(ma.at(oa.prefix + "w13_qweight").data == mg.at(og.prefix + "w13_qweight").data);
      EXPECT_TRUE(ma.at(oa.prefix + "w2_qweight").data == mg.at(og.prefix + "w2_qweight").data);
      // And the same product.
      EXPECT_LT(kernel_error(rng, oa, ma, x.w13, MoeProj::kW13, 1), 1e-5);
    }
  }
}

TEST(MarlinMoe, ActOrderRepackEqualsRepackOfGatheredRows) {
  Rng rng(14);
  const int64_t N = 128, K = 256;
  for (int bits : {4, 8}) {
    const QuantTensor q = random_proj(rng, 1, N, K, bits, 64, true, true, DType::kF16);
    const std::vector<int32_t> perm = stable_argsort(q.g_idx.data(), K);
    std::vector<uint8_t> gathered(q.codes.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        gathered[static_cast<size_t>(n * K + k)] =
            q.codes[static_cast<size_t>(n * K + perm[static_cast<size_t>(k)])];
    EXPECT_EQ(marlin_repack(q.codes.data(), N, K, bits, perm.data(), false),
              marlin_repack(gathered.data(), N, K, bits, nullptr, false));
  }
}

TEST(MarlinMoe, W13IsConcatOfGateAndUpPerKTile) {
  // spec §3.6: no 64-column tile straddles gate|up, so row kt of Marlin(w13) is
  // concat(Marlin(gate)[kt], Marlin(up)[kt]).
  Rng rng(15);
  const int64_t I = 128, H = 256;
  const QuantTensor q = random_proj(rng, 1, 2 * I, H, 4, 64, true, false, DType::kF16);
  const auto full = marlin_repack(q.codes.data(), 2 * I, H, 4, nullptr, false);
  const auto gate = marlin_repack(q.codes.data(), I, H, 4, nullptr, false);
  const auto up = marlin_repack(q.codes.data() + I * H, I, H, 4, nullptr, false);
  const int64_t row = 2 * I * 16 / 8, half = row / 2;
  for (int64_t kt = 0; kt < H / 16; ++kt) {
    EXPECT_TRUE(std::equal(full.begin() + kt * row, full.begin() + kt * row + half,
                           gate.begin() + kt * half));
    EXPECT_TRUE(std::equal(full.begin() + kt * row + half, full.begin() + (kt + 1) * row,
                           up.begin() + kt * half));
  }
}

// ---- building blocks: inverses and spec examples
// -------------------------------------------------

TEST(MarlinBlocks, RepackInverseAllVariants) {
  Rng rng(16);
  for (int bits : {4, 8})
    for (bool a8 : {false, true})
      for (int64_t N : {64, 192})
        for (int64_t K : {32, 96}) {
          const QuantTensor q = random_proj(rng, 1, N, K, bits, -1, true, false, DType::kF16);
          const auto w = marlin_repack(q.codes.data(), N, K, bits, nullptr, a8);
          EXPECT_EQ(static_cast<int64_t>(w.size()), K / 16 * N * 16 / (32 / bits));
          EXPECT_EQ(marlin_unrepack(w.data(), N, K, bits, a8), q.codes);
        }
}

// marlin_unrepack (one offset table shifted per tile) equals the closed-form field map applied
// code by code, on random words over several tiles in both directions.
TEST(MarlinBlocks, UnrepackEqualsFieldMapPerCode) {
  Rng rng(27);
  for (int bits : {4, 8})
    for (bool a8 : {false, true})
      for (int64_t N : {64, 192})
        for (int64_t K : {32, 96}) {
          const int pf = 32 / bits, T = marlin::words_per_tile(bits);
          const int64_t tiles_n = N / marlin::tile_n(a8), tiles = K / marlin::tile_k(a8) * tiles_n;
          std::vector<uint32_t> w(static_cast<size_t>(tiles * T));
          for (auto& x : w) x = static_cast<uint32_t>(rng());
          std::vector<uint8_t> want(static_cast<size_t>(N * K), 0xff);
          for (int64_t tau = 0; tau < tiles; ++tau)
            for (int r = 0; r < T; ++r)
              for (int f = 0; f < pf; ++f) {
                int64_t k, n;
                marlin::word_field_coords(bits, a8, tau / tiles_n, tau % tiles_n, r, f, &k, &n);
                want[static_cast<size_t>(n * K + k)] = static_cast<uint8_t>(
                    (w[static_cast<size_t>(tau * T + r)] >> (bits * f)) & ((1u << bits) - 1u));
              }
          EXPECT_EQ(marlin_unrepack(w.data(), N, K, bits, a8), want)
              << "bits " << bits << " a8 " << a8 << " N " << N << " K " << K;
        }
}

TEST(MarlinBlocks, TileMapIsABijection) {
  for (int bits : {4, 8})
    for (bool a8 : {false, true}) {
      const int tk = marlin::tile_k(a8), tn = marlin::tile_n(a8), pf = 32 / bits;
      std::vector<int> seen(static_cast<size_t>(tk * tn), 0);
      for (int r = 0; r < marlin::words_per_tile(bits); ++r)
        for (int f = 0; f < pf; ++f) {
          int64_t k, n;
          marlin::word_field_coords(bits, a8, 0, 0, r, f, &k, &n);
          ASSERT_TRUE(k >= 0 && k < tk && n >= 0 && n < tn);
          ++seen[static_cast<size_t>(k * tn + n)];
        }
      for (int v : seen) EXPECT_EQ(v, 1);
    }
}

TEST(MarlinBlocks, SpecExampleWord5) {
  // spec §3.2: word r = 5 of tile (0, 0), int4, holds (2,16) (10,16) (2,24) (10,24) (3,16)
  // (11,16) (3,24) (11,24) in fields 0..7.
  const int64_t want[8][2] = {{2, 16}, {10, 16}, {2, 24}, {10, 24},
                              {3, 16}, {11, 16}, {3, 24}, {11, 24}};
  for (int f = 0; f < 8; ++f) {
    int64_t k, n;
    marlin::word_field_coords(4, false, 0, 0, 5, f, &k, &n);
    EXPECT_EQ(k, want[f][0]);
    EXPECT_EQ(n, want[f][1]);
  }
}

TEST(MarlinBlocks, SpecExampleZeroPoints) {
  // spec §5.1: zp[0, n] = n mod 16, N = 64 -> 0x88880000, 0x99991111, ..., 0xffff7777.
  std::vector<uint8_t> zp(64);
  for (int n = 0; n < 64; ++n) zp[static_cast<size_t>(n)] = static_cast<uint8_t>(n % 16);
  const auto w = marlin_pack_zero_points(zp.data(), 1, 64, 4, false);
  ASSERT_EQ(w.size(), 8u);
  for (uint32_t c = 0; c < 8; ++c) EXPECT_EQ(w[c], 0x88880000u + 0x11111111u * c) << c;
  EXPECT_EQ(marlin_unpack_zero_points(w.data(), 1, 64, 4, false), zp);
}

TEST(MarlinBlocks, ScalePermutationsMatchSpecFormulas) {
  std::vector<uint16_t> v(128);
  for (int i = 0; i < 128; ++i) v[static_cast<size_t>(i)] = static_cast<uint16_t>(i);
  std::vector<uint16_t> g = v, s = v;
  marlin_permute_scales(reinterpret_cast<uint8_t*>(g.data()), 2, 64, 2, true);
  marlin_permute_scales(reinterpret_cast<uint8_t*>(s.data()), 2, 64, 2, false);
  const int S[8] = {0, 1, 8, 9, 16, 17, 24, 25};
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) EXPECT_EQ(g[64 * c + 8 * i + j], 64 * c + 8 * j + i);
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 4; ++i)
      for (int m = 0; m < 8; ++m) EXPECT_EQ(s[32 * c + 8 * i + m], 32 * c + 2 * i + S[m]);
  marlin_unpermute_scales(reinterpret_cast<uint8_t*>(g.data()), 2, 64, 2, true);
  marlin_unpermute_scales(reinterpret_cast<uint8_t*>(s.data()), 2, 64, 2, false);
  EXPECT_EQ(g, v);
  EXPECT_EQ(s, v);
}

TEST(MarlinMoe, Fp16ScalesServedInBf16RoundToNearestEven) {
  Rng rng(17);
  LayerSpec s;
  s.scale_dtype = DType::kF16;
  s.act_dtype = DType::kBF16;
  MoeExperts x = random_layer(rng, s);
  // 1 + 2^-8 + 2^-10 in fp16 (0x3C05) lies above the bf16 midpoint: rounds up to 0x3F81;
  // 1 + 2^-8 (0x3C04) is a tie: rounds to even 0x3F80.
  const uint16_t a = 0x3C05, b = 0x3C04;
  std::memcpy(x.w13.scales.data(), &a, 2);
  std::memcpy(x.w13.scales.data() + 2, &b, 2);
  const LayoutOptions o = options_for(s);
  const MoeExperts back = unpack_marlin_moe(o, by_name(pack_marlin_moe(o, x)));
  uint16_t ra, rb;
  std::memcpy(&ra, back.w13.scales.data(), 2);
  std::memcpy(&rb, back.w13.scales.data() + 2, 2);
  EXPECT_EQ(ra, 0x3F81);
  EXPECT_EQ(rb, 0x3F80);
}

// ---- refusals ----------------------------------------------------------------------------------

bool has_reason(const std::vector<std::string>& why, const std::string& part) {
  for (const auto& w : why)
    if (w.find(part) != std::string::npos) return true;
  return false;
}

TEST(MarlinMoe, RefusesWhatTheKernelCannotTake) {
  Rng rng(18);
  struct Case {
    std::string name, expect;
    LayerSpec spec;
    std::function<void(MoeExperts&, LayoutOptions&)> tweak;
  };
  std::vector<Case> cases;
  LayerSpec h192;
  h192.H = 192;
  cases.push_back({"H%128", "H=192", h192, nullptr});
  LayerSpec i96;
  i96.I = 96;
  i96.gs = 32;
  cases.push_back({"I%64", "I=96", i96, nullptr});
  LayerSpec i64g128;
  i64g128.I = 64;
  i64g128.gs = 128;
  cases.push_back({"I%group", "max(64, group_size)=128", i64g128, nullptr});
  LayerSpec g256;
  g256.I = 256;
  g256.gs = 256;
  cases.push_back({"group", "group_size=256", g256, nullptr});
  LayerSpec gptq_asym;
  cases.push_back({"asym gptq", "asymmetric", gptq_asym, [](MoeExperts& x, LayoutOptions&) {
                     for (QuantTensor* q : {&x.w13, &x.w2}) {
                       q->symmetric = false;
                       q->zeros.assign(static_cast<size_t>(q->experts * q->n * q->groups()), 7);
                     }
                   }});
  LayerSpec two_bit;
  two_bit.bits = 2;
  cases.push_back({"bits", "bits=2", two_bit, nullptr});
  LayerSpec awq8;
  awq8.method = QuantMethod::kAwq;
  awq8.bits = 8;
  cases.push_back({"awq8", "AWQ on Marlin is 4-bit only", awq8, nullptr});
  LayerSpec a8ao;
  a8ao.a8 = true;
  a8ao.act_order = true;
  cases.push_back({"a8 act-order", "act-order with 8-bit activations", a8ao, nullptr});
  LayerSpec uneven;
  uneven.act_order = true;
  cases.push_back(
      {"uneven groups", "exactly group_size", uneven,
       [](MoeExperts& x, LayoutOptions&) { x.w2.g_idx[0] = x.w2.g_idx[0] == 0 ? 1 : 0; }});
  LayerSpec int8src;
  cases.push_back({"w8a8", "no Marlin MoE path", int8src, [](MoeExperts&, LayoutOptions& o) {
                     o.source_method = QuantMethod::kCtIntQuantized;
                   }});
  for (auto& c : cases) {
    MoeExperts x = random_layer(rng, c.spec);
    LayoutOptions o = options_for(c.spec);
    if (c.tweak) c.tweak(x, o);
    auto why = marlin_unsupported_reasons(o, moe_shape_of(x));
    for (auto& r : marlin_g_idx_reasons(x)) why.push_back(r);
    EXPECT_TRUE(has_reason(why, c.expect)) << c.name << ": " << (why.empty() ? "(none)" : why[0]);
    try {
      pack_marlin_moe(o, x);
      ADD_FAILURE() << c.name << ": pack did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << c.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
  }
}

TEST(MarlinMoe, DeviationsListed) {
  Rng rng(19);
  LayerSpec s;
  s.bits = 8;
  const MoeExperts x = random_layer(rng, s);
  const auto dev = marlin_deviations_from_vllm(options_for(s), moe_shape_of(x));
  EXPECT_TRUE(has_reason(dev, "GPTQ int8"));
  LayerSpec ct = s;
  ct.method = QuantMethod::kCtPackQuantized;
  ct.act_order = true;
  EXPECT_TRUE(
      marlin_deviations_from_vllm(options_for(ct), moe_shape_of(random_layer(rng, ct))).empty());
}

TEST(MarlinMoe, UnpackValidatesParameters) {
  Rng rng(20);
  LayerSpec s;
  s.act_order = true;
  const MoeExperts x = random_layer(rng, s);
  const LayoutOptions o = options_for(s);
  const TensorMap good = by_name(pack_marlin_moe(o, x));
  {
    TensorMap m = good;
    m.erase(o.prefix + "w2_scales");
    try {
      unpack_marlin_moe(o, m);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kMissingTensor);
      EXPECT_EQ(e.tensor(), o.prefix + "w2_scales");
    }
  }
  {
    TensorMap m = good;
    int32_t* si = m.at(o.prefix + "w13_g_idx_sort_indices").as<int32_t>();
    si[1] = si[0];
    try {
      unpack_marlin_moe(o, m);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadValue);
    }
  }
  {
    LayoutOptions wrong = o;
    wrong.act_dtype = DType::kBF16;
    try {
      unpack_marlin_moe(wrong, good);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadDtype);
    }
  }
}

}  // namespace
}  // namespace moepack

namespace moepack {
namespace {

// marlin_repack's row-wise 16-bit-activation path against the normative per-field map
// (word_field_coords), on random shapes, int4/int8, with and without an act-order gather; and
// codes wider than the bit width refused.
TEST(MarlinBlocks, RowwiseRepackEqualsClosedFormMap) {
  std::mt19937_64 rng(11);
  for (int bits : {4, 8})
    for (bool with_perm : {false, true})
      for (int trial = 0; trial < 4; ++trial) {
        const int64_t n = 64 * (1 + static_cast<int64_t>(rng() % 4)),
                      k = 16 * (1 + static_cast<int64_t>(rng() % 9));
        std::vector<uint8_t> codes(static_cast<size_t>(n * k));
        for (auto& c : codes) c = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
        std::vector<int32_t> perm(static_cast<size_t>(k));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        const int32_t* p = with_perm ? perm.data() : nullptr;
        const auto got = marlin_repack(codes.data(), n, k, bits, p, false);
        const int pf = 32 / bits, T = 1024 / pf;
        ASSERT_EQ(got.size(), static_cast<size_t>(n * k / pf));
        for (int64_t w = 0; w < static_cast<int64_t>(got.size()); ++w) {
          const int64_t tau = w / T, kt = tau / (n / 64), nt = tau % (n / 64);
          uint32_t want = 0;
          for (int f = 0; f < pf; ++f) {
            int64_t kk, nn;
            marlin::word_field_coords(bits, false, kt, nt, static_cast<int>(w % T), f, &kk, &nn);
            want |= static_cast<uint32_t>(codes[static_cast<size_t>(nn * k + (p ? p[kk] : kk))])
                    << (bits * f);
          }
          ASSERT_EQ(got[static_cast<size_t>(w)], want) << "bits " << bits << " word " << w;
        }
      }
  std::vector<uint8_t> bad(64 * 16, 3);
  bad[5 * 16 + 7] = 16;
  EXPECT_THROW(marlin_repack(bad.data(), 64, 16, 4, nullptr, false), Error);
}

}  // namespace
}  // namespace moepack
