// libFuzzer target: any bytes as moepack.json parse into a Manifest or a moepack::Error, as
// read_manifest does (bounded JSON, then every field checked).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/json_file.h"
#include "pipeline/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    moepack::parse_manifest(moepack::parse_json_bounded(text, "moepack.json"), "moepack.json");
  } catch (const moepack::Error&) {
  }
  return 0;
}
