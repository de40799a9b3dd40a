// Python `re` patterns from configs, matched by RE2 (model/python_regex.h).
#include "model/python_regex.h"

#include <re2/re2.h>

#include <cctype>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "core/error.h"

namespace moepack {
namespace {

bool printable_ascii(unsigned char c) {
  return c >= 0x20 && c < 0x7f;
}

std::string at(size_t i) {
  return " at offset " + std::to_string(i);
}

// After a quantifier (and its lazy '?'): another quantifier is Python's "multiple repeat" or a
// possessive form (Python 3.11), neither of which RE2 reads the same way.
std::string check_after_quantifier(const std::string& p, size_t* i) {
  if (*i + 1 < p.size() && p[*i + 1] == '?') ++*i;  // lazy
  if (*i + 1 < p.size() && std::strchr("*+?{", p[*i + 1]))
    return "a repeated or possessive quantifier" + at(*i + 1);
  return "";
}

// A '{' at p[i]: only {m}, {m,} and {m,n} with decimal m, n (Python reads "{,n}" as {0,n} and any
// other '{' as a literal, RE2 differently); on success *i is at the '}'.
std::string check_repeat(const std::string& p, size_t* i) {
  size_t j = *i + 1;
  const size_t m = j;
  while (j < p.size() && p[j] >= '0' && p[j] <= '9') ++j;
  bool ok = j > m;
  if (ok && j < p.size() && p[j] == ',') {
    ++j;
    while (j < p.size() && p[j] >= '0' && p[j] <= '9') ++j;
  }
  ok = ok && j < p.size() && p[j] == '}';
  if (!ok) return "a '{' that is not a repeat {m}, {m,} or {m,n}" + at(*i) + " (escape it: \\{)";
  *i = j;
  return check_after_quantifier(p, i);
}

// A character set starting at p[i] == '['; on success *i is at its closing ']'.
std::string check_set(const std::string& p, size_t* i) {
  size_t j = *i + 1;
  if (j < p.size() && p[j] == '^') ++j;
  const size_t first = j;  // a ']' here is a literal
  for (; j < p.size(); ++j) {
    const char c = p[j];
    if (c == ']' && j > first) {
      *i = j;
      return "";
    }
    if (c == '\\') {
      if (j + 1 >= p.size()) break;
      const char n = p[++j];
      if (std::isalnum(static_cast<unsigned char>(n)) && !std::strchr("dDwWsS", n))
        return std::string("the escape \\") + n + at(j - 1);
      continue;
    }
    if (c == '[') return "a '[' inside a character set" + at(j) + " (escape it: \\[)";
    if (j + 1 < p.size() && std::strchr("-&~|", c) && p[j + 1] == c)
      return std::string("the set operation ") + c + c + at(j);
  }
  return "an unterminated character set" + at(*i);
}

// The subset's syntax (model/python_regex.h); "" when `p` is inside it.
std::string syntax_problem(const std::string& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    if (!printable_ascii(c)) return "a character that is not printable ASCII" + at(i);
    std::string problem;
    switch (c) {
      case '\\': {
        if (i + 1 >= p.size()) return "a trailing backslash";
        const char n = p[++i];
        if (std::isalnum(static_cast<unsigned char>(n)) && !std::strchr("dDwWsS", n))
          return std::string("the escape \\") + n + at(i - 1);
        break;
      }
      case '[':
        problem = check_set(p, &i);
        break;
      case '(':
        if (i + 1 < p.size() && p[i + 1] == '?') {
          if (i + 2 < p.size() && p[i + 2] == ':') {
            i += 2;
            break;
          }
          return "the group syntax " + p.substr(i, 3) + at(i) + " (only (...) and (?:...))";
        }
        break;
      case '{':
        problem = check_repeat(p, &i);
        break;
      case '*':
      case '+':
      case '?':
        problem = check_after_quantifier(p, &i);
        break;
      default:
        break;
    }
    if (!problem.empty()) return problem;
  }
  return "";
}

struct Compiled {
  std::shared_ptr<const re2::RE2> re;  // null when outside the subset
  std::string problem;
};

const Compiled& compiled(const std::string& pattern) {
  static std::mutex mu;
  static std::map<std::string, Compiled> cache;  // std::map nodes never move
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(pattern);
  if (it != cache.end()) return it->second;
  Compiled c;
  c.problem = syntax_problem(pattern);
  if (c.problem.empty()) {
    re2::RE2::Options o;
    o.set_log_errors(false);
    o.set_encoding(re2::RE2::Options::EncodingLatin1);  // printable ASCII only, both sides
    auto re = std::make_shared<const re2::RE2>(pattern, o);
    if (re->ok())
      c.re = std::move(re);
    else
      c.problem = re->error();
  }
  return cache.emplace(pattern, std::move(c)).first->second;
}

bool run(const std::string& pattern, const std::string& name, const std::string& file,
         const std::string& key, re2::RE2::Anchor anchor) {
  const Compiled& c = compiled(pattern);
  if (!c.re)
    throw Error(ErrorCode::kBadConfig, file, "",
                key + ": regex \"" + pattern + "\" is outside the Python subset moepack matches (" +
                    c.problem +
                    "; it reads literals, escaped punctuation, . ^ $, \\d \\w \\s and their "
                    "negations, [...] sets, (...) and (?:...) groups, | and the quantifiers * + ? "
                    "{m,n} with their lazy forms)");
  for (unsigned char ch : name)
    if (!printable_ascii(ch))
      throw Error(ErrorCode::kBadConfig, file, name,
                  key +
                      ": the module name is not printable ASCII, where Python's re and RE2 "
                      "could match regex \"" +
                      pattern + "\" differently");
  return c.re->Match(name, 0, name.size(), anchor, nullptr, 0);
}

}  // namespace

std::string python_regex_problem(const std::string& pattern) {
  return compiled(pattern).problem;
}

bool python_re_match(const std::string& pattern, const std::string& name, const std::string& file,
                     const std::string& key) {
  return run(pattern, name, file, key, re2::RE2::ANCHOR_START);
}

bool python_re_search(const std::string& pattern, const std::string& name, const std::string& file,
                      const std::string& key) {
  return run(pattern, name, file, key, re2::RE2::UNANCHORED);
}

}  // namespace moepack
