// AtomicOutputDir: output appears only on commit, a failure leaves nothing behind, existing
// outputs need force, and an output never equals, lies inside, or contains an input.
#include "io/atomic_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using test::TempDir;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}
std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
// Names in `dir`, sorted.
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

template <typename F>
void expect_error(ErrorCode code, F&& f) {
  try {
    f();
    ADD_FAILURE() << "expected " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
  }
}

TEST(AtomicOutputDir, CommitCreatesFinal) {
  TempDir tmp;
  const std::string out = tmp / "out";
  {
    AtomicOutputDir dir(out, false, {});
    EXPECT_FALSE(fs::exists(out)) << "nothing at the final path before commit";
    EXPECT_EQ(fs::path(dir.path()).parent_path(), fs::path(tmp.path));
    EXPECT_EQ(fs::path(dir.path()).filename().string().rfind("out.moepack-tmp-", 0), 0u)
        << dir.path();
    write_text(dir.path() + "/model.safetensors", "weights");
    fs::create_directory(dir.path() + "/sub");
    write_text(dir.path() + "/sub/x.json", "{}");
    dir.commit();
    EXPECT_TRUE(dir.committed());
    EXPECT_FALSE(fs::exists(dir.path()));
    expect_error(ErrorCode::kInternal, [&] { dir.commit(); });
  }
  EXPECT_EQ(read_text(out + "/model.safetensors"), "weights");
  EXPECT_EQ(read_text(out + "/sub/x.json"), "{}");
  EXPECT_EQ(listing(tmp.path), std::vector<std::string>{"out"});
}

TEST(AtomicOutputDir, FailureBeforeCommitLeavesNothing) {
  TempDir tmp;
  const std::string out = tmp / "out";
  std::string temp;
  try {
    AtomicOutputDir dir(out, false, {});
    temp = dir.path();
    write_text(dir.path() + "/partial.safetensors", "half");
    fs::create_directory(dir.path() + "/nested");
    write_text(dir.path() + "/nested/f", "x");
    throw std::runtime_error("conversion failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(temp.empty());
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(listing(tmp.path).empty());
}

TEST(AtomicOutputDir, ExistingOutputNeedsForce) {
  TempDir tmp;
  const std::string out = tmp / "out";
  fs::create_directory(out);
  write_text(out + "/old.safetensors", "old");
  expect_error(ErrorCode::kOutputExists, [&] { AtomicOutputDir dir(out, false, {}); });
  EXPECT_EQ(listing(tmp.path), std::vector<std::string>{"out"}) << "no temp dir left";
  EXPECT_EQ(read_text(out + "/old.safetensors"), "old");

  // An existing plain file, and a dangling symlink, count as existing too.
  write_text(tmp / "file", "f");
  expect_error(ErrorCode::kOutputExists, [&] { AtomicOutputDir dir(tmp / "file", false, {}); });
  fs::create_symlink(tmp / "nowhere", tmp / "dangling");
  expect_error(ErrorCode::kOutputExists, [&] { AtomicOutputDir dir(tmp / "dangling", false, {}); });

  {
    AtomicOutputDir dir(out, true, {});
    write_text(dir.path() + "/new.safetensors", "new");
    EXPECT_EQ(read_text(out + "/old.safetensors"), "old") << "old output intact until commit";
    dir.commit();
  }
  EXPECT_EQ(listing(out), std::vector<std::string>{"new.safetensors"});
  EXPECT_EQ(read_text(out + "/new.safetensors"), "new");
  EXPECT_EQ(listing(tmp.path), (std::vector<std::string>{"dangling", "file", "out"}))
      << "neither temp nor the replaced output is left behind";

  // Force over a plain file.
  {
    AtomicOutputDir dir(tmp / "file", true, {});
    write_text(dir.path() + "/a", "a");
    dir.commit();
  }
  EXPECT_TRUE(fs::is_directory(tmp / "file"));

  // Without force, an output that appears while converting is refused at commit.
  {
    AtomicOutputDir dir(tmp / "late", false, {});
    fs::create_directory(tmp / "late");  // empty: plain rename(2) would replace it silently
    expect_error(ErrorCode::kOutputExists, [&] { dir.commit(); });
  }
  EXPECT_TRUE(fs::is_empty(tmp / "late"));
  EXPECT_EQ(listing(tmp.path), (std::vector<std::string>{"dangling", "file", "late", "out"}));
}

TEST(AtomicOutputDir, RefusesAliasingInputs) {
  TempDir tmp;
  const std::string in = tmp / "model";
  fs::create_directories(in + "/sub");
  write_text(in + "/model.safetensors", "w");
  auto refused = [&](const std::string& out, const std::vector<std::string>& inputs) {
    for (bool force : {false, true}) {
      SCOPED_TRACE(out + (force ? " (force)" : ""));
      expect_error(ErrorCode::kOutputAliasesInput,
                   [&] { AtomicOutputDir dir(out, force, inputs); });
    }
  };
  refused(in, {in});                                                // output == input
  refused(in + "/", {in});                                          // trailing slash
  refused(tmp / "model/../model", {in});                            // dot-dot
  refused(in + "/converted", {in});                                 // inside the input
  refused(in + "/sub/deeper/out", {in});                            // deep inside, not existing yet
  refused(tmp.path, {in});                                          // input inside the output
  refused(tmp / "x", {tmp / "x/y/model.safetensors"});              // input file inside output
  refused(in + "/model.safetensors", {in + "/model.safetensors"});  // file == file
  refused(tmp / "other", {tmp / "unrelated", in, tmp / "other"});   // any of several

  // Through a symlink to the input.
  fs::create_symlink(in, tmp / "link");
  refused(tmp / "link", {in});
  refused(tmp / "link/out", {in});
  refused(in + "/out", {tmp / "link"});

  // Relative paths.
  const fs::path cwd = fs::current_path();
  fs::current_path(tmp.path);
  refused("model/out", {in});
  refused("model", {"./model"});
  fs::current_path(cwd);

  // Nothing was created by any refusal.
  EXPECT_EQ(listing(tmp.path), (std::vector<std::string>{"link", "model"}));
  EXPECT_EQ(listing(in), (std::vector<std::string>{"model.safetensors", "sub"}));

  // A sibling whose name shares a prefix is not inside: "model2" vs "model".
  {
    AtomicOutputDir dir(tmp / "model2", false, {in});
    dir.commit();
  }
  EXPECT_TRUE(fs::is_directory(tmp / "model2"));
}

TEST(AtomicOutputDir, CreatesMissingParents) {
  TempDir tmp;
  const std::string out = tmp / "a/b/out";
  {
    AtomicOutputDir dir(out, false, {});
    write_text(dir.path() + "/f", "1");
    dir.commit();
  }
  EXPECT_EQ(read_text(out + "/f"), "1");
  expect_error(ErrorCode::kUsage, [&] { AtomicOutputDir dir("", false, {}); });
}

TEST(AtomicOutputDir, FsyncFile) {
  TempDir tmp;
  write_text(tmp / "f", "x");
  EXPECT_NO_THROW(fsync_file(tmp / "f"));
  EXPECT_NO_THROW(fsync_file(tmp.path));
  try {
    fsync_file(tmp / "missing");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_EQ(e.file(), tmp / "missing");
  }
}

}  // namespace
}  // namespace moepack
