// Property tests of the Triton MoE layouts (formats/triton_wna16, formats/triton_int8):
// unpack(pack(x)) == x on random legal layers, the reader's matmul (reading the packed bytes like
// the kernel) against dequantize_expert, vLLM's GPTQ zero-point wrap, and the refusal reasons.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/half.h"
#include "formats/triton_int8.h"
#include "formats/triton_wna16.h"
#include "tests/test_util.h"

using namespace moepack;

namespace {

struct Spec {
  int64_t experts, hidden, inter, group_size;
  int bits;
  bool symmetric;
  QuantMethod method;
  DType act;
};

std::string describe(const Spec& s) {
  return std::string(quant_method_name(s.method)) + " E=" + std::to_string(s.experts) +
         " H=" + std::to_string(s.hidden) + " I=" + std::to_string(s.inter) +
         " gs=" + std::to_string(s.group_size) + " bits=" + std::to_string(s.bits) +
         (s.symmetric ? " sym " : " asym ") + dtype_name(s.act);
}

uint16_t random_scale(std::mt19937& rng, DType dt) {
  const float v = 0.0005f + static_cast<float>(rng() % 100000) * 2e-7f;
  return dt == DType::kF16 ? float_to_f16(v) : float_to_bf16(v);
}

// Random canonical projection; codes never all zero, zeros in [zmin, zmax].
QuantTensor random_projection(std::mt19937& rng, int64_t e, int64_t n, int64_t k, int64_t gs,
                              int bits, bool sym, DType scale_dtype, int zmin, int zmax) {
  QuantTensor q;
  q.experts = e;
  q.n = n;
  q.k = k;
  q.bits = bits;
  q.group_size = gs;
  q.symmetric = sym;
  q.scale_dtype = scale_dtype;
  q.codes.resize(static_cast<size_t>(e * n * k));
  for (auto& c : q.codes) c = static_cast<uint8_t>(rng() % (1u << bits));
  q.codes[0] = 1;
  const int64_t G = q.groups();
  q.scales.resize(static_cast<size_t>(e * n * G * 2));
  for (size_t i = 0; i < q.scales.size(); i += 2) {
    const uint16_t h = random_scale(rng, scale_dtype);
    std::memcpy(&q.scales[i], &h, 2);
  }
  if (!sym) {
    q.zeros.resize(static_cast<size_t>(e * n * G));
    for (auto& z : q.zeros) z = static_cast<uint8_t>(zmin + rng() % (zmax - zmin + 1));
  }
  return q;
}

MoeExperts random_layer(std::mt19937& rng, const Spec& s, int zmin, int zmax) {
  MoeExperts x;
  x.w13 = random_projection(rng, s.experts, 2 * s.inter, s.hidden, s.group_size, s.bits,
                            s.symmetric, s.act, zmin, zmax);
  x.w2 = random_projection(rng, s.experts, s.hidden, s.inter, s.group_size, s.bits, s.symmetric,
                           s.act, zmin, zmax);
  return x;
}

LayoutOptions options_for(const Spec& s) {
  LayoutOptions o;
  o.act_dtype = s.act;
  o.source_method = s.method;
  o.prefix = "model.layers.1.mlp.experts.";
  return o;
}

TensorMap to_map(const std::vector<Tensor>& ts) {
  TensorMap m;
  for (const auto& t : ts) m[t.name] = t;
  return m;
}

void expect_same(const QuantTensor& a, const QuantTensor& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.k, b.k);
  EXPECT_EQ(a.bits, b.bits);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.group_size, b.group_size);
  EXPECT_EQ(a.symmetric, b.symmetric);
  EXPECT_EQ(a.scale_dtype, b.scale_dtype);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.zeros, b.zeros);
  EXPECT_EQ(a.g_idx, b.g_idx);
}

