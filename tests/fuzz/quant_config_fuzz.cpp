// libFuzzer target: any JSON given as quantization_config is normalised or refused with
// moepack::Error (kBadConfig / kUnsupported) -- never a bare nlohmann exception or a crash.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j =
      nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size), nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    moepack::normalize_quant_config(j, "fuzz.json", moepack::DType::kBF16);
  } catch (const moepack::Error&) {
  }
  return 0;
}
