// The flag parsers every subcommand shares (tools/flags.h): sizes and 16-bit float dtypes, and
// their usage errors naming the flag and the value.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/test_util.h"
#include "tools/flags.h"

namespace moepack::cli {
namespace {
using test::expect_error;

TEST(CliFlags, SizesInDecimalAndBinaryUnits) {
  EXPECT_EQ(parse_size("--max-shard-size", "1048576"), 1048576u);
  EXPECT_EQ(parse_size("--max-shard-size", "0"), 0u);
  EXPECT_EQ(parse_size("--max-shard-size", "7B"), 7u);
  EXPECT_EQ(parse_size("--max-shard-size", "100KB"), 100000u);
  EXPECT_EQ(parse_size("--max-shard-size", "500MB"), 500000000u);
  EXPECT_EQ(parse_size("--max-shard-size", "5GB"), 5000000000u);
  EXPECT_EQ(parse_size("--max-shard-size", "2TB"), 2000000000000u);
  EXPECT_EQ(parse_size("--max-shard-size", "1.5GB"), 1500000000u);
  EXPECT_EQ(parse_size("--chunk-size", "1KiB"), 1024u);
  EXPECT_EQ(parse_size("--chunk-size", "3MiB"), 3u << 20);
  EXPECT_EQ(parse_size("--chunk-size", "1GiB"), 1u << 30);
  EXPECT_EQ(parse_size("--chunk-size", "1gib"), 1u << 30);  // units in any case
  EXPECT_EQ(parse_size("--chunk-size", "0.5kb"), 500u);
  EXPECT_EQ(parse_size("--chunk-size", ".5KB"), 500u);
  EXPECT_EQ(parse_size("--chunk-size", "1.5KiB"), 1536u);
  EXPECT_EQ(parse_size("--chunk-size", "1.0001B"), 1u);  // fractional bytes are dropped
  EXPECT_EQ(parse_size("--chunk-size", "18446744073709549568"), 18446744073709549568u);
}

TEST(CliFlags, BadSizesAreUsageErrorsNamingTheFlag) {
  for (const char* bad :
       {"", ".", "..5", "1.2.3", "-1", "+1", "5XB", "5 GB", "GB", "1e3", "0x10",
        "18446744073709551616", "99999999999999999999999", "20000000TB", "1e400", "5GBs"}) {
    SCOPED_TRACE(bad);
    const Error e = expect_error([&] { parse_size("--max-shard-size", bad); }, ErrorCode::kUsage);
    EXPECT_EQ(e.message().rfind(std::string("--max-shard-size \"") + bad + "\": ", 0), 0u)
        << e.message();
  }
}

TEST(CliFlags, HalfDtypes) {
  EXPECT_EQ(parse_act_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_act_dtype("fp16"), DType::kF16);
  EXPECT_EQ(parse_half_dtype("--dtype", "fp16"), DType::kF16);
  for (const char* bad : {"", "BF16", "F16", "fp32", "float16", "bfloat16", "bf16 "}) {
    SCOPED_TRACE(bad);
    const Error e = expect_error([&] { parse_act_dtype(bad); }, ErrorCode::kUsage);
    EXPECT_EQ(e.message(), std::string("--act-dtype must be bf16 or fp16, got \"") + bad + "\"");
    const Error d = expect_error([&] { parse_half_dtype("--dtype", bad); }, ErrorCode::kUsage);
    EXPECT_EQ(d.message().rfind("--dtype must be bf16 or fp16", 0), 0u) << d.message();
  }
}

// "Did you mean": a typo (one edit, a swapped pair, a case change) finds its word; a word too far
// from every candidate, or one of them, gets no suggestion.
TEST(CliFlags, DidYouMean) {
  const std::vector<std::string> subs = {"inspect", "convert", "merge", "verify", "synth"};
  EXPECT_EQ(closest_to("conver", subs), "convert");
  EXPECT_EQ(closest_to("verfiy", subs), "verify");
  EXPECT_EQ(closest_to("SYNTH", subs), "");  // it is one (case-insensitive)
  EXPECT_EQ(closest_to("serve", subs), "");
  EXPECT_EQ(closest_to("--thread", {"--threads", "--tokens"}), "--threads");
  EXPECT_EQ(closest_to("ab", {"cd"}), "");
  EXPECT_EQ(choice_suggestion("unknown --format \"gtpq\" (supported: bf16, gptq, awq)"),
            "did you mean \"gptq\"?");
  EXPECT_EQ(choice_suggestion("unknown --vllm-target \"2026-5\" (0.33|2026-05)"),
            "did you mean \"2026-05\"?");
  EXPECT_EQ(choice_suggestion("--device: cdua not in {cpu,cuda}"), "did you mean \"cuda\"?");
  EXPECT_EQ(choice_suggestion("unknown --format \"zzzzzz\" (supported: bf16, gptq)"), "");
  EXPECT_EQ(choice_suggestion("a: not a directory"), "");
}

}  // namespace
}  // namespace moepack::cli
