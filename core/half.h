// IEEE half and bfloat16 bit conversions (scalar, exact, round-to-nearest-even).
#pragma once

#include <cstdint>
#include <cstring>

namespace moepack {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) {
  return bits_to_float(static_cast<uint32_t>(h) << 16);
}

// float -> bf16 with round-to-nearest-even; NaN stays a quiet NaN (as torch does).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// float -> fp16 with round-to-nearest-even, overflow to inf, NaN preserved as quiet NaN.
inline uint16_t float_to_f16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65536
  if (absu < 0x38800000u) {  // below the smallest normal 2^-14: subnormal or zero
    // value / 2^-24, rounded to nearest even, in [0, 1024]
    const float a = bits_to_float(absu) * 16777216.0f;  // exact: scaling by a power of two
    // nearbyint with ties-to-even under the default rounding mode
    float r = a + 8388608.0f;  // 2^23: forces rounding to an integer in float arithmetic
    r -= 8388608.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  uint32_t exp = (absu >> 23) - 112u;
  uint32_t mant = absu & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may roll into the exponent
  return static_cast<uint16_t>(sign | h);
}

// fp16 -> bf16 as torch's copy_ does: through float32, then round-to-nearest-even.
inline uint16_t f16_to_bf16(uint16_t h) {
  return float_to_bf16(f16_to_float(h));
}

}  // namespace moepack
