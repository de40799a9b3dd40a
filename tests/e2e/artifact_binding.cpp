// The artifact is bound whole (pipeline/artifact.h), through the real binary: after convert, any
// edit of config.json -- the quantization_config replaced by the source's, removed or its backend
// changed, a routing or layer-plan field changed, a field added -- fails `verify` (with and
// without --source) naming the field, and `inspect` says the artifact is not intact; a manifest
// whose digests were forged to match the edit is caught by its SHA-256 in config.json, and one
// re-bound both ways by --source. Output bytes depend only on the source's bytes: SRC, SRC/ and
// SRC/. give the same artifact, and parts converted from one spelling merge with another.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_cli;
using test::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void spit(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}
json read(const std::string& path) {
  return json::parse(slurp(path));
}
void write(const std::string& path, const json& j) {
  spit(path, j.dump(2) + "\n");
}

// One converted DeepSeek GPTQ checkpoint (router fields, a quantization_config to swap), made
// once for the suite and copied fresh for each case.
class ArtifactBinding : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    src_ = dir_->path + "/src";
    dst_ = dir_->path + "/dst";
    ASSERT_EQ(moepack_cli("synth " + src_ + " --format gptq --family deepseek --layers 3"), 0);
    ASSERT_EQ(moepack_cli("convert " + src_ + " " + dst_), 0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  // A fresh copy of the converted checkpoint.
  std::string copy() {
    const std::string d = tmp_.path + "/dst";
    fs::copy(dst_, d, fs::copy_options::recursive);
    return d;
  }
  static TempDir* dir_;
  static std::string src_, dst_;
  TempDir tmp_;
};
TempDir* ArtifactBinding::dir_ = nullptr;
std::string ArtifactBinding::src_, ArtifactBinding::dst_;

struct ConfigEdit {
  std::string what;
  std::function<void(json& cfg, const json& source_cfg)> edit;
  std::string field;  // what verify's message must name
};

std::vector<ConfigEdit> config_edits() {
  return {
      {"quantization_config replaced by the source's",
       [](json& c, const json& s) { c["quantization_config"] = s["quantization_config"]; },
       "quantization_config."},
      {"quantization_config removed", [](json& c, const json&) { c.erase("quantization_config"); },
       "quantization_config: removed"},
      {"backend changed",
       [](json& c, const json&) { c["quantization_config"]["backend"] = "triton"; },
       "quantization_config.backend"},
      {"moepack block's layout changed", [](json& c, const json&) { c["moepack"]["layout"] = "x"; },
       "moepack.layout"},
      {"num_experts_per_tok", [](json& c, const json&) { c["num_experts_per_tok"] = 1; },
       "num_experts_per_tok"},
      {"norm_topk_prob", [](json& c, const json&) { c["norm_topk_prob"] = !c["norm_topk_prob"]; },
       "norm_topk_prob"},
      {"moe_intermediate_size", [](json& c, const json&) { c["moe_intermediate_size"] = 64; },
       "moe_intermediate_size"},
      {"mlp_only_layers added", [](json& c, const json&) { c["mlp_only_layers"] = {0}; },
       "mlp_only_layers: added"},
      {"routed_scaling_factor", [](json& c, const json&) { c["routed_scaling_factor"] = 9.5; },
       "routed_scaling_factor"},
      {"n_group / topk_group",
       [](json& c, const json&) {
         c["n_group"] = 1;
         c["topk_group"] = 1;
       },
       "n_group"},
      {"scoring_func", [](json& c, const json&) { c["scoring_func"] = "softmax"; }, "scoring_func"},
      {"manifest_sha256",
       [](json& c, const json&) {
         c["quantization_config"]["manifest_sha256"] = std::string(64, 'a');
       },
       "quantization_config.manifest_sha256"}};
}

TEST_F(ArtifactBinding, UntouchedArtifactIsIntactAndVerifies) {
  std::string out, err;
  EXPECT_EQ(moepack_cli("verify --json " + dst_ + " --source " + src_, &out, &err), 0)
      << out << err;
  EXPECT_NE(out.find("config.json is the one convert wrote from the source"), std::string::npos)
      << out;
  ASSERT_EQ(moepack_cli("inspect --json " + dst_, &out, &err), 0) << err;
  const json j = json::parse(out);
  EXPECT_EQ(j["moepack"]["intact"]["ok"], true) << j["moepack"]["intact"].dump();
  EXPECT_EQ(read(dst_ + "/moepack.json")["manifest_version"], 4);
}

