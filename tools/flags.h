// Flag values more than one subcommand takes, each parsed in one place: a bad value is
// Error{kUsage} naming the flag and the value (exit 2, and main()'s --json error object).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moepack::cli {

// A byte count: "5GB", "500MB", "2GiB", "100KB", "1.5GB", "1048576" (bytes). Decimal units
// (KB, MB, GB, TB) and binary ones (KiB, MiB, GiB), case-insensitive; the fractional bytes of
// "1.5KiB"-like values are dropped. Throws kUsage naming `flag` for anything else, and for a
// count of 2^64 bytes or more.
uint64_t parse_size(const std::string& flag, const std::string& text);

// A 16-bit float dtype as the flags spell it: "bf16" -> kBF16, "fp16" -> kF16. Throws kUsage
// naming `flag` for anything else.
DType parse_half_dtype(const std::string& flag, const std::string& text);

// --act-dtype (convert, inspect): the serving activation dtype, bf16|fp16.
inline DType parse_act_dtype(const std::string& text) {
  return parse_half_dtype("--act-dtype", text);
}

// "Did you mean": the candidate closest to `word` (case-insensitive edit distance, a swap of two
// neighbours counting as one edit), when it is close enough to be a typo of it: at most 1 edit
// for words of up to 5 characters, 2 for longer ones. "" when none is, or when `word` is one.
std::string closest_to(const std::string& word, const std::vector<std::string>& candidates);

// The suggestion for a usage message that rejects a choice, in the forms moepack's and CLI11's
// messages take: `unknown --flag "value" (a|b|c)` or `(supported: a, b, c)`, and
// `--flag: value not in {a,b,c}`. Returns `did you mean "b"?` or "".
std::string choice_suggestion(const std::string& message);

}  // namespace moepack::cli
