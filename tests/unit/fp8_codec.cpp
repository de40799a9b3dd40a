// e4m3 / E8M0 scalar codecs against independent oracles (exhaustive over bf16 and fp16 inputs),
// the MXFP8 quantiser's recipes, and the MXFP8 / FP8-block checkpoint codecs' validation.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "core/half.h"
#include "formats/fp8.h"
#include "formats/fp8_block.h"
#include "formats/mxfp8.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

// Oracle: nearest finite e4m3 value by exhaustive search over the decoded table, ties to the
// code with an even LSB, magnitudes beyond 448 saturate, NaN -> 0x7f, the sign bit is kept.
uint8_t oracle_e4m3(float x) {
  static const std::vector<double> table = [] {
    std::vector<double> t;
    for (int c = 0; c <= 0x7e; ++c) t.push_back(static_cast<double>(e4m3_to_float(c)));
    return t;
  }();
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(a - table[static_cast<size_t>(c)]);
    if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

TEST(E4m3, DecodeTableSanity) {
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_EQ(e4m3_to_float(0xbe), -1.75f);
}

TEST(E4m3, EncodeExhaustiveBf16) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = bf16_to_float(static_cast<uint16_t>(h));
    const uint8_t got = float_to_e4m3_satfinite(x), want = oracle_e4m3(x);
    if (got != want && ++bad < 10)
      ADD_FAILURE() << "bf16 0x" << std::hex << h << " (" << x << "): got 0x" << int(got)
                    << ", want 0x" << int(want);
  }
  EXPECT_EQ(bad, 0);
}

TEST(E4m3, EncodeExhaustiveFp16) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = f16_to_float(static_cast<uint16_t>(h));
    const uint8_t got = float_to_e4m3_satfinite(x), want = oracle_e4m3(x);
    if (got != want && ++bad < 10)
      ADD_FAILURE() << "fp16 0x" << std::hex << h << " (" << x << "): got 0x" << int(got)
                    << ", want 0x" << int(want);
  }
  EXPECT_EQ(bad, 0);
}

