#include "io/atomic_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"

namespace moepack {
namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) {
  return std::string(std::strerror(err));
}

// Absolute, lexically normal, no trailing separator ("/a/b/" -> "/a/b").
fs::path normal_absolute(const std::string& p) {
  fs::path a = fs::absolute(fs::path(p)).lexically_normal();
  while (!a.has_filename() && a.has_relative_path()) a = a.parent_path();
  return a;
}

// Symlinks resolved for the part that exists (weakly_canonical), falling back to the normal
// absolute path if resolution fails (e.g. a permission error on a prefix).
fs::path resolved(const std::string& p) {
  const fs::path a = normal_absolute(p);
  std::error_code ec;
  fs::path c = fs::weakly_canonical(a, ec);
  if (ec) return a;
  while (!c.has_filename() && c.has_relative_path()) c = c.parent_path();
  return c;
}

// True when `outer` is `inner` or one of its ancestors, component by component (so "/a/bc" is
// not inside "/a/b"), or -- for paths that exist -- by inode, which also catches bind mounts
// and hard-linked directories.
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto oi = outer.begin();
  auto ii = inner.begin();
  bool prefix = true;
  for (; oi != outer.end(); ++oi, ++ii) {
    if (ii == inner.end() || *ii != *oi) {
      prefix = false;
      break;
    }
  }
  if (prefix) return true;
  std::error_code ec;
  if (!fs::exists(outer, ec)) return false;
  for (fs::path p = inner;; p = p.parent_path()) {
    if (fs::exists(p, ec) && fs::equivalent(p, outer, ec)) return true;
    if (p == p.parent_path() || p.empty()) break;
  }
  return false;
}

uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// The longest owner tag (new_owner_tag: 16 + 8 + 10 + 20 + 12 digits and 4 dashes) and the
// longest marker before it: a sibling's name is stem + marker + tag.
constexpr size_t kMaxTagChars = 16 + 8 + 10 + 20 + 12 + 4;
constexpr size_t kMarkerChars = sizeof(".moepack-tmp-") - 1;
constexpr size_t kNameMax = 255;  // NAME_MAX of Linux file systems

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s, '\0');
  return s;
}

// Field 22 (starttime) of /proc/<pid>/stat; nullopt when unreadable. The command name (field 2)
// may hold spaces and parentheses, so fields are counted after the last ')'.
std::optional<uint64_t> process_start_time(int64_t pid) {
  const std::string stat = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(rest >> field)) return std::nullopt;
  try {
    return static_cast<uint64_t>(std::stoull(field));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

OutputOwner make_this_process_owner() {
  OutputOwner o;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  char ns[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  const std::string machine = std::string(host) + '\n' + (n > 0 ? std::string(ns, n) : "");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a(machine)));
  o.machine = buf;
  std::string boot;
  for (char c : read_small_file("/proc/sys/kernel/random/boot_id"))
    if (std::isxdigit(static_cast<unsigned char>(c)) && boot.size() < 8)
      boot += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  o.boot = boot.size() == 8 ? boot : "00000000";
  o.pid = static_cast<int64_t>(::getpid());
  o.start = process_start_time(o.pid).value_or(0);
  return o;
}

bool all_hex(const std::string& s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 19 || (s.size() > 1 && s[0] == '0')) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

bool path_exists(const std::string& p) {
  std::error_code ec;
  return fs::symlink_status(p, ec).type() != fs::file_type::not_found;
}

// ---- the signal-time table of live outputs ----

enum SlotState : int {
  kFree = 0,
  kFilling,    // being set up: the handler skips it
  kWriting,    // temp is ours; remove it
  kOldAside,   // final was moved to old, temp not yet renamed: remove temp, move old back
  kOldToDrop,  // temp is the final output now: remove old
};

constexpr int kPendingSlots = 8;
struct PendingSlot {
  std::atomic<int> state{kFree};
  char temp[PATH_MAX];
  char final_path[PATH_MAX];
  char old[PATH_MAX];
  char created_parent[PATH_MAX];  // the parent this output created ("" when it existed)
};
PendingSlot g_pending[kPendingSlots];
static_assert(std::atomic<int>::is_always_lock_free, "read from signal handlers");

bool copy_path(char (&dst)[PATH_MAX], const std::string& src) {
  if (src.size() >= PATH_MAX) return false;
  std::memcpy(dst, src.c_str(), src.size() + 1);
  return true;
}

