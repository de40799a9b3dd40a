// Device code: token -> expert sorting. The T * top_k routed slots (slot s = t * top_k + k goes
// to expert_ids[s]) grouped by expert, each expert's slots in slot (= token) order, so the
// result never depends on thread scheduling:
//   counts[e]   number of slots routed to e
//   offsets[e]  exclusive prefix sum of counts, offsets[E] = T * top_k
//   sorted[p]   for p in [offsets[e], offsets[e + 1]): expert e's slots, ascending
// One thread per expert walks all slots (E * T * top_k steps in all: small for verification
// batches); the prefix sum is one thread. Raw pointers only.
#pragma once

#include <cstdint>

namespace moepack::kernels {

__global__ void count_slots_kernel(const int32_t* expert_ids, int64_t slots, int64_t experts,
                                   int32_t* counts) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= experts) return;
  int32_t c = 0;
  for (int64_t s = 0; s < slots; ++s) c += expert_ids[s] == e;
  counts[e] = c;
}

__global__ void exclusive_scan_kernel(const int32_t* counts, int64_t experts, int32_t* offsets) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int32_t acc = 0;
  for (int64_t e = 0; e < experts; ++e) {
    offsets[e] = acc;
    acc += counts[e];
  }
  offsets[experts] = acc;
}

// Also row_token[p] = sorted[p] / top_k, the token whose hidden state position p reads.
__global__ void fill_sorted_kernel(const int32_t* expert_ids, int64_t slots, int64_t experts,
                                   int top_k, const int32_t* offsets, int32_t* sorted,
                                   int32_t* row_token) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= experts) return;
  int32_t p = offsets[e];
  for (int64_t s = 0; s < slots; ++s)
    if (expert_ids[s] == e) {
      sorted[p] = static_cast<int32_t>(s);
      row_token[p] = static_cast<int32_t>(s / top_k);
      ++p;
    }
}

}  // namespace moepack::kernels
