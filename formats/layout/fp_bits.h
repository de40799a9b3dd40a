// Scalar float codecs on bit patterns, MOEPACK_HD so the CUDA runtime decodes and rounds exactly
// as the host codecs do: bf16 / fp16 (core/half.h), float8_e4m3fn and E8M0 (formats/fp8.{h,cpp}).
// Integer arithmetic only, so no floating-point environment, flush-to-zero or contraction can
// change a result; tests/unit/moe_reader.cpp checks each against the host function (every 8- and
// 16-bit code, and float inputs around every rounding boundary).
#pragma once

#include <cstdint>
#include <cstring>

#include "formats/layout/hd.h"

namespace moepack::hd {

MOEPACK_HD float bits_as_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
MOEPACK_HD uint32_t float_as_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

constexpr uint32_t kQuietNanBits = 0x7fc00000u;  // what std::nanf("") gives on our hosts

MOEPACK_HD float bf16_value(uint16_t h) {
  return bits_as_float(static_cast<uint32_t>(h) << 16);
}

// = core/half.h f16_to_float (subnormals mant * 2^-24 are exact in float32).
MOEPACK_HD float f16_value(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_as_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_as_float(sign);
    // mant * 2^-24 as a float: normalise the 10-bit significand.
    int shift = 0;
    uint32_t m = mant;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      ++shift;
    }
    return bits_as_float(sign | ((113u - static_cast<uint32_t>(shift)) << 23) |
                         ((m & 0x3ffu) << 13));
  }
  return bits_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// = core/half.h float_to_bf16: round to nearest even, NaN stays a quiet NaN.
MOEPACK_HD uint16_t bf16_round(float f) {
  uint32_t u = float_as_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// = core/half.h float_to_f16: round to nearest even, overflow to inf, NaN quiet. The subnormal
// range rounds the integer significand instead of the host's float trick (same results).
MOEPACK_HD uint16_t f16_round(float f) {
  const uint32_t u = float_as_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (absu < 0x38800000u) {
    // |f| * 2^24 rounded: |f| = sig * 2^(e - 150) (e >= 1; sig * 2^-149 for e = 0).
    const uint32_t e = absu >> 23;
    const uint32_t sig = e ? ((absu & 0x7fffffu) | 0x800000u) : absu;
    const uint32_t shift = 126u - (e ? e : 1u);  // >= 14
    if (shift >= 32) return sign;
    const uint32_t q = sig >> shift, rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
    const uint32_t code = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | code);
  }
  const uint32_t exp = (absu >> 23) - 112u, mant = absu & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// = formats/fp8.h e4m3_to_float: S EEEE MMM, bias 7, 0x7f / 0xff NaN.
MOEPACK_HD float e4m3_value(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  if (exp == 0xf && mant == 0x7) return bits_as_float(kQuietNanBits);
  if (exp == 0) {
    if (mant == 0) return bits_as_float(sign);
    // mant * 2^-9, mant in 1..7: exact.
    const uint32_t lead = mant >= 4 ? 2u : (mant >= 2 ? 1u : 0u);
    const uint32_t frac = (mant << (23 - lead)) & 0x7fffffu;
    return bits_as_float(sign | ((118u + lead) << 23) | frac);
  }
  return bits_as_float(sign | ((exp + 120u) << 23) | (mant << 20));
}

// float4_e2m1fn nibble S EE M (bias 1): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; only the
// low 4 bits of b are read.
MOEPACK_HD float e2m1_value(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x8u) << 28;
  const uint32_t exp = (b >> 1) & 0x3u, mant = b & 0x1u;
  if (exp == 0) return bits_as_float(sign | (mant ? 0x3f000000u : 0u));  // 0 or 0.5
  return bits_as_float(sign | ((exp + 126u) << 23) | (mant << 22));
}

// Nearest e2m1 nibble of x, ties to the even code, saturating at +-6 (PTX
// cvt.rn.satfinite.e2m1x2.f32, = formats/fp4.h float_to_e2m1 for finite x); the sign is kept.
MOEPACK_HD uint8_t e2m1_round_satfinite(float x) {
  const uint8_t sign = static_cast<uint8_t>((float_as_bits(x) >> 28) & 0x8u);
  const float a = bits_as_float(float_as_bits(x) & 0x7fffffffu);
  uint8_t m = 7;
  if (a <= 0.25f)
    m = 0;
  else if (a < 0.75f)
    m = 1;
  else if (a <= 1.25f)
    m = 2;
  else if (a < 1.75f)
    m = 3;
  else if (a <= 2.5f)
    m = 4;
  else if (a < 3.5f)
    m = 5;
  else if (a <= 5.0f)
    m = 6;
  return static_cast<uint8_t>(sign | m);
}

// = formats/fp8.h e8m0_to_float: 2^(c-127), c = 0 the float32 subnormal 2^-127, 255 NaN.
MOEPACK_HD float e8m0_value(uint8_t c) {
  if (c == 255) return bits_as_float(kQuietNanBits);
  if (c == 0) return bits_as_float(0x00400000u);
  return bits_as_float(static_cast<uint32_t>(c) << 23);
}

// = formats/fp8.cpp float_to_e4m3_satfinite (PTX cvt.rn.satfinite.e4m3x2.f32).
MOEPACK_HD uint8_t e4m3_round_satfinite(float x) {
  const uint32_t u = float_as_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return 0x7f;
  if (absu < (121u << 23)) {
    const uint32_t exp = absu >> 23;
    const uint32_t sig = exp ? ((absu & 0x7fffffu) | 0x800000u) : absu;
    const uint32_t shift = exp ? 141u - exp : 140u;
    if (shift >= 32) return sign;
    const uint32_t q = sig >> shift, rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
    const uint32_t code = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint8_t>(sign | code);
  }
  const uint32_t exp = (absu >> 23) - 120u;
  if (exp > 15) return static_cast<uint8_t>(sign | 0x7e);
  const uint32_t mant = absu & 0x7fffffu;
  uint32_t code = (exp << 3) | (mant >> 20);
  const uint32_t rem = mant & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) ++code;
  if (code > 0x7e) code = 0x7e;
  return static_cast<uint8_t>(sign | code);
}

// = formats/fp8.cpp e8m0_ceil_code: the smallest c in [0, 254] with 2^(c-127) >= s.
MOEPACK_HD uint8_t e8m0_ceil(float s) {
  const uint32_t u = float_as_bits(s);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 255;
  if (u & 0x80000000u) return 0;
  const uint32_t exp = u >> 23, mant = u & 0x7fffffu;
  if (exp == 0) return mant > 0x400000u ? 1 : 0;
  const uint32_t c = exp + (mant != 0 ? 1u : 0u);
  return static_cast<uint8_t>(c > 254 ? 254 : c);
}

MOEPACK_HD bool is_finite_bits(float f) {
  return (float_as_bits(f) & 0x7f800000u) != 0x7f800000u;
}

}  // namespace moepack::hd
