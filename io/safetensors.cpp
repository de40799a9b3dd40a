// safetensors reader and writer. The reader applies the reference reader's rules
// (huggingface/safetensors `SafeTensors::read_metadata` + `Metadata::validate`,
// spec/checkpoints.md §4.3) to every file it opens, and closes the holes listed in §4.4:
// duplicate keys are refused (not last-wins), every size is overflow-checked, and the JSON is
// checked for NUL bytes and a BOM, which nlohmann's lexer would otherwise silently accept.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/error.h"

namespace moepack {

struct WriterLock {
  std::mutex mu;
};

namespace {

using json = nlohmann::json;

// docs/safetensors.schema.json caps every shape dimension at 2^48 - 1.
constexpr uint64_t kMaxDim = (uint64_t{1} << 48) - 1;

std::string errno_text(int err) {
  return std::string(std::strerror(err));
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Strict UTF-8 as Rust's std::str::from_utf8 checks it: no overlong forms, no surrogates
// (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequences. Returns the offset of the
// first bad byte, or `len` when valid.
size_t first_invalid_utf8(const uint8_t* s, size_t len) {
  size_t i = 0;
  while (i < len) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c == 0xE0) {
      n = 3, lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      n = 3;
    } else if (c == 0xED) {
      n = 3, hi = 0x9F;  // excludes surrogates
    } else if (c == 0xF0) {
      n = 4, lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
      n = 4;
    } else if (c == 0xF4) {
      n = 4, hi = 0x8F;  // <= U+10FFFF
    } else {
      return i;
    }
    if (len - i < n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < n; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    i += n;
  }
  return len;
}

struct ParsedEntry {
  std::string name;
  bool have_dtype = false, have_shape = false, have_offsets = false;
  std::string dtype;
  Shape shape;
  std::vector<uint64_t> offsets;
};

// A schema-aware SAX handler: builds the entries directly (no generic DOM, so a 100 MB header
// costs at most ~8 bytes per number, as in the reference reader) and records the first
// semantic error in document order while letting the parser finish, so that a syntax error
// anywhere in the header still reports as invalid JSON.
//
// Depth: 0 = outside the root, 1 = root object, 2 = an entry / __metadata__ object,
// 3 = a shape / data_offsets array. Anything we do not interpret (unknown entry fields, or
// values where they are not allowed) is skipped by counting nesting in `skip_`.
class HeaderSax {
 public:
  std::vector<ParsedEntry> entries;
  std::map<std::string, std::string> metadata;
  bool have_error = false;
  ErrorCode error_code = ErrorCode::kInvalidHeaderLayout;
  std::string error_tensor, error_message;
  bool syntax_error = false;
  std::string syntax_message;
  bool root_not_object = false;

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number(static_cast<uint64_t>(v));
    return scalar("a negative number");
  }
  bool number_unsigned(json::number_unsigned_t v) { return number(v); }
  bool number_float(json::number_float_t, const std::string&) {
    return scalar("a non-integer number");
  }
  bool binary(json::binary_t&) { return scalar("binary"); }
  bool string(std::string& s) {
    if (skip_ > 0) return true;
    if (depth_ == 2 && in_metadata_) {
      metadata[meta_key_] = s;
      return true;
    }
    if (depth_ == 2 && field_ == Field::kDtype) {
      cur().dtype = s;
      cur().have_dtype = true;
      return true;
    }
    return scalar("a string");
  }

