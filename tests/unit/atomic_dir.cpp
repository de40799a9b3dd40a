// AtomicOutputDir: output appears only on commit, a failure leaves nothing behind, existing
// outputs need force, and an output never equals, lies inside, or contains an input.
#include "io/atomic_dir.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

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

// ---- owners of temporaries ----

std::string tag_of(const OutputOwner& o, const std::string& rand = "0123456789ab") {
  return o.machine + "-" + o.boot + "-" + std::to_string(o.pid) + "-" + std::to_string(o.start) +
         "-" + rand;
}

// The pid of a child that has exited and been reaped: no process has it (barring reuse).
int64_t dead_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

TEST(OutputOwner, TagRoundTripsAndThisProcessIsAlive) {
  const OutputOwner& me = this_process_owner();
  EXPECT_EQ(me.pid, static_cast<int64_t>(getpid()));
  EXPECT_GT(me.start, 0u);
  const std::string tag = new_owner_tag();
  const auto parsed = parse_owner_tag(tag);
  ASSERT_TRUE(parsed.has_value()) << tag;
  EXPECT_EQ(parsed->machine, me.machine);
  EXPECT_EQ(parsed->boot, me.boot);
  EXPECT_EQ(parsed->pid, me.pid);
  EXPECT_EQ(parsed->start, me.start);
  EXPECT_EQ(owner_state(*parsed), OwnerState::kAlive);
}

TEST(OutputOwner, MalformedTagsAreNotOwners) {
  const std::string m = this_process_owner().machine, b = this_process_owner().boot;
  for (const std::string& tag :
       {std::string("12-0123456789ab"), std::string(""), m + "-" + b + "-1-2",
        m + "-" + b + "-01-2-0123456789ab", m + "-" + b + "-1-2-0123456789AB",
        m + "-" + b + "-1-2-0123456789ab-x", m + "-" + b + "--1-2-0123456789ab",
        m + "-" + b + "-0-2-0123456789ab", m + "-" + b + "-99999999999-2-0123456789ab",
        m.substr(1) + "-" + b + "-1-2-0123456789ab"})
    EXPECT_FALSE(parse_owner_tag(tag).has_value()) << tag;
}