TEST_F(ArtifactBinding, EveryConfigEditFailsVerifyNamingTheField) {
  const json source_cfg = read(src_ + "/config.json");
  for (const ConfigEdit& c : config_edits()) {
    SCOPED_TRACE(c.what);
    const std::string d = copy();
    json cfg = read(d + "/config.json");
    c.edit(cfg, source_cfg);
    write(d + "/config.json", cfg);
    for (const std::string& source : {std::string(), " --source " + src_}) {
      std::string out, err;
      EXPECT_EQ(moepack_cli("verify " + d + source, &out, &err), 1) << out << err;
      EXPECT_NE(out.find("FAIL config.json is the one convert wrote"), std::string::npos) << out;
      EXPECT_NE(out.find("config.json: " + c.field), std::string::npos) << out;
    }
    // inspect says the artifact is not intact, naming the field -- or, where the edit made it
    // no checkpoint at all (a source holding a moepack.json), refuses it saying so.
    std::string out, err;
    const int rc = moepack_cli("inspect --json --no-validate " + d, &out, &err);
    if (rc == 0) {
      const json intact = json::parse(out)["moepack"]["intact"];
      EXPECT_EQ(intact["ok"], false) << intact.dump();
      EXPECT_NE(intact["detail"].get<std::string>().find(c.field), std::string::npos)
          << intact.dump();
    } else {
      EXPECT_EQ(rc, 3) << err;
      EXPECT_NE(err.find("not intact (config.json: " + c.field), std::string::npos) << err;
    }
    fs::remove_all(d);
  }
}

// An edit whose digests were also written into the manifest: config.json's manifest_sha256 no
// longer matches; with that re-bound too, only the source tells, naming the field.
TEST_F(ArtifactBinding, ForgedManifestIsCaught) {
  const std::string d = copy();
  json cfg = read(d + "/config.json");
  json m = read(d + "/moepack.json");
  cfg["num_experts_per_tok"] = 1;
  const std::string text = json(1).dump();
  m["config"]["num_experts_per_tok"] = sha256_hex(text.data(), text.size());
  write(d + "/moepack.json", m);
  write(d + "/config.json", cfg);
  std::string out;
  EXPECT_EQ(moepack_cli("verify " + d, &out), 1) << out;
  EXPECT_NE(out.find("quantization_config.manifest_sha256"), std::string::npos) << out;

  const std::string mtext = slurp(d + "/moepack.json");
  cfg["quantization_config"]["manifest_sha256"] = sha256_hex(mtext.data(), mtext.size());
  write(d + "/config.json", cfg);
  EXPECT_EQ(moepack_cli("verify " + d + " --tokens 4", &out), 0) << out;  // bound both ways
  EXPECT_EQ(moepack_cli("verify " + d + " --source " + src_, &out), 1) << out;
  EXPECT_NE(out.find("config.json: num_experts_per_tok: differs from what convert writes from "
                     "the source"),
            std::string::npos)
      << out;
}

