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

// Code i of the canonical [E, N, K] codes: expert e, row n, column j; the tiled matrix's row
// kk = inverse_sort[e, j] (or j) holds it.
__device__ inline uint32_t marlin_gathered_code(const MarlinCodeGather& g, int64_t i) {
  const int64_t nk = g.n * g.k;
  const int64_t e = i / nk, rem = i - e * nk;
  const int64_t row = rem / g.k, col = rem - row * g.k;
  const int64_t kk = g.inverse_sort ? g.inverse_sort[e * g.k + col] : col;
  const int64_t kt = kk / g.tile_k, nt = row / g.tile_n;
  const int rf = g.word_field[(row - nt * g.tile_n) * g.tile_k + (kk - kt * g.tile_k)];
  const uint32_t w = g.qweight[e * g.words_per_expert + (kt * g.tiles_n + nt) * g.words_per_tile +
                               rf / g.pack_factor];
  return (w >> (g.bits * (rf % g.pack_factor))) & ((1u << g.bits) - 1u);
}

// One output byte per thread (grid-stride): 4-bit codes two per byte, code 2b in the low nibble
// and 2b + 1 in the high one (0 past the last code); 8-bit codes one per byte.
__global__ void marlin_code_decode_kernel(MarlinCodeGather g, uint8_t* out, int64_t out_bytes) {
  const int64_t count = g.experts * g.n * g.k;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < out_bytes;
       b += stride) {
    if (g.bits == 4) {
      const uint32_t lo = marlin_gathered_code(g, 2 * b);
      const uint32_t hi = 2 * b + 1 < count ? marlin_gathered_code(g, 2 * b + 1) : 0u;
      out[b] = static_cast<uint8_t>(lo | (hi << 4));
    } else {
      out[b] = static_cast<uint8_t>(marlin_gathered_code(g, b));
    }
  }
}

}  // namespace moepack::kernels
