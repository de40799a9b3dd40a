#include "io/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace moepack {
using nlohmann::json;

namespace {

std::string errno_message(int err) {
  return std::error_code(err, std::generic_category()).message();
}

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "is a directory, not a file";
  if (S_ISFIFO(m)) return "is a FIFO, not a regular file";
  if (S_ISSOCK(m)) return "is a socket, not a regular file";
  if (S_ISCHR(m) || S_ISBLK(m)) return "is a device, not a regular file";
  return "not a regular file";
}

}  // namespace

PathKind regular_file_or_missing(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return PathKind::kMissing;
    if (err == ELOOP)
      throw Error(ErrorCode::kBadConfig, path, "", "symlink loop (" + errno_message(err) + ")");
    if (err == ENOTDIR || err == ENAMETOOLONG)
      throw Error(ErrorCode::kBadConfig, path, "", "cannot stat: " + errno_message(err));
    throw Error(ErrorCode::kIo, path, "", "cannot stat: " + errno_message(err));
  }
  if (!S_ISREG(st.st_mode)) throw Error(ErrorCode::kBadConfig, path, "", kind_of(st.st_mode));
  return PathKind::kRegular;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
  // Checked before opening (opening a FIFO for reading blocks until a writer appears) and again
  // on the descriptor (the path may have been replaced in between; O_NONBLOCK keeps even that
  // open from blocking).
  if (regular_file_or_missing(path) == PathKind::kMissing)
    throw Error(ErrorCode::kBadConfig, path, "", "not found");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP)
      throw Error(ErrorCode::kBadConfig, path, "", "symlink loop (" + errno_message(err) + ")");
    throw Error(ErrorCode::kIo, path, "", "cannot open: " + errno_message(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0)
    throw Error(ErrorCode::kIo, path, "", "cannot stat: " + errno_message(errno));
  if (!S_ISREG(st.st_mode)) throw Error(ErrorCode::kBadConfig, path, "", kind_of(st.st_mode));
  const auto too_large = [&](uint64_t n) {
    return Error(ErrorCode::kBadConfig, path, "",
                 "at least " + std::to_string(n) + " bytes: larger than the " +
                     std::to_string(max_bytes) + " bytes moepack reads from a JSON file");
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw too_large(static_cast<uint64_t>(st.st_size));
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  for (;;) {
    if (got == text.size()) {  // the file may have grown since fstat
      if (text.size() > max_bytes) throw too_large(text.size());
      text.resize(text.size() + 4096);
    }
    const ssize_t r = ::read(fd, &text[got], text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      throw Error(err == EISDIR ? ErrorCode::kBadConfig : ErrorCode::kIo, path, "",
                  "read failed: " + errno_message(err));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  text.resize(got);
  if (got > max_bytes) throw too_large(got);
  return text;
}

json parse_json_bounded(const std::string& text, const std::string& file, int max_depth) {
  try {
    return json::parse(text, [&](int depth, json::parse_event_t, json&) {
      if (depth > max_depth)
        throw Error(ErrorCode::kBadConfig, file, "",
                    "invalid JSON: nested more than " + std::to_string(max_depth) + " levels deep");
      return true;
    });
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kBadConfig, file, "", std::string("invalid JSON: ") + e.what());
  }
}

json read_json_file(const std::string& path, uint64_t max_bytes, int max_depth) {
  return parse_json_bounded(read_regular_file(path, max_bytes), path, max_depth);
}

}  // namespace moepack