TEST(OutputOwner, GoneOnlyWhenProvablyGone) {
  OutputOwner o = this_process_owner();
  EXPECT_EQ(owner_state(o), OwnerState::kAlive);
  o.start += 1;  // this pid, another start time: the pid was reused
  EXPECT_EQ(owner_state(o), OwnerState::kGone);
  o = this_process_owner();
  o.pid = dead_pid();
  EXPECT_EQ(owner_state(o), OwnerState::kGone);
  o = this_process_owner();
  o.pid = getppid();  // another live process: alive with its own start time, gone with another
  std::ifstream stat("/proc/" + std::to_string(o.pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {}), field;
  std::istringstream rest(text.substr(text.rfind(')') + 1));
  for (int i = 3; i <= 22; ++i) rest >> field;
  o.start = std::stoull(field);
  EXPECT_EQ(owner_state(o), OwnerState::kAlive);
  o.start += 1;
  EXPECT_EQ(owner_state(o), OwnerState::kGone);
  o = this_process_owner();
  o.boot = o.boot == "00000000" ? "00000001" : "00000000";  // another boot of this machine
  EXPECT_EQ(owner_state(o), OwnerState::kGone);
  o = this_process_owner();
  o.machine = std::string(16, o.machine[0] == 'f' ? 'e' : 'f');  // another host or PID namespace
  o.pid = dead_pid();
  EXPECT_EQ(owner_state(o), OwnerState::kUnknown);
}

TEST(AtomicOutputDir, RemovesStaleTemporariesAndKeepsLiveOnes) {
  TempDir tmp;
  const std::string out = tmp / "model";
  OutputOwner gone = this_process_owner(), other = this_process_owner();
  gone.pid = dead_pid();
  other.machine = std::string(16, other.machine[0] == 'f' ? 'e' : 'f');
  other.pid = gone.pid;
  const std::string stale = out + ".moepack-tmp-" + tag_of(gone);
  const std::string live = out + ".moepack-tmp-" + tag_of(this_process_owner());
  const std::string foreign = out + ".moepack-tmp-" + tag_of(other);
  const std::string legacy = out + ".moepack-tmp-" + std::to_string(gone.pid) + "-0123456789ab";
  const std::string unrelated = tmp / ("other.moepack-tmp-" + tag_of(gone));
  for (const auto& d : {stale, live, foreign, legacy, unrelated}) {
    fs::create_directories(d + "/sub");
    write_text(d + "/sub/shard", "bytes");
  }
  {
    AtomicOutputDir dir(out, false, {});
    EXPECT_EQ(dir.stale_removed(), std::vector<std::string>{stale});
    dir.commit();
  }
  EXPECT_FALSE(fs::exists(stale));
  for (const auto& d : {live, foreign, legacy, unrelated}) EXPECT_TRUE(fs::exists(d)) << d;
  EXPECT_TRUE(fs::is_directory(out));
}

// A replace interrupted between its two renames (final moved aside, new one not yet in place)
// is rolled back by the next run: the old output returns to the final path.
TEST(AtomicOutputDir, InterruptedReplaceIsRolledBack) {
  TempDir tmp;
  const std::string out = tmp / "model";
  OutputOwner gone = this_process_owner();
  gone.pid = dead_pid();
  const std::string old = out + ".moepack-old-" + tag_of(gone);
  fs::create_directories(old);
  write_text(old + "/f", "old");
  expect_error(ErrorCode::kOutputExists, [&] { AtomicOutputDir dir(out, false, {}); });
  EXPECT_EQ(read_text(out + "/f"), "old");
  EXPECT_FALSE(fs::exists(old));
  // Interrupted after both renames: the final path holds the new output, the old one goes.
  fs::create_directories(old);
  write_text(old + "/f", "older");
  { AtomicOutputDir dir(out, true, {}); }
  EXPECT_EQ(listing(tmp.path), std::vector<std::string>{"model"});
  EXPECT_EQ(read_text(out + "/f"), "old");
}

// A stale sibling named like an output moved aside, but a regular file (or a symlink): not
// something moepack made, so it is neither moved into place nor removed, and the output is made
// as if it were not there (issue 28: the next convert refused its own output as "exists").
TEST(AtomicOutputDir, StaleOldSiblingThatIsNoDirectoryIsIgnored) {
  TempDir tmp;
  const std::string out = tmp / "model";
  OutputOwner gone = this_process_owner();
  gone.pid = dead_pid();
  const std::string old_file = out + ".moepack-old-" + tag_of(gone);
  write_text(old_file, "not an output");
  gone.start += 1;
  const std::string old_link = out + ".moepack-old-" + tag_of(gone);
  fs::create_directory_symlink(tmp.path, old_link);
  {
    AtomicOutputDir dir(out, false, {});
    EXPECT_EQ(dir.stale_removed(), std::vector<std::string>{});
    write_text(dir.path() + "/f", "new");
    dir.commit();
  }
  EXPECT_EQ(read_text(out + "/f"), "new");
  EXPECT_EQ(read_text(old_file), "not an output");
  EXPECT_TRUE(fs::is_symlink(old_link));
  { AtomicOutputDir again(out, true, {}); }  // and again: the output is not "appeared"
  EXPECT_EQ(read_text(out + "/f"), "new");
}

// Any legal output name (up to NAME_MAX = 255 bytes) gets a temporary sibling that fits: a long
// name's siblings start with a shortened stem, which the stale-sibling scan matches too.
TEST(AtomicOutputDir, LongestLegalNameGetsATemporaryThatFits) {
  for (size_t len : {size_t{150}, size_t{180}, size_t{200}, size_t{255}}) {
    SCOPED_TRACE(len);
    TempDir tmp;
    const std::string name(len, 'n');
    const std::string out = tmp / name;
    {
      AtomicOutputDir dir(out, false, {});
      EXPECT_LE(fs::path(dir.path()).filename().string().size(), 255u);
      EXPECT_EQ(fs::path(dir.path()).filename().string().rfind(sibling_stem(name), 0), 0u);
      write_text(dir.path() + "/f", "v1");
      dir.commit();
    }
    {
      AtomicOutputDir dir(out, true, {});  // the replace's old sibling fits too
      write_text(dir.path() + "/f", "v2");
      dir.commit();
    }
    EXPECT_EQ(read_text(out + "/f"), "v2");
    EXPECT_EQ(listing(tmp.path), std::vector<std::string>{name});
    OutputOwner gone = this_process_owner();
    gone.pid = dead_pid();
    const std::string stale = tmp / (sibling_stem(name) + ".moepack-tmp-" + tag_of(gone));
    fs::create_directories(stale);
    AtomicOutputDir dir(out, true, {});
    EXPECT_EQ(dir.stale_removed(), std::vector<std::string>{stale});
  }
  EXPECT_EQ(sibling_stem("model"), "model");
  EXPECT_NE(sibling_stem(std::string(200, 'a')), sibling_stem(std::string(199, 'a') + "b"));
}

// A parent directory the output made (DST.parts/ of a --shard part) does not outlive a failed
// output when it is empty; one that holds something else stays.
TEST(AtomicOutputDir, CreatedParentIsRemovedWhenLeftEmpty) {
  TempDir tmp;
  { AtomicOutputDir dir(tmp / "dst.parts/0-of-2", false, {}); }
  EXPECT_EQ(listing(tmp.path), std::vector<std::string>{});
  {
    AtomicOutputDir done(tmp / "dst.parts/1-of-2", false, {});
    done.commit();
    AtomicOutputDir failed(tmp / "dst.parts/0-of-2", false, {});
  }
  EXPECT_EQ(listing(tmp / "dst.parts"), std::vector<std::string>{"1-of-2"});
  const pid_t pid = fork();  // the signal handler's way, in a child
  if (pid == 0) {
    AtomicOutputDir a(tmp / "other.parts/0-of-2", false, {});
    abandon_pending_outputs();
    _exit(fs::exists(tmp / "other.parts") ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// What a signal handler calls: every uncommitted output of the process is removed. Run in a
// child so that the table of this test process stays untouched.
TEST(AtomicOutputDir, AbandonPendingOutputsRemovesTemporaries) {
  TempDir tmp;
  const pid_t pid = fork();
  if (pid == 0) {
    AtomicOutputDir a(tmp / "a", false, {});
    AtomicOutputDir b(tmp / "b", false, {});
    fs::create_directories(a.path() + "/x/y");
    write_text(a.path() + "/x/y/f", "data");
    write_text(b.path() + "/g", "data");
    abandon_pending_outputs();
    _exit(fs::exists(a.path()) || fs::exists(b.path()) ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(listing(tmp.path), std::vector<std::string>{});
}

}  // namespace
}  // namespace moepack
