#include "io/atomic_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

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

std::string random_tag() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d-%012llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(r & 0xffffffffffffULL));
  return buf;
}

bool path_exists(const std::string& p) {
  std::error_code ec;
  return fs::symlink_status(p, ec).type() != fs::file_type::not_found;
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
  fs::create_directories(abs.parent_path(), ec);
  if (ec)
    throw Error(
        ErrorCode::kIo, final_path, "",
        "cannot create parent directory " + abs.parent_path().string() + ": " + ec.message());
  parent_ = resolved(abs.parent_path().string()).string();
  final_ = (fs::path(parent_) / abs.filename()).string();

  if (!force && path_exists(final_))
    throw Error(ErrorCode::kOutputExists, final_, "", "output exists (use --force to replace it)");

  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string t = final_ + ".moepack-tmp-" + random_tag();
    if (::mkdir(t.c_str(), 0755) == 0) {
      temp_ = t;
      return;
    }
    if (errno != EEXIST)
      throw Error(ErrorCode::kIo, final_, "",
                  "cannot create temporary directory " + t + ": " + errno_text(errno));
  }
  throw Error(ErrorCode::kIo, final_, "", "cannot find a free temporary directory name");
}

AtomicOutputDir::~AtomicOutputDir() {
  if (committed_ || temp_.empty()) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

void AtomicOutputDir::commit() {
  if (committed_) throw Error(ErrorCode::kInternal, final_, "", "commit() called twice");
  fsync_tree(temp_);

  std::string old;
  if (path_exists(final_)) {
    if (!force_)
      throw Error(ErrorCode::kOutputExists, final_, "",
                  "output appeared while converting (use --force to replace it)");
    old = final_ + ".moepack-old-" + random_tag();
    if (::rename(final_.c_str(), old.c_str()) != 0)
      throw Error(ErrorCode::kIo, final_, "",
                  "cannot move the existing output aside: " + errno_text(errno));
    if (::rename(temp_.c_str(), final_.c_str()) != 0) {
      const int err = errno;
      ::rename(old.c_str(), final_.c_str());  // put the old output back
      throw Error(ErrorCode::kIo, final_, "",
                  "cannot rename the new output into place: " + errno_text(err));
    }
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
  }
  committed_ = true;
  fsync_file(parent_);
  if (!old.empty()) {
    std::error_code ec;
    fs::remove_all(old, ec);
    if (ec)
      throw Error(ErrorCode::kIo, final_, "",
                  "new output is in place but the replaced one at " + old +
                      " could not be removed: " + ec.message());
  }
}

}  // namespace moepack
