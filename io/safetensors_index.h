// model.safetensors.index.json: {"metadata": {"total_size": N, ...}, "weight_map": {tensor: shard}}
// read as untrusted input (io/json_file.h: regular file, bounded size and depth) and validated:
// weight_map an object of plain shard file names ending in ".safetensors" (no '/', not "." or
// "..", not empty), total_size absent or a non-negative integer. Every failure is kBadConfig
// naming the file and the field.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace moepack {

constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shard_names;           // sorted, unique
  std::optional<uint64_t> total_size;             // metadata.total_size when present
};

SafetensorsIndex read_safetensors_index(const std::string& path);
SafetensorsIndex parse_safetensors_index(const nlohmann::json& j, const std::string& path);

}  // namespace moepack
