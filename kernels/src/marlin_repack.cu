// Launcher of the GPU GPTQ -> Marlin repack (kernels/include/marlin_repack.cuh): checks shapes
// and inputs on the host, copies in, runs one thread per output word, copies out. Every CUDA
// call is checked; failures become moepack::Error (kNoCuda when there is no usable device).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/include/marlin_repack.cuh"
#include "kernels/moepack_cuda.h"

namespace moepack {
namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const bool no_device = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
                         err == cudaErrorInitializationError;
  cudaGetLastError();  // clear a non-sticky error so later calls are not poisoned
  throw Error(no_device ? ErrorCode::kNoCuda : ErrorCode::kInternal,
              std::string("cuda_marlin_repack: ") + what + ": " + cudaGetErrorString(err));
}

// Device memory freed on every path out, errors included.
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer(size_t bytes, const char* what) {
    if (bytes) check_cuda(cudaMalloc(&ptr, bytes), what);
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace

std::vector<uint32_t> cuda_marlin_repack(const uint8_t* codes, int64_t n, int64_t k, int bits,
                                         const int32_t* perm) {
  if (bits != 4 && bits != 8)
    throw Error(ErrorCode::kUnsupported, "", "codes",
                "Marlin repack takes 4- or 8-bit codes, got " + std::to_string(bits));
  if (n <= 0 || k <= 0 || n % 64 != 0 || k % 16 != 0)
    throw Error(ErrorCode::kBadShape, "", "codes",
                "Marlin needs N % 64 == 0 and K % 16 == 0, got N=" + std::to_string(n) +
                    " K=" + std::to_string(k));
  if (codes == nullptr) throw Error(ErrorCode::kInternal, "cuda_marlin_repack: null codes");
  const uint8_t limit = static_cast<uint8_t>((1u << bits) - 1u);
  for (int64_t i = 0; i < n * k; ++i)
    if (codes[i] > limit)
      throw Error(ErrorCode::kBadValue, "", "codes",
                  "code " + std::to_string(codes[i]) + " at " + std::to_string(i) +
                      " does not fit " + std::to_string(bits) + " bits");
  if (perm) {
    // The kernel indexes with perm: it must be a permutation of 0..K-1.
    std::vector<uint8_t> seen(static_cast<size_t>(k), 0);
    for (int64_t i = 0; i < k; ++i) {
      const int32_t p = perm[i];
      if (p < 0 || p >= k || seen[static_cast<size_t>(p)])
        throw Error(ErrorCode::kBadValue, "", "perm",
                    "not a permutation of 0.." + std::to_string(k - 1) + " (entry " +
                        std::to_string(i) + " = " + std::to_string(p) + ")");
      seen[static_cast<size_t>(p)] = 1;
    }
  }

  const int pf = 32 / bits;
  const int64_t words = (k / 16) * (n * 16 / pf);
  const size_t code_bytes = static_cast<size_t>(n * k);
  DeviceBuffer d_codes(code_bytes, "cudaMalloc(codes)");
  DeviceBuffer d_perm(perm ? static_cast<size_t>(k) * sizeof(int32_t) : 0, "cudaMalloc(perm)");
  DeviceBuffer d_out(static_cast<size_t>(words) * sizeof(uint32_t), "cudaMalloc(out)");
  check_cuda(cudaMemcpy(d_codes.ptr, codes, code_bytes, cudaMemcpyHostToDevice),
             "cudaMemcpy(codes)");
  if (perm)
    check_cuda(cudaMemcpy(d_perm.ptr, perm, static_cast<size_t>(k) * sizeof(int32_t),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy(perm)");

  const int threads = 256;
  const int64_t blocks = (words + threads - 1) / threads;
  if (blocks > 0x7fffffffLL)
    throw Error(ErrorCode::kUnsupported, "", "codes",
                "matrix too large for one launch (" + std::to_string(words) + " words)");
  kernels::marlin_repack_kernel<<<static_cast<unsigned>(blocks), threads>>>(
      static_cast<const uint8_t*>(d_codes.ptr), static_cast<const int32_t*>(d_perm.ptr), n, k, bits,
      static_cast<uint32_t*>(d_out.ptr));
  check_cuda(cudaGetLastError(), "launch marlin_repack_kernel");
  check_cuda(cudaDeviceSynchronize(), "marlin_repack_kernel");

  std::vector<uint32_t> out(static_cast<size_t>(words));
  check_cuda(
      cudaMemcpy(out.data(), d_out.ptr, out.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost),
      "cudaMemcpy(out)");
  return out;
}

}  // namespace moepack
