// Host-side entry points of the CUDA kernels. Declared always; without CUDA they throw
// Error{kNoCuda, "built without CUDA"} (kernels/src/stub.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moepack {

struct CudaDeviceInfo {
  bool available = false;
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
};

// Whether moepack was built with CUDA and a device is present. Never throws.
CudaDeviceInfo cuda_device_info();

// GPU GPTQ -> Marlin repack of one expert matrix (16-bit-activation tiles), byte-identical to
// formats/marlin's scalar path. codes: [N, K] uint8 (canonical), perm: [K] or empty.
// Returns the Marlin words [K/16, N*16/pf].
std::vector<uint32_t> cuda_marlin_repack(const uint8_t* codes, int64_t n, int64_t k, int bits,
                                         const int32_t* perm);

}  // namespace moepack