int claim_slot(const std::string& temp, const std::string& final_path,
               const std::string& created_parent) {
  for (int i = 0; i < kPendingSlots; ++i) {
    int expect = kFree;
    if (!g_pending[i].state.compare_exchange_strong(expect, kFilling)) continue;
    if (!copy_path(g_pending[i].temp, temp) || !copy_path(g_pending[i].final_path, final_path) ||
        !copy_path(g_pending[i].created_parent, created_parent)) {
      g_pending[i].state.store(kFree);
      return -1;
    }
    g_pending[i].old[0] = '\0';
    g_pending[i].state.store(kWriting, std::memory_order_release);
    return i;
  }
  return -1;  // more than kPendingSlots outputs at once: those are cleaned on exceptions only
}

void set_slot(int slot, int state) {
  if (slot >= 0) g_pending[slot].state.store(state, std::memory_order_release);
}

// Blocks the asynchronous termination signals in this thread while the table and the renames
// change together, so a handler never sees one without the other.
class TerminationSignalsBlocked {
 public:
  TerminationSignalsBlocked() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGXFSZ}) sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, &saved_);
  }
  ~TerminationSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  TerminationSignalsBlocked(const TerminationSignalsBlocked&) = delete;
  TerminationSignalsBlocked& operator=(const TerminationSignalsBlocked&) = delete;

 private:
  sigset_t saved_;
};

// DIRFD/NAME and everything below it, with async-signal-safe calls only: getdents64 into a
// stack buffer, unlinkat. Entries created meanwhile by other threads are caught by repeating.
void remove_tree_signal_safe(int dirfd, const char* name, int depth) {
  constexpr int kMaxDepth = 24;
  for (int pass = 0; pass < 8; ++pass) {
    if (::unlinkat(dirfd, name, 0) == 0 || errno == ENOENT) return;  // a file, or gone
    const int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    if (depth < kMaxDepth) {
      alignas(8) char buf[2048];
      for (;;) {
        const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (n <= 0) break;
        for (long off = 0; off < n;) {
          // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[]
          uint16_t reclen;
          std::memcpy(&reclen, buf + off + 16, sizeof reclen);
          const unsigned char type = static_cast<unsigned char>(buf[off + 18]);
          const char* entry = buf + off + 19;
          off += reclen;
          if (entry[0] == '.' && (entry[1] == '\0' || (entry[1] == '.' && entry[2] == '\0')))
            continue;
          if (type == DT_DIR || (::unlinkat(fd, entry, 0) != 0 && errno == EISDIR))
            remove_tree_signal_safe(fd, entry, depth + 1);
        }
      }
    }
    ::close(fd);
    if (::unlinkat(dirfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT) return;
  }
}

// Siblings of FINAL named NAME.moepack-tmp-TAG / NAME.moepack-old-TAG whose owner is gone:
// temporaries are removed; an old output is removed when the final path exists (the replace
// finished) and moved back to it otherwise (the replace was interrupted between its renames).
std::vector<std::string> remove_stale_siblings(const fs::path& final_path) {
  std::vector<std::string> done;
  const std::string base = sibling_stem(final_path.filename().string());
  const std::string tmp_prefix = base + ".moepack-tmp-", old_prefix = base + ".moepack-old-";
  std::error_code ec;
  std::vector<fs::path> olds;
  for (fs::directory_iterator it(final_path.parent_path(), ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const bool is_tmp = n.rfind(tmp_prefix, 0) == 0, is_old = n.rfind(old_prefix, 0) == 0;
    if (!is_tmp && !is_old) continue;
    // Every sibling moepack makes is a directory (a temporary output, or an output moved aside):
    // anything else with such a name is someone else's, never removed or moved into place.
    std::error_code st;
    if (it->symlink_status(st).type() != fs::file_type::directory) continue;
    const auto owner = parse_owner_tag(n.substr((is_tmp ? tmp_prefix : old_prefix).size()));
    if (!owner || owner_state(*owner) != OwnerState::kGone) continue;
    if (is_old) {
      olds.push_back(it->path());
      continue;
    }
    std::error_code rm;
    fs::remove_all(it->path(), rm);
    if (!rm) done.push_back(it->path().string());
  }
  for (const fs::path& old : olds) {
    std::error_code rm;
    if (path_exists(final_path.string()))
      fs::remove_all(old, rm);
    else
      fs::rename(old, final_path, rm);
    if (!rm) done.push_back(old.string());
  }
  return done;
}

void fsync_tree(const std::string& root) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; it != end; it.increment(ec)) {
    if (ec) throw Error(ErrorCode::kIo, root, "", "cannot list: " + ec.message());
    const fs::file_status st = it->symlink_status(ec);
    if (fs::is_regular_file(st) || fs::is_directory(st)) fsync_file(it->path().string());
  }
  if (ec) throw Error(ErrorCode::kIo, root, "", "cannot list: " + ec.message());
  fsync_file(root);
}

}  // namespace