// ||y - y_ref|| / ||y_ref|| of x . W^T, W from dequantize_expert.
template <typename Matmul>
double matmul_error(const QuantTensor& q, int64_t e, Matmul&& mm, std::mt19937& rng) {
  const int64_t m = 3;
  std::vector<float> x(static_cast<size_t>(m * q.k)), y(static_cast<size_t>(m * q.n));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  mm(x.data(), m, y.data());
  const auto w = dequantize_expert(q, e);
  double num = 0, den = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t n = 0; n < q.n; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < q.k; ++k)
        ref += static_cast<double>(x[static_cast<size_t>(r * q.k + k)]) *
               w[static_cast<size_t>(n * q.k + k)];
      const double d = y[static_cast<size_t>(r * q.n + n)] - ref;
      num += d * d;
      den += ref * ref;
    }
  EXPECT_GT(den, 0.0);
  return std::sqrt(num / den);
}

std::vector<Spec> legal_specs() {
  std::vector<Spec> out;
  const int64_t hs[] = {64, 128, 256, 320};
  const int64_t is[] = {32, 64, 96, 128, 192};
  const int64_t gss[] = {32, 64, 128};
  for (QuantMethod m : {QuantMethod::kGptq, QuantMethod::kAwq, QuantMethod::kCtPackQuantized})
    for (int bits : {4, 8})
      for (bool sym : {true, false})
        for (int64_t h : hs)
          for (int64_t i : is)
            for (int64_t gs : gss) {
              const Spec s{1 + static_cast<int64_t>((h + i + gs) % 3),     h, i, gs, bits, sym, m,
                           ((h + i) / 32) % 2 ? DType::kF16 : DType::kBF16};
              out.push_back(s);
            }
  return out;
}

TEST(TritonWna16, RoundTripAndMatmulOnRandomLayers) {
  std::mt19937 rng(1234);
  int packed = 0, halved = 0, refused = 0;
  for (const Spec& s : legal_specs()) {
    SCOPED_TRACE(describe(s));
    const bool gptq = s.method == QuantMethod::kGptq;
    const bool awq = s.method == QuantMethod::kAwq;
    // Zeros kept <= 15 so the kernel reading equals dequantize_expert (16 wraps: own test).
    MoeExperts x = random_layer(rng, s, gptq ? 1 : 0, 15);
    const LayoutOptions o = options_for(s);
    const auto reasons = triton_wna16_unsupported_reasons(o, moe_shape_of(x));
    if (!reasons.empty()) {
      ++refused;
      EXPECT_THROW(pack_triton_wna16_moe(o, x), Error);
      continue;
    }
    ++packed;
    EXPECT_FALSE(awq && s.bits == 8);
    const auto out = pack_triton_wna16_moe(o, x);
    const TensorMap params = to_map(out);
    int64_t eff = s.group_size, f = 1;
    if (s.method != QuantMethod::kCtPackQuantized) {
      ASSERT_TRUE(triton_wna16_halve_group_size(s.group_size, s.inter, s.hidden, &eff, &f));
    }
    if (f > 1) ++halved;
    const std::string scales13 =
        o.prefix + (s.method == QuantMethod::kCtPackQuantized ? "w13_weight_scale" : "w13_scales");
    ASSERT_TRUE(params.count(scales13));
    // K / gs' columns: vLLM's loader narrows the f-fold repeats to its parameter.
    EXPECT_EQ(params.at(scales13).shape, (Shape{s.experts, 2 * s.inter, s.hidden / eff}));
    const MoeExperts back = unpack_triton_wna16_moe(o, params);
    if (s.hidden % s.group_size == 0 && s.inter % s.group_size == 0) {
      expect_same(back.w13, x.w13, "w13");
      expect_same(back.w2, x.w2, "w2");
    } else {
      // The narrowing dropped the repeats that showed gs: the shapes alone may read a smaller
      // group size, which decodes to the same weights.
      for (int64_t e = 0; e < s.experts; ++e) {
        EXPECT_EQ(dequantize_expert(back.w13, e), dequantize_expert(x.w13, e)) << "w13 " << e;
        EXPECT_EQ(dequantize_expert(back.w2, e), dequantize_expert(x.w2, e)) << "w2 " << e;
      }
    }
    if (s.method != QuantMethod::kCtPackQuantized) {
      const MoeExperts back2 = unpack_triton_wna16_moe_with_group_size(o, params, s.group_size);
      expect_same(back2.w13, x.w13, "w13 (group size given)");
      expect_same(back2.w2, x.w2, "w2 (group size given)");
    }
    for (int64_t e = 0; e < s.experts; ++e) {
      EXPECT_LT(matmul_error(
                    x.w13, e,
                    [&](const float* xx, int64_t m, float* y) {
                      test::layout_matmul(triton_wna16_make_reader, o, params, MoeProj::kW13, e, xx,
                                          m, y);
                    },
                    rng),
                1e-5);
      EXPECT_LT(matmul_error(
                    x.w2, e,
                    [&](const float* xx, int64_t m, float* y) {
                      test::layout_matmul(triton_wna16_make_reader, o, params, MoeProj::kW2, e, xx,
                                          m, y);
                    },
                    rng),
                1e-5);
    }
  }
  EXPECT_GT(packed, 100);
  EXPECT_GT(halved, 10);
  EXPECT_GT(refused, 10);
}

