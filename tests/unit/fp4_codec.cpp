// The canonical form's FP4 codes and two-level scales (formats/codec.h CodeKind::kFp4E2M1,
// GlobalScale): the e2m1 decoder against the OCP MX table, dequantize_expert's definition of a
// value under each global-scale convention (worked by hand), global shards of a stacked w13, and
// check_consistent's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "formats/codec.h"
#include "formats/fp4.h"
#include "formats/fp8.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(E2m1, DecodeTableIsOcpMx) {
  // OCP Microscaling Formats v1.0, Table 5 (FP4 E2M1): exponent bias 1, one mantissa bit,
  // E = 0 subnormal (0.5 * M), no Inf or NaN.
  const float want[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const int e = (c >> 1) & 3, m = c & 1;
    const double by_formula = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
    const float v = e2m1_to_float(static_cast<uint8_t>(c));
    EXPECT_EQ(std::fabs(v), want[c & 7]) << c;
    EXPECT_EQ(std::fabs(v), static_cast<float>(by_formula)) << c;
    EXPECT_EQ(std::signbit(v), (c & 8) != 0) << c;  // 8 is -0
    // The high nibble is not part of the code.
    EXPECT_EQ(bits_of(e2m1_to_float(static_cast<uint8_t>(c | 0xf0))), bits_of(v)) << c;
  }
}

QuantTensor one_block(GlobalScale gs, float global) {
  QuantSpec spec;
  spec.kind = CodeKind::kFp4E2M1;
  spec.bits = 4;
  spec.group_size = 16;
  spec.scale_dtype = DType::kF8_E4M3;
  spec.global_scale = gs;
  QuantTensor q(spec, 1, 1, 16);
  for (int k = 0; k < 16; ++k) q.codes[static_cast<size_t>(k)] = static_cast<uint8_t>(k);
  q.scales[0] = 0x3c;  // e4m3 0.0.1111.100 = 2^0 * 1.5 = 1.5
  if (gs != GlobalScale::kNone) q.global_scales[0] = global;
  return q;
}

TEST(Fp4Canonical, DequantizeUnderEachGlobalConvention) {
  // Without a global scale: code * 1.5.
  const std::vector<float> plain = dequantize_expert(one_block(GlobalScale::kNone, 0), 0);
  EXPECT_EQ(plain[7], 9.0f);    // 6 * 1.5
  EXPECT_EQ(plain[15], -9.0f);  // -6 * 1.5
  EXPECT_EQ(plain[3], 2.25f);   // 1.5 * 1.5
  // ModelOpt weight_scale_2 (a decode multiplier): code * (1.5 * 0.25).
  const std::vector<float> dec =
      dequantize_expert(one_block(GlobalScale::kDecodeMultiplier, 0.25f), 0);
  EXPECT_EQ(dec[7], 2.25f);
  EXPECT_EQ(dec[1], 0.1875f);  // 0.5 * 0.375
  // compressed-tensors weight_global_scale (an encode divisor): code * (1.5 / 4).
  const std::vector<float> enc = dequantize_expert(one_block(GlobalScale::kEncodeDivisor, 4.0f), 0);
  for (int k = 0; k < 16; ++k) EXPECT_EQ(bits_of(enc[k]), bits_of(dec[k])) << k;
  // The divisor is applied as a division, not as a multiplication by its reciprocal: 1.5 / 7
  // and 1.5 * fl(1/7) differ in the last bit.
  const std::vector<float> seventh =
      dequantize_expert(one_block(GlobalScale::kEncodeDivisor, 7.0f), 0);
  volatile float seven = 7.0f, s15 = 1.5f;
  const float by_division = s15 / seven, by_reciprocal = s15 * (1.0f / seven);
  ASSERT_NE(bits_of(by_division), bits_of(by_reciprocal));
  EXPECT_EQ(bits_of(seventh[2]), bits_of(by_division));  // code 2 = 1.0
  // The order is code * (s op g), the scale product rounded first: with s = 1.5 and g = 1.7f,
  // code 5 (= 3) * fl(1.5 * 1.7f) differs from fl(3 * 1.5) * 1.7f.
  const std::vector<float> odd =
      dequantize_expert(one_block(GlobalScale::kDecodeMultiplier, 1.7f), 0);
  volatile float g17 = 1.7f;
  const float scale_first = 3.0f * (s15 * g17), code_first = (3.0f * s15) * g17;
  ASSERT_NE(bits_of(scale_first), bits_of(code_first));
  EXPECT_EQ(bits_of(odd[5]), bits_of(scale_first));
}