  bool start_object(std::size_t) {
    if (skip_ > 0) return ++skip_, true;
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ == 1) {
      depth_ = 2;
      if (top_key_ == "__metadata__") {
        in_metadata_ = true;
        seen_fields_.clear();
        return true;
      }
      entries.emplace_back();
      entries.back().name = top_key_;
      seen_fields_.clear();
      return true;
    }
    return container("an object");
  }
  bool end_object() {
    if (skip_ > 0) return --skip_, true;
    if (depth_ == 2) {
      if (in_metadata_) {
        in_metadata_ = false;
      } else {
        const ParsedEntry& e = cur();
        if (!e.have_dtype || !e.have_shape || !e.have_offsets)
          fail(ErrorCode::kInvalidHeaderLayout, e.name,
               std::string("entry lacks ") + (!e.have_dtype   ? "\"dtype\""
                                              : !e.have_shape ? "\"shape\""
                                                              : "\"data_offsets\""));
      }
    }
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    if (skip_ > 0) return ++skip_, true;
    if (depth_ == 0) {
      root_not_object = true;
      skip_ = 1;
      return true;
    }
    if (depth_ == 2 && !in_metadata_ && (field_ == Field::kShape || field_ == Field::kOffsets)) {
      depth_ = 3;
      if (field_ == Field::kShape) cur().have_shape = true;
      if (field_ == Field::kOffsets) cur().have_offsets = true;
      return true;
    }
    return container("an array");
  }
  bool end_array() {
    if (skip_ > 0) return --skip_, true;
    // depth_ == 3: closing a shape / data_offsets array.
    if (field_ == Field::kOffsets && cur().offsets.size() != 2)
      fail(ErrorCode::kInvalidHeaderLayout, cur().name,
           "\"data_offsets\" must hold exactly 2 integers, got " +
               std::to_string(cur().offsets.size()));
    depth_ = 2;
    return true;
  }

  bool key(std::string& k) {
    if (skip_ > 0) return true;
    if (depth_ == 1) {
      if (!top_keys_.insert(k).second) {
        if (k == "__metadata__")
          fail(ErrorCode::kInvalidHeaderLayout, "", "duplicate \"__metadata__\" key");
        else
          fail(ErrorCode::kDuplicateTensor, k,
               "tensor name appears more than once in the header (refusing last-wins)");
      }
      top_key_ = k;
      return true;
    }
    // depth_ == 2
    if (!seen_fields_.insert(k).second)
      fail(ErrorCode::kInvalidHeaderLayout, in_metadata_ ? "" : cur().name,
           std::string(in_metadata_ ? "__metadata__" : "entry") + " has key \"" + k +
               "\" more than once");
    if (in_metadata_) {
      meta_key_ = k;
      return true;
    }
    field_ = k == "dtype"          ? Field::kDtype
             : k == "shape"        ? Field::kShape
             : k == "data_offsets" ? Field::kOffsets
                                   : Field::kOther;
    return true;
  }

  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& ex) {
    syntax_error = true;
    syntax_message = "byte " + std::to_string(pos) + " of the header: " + ex.what();
    return false;
  }

 private:
  enum class Field { kDtype, kShape, kOffsets, kOther };

  ParsedEntry& cur() { return entries.back(); }

  void fail(ErrorCode code, const std::string& tensor, const std::string& message) {
    if (have_error) return;
    have_error = true;
    error_code = code;
    error_tensor = tensor;
    error_message = message;
  }

  // What the value at the current position is allowed to be, for error messages.
  std::string where() const {
    if (depth_ == 1) return top_key_ == "__metadata__" ? "\"__metadata__\"" : "entry";
    if (in_metadata_) return "__metadata__ value \"" + meta_key_ + "\"";
    if (depth_ == 3)
      return field_ == Field::kShape ? "\"shape\" element" : "\"data_offsets\" element";
    switch (field_) {
      case Field::kDtype:
        return "\"dtype\"";
      case Field::kShape:
        return "\"shape\"";
      case Field::kOffsets:
        return "\"data_offsets\"";
      default:
        return "";
    }
  }
  const char* expected() const {
    if (depth_ == 1) return "an object";
    if (in_metadata_) return "a string";
    if (depth_ == 3) return "a non-negative integer";
    switch (field_) {
      case Field::kDtype:
        return "a string";
      case Field::kShape:
      case Field::kOffsets:
        return "an array";
      default:
        return "anything";
    }
  }
  std::string tensor_here() const {
    if (depth_ == 1) return top_key_ == "__metadata__" ? "" : top_key_;
    if (in_metadata_) return "";
    return entries.empty() ? "" : entries.back().name;
  }

  // A scalar that is not a string / accepted number.
  bool scalar(const char* what) {
    if (skip_ > 0) return true;
    if (depth_ == 0) {
      root_not_object = true;
      return true;
    }
    // "__metadata__": null is the reference's Option::None.
    if (depth_ == 1 && top_key_ == "__metadata__" && std::string(what) == "null") return true;
    if (depth_ == 2 && !in_metadata_ && field_ == Field::kOther) return true;
    fail(ErrorCode::kInvalidHeaderLayout, tensor_here(),
         where() + " must be " + expected() + ", got " + what);
    return true;
  }
  bool number(uint64_t v) {
    if (skip_ > 0) return true;
    if (depth_ == 3) {
      if (field_ == Field::kShape) {
        if (v > kMaxDim)
          fail(ErrorCode::kInvalidHeaderLayout, cur().name,
               "shape dimension " + std::to_string(v) + " exceeds 2^48-1");
        else
          cur().shape.push_back(static_cast<int64_t>(v));
      } else {
        cur().offsets.push_back(v);
      }
      return true;
    }
    return scalar("a number");
  }
  bool container(const char* what) {
    // Unknown entry fields may hold anything (the reference ignores them).
    if (!(depth_ == 2 && !in_metadata_ && field_ == Field::kOther))
      fail(ErrorCode::kInvalidHeaderLayout, tensor_here(),
           where() + " must be " + expected() + ", got " + what);
    skip_ = 1;
    return true;
  }

  int depth_ = 0;
  uint64_t skip_ = 0;
  bool in_metadata_ = false;
  Field field_ = Field::kOther;
  std::string top_key_, meta_key_;
  std::set<std::string> top_keys_, seen_fields_;
};

