// Host entry of the fused Marlin MoE kernel (kernels/include/marlin_moe.cuh) for tests and tools:
// host buffers in, one forward on the device, fp32 out. Declared always; without CUDA it throws
// Error{kNoCuda} (kernels/src/stub.cpp). The runtime calls the device-pointer launcher
// (kernels/include/marlin_moe_launch.h) directly.
#pragma once

#include <cstdint>
#include <vector>

namespace moepack {

// One layer's Marlin parameters as pack_marlin_moe writes them (int4 uint4b8, no act-order, no
// zero points): words and 16-bit scales in the activation dtype.
struct MarlinMoeHostLayer {
  int64_t experts = 0, hidden = 0, inter = 0;  // inter: the parameters' (padded) I
  bool gated = true;
  bool bf16 = true;                   // activations and scales bf16 (else fp16)
  std::vector<uint32_t> w13, w2;      // [E, H/16, 2*N13], [E, I/16, 2H]
  std::vector<uint16_t> s13, s2;      // [E, G13, N13], [E, G2, H]
  int64_t groups13 = 1, groups2 = 1;  // scales grouped-permuted iff G > 1 (the kernel's rule)
};

// out [tokens, H] = sum_s topk_weights[t, s] * expert_{topk_ids[t, s]}(x[t]) on the GPU.
// x: [tokens, H] 16-bit activation bits. Throws kUnsupported naming the reason for a layer the
// kernel cannot take, kBadShape for inconsistent sizes, kNoCuda without a device.
std::vector<float> cuda_marlin_moe_forward(const MarlinMoeHostLayer& layer,
                                           const std::vector<uint16_t>& x,
                                           const std::vector<int32_t>& topk_ids,
                                           const std::vector<float>& topk_weights, int64_t tokens,
                                           int32_t top_k);

}  // namespace moepack
