// Hugging Face inputs through the real binary (model/hf_hub.h): a hub cache laid out as
// huggingface_hub writes it -- blobs/<hash> holding the bytes, snapshots/<commit>/ holding
// relative symlinks into blobs/, refs/main naming the commit -- is read by every command through
// a snapshot directory, a cache repo root, or a hub id resolved offline; only the safetensors
// weights and the config/tokenizer files are carried (other weight formats left out unless
// --include'd), and verify --source checks the rule again.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/sha256.h"
#include "model/hf_hub.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_bin;
using test::moepack_cli;
using test::run_command;
using test::TempDir;

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// `src` copied into a hub cache at `cache` as repo org/name at commit `commit`: each file's
// bytes once in blobs/, a relative symlink per file in the snapshot, refs/main -> commit.
fs::path make_hub_cache(const fs::path& src, const fs::path& cache, const std::string& id,
                        const std::string& commit) {
  const std::string folder =
      "models--" + id.substr(0, id.find('/')) + "--" + id.substr(id.find('/') + 1);
  const fs::path root = cache / folder, snap = root / "snapshots" / commit;
  fs::create_directories(root / "blobs");
  write_file(root / "refs" / "main", commit);
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = e.path().lexically_relative(src);
    const std::string blob = "blob" + std::to_string(n++);
    fs::copy_file(e.path(), root / "blobs" / blob);
    const fs::path link = snap / rel;
    fs::create_directories(link.parent_path());
    fs::create_symlink(fs::path("../../blobs") / blob, link);
    // Links in a sub-folder climb one more level, as huggingface_hub writes them.
    if (rel.has_parent_path()) {
      fs::remove(link);
      fs::create_symlink(fs::path("../../../blobs") / blob, link);
    }
  }
  return root;
}

class HfCache : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = tmp_ / "src";
    ASSERT_EQ(moepack_cli("synth " + src_ +
                          " --format gptq --layers 2 --experts 4 --hidden 256 --inter 128"),
              0);
    write_file(fs::path(src_) / "generation_config.json", "{\"do_sample\": true}\n");
    write_file(fs::path(src_) / "tokenizer.json", "{\"version\": \"1.0\"}\n");
    write_file(fs::path(src_) / "pytorch_model.bin", "pickled weights\n");
    write_file(fs::path(src_) / "original" / "consolidated.00.pth", "original weights\n");
    cache_ = tmp_ / "hub";
    root_ = make_hub_cache(src_, cache_, "acme/tiny-moe", "0123abcd").string();
    snap_ = root_ + "/snapshots/0123abcd";
    env_ = "HF_HUB_CACHE=" + cache_ + " ";
  }
  int cli(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
    return run_command(env_ + moepack_bin() + " " + args, out, err);
  }
  TempDir tmp_;
  std::string src_, cache_, root_, snap_, env_;
};

TEST_F(HfCache, EveryCommandReadsTheSnapshotThroughItsSymlinks) {
  const std::string dst = tmp_ / "out";
  std::string out, err;
  ASSERT_EQ(cli("convert " + snap_ + " " + dst + " --json", &out, &err), 0) << err;
  const json conv = json::parse(out);
  EXPECT_EQ(conv["files_carried"], json({"generation_config.json", "tokenizer.json"}));
  ASSERT_EQ(conv["files_left_out"].size(), 2u) << conv["files_left_out"];
  EXPECT_EQ(conv["files_left_out"][0]["path"], "original/consolidated.00.pth");
  EXPECT_EQ(conv["files_left_out"][1]["path"], "pytorch_model.bin");
  // The output holds files, not links into the cache.
  EXPECT_EQ(fs::symlink_status(fs::path(dst) / "generation_config.json").type(),
            fs::file_type::regular);
  EXPECT_FALSE(fs::exists(fs::path(dst) / "pytorch_model.bin"));
  EXPECT_FALSE(fs::exists(fs::path(dst) / "original"));
  const json m = test::read_json_file(dst + "/moepack.json");
  EXPECT_EQ(m["files_left_out"], json({"original/consolidated.00.pth", "pytorch_model.bin"}));
  EXPECT_FALSE(m.contains("files_rule"));  // the defaults are not written

  // verify --source reads the snapshot (symlinked generation_config.json and all): the issue's
  // "generation_config.json is not a regular file".
  ASSERT_EQ(cli("verify " + dst + " --source " + snap_ + " --tokens 8", &out, &err), 0)
      << out << err;
  EXPECT_EQ(cli("inspect " + snap_, &out, &err), 0) << err;
  EXPECT_EQ(cli("inspect " + dst, &out, &err), 0) << err;
}

TEST_F(HfCache, HubIdAndRepoRootResolveOffline) {
  const std::string dst = tmp_ / "out";
  std::string out, err;
  ASSERT_EQ(cli("convert acme/tiny-moe " + dst, &out, &err), 0) << err;
  EXPECT_NE(err.find("Hugging Face cache snapshot " + snap_), std::string::npos) << err;
  EXPECT_NE(err.find("main = 0123abcd"), std::string::npos) << err;
  EXPECT_EQ(cli("verify " + dst + " --source acme/tiny-moe --tokens 8", &out, &err), 0) << err;
  EXPECT_EQ(cli("verify " + dst + " --source acme/tiny-moe@0123abcd --tokens 8", &out, &err), 0)
      << err;
  ASSERT_EQ(cli("inspect " + root_ + " --json", &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out)["path"], snap_);
  // HF_HOME/hub is looked in too.
  EXPECT_EQ(run_command("HF_HOME=" + tmp_.path + " " + moepack_bin() +
                            " inspect acme/tiny-moe --no-validate --json",
                        &out, &err),
            0)
      << err;
}