// float32 inputs carry sticky bits below bf16's mantissa: random patterns over the interesting
// exponent range (float subnormals to beyond 448), plus exact midpoints nudged by one ulp.
TEST(E4m3, EncodeRandomFloat32) {
  std::mt19937 rng(1234);
  int bad = 0;
  for (int i = 0; i < 400000; ++i) {
    uint32_t u = rng();
    const uint32_t exp = (rng() % 160);  // 0 (subnormal) .. 159 (~2^32)
    u = (u & 0x807fffffu) | (exp << 23);
    const float x = bits_to_float(u);
    if (float_to_e4m3_satfinite(x) != oracle_e4m3(x) && ++bad < 10)
      ADD_FAILURE() << "float bits 0x" << std::hex << u;
  }
  for (int c = 0; c < 0x7e; ++c) {
    const float mid = (e4m3_to_float(c) + e4m3_to_float(c + 1)) / 2;  // exact in float32
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid}) {
      if (float_to_e4m3_satfinite(x) != oracle_e4m3(x) && ++bad < 20)
        ADD_FAILURE() << "midpoint " << x << " after code " << c;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(E4m3, SpecialValues) {
  EXPECT_EQ(float_to_e4m3_satfinite(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3_satfinite(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3_satfinite(INFINITY), 0x7e);
  EXPECT_EQ(float_to_e4m3_satfinite(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_e4m3_satfinite(NAN), 0x7f);
  EXPECT_EQ(float_to_e4m3_satfinite(-NAN), 0x7f);
  EXPECT_EQ(float_to_e4m3_satfinite(464.0f), 0x7e);  // would round to 512: saturates
  EXPECT_EQ(float_to_e4m3_satfinite(-1e30f), 0xfe);
  EXPECT_EQ(float_to_e4m3_satfinite(-1e-30f), 0x80);  // rounds to zero, keeps the sign
  EXPECT_EQ(float_to_e4m3_satfinite(std::ldexp(1.0f, -10)), 0x00);  // tie to even (0)
  EXPECT_EQ(float_to_e4m3_satfinite(std::ldexp(3.0f, -10)), 0x02);  // tie to even (2)
  EXPECT_EQ(float_to_e4m3_satfinite(FLT_TRUE_MIN), 0x00);
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(float_to_e4m3_satfinite(e4m3_to_float(static_cast<uint8_t>(c))), c) << c;
  }
}

// E8M0 by definition: the smallest c in [0, 254] with 2^(c-127) >= s (double comparisons).
uint8_t oracle_ceil_code(float s) {
  for (int c = 0; c <= 254; ++c)
    if (std::ldexp(1.0, c - 127) >= static_cast<double>(s)) return static_cast<uint8_t>(c);
  return 254;
}

// The log2 form of spec §6 for amax >= 448 * 2^-126.
int log2_formula_code(float amax) {
  int e;
  const double f = std::frexp(static_cast<double>(amax), &e);  // amax = f * 2^e, f in [0.5, 1)
  const int fl = e - 1;
  return fl + 119 + (2.0 * f > 1.75 ? 1 : 0);
}

std::vector<float> edge_floats() {
  std::vector<float> v = {0.0f,
                          FLT_TRUE_MIN,
                          FLT_MIN,
                          FLT_MAX,
                          1.0f,
                          448.0f,
                          449.0f,
                          447.0f,
                          std::ldexp(1.0f, -127),
                          std::ldexp(1.0f, -126),
                          std::ldexp(448.0f, -127),
                          std::ldexp(448.0f, -126),
                          std::ldexp(1.75f, 3),
                          std::ldexp(1.875f, 3)};
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    v.push_back(p);
    v.push_back(std::nextafter(p, 0.0f));
    v.push_back(std::nextafter(p, INFINITY));
    v.push_back(p * 1.75f);
    if (e < 127) v.push_back(std::nextafter(p * 1.75f, INFINITY));
    v.push_back(std::nextafter(p * 1.75f, 0.0f));
    if (e < 127) v.push_back(p * 1.9f);
  }
  return v;
}

TEST(E8m0, CeilCodeMatchesDefinition) {
  std::mt19937 rng(77);
  std::vector<float> xs = edge_floats();
  for (int i = 0; i < 200000; ++i) xs.push_back(bits_to_float(rng() & 0x7f7fffffu));
  int bad = 0;
  for (float s : xs) {
    if (!std::isfinite(s)) continue;
    if (e8m0_ceil_code(s) != oracle_ceil_code(s) && ++bad < 10)
      ADD_FAILURE() << "s=" << s << " got " << int(e8m0_ceil_code(s)) << " want "
                    << int(oracle_ceil_code(s));
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(e8m0_ceil_code(INFINITY), 254);
  EXPECT_EQ(e8m0_ceil_code(NAN), 255);
}

TEST(E8m0, AmaxCodeMatchesLog2FormulaAndOcp) {
  std::mt19937 rng(78);
  std::vector<float> xs = edge_floats();
  for (int i = 0; i < 200000; ++i) xs.push_back(bits_to_float(rng() & 0x7f7fffffu));
  const float lo = std::ldexp(448.0f, -126);
  int bad = 0, ocp_diff = 0;
  for (float amax : xs) {
    if (!std::isfinite(amax)) continue;
    const int c = mxfp8_scale_code_for_amax(amax);
    // Definition on the correctly rounded float32 quotient.
    if (c != oracle_ceil_code(amax / 448.0f) && ++bad < 10) ADD_FAILURE() << "amax " << amax;
    if (amax >= lo) {
      if (c != log2_formula_code(amax) && ++bad < 10)
        ADD_FAILURE() << "log2 formula, amax " << amax << " got " << c << " want "
                      << log2_formula_code(amax);
      // OCP MX v1.0: floor(log2 amax) - 8 (+127): one less exactly when the significand > 1.75.
      int e;
      const double f = std::frexp(static_cast<double>(amax), &e);
      const int ocp = (e - 1) - 8 + 127;
      if (c != ocp + (2.0 * f > 1.75 ? 1 : 0) && ++bad < 10) ADD_FAILURE() << "ocp " << amax;
      ocp_diff += c != ocp;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(ocp_diff, 0);  // the inputs did exercise the significand > 1.75 case
  EXPECT_EQ(mxfp8_scale_code_for_amax(0.0f), 0);
  EXPECT_EQ(mxfp8_scale_code_for_amax(448.0f), 127);
  EXPECT_EQ(mxfp8_scale_code_for_amax(449.0f), 128);
  EXPECT_EQ(mxfp8_scale_code_for_amax(1.0f), 119);  // 1/448 -> 2^-8 >= 1/448 > 2^-9
}

TEST(QuantizeMxfp8, ScaleIsTightAndNothingSaturates) {
  std::mt19937 rng(5);
  const int64_t E = 2, N = 8, K = 128;
  std::vector<float> w(static_cast<size_t>(E * N * K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t i = 0; i < w.size(); ++i) {
    const int64_t block = static_cast<int64_t>(i) / 32;
    // Per-block magnitudes from 2^-60 to 2^60 so many exponents are hit.
    w[i] = bf16_to_float(
        float_to_bf16(nd(rng) * std::ldexp(1.0f, static_cast<int>(block % 121) - 60)));
  }
  const QuantTensor q = quantize_mxfp8(w.data(), E, N, K, MxRecipe::kFlashInfer);
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(E * N * K / 32));
  for (size_t b = 0; b < q.scales.size(); ++b) {
    double amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(double(w[b * 32 + j])));
    const int c = q.scales[b];
    ASSERT_GT(c, 0);
    EXPECT_LE(amax, 448.0 * std::ldexp(1.0, c - 127)) << b;  // fits without clipping
    EXPECT_GT(amax, 448.0 * std::ldexp(1.0, c - 128)) << b;  // and c is the smallest such
    for (int j = 0; j < 32; ++j) {
      const double x = w[b * 32 + j], s = std::ldexp(1.0, c - 127);
      const double deq = e4m3_to_float(q.codes[b * 32 + j]) * s;
      // RNE to e4m3: error at most half a step (step <= 2^-3 relative, or 2^-9 absolute).
      EXPECT_LE(std::fabs(deq - x), std::max(std::fabs(x) / 16.0, std::ldexp(1.0, -10) * s))
          << b << " " << j;
      EXPECT_EQ(q.codes[b * 32 + j], oracle_e4m3(static_cast<float>(x / s)));
    }
  }
}

TEST(QuantizeMxfp8, ZeroCodeBlocksDifferBetweenRecipes) {
  std::vector<float> w(64, 0.0f);
  // block 0: tiny values (amax <= 448 * 2^-127 -> c = 0); block 1: all zeros, one -0.
  for (int j = 0; j < 32; ++j) w[j] = (j % 2 ? -1.0f : 1.0f) * std::ldexp(1.0f + j / 64.0f, -125);
  w[32 + 3] = -0.0f;
  const QuantTensor fi = quantize_mxfp8(w.data(), 1, 1, 64, MxRecipe::kFlashInfer);
  const QuantTensor mo = quantize_mxfp8(w.data(), 1, 1, 64, MxRecipe::kModelOpt);
  EXPECT_EQ(fi.scales, (std::vector<uint8_t>{0, 0}));
  EXPECT_EQ(mo.scales, (std::vector<uint8_t>{0, 0}));
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(fi.codes[j], j % 2 ? 0x80 : 0x00) << j;
    EXPECT_EQ(mo.codes[j], oracle_e4m3(w[j] * std::ldexp(1.0f, 127))) << j;
    EXPECT_NE(mo.codes[j] & 0x7f, 0) << j;
  }
  for (int j = 32; j < 64; ++j) {
    EXPECT_EQ(fi.codes[j], j == 35 ? 0x80 : 0x00);
    EXPECT_EQ(mo.codes[j], j == 35 ? 0x80 : 0x00);
  }
}

TEST(QuantizeMxfp8, RefusesNonFiniteAndBadShapes) {
  std::vector<float> w(32, 1.0f);
  w[7] = NAN;
  try {
    quantize_mxfp8(w.data(), 1, 1, 32, MxRecipe::kFlashInfer);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadValue);
  }
  try {
    quantize_mxfp8(w.data(), 1, 1, 16, MxRecipe::kFlashInfer);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadShape);
  }
}

// Any e4m3fn code but the two NaNs (0x7f, 0xff), which the codecs refuse.
uint8_t random_finite_e4m3(std::mt19937& rng) {
  uint8_t b;
  do b = static_cast<uint8_t>(rng());
  while (e4m3_is_nan(b));
  return b;
}

TensorMap mx_linear(int64_t n, int64_t k, DType scale_dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor w("weight", DType::kF8_E4M3, {n, k});
  for (auto& b : w.data) b = random_finite_e4m3(rng);
  Tensor s("weight_scale", scale_dtype, {n, k / 32});
  for (auto& b : s.data) b = static_cast<uint8_t>(rng() % 255);
  TensorMap m;
  m.emplace("weight", w);
  m.emplace("weight_scale", s);
  return m;
}

ErrorCode code_of(const std::function<void()>& f, std::string* tensor = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (tensor) *tensor = e.tensor();
    return e.code();
  }
  return ErrorCode::kInternal;  // "did not throw"
}

