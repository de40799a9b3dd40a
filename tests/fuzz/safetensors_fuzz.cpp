// libFuzzer target: the safetensors reader must accept or throw moepack::Error on any bytes --
// never crash, hang or read out of bounds (run under ASan/UBSan). Every accepted file's views are
// touched end to end.
//
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DMOEPACK_FUZZ=ON
//   -DMOEPACK_CUDA=OFF ninja -C build-fuzz fuzz_safetensors && build-fuzz/bin/fuzz_safetensors
//   -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const moepack::SafetensorsFile f =
        moepack::SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
    uint64_t total = 0;
    for (const auto& e : f.entries()) {
      const moepack::TensorView v = f.view(e);
      volatile uint8_t sink = v.nbytes ? v.data[0] ^ v.data[v.nbytes - 1] : 0;
      (void)sink;
      total += v.nbytes;
    }
    if (8 + f.header_length() + total != size) __builtin_trap();  // accepted files are exact
  } catch (const moepack::Error&) {
  }
  return 0;
}
