// Built when CUDA is off: every device entry point says so explicitly (STYLE.md §7).
#include "core/error.h"
#include "kernels/marlin_moe.h"
#include "kernels/moepack_cuda.h"

namespace moepack {

CudaDeviceInfo cuda_device_info() {
  return {};
}

std::vector<uint32_t> cuda_marlin_repack(const uint8_t*, int64_t, int64_t, int, const int32_t*) {
  throw Error(ErrorCode::kNoCuda, "built without CUDA");
}

std::vector<float> cuda_marlin_moe_forward(const MarlinMoeHostLayer&, const std::vector<uint16_t>&,
                                           const std::vector<int32_t>&, const std::vector<float>&,
                                           int64_t, int32_t) {
  throw Error(ErrorCode::kNoCuda, "built without CUDA");
}

}  // namespace moepack
