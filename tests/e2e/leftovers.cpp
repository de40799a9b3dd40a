// No leftovers through the real binary: a convert ended by any catchable signal mid-write leaves
// neither output nor temporary sibling and dies by that signal; one killed by SIGKILL leaves a
// temporary that the next convert to the same output removes, while a live one's is never
// touched; a file-size limit (SIGXFSZ) leaves nothing.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "io/atomic_dir.h"
#include "tests/test_util.h"

extern char** environ;

namespace moepack {
namespace {
namespace fs = std::filesystem;
using test::moepack_bin;
using test::run_command;
using test::TempDir;

// Names in `parent` other than `keep`.
std::vector<std::string> names_except(const std::string& parent, const std::string& keep) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(parent))
    if (e.path().filename() != keep) out.push_back(e.path().filename().string());
  return out;
}

// The temporary sibling of `dst`, or "" when there is none.
std::string temp_of(const std::string& dst) {
  const fs::path d(dst);
  const std::string prefix = d.filename().string() + ".moepack-tmp-";
  std::error_code ec;  // the parent may not exist yet (DST.parts/ of a --shard part)
  for (fs::directory_iterator it(d.parent_path(), ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind(prefix, 0) == 0) return it->path().string();
  return "";
}

pid_t spawn_convert(const std::string& src, const std::string& dst, const std::string& extra) {
  const std::string cmd =
      "exec " + moepack_bin() + " convert " + src + " " + dst + " --threads 1 " + extra;
  const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  return pid;
}

// Waits until the convert `pid` has a temporary sibling of `dst` holding at least one file, then
// stops it (SIGSTOP) so that the test acts mid-write. Returns the temporary, or "" when the
// process ended first.
std::string stop_mid_write(pid_t pid, const std::string& dst) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string t = temp_of(dst);
    std::error_code ec;
    if (!t.empty() && !fs::is_empty(t, ec) && !ec) {
      kill(pid, SIGSTOP);
      if (fs::exists(temp_of(dst))) return temp_of(dst);
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return "";
}

int wait_status(pid_t pid) {
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

// One source per suite: 2 MoE layers of 16 experts, ~13 MB of tensors, so that a
// single-threaded convert runs long enough to be stopped mid-write.
class Leftovers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    src_dir_ = new TempDir();
    src_ = *src_dir_ / "src";
    ASSERT_EQ(run_command(moepack_bin() + " synth " + src_ +
                          " --format gptq --layers 2 --experts 16 --hidden 1024 --inter 256"),
              0);
  }
  static void TearDownTestSuite() {
    delete src_dir_;
    src_dir_ = nullptr;
  }
  static TempDir* src_dir_;
  static std::string src_;
};
TempDir* Leftovers::src_dir_ = nullptr;
std::string Leftovers::src_;

class SignalMidConvert : public Leftovers, public ::testing::WithParamInterface<int> {};

TEST_P(SignalMidConvert, LeavesNothingAndDiesByTheSignal) {
  const int sig = GetParam();
  TempDir out;
  const std::string dst = out / "dst";
  const pid_t pid = spawn_convert(src_, dst, "");
  const std::string temp = stop_mid_write(pid, dst);
  ASSERT_FALSE(temp.empty()) << "convert ended before it could be stopped mid-write";
  kill(pid, sig);
  kill(pid, SIGCONT);
  const int status = wait_status(pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), sig);
  EXPECT_FALSE(fs::exists(dst));
  EXPECT_EQ(names_except(out.path, ""), std::vector<std::string>{}) << temp;
}

INSTANTIATE_TEST_SUITE_P(Catchable, SignalMidConvert,
                         ::testing::Values(SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGXFSZ, SIGBUS,
                                           SIGSEGV),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(sigabbrev_np(i.param));
                         });

// A replace (--force over an existing output) interrupted mid-write keeps the old output.
TEST_F(Leftovers, SignalDuringForcedReplaceKeepsTheOldOutput) {
  TempDir out;
  const std::string dst = out / "dst";
  ASSERT_EQ(run_command(moepack_bin() + " convert " + src_ + " " + dst), 0);
  const pid_t pid = spawn_convert(src_, dst, "--force");
  ASSERT_FALSE(stop_mid_write(pid, dst).empty());
  kill(pid, SIGTERM);
  kill(pid, SIGCONT);
  EXPECT_TRUE(WIFSIGNALED(wait_status(pid)));
  EXPECT_EQ(names_except(out.path, ""), std::vector<std::string>{"dst"});
  EXPECT_EQ(run_command(moepack_bin() + " verify " + dst), 0);
}

// SIGKILL cannot be caught: the temporary stays, and the next convert to the same output
// removes it because its owner is gone.
TEST_F(Leftovers, SigkillLeavesATemporaryTheNextConvertRemoves) {
  TempDir out;
  const std::string dst = out / "dst";
  const pid_t pid = spawn_convert(src_, dst, "");
  const std::string temp = stop_mid_write(pid, dst);
  ASSERT_FALSE(temp.empty());
  kill(pid, SIGKILL);
  EXPECT_TRUE(WIFSIGNALED(wait_status(pid)));
  ASSERT_TRUE(fs::exists(temp)) << "the test needs a leftover to start from";
  const auto owner = parse_owner_tag(fs::path(temp).filename().string().substr(
      std::string("dst").size() + strlen(".moepack-tmp-")));
  ASSERT_TRUE(owner.has_value()) << temp;
  EXPECT_EQ(owner->pid, pid);
  EXPECT_EQ(owner_state(*owner), OwnerState::kGone);

  EXPECT_EQ(run_command(moepack_bin() + " convert " + src_ + " " + dst), 0);
  EXPECT_EQ(names_except(out.path, ""), std::vector<std::string>{"dst"});
}