void write_all_at(int fd, const uint8_t* data, uint64_t len, uint64_t offset,
                  const std::string& path, const std::string& tensor) {
  while (len > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(len, uint64_t{1} << 30));
    const ssize_t n = ::pwrite(fd, data, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kIo, path, tensor, "pwrite failed: " + errno_text(errno));
    }
    if (n == 0) throw Error(ErrorCode::kIo, path, tensor, "pwrite wrote nothing");
    data += n;
    len -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept {
  *this = std::move(o);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this == &o) return *this;
  if (mapped_ && base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  path_ = std::move(o.path_);
  base_ = o.base_;
  size_ = o.size_;
  header_len_ = o.header_len_;
  mapped_ = o.mapped_;
  owned_ = std::move(o.owned_);
  if (!mapped_) base_ = owned_.data();  // vector move keeps the buffer, but be explicit
  entries_ = std::move(o.entries_);
  index_ = std::move(o.index_);
  metadata_ = std::move(o.metadata_);
  o.base_ = nullptr;
  o.size_ = 0;
  o.mapped_ = false;
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapped_ && base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused as not a regular file
  // below); it changes nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    throw Error(err == ELOOP ? ErrorCode::kBadConfig : ErrorCode::kIo, path, "",
                (err == ELOOP ? "symlink loop: " : "cannot open: ") + errno_text(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(ErrorCode::kIo, path, "", "cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    // What the path is, not the environment, is wrong: an input error, as for a JSON input
    // (io/json_file.h), never an I/O error a pipeline would retry.
    ::close(fd);
    throw Error(ErrorCode::kBadConfig, path, "",
                S_ISDIR(st.st_mode)    ? "is a directory, not a file"
                : S_ISFIFO(st.st_mode) ? "is a FIFO, not a regular file"
                                       : "not a regular file");
  }
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ < 8) {
    ::close(fd);
    throw Error(
        ErrorCode::kHeaderTooSmall, path, "",
        "file is " + std::to_string(f.size_) + " bytes, shorter than the 8-byte header length");
  }
  // MAP_PRIVATE + PROT_READ: we never write through the mapping. (A file truncated by someone
  // else while mapped can still SIGBUS; outputs are written to temp dirs and renamed, never
  // truncated in place.)
  void* p = ::mmap(nullptr, static_cast<size_t>(f.size_), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw Error(ErrorCode::kIo, path, "", "mmap failed: " + errno_text(err));
  f.base_ = static_cast<const uint8_t*>(p);
  f.mapped_ = true;
  f.parse_and_validate();  // on throw, ~SafetensorsFile unmaps
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes, const std::string& label) {
  SafetensorsFile f;
  f.path_ = label;
  f.owned_ = std::move(bytes);
  f.base_ = f.owned_.data();
  f.size_ = f.owned_.size();
  f.parse_and_validate();
  return f;
}

namespace {

// Steps 1 and 2 of parse_and_validate: the 8-byte length prefix, within the limit and the file.
uint64_t checked_header_length(const uint8_t* base, uint64_t size, const std::string& file) {
  if (size < 8)
    throw Error(
        ErrorCode::kHeaderTooSmall, file, "",
        "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  const uint64_t n = read_u64_le(base);
  if (n > kMaxSafetensorsHeader)
    throw Error(ErrorCode::kHeaderTooLarge, file, "",
                "header length " + std::to_string(n) + " exceeds the limit of " +
                    std::to_string(kMaxSafetensorsHeader) + " bytes");
  // 8 + N <= file size (n <= 1e8 so 8 + n cannot overflow; compare without adding anyway).
  if (n > size - 8)
    throw Error(ErrorCode::kInvalidHeaderLength, file, "",
                "header length " + std::to_string(n) + " runs past the end of the " +
                    std::to_string(size) + "-byte file");
  return n;
}

// Step 3: UTF-8, then JSON, into `sax`. NUL and a BOM are checked here because nlohmann's lexer
// treats NUL as end of input (which would let bytes after it be smuggled) and skips a leading
// BOM, while the reference's serde_json rejects both.
void parse_header_json(const uint8_t* hdr, size_t hlen, const std::string& file, HeaderSax& sax) {
  const size_t bad = first_invalid_utf8(hdr, hlen);
  if (bad != hlen)
    throw Error(ErrorCode::kInvalidHeaderUtf8, file, "",
                "header is not valid UTF-8 at byte " + std::to_string(bad) + " of the header");
  if (const void* nul = std::memchr(hdr, 0, hlen))
    throw Error(ErrorCode::kInvalidHeaderJson, file, "",
                "header contains a NUL byte at byte " +
                    std::to_string(static_cast<const uint8_t*>(nul) - hdr) + " of the header");
  if (hlen >= 3 && hdr[0] == 0xEF && hdr[1] == 0xBB && hdr[2] == 0xBF)
    throw Error(ErrorCode::kInvalidHeaderJson, file, "", "header starts with a byte order mark");

  const char* jb = reinterpret_cast<const char*>(hdr);
  json::sax_parse(jb, jb + hlen, &sax, json::input_format_t::json, /*strict=*/true,
                  /*ignore_comments=*/false);
  if (sax.syntax_error)
    throw Error(ErrorCode::kInvalidHeaderJson, file, "",
                "header is not valid JSON: " + sax.syntax_message);
  if (sax.root_not_object)
    throw Error(ErrorCode::kInvalidHeaderJson, file, "", "header JSON is not an object");
  if (sax.have_error) throw Error(sax.error_code, file, sax.error_tensor, sax.error_message);
}

// Step 4: the entries with their dtypes, in header order (so the first bad entry in the file is
// the one named).
std::vector<SafetensorsEntry> typed_entries(std::vector<ParsedEntry>& parsed,
                                            const std::string& file) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(parsed.size());
  for (ParsedEntry& pe : parsed) {
    const auto dt = parse_dtype(pe.dtype);
    if (!dt)
      throw Error(ErrorCode::kUnknownDtype, file, pe.name, "unknown dtype \"" + pe.dtype + "\"");
    SafetensorsEntry e;
    e.name = std::move(pe.name);
    e.dtype = *dt;
    e.shape = std::move(pe.shape);
    e.begin = pe.offsets[0];
    e.end = pe.offsets[1];
    entries.push_back(std::move(e));
  }
  return entries;
}

// The exact byte size of one entry's data: prod(shape) * bits / 8, all with checked arithmetic.
uint64_t checked_data_bytes(const SafetensorsEntry& e, const std::string& file) {
  uint64_t elems = 1;
  for (int64_t d : e.shape) {
    const uint64_t ud = static_cast<uint64_t>(d);
    if (ud != 0 && elems > UINT64_MAX / ud)
      throw Error(ErrorCode::kValidationOverflow, file, e.name,
                  "element count of shape " + shape_str(e.shape) + " overflows 64 bits");
    elems *= ud;
  }
  const uint64_t bits = static_cast<uint64_t>(dtype_bits(e.dtype));
  if (elems != 0 && elems > UINT64_MAX / bits)
    throw Error(ErrorCode::kValidationOverflow, file, e.name,
                "bit count of shape " + shape_str(e.shape) + " x " + dtype_name(e.dtype) +
                    " overflows 64 bits");
  const uint64_t total_bits = elems * bits;
  if (total_bits % 8 != 0)
    throw Error(ErrorCode::kTensorInvalidInfo, file, e.name,
                std::to_string(elems) + " elements of " + dtype_name(e.dtype) + " are " +
                    std::to_string(total_bits) + " bits, not a whole number of bytes");
  return total_bits / 8;
}

// Step 5: offsets and sizes in data order, as Metadata::validate walks them: each tensor must
// start where the previous ended (the first at 0), END >= BEGIN, and END - BEGIN must be exactly
// its data bytes. Sorts `entries` into data order; returns where the last one ends.
uint64_t check_data_offsets(std::vector<SafetensorsEntry>& entries, const std::string& file) {
  // Stable: tensors with equal offsets (zero-size ones) keep their header order.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
                   });
  uint64_t expected_begin = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.begin != expected_begin || e.end < e.begin) {
      std::string why;
      if (e.end < e.begin)
        why = "ends before it begins";
      else if (e.begin > expected_begin)
        why = expected_begin == 0 ? "does not start at 0 (the first tensor must)"
                                  : "leaves a gap after the previous tensor";
      else
        why = "overlaps the previous tensor";
      throw Error(ErrorCode::kInvalidOffset, file, e.name,
                  "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] " +
                      why + " (expected begin " + std::to_string(expected_begin) + ")");
    }
    const uint64_t bytes = checked_data_bytes(e, file);
    if (e.end - e.begin != bytes)
      throw Error(ErrorCode::kTensorInvalidInfo, file, e.name,
                  "data_offsets span " + std::to_string(e.end - e.begin) + " bytes but " +
                      dtype_name(e.dtype) + " " + shape_str(e.shape) + " needs " +
                      std::to_string(bytes));
    expected_begin = e.end;
  }
  return expected_begin;
}

}  // namespace