TEST(Fp4Canonical, StackedW13KeepsEachShardsGlobalScale) {
  QuantSpec spec;
  spec.kind = CodeKind::kFp4E2M1;
  spec.bits = 4;
  spec.group_size = 16;
  spec.scale_dtype = DType::kF8_E4M3;
  spec.global_scale = GlobalScale::kDecodeMultiplier;
  QuantTensor q(spec, 2, 4, 16);  // [gate; up] of I = 2 rows each
  q.global_shards = 2;
  q.global_scales = {1.0f, 2.0f, 4.0f, 8.0f};  // expert 0: gate 1, up 2; expert 1: gate 4, up 8
  for (auto& c : q.codes) c = 2;               // 1.0
  for (auto& s : q.scales) s = 0x38;           // 1.0
  q.check_consistent("w13");
  for (int64_t e = 0; e < 2; ++e) {
    const std::vector<float> w = dequantize_expert(q, e);
    for (int64_t n = 0; n < 4; ++n)
      EXPECT_EQ(w[static_cast<size_t>(n * 16)], q.global_scales[static_cast<size_t>(e * 2 + n / 2)])
          << "expert " << e << " row " << n;
  }
}

TEST(Fp4Canonical, CheckConsistentRefusesGlobalScaleMismatches) {
  QuantSpec spec;
  spec.kind = CodeKind::kFp4E2M1;
  spec.bits = 4;
  spec.group_size = 16;
  spec.scale_dtype = DType::kF8_E4M3;
  spec.global_scale = GlobalScale::kEncodeDivisor;
  const QuantTensor good(spec, 2, 6, 32);
  EXPECT_EQ(good.global_scales.size(), 2u);  // one per expert, zero-filled
  good.check_consistent("ok");
  QuantTensor missing = good;
  missing.global_scales.pop_back();
  test::expect_error([&] { missing.check_consistent("t"); }, ErrorCode::kInternal);
  QuantTensor shards = good;
  shards.global_shards = 4;  // 6 rows do not split into 4 shards
  shards.global_scales.resize(8, 1.0f);
  test::expect_error([&] { shards.check_consistent("t"); }, ErrorCode::kInternal);
  QuantTensor stray = good;
  stray.global_scale = GlobalScale::kNone;  // values without a convention
  test::expect_error([&] { stray.check_consistent("t"); }, ErrorCode::kInternal);
  QuantSpec other = spec;
  other.global_scale = GlobalScale::kDecodeMultiplier;
  EXPECT_NE(other, spec);  // the convention is part of the encoding
}

// ---- the source codecs (formats/fp4.h) ---------------------------------------------------------

Tensor u8(const char* name, Shape shape, std::vector<uint8_t> data, DType d = DType::kU8) {
  Tensor t(name, d, std::move(shape));
  t.data = std::move(data);
  return t;
}
Tensor f32(const char* name, Shape shape, float v) {
  Tensor t(name, DType::kF32, std::move(shape));
  t.data.resize(4);
  std::memcpy(t.data.data(), &v, 4);
  return t;
}

// One NVFP4 Linear [2, 32]: codes k (mod 16) in row 0, 15 - k in row 1; scales 1.0 / 2.0.
TensorMap nvfp4_linear(const char* weight, const char* global, Shape gshape, float g) {
  std::vector<uint8_t> w(2 * 16);
  for (int n = 0; n < 2; ++n)
    for (int j = 0; j < 16; ++j) {
      const int k0 = 2 * j, k1 = 2 * j + 1;
      const int c0 = n == 0 ? k0 % 16 : 15 - k0 % 16, c1 = n == 0 ? k1 % 16 : 15 - k1 % 16;
      w[static_cast<size_t>(n * 16 + j)] = static_cast<uint8_t>(c0 | c1 << 4);
    }
  TensorMap m;
  m.emplace(weight, u8(weight, {2, 16}, w));
  m.emplace("weight_scale", u8("weight_scale", {2, 2}, {0x38, 0x40, 0x38, 0x40}, DType::kF8_E4M3));
  m.emplace(global, f32(global, gshape, g));
  return m;
}

