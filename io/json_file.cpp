#include "io/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
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

namespace {

// The whole file, at most max_bytes of it.
std::string read_regular_file(const std::string& path, const std::string& if_missing,
                              uint64_t max_bytes) {
  // Checked before opening (opening a FIFO for reading blocks until a writer appears) and again
  // on the descriptor (the path may have been replaced in between; O_NONBLOCK keeps even that
  // open from blocking).
  if (regular_file_or_missing(path) == PathKind::kMissing)
    throw Error(ErrorCode::kBadConfig, path, "", if_missing);
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

}  // namespace

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

json read_json_file(const std::string& path, const JsonFileRules& rules) {
  return parse_json_bounded(read_regular_file(path, rules.if_missing, rules.max_bytes), path,
                            rules.max_depth);
}

// ---- JsonField ----

std::string json_excerpt(const json& j) {
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  std::string s = j.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

void JsonField::fail(const std::string& what) const {
  throw Error(ErrorCode::kBadConfig, file_, "",
              (path_.empty() ? "top level" : path_) + ": " + what);
}

void JsonField::expect_object() const {
  if (!j_.is_object()) fail("expected an object, got " + json_excerpt(j_));
}

bool JsonField::has(const char* key) const {
  expect_object();
  return j_.contains(key);
}

JsonField JsonField::operator[](const char* key) const {
  expect_object();
  const std::string p = path_.empty() ? std::string(key) : path_ + "." + key;
  const auto it = j_.find(key);
  if (it == j_.end()) throw Error(ErrorCode::kBadConfig, file_, "", p + ": missing");
  return JsonField(*it, p, file_);
}

JsonField JsonField::member(const std::string& key) const {
  return JsonField(j_.at(key), path_ + "[" + json_excerpt(json(key)) + "]", file_);
}

size_t JsonField::array_size() const {
  if (!j_.is_array()) fail("expected an array, got " + json_excerpt(j_));
  return j_.size();
}

JsonField JsonField::item(size_t i) const {
  return JsonField(j_[i], path_ + "[" + std::to_string(i) + "]", file_);
}

std::string JsonField::str() const {
  if (!j_.is_string()) fail("expected a string, got " + json_excerpt(j_));
  return j_.get<std::string>();
}

std::string JsonField::nonempty_str() const {
  std::string s = str();
  if (s.empty()) fail("must not be empty");
  return s;
}

bool JsonField::boolean() const {
  if (!j_.is_boolean()) fail("expected true or false, got " + json_excerpt(j_));
  return j_.get<bool>();
}

int64_t JsonField::integer(int64_t lo, int64_t hi) const {
  if (!j_.is_number_integer()) fail("expected an integer, got " + json_excerpt(j_));
  const bool too_big = j_.is_number_unsigned() && j_.get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t v = too_big ? hi : j_.get<int64_t>();
  if (too_big || v < lo || v > hi)
    fail((hi == INT64_MAX
              ? "must be >= " + std::to_string(lo)
              : "must be between " + std::to_string(lo) + " and " + std::to_string(hi)) +
         ", got " + json_excerpt(j_));
  return v;
}

uint64_t JsonField::size() const {
  if (!j_.is_number_integer()) fail("expected a non-negative integer, got " + json_excerpt(j_));
  if (!j_.is_number_unsigned() && j_.get<int64_t>() < 0)
    fail("must be non-negative, got " + json_excerpt(j_));
  return j_.get<uint64_t>();
}

std::vector<std::string> JsonField::strings() const {
  std::vector<std::string> out(array_size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = item(i).str();
  return out;
}

DType JsonField::dtype() const {
  const std::string s = str();
  const auto d = parse_dtype(s);
  // Only the canonical spelling: verify compares dtypes by name.
  if (!d || dtype_name(*d) != s) fail("unknown dtype " + json_excerpt(j_));
  return *d;
}

}  // namespace moepack
