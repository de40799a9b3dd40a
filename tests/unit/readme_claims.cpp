// README claims that are cheap to check against the repository itself: the first command builds
// only the CLI, the second (run verbatim by .ci/run) builds and runs every test, the LICENSE it
// names exists.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

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

TEST(ReadmeClaims, LicenseExists) {
  const std::string license = read_text(test::source_dir() + "/LICENSE");
  EXPECT_NE(license.find("Apache License"), std::string::npos);
  EXPECT_NE(read_text(test::source_dir() + "/README.md").find("[LICENSE](LICENSE)"),
            std::string::npos);
}

}  // namespace
}  // namespace moepack