TEST(Mxfp8Codec, RoundTripBothScaleDtypes) {
  QuantParams p;
  p.method = QuantMethod::kCtMxfp8;
  for (DType d : {DType::kU8, DType::kF8_E8M0}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 32}, {7, 96}, {64, 256}}) {
      const TensorMap lin = mx_linear(n, k, d, static_cast<uint32_t>(n * 1000 + k));
      const QuantTensor q = unpack_mxfp8(p, lin, n, k);
      EXPECT_EQ(q.kind, CodeKind::kFp8E4M3);
      EXPECT_EQ(q.group_size, 32);
      EXPECT_EQ(q.scale_dtype, DType::kU8);
      EXPECT_EQ(q.groups(), k / 32);
      const TensorMap back = pack_mxfp8(p, q);
      EXPECT_EQ(back.at("weight").data, lin.at("weight").data);
      EXPECT_EQ(back.at("weight_scale").data, lin.at("weight_scale").data);
      EXPECT_EQ(back.at("weight_scale").dtype, DType::kU8);
      EXPECT_EQ(back.at("weight_scale").shape, (Shape{n, k / 32}));
    }
  }
  EXPECT_EQ(mxfp8_required_suffixes(p), (std::vector<std::string>{"weight", "weight_scale"}));
}

TEST(Mxfp8Codec, Refusals) {
  QuantParams p;
  std::string t;
  TensorMap lin = mx_linear(4, 64, DType::kU8, 1);
  EXPECT_EQ(code_of([&] { unpack_mxfp8(p, lin, 4, 48); }), ErrorCode::kBadShape);
  EXPECT_EQ(code_of([&] { unpack_mxfp8(p, lin, 5, 64); }, &t), ErrorCode::kBadShape);
  EXPECT_EQ(t, "weight");
  TensorMap nan = lin;
  nan.at("weight_scale").data[5] = 255;
  EXPECT_EQ(code_of([&] { unpack_mxfp8(p, nan, 4, 64); }, &t), ErrorCode::kBadValue);
  EXPECT_EQ(t, "weight_scale");
  TensorMap bad_dtype = lin;
  bad_dtype.at("weight_scale").dtype = DType::kI8;
  EXPECT_EQ(code_of([&] { unpack_mxfp8(p, bad_dtype, 4, 64); }, &t), ErrorCode::kBadDtype);
  EXPECT_EQ(t, "weight_scale");
  TensorMap bad_w = lin;
  bad_w.at("weight").dtype = DType::kU8;
  EXPECT_EQ(code_of([&] { unpack_mxfp8(p, bad_w, 4, 64); }, &t), ErrorCode::kBadDtype);
  TensorMap missing = lin;
  missing.erase("weight_scale");
  EXPECT_EQ(code_of([&] { unpack_mxfp8(p, missing, 4, 64); }, &t), ErrorCode::kMissingTensor);
  EXPECT_EQ(t, "weight_scale");
  TensorMap bad_scale_shape = lin;
  bad_scale_shape.at("weight_scale").shape = {2, 4};
  EXPECT_EQ(code_of([&] { unpack_mxfp8(p, bad_scale_shape, 4, 64); }, &t), ErrorCode::kBadShape);
  EXPECT_EQ(t, "weight_scale");
  // A NaN code (either sign) is malformed input naming the weight, row and column.
  for (uint8_t nan_code : {uint8_t{0x7f}, uint8_t{0xff}}) {
    TensorMap nan_codes = lin;
    nan_codes.at("weight").data[70] = nan_code;
    EXPECT_EQ(code_of([&] { unpack_mxfp8(p, nan_codes, 4, 64); }, &t), ErrorCode::kBadValue);
    EXPECT_EQ(t, "weight");
  }
  // input_scale is optional and ignored.
  TensorMap with_input = lin;
  with_input.emplace("input_scale", Tensor("input_scale", DType::kF32, {}));
  EXPECT_NO_THROW(unpack_mxfp8(p, with_input, 4, 64));
}