std::string sibling_stem(const std::string& name) {
  if (name.size() + kMarkerChars + kMaxTagChars <= kNameMax) return name;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(name)));
  return name.substr(0, kNameMax - kMarkerChars - kMaxTagChars - 17) + "~" + hash;
}

const OutputOwner& this_process_owner() {
  static const OutputOwner owner = make_this_process_owner();
  return owner;
}

std::string new_owner_tag() {
  const OutputOwner& o = this_process_owner();
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s-%s-%lld-%llu-%012llx", o.machine.c_str(), o.boot.c_str(),
                static_cast<long long>(o.pid), static_cast<unsigned long long>(o.start),
                static_cast<unsigned long long>(r & 0xffffffffffffULL));
  return buf;
}

std::optional<OutputOwner> parse_owner_tag(const std::string& tag) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : tag) {
    if (c == '-') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  if (parts.size() != 5 || !all_hex(parts[0], 16) || !all_hex(parts[1], 8) ||
      !all_digits(parts[2]) || !all_digits(parts[3]) || !all_hex(parts[4], 12))
    return std::nullopt;
  OutputOwner o;
  o.machine = parts[0];
  o.boot = parts[1];
  try {
    o.pid = std::stoll(parts[2]);
    o.start = std::stoull(parts[3]);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (o.pid <= 0 || o.pid > INT_MAX) return std::nullopt;
  return o;
}

OwnerState owner_state(const OutputOwner& owner) {
  const OutputOwner& me = this_process_owner();
  if (owner.machine != me.machine || me.boot == "00000000" || me.start == 0)
    return OwnerState::kUnknown;
  if (owner.boot != me.boot) return OwnerState::kGone;  // every process of that boot is gone
  if (owner.pid == me.pid) return owner.start == me.start ? OwnerState::kAlive : OwnerState::kGone;
  // kill(pid, 0) sees processes /proc may hide (hidepid); ESRCH: no such process.
  if (::kill(static_cast<pid_t>(owner.pid), 0) != 0 && errno == ESRCH) return OwnerState::kGone;
  const auto start = process_start_time(owner.pid);
  if (start && *start != owner.start) return OwnerState::kGone;  // the pid was reused
  return OwnerState::kAlive;
}

void abandon_pending_outputs() noexcept {
  const int saved_errno = errno;
  for (PendingSlot& s : g_pending) {
    const int state = s.state.load(std::memory_order_acquire);
    if (state == kWriting || state == kOldAside) remove_tree_signal_safe(AT_FDCWD, s.temp, 0);
    if (state == kOldAside) ::rename(s.old, s.final_path);
    if (state == kOldToDrop) remove_tree_signal_safe(AT_FDCWD, s.old, 0);
    // A parent made for this output (DST.parts/ of a --shard part) goes too when nothing else
    // is in it; rmdir(2) refuses one that holds another part.
    if ((state == kWriting || state == kOldAside) && s.created_parent[0] != '\0')
      ::rmdir(s.created_parent);
  }
  errno = saved_errno;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const fs::path abs = normal_absolute(path);
  const std::string temp = (abs.parent_path() / (sibling_stem(abs.filename().string()) +
                                                 ".moepack-tmp-" + new_owner_tag()))
                               .string();
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(ErrorCode::kIo, path, "", "cannot create " + temp + ": " + errno_text(errno));
  int err = 0;
  for (size_t done = 0; done < text.size() && err == 0;) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      err = n < 0 ? errno : ENOSPC;
    else
      done += static_cast<size_t>(n);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(temp.c_str(), abs.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    throw Error(ErrorCode::kIo, path, "", "write failed: " + errno_text(err));
  }
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, path, "", "cannot open to fsync: " + errno_text(errno));
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(ErrorCode::kIo, path, "", "fsync failed: " + errno_text(err));
  }
  ::close(fd);
}

void check_output_not_aliasing(const std::string& output, const std::vector<std::string>& inputs) {
  const fs::path out = resolved(output);
  for (const std::string& in_str : inputs) {
    const fs::path in = resolved(in_str);
    if (is_within(out, in))
      throw Error(
          ErrorCode::kOutputAliasesInput, output, "",
          out == in ? "output is the input " + in_str : "output lies inside the input " + in_str);
    if (is_within(in, out))
      throw Error(
          ErrorCode::kOutputAliasesInput, output, "",
          "output contains the input " + in_str + " (replacing the output would destroy it)");
  }
}

