// Fast Marlin decode (formats/fast_unpack.h): the 16-bit-activation tiles byte-unzipped a
// 64-bit word at a time, rows written 8 codes per store.
#include "formats/fast_unpack.h"

#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/error.h"
#include "formats/layout/marlin_layout.h"

namespace moepack {
namespace {

void require(bool ok, const char* what, const std::string& why) {
  if (!ok) throw Error(ErrorCode::kInternal, "", what, why);
}

std::string dims(int64_t n, int64_t k, int bits) {
  return "N=" + std::to_string(n) + " K=" + std::to_string(k) + " bits=" + std::to_string(bits);
}

// [a0 b0 a1 b1 a2 b2 a3 b3] (byte 0 lowest) -> [a0 a1 a2 a3 b0 b1 b2 b3]: the even bytes in the
// low half, the odd bytes in the high half (two delta swaps).
inline uint64_t unzip_bytes(uint64_t x) {
  uint64_t t = (x ^ (x >> 8)) & 0x0000ff000000ff00ull;
  x ^= t ^ (t << 8);
  t = (x ^ (x >> 16)) & 0x00000000ffff0000ull;
  return x ^ t ^ (t << 16);
}

inline uint64_t pair(uint32_t lo, uint32_t hi) {
  return static_cast<uint64_t>(lo) | static_cast<uint64_t>(hi) << 32;
}

inline void store8(uint8_t* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}

constexpr uint64_t kLowNibbles = 0x0f0f0f0f0f0f0f0full;

// One int4 tile (128 words) into the 64 rows x 16 codes at `origin` (row stride k). Words
// 16 m + 4 q + j, q = 0..3, hold rows c = 16 j + m and c + 8 (see the header).
void unrepack_tile_int4(const uint32_t* tile, uint8_t* origin, int64_t k) {
  for (int m = 0; m < 8; ++m) {
    const uint32_t* w = tile + 16 * m;
    for (int j = 0; j < 4; ++j) {
      const uint64_t v01 = pair(w[j], w[4 + j]), v23 = pair(w[8 + j], w[12 + j]);
      const uint64_t lo01 = unzip_bytes(v01 & kLowNibbles), lo23 = unzip_bytes(v23 & kLowNibbles);
      const uint64_t hi01 = unzip_bytes((v01 >> 4) & kLowNibbles);
      const uint64_t hi23 = unzip_bytes((v23 >> 4) & kLowNibbles);
      uint8_t* a = origin + (16 * j + m) * k;  // row c
      uint8_t* b = a + 8 * k;                  // row c + 8
      store8(a, (lo01 & 0xffffffffull) | (lo23 << 32));
      store8(a + 8, (hi01 & 0xffffffffull) | (hi23 << 32));
      store8(b, (lo01 >> 32) | (lo23 & 0xffffffff00000000ull));
      store8(b + 8, (hi01 >> 32) | (hi23 & 0xffffffff00000000ull));
    }
  }
}

#if defined(__SSE2__)
// SSE2 (every x86-64). L[q] and H[q] hold, in 16-bit lane i, codes (2q, 2q+1) and
// (2q+8, 2q+9) of the tile row row_of_lane[i]: a 4 x 8 transpose of 16-bit lanes over q
// (unpack 16, 32, 64) assembles each of the eight rows' 16 codes, stored at origin + row * k.
// Inlined into the tile loops (a call per eight rows costs a third of the decode).
[[gnu::always_inline]] inline void store_lane_rows(const __m128i* L, const __m128i* H,
                                                   const int* row_of_lane, uint8_t* origin,
                                                   int64_t k) {
  const __m128i l01 = _mm_unpacklo_epi16(L[0], L[1]), l23 = _mm_unpacklo_epi16(L[2], L[3]);
  const __m128i l45 = _mm_unpackhi_epi16(L[0], L[1]), l67 = _mm_unpackhi_epi16(L[2], L[3]);
  const __m128i h01 = _mm_unpacklo_epi16(H[0], H[1]), h23 = _mm_unpacklo_epi16(H[2], H[3]);
  const __m128i h45 = _mm_unpackhi_epi16(H[0], H[1]), h67 = _mm_unpackhi_epi16(H[2], H[3]);
  // 64-bit lanes: codes 0..7 (l) or 8..15 (h) of lanes (0, 1), (2, 3), (4, 5), (6, 7).
  const __m128i l[4] = {_mm_unpacklo_epi32(l01, l23), _mm_unpackhi_epi32(l01, l23),
                        _mm_unpacklo_epi32(l45, l67), _mm_unpackhi_epi32(l45, l67)};
  const __m128i h[4] = {_mm_unpacklo_epi32(h01, h23), _mm_unpackhi_epi32(h01, h23),
                        _mm_unpacklo_epi32(h45, h67), _mm_unpackhi_epi32(h45, h67)};
  for (int p = 0; p < 4; ++p) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(origin + row_of_lane[2 * p] * k),
                     _mm_unpacklo_epi64(l[p], h[p]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(origin + row_of_lane[2 * p + 1] * k),
                     _mm_unpackhi_epi64(l[p], h[p]));
  }
}

// int4: per m, the 16 words 16 m + 4 q + j as four loads (q = 0..3, 32-bit lanes j). Nibbles to
// bytes; packus of each word's even and odd bytes gives 16-bit lane j = codes (2q, 2q+1) of row
// 16 j + m and lane 4 + j those of row 16 j + m + 8.
void unrepack_tile_int4_sse2(const uint32_t* tile, uint8_t* origin, int64_t k) {
  static constexpr int kRows[8] = {0, 16, 32, 48, 8, 24, 40, 56};
  const __m128i low = _mm_set1_epi8(0x0f), even = _mm_set1_epi16(0x00ff);
  for (int m = 0; m < 8; ++m) {
    __m128i L[4], H[4];
    for (int q = 0; q < 4; ++q) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + 16 * m + 4 * q));
      const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
      L[q] = _mm_packus_epi16(_mm_and_si128(lo, even), _mm_srli_epi16(lo, 8));
      H[q] = _mm_packus_epi16(_mm_and_si128(hi, even), _mm_srli_epi16(hi, 8));
    }
    store_lane_rows(L, H, kRows, origin + m * k, k);
  }
}

