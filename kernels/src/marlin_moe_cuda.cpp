// cuda_marlin_moe_forward: checks sizes, uploads, runs the launcher, downloads; every CUDA error
// becomes moepack::Error (kNoCuda when no device is usable).
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"
#include "kernels/include/marlin_moe_launch.h"
#include "kernels/marlin_moe.h"

namespace moepack {
namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const bool no_device = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
                         err == cudaErrorInitializationError;
  cudaGetLastError();
  throw Error(no_device ? ErrorCode::kNoCuda : ErrorCode::kInternal,
              std::string("cuda_marlin_moe_forward: ") + what + ": " + cudaGetErrorString(err));
}

struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer(size_t bytes, const char* what) {
    if (bytes) check_cuda(cudaMalloc(&ptr, bytes), what);
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr) { o.ptr = nullptr; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
};

template <class T>
DeviceBuffer upload(const std::vector<T>& v, const char* what) {
  DeviceBuffer b(v.size() * sizeof(T), what);
  if (!v.empty())
    check_cuda(cudaMemcpy(b.ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), what);
  return b;
}

void expect_size(size_t got, int64_t want, const char* name) {
  if (got != static_cast<size_t>(want))
    throw Error(
        ErrorCode::kBadShape, "", name,
        "has " + std::to_string(got) + " elements, the shape needs " + std::to_string(want));
}

}  // namespace

std::vector<float> cuda_marlin_moe_forward(const MarlinMoeHostLayer& l,
                                           const std::vector<uint16_t>& x,
                                           const std::vector<int32_t>& topk_ids,
                                           const std::vector<float>& topk_weights, int64_t tokens,
                                           int32_t top_k) {
  const int64_t E = l.experts, H = l.hidden, I = l.inter, n13 = l.gated ? 2 * I : I;
  kernels::MarlinMoeLayer d;
  d.experts = E;
  d.hidden = H;
  d.inter = I;
  d.gated = l.gated;
  d.bf16 = l.bf16;
  d.groups13 = l.groups13;
  d.groups2 = l.groups2;
  // Shape checks before the pointers exist: marlin_moe_unsupported also wants them non-null.
  static const uint32_t kDummy = 0;
  d.w13 = d.w2 = &kDummy;
  d.s13 = d.s2 = reinterpret_cast<const uint16_t*>(&kDummy);
  if (const char* why = kernels::marlin_moe_unsupported(d))
    throw Error(ErrorCode::kUnsupported, "", "marlin", std::string("fused Marlin MoE: ") + why);
  expect_size(l.w13.size(), E * (H / 16) * 2 * n13, "w13_qweight");
  expect_size(l.w2.size(), E * (I / 16) * 2 * H, "w2_qweight");
  expect_size(l.s13.size(), E * l.groups13 * n13, "w13_scales");
  expect_size(l.s2.size(), E * l.groups2 * H, "w2_scales");
  expect_size(x.size(), tokens * H, "x");
  expect_size(topk_ids.size(), tokens * top_k, "topk_ids");
  expect_size(topk_weights.size(), tokens * top_k, "topk_weights");

  DeviceBuffer w13 = upload(l.w13, "w13"), w2 = upload(l.w2, "w2"), s13 = upload(l.s13, "s13"),
               s2 = upload(l.s2, "s2"), dx = upload(x, "x"), ids = upload(topk_ids, "topk_ids"),
               tw = upload(topk_weights, "topk_weights");
  d.w13 = static_cast<const uint32_t*>(w13.ptr);
  d.w2 = static_cast<const uint32_t*>(w2.ptr);
  d.s13 = static_cast<const uint16_t*>(s13.ptr);
  d.s2 = static_cast<const uint16_t*>(s2.ptr);
  const size_t ws_bytes = kernels::marlin_moe_workspace_bytes(d, tokens, top_k);
  DeviceBuffer ws(ws_bytes, "workspace");
  std::vector<float> out(static_cast<size_t>(tokens * H));
  DeviceBuffer dout(out.size() * sizeof(float), "out");
  check_cuda(static_cast<cudaError_t>(kernels::marlin_moe_forward(
                 d, dx.ptr, static_cast<const int32_t*>(ids.ptr), static_cast<const float*>(tw.ptr),
                 tokens, top_k, static_cast<float*>(dout.ptr), ws.ptr, ws_bytes, nullptr)),
             "launch");
  check_cuda(cudaDeviceSynchronize(), "kernels");
  if (!out.empty())
    check_cuda(cudaMemcpy(out.data(), dout.ptr, out.size() * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy(out)");
  return out;
}

}  // namespace moepack