TEST(Fp4Codecs, NibbleOrderAndGlobalConventions) {
  const QuantParams mo = modelopt_nvfp4_param_space().front();
  const QuantTensor a =
      unpack_modelopt_nvfp4(mo, nvfp4_linear("weight", "weight_scale_2", {}, 0.5f), 2, 32);
  for (int k = 0; k < 32; ++k) {  // the even k is the low nibble
    EXPECT_EQ(a.codes[static_cast<size_t>(k)], k % 16) << k;
    EXPECT_EQ(a.codes[static_cast<size_t>(32 + k)], 15 - k % 16) << k;
  }
  EXPECT_EQ(a.global_scale, GlobalScale::kDecodeMultiplier);
  ASSERT_EQ(a.global_scales.size(), 1u);
  EXPECT_EQ(a.global_scales[0], 0.5f);
  // Row 0, k = 23: code 7 (6.0), block 1 scale 2.0, g 0.5 -> 6.
  EXPECT_EQ(dequantize_expert(a, 0)[23], 6.0f);
  const QuantParams ct = ct_nvfp4_param_space().front();
  const QuantTensor b =
      unpack_ct_nvfp4(ct, nvfp4_linear("weight_packed", "weight_global_scale", {1}, 2.0f), 2, 32);
  EXPECT_EQ(b.global_scale, GlobalScale::kEncodeDivisor);
  EXPECT_EQ(b.global_scales[0], 2.0f);           // stored as is, not its reciprocal
  EXPECT_EQ(dequantize_expert(b, 0)[23], 6.0f);  // 6 * (2 / 2)
  // pack writes the bytes back.
  const TensorMap again = pack_ct_nvfp4(ct, b);
  EXPECT_EQ(
      again.at("weight_packed").data,
      nvfp4_linear("weight_packed", "weight_global_scale", {1}, 2.0f).at("weight_packed").data);
  EXPECT_EQ(pack_modelopt_nvfp4(mo, a).at("weight_scale_2").shape, Shape{});
}

