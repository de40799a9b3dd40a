// Marlin weight tile layout as closed-form index maps (spec/wna16_marlin.md §3.2-3.3), shared
// by formats/marlin.cpp and kernels/ (host and device). Raw integers only, no library types.
//
// Output: uint32 words [K/16, N*16/pf], read as consecutive tiles of T = 1024/pf words.
//   16-bit activations: tiles 16(k) x 64(n), tau = kt*(N/64) + nt
//   8-bit activations (a8): tiles 32(k) x 32(n), tau = kt*(N/32) + nt
// Word r of tile (kt, nt), field f (bits [nb*f, nb*f+nb)) holds Q[k, n] with (k, n) below.
#pragma once

#include <cstdint>

#include "formats/layout/hd.h"

namespace moepack::marlin {

MOEPACK_HD int tile_k(bool a8) {
  return a8 ? 32 : 16;
}
MOEPACK_HD int tile_n(bool a8) {
  return a8 ? 32 : 64;
}
MOEPACK_HD int pack_factor(int bits) {
  return 32 / bits;
}
MOEPACK_HD int words_per_tile(int bits) {
  return 1024 / pack_factor(bits);
}

// (k, n) of field f of word r in tile (kt, nt).
MOEPACK_HD void word_field_coords(int bits, bool a8, int64_t kt, int64_t nt, int r, int f,
                                  int64_t* k, int64_t* n) {
  if (!a8) {
    if (bits == 4) {
      // DK = (0,8,0,8,1,9,1,9), DN = (0,0,8,8,0,0,8,8)
      const int t = r >> 2, j = r & 3, b = 2 * (t & 3);
      const int dk = (f & 1) * 8 + (f >> 2);
      const int dn = ((f >> 1) & 1) * 8;
      *k = 16 * kt + b + dk;
      *n = 64 * nt + 16 * j + (t >> 2) + dn;
    } else {
      // DK8 = (0,8,1,9)
      const int t = r >> 3, j = (r & 7) >> 1, h = r & 1, b = 2 * (t & 3);
      const int dk = (f & 1) * 8 + (f >> 1);
      *k = 16 * kt + b + dk;
      *n = 64 * nt + 16 * j + (t >> 2) + 8 * h;
    }
  } else {
    if (bits == 4) {
      // DKa = (0,16,1,17,2,18,3,19)
      const int t = r >> 2, j = (r & 3) >> 1, h = r & 1;
      const int dk = (f & 1) * 16 + (f >> 1);
      *k = 32 * kt + 4 * (t & 3) + dk;
      *n = 32 * nt + 16 * j + (t >> 2) + 8 * h;
    } else {
      const int t = r >> 3, j = (r & 7) >> 2, h = (r & 3) >> 1, s = r & 1;
      *k = 32 * kt + 4 * (t & 3) + 16 * s + f;
      *n = 32 * nt + 16 * j + (t >> 2) + 8 * h;
    }
  }
}

// Inverse of word_field_coords: the word r (within its tile) and field f holding Q[k, n]; the
// tile is (k / tile_k, n / tile_n). Read-side map of the readers (formats/layout/moe_reader.h).
MOEPACK_HD void word_field_of(int bits, bool a8, int64_t k, int64_t n, int* r, int* f) {
  if (!a8) {
    const int kr = static_cast<int>(k & 15), nr = static_cast<int>(n & 63);
    const int j = nr >> 4, rem = nr & 15;
    const int t = ((rem & 7) << 2) | ((kr & 7) >> 1);
    if (bits == 4) {
      *f = (kr >> 3) | ((rem >> 3) << 1) | ((kr & 1) << 2);
      *r = (t << 2) | j;
    } else {
      *f = (kr >> 3) | ((kr & 1) << 1);
      *r = (t << 3) | (j << 1) | (rem >> 3);
    }
  } else {
    const int kr = static_cast<int>(k & 31), nr = static_cast<int>(n & 31);
    const int j = nr >> 4, rem = nr & 15;
    const int t = ((rem & 7) << 2) | ((kr & 15) >> 2);
    if (bits == 4) {
      *f = (kr >> 4) | ((kr & 3) << 1);
      *r = (t << 2) | (j << 1) | (rem >> 3);
    } else {
      *f = kr & 3;
      *r = (t << 3) | (j << 2) | ((rem >> 3) << 1) | (kr >> 4);
    }
  }
}

// ---- Scale and zero-point permutations (spec §4.1, §5.1) -------------------------------------
// Each is a gather inside fixed-size chunks of the row-major flattened [G, N] tensor:
// out[chunk*C + i] = in[chunk*C + src(i)]. Source: get_scale_perms / marlin_zero_points in
// vllm marlin_utils.py (facts re-derived from spec §4.1; see docs/marlin.md).

// Grouped scales, C = 64: an 8x8 transpose, out[8a + b] = in[8b + a].
MOEPACK_HD int scale_perm_grouped_src(int i) {
  return 8 * (i & 7) + (i >> 3);
}
// Single (channelwise / a8) scales, C = 32: out[8a + m] = in[2a + S[m]],
// S = (0, 1, 8, 9, 16, 17, 24, 25) = 8 * (m / 2) + (m % 2).
MOEPACK_HD int scale_perm_single_src(int i) {
  const int a = i >> 3, m = i & 7;
  return 2 * a + 8 * (m >> 1) + (m & 1);
}
MOEPACK_HD int scale_chunk(bool grouped) {
  return grouped ? 64 : 32;
}
MOEPACK_HD int scale_perm_src(bool grouped, int i) {
  return grouped ? scale_perm_grouped_src(i) : scale_perm_single_src(i);
}

// Inverses (read side): the position inside its chunk where entry i of the logical chunk lands.
MOEPACK_HD int scale_perm_grouped_dst(int i) {
  return scale_perm_grouped_src(i);  // an 8x8 transpose is its own inverse
}
MOEPACK_HD int scale_perm_single_dst(int i) {
  return 8 * ((i >> 1) & 3) + 2 * (i >> 3) + (i & 1);
}
MOEPACK_HD int scale_perm_dst(bool grouped, int i) {
  return grouped ? scale_perm_grouped_dst(i) : scale_perm_single_dst(i);
}

// The pair swap of vLLM's float Marlin scales (x.view(-1, 4)[:, [0, 2, 1, 3]] on the permuted
// matrix: "fit the layout of fp8 dequantization", marlin_utils_fp8.py / marlin_utils_fp4.py):
// position p holds the scale that the permutation alone put at pair_swap_pos(p). An involution.
MOEPACK_HD int64_t pair_swap_pos(int64_t p) {
  const int64_t q = p & 3;
  return (p & ~int64_t{3}) | (q == 1 ? 2 : q == 2 ? 1 : q);
}

// Field interleave inside one pf-run: int4 (0,2,4,6,1,3,5,7), int8 (0,2,1,3); out[j] = in[P[j]].
MOEPACK_HD int interleave_src(int bits, int j) {
  const int half = pack_factor(bits) / 2;
  return j < half ? 2 * j : 2 * (j - half) + 1;
}

// Zero points, C = 64: the grouped 64-permutation (always), then unless a8 the interleave of each
// run of pf values; the result is packed low-bits-first along N, so position x of a 64-chunk is
// field x % pf of word x / pf of that chunk.
MOEPACK_HD int zero_point_src(int bits, bool a8, int x) {
  const int pf = pack_factor(bits);
  const int y = a8 ? x : pf * (x / pf) + interleave_src(bits, x % pf);
  return scale_perm_grouped_src(y);
}

// Inverse of zero_point_src: the position inside its 64-chunk of logical zero point i.
MOEPACK_HD int zero_point_dst(int bits, bool a8, int i) {
  const int y = scale_perm_grouped_dst(i);
  if (a8) return y;
  const int pf = pack_factor(bits), half = pf / 2, j = y % pf;
  return pf * (y / pf) + ((j & 1) ? half + (j >> 1) : (j >> 1));
}

}  // namespace moepack::marlin
