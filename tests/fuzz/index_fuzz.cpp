// libFuzzer target: any bytes as model.safetensors.index.json parse into a validated
// SafetensorsIndex (plain shard names, integer total_size) or a moepack::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/json_file.h"
#include "io/safetensors_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const moepack::SafetensorsIndex idx = moepack::parse_safetensors_index(
        moepack::parse_json_bounded(text, "index.json"), "index.json");
    for (const auto& [tensor, shard] : idx.weight_map)
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "..")
        __builtin_trap();  // the parser promised plain file names
  } catch (const moepack::Error&) {
  }
  return 0;
}
