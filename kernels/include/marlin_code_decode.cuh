// Device decode of Marlin-tiled codes into the canonical reader's form (kernels/moe_runtime.h
// MarlinCodeDecode): a gather through the code map (formats/marlin.h marlin_code_map), built from
// the same table as the scalar unpack (marlin_unrepack) and independent of the layout side's
// reader (formats/layout/moe_reader.h), which verify compares against it.
#pragma once

#include <cstdint>

namespace moepack::kernels {

struct MarlinCodeGather {
  const uint32_t* qweight;      // [E, K/16, N*16/pf] words
  const int32_t* word_field;    // [tile_n * tile_k]: r * pack_factor + f
  const int32_t* inverse_sort;  // [E, K] or null
  int64_t experts, n, k;
  int64_t tiles_n;           // N / tile_n
  int64_t words_per_expert;  // K * N / pack_factor
  int bits, tile_n, tile_k, pack_factor, words_per_tile;
};

// Code (e, row, col) of the canonical [E, N, K] codes: the tiled matrix's row
// kk = inverse_sort[e, col] (or col) holds it. Within an expert the indices fit in 32 bits.
__device__ inline uint32_t marlin_code_at(const MarlinCodeGather& g, int64_t e, int32_t row,
                                          int32_t col) {
  const int32_t kk = g.inverse_sort ? g.inverse_sort[e * g.k + col] : col;
  const int32_t kt = kk / g.tile_k, nt = row / g.tile_n;
  const int32_t rf = g.word_field[(row - nt * g.tile_n) * g.tile_k + (kk - kt * g.tile_k)];
  const uint32_t w = g.qweight[e * g.words_per_expert +
                               (static_cast<int64_t>(kt) * g.tiles_n + nt) * g.words_per_tile +
                               rf / g.pack_factor];
  return (w >> (g.bits * (rf % g.pack_factor))) & ((1u << g.bits) - 1u);
}

// One output byte per thread (grid-stride): 4-bit codes two per byte, code 2b in the low nibble
// and 2b + 1 (the next column of the same row: K is whole tiles, so even) in the high one; 8-bit
// codes one per byte.
__global__ void marlin_code_decode_kernel(MarlinCodeGather g, uint8_t* out, int64_t out_bytes) {
  const int64_t nk = g.n * g.k, per_byte = g.bits == 4 ? 2 : 1;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < out_bytes;
       b += stride) {
    const int64_t i = per_byte * b, e = i / nk, rem = i - e * nk;
    const int32_t row = static_cast<int32_t>(rem / g.k);
    const int32_t col = static_cast<int32_t>(rem - static_cast<int64_t>(row) * g.k);
    uint32_t v = marlin_code_at(g, e, row, col);
    if (g.bits == 4) v |= marlin_code_at(g, e, row, col + 1) << 4;
    out[b] = static_cast<uint8_t>(v);
  }
}

}  // namespace moepack::kernels
