// float8_e4m3fn / E8M0 scalar encoders (spec/mxfp8_trtllm.md §6). The decoders are inline in
// fp8.h. Everything here works on the float32 bit pattern so the rounding is exactly the PTX
// `cvt.rn.satfinite.e4m3x2.f32` rule, independent of the host's floating-point environment.
#include "formats/fp8.h"

#include <cstdint>

#include "core/error.h"
#include "core/half.h"

namespace moepack {

uint8_t float_to_e4m3_satfinite(float x) {
  const uint32_t u = float_to_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return 0x7f;  // NaN (either sign) -> the canonical positive NaN code
  // e4m3 normals start at 2^-6 (float exponent field 121); below that the e4m3 grid is uniform
  // with step 2^-9, i.e. code = round(|x| * 2^9) with the subnormal codes 0..7 and 8 = 2^-6.
  if (absu < (121u << 23)) {
    // |x| * 2^9 < 8 fits in 23 mantissa bits: work on the integer significand so that float
    // subnormal inputs are handled too. value = sig * 2^(exp - 150) (exp >= 1), sig * 2^-149 else.
    const uint32_t exp = absu >> 23;
    const uint32_t sig = exp ? ((absu & 0x7fffffu) | 0x800000u) : absu;
    const int shift = exp ? static_cast<int>(150 - 9 - exp) : 149 - 9;  // |x| * 2^9 = sig >> shift
    if (shift >= 32) return sign;                                       // far below half of 2^-9
    const uint32_t q = sig >> shift;
    const uint32_t rem = sig & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    uint32_t code = q;
    if (rem > half || (rem == half && (q & 1u))) ++code;  // code 8 is exactly 2^-6: still right
    return static_cast<uint8_t>(sign | code);
  }
  // Normal range: keep 3 mantissa bits, round the 20 dropped bits to nearest even. The carry
  // out of the mantissa rolls into the exponent, which is what the e4m3 encoding needs.
  const uint32_t exp = (absu >> 23) - 127u + 7u;           // e4m3 biased exponent, >= 1
  if (exp > 15) return static_cast<uint8_t>(sign | 0x7e);  // >= 512 (or inf): saturate
  const uint32_t mant = absu & 0x7fffffu;
  uint32_t code = (exp << 3) | (mant >> 20);
  const uint32_t rem = mant & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) ++code;
  if (code > 0x7e) code = 0x7e;  // 0x7f would be NaN: satfinite clamps to 448
  return static_cast<uint8_t>(sign | code);
}

uint8_t e8m0_ceil_code(float s) {
  const uint32_t u = float_to_bits(s);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 255;
  if (u & 0x80000000u) return 0;  // negative (or -0): 2^-127 >= s already
  const uint32_t exp = u >> 23;
  const uint32_t mant = u & 0x7fffffu;
  if (exp == 0) return mant > 0x400000u ? 1 : 0;  // subnormal: 2^-127 is mantissa 2^22
  const uint32_t c = exp + (mant != 0 ? 1u : 0u);
  return static_cast<uint8_t>(c > 254 ? 254 : c);
}

uint8_t mxfp8_scale_code_for_amax(float amax) {
  return e8m0_ceil_code(amax / 448.0f);
}

void check_e4m3_codes(const std::vector<uint8_t>& codes, int64_t k, const std::string& what) {
  for (size_t i = 0; i < codes.size(); ++i)
    if (e4m3_is_nan(codes[i]))
      throw Error(ErrorCode::kBadValue, "", what,
                  std::string("float8_e4m3fn code ") + (codes[i] == 0x7f ? "0x7f" : "0xff") +
                      " (NaN) at row " + std::to_string(static_cast<int64_t>(i) / k) + ", column " +
                      std::to_string(static_cast<int64_t>(i) % k) +
                      ": a quantised weight is a finite number");
}

void check_e8m0_scale_codes(const std::vector<uint8_t>& codes, int64_t groups,
                            const std::string& what) {
  for (size_t i = 0; i < codes.size(); ++i)
    if (codes[i] == 255)
      throw Error(ErrorCode::kBadValue, "", what,
                  "E8M0 code 255 (NaN) at row " + std::to_string(static_cast<int64_t>(i) / groups) +
                      ", block " + std::to_string(static_cast<int64_t>(i) % groups));
}

void check_e4m3_scale_codes(const std::vector<uint8_t>& codes, int64_t groups,
                            const std::string& what) {
  static const char* kHex = "0123456789abcdef";
  for (size_t i = 0; i < codes.size(); ++i) {
    const uint8_t c = codes[i];
    const bool nan = e4m3_is_nan(c), negative = (c & 0x80) && c != 0x80;
    if (!nan && !negative) continue;
    throw Error(ErrorCode::kBadValue, "", what,
                std::string("float8_e4m3fn scale code 0x") + kHex[c >> 4] + kHex[c & 15] +
                    (nan ? " (NaN)" : " (negative)") + " at row " +
                    std::to_string(static_cast<int64_t>(i) / groups) + ", block " +
                    std::to_string(static_cast<int64_t>(i) % groups) +
                    ": block scales are finite and non-negative");
  }
}

}  // namespace moepack
