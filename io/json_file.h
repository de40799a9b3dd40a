// Untrusted JSON files (config.json, the side quantization configs, the index): opened as a
// regular file only -- a FIFO, socket or device is refused without blocking, a directory or a
// symlink loop is an input error -- read up to a byte cap, and parsed with a nesting cap, into
// one nlohmann value. Every failure is an Error naming the file; none is a bare exception.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace moepack {

// A real config.json is a few KB and nests about 6 deep (quantization_config.config_groups.
// group_0.weights...); a 1M-tensor index is about 100 MB. The caps only stop hostile files:
// nlohmann's parser is iterative, but copying, comparing and printing a value recurse.
constexpr uint64_t kMaxJsonFileBytes = 256ull << 20;
constexpr int kMaxJsonDepth = 64;

// What the path is, without following it into a block: regular file, missing, or an input error
// (kBadConfig: directory, FIFO, device, socket, symlink loop) / kIo (permission, other errno).
enum class PathKind { kMissing, kRegular };
PathKind regular_file_or_missing(const std::string& path);

// The whole file: kBadConfig for a non-regular file or one over max_bytes, kIo for open/read
// failures, kBadConfig "not found" when missing.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

// Parses `text` (named `file` in errors): kBadConfig "invalid JSON: ..." for any syntax error or
// nesting beyond max_depth.
nlohmann::json parse_json_bounded(const std::string& text, const std::string& file,
                                  int max_depth = kMaxJsonDepth);

// read_regular_file + parse_json_bounded.
nlohmann::json read_json_file(const std::string& path, uint64_t max_bytes = kMaxJsonFileBytes,
                              int max_depth = kMaxJsonDepth);

}  // namespace moepack