void SafetensorsFile::parse_and_validate() {
  const std::string& file = path_;
  // 1-2. The length prefix.
  const uint64_t n = checked_header_length(base_, size_, file);
  header_len_ = n;
  // 3. UTF-8, then JSON.
  HeaderSax sax;
  parse_header_json(base_ + 8, static_cast<size_t>(n), file, sax);
  // 4. Dtypes.
  std::vector<SafetensorsEntry> entries = typed_entries(sax.entries, file);
  // 5. Offsets and sizes.
  const uint64_t data_end = check_data_offsets(entries, file);
  // 6. The data section is exactly the tensors: no trailing bytes, nothing missing.
  const uint64_t data_len = size_ - 8 - n;
  if (data_end != data_len)
    throw Error(ErrorCode::kMetadataIncompleteBuffer, file,
                entries.empty() ? "" : entries.back().name,
                "tensors cover " + std::to_string(data_end) + " bytes but the data section holds " +
                    std::to_string(data_len));

  entries_ = std::move(entries);
  metadata_ = std::move(sax.metadata);
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

TensorView SafetensorsFile::view(const SafetensorsEntry& e) const {
  TensorView v;
  v.name = e.name;
  v.dtype = e.dtype;
  v.shape = e.shape;
  v.data = base_ + 8 + header_len_ + e.begin;
  v.nbytes = e.end - e.begin;
  return v;
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) throw Error(ErrorCode::kMissingTensor, path_, name, "tensor not found");
  return view(*e);
}