// int8: per m and q, the eight words 32 m + 8 q + r (r = 2 j + h, row 16 j + m + 8 h = m + 8 r)
// as two loads; each word's bytes are codes (b, b+8, b+1, b+9), b = 2q, so packus of the even
// bytes gives 16-bit lane r = codes (2q, 2q+1) and of the odd bytes (2q+8, 2q+9).
void unrepack_tile_int8_sse2(const uint32_t* tile, uint8_t* origin, int64_t k) {
  static constexpr int kRows[8] = {0, 8, 16, 24, 32, 40, 48, 56};
  const __m128i even = _mm_set1_epi16(0x00ff);
  for (int m = 0; m < 8; ++m) {
    __m128i L[4], H[4];
    for (int q = 0; q < 4; ++q) {
      const uint32_t* w = tile + 32 * m + 8 * q;
      const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
      const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 4));
      L[q] = _mm_packus_epi16(_mm_and_si128(v0, even), _mm_and_si128(v1, even));
      H[q] = _mm_packus_epi16(_mm_srli_epi16(v0, 8), _mm_srli_epi16(v1, 8));
    }
    store_lane_rows(L, H, kRows, origin + m * k, k);
  }
}
#endif

// One int8 tile (256 words): words 32 m + 8 q + 2 j + h, q = 0..3, hold row 16 j + m + 8 h.
void unrepack_tile_int8(const uint32_t* tile, uint8_t* origin, int64_t k) {
  for (int m = 0; m < 8; ++m) {
    const uint32_t* w = tile + 32 * m;
    for (int r = 0; r < 8; ++r) {  // r = 2 j + h
      const uint64_t u01 = unzip_bytes(pair(w[r], w[8 + r]));
      const uint64_t u23 = unzip_bytes(pair(w[16 + r], w[24 + r]));
      uint8_t* row = origin + (16 * (r >> 1) + m + 8 * (r & 1)) * k;
      store8(row, (u01 & 0xffffffffull) | (u23 << 32));
      store8(row + 8, (u01 >> 32) | (u23 & 0xffffffff00000000ull));
    }
  }
}

}  // namespace

bool marlin_unrepack_fast_applies(int bits, bool a8) {
  return !a8 && (bits == 4 || bits == 8);
}