TEST(TritonWna16, OneExpertOneGroup) {
  std::mt19937 rng(5);
  for (QuantMethod m : {QuantMethod::kGptq, QuantMethod::kAwq, QuantMethod::kCtPackQuantized}) {
    const Spec s{1, 64, 64, 64, 4, m == QuantMethod::kCtPackQuantized, m, DType::kBF16};
    SCOPED_TRACE(describe(s));
    const MoeExperts x = random_layer(rng, s, 1, 15);
    const LayoutOptions o = options_for(s);
    const auto params = to_map(pack_triton_wna16_moe(o, x));
    const MoeExperts back = unpack_triton_wna16_moe(o, params);
    expect_same(back.w13, x.w13, "w13");
    expect_same(back.w2, x.w2, "w2");
  }
}

TEST(TritonWna16, HalvingRepeatsScaleColumns) {
  // I = 96 is not a multiple of 64: vLLM halves to 32 and repeats every group twice.
  std::mt19937 rng(9);
  const Spec s{2, 256, 96, 64, 4, true, QuantMethod::kGptq, DType::kF16};
  const MoeExperts x = random_layer(rng, s, 0, 0);
  const LayoutOptions o = options_for(s);
  const auto params = to_map(pack_triton_wna16_moe(o, x));
  const Tensor& s2 = params.at(o.prefix + "w2_scales");
  // 96 / 32 = 3 columns: groups 0, 0, 1 (the loader's 2 x 2 repeats narrowed to the parameter).
  ASSERT_EQ(s2.shape, (Shape{2, 256, 3}));
  const auto* in = reinterpret_cast<const uint16_t*>(x.w2.scales.data());
  const auto* outp = s2.as<uint16_t>();
  for (int64_t r = 0; r < 2 * 256; ++r)
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(outp[r * 3 + c], in[r * 2 + c / 2]);
  // vLLM loads this layer (H = 256 is a multiple of 64): no halving deviation to record.
  for (const auto& d : triton_wna16_deviations_from_vllm(o, moe_shape_of(x)))
    EXPECT_EQ(d.find("halved"), std::string::npos) << d;
  // A tampered repeat is caught when the group size is known.
  TensorMap bad = params;
  bad.at(o.prefix + "w2_scales").as<uint16_t>()[1] ^= 1;
  EXPECT_THROW(unpack_triton_wna16_moe_with_group_size(o, bad, 64), Error);
}