// A temporary whose owner is alive (here: stopped) is never touched by another convert; once
// its owner is killed, the next convert removes it.
TEST_F(Leftovers, LiveOwnersTemporaryIsKept) {
  TempDir out;
  const std::string dst = out / "dst";
  const pid_t pid = spawn_convert(src_, dst, "");
  const std::string temp = stop_mid_write(pid, dst);
  ASSERT_FALSE(temp.empty());
  EXPECT_EQ(run_command(moepack_bin() + " convert " + src_ + " " + dst), 0);
  EXPECT_TRUE(fs::exists(temp)) << "a live convert's temporary was removed";
  kill(pid, SIGKILL);
  wait_status(pid);
  EXPECT_EQ(run_command(moepack_bin() + " convert " + src_ + " " + dst + " --force"), 0);
  EXPECT_EQ(names_except(out.path, ""), std::vector<std::string>{"dst"});
}

// A file-size limit below the output size: the write raises SIGXFSZ, and nothing is left.
TEST_F(Leftovers, FileSizeLimitLeavesNothing) {
  TempDir out;
  const std::string dst = out / "dst";
  std::string err;
  const int rc = run_command("ulimit -f 2048 && " + moepack_bin() + " convert " + src_ + " " + dst,
                             nullptr, &err);
  EXPECT_EQ(rc, 128 + SIGXFSZ) << err;
  EXPECT_EQ(names_except(out.path, ""), std::vector<std::string>{});
}

// SIGTERM of a `convert --shard` task mid-write: no part, no temporary and no empty DST.parts/
// (issue 28: the empty folder was left, and a later merge reported "no parts").
TEST_F(Leftovers, SignalMidShardLeavesNoPartsFolder) {
  TempDir out;
  const std::string dst = out / "dst";
  const pid_t pid = spawn_convert(src_, dst, "--shard 0/2");
  ASSERT_FALSE(stop_mid_write(pid, dst + ".parts/0-of-2").empty())
      << "convert ended before it could be stopped mid-write";
  kill(pid, SIGTERM);
  kill(pid, SIGCONT);
  EXPECT_TRUE(WIFSIGNALED(wait_status(pid)));
  EXPECT_EQ(names_except(out.path, ""), std::vector<std::string>{});
}

// A legal 200-byte output name (and the 250-byte one without --shard, whose DST.parts would not
// fit NAME_MAX): convert, --shard, merge and verify work, and leave only the outputs.
TEST_F(Leftovers, LongOutputNamesWork) {
  TempDir out;
  const std::string name(200, 'd');
  const std::string dst = out / name;
  std::string err;
  ASSERT_EQ(run_command(moepack_bin() + " convert " + src_ + " " + dst, nullptr, &err), 0) << err;
  ASSERT_EQ(run_command(moepack_bin() + " convert " + src_ + " " + dst + " --force", nullptr, &err),
            0)
      << err;
  const std::string longest = out / std::string(250, 'e');
  ASSERT_EQ(run_command(moepack_bin() + " convert " + src_ + " " + longest, nullptr, &err), 0)
      << err;
  const std::string sharded = out / std::string(200, 's');
  for (const char* shard : {"0/2", "1/2"})
    ASSERT_EQ(run_command(moepack_bin() + " convert " + src_ + " " + sharded + " --shard " + shard,
                          nullptr, &err),
              0)
        << err;
  ASSERT_EQ(
      run_command(moepack_bin() + " merge " + sharded + " --source " + src_ + " --remove-parts",
                  nullptr, &err),
      0)
      << err;
  EXPECT_EQ(run_command(moepack_bin() + " verify " + dst + " --tokens 4"), 0);
  EXPECT_EQ(run_command("cmp " + dst + "/moepack.json " + sharded + "/moepack.json"), 0);
  std::vector<std::string> names = names_except(out.path, "");
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{name, std::string(250, 'e'), std::string(200, 's')}));
}

// `verify --report` on a full disk (here: a file-size limit with SIGXFSZ ignored, so the write
// fails with EFBIG as on ENOSPC) is an I/O error that leaves no empty or cut report, and an
// existing report as it was.
TEST_F(Leftovers, ReportOnAFullDiskLeavesNoReport) {
  TempDir out;
  const std::string dst = out / "dst";
  ASSERT_EQ(run_command(moepack_bin() + " convert " + src_ + " " + dst), 0);
  const std::string reports = out / "reports";
  fs::create_directories(reports);
  std::string err;
  const std::string limited = "trap '' XFSZ; ulimit -f 1 && ";
  EXPECT_EQ(run_command(limited + moepack_bin() + " verify " + dst + " --tokens 4 --report " +
                            reports + "/r.html",
                        nullptr, &err),
            5)
      << err;
  EXPECT_NE(err.find("r.html"), std::string::npos) << err;
  EXPECT_EQ(names_except(reports, ""), std::vector<std::string>{});
  std::ofstream(reports + "/r.html") << "previous report";
  EXPECT_EQ(run_command(limited + moepack_bin() + " verify " + dst + " --tokens 4 --report " +
                        reports + "/r.html"),
            5);
  EXPECT_EQ(names_except(reports, ""), std::vector<std::string>{"r.html"});
  std::ifstream in(reports + "/r.html");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "previous report");
  EXPECT_EQ(
      run_command(moepack_bin() + " verify " + dst + " --tokens 4 --report " + reports + "/r.html"),
      0);
  EXPECT_GT(fs::file_size(reports + "/r.html"), 1000u);
}

}  // namespace
}  // namespace moepack
