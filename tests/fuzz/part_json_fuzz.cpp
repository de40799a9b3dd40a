// libFuzzer target: any bytes as a part's part.json (convert --shard, pipeline/parts.h) parse into
// a checked record -- unit, units, plan digest, recorded flags, per-tensor and per-source-tensor
// SHA-256s -- or a moepack::Error, as merge reads it (bounded JSON, then every field checked).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/json_file.h"
#include "pipeline/parts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    moepack::validate_part_json(moepack::parse_json_bounded(text, "part.json"), "part.json");
  } catch (const moepack::Error& e) {
    if (e.code() == moepack::ErrorCode::kInternal) __builtin_trap();  // a bug, not bad input
  }
  return 0;
}
