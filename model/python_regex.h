// Python `re` patterns read from a checkpoint's config -- GPTQModel's "dynamic" keys ("+:" / "-:"
// prefixes), compressed-tensors' "re:" targets and ignore entries, auto-round's "extra_config"
// keys -- matched by RE2, whose time is linear in the name's length whatever the pattern: a
// catastrophic pattern such as (a+)+$ cannot stall a conversion (Python's backtracking re, and
// std::regex, take exponential time on it).
//
// Only the subset of Python's syntax on which RE2 and Python's re agree is accepted, and matched
// against printable-ASCII names only, so a name matches here exactly when it matches in the
// producer and in vLLM:
//   literals (printable ASCII), escaped punctuation (\. \- \\ ...), . ^ $, the classes \d \D \w
//   \W \s \S, character sets [...] / [^...] (ranges, those classes and escapes inside, no nested
//   '[' or set operations), groups (...) and (?:...), alternation |, the quantifiers * + ? {m}
//   {m,} {m,n} and their lazy forms (*? ...).
// Anything else -- back-references, lookaround, inline flags, named groups, possessive or
// repeated quantifiers, {,n}, a '{' that is no repeat, escapes such as \b \A \Z \n, non-ASCII --
// is refused with kBadConfig (exit 3) naming the file and the key, never matched differently.
#pragma once

#include <string>

namespace moepack {

// "" when `pattern` is inside the subset (and RE2 compiles it), else why not, in a few words.
std::string python_regex_problem(const std::string& pattern);

// Python's re.match(pattern, name): a match starting at the first character (not necessarily
// ending at the last), as GPTQModel's dynamic_get, vLLM's get_dynamic_override and
// compressed-tensors match module names. Throws kBadConfig naming `file` and `key` (the config
// field holding the pattern) for a pattern outside the subset, or a name that is not printable
// ASCII. Compiled patterns are cached (thread-safe): a checkpoint asks once per expert Linear.
bool python_re_match(const std::string& pattern, const std::string& name, const std::string& file,
                     const std::string& key);
// Python's re.search(pattern, name): a match anywhere (auto-round's extra_config in vLLM).
bool python_re_search(const std::string& pattern, const std::string& name, const std::string& file,
                      const std::string& key);

}  // namespace moepack
