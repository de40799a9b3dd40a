// GPTQ -> Marlin weight repack, device side (16-bit-activation tiles). spec/wna16_marlin.md
// §3.2/§3.4; mirrors vLLM csrc/quantization/marlin/gptq_marlin_repack.cu in effect, not in
// structure: one thread per output word, each field located by the closed-form map shared with
// the scalar codec (formats/layout/marlin_layout.h), so the two paths cannot drift apart.
//
//   codes [N, K] uint8, one code per byte (canonical, row = output feature)
//   perm  [K] int32 or null: Marlin row k holds source row perm[k] (the act-order sort index)
//   out   [K/16, N*16/pf] uint32 = consecutive 16x64 tiles of T = 1024/pf words,
//         tile tau = kt*(N/64) + nt, word w = tau*T + r, field f = bits [nb*f, nb*f + nb)
#pragma once

#include <cstdint>

#include "formats/layout/marlin_layout.h"

namespace moepack::kernels {

__global__ void marlin_repack_kernel(const uint8_t* __restrict__ codes,
                                     const int32_t* __restrict__ perm, int64_t n, int64_t k,
                                     int bits, uint32_t* __restrict__ out) {
  const int pf = marlin::pack_factor(bits);
  const int words_per_tile = marlin::words_per_tile(bits);
  const int64_t total = (k / 16) * (n * 16 / pf);
  const int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= total) return;
  const int64_t tau = w / words_per_tile;
  const int r = static_cast<int>(w % words_per_tile);
  const int64_t n_tiles = n / 64;
  const int64_t kt = tau / n_tiles, nt = tau % n_tiles;
  const uint32_t mask = (1u << bits) - 1u;
  uint32_t word = 0;
  for (int f = 0; f < pf; ++f) {
    int64_t kk = 0, nn = 0;
    marlin::word_field_coords(bits, false, kt, nt, r, f, &kk, &nn);
    const int64_t src_k = perm ? static_cast<int64_t>(perm[kk]) : kk;
    word |= (static_cast<uint32_t>(codes[nn * k + src_k]) & mask) << (bits * f);
  }
  out[w] = word;
}

}  // namespace moepack::kernels
