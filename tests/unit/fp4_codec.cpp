// The canonical form's FP4 codes and two-level scales (formats/codec.h CodeKind::kFp4E2M1,
// GlobalScale): the e2m1 decoder against the OCP MX table, dequantize_expert's definition of a
// value under each global-scale convention (worked by hand), global shards of a stacked w13, and
// check_consistent's refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "formats/codec.h"
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

}  // namespace
}  // namespace moepack
