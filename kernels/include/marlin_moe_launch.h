// Launcher interface of the fused Marlin MoE (kernels/include/marlin_moe.cuh): plain structs and
// device pointers, cudaError_t as an int, no CUDA or library headers, so that both the library
// (kernels/src/marlin_moe_cuda.cpp turns errors into moepack::Error) and the standalone benchmark
// library (bench/marlin_moe_capi.cpp, loaded by Python next to torch) can call it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moepack::kernels {

// One MoE layer in the Marlin layout, int4 uint4b8 (GPTQ / compressed-tensors symmetric), no
// act-order, no zero points. All pointers are device memory.
struct MarlinMoeLayer {
  int64_t experts = 0, hidden = 0;
  int64_t inter = 0;              // the parameters' intermediate size (Marlin's padded I)
  bool gated = true;              // w13 = [gate; up] (silu(gate) * up) or w1 only (relu2)
  bool bf16 = true;               // activation dtype = scale dtype: bf16 or fp16
  const uint32_t* w13 = nullptr;  // [E, H/16, 2N13] int32 words, N13 = 2I gated or I
  const uint16_t* s13 = nullptr;  // [E, G13, N13]
  int64_t groups13 = 1;  // G13: H / group_size, or 1 (channelwise); scales are permuted with
                         // the 64-entry (grouped) map iff G > 1, else the 32-entry one (the
                         // kernel's rule, ops.cu; formats/marlin.cpp marlin_make_reader)
  const uint32_t* w2 = nullptr;  // [E, I/16, 2H]
  const uint16_t* s2 = nullptr;  // [E, G2, H]
  int64_t groups2 = 1;
};

// Why a layer cannot run here, or nullptr: H % 64, I % 64, groups dividing K into multiples of
// 16 rows. The message is a static string.
const char* marlin_moe_unsupported(const MarlinMoeLayer& layer);

// Device workspace bytes for up to `tokens` tokens of top_k experts each.
size_t marlin_moe_workspace_bytes(const MarlinMoeLayer& layer, int64_t tokens, int32_t top_k);

// out[t, :] = sum_s topk_weights[t, s] * expert_{topk_ids[t, s]}(x[t, :]) in fp32, [tokens, H].
// x: [tokens, H] in the activation dtype; topk_ids int32 / topk_weights fp32 [tokens, top_k].
// Enqueues four kernels on `stream` (a cudaStream_t), no host synchronisation, capturable in a
// CUDA graph. Returns a cudaError_t (0 = success) of the launches. block_rows: 0 picks the
// block shape from the rows per expert (16 up to 16 rows per expert on average, else 64); 16 or
// 64 force one (the benchmark measures both around the crossover).
int marlin_moe_forward(const MarlinMoeLayer& layer, const void* x, const int32_t* topk_ids,
                       const float* topk_weights, int64_t tokens, int32_t top_k, float* out,
                       void* workspace, size_t workspace_bytes, void* stream,
                       int32_t block_rows = 0);

}  // namespace moepack::kernels
