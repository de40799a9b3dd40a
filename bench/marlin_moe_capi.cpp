// C ABI of the fused Marlin MoE launcher for bench/bench_marlin_moe.py, which loads this library
// with ctypes so that the kernel, the torch bf16 baseline and the copy-bandwidth floor are timed
// in one process on the same tensors (torch owns every buffer; pointers come in as integers).
#include <cstddef>
#include <cstdint>

#include "kernels/include/marlin_moe_launch.h"

namespace {

moepack::kernels::MarlinMoeLayer layer_of(int64_t experts, int64_t hidden, int64_t inter,
                                          int64_t groups13, int64_t groups2, int gated, int bf16,
                                          const void* w13, const void* s13, const void* w2,
                                          const void* s2) {
  moepack::kernels::MarlinMoeLayer l;
  l.experts = experts;
  l.hidden = hidden;
  l.inter = inter;
  l.groups13 = groups13;
  l.groups2 = groups2;
  l.gated = gated != 0;
  l.bf16 = bf16 != 0;
  l.w13 = static_cast<const uint32_t*>(w13);
  l.s13 = static_cast<const uint16_t*>(s13);
  l.w2 = static_cast<const uint32_t*>(w2);
  l.s2 = static_cast<const uint16_t*>(s2);
  return l;
}

}  // namespace

extern "C" {

size_t moepack_marlin_moe_workspace_bytes(int64_t experts, int64_t hidden, int64_t inter,
                                          int64_t tokens, int32_t top_k) {
  const auto l = layer_of(experts, hidden, inter, 1, 1, 1, 1, nullptr, nullptr, nullptr, nullptr);
  return moepack::kernels::marlin_moe_workspace_bytes(l, tokens, top_k);
}

// Returns a cudaError_t (0 = success); enqueues on `stream` without synchronising.
// block_rows: 0 = the launcher's choice, 16 or 64 forced.
int moepack_marlin_moe_forward(int64_t experts, int64_t hidden, int64_t inter, int64_t groups13,
                               int64_t groups2, int gated, int bf16, const void* w13,
                               const void* s13, const void* w2, const void* s2, const void* x,
                               const int32_t* topk_ids, const float* topk_weights, int64_t tokens,
                               int32_t top_k, float* out, void* workspace, size_t workspace_bytes,
                               void* stream, int32_t block_rows) {
  const auto l = layer_of(experts, hidden, inter, groups13, groups2, gated, bf16, w13, s13, w2, s2);
  return moepack::kernels::marlin_moe_forward(l, x, topk_ids, topk_weights, tokens, top_k, out,
                                              workspace, workspace_bytes, stream, block_rows);
}

}  // extern "C"
