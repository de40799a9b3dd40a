// Size arithmetic on extents that come from untrusted files: an overflow (or a negative extent)
// is an Error, never undefined behaviour or a wrapped size.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace moepack {

// a * b, or kValidationOverflow naming `what` when the product leaves int64.
inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what = "") {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw Error(ErrorCode::kValidationOverflow, "", what,
                std::to_string(a) + " * " + std::to_string(b) + " overflows 64 bits");
  return r;
}

// a + b, or kValidationOverflow naming `what`.
inline int64_t checked_add(int64_t a, int64_t b, const std::string& what = "") {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    throw Error(ErrorCode::kValidationOverflow, "", what,
                std::to_string(a) + " + " + std::to_string(b) + " overflows 64 bits");
  return r;
}

// ceil(a / b) for a >= 0, b > 0, without forming a + b - 1.
inline int64_t ceil_div_checked(int64_t a, int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

}  // namespace moepack
