#include "tools/flags.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <regex>

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

namespace {

// Optimal string alignment distance, case-insensitive.
size_t edit_distance(const std::string& a, const std::string& b) {
  auto lower = [](char c) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  };
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::vector<std::string> split_choices(const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : list + "|") {
    if (c == '|' || c == ',' || c == ' ') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

}  // namespace

std::string closest_to(const std::string& word, const std::vector<std::string>& candidates) {
  const size_t limit = word.size() <= 5 ? 1 : 2;
  std::string best;
  size_t best_d = limit + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d == 0) return "";
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::string choice_suggestion(const std::string& message) {
  static const std::regex unknown(
      R"re(unknown --[A-Za-z0-9-]+ "([^"]*)" \((?:supported: )?([^)]*)\))re");
  static const std::regex not_in(R"re(--[A-Za-z0-9-]+: (\S+) not in \{([^}]*)\})re");
  std::smatch m;
  if (!std::regex_search(message, m, unknown) && !std::regex_search(message, m, not_in)) return "";
  const std::string best = closest_to(m[1].str(), split_choices(m[2].str()));
  return best.empty() ? "" : "did you mean \"" + best + "\"?";
}

}  // namespace moepack::cli