TensorMap block_linear(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor w("weight", DType::kF8_E4M3, {n, k});
  for (auto& b : w.data) b = random_finite_e4m3(rng);
  const int64_t sr = (n + 127) / 128, sc = (k + 127) / 128;
  std::vector<float> s(static_cast<size_t>(sr * sc));
  for (auto& v : s)
    v = std::ldexp(1.0f + (rng() % 1000) / 1000.0f, static_cast<int>(rng() % 20) - 15);
  TensorMap m;
  m.emplace("weight", w);
  m.emplace("weight_scale_inv", make_tensor("weight_scale_inv", DType::kF32, {sr, sc}, s));
  return m;
}

TEST(Fp8BlockCodec, RoundTripIncludingRaggedShapes) {
  QuantParams p;
  p.method = QuantMethod::kFp8Block;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{128, 128}, {200, 300}, {1, 1}, {256, 512}}) {
    const TensorMap lin = block_linear(n, k, static_cast<uint32_t>(n + k));
    const QuantTensor q = unpack_fp8_block(p, lin, n, k);
    EXPECT_EQ(q.group_size, 128);
    EXPECT_EQ(q.scale_block_n, 128);
    EXPECT_EQ(q.scale_dtype, DType::kF32);
    EXPECT_EQ(q.scale_rows(), (n + 127) / 128);
    const TensorMap back = pack_fp8_block(p, q);
    EXPECT_EQ(back.at("weight").data, lin.at("weight").data);
    EXPECT_EQ(back.at("weight_scale_inv").data, lin.at("weight_scale_inv").data);
    EXPECT_EQ(back.at("weight_scale_inv").shape, lin.at("weight_scale_inv").shape);
    // dequantize_expert uses scale row n/128 and column k/128.
    const auto deq = dequantize_expert(q, 0);
    const int64_t rn = n - 1, ck = k - 1;
    float s;
    std::memcpy(
        &s,
        lin.at("weight_scale_inv").data.data() + 4 * ((rn / 128) * ((k + 127) / 128) + ck / 128),
        4);
    const float want = e4m3_to_float(lin.at("weight").data[static_cast<size_t>(rn * k + ck)]) * s;
    if (!std::isnan(want)) {
      EXPECT_EQ(deq[static_cast<size_t>(rn * k + ck)], want);
    }
  }
}