namespace {

// tile_fn(tile words, origin of its 64 x 16 codes, row stride k), inlined into the loop.
template <void (*tile_fn)(const uint32_t*, uint8_t*, int64_t)>
void unrepack_tiles(const uint32_t* words, int64_t n, int64_t k, int bits, uint8_t* out_nk) {
  require((bits == 4 || bits == 8) && n > 0 && k > 0 && n % 64 == 0 && k % 16 == 0,
          "marlin_unrepack_fast", "not a 16-bit-activation Marlin tiling: " + dims(n, k, bits));
  const int T = marlin::words_per_tile(bits);
  const int64_t ntiles_n = n / 64, ntiles_k = k / 16;
  // Column of tiles by column: the 64 rows of a tile column are finished before the next, so
  // the rows being written stay in cache; the tiles are read with a stride of one tile row.
  for (int64_t nt = 0; nt < ntiles_n; ++nt) {
    uint8_t* rows = out_nk + nt * 64 * k;
    for (int64_t kt = 0; kt < ntiles_k; ++kt)
      tile_fn(words + (kt * ntiles_n + nt) * T, rows + 16 * kt, k);
  }
}

}  // namespace

void marlin_unrepack_fast(const uint32_t* words, int64_t n, int64_t k, int bits, uint8_t* out_nk) {
#if defined(__SSE2__)
  if (bits == 4)
    unrepack_tiles<unrepack_tile_int4_sse2>(words, n, k, bits, out_nk);
  else
    unrepack_tiles<unrepack_tile_int8_sse2>(words, n, k, bits, out_nk);
#else
  marlin_unrepack_swar(words, n, k, bits, out_nk);
#endif
}

void marlin_unrepack_swar(const uint32_t* words, int64_t n, int64_t k, int bits, uint8_t* out_nk) {
  if (bits == 4)
    unrepack_tiles<unrepack_tile_int4>(words, n, k, bits, out_nk);
  else
    unrepack_tiles<unrepack_tile_int8>(words, n, k, bits, out_nk);
}

void marlin_unrepack_sorted_fast(const uint32_t* words, int64_t n, int64_t k, int bits,
                                 const int32_t* sort, uint8_t* scratch, uint8_t* out_nk) {
  marlin_unrepack_fast(words, n, k, bits, scratch);
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* from = scratch + r * k;
    uint8_t* to = out_nk + r * k;
    for (int64_t i = 0; i < k; ++i) to[sort[i]] = from[i];
  }
}

void marlin_unpermute_transpose_scales(const uint16_t* in_gn, int64_t g, int64_t n, bool grouped,
                                       uint16_t* out_ng) {
  const int c = marlin::scale_chunk(grouped);
  require(g > 0 && n > 0 && (g * n) % c == 0, "scales",
          "G=" + std::to_string(g) + " N=" + std::to_string(n) + " is not a whole number of " +
              std::to_string(c) + "-entry chunks");
  int dst[64];
  for (int i = 0; i < c; ++i) dst[i] = marlin::scale_perm_dst(grouped, i);
  // Logical element x = gi * N + ni sits at (x / c) * c + dst[x % c] of the permuted tensor.
  for (int64_t gi = 0; gi < g; ++gi)
    for (int64_t ni = 0; ni < n; ++ni) {
      const int64_t x = gi * n + ni;
      out_ng[ni * g + gi] = in_gn[x - x % c + dst[x % c]];
    }
}

void marlin_unpack_zero_points_transposed(const uint32_t* words, int64_t g, int64_t n, int bits,
                                          bool a8, uint8_t* out_ng) {
  require(bits == 4 || bits == 8, "qzeros", "bits=" + std::to_string(bits));
  const int pf = marlin::pack_factor(bits);
  require(g > 0 && n > 0 && (g * n) % 64 == 0 && n % pf == 0, "qzeros",
          "G=" + std::to_string(g) + " N=" + std::to_string(n) + ": not whole 64-entry chunks");
  int src[64];
  for (int i = 0; i < 64; ++i) src[i] = marlin::zero_point_src(bits, a8, i);
  const uint32_t mask = (1u << bits) - 1u;
  // Position x of the packed tensor holds logical zero point (x / 64) * 64 + src[x % 64].
  for (int64_t x = 0; x < g * n; ++x) {
    const int64_t logical = x - x % 64 + src[x % 64];
    out_ng[(logical % n) * g + logical / n] =
        static_cast<uint8_t>((words[x / pf] >> (bits * (x % pf))) & mask);
  }
}

}  // namespace moepack