TEST(Fp4Codecs, BadInputRefusedNamingTheTensor) {
  const QuantParams mo = modelopt_nvfp4_param_space().front();
  auto refuse = [&](TensorMap m, const char* tensor, ErrorCode code) {
    const Error e = test::expect_error([&] { unpack_modelopt_nvfp4(mo, m, 2, 32); }, code);
    EXPECT_EQ(e.tensor(), tensor) << e.what();
  };
  for (float g : {0.0f, -1.0f, std::nanf(""), INFINITY})
    refuse(nvfp4_linear("weight", "weight_scale_2", {}, g), "weight_scale_2", ErrorCode::kBadValue);
  for (uint8_t nan : {uint8_t{0x7f}, uint8_t{0xff}}) {
    TensorMap m = nvfp4_linear("weight", "weight_scale_2", {}, 1.0f);
    m.at("weight_scale").data[3] = nan;
    refuse(m, "weight_scale", ErrorCode::kBadValue);
  }
  // Negative block scales cannot come from amax / 6 / g: refused; -0 (0x80) is zero, read.
  for (uint8_t neg : {uint8_t{0x81}, uint8_t{0xb8}, uint8_t{0xfe}}) {
    TensorMap m = nvfp4_linear("weight", "weight_scale_2", {}, 1.0f);
    m.at("weight_scale").data[2] = neg;
    refuse(m, "weight_scale", ErrorCode::kBadValue);
  }
  {
    TensorMap m = nvfp4_linear("weight", "weight_scale_2", {}, 1.0f);
    m.at("weight_scale").data[2] = 0x80;
    EXPECT_EQ(dequantize_expert(unpack_modelopt_nvfp4(mo, m, 2, 32), 0)[32], 0.0f);  // row 1, k 0
    m.at("weight_scale").data[3] = 0xff;  // row 1, block 1: the message says where
    const Error e =
        test::expect_error([&] { unpack_modelopt_nvfp4(mo, m, 2, 32); }, ErrorCode::kBadValue);
    EXPECT_NE(e.message().find("0xff (NaN) at row 1, block 1"), std::string::npos) << e.what();
  }
  // compressed-tensors' encode divisor: 1 / g is the decode scale vLLM computes; a subnormal g
  // makes it infinite. ModelOpt's decode multiplier takes the same value (it is finite).
  const QuantParams ctp = ct_nvfp4_param_space().front();
  const Error inv = test::expect_error(
      [&] {
        unpack_ct_nvfp4(ctp, nvfp4_linear("weight_packed", "weight_global_scale", {1}, 1e-39f), 2,
                        32);
      },
      ErrorCode::kBadValue);
  EXPECT_EQ(inv.tensor(), "weight_global_scale");
  EXPECT_NE(inv.message().find("global scale 1.00000022e-39"), std::string::npos) << inv.what();
  EXPECT_EQ(unpack_modelopt_nvfp4(mo, nvfp4_linear("weight", "weight_scale_2", {}, 1e-39f), 2, 32)
                .global_scales[0],
            1e-39f);
  TensorMap shape = nvfp4_linear("weight", "weight_scale_2", {}, 1.0f);
  shape.at("weight_scale").shape = {4, 1};
  refuse(shape, "weight_scale", ErrorCode::kBadShape);
  TensorMap two = nvfp4_linear("weight", "weight_scale_2", {}, 1.0f);
  two.at("weight_scale_2") = f32("weight_scale_2", {2}, 1.0f);
  two.at("weight_scale_2").data.resize(8);
  refuse(two, "weight_scale_2", ErrorCode::kBadShape);
  TensorMap dt = nvfp4_linear("weight", "weight_scale_2", {}, 1.0f);
  dt.at("weight_scale").dtype = DType::kU8;
  refuse(dt, "weight_scale", ErrorCode::kBadDtype);
  // Packed weight disagreeing with the Linear's logical shape.
  test::expect_error(
      [&] { unpack_modelopt_nvfp4(mo, nvfp4_linear("weight", "weight_scale_2", {}, 1.0f), 2, 64); },
      ErrorCode::kBadShape);
  test::expect_error(
      [&] { unpack_modelopt_nvfp4(mo, nvfp4_linear("weight", "weight_scale_2", {}, 1.0f), 2, 24); },
      ErrorCode::kBadShape);
  // MXFP4: E8M0 255 is NaN.
  const QuantParams mx = ct_mxfp4_param_space().front();
  TensorMap m;
  m.emplace("weight_packed", u8("weight_packed", {1, 16}, std::vector<uint8_t>(16, 0x21)));
  m.emplace("weight_scale", u8("weight_scale", {1, 1}, {127}));
  const QuantTensor ok = unpack_ct_mxfp4(mx, m, 1, 32);
  EXPECT_EQ(dequantize_expert(ok, 0)[0], 0.5f);  // low nibble 1
  EXPECT_EQ(dequantize_expert(ok, 0)[1], 1.0f);  // high nibble 2
  m.at("weight_scale").data[0] = 255;
  const Error e = test::expect_error([&] { unpack_ct_mxfp4(mx, m, 1, 32); }, ErrorCode::kBadValue);
  EXPECT_EQ(e.tensor(), "weight_scale");
}

TEST(Fp4Codecs, RoundToNearestEvenE2m1) {
  const std::pair<float, uint8_t> cases[] = {{0.25f, 0}, {0.26f, 1},  {0.75f, 2}, {1.25f, 2},
                                             {1.75f, 4}, {2.5f, 4},   {3.5f, 6},  {5.0f, 6},
                                             {5.01f, 7}, {100.0f, 7}, {-0.0f, 8}, {-3.0f, 13}};
  for (const auto& [x, c] : cases) EXPECT_EQ(float_to_e2m1(x), c) << x;
}

TEST(Fp4Codecs, QuantisersDecodeNearTheInput) {
  test::Rng rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> w(4 * 64);
  float amax = 0.0f;
  for (float& v : w) amax = std::fmax(amax, std::fabs(v = normal(rng)));
  // NVFP4: the block scale is amax / 6 within e4m3's rounding, the widest e2m1 gap is 2 (4..6).
  for (GlobalScale gs : {GlobalScale::kDecodeMultiplier, GlobalScale::kEncodeDivisor}) {
    const QuantTensor q = quantize_nvfp4(w.data(), 4, 64, 2.0f / 2688.0f, gs);
    const std::vector<float> d = dequantize_expert(q, 0);
    for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(d[i], w[i], 0.2f * amax) << i;
  }
  // MXFP4 (OCP): amax / scale in [4, 8), so a block's top values clip at 6 (error < amax / 4).
  const QuantTensor m = quantize_mxfp4(w.data(), 4, 64);
  const std::vector<float> d = dequantize_expert(m, 0);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(d[i], w[i], 0.26f * amax) << i;
}

}  // namespace
}  // namespace moepack
