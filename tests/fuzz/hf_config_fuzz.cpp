// libFuzzer target: any bytes as config.json -- bounded JSON parse (size, nesting), the model
// fields (sizes and counts checked), the quantization_config found in it normalised -- end in a
// HfConfig or a moepack::Error: never a bare nlohmann exception, a crash or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/json_file.h"
#include "model/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const std::string text(reinterpret_cast<const char*>(data), size);
    const moepack::HfConfig c = moepack::hf_config_from_json(
        moepack::parse_json_bounded(text, "config.json"), "config.json", "");
    // What convert later does with it: copy and print the raw config (recursive in nlohmann).
    nlohmann::json copy = c.raw;
    copy["moepack"] = {{"fuzz", true}};
    (void)copy.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const moepack::Error&) {
  }
  return 0;
}