TEST(TritonWna16, Fp16ScalesBecomeBf16LikeCopy) {
  std::mt19937 rng(11);
  const Spec s{1, 128, 64, 32, 4, true, QuantMethod::kGptq, DType::kBF16};
  MoeExperts x = random_layer(rng, s, 0, 0);
  x.w13.scale_dtype = x.w2.scale_dtype = DType::kF16;
  for (QuantTensor* q : {&x.w13, &x.w2})
    for (size_t i = 0; i < q->scales.size(); i += 2) {
      const uint16_t h = float_to_f16(0.001f + static_cast<float>(rng() % 4096) * 3.1e-6f);
      std::memcpy(&q->scales[i], &h, 2);
    }
  const LayoutOptions o = options_for(s);
  const auto params = to_map(pack_triton_wna16_moe(o, x));
  const Tensor& sc = params.at(o.prefix + "w13_scales");
  EXPECT_EQ(sc.dtype, DType::kBF16);
  const auto* in = reinterpret_cast<const uint16_t*>(x.w13.scales.data());
  int rounded = 0;
  for (int64_t i = 0; i < numel(sc.shape); ++i) {
    // Through float32 then round-to-nearest-even to bf16.
    const float v = f16_to_float(in[i]);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    const uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    EXPECT_EQ(sc.as<uint16_t>()[i], rne);
    if ((u & 0xffffu) != 0) ++rounded;
  }
  EXPECT_GT(rounded, 0);
}

TEST(TritonWna16, GptqZeroOf16WrapsLikeVllmUint8Arithmetic) {
  // vLLM (convert_gptq_int4_qzeros): nibbles of the stored v1 zeros, +1 in uint8, lo + 16*hi in
  // uint8. Computed here from stored values independently of the codec.
  std::mt19937 rng(3);
  const Spec s{1, 64, 64, 32, 4, false, QuantMethod::kGptq, DType::kF16};
  MoeExperts x = random_layer(rng, s, 1, 16);
  for (size_t i = 0; i < x.w13.zeros.size(); i += 3) x.w13.zeros[i] = 16;
  const LayoutOptions o = options_for(s);
  const auto params = to_map(pack_triton_wna16_moe(o, x));
  const Tensor& z = params.at(o.prefix + "w13_qzeros");
  const int64_t N = x.w13.n, G = x.w13.groups();
  ASSERT_EQ(z.shape, (Shape{1, N / 2, G}));
  int wrapped = 0;
  for (int64_t n2 = 0; n2 < N / 2; ++n2)
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t lo_stored = static_cast<uint8_t>(x.w13.zeros[(2 * n2) * G + g] - 1);
      const uint8_t hi_stored = static_cast<uint8_t>(x.w13.zeros[(2 * n2 + 1) * G + g] - 1);
      const uint8_t lo = static_cast<uint8_t>(lo_stored + 1),
                    hi = static_cast<uint8_t>(hi_stored + 1);
      const uint8_t expect = static_cast<uint8_t>(lo + static_cast<uint8_t>(hi * 16));
      EXPECT_EQ(z.data[static_cast<size_t>(n2 * G + g)], expect);
      if (lo == 16 || hi == 16) ++wrapped;
    }
  EXPECT_GT(wrapped, 0);
  // Still invertible: canonical GPTQ zeros are 1..16.
  const MoeExperts back = unpack_triton_wna16_moe(o, params);
  expect_same(back.w13, x.w13, "w13");
  expect_same(back.w2, x.w2, "w2");
  // And the kernel reading sees the wrapped nibbles, as vLLM's kernel would.
  const double err = matmul_error(
      x.w13, 0,
      [&](const float* xx, int64_t m, float* y) {
        test::layout_matmul(triton_wna16_make_reader, o, params, MoeProj::kW13, 0, xx, m, y);
      },
      rng);
  EXPECT_GT(err, 1e-3);
}

bool has_reason(const std::vector<std::string>& r, const std::string& needle) {
  for (const auto& s : r)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}

