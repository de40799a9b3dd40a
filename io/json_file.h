// The one reader of untrusted JSON files -- config.json and the side quantization configs
// (model/hf_config.cpp), the safetensors index (io/safetensors_index.cpp), moepack.json
// (pipeline/manifest.cpp), the part.json of `convert --shard` parts (pipeline/parts.cpp) and the
// index of a converted checkpoint (verify/verify.cpp) -- and the typed walk over what it read.
//
// read_json_file opens the path as a regular file only (a FIFO, socket or device is refused
// without blocking; a directory or a symlink loop is an input error), reads up to a byte cap and
// parses with a nesting cap (invalid UTF-8 and trailing bytes are syntax errors) into one
// nlohmann value. JsonField then reads that value field by field, each failure naming the file
// and the field's path ("layers[0].experts: expected an integer, got \"4\""). Every failure is
// an Error -- kBadConfig for the file's content or kind, kIo when it cannot be read -- naming
// the file; none is a bare nlohmann exception.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace moepack {

// A real config.json is a few KB and nests about 6 deep (quantization_config.config_groups.
// group_0.weights...); a 1M-tensor index is about 100 MB. The caps only stop hostile files:
// nlohmann's parser is iterative, but copying, comparing and printing a value recurse.
constexpr uint64_t kMaxJsonFileBytes = 256ull << 20;
constexpr int kMaxJsonDepth = 64;

// How one kind of JSON file is read.
struct JsonFileRules {
  // The message when the path does not exist (kBadConfig naming the file).
  std::string if_missing = "not found";
  uint64_t max_bytes = kMaxJsonFileBytes;
  int max_depth = kMaxJsonDepth;
};

// The parsed file: kBadConfig for a missing path (rules.if_missing), a path that is not a regular
// file, one over rules.max_bytes, invalid JSON or nesting beyond rules.max_depth; kIo when it
// cannot be opened or read.
nlohmann::json read_json_file(const std::string& path, const JsonFileRules& rules = {});

// What the path is, without following it into a block: regular file, missing, or an input error
// (kBadConfig: directory, FIFO, device, socket, symlink loop) / kIo (permission, other errno).
// For callers that treat a missing file as "absent" before reading it.
enum class PathKind { kMissing, kRegular };
PathKind regular_file_or_missing(const std::string& path);

// Parses `text` (named `file` in errors): kBadConfig "invalid JSON: ..." for any syntax error or
// nesting beyond max_depth. read_json_file's parser, for the fuzz targets that start from bytes.
nlohmann::json parse_json_bounded(const std::string& text, const std::string& file,
                                  int max_depth = kMaxJsonDepth);

// A value for an error message: "an object", "an array", or the value as JSON, ASCII only (so
// the message is valid UTF-8 whatever the input) and cut to 80 characters.
std::string json_excerpt(const nlohmann::json& j);

// One JSON value and where it sits in its file ("layers[0].experts"; "" for the top level).
// Every accessor checks the type first and fails with kBadConfig naming the file and the path.
// Holds references: the value and the file name outlive it.
class JsonField {
 public:
  JsonField(const nlohmann::json& j, std::string path, const std::string& file)
      : j_(j), path_(std::move(path)), file_(file) {}

  // kBadConfig, file, "<path>: <what>" ("top level: <what>" at the top).
  [[noreturn]] void fail(const std::string& what) const;
  const nlohmann::json& value() const { return j_; }
  const std::string& path() const { return path_; }

  void expect_object() const;
  bool has(const char* key) const;  // an object with member KEY
  // Member KEY of an object ("path.KEY"); "path.KEY: missing" when absent.
  JsonField operator[](const char* key) const;
  // Member KEY, named path["KEY"] (for keys that are data, like tensor names); KEY must exist.
  JsonField member(const std::string& key) const;
  size_t array_size() const;
  JsonField item(size_t i) const;  // i < array_size()

  std::string str() const;
  std::string nonempty_str() const;
  bool boolean() const;
  int64_t integer(int64_t lo, int64_t hi) const;  // within [lo, hi]
  uint64_t size() const;                          // a non-negative integer (a byte count)
  std::vector<std::string> strings() const;       // an array of strings
  DType dtype() const;                            // a dtype by its canonical name ("BF16")

 private:
  const nlohmann::json& j_;
  std::string path_;
  const std::string& file_;
};

}  // namespace moepack