AtomicOutputDir::AtomicOutputDir(const std::string& final_path, bool force,
                                 const std::vector<std::string>& input_paths)
    : force_(force) {
  if (final_path.empty()) throw Error(ErrorCode::kUsage, "", "", "empty output path");
  const fs::path abs = normal_absolute(final_path);
  if (!abs.has_filename() || abs.filename() == "." || abs.filename() == "..")
    throw Error(ErrorCode::kUsage, final_path, "", "output path has no directory name");
  check_output_not_aliasing(final_path, input_paths);

  // The parent is resolved but the last component is kept as is, so an output that is a
  // symlink is replaced as a link, never followed into its target.
  std::error_code ec;
  const bool parent_existed = path_exists(abs.parent_path().string());
  fs::create_directories(abs.parent_path(), ec);
  if (ec)
    throw Error(
        ErrorCode::kIo, final_path, "",
        "cannot create parent directory " + abs.parent_path().string() + ": " + ec.message());
  parent_ = resolved(abs.parent_path().string()).string();
  final_ = (fs::path(parent_) / abs.filename()).string();
  if (!parent_existed) created_parent_ = parent_;
  const std::string stem = (fs::path(parent_) / sibling_stem(abs.filename().string())).string();

  // Before the existence check: a stale old output moved back makes the final path exist again.
  stale_removed_ = remove_stale_siblings(final_);
  if (!force && path_exists(final_))
    throw Error(ErrorCode::kOutputExists, final_, "", "output exists (use --force to replace it)");

  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string t = stem + ".moepack-tmp-" + new_owner_tag();
    TerminationSignalsBlocked blocked;  // made and listed for the handlers together
    if (::mkdir(t.c_str(), 0755) == 0) {
      temp_ = t;
      slot_ = claim_slot(temp_, final_, created_parent_);
      return;
    }
    if (errno != EEXIST)
      throw Error(ErrorCode::kIo, final_, "",
                  "cannot create temporary directory " + t + ": " + errno_text(errno));
  }
  throw Error(ErrorCode::kIo, final_, "", "cannot find a free temporary directory name");
}

AtomicOutputDir::~AtomicOutputDir() {
  if (!committed_ && !temp_.empty()) {
    std::error_code ec;
    fs::remove_all(temp_, ec);
    if (!created_parent_.empty()) ::rmdir(created_parent_.c_str());  // only when empty
  }
  set_slot(slot_, kFree);
}

void AtomicOutputDir::commit() {
  if (committed_) throw Error(ErrorCode::kInternal, final_, "", "commit() called twice");
  fsync_tree(temp_);

  std::string old;
  {
    TerminationSignalsBlocked blocked;  // the renames and the handlers' table change together
    if (path_exists(final_)) {
      if (!force_)
        throw Error(ErrorCode::kOutputExists, final_, "",
                    "output appeared while converting (use --force to replace it)");
      old = (fs::path(parent_) / sibling_stem(fs::path(final_).filename().string())).string() +
            ".moepack-old-" + new_owner_tag();
      if (slot_ >= 0 && !copy_path(g_pending[slot_].old, old))
        throw Error(ErrorCode::kIo, final_, "", "path too long: " + old);
      if (::rename(final_.c_str(), old.c_str()) != 0)
        throw Error(ErrorCode::kIo, final_, "",
                    "cannot move the existing output aside: " + errno_text(errno));
      set_slot(slot_, kOldAside);
      if (::rename(temp_.c_str(), final_.c_str()) != 0) {
        const int err = errno;
        ::rename(old.c_str(), final_.c_str());  // put the old output back
        set_slot(slot_, kWriting);
        throw Error(ErrorCode::kIo, final_, "",
                    "cannot rename the new output into place: " + errno_text(err));
      }
      set_slot(slot_, kOldToDrop);
    } else {
      // NOREPLACE: plain rename(2) would silently replace an empty directory created meanwhile.
      int rc = ::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, final_.c_str(), RENAME_NOREPLACE);
      if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {  // filesystem without NOREPLACE
        rc = path_exists(final_) ? (errno = EEXIST, -1) : ::rename(temp_.c_str(), final_.c_str());
      }
      if (rc != 0) {
        if (errno == EEXIST || errno == ENOTEMPTY)
          throw Error(ErrorCode::kOutputExists, final_, "", "output appeared while converting");
        throw Error(ErrorCode::kIo, final_, "",
                    "cannot rename the output into place: " + errno_text(errno));
      }
      set_slot(slot_, kFree);
    }
    committed_ = true;
  }
  fsync_file(parent_);
  if (!old.empty()) {
    std::error_code ec;
    fs::remove_all(old, ec);
    set_slot(slot_, kFree);
    if (ec)
      throw Error(ErrorCode::kIo, final_, "",
                  "new output is in place but the replaced one at " + old +
                      " could not be removed: " + ec.message());
  }
}

}  // namespace moepack