TEST(Fp8BlockCodec, Refusals) {
  QuantParams p;
  std::string t;
  const TensorMap lin = block_linear(256, 256, 3);
  for (float badv : {NAN, INFINITY, -1.0f}) {
    TensorMap bad = lin;
    std::memcpy(bad.at("weight_scale_inv").data.data() + 4, &badv, 4);
    EXPECT_EQ(code_of([&] { unpack_fp8_block(p, bad, 256, 256); }, &t), ErrorCode::kBadValue);
    EXPECT_EQ(t, "weight_scale_inv");
  }
  for (uint8_t nan_code : {uint8_t{0x7f}, uint8_t{0xff}}) {
    TensorMap nan_codes = lin;
    nan_codes.at("weight").data[300] = nan_code;
    try {
      unpack_fp8_block(p, nan_codes, 256, 256);
      ADD_FAILURE() << "a NaN weight code was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadValue);
      EXPECT_EQ(e.tensor(), "weight");
      EXPECT_NE(e.message().find("row 1, column 44"), std::string::npos) << e.message();
    }
  }
  EXPECT_EQ(code_of([&] { unpack_fp8_block(p, lin, 256, 384); }), ErrorCode::kBadShape);
  TensorMap f16 = lin;
  f16.at("weight_scale_inv").dtype = DType::kF16;
  EXPECT_EQ(code_of([&] { unpack_fp8_block(p, f16, 256, 256); }, &t), ErrorCode::kBadDtype);
  QuantParams p64 = p;
  p64.block_k = 64;
  EXPECT_EQ(code_of([&] { unpack_fp8_block(p64, lin, 256, 256); }), ErrorCode::kUnsupported);
  TensorMap missing = lin;
  missing.erase("weight");
  EXPECT_EQ(code_of([&] { unpack_fp8_block(p, missing, 256, 256); }, &t),
            ErrorCode::kMissingTensor);
  EXPECT_EQ(t, "weight");
}

}  // namespace
}  // namespace moepack