// ---------------------------------------------------------------------------------------------
// Writer

std::vector<uint8_t> build_safetensors_header(const std::vector<SafetensorsEntry>& layout_in,
                                              const std::map<std::string, std::string>& metadata,
                                              std::vector<SafetensorsEntry>* layout_out) {
  // JSON is assembled by hand so the key order is ours (__metadata__ first, then tensors in the
  // given order); nlohmann only escapes the strings. dump() throws on invalid UTF-8.
  auto quote = [](const std::string& s, const std::string& tensor) {
    try {
      return json(s).dump();
    } catch (const json::exception& ex) {
      throw Error(ErrorCode::kBadValue, "", tensor, std::string("not valid UTF-8: ") + ex.what());
    }
  };
  std::string js = "{\"__metadata__\":{\"format\":";
  const auto fmt = metadata.find("format");
  js += quote(fmt == metadata.end() ? std::string("pt") : fmt->second, "__metadata__");
  for (const auto& [k, v] : metadata) {
    if (k == "format") continue;
    js += "," + quote(k, "__metadata__") + ":" + quote(v, "__metadata__");
  }
  js += "}";

  std::vector<SafetensorsEntry> out;
  out.reserve(layout_in.size());
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const SafetensorsEntry& in : layout_in) {
    if (in.name == "__metadata__")
      throw Error(ErrorCode::kBadValue, "", in.name, "reserved name cannot be a tensor");
    if (!names.insert(in.name).second)
      throw Error(ErrorCode::kBadValue, "", in.name, "tensor name given twice");
    uint64_t elems = 1;
    for (int64_t d : in.shape) {
      if (d < 0 || static_cast<uint64_t>(d) > kMaxDim)
        throw Error(ErrorCode::kBadShape, "", in.name,
                    "bad dimension in shape " + shape_str(in.shape));
      if (d != 0 && elems > UINT64_MAX / static_cast<uint64_t>(d))
        throw Error(ErrorCode::kValidationOverflow, "", in.name,
                    "shape " + shape_str(in.shape) + " overflows");
      elems *= static_cast<uint64_t>(d);
    }
    const auto bytes = dtype_bytes(in.dtype, elems);
    if (!bytes)
      throw Error(ErrorCode::kTensorInvalidInfo, "", in.name,
                  std::string(dtype_name(in.dtype)) + " " + shape_str(in.shape) +
                      " is not a whole number of bytes (or overflows)");
    if (offset > UINT64_MAX - *bytes)
      throw Error(ErrorCode::kValidationOverflow, "", in.name, "total data size overflows");
    SafetensorsEntry e = in;
    e.begin = offset;
    e.end = offset + *bytes;
    offset = e.end;
    js += "," + quote(e.name, e.name) + ":{\"dtype\":\"" + dtype_name(e.dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) js += (i ? "," : "") + std::to_string(e.shape[i]);
    js += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
    out.push_back(std::move(e));
  }
  js += "}";
  // Pad with spaces so the data section starts 8-aligned (8 + N ≡ 0 mod 8), like the
  // reference writer.
  js.append((8 - js.size() % 8) % 8, ' ');
  if (js.size() > kMaxSafetensorsHeader)
    throw Error(ErrorCode::kHeaderTooLarge, "", "",
                "header of " + std::to_string(js.size()) + " bytes exceeds the limit of " +
                    std::to_string(kMaxSafetensorsHeader));

  std::vector<uint8_t> hdr(8 + js.size());
  const uint64_t n = js.size();
  for (int i = 0; i < 8; ++i) hdr[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(hdr.data() + 8, js.data(), js.size());
  if (layout_out) *layout_out = std::move(out);
  return hdr;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path,
                                     const std::vector<SafetensorsEntry>& layout,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), lock_(std::make_unique<WriterLock>()) {
  std::vector<uint8_t> hdr;
  try {
    hdr = build_safetensors_header(layout, metadata, &layout_);
  } catch (const Error& e) {
    throw Error(e.code(), path, e.tensor(), e.message());
  }
  data_start_ = hdr.size();
  const uint64_t data_len = layout_.empty() ? 0 : layout_.back().end;
  if (data_len > UINT64_MAX - data_start_)
    throw Error(ErrorCode::kValidationOverflow, path, "", "file size overflows");
  file_size_ = data_start_ + data_len;
  for (size_t i = 0; i < layout_.size(); ++i) index_[layout_[i].name] = i;
  written_.assign(layout_.size(), 0);

  fd_ = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(ErrorCode::kIo, path, "", "cannot create: " + errno_text(errno));
  try {
    write_all_at(fd_, hdr.data(), hdr.size(), 0, path_, "");
    // Sets the final size up front (sparse), so tensors can be pwritten in any order.
    if (::ftruncate(fd_, static_cast<off_t>(file_size_)) != 0)
      throw Error(ErrorCode::kIo, path, "",
                  "cannot size to " + std::to_string(file_size_) + " bytes: " + errno_text(errno));
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::write(const std::string& name, const void* data, uint64_t len,
                              uint64_t offset) {
  const auto it = index_.find(name);
  if (it == index_.end())
    throw Error(ErrorCode::kInternal, path_, name, "tensor is not in the writer's layout");
  const SafetensorsEntry& e = layout_[it->second];
  const uint64_t size = e.end - e.begin;
  if (offset > size || len > size - offset)
    throw Error(ErrorCode::kInternal, path_, name,
                "write of " + std::to_string(len) + " bytes at " + std::to_string(offset) +
                    " exceeds the tensor's " + std::to_string(size) + " bytes");
  int fd;
  {
    std::lock_guard<std::mutex> g(lock_->mu);
    if (fd_ < 0) throw Error(ErrorCode::kInternal, path_, name, "write after finish()");
    fd = fd_;
    // Disjoint writes can never add up to more than the tensor; more means a range was
    // written twice, which a later finish() could otherwise mistake for completeness.
    if (written_[it->second] + len > size)
      throw Error(ErrorCode::kInternal, path_, name, "bytes written more than once");
    written_[it->second] += len;
  }
  write_all_at(fd, static_cast<const uint8_t*>(data), len, data_start_ + e.begin + offset, path_,
               name);
}

void SafetensorsWriter::start_writeback() {
  int fd;
  {
    std::lock_guard<std::mutex> g(lock_->mu);
    fd = fd_;
  }
#ifdef __linux__
  // Offset 0, length 0: the whole file. Pages already under writeback are skipped, not waited on.
  if (fd >= 0) (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#else
  (void)fd;
#endif
}

void SafetensorsWriter::finish() {
  std::lock_guard<std::mutex> g(lock_->mu);
  if (fd_ < 0) throw Error(ErrorCode::kInternal, path_, "", "finish() called twice");
  for (size_t i = 0; i < layout_.size(); ++i) {
    const uint64_t size = layout_[i].end - layout_[i].begin;
    if (written_[i] != size)
      throw Error(ErrorCode::kInternal, path_, layout_[i].name,
                  "only " + std::to_string(written_[i]) + " of " + std::to_string(size) +
                      " bytes were written");
  }
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(ErrorCode::kIo, path_, "", "fsync failed: " + errno_text(err));
  }
  if (::close(fd) != 0)
    throw Error(ErrorCode::kIo, path_, "", "close failed: " + errno_text(errno));
}

void write_safetensors(const std::string& path, const std::vector<Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> layout;
  layout.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    SafetensorsEntry e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.shape;
    layout.push_back(std::move(e));
  }
  SafetensorsWriter w(path, layout, metadata);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsEntry& e = w.layout()[i];
    if (tensors[i].data.size() != e.end - e.begin)
      throw Error(ErrorCode::kInternal, path, e.name,
                  "holds " + std::to_string(tensors[i].data.size()) + " bytes but " +
                      dtype_name(e.dtype) + " " + shape_str(e.shape) + " needs " +
                      std::to_string(e.end - e.begin));
    w.write(tensors[i]);
  }
  w.finish();
}

}  // namespace moepack
