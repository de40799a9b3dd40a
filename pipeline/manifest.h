// moepack.json: what a converted checkpoint is and how it was made -- tool and layout versions,
// source format and parameters, backend, target arch, activation dtype, deliberate deviations
// from vLLM's loader, and per output tensor its shard, dtype, shape, sources and SHA-256.
// Deterministic: no timestamps, no absolute paths, nothing about the machine that ran it.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "pipeline/plan.h"

namespace moepack {

constexpr int kManifestVersion = 1;

std::string moepack_version_string();

nlohmann::json build_manifest(const Plan& plan, const Checkpoint& ckpt,
                              const std::map<std::string, std::string>& sha256_by_tensor);
void write_manifest(const std::string& path, const nlohmann::json& manifest);
// Reads DIR/moepack.json; throws kBadConfig naming the file when missing or malformed.
nlohmann::json read_manifest(const std::string& dir);

nlohmann::json quant_params_json(const QuantParams& q);
// Inverse of quant_params_json (for verify: the source params the conversion used).
QuantParams quant_params_from_json(const nlohmann::json& j, const std::string& file);

}  // namespace moepack
