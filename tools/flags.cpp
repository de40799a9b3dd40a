#include "tools/flags.h"

#include <cctype>
#include <cstdlib>

#include "core/error.h"

namespace moepack::cli {

uint64_t parse_size(const std::string& flag, const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kUsage, flag + " \"" + text + "\": " + why);
  };
  // The number: digits with at most one '.', at least one digit.
  size_t i = 0, digits = 0, dots = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9')
      ++digits;
    else if (c == '.')
      ++dots;
    else
      break;
  }
  if (digits == 0 || dots > 1)
    throw bad("expected a size such as 5GB, 500MB, 2GiB or a byte count");
  std::string unit = text.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else if (unit == "TB")
    mult = 1e12;
  else if (unit == "KIB")
    mult = 1024.0;
  else if (unit == "MIB")
    mult = 1024.0 * 1024;
  else if (unit == "GIB")
    mult = 1024.0 * 1024 * 1024;
  else
    throw bad("unknown unit (B, KB, MB, GB, TB, KiB, MiB, GiB)");
  // In double, as always (so "1.5GB" is the byte count it always was), checked before the cast:
  // a cast of 2^64 or more to uint64_t is undefined. 2^64 is exact in a double.
  const double bytes = std::strtod(text.substr(0, i).c_str(), nullptr) * mult;
  if (!(bytes < 18446744073709551616.0)) throw bad("2^64 bytes or more");
  return static_cast<uint64_t>(bytes);
}

DType parse_half_dtype(const std::string& flag, const std::string& text) {
  if (text == "bf16") return DType::kBF16;
  if (text == "fp16") return DType::kF16;
  throw Error(ErrorCode::kUsage, flag + " must be bf16 or fp16, got \"" + text + "\"");
}

}  // namespace moepack::cli