// Shape-level reasons come from triton_wna16_unsupported_reasons (what the oracle sees); value
// reasons (zero points the nibbles cannot express) only from pack, which reports both.
enum class Level { kShape, kValues };
void expect_refused(const LayoutOptions& o, const MoeExperts& x, const std::string& needle,
                    Level level = Level::kShape) {
  const auto r = triton_wna16_unsupported_reasons(o, moe_shape_of(x));
  EXPECT_EQ(has_reason(r, needle), level == Level::kShape)
      << "shape reasons and '" << needle << "' disagree";
  try {
    pack_triton_wna16_moe(o, x);
    ADD_FAILURE() << "pack accepted: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TritonWna16, RefusalReasons) {
  std::mt19937 rng(21);
  const Spec base{1, 128, 64, 32, 4, false, QuantMethod::kGptq, DType::kF16};
  {
    MoeExperts x = random_layer(rng, base, 1, 15);
    x.w13.g_idx.resize(static_cast<size_t>(x.w13.k));
    for (int64_t k = 0; k < x.w13.k; ++k) x.w13.g_idx[k] = static_cast<int32_t>((k * 7 % 128) / 32);
    expect_refused(options_for(base), x, "act-order");
    // A g_idx that only restates k / group_size is fine.
    for (int64_t k = 0; k < x.w13.k; ++k) x.w13.g_idx[k] = static_cast<int32_t>(k / 32);
    EXPECT_NO_THROW(pack_triton_wna16_moe(options_for(base), x));
  }
  {
    Spec s = base;
    s.bits = 8;
    expect_refused(options_for(s), random_layer(rng, s, 1, 200), "8-bit zero points");
    s.method = QuantMethod::kAwq;
    expect_refused(options_for(s), random_layer(rng, s, 1, 200), "AWQ with 8 bits");
  }
  {
    MoeExperts x = random_layer(rng, base, 1, 15);
    x.w2.zeros[5] = 0;
    expect_refused(options_for(base), x, "GPTQ zero point of 0", Level::kValues);
  }
  {
    Spec s = base;
    s.method = QuantMethod::kAwq;
    MoeExperts x = random_layer(rng, s, 0, 15);
    x.w2.zeros[5] = 16;
    expect_refused(options_for(s), x, "AWQ int4 zero point 16", Level::kValues);
  }
  {
    Spec s = base;
    s.method = QuantMethod::kCtPackQuantized;
    expect_refused(options_for(s), random_layer(rng, s, 1, 15), "symmetric-only");
    s.symmetric = true;
    s.group_size = -1;
    expect_refused(options_for(s), random_layer(rng, s, 0, 0), "channelwise");
    s.group_size = 96;
    s.inter = 96;
    expect_refused(options_for(s), random_layer(rng, s, 0, 0), "does not divide");
  }
  {
    Spec s = base;
    s.inter = 48;  // 64 -> 32 -> 16: vLLM's assert group_size >= 32 fires
    s.group_size = 64;
    s.symmetric = true;
    expect_refused(options_for(s), random_layer(rng, s, 0, 0), "cannot be halved");
    s.group_size = -1;
    expect_refused(options_for(s), random_layer(rng, s, 0, 0), "channelwise");
    s.inter = 64;
    s.hidden = 64;
    s.group_size = 65;  // halves (floors) to 32
    expect_refused(options_for(s), random_layer(rng, s, 0, 0), "rounds down");
  }
  {
    Spec s = base;
    s.inter = 96;
    s.group_size = 64;  // halving with zero points on w2: vLLM sizes w2_qzeros I // 32
    expect_refused(options_for(s), random_layer(rng, s, 1, 15), "w2_qzeros");
  }
  {
    Spec s = base;
    s.symmetric = true;
    MoeExperts x = random_layer(rng, s, 0, 0);
    LayoutOptions o = options_for(s);
    o.gated = false;
    x.w13.n = s.inter;  // shapes consistent for a non-gated layer
    x.w13.codes.resize(static_cast<size_t>(x.w13.n * x.w13.k));
    x.w13.scales.resize(static_cast<size_t>(x.w13.n * x.w13.groups() * 2));
    expect_refused(o, x, "non-gated");
    o.source_method = QuantMethod::kCtPackQuantized;
    EXPECT_TRUE(triton_wna16_unsupported_reasons(o, moe_shape_of(x)).empty());
    const auto params = to_map(pack_triton_wna16_moe(o, x));
    expect_same(unpack_triton_wna16_moe(o, params).w13, x.w13, "non-gated CT");
  }
  {
    Spec s = base;
    s.symmetric = true;
    MoeExperts x = random_layer(rng, s, 0, 0);
    x.w2.bits = 3;
    x.w13.bits = 3;
    for (auto& c : x.w13.codes) c &= 7;
    for (auto& c : x.w2.codes) c &= 7;
    expect_refused(options_for(s), x, "3-bit");
    LayoutOptions o = options_for(s);
    o.source_method = QuantMethod::kFp8Block;
    expect_refused(o, random_layer(rng, s, 0, 0), "no Triton WNA16 MoE method");
  }
  {
    // Shape disagreement is an input error, not an unsupported feature.
    MoeExperts x = random_layer(rng, base, 1, 15);
    x.w2 = random_projection(rng, 1, 64, 64, 32, 4, false, DType::kF16, 1, 15);
    try {
      pack_triton_wna16_moe(options_for(base), x);
      ADD_FAILURE() << "accepted mismatched shapes";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadShape);
    }
  }
}

