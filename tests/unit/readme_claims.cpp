// README claims that are cheap to check against the repository itself: the first command builds
// only the CLI, the second (run verbatim by .ci/run) builds and runs every test, the LICENSE it
// names exists.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "tests/test_util.h"

namespace moepack {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f) << path;
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// The line after "# (N) " in the README's first code blocks.
std::string command(const std::string& readme, const std::string& n) {
  const size_t at = readme.find("# (" + n + ") ");
  if (at == std::string::npos) return "";
  const size_t line = readme.find('\n', at) + 1;
  return readme.substr(line, readme.find('\n', line) - line);
}

TEST(ReadmeClaims, CommandOneBuildsOnlyTheCli) {
  const std::string readme = read_text(test::source_dir() + "/README.md");
  const std::string one = command(readme, "1");
  ASSERT_FALSE(one.empty());
  EXPECT_NE(one.find("cmake --build build --target moepack &&"), std::string::npos) << one;
  EXPECT_EQ(one.find("ctest"), std::string::npos) << one;
}

TEST(ReadmeClaims, CommandTwoBuildsAndRunsEveryTestAndCiRunsItVerbatim) {
  const std::string readme = read_text(test::source_dir() + "/README.md");
  const std::string two = command(readme, "2");
  ASSERT_FALSE(two.empty());
  EXPECT_NE(two.find("cmake --build build &&"), std::string::npos) << two;
  EXPECT_NE(two.find("ctest --test-dir build"), std::string::npos) << two;
  EXPECT_NE(read_text(test::source_dir() + "/.ci/run").find(two), std::string::npos)
      << ".ci/run does not run README command (2) verbatim: " << two;
}

// The README's synth row names exactly the formats `moepack synth --format` writes.
TEST(ReadmeClaims, SynthRowNamesEveryFormatSynthWrites) {
  const std::string readme = read_text(test::source_dir() + "/README.md");
  const size_t row = readme.find("| `moepack synth OUT");
  ASSERT_NE(row, std::string::npos);
  const std::string line = readme.substr(row, readme.find('\n', row) - row);
  const size_t from = line.find("in the `--format`s ");
  ASSERT_NE(from, std::string::npos) << line;
  const std::string named = line.substr(from + 19, line.find(':', from) - from - 19);
  std::string out, err;
  ASSERT_EQ(test::moepack_cli("synth /nonexistent/x --format none-such", &out, &err), 2) << err;
  const size_t at = err.find("(supported: ");
  ASSERT_NE(at, std::string::npos) << err;
  const std::string supported = err.substr(at + 12, err.find(')', at) - at - 12);
  EXPECT_EQ(named, supported);
}

// "With --json, every error (flag-parse errors included) is also printed on stdout as JSON": one
// failure of each kind (a parse error, a usage error found later, missing input, a bad input).
TEST(ReadmeClaims, JsonErrorsForEveryKindOfFailure) {
  test::TempDir tmp;
  const std::string empty_dir = tmp / "empty";
  ASSERT_EQ(test::run_command("mkdir " + empty_dir), 0);
  const std::vector<std::string> failures = {
      "conver a --json",
      "--json inspect a --no-such-flag",
      "synth " + (tmp / "s") + " --format none-such --json",
      "inspect /nonexistent/x --json",
      "verify " + empty_dir + " --json",
      "convert " + empty_dir + " " + (tmp / "out") + " --json"};
  for (const std::string& args : failures) {
    std::string out, err;
    const int rc = test::moepack_cli(args, &out, &err);
    EXPECT_NE(rc, 0) << args;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(out)) << args << "\n" << out << err;
    EXPECT_EQ(j["ok"], false) << args;
    EXPECT_EQ(j["exit_code"], rc) << args;
    EXPECT_TRUE(j["error"]["message"].is_string()) << args;
  }
}

// "[inspect] refuses what convert would refuse, with the same exit code; a checkpoint no backend
// takes on the target is reported (exit 0, the oracle saying why) where convert exits 4, and
// --require-servable makes that exit 4": act-order GPTQ for vLLM 0.33.
TEST(ReadmeClaims, InspectReportsWhereConvertRefusesAndRequireServableRefuses) {
  test::TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(test::moepack_cli("synth " + src +
                              " --format gptq-actorder --layers 2 --experts 4 --hidden 256 "
                              "--inter 128"),
            0);
  std::string out, err;
  EXPECT_EQ(test::moepack_cli("convert " + src + " " + (tmp / "a"), &out, &err), 4) << err;
  EXPECT_EQ(test::moepack_cli("inspect " + src, &out, &err), 0) << err;
  EXPECT_NE(out.find("no backend"), std::string::npos) << out;
  EXPECT_EQ(test::moepack_cli("inspect " + src + " --require-servable", &out, &err), 4) << err;
  const std::string other = " --vllm-target 2026-05";
  EXPECT_EQ(test::moepack_cli("convert " + src + " " + (tmp / "b") + other, &out, &err), 0) << err;
  EXPECT_EQ(test::moepack_cli("inspect " + src + other, &out, &err), 0) << err;
}

TEST(ReadmeClaims, LicenseExists) {
  const std::string license = read_text(test::source_dir() + "/LICENSE");
  EXPECT_NE(license.find("Apache License"), std::string::npos);
  EXPECT_NE(read_text(test::source_dir() + "/README.md").find("[LICENSE](LICENSE)"),
            std::string::npos);
}

}  // namespace
}  // namespace moepack
