// float8_e4m3fn, E8M0 and float4_e2m1 scalar codecs (spec/mxfp8_trtllm.md §6, OCP MX v1.0 §5.3).
//
//   e4m3fn: S EEEE MMM, bias 7, subnormal step 2^-9, max 448, no inf, S.1111.111 = NaN
//   e8m0:   one byte c, value 2^(c-127), 255 = NaN
//   e2m1:   S EE M (low nibble), bias 1, values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no inf, no NaN
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/half.h"

namespace moepack {

// Exact decode of an e4m3fn byte (NaN for 0x7f / 0xff).
inline float e4m3_to_float(uint8_t b) {
  const bool neg = b & 0x80;
  const int exp = (b >> 3) & 0xf;
  const int mant = b & 0x7;
  float v;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0)
    v = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant * 2^-9
  else
    v = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  return neg ? -v : v;
}

// Exact decode of an e2m1 code (the low 4 bits of b; the high ones are ignored): magnitude
// m = c & 7 is 0.5 * m for m < 4 (0 and the subnormal 0.5 included) and 2^((m >> 1) - 1) *
// (1 + (m & 1) / 2) above; bit 3 the sign (8 is -0).
inline float e2m1_to_float(uint8_t b) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMagnitude[b & 7];
  return (b & 8) ? -v : v;
}

// 2^(c-127) as float; c = 0 gives 2^-127 (a float32 subnormal), 255 gives NaN.
inline float e8m0_to_float(uint8_t c) {
  if (c == 255) return std::nanf("");
  return std::ldexp(1.0f, static_cast<int>(c) - 127);
}

// float -> e4m3fn, round-to-nearest-even, saturating to +-448 (cvt.rn.satfinite); NaN -> 0x7f.
// -0 and negative values that round to zero keep the sign (0x80). +-inf saturate to +-448.
uint8_t float_to_e4m3_satfinite(float x);

// The E8M0 code c = smallest integer in [0, 254] with 2^(c-127) >= s, for a finite s >= 0
// (FlashInfer's bit rule, spec/mxfp8_trtllm.md §6 step 2): normal s -> exponent field +
// (mantissa != 0); subnormal s -> 1 if s > 2^-127 else 0. s = +inf or NaN gives 254 / 255.
uint8_t e8m0_ceil_code(float s);

// The MXFP8 block scale code for a block whose max |x| is `amax` (float32, finite, >= 0):
// e8m0_ceil_code(amax / 448) with the float32 division correctly rounded (FlashInfer
// mxfp8_quantize_reference, ModelOpt MXFP8QTensor).
uint8_t mxfp8_scale_code_for_amax(float amax);

// Whether an e4m3fn byte is a NaN (S.1111.111: 0x7f, 0xff; e4m3fn has no infinity).
inline bool e4m3_is_nan(uint8_t b) {
  return (b & 0x7f) == 0x7f;
}

// Float8 weights are finite numbers: a NaN code cannot come from a quantiser and would poison
// every output it touches. Throws kBadValue naming `what` (the tensor's suffix) with the row and
// column of the first NaN code of `codes` [n, k].
void check_e4m3_codes(const std::vector<uint8_t>& codes, int64_t k, const std::string& what);

// Block scales are finite and non-negative (docs/validation.md "Values"), the one check of every
// byte-coded scale tensor [n, groups] a source holds; both throw kBadValue naming `what` (the
// tensor's suffix) with the row and block of the first bad code.
// E8M0 codes (MXFP8, MXFP4): 255 is NaN.
void check_e8m0_scale_codes(const std::vector<uint8_t>& codes, int64_t groups,
                            const std::string& what);
// float8_e4m3fn scales (NVFP4): NaN (0x7f / 0xff) and negative values (sign set, not -0).
void check_e4m3_scale_codes(const std::vector<uint8_t>& codes, int64_t groups,
                            const std::string& what);

}  // namespace moepack