// Bytes depend only on bytes: every spelling of SRC and DST gives the same files, the manifest
// names no path, and parts converted from SRC merge under --source SRC/.
TEST_F(ArtifactBinding, EverySpellingOfSrcAndDstGivesTheSameBytes) {
  const std::string t = tmp_.path;
  fs::create_directories(t + "/sub");
  const std::vector<std::pair<std::string, std::string>> spellings = {
      {src_, t + "/a"},
      {src_ + "/", t + "/b/"},
      {src_ + "/.", t + "/sub/../c"},
      {src_ + "//", t + "/./d"}};
  std::vector<std::string> outs;
  for (const auto& [s, d] : spellings) {
    std::string out, err;
    ASSERT_EQ(moepack_cli("convert " + s + " " + d, &out, &err), 0) << s << " " << d << err;
    outs.push_back(fs::path(d).lexically_normal().string());
  }
  const std::string manifest = slurp(dst_ + "/moepack.json");
  EXPECT_EQ(manifest.find(dir_->path), std::string::npos) << "a machine path in the manifest";
  EXPECT_EQ(slurp(dst_ + "/config.json").find(dir_->path), std::string::npos);
  for (const std::string& o : outs) {
    std::string norm = o;
    if (!norm.empty() && norm.back() == '/') norm.pop_back();
    for (const char* f : {"moepack.json", "config.json", "model.safetensors"})
      EXPECT_EQ(slurp(norm + "/" + f), slurp(dst_ + "/" + f)) << norm << "/" << f;
  }

  std::string out, err;
  ASSERT_EQ(moepack_cli("convert " + src_ + " " + t + "/m --shard 0/2", &out, &err), 0) << err;
  ASSERT_EQ(moepack_cli("convert " + src_ + "/. " + t + "/m --shard 1/2", &out, &err), 0) << err;
  ASSERT_EQ(moepack_cli("merge " + t + "/m --source " + src_ + "/", &out, &err), 0) << out << err;
  EXPECT_EQ(slurp(t + "/m/moepack.json"), manifest);
  EXPECT_EQ(slurp(t + "/m/config.json"), slurp(dst_ + "/config.json"));
}

// Every regular file under ROOT (relative path -> bytes).
std::map<std::string, std::string> tree(const std::string& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) files[fs::relative(e.path(), root).string()] = slurp(e.path());
  return files;
}

// Issue 28, bytes depend only on bytes: two copies of the source at different places, spelled
// differently, give the same bytes in every file convert --shard, merge and convert write -- the
// parts' part.json and part.safetensors included -- and no file holds a path of this machine.
// Parts from one copy merge under the other.
TEST_F(ArtifactBinding, TwoCopiesOfTheSourceGiveTheSameBytesInEveryFile) {
  const std::string t = tmp_.path;
  const std::string copy = t + "/elsewhere/deeper/src-copy";
  fs::create_directories(t + "/elsewhere/deeper");
  fs::copy(src_, copy, fs::copy_options::recursive);
  const std::string copy_spelled = t + "/elsewhere/./deeper/../deeper/src-copy/";
  std::string out, err;
  for (const auto& [s, d] :
       {std::pair<std::string, std::string>{src_, t + "/x1"}, {copy_spelled, t + "/x2"}}) {
    ASSERT_EQ(moepack_cli("convert " + s + " " + d + "/single", &out, &err), 0) << err;
    for (const char* shard : {"0/3", "1/3", "2/3"})
      ASSERT_EQ(moepack_cli("convert " + s + " " + d + "/m --shard " + shard, &out, &err), 0)
          << err;
  }
  EXPECT_EQ(tree(t + "/x1/m.parts"), tree(t + "/x2/m.parts"));
  EXPECT_EQ(tree(t + "/x1/single"), tree(dst_));
  EXPECT_EQ(tree(t + "/x2/single"), tree(dst_));
  // Crossed: the parts of each copy merged under the other.
  ASSERT_EQ(moepack_cli("merge " + t + "/x1/m --source " + copy_spelled, &out, &err), 0) << err;
  ASSERT_EQ(moepack_cli("merge " + t + "/x2/m --source " + src_, &out, &err), 0) << err;
  EXPECT_EQ(tree(t + "/x1/m"), tree(dst_));
  EXPECT_EQ(tree(t + "/x2/m"), tree(dst_));
  // No path of this machine in any file written (the temporary folders' roots cover every path
  // involved), nor in verify's report.
  ASSERT_EQ(moepack_cli("verify " + t + "/x2/m --source " + copy + " --tokens 4 --report " + t +
                            "/x2/report.html",
                        &out, &err),
            0)
      << err;
  for (const std::string& root : {t + "/x1", t + "/x2"})
    for (const auto& [rel, bytes] : tree(root)) {
      EXPECT_EQ(bytes.find(t), std::string::npos) << root << "/" << rel << " names " << t;
      EXPECT_EQ(bytes.find(dir_->path), std::string::npos) << root << "/" << rel;
    }
}

}  // namespace
}  // namespace moepack
