// Servability (pipeline/servability.h): derived from the layout rows' vllm_serving entries,
// agreeing with the plugin's own list of vLLM targets, and the README's served matrix is exactly
// the one those rows give.
#include "pipeline/servability.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
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

TEST(Servability, FollowsTheLayoutRows) {
  for (const TargetLayout& l : target_layouts())
    for (const SourceCodec& c : source_codecs()) {
      if (std::find(l.schemes.begin(), l.schemes.end(), std::string(c.scheme)) == l.schemes.end())
        continue;
      for (const VllmTargetRow& t : vllm_target_rows()) {
        SCOPED_TRACE(std::string(l.name) + " " + c.name + " " + t.name);
        const Servability s = servability(l, t.target, c.method);
        const VllmServing row = find_vllm_serving(l, t.target, c.method);
        EXPECT_EQ(s.servable, row.path != ServingPath::kNone);
        EXPECT_EQ(s.path, row.path);
        EXPECT_EQ(s.archs, l.archs);
        if (s.servable) {
          EXPECT_TRUE(s.reason.empty());
          EXPECT_NE(s.to_text().find("TP 1 only, no expert parallelism"), std::string::npos);
        } else {
          EXPECT_FALSE(s.reason.empty());
          EXPECT_EQ(s.to_text().rfind("NOT servable by moepack-vllm", 0), 0u) << s.to_text();
        }
        const auto j = s.to_json();
        EXPECT_EQ(j["tensor_parallel_size"], 1);
        EXPECT_EQ(j["expert_parallel"], false);
        EXPECT_EQ(j["vllm"], t.follows);
      }
    }
}

// A parallel output records the degree it is written for (mark_parallel), in text and JSON: the
// tensor_parallel_size every output reports is the real one, not a constant.
TEST(Servability, ReportsTheParallelismTheOutputIsWrittenFor) {
  const TargetLayout* marlin = find_target_layout("marlin");
  ASSERT_NE(marlin, nullptr);
  Servability whole = servability(*marlin, VllmTarget::kV0_33, QuantMethod::kGptq);
  mark_parallel(Parallelism{}, whole);
  EXPECT_EQ(whole.to_json()["tensor_parallel_size"], 1);
  EXPECT_EQ(whole.to_json()["expert_parallel"], false);
  Parallelism tp;
  tp.tensor = 8;
  Servability s = servability(*marlin, VllmTarget::kV0_33, QuantMethod::kGptq);
  mark_parallel(tp, s);
  EXPECT_TRUE(s.servable) << s.to_text();  // the plugin serves each rank's files
  EXPECT_EQ(s.to_json()["tensor_parallel_size"], 8);
  EXPECT_EQ(s.to_json()["expert_parallel"], false);
  EXPECT_NE(s.to_text().find("TP 8 only, no expert parallelism, each rank reading its own"),
            std::string::npos)
      << s.to_text();
  Parallelism ep;
  ep.expert = 4;
  ep.placement = ExpertPlacement::kRoundRobin;
  Servability e = servability(*marlin, VllmTarget::kV0_33, QuantMethod::kGptq);
  mark_parallel(ep, e);
  EXPECT_EQ(e.to_json()["tensor_parallel_size"], 1);
  EXPECT_EQ(e.to_json()["expert_parallel"], true);
  EXPECT_EQ(e.to_json()["expert_parallel_size"], 4);
  EXPECT_EQ(e.to_json()["expert_placement"], "round_robin");
  EXPECT_TRUE(e.servable);
  EXPECT_NE(e.to_text().find("expert parallel 4 (round_robin; --tensor-parallel-size 4 "
                             "--enable-expert-parallel)"),
            std::string::npos)
      << e.to_text();
}

// The plugin's VLLM_TARGETS (integrations/vllm/moepack_vllm/artifact.py) are exactly the targets
// some layout row serves; an output for any other target says which ones are.
TEST(Servability, ServedTargetsAreThePluginsTargets) {
  const std::string py =
      read_text(test::source_dir() + "/integrations/vllm/moepack_vllm/artifact.py");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(py, m, std::regex(R"(VLLM_TARGETS = \(([^)]*)\))"))) << py;
  std::vector<std::string> plugin;
  const std::string list = m[1];
  const std::regex item("\"([^\"]+)\"");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), item); it != std::sregex_iterator();
       ++it)
    plugin.push_back((*it)[1]);
  std::vector<std::string> rows;
  for (VllmTarget t : served_vllm_targets()) rows.push_back(vllm_target_name(t));
  EXPECT_EQ(rows, plugin);
  for (const VllmTargetRow& t : vllm_target_rows()) {
    if (std::find(rows.begin(), rows.end(), t.name) != rows.end()) continue;
    const Servability s = servability(target_layouts().front(), t.target, QuantMethod::kGptq);
    EXPECT_FALSE(s.servable);
    EXPECT_NE(s.reason.find("moepack-vllm serves --vllm-target " + rows.front() + " only"),
              std::string::npos)
        << s.reason;
  }
}

// README.md holds the served matrix the rows give, between its served-matrix markers (regenerate
// it with the text this test prints when a row changes).
TEST(Servability, ReadmeMatrixIsTheRows) {
  const std::string readme = read_text(test::source_dir() + "/README.md");
  const std::string begin =
      "<!-- served-matrix: generated from the layout rows, checked by "
      "tests/unit/servability.cpp -->\n";
  const std::string end = "<!-- /served-matrix -->";
  const size_t b = readme.find(begin), e = readme.find(end);
  ASSERT_NE(b, std::string::npos) << "README.md has no served-matrix block";
  ASSERT_NE(e, std::string::npos);
  const std::string got = readme.substr(b + begin.size(), e - b - begin.size());
  EXPECT_EQ(got, served_matrix_markdown()) << "README.md's served matrix should read:\n"
                                           << served_matrix_markdown();
  // On the first screen: before "## What it does".
  EXPECT_LT(b, readme.find("## What it does"));
}

}  // namespace
}  // namespace moepack