TEST(TritonWna16, UnpackRejectsBrokenParams) {
  std::mt19937 rng(33);
  const Spec s{1, 128, 64, 32, 4, false, QuantMethod::kAwq, DType::kF16};
  const LayoutOptions o = options_for(s);
  const auto params = to_map(pack_triton_wna16_moe(o, random_layer(rng, s, 0, 15)));
  {
    TensorMap m = params;
    m.erase(o.prefix + "w2_qzeros");
    try {
      unpack_triton_wna16_moe(o, m);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kMissingTensor);
    }
  }
  {
    TensorMap m = params;
    m.at(o.prefix + "w13_scales").dtype = DType::kBF16;
    try {
      unpack_triton_wna16_moe(o, m);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadDtype);
    }
  }
  {
    TensorMap m = params;
    Tensor& t = m.at(o.prefix + "w2_qweight");
    t.shape[2] += 1;
    t.data.resize(static_cast<size_t>(numel(t.shape)));
    try {
      unpack_triton_wna16_moe(o, m);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadShape);
    }
  }
}

// ---- W8A8 int8 ----

QuantTensor random_int8(std::mt19937& rng, int64_t e, int64_t n, int64_t k, DType sd) {
  QuantTensor q;
  q.experts = e;
  q.n = n;
  q.k = k;
  q.kind = CodeKind::kInt;
  q.bits = 8;
  q.group_size = -1;
  q.symmetric = true;
  q.scale_dtype = sd;
  q.codes.resize(static_cast<size_t>(e * n * k));
  for (auto& c : q.codes) c = static_cast<uint8_t>(rng());
  q.codes[0] = 0x81;
  q.scales.resize(static_cast<size_t>(e * n * dtype_bits(sd) / 8));
  for (int64_t i = 0; i < e * n; ++i) {
    const float v = 0.001f + static_cast<float>(rng() % 10000) * 1e-6f;
    if (sd == DType::kF32) {
      std::memcpy(&q.scales[static_cast<size_t>(i * 4)], &v, 4);
    } else {
      const uint16_t h = sd == DType::kF16 ? float_to_f16(v) : float_to_bf16(v);
      std::memcpy(&q.scales[static_cast<size_t>(i * 2)], &h, 2);
    }
  }
  return q;
}

