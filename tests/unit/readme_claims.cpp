// README and docs claims that are cheap to check against the repository itself: the first
// command builds only the CLI, the second (run verbatim by .ci/run) builds and runs every test, the
// LICENSE it names exists, the command table's flags are the commands' flags, every file and test
// the docs name exists, and each layout doc's "layout version" is its row's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "formats/codec.h"
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

// README.md and every docs/*.md, as (path relative to the source root, text).
std::vector<std::pair<std::string, std::string>> readme_and_docs() {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> docs = {
      {"README.md", read_text(test::source_dir() + "/README.md")}};
  for (const auto& e : fs::directory_iterator(test::source_dir() + "/docs"))
    if (e.path().extension() == ".md")
      docs.push_back({"docs/" + e.path().filename().string(), read_text(e.path().string())});
  return docs;
}

// Every flag the README's command table shows for `moepack CMD` is one of CMD's (its --help).
TEST(ReadmeClaims, CommandTableFlagsAreTheCommandsFlags) {
  const std::string readme = read_text(test::source_dir() + "/README.md");
  const std::regex row(R"(\n\| `moepack (\w+) ([^|]|\\\|)*?` \|)"), flag(R"(--[a-z][a-z0-9-]*)");
  int rows = 0;
  for (std::sregex_iterator r(readme.begin(), readme.end(), row), end; r != end; ++r, ++rows) {
    const std::string cmd = (*r)[1], cell = r->str();
    std::string help, err;
    ASSERT_EQ(test::moepack_cli(cmd + " --help", &help, &err), 0) << cmd << err;
    for (std::sregex_iterator f(cell.begin(), cell.end(), flag); f != end; ++f)
      EXPECT_NE(help.find(f->str()), std::string::npos)
          << "README's `moepack " << cmd << "` row shows " << f->str() << ", not in its --help";
  }
  EXPECT_GE(rows, 5) << "the command table was not found";
}

// Every relative link and every `path` under a top-level folder of the repository that README.md
// or docs/*.md names exists (templates with <...>, globs and variables aside).
TEST(ReadmeClaims, DocsNameFilesThatExist) {
  namespace fs = std::filesystem;
  const std::regex link(R"(\]\(([^)\s#]+)(#[^)\s]*)?\))"), code(R"(`([^`\s]+)`)");
  const std::vector<std::string> tops = {
      "core/",  "io/",    "formats/", "model/", "pipeline/", "verify/",       "synth/", "kernels/",
      "tools/", "tests/", "samples/", "bench/", "docs/",     "integrations/", ".ci/"};
  for (const auto& [doc, text] : readme_and_docs()) {
    const fs::path base = fs::path(test::source_dir()) / fs::path(doc).parent_path();
    for (std::sregex_iterator m(text.begin(), text.end(), link), end; m != end; ++m) {
      const std::string target = (*m)[1];
      if (target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0) continue;
      EXPECT_TRUE(fs::exists(base / target)) << doc << " links to " << target;
    }
    for (std::sregex_iterator m(text.begin(), text.end(), code), end; m != end; ++m) {
      std::string path = (*m)[1];
      bool under_top = false;
      for (const auto& t : tops) under_top |= path.rfind(t, 0) == 0;
      if (!under_top || path.find_first_of("<*{$[|") != std::string::npos ||
          path.find("NAME") != std::string::npos || path.find("\u2026") != std::string::npos)
        continue;
      path = path.substr(0, path.find_first_of(":#("));  // file:line, test ids, anchors, calls
      while (!path.empty() && (path.back() == '.' || path.back() == ',')) path.pop_back();
      EXPECT_TRUE(fs::exists(fs::path(test::source_dir()) / path)) << doc << " names " << path;
    }
  }
}

// Every GoogleTest test README.md and docs/*.md name as `Suite.Name` (or `Suite.Prefix*`), for a
// suite of ours, exists; likewise each pytest `tests/....py::test_name`.
TEST(ReadmeClaims, DocsNameTestsThatExist) {
  namespace fs = std::filesystem;
  std::string sources;
  std::map<std::string, std::string> python;
  for (const auto& e : fs::recursive_directory_iterator(test::source_dir() + "/tests")) {
    const std::string ext = e.path().extension().string();
    if (ext == ".cpp" || ext == ".cu") sources += read_text(e.path().string());
    if (ext == ".py")
      python[fs::relative(e.path(), test::source_dir()).string()] = read_text(e.path().string());
  }
  std::set<std::pair<std::string, std::string>> tests;
  std::set<std::string> suites;
  const std::regex test_decl(R"(TEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\))");
  for (std::sregex_iterator m(sources.begin(), sources.end(), test_decl), end; m != end; ++m) {
    tests.insert({(*m)[1], (*m)[2]});
    suites.insert((*m)[1]);
  }
  ASSERT_GT(tests.size(), 100u);
  // Our test names are CamelCase: `Manifest.for_rank` is the plugin's Python method, not a test.
  const std::regex named(R"(`([A-Z][A-Za-z0-9]+)\.((?:[A-Z][A-Za-z0-9_]*)?)(\*?)`)"),
      pytest(R"((tests/[\w/]+\.py)::(\w+))");
  int checked = 0;
  for (const auto& [doc, text] : readme_and_docs()) {
    for (std::sregex_iterator m(text.begin(), text.end(), named), end; m != end; ++m) {
      const std::string suite = (*m)[1], name = (*m)[2];
      if (!suites.count(suite)) continue;  // a class of vLLM's, transformers', ...
      ++checked;
      bool found = false;
      for (const auto& [s, n] : tests)
        found |= s == suite && ((*m)[3].length() ? n.rfind(name, 0) == 0 : n == name);
      EXPECT_TRUE(found) << doc << " names the test " << m->str() << ", which does not exist";
    }
    for (std::sregex_iterator m(text.begin(), text.end(), pytest), end; m != end; ++m) {
      ++checked;
      const auto file = python.find((*m)[1]);
      EXPECT_TRUE(file != python.end() &&
                  file->second.find("def " + (*m)[2].str() + "(") != std::string::npos)
          << doc << " names the test " << m->str() << ", which does not exist";
    }
  }
  EXPECT_GT(checked, 10);
}

// A layout doc's title says its layout version ("# Marlin MoE layout (`--backend marlin`, layout
// version 2)"): the version moepack writes for each layout it names (formats/registry.cpp).
TEST(ReadmeClaims, LayoutDocsStateTheLayoutVersionWritten) {
  const std::regex title(R"(^# [^\n]*layout version (\d+)\))");
  int checked = 0;
  for (const auto& [doc, text] : readme_and_docs()) {
    std::smatch m;
    if (!std::regex_search(text, m, title)) continue;
    const std::string line = m.str();
    for (const auto& row : target_layouts()) {
      const std::string name = row.name;
      if (line.find("`" + name + "`") == std::string::npos &&
          line.find("`--backend " + name + "`") == std::string::npos)
        continue;
      ++checked;
      EXPECT_EQ(std::stoi(m[1]), row.layout_version) << doc << ": " << line;
    }
  }
  EXPECT_GE(checked, 4);
}

TEST(ReadmeClaims, LicenseExists) {
  const std::string license = read_text(test::source_dir() + "/LICENSE");
  EXPECT_NE(license.find("Apache License"), std::string::npos);
  EXPECT_NE(read_text(test::source_dir() + "/README.md").find("[LICENSE](LICENSE)"),
            std::string::npos);
}

}  // namespace
}  // namespace moepack
