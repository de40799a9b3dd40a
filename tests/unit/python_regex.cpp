// Regexes read from checkpoint configs (model/python_regex.h): matched by RE2 exactly as Python's
// re.match / re.search match them, inside the subset GPTQModel writes; anything outside it is
// exit 3 naming the key; a catastrophic pattern takes milliseconds.
#include "model/python_regex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/hf_config.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
using nlohmann::json;

const std::vector<std::string> kNames = {
    "model.layers.18.mlp.experts.3.gate_proj", "model.layers.1.mlp.experts.0.down_proj",
    "model.layers.31.mlp.experts.7.up_proj", "model.layers.32.mlp.experts.2.gate_proj",
    "mlp.experts.2.up_proj"};

// Expected values: Python 3.11's bool(re.match(pattern, name)) for each of kNames, computed with
// CPython (not with moepack), pasted here. The patterns are of the kinds GPTQModel's docs and
// producers write for "dynamic" (module paths, layer ranges by alternation, \d+, lazy .*?).
struct Case {
  const char* pattern;
  std::vector<bool> python;
};
const std::vector<Case> kCases = {
    {R"(.*\.18\..*gate.*)", {true, false, false, false, false}},
    {R"(.*\.layers\.(?:[3-9]|[12]\d|30|31)\..*)", {true, false, true, false, false}},
    {R"(model\.layers\.\d+\.mlp\.experts\.\d+\..*)", {true, true, true, true, false}},
    {R"(.*down_proj)", {false, true, false, false, false}},
    {R"(experts\.\d+)", {false, false, false, false, false}},
    {R"(.*mlp\.experts\.[0-3]\.(gate|up)_proj$)", {true, false, false, true, true}},
    {R"(model.layers.1)", {true, true, false, false, false}},
    {R"([^.]+\.layers\.\d{1,2}\.)", {true, true, true, true, false}},
    {R"(.*?experts)", {true, true, true, true, true}},
    {R"()", {true, true, true, true, true}},
    {R"(lm_head|.*experts\.7\.)", {false, false, true, false, false}},
    {R"(\w+\.\W?layers)", {true, true, true, true, false}},
    {R"([\]a-c]+)", {false, false, false, false, false}},
    {R"(.*\.\s*x)", {false, false, false, false, false}},
};

TEST(PythonRegex, MatchesAsPythonReMatch) {
  for (const Case& c : kCases)
    for (size_t i = 0; i < kNames.size(); ++i) {
      EXPECT_EQ(python_re_match(c.pattern, kNames[i], "config.json", "key"), c.python[i])
          << c.pattern << " on " << kNames[i];
      EXPECT_EQ(python_regex_problem(c.pattern), "") << c.pattern;
    }
  // re.search: anywhere in the name (Python: True; re.match of the same pattern: False).
  EXPECT_TRUE(python_re_search(R"(experts\.\d+\.down)", kNames[1], "config.json", "key"));
  EXPECT_FALSE(python_re_match(R"(experts\.\d+\.down)", kNames[1], "config.json", "key"));
}

// Outside the subset: refused (kBadConfig, exit 3) naming the file and the key, never matched.
TEST(PythonRegex, OutsideTheSubsetIsRefusedNamingTheKey) {
  for (const char* p : {R"((?=x).*)",   R"((a)\1)",     R"((?i)experts)", R"((?P<x>.*)experts)",
                        R"((?<=a)b)",   R"(a*+)",       R"(a**)",         R"(a{2}{3})",
                        R"(a{,3})",     R"(a{x})",      R"(a{1,2)",       R"(\bexperts)",
                        R"(experts\Z)", R"(\Aexperts)", R"(a\nb)",        R"([[:alpha:]]+)",
                        R"([a--b])",    R"([abc)",      R"((abc)",        "caf\xc3\xa9",
                        "a\tb",         R"(\)",         R"(a{1001})",     R"((?#comment)a)",
                        R"((?>a))"}) {
    SCOPED_TRACE(p);
    EXPECT_NE(python_regex_problem(p), "");
    const Error e = test::expect_error(
        [&] {
          python_re_match(p, kNames[0], "q/config.json", "quantization_config.dynamic \"k\"");
        },
        ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), "q/config.json");
    EXPECT_NE(e.message().find("quantization_config.dynamic \"k\""), std::string::npos)
        << e.message();
    EXPECT_EQ(exit_code_for(e.code()), ExitCode::kInvalidInput);
  }
  // A name that is not printable ASCII could match differently: refused too.
  test::expect_error([&] { python_re_match(R"(.*\d)", "model.layers.\xd9\xa1", "c.json", "k"); },
                     ErrorCode::kBadConfig);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// (a+)+$ on 30 a's and a b takes a backtracking engine (Python's re, std::regex) 2^30 steps; RE2
// is linear in the name. Bounded at 200 ms on a loaded 2-core machine: milliseconds normally.
TEST(PythonRegex, CatastrophicPatternFinishesInMilliseconds) {
  const std::string name = std::string(30, 'a') + "b";
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(python_re_match("(a+)+$", name, "config.json", "key"));
  EXPECT_FALSE(python_re_search("(a+)+$", name + "!", "config.json", "key"));
  EXPECT_LT(ms_since(t0), 200.0);
  // Linear: a name 10^5 characters long, still well under a second.
  t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(python_re_match("(a|aa)+$", std::string(100000, 'a') + "b", "config.json", "key"));
  EXPECT_LT(ms_since(t0), 1000.0);

  // The same through a GPTQModel config: quant_for_module on such a name.
  HfConfig c;
  c.quant_file = "config.json";
  c.quant_raw = {
      {"quant_method", "gptq"},
      {"bits", 4},
      {"group_size", 128},
      {"sym", true},
      {"desc_act", false},
      {"dynamic", {{"+:(a+)+$", {{"group_size", 32}}}, {"-:((a*)*)*c", json::object()}}}};
  c.quant = normalize_quant_config(c.quant_raw, c.quant_file, DType::kBF16);
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(quant_for_module(c, name).group_size, 128);
  EXPECT_LT(ms_since(t0), 200.0);
  EXPECT_EQ(quant_for_module(c, std::string(30, 'a')).group_size, 32);
}

// A GPTQModel dynamic key outside the subset: exit 3 naming the key (with its +: / -: prefix).
TEST(PythonRegex, DynamicKeyOutsideTheSubsetIsExit3NamingIt) {
  HfConfig c;
  c.quant_file = "src/config.json";
  c.quant_raw = {{"quant_method", "gptq"}, {"bits", 4},
                 {"group_size", 128},      {"sym", true},
                 {"desc_act", false},      {"dynamic", {{"-:(?!x).*", json::object()}}}};
  c.quant = normalize_quant_config(c.quant_raw, c.quant_file, DType::kBF16);
  const Error e =
      test::expect_error([&] { quant_for_module(c, kNames[0]); }, ErrorCode::kBadConfig);
  EXPECT_EQ(e.file(), "src/config.json");
  EXPECT_NE(e.message().find("quantization_config.dynamic \"-:(?!x).*\""), std::string::npos)
      << e.message();
}

}  // namespace
}  // namespace moepack