TEST(TritonInt8, RoundTripAndMatmul) {
  std::mt19937 rng(77);
  int cases = 0;
  for (int64_t e : {1, 3})
    for (int64_t h : {16, 96, 256})
      for (int64_t i : {8, 64, 200})
        for (bool gated : {true, false}) {
          SCOPED_TRACE("E=" + std::to_string(e) + " H=" + std::to_string(h) +
                       " I=" + std::to_string(i) + (gated ? " gated" : " plain"));
          MoeExperts x;
          x.w13 = random_int8(rng, e, (gated ? 2 : 1) * i, h, DType::kF32);
          x.w2 = random_int8(rng, e, h, i, DType::kF32);
          LayoutOptions o;
          o.gated = gated;
          o.prefix = "m.";
          o.source_method = QuantMethod::kCtIntQuantized;
          ASSERT_TRUE(triton_int8_unsupported_reasons(o, moe_shape_of(x)).empty());
          const auto params = to_map(pack_triton_int8_moe(o, x));
          EXPECT_EQ(params.at("m.w13_weight").dtype, DType::kI8);
          EXPECT_EQ(params.at("m.w13_weight").shape, (Shape{e, (gated ? 2 : 1) * i, h}));
          EXPECT_EQ(params.at("m.w2_weight_scale").shape, (Shape{e, h, 1}));
          // No transformation: the parameter bytes are the canonical codes.
          EXPECT_EQ(params.at("m.w2_weight").data, x.w2.codes);
          const MoeExperts back = unpack_triton_int8_moe(o, params);
          expect_same(back.w13, x.w13, "w13");
          expect_same(back.w2, x.w2, "w2");
          for (int64_t ex = 0; ex < e; ++ex) {
            EXPECT_LT(matmul_error(
                          x.w13, ex,
                          [&](const float* xx, int64_t m, float* y) {
                            test::layout_matmul(triton_int8_make_reader, o, params, MoeProj::kW13,
                                                ex, xx, m, y);
                          },
                          rng),
                      1e-5);
            EXPECT_LT(matmul_error(
                          x.w2, ex,
                          [&](const float* xx, int64_t m, float* y) {
                            test::layout_matmul(triton_int8_make_reader, o, params, MoeProj::kW2,
                                                ex, xx, m, y);
                          },
                          rng),
                      1e-5);
          }
          ++cases;
        }
  EXPECT_EQ(cases, 36);
}

TEST(TritonInt8, Bf16AndF16ScalesWidenExactly) {
  std::mt19937 rng(78);
  for (DType sd : {DType::kBF16, DType::kF16}) {
    MoeExperts x;
    x.w13 = random_int8(rng, 2, 64, 32, sd);
    x.w2 = random_int8(rng, 2, 32, 32, sd);
    LayoutOptions o;
    const auto params = to_map(pack_triton_int8_moe(o, x));
    const float* s = params.at("w13_weight_scale").as<float>();
    const auto* in = reinterpret_cast<const uint16_t*>(x.w13.scales.data());
    for (int64_t i = 0; i < 2 * 64; ++i)
      EXPECT_EQ(s[i], sd == DType::kBF16 ? bf16_to_float(in[i]) : f16_to_float(in[i]));
    const MoeExperts back = unpack_triton_int8_moe(o, params);
    EXPECT_EQ(back.w13.scale_dtype, DType::kF32);
    EXPECT_EQ(back.w13.codes, x.w13.codes);
    // Same weights after widening.
    EXPECT_EQ(dequantize_expert(back.w13, 1), dequantize_expert(x.w13, 1));
  }
}

TEST(TritonInt8, RefusalReasons) {
  std::mt19937 rng(79);
  MoeExperts x;
  x.w13 = random_int8(rng, 1, 64, 32, DType::kF32);
  x.w2 = random_int8(rng, 1, 32, 32, DType::kF32);
  LayoutOptions o;
  {
    MoeExperts y = x;
    y.w13.kind = CodeKind::kUint;
    y.w2.group_size = 32;
    const auto r = triton_int8_unsupported_reasons(o, moe_shape_of(y));
    EXPECT_TRUE(has_reason(r, "not signed int8"));
    EXPECT_TRUE(has_reason(r, "channel strategy"));
    try {
      pack_triton_int8_moe(o, y);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("channel strategy"), std::string::npos);
    }
  }
  {
    MoeExperts y = x;
    y.w2.symmetric = false;
    y.w2.zeros.assign(static_cast<size_t>(y.w2.n), 3);
    EXPECT_TRUE(has_reason(triton_int8_unsupported_reasons(o, moe_shape_of(y)), "asymmetric"));
  }
  {
    MoeExperts y = x;
    y.w2 = random_int8(rng, 1, 48, 32, DType::kF32);
    EXPECT_THROW(pack_triton_int8_moe(o, y), Error);
  }
}

}  // namespace