// A converted checkpoint uploaded and downloaded again is a snapshot of links too: verify and
// inspect read it by hub id (sharded, so the index is a link as well).
TEST_F(HfCache, AConvertedCheckpointInTheCacheVerifies) {
  const std::string dst = tmp_ / "out";
  std::string out, err;
  ASSERT_EQ(cli("convert acme/tiny-moe " + dst + " --max-shard-size 300KB", &out, &err), 0) << err;
  ASSERT_TRUE(fs::exists(dst + "/model.safetensors.index.json"));
  make_hub_cache(dst, cache_, "acme/tiny-moe-marlin", "feed0001");
  EXPECT_EQ(cli("verify acme/tiny-moe-marlin --source acme/tiny-moe --tokens 8", &out, &err), 0)
      << out << err;
  EXPECT_EQ(cli("inspect acme/tiny-moe-marlin", &out, &err), 0) << err;
}

TEST_F(HfCache, AHubIdInNoCacheIsExit5NamingWhereItLooked) {
  std::string out, err;
  EXPECT_EQ(cli("inspect acme/other-moe", &out, &err), 5);
  EXPECT_NE(err.find(cache_ + "/models--acme--other-moe"), std::string::npos) << err;
  EXPECT_NE(err.find("huggingface-cli download acme/other-moe"), std::string::npos) << err;
  // Under --json the error is the JSON error object.
  EXPECT_EQ(cli("convert acme/other-moe " + (tmp_ / "o") + " --json", &out, &err), 5);
  EXPECT_EQ(json::parse(out)["error"]["code"], "io") << out;
  // A ref the repository does not have, and refs/main naming a missing snapshot: exit 3.
  EXPECT_EQ(cli("inspect acme/tiny-moe@dev", &out, &err), 3);
  EXPECT_NE(err.find("snapshots: 0123abcd"), std::string::npos) << err;
  write_file(fs::path(root_) / "refs" / "main", "feedbeef\n");
  EXPECT_EQ(cli("inspect acme/tiny-moe", &out, &err), 3);
  EXPECT_NE(err.find("refs/main names feedbeef, but no such snapshot exists"), std::string::npos)
      << err;
}

TEST_F(HfCache, IncludeAndExcludeChangeTheCarriedFilesAndVerifyChecksTheRule) {
  const std::string dst = tmp_ / "out";
  std::string out, err;
  ASSERT_EQ(cli("convert acme/tiny-moe " + dst +
                    " --include '*.bin' --exclude 'generation_config.json' --json",
                &out, &err),
            0)
      << err;
  EXPECT_EQ(json::parse(out)["files_carried"], json({"pytorch_model.bin", "tokenizer.json"}));
  EXPECT_TRUE(fs::exists(fs::path(dst) / "pytorch_model.bin"));
  EXPECT_FALSE(fs::exists(fs::path(dst) / "generation_config.json"));
  json m = test::read_json_file(dst + "/moepack.json");
  EXPECT_EQ(m["files_rule"]["include"], json({"*.bin"}));
  EXPECT_EQ(m["files_left_out"], json({"generation_config.json", "original/consolidated.00.pth"}));
  ASSERT_EQ(cli("verify " + dst + " --source acme/tiny-moe --tokens 8", &out, &err), 0) << out;

  // A manifest whose recorded rule no longer gives what it lists is refused by verify --source
  // (exit 3, as any manifest that does not describe the source), naming the file.
  m["files_rule"]["include"] = json::array();
  std::ofstream(dst + "/moepack.json") << m.dump(2);
  EXPECT_EQ(cli("verify " + dst + " --source acme/tiny-moe --tokens 8", &out, &err), 3) << out;
  EXPECT_NE(err.find("files_left_out"), std::string::npos) << err;
  EXPECT_NE(err.find("pytorch_model.bin"), std::string::npos) << err;
}

TEST(HfHub, SelectFilesLeavesOutOtherWeightFormatsUnlessIncluded) {
  const std::vector<std::string> files = {"README.md",
                                          "consolidated.pth",
                                          "model.gguf",
                                          "original/params.json",
                                          "pytorch_model.bin.index.json",
                                          "tokenizer.model"};
  FileSelection s = select_files(files, {});
  EXPECT_EQ(s.carried, (std::vector<std::string>{"README.md", "tokenizer.model"}));
  ASSERT_EQ(s.left_out.size(), 4u);
  EXPECT_NE(s.left_out[0].why.find("--include '*.pth'"), std::string::npos) << s.left_out[0].why;
  s = select_files(files, {{"original/*"}, {"*.md"}});
  EXPECT_EQ(s.carried, (std::vector<std::string>{"original/params.json", "tokenizer.model"}));
  EXPECT_EQ(s.left_out[0].why, "--exclude '*.md'");
}

TEST(HfHub, HubIdShape) {
  EXPECT_TRUE(looks_like_hub_id("Qwen/Qwen3-30B-A3B-GPTQ-Int4"));
  EXPECT_TRUE(looks_like_hub_id("org/name@refs/pr/1"));
  EXPECT_FALSE(looks_like_hub_id("name"));
  EXPECT_FALSE(looks_like_hub_id("a/b/c"));
  EXPECT_FALSE(looks_like_hub_id("../x"));
  EXPECT_FALSE(looks_like_hub_id("org/na me"));
  EXPECT_FALSE(looks_like_hub_id("org/name@"));
}

}  // namespace
}  // namespace moepack
