// Device discovery. Never throws: no driver / no device reads as "not available".
#include <cuda_runtime.h>

#include "kernels/moepack_cuda.h"

namespace moepack {

CudaDeviceInfo cuda_device_info() {
  CudaDeviceInfo info;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return info;
  info.available = true;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  return info;
}

}  // namespace moepack
