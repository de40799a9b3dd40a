// Host-side entry points of the CUDA kernels. Declared always; without CUDA they throw
// Error{kNoCuda, "built without CUDA"} (kernels/src/stub.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace moepack {

struct CudaDeviceInfo {
  bool available = false;
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
};

// Whether moepack was built with CUDA and a device is present. Never throws.
CudaDeviceInfo cuda_device_info();

}  // namespace moepack
