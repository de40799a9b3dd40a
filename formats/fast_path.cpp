// Direct fast paths (formats/fast_path.h): GPTQ / compressed-tensors pack-quantized / AWQ ->
// Marlin and ModelOpt / compressed-tensors MXFP8 -> TRT-LLM MXFP8, byte-identical to
// SourceCodec.unpack + stack + TargetLayout.pack.
//
// What each path replicates of the canonical one:
//   - the codec's input checks (suffix set, dtypes, shapes, finite scales, g_idx range and
//     consistency with the config, compressed-tensors weight_shape and symmetric zero points) --
//     as "decline" instead of an error;
//   - load_moe_experts' stacking: w13 = [gate; up] on N; explicit (trivial) g_idx when the plan
//     forces them; gate and up must carry the same g_idx; mixed scale dtypes (the canonical path
//     widens them to F32 first, which is exact, so converting each from its own dtype through
//     float32 gives the same bytes);
//   - the layout's pack: Marlin tiles (marlin::word_field_coords, unrolled as repack_16bit_act
//     does), scale conversion and permutation, zero points, act-order sort indices, vLLM 0.33's
//     intermediate padding; TRT-LLM MXFP8 row maps and the 128x4 scale interleave.
#include "formats/fast_path.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <set>

#include "core/half.h"
#include "core/threads.h"
#include "formats/awq.h"
#include "formats/fast_path_mxfp4.h"
#include "formats/fp8.h"
#include "formats/layout/marlin_layout.h"
#include "formats/marlin.h"
#include "formats/trtllm_mxfp8.h"
#include "formats/wna16_util.h"

namespace moepack {
namespace {

using LinearViews = std::map<std::string, TensorView>;

std::string num(int64_t v) {
  return std::to_string(v);
}

const TensorView* find_view(const LinearViews& m, const char* suffix) {
  auto it = m.find(suffix);
  return it == m.end() ? nullptr : &it->second;
}

bool dtype_in(DType d, std::initializer_list<DType> ok) {
  return std::find(ok.begin(), ok.end(), d) != ok.end();
}

bool is_float_scale(DType d) {
  return dtype_in(d, {DType::kF16, DType::kBF16, DType::kF32});
}

// The codec's suffix rule (load_moe_experts): every required suffix present, nothing unknown.
bool suffixes_as_codec_reads(const QuantParams& q, const LinearViews& m) {
  const SourceCodec* codec = find_source_codec(q.method);
  if (!codec) return false;
  std::set<std::string> known;
  for (const auto& s : codec->required_suffixes(q)) {
    if (!m.count(s)) return false;
    known.insert(s);
  }
  for (const auto& s : codec->optional_suffixes(q)) known.insert(s);
  for (const auto& kv : m)
    if (!known.count(kv.first)) return false;
  return true;
}

int64_t groups_of(int64_t k, int64_t group_size) {
  return group_size > 0 ? (k + group_size - 1) / group_size : 1;
}

// Runs a direct conversion; any Error (a scale that overflows the activation dtype, ...) means
// the bytes hold something the canonical path decides on, so the chunk goes there.
template <typename Fn>
std::optional<std::vector<Tensor>> declining_errors(Fn fn) {
  try {
    return fn();
  } catch (const Error&) {
    return std::nullopt;
  }
}

// ---- WNA16 sources ------------------------------------------------------------------------------

enum class WordOrder : uint8_t {
  kGptq,  // qweight [K/pf, N]: word (kw, n) holds k = pf*kw .. pf*kw+pf-1, low bits first
  kCt,    // weight_packed [N, K/pf]: the same words, stored row n first
  kAwq,   // qweight [K, N/8]: word (k, c) holds n = 8c + kAwqOrder[p] in field p
};

// One source Linear of one expert, validated.
struct WnaLinear {
  const uint8_t* words = nullptr;   // packed codes (unaligned little-endian words)
  const uint8_t* scales = nullptr;  // GPTQ / AWQ [G, N], compressed-tensors [N, G]
  DType scale_dtype = DType::kF16;
  int64_t scale_bytes = 2;         // of scale_dtype
  const uint8_t* zeros = nullptr;  // AWQ qzeros [G, N/8]
  std::vector<int32_t> g_idx;      // [K], empty when trivial (k / group_size)
  int64_t n = 0, k = 0, g = 0;
};

// AWQ field of logical column n % 8 (inverse of kAwqOrder).
constexpr int kAwqField[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// Reads one Linear's tensors as the codec's unpack would accept them; false where it would not.
bool read_wna_linear(const QuantParams& q, WordOrder order, const LinearViews& m, int64_t n,
                     int64_t k, WnaLinear* out) {
  if (!suffixes_as_codec_reads(q, m)) return false;
  const int bits = q.bits;
  if (n <= 0 || k <= 0 || (bits != 4 && bits != 8)) return false;
  const int pf = 32 / bits;
  if (k % pf != 0) return false;
  if (q.group_size == 0 || q.group_size < -1) return false;
  const int64_t G = groups_of(k, q.group_size);
  out->n = n;
  out->k = k;
  out->g = G;
  const char* qname = order == WordOrder::kCt ? "weight_packed" : "qweight";
  const char* sname = order == WordOrder::kCt ? "weight_scale" : "scales";
  const TensorView* qw = find_view(m, qname);
  const TensorView* sc = find_view(m, sname);
  if (!qw || !sc || !dtype_in(qw->dtype, {DType::kI32, DType::kU32})) return false;
  const Shape want_q = order == WordOrder::kGptq ? Shape{k / pf, n}
                       : order == WordOrder::kCt ? Shape{n, k / pf}
                                                 : Shape{k, n / 8};
  if (qw->shape != want_q) return false;
  if (!is_float_scale(sc->dtype)) return false;
  if (sc->shape != (order == WordOrder::kCt ? Shape{n, G} : Shape{G, n})) return false;
  out->words = qw->data;
  out->scales = sc->data;
  out->scale_dtype = sc->dtype;
  out->scale_bytes = dtype_bits(sc->dtype) / 8;

  if (order == WordOrder::kAwq) {
    if (bits != 4 || q.group_size <= 0 || n % 8 != 0) return false;
    const TensorView* qz = find_view(m, "qzeros");
    if (!qz || !dtype_in(qz->dtype, {DType::kI32, DType::kU32}) || qz->shape != Shape{G, n / 8})
      return false;
    out->zeros = qz->data;
    return true;
  }
  if (!q.symmetric) return false;  // Marlin takes zero points from AWQ only
  if (order == WordOrder::kCt) {
    if (const TensorView* ws = find_view(m, "weight_shape")) {
      if (!dtype_in(ws->dtype, {DType::kI64, DType::kI32}) || ws->shape != Shape{2}) return false;
      int64_t v[2];
      for (int i = 0; i < 2; ++i) {
        if (ws->dtype == DType::kI64) {
          std::memcpy(&v[i], ws->data + 8 * i, 8);
        } else {
          int32_t x;
          std::memcpy(&x, ws->data + 4 * i, 4);
          v[i] = x;
        }
      }
      if (v[0] != n || v[1] != k) return false;
    }
    // A symmetric scheme's zero points, if written at all, must be the symmetric zero.
    if (const TensorView* zp = find_view(m, "weight_zero_point")) {
      const uint32_t mask = (1u << bits) - 1u, packed_zero = 1u << (bits - 1);
      if (dtype_in(zp->dtype, {DType::kI32, DType::kU32})) {
        for (uint64_t i = 0; i + 4 <= zp->nbytes; i += 4) {
          const uint32_t w = wna16::load_u32(zp->data + i);
          if (w == 0) continue;
          for (int f = 0; f < pf; ++f)
            if (((w >> (bits * f)) & mask) != packed_zero) return false;
        }
      } else {
        for (uint64_t i = 0; i < zp->nbytes; ++i)
          if (zp->data[i] != 0) return false;
      }
    }
  }
  const char* gname = order == WordOrder::kCt ? "weight_g_idx" : "g_idx";
  if (const TensorView* gi = find_view(m, gname)) {
    if (gi->dtype != DType::kI32 || gi->shape != Shape{k}) return false;
    out->g_idx.resize(static_cast<size_t>(k));
    std::memcpy(out->g_idx.data(), gi->data, static_cast<size_t>(k) * 4);
    bool trivial = true;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t g = out->g_idx[static_cast<size_t>(i)];
      if (g < 0 || g >= G) return false;
      trivial = trivial && g == wna16::trivial_group(i, q.group_size);
    }
    if (trivial) out->g_idx.clear();
    if (!q.act_order && !out->g_idx.empty()) return false;
  } else if (q.act_order) {
    return false;
  }
  return true;
}

// Logical row n of a projection: the Linear and row it comes from, or padding (lin == nullptr).
struct RowRef {
  const WnaLinear* lin = nullptr;
  int64_t row = 0;
};

// One projection of one expert as the layout sees it: N x K logical (padding included), of which
// the source holds k_real columns of K.
struct ProjSource {
  std::vector<RowRef> rows;  // [N]
  int64_t n = 0, k = 0, k_real = 0, g = 0;
};

// Code (k, n) of a source row, 0 in padding.
inline uint32_t wna_code(WordOrder order, int bits, const RowRef& r, int64_t k, int64_t k_real) {
  if (!r.lin || k >= k_real) return 0;
  const WnaLinear& L = *r.lin;
  if (order == WordOrder::kAwq) {
    const uint32_t w = wna16::load_u32(L.words + (k * (L.n / 8) + r.row / 8) * 4);
    return (w >> (4 * kAwqField[r.row % 8])) & 15u;
  }
  const int pf = 32 / bits;
  const int64_t kw = k / pf;
  const int64_t off = order == WordOrder::kGptq ? kw * L.n + r.row : r.row * (L.k / pf) + kw;
  return (wna16::load_u32(L.words + off * 4) >> (bits * (k % pf))) & ((1u << bits) - 1u);
}

// Marlin 16-bit-activation tiles field by field, for act-order rows `perm` (codes in g_idx order
// are not whole source words): the same unrolled map as marlin_words_tiled, one code at a time.
void marlin_words_generic(WordOrder order, int bits, const ProjSource& p, const int32_t* perm,
                          uint32_t* out) {
  const int T = marlin::words_per_tile(bits);
  const int64_t ntiles_n = p.n / 64;
  int64_t kx[16];
  for (int64_t kt = 0; kt < p.k / 16; ++kt) {
    for (int i = 0; i < 16; ++i) kx[i] = perm ? perm[16 * kt + i] : 16 * kt + i;
    for (int64_t nt = 0; nt < ntiles_n; ++nt) {
      uint32_t* dst = out + (kt * ntiles_n + nt) * T;
      for (int r = 0; r < T; ++r) {
        uint32_t w;
        const auto code = [&](const RowRef& row, int64_t k) {
          return wna_code(order, bits, row, k, p.k_real);
        };
        if (bits == 4) {
          const int t = r >> 2, j = r & 3, b = 2 * (t & 3);
          const int64_t c0 = 64 * nt + 16 * j + (t >> 2);
          const RowRef& A = p.rows[static_cast<size_t>(c0)];
          const RowRef& B = p.rows[static_cast<size_t>(c0 + 8)];
          w = code(A, kx[b]) | code(A, kx[b + 8]) << 4 | code(B, kx[b]) << 8 |
              code(B, kx[b + 8]) << 12 | code(A, kx[b + 1]) << 16 | code(A, kx[b + 9]) << 20 |
              code(B, kx[b + 1]) << 24 | code(B, kx[b + 9]) << 28;
        } else {
          const int t = r >> 3, j = (r & 7) >> 1, h = r & 1, b = 2 * (t & 3);
          const RowRef& R = p.rows[static_cast<size_t>(64 * nt + 16 * j + (t >> 2) + 8 * h)];
          w = code(R, kx[b]) | code(R, kx[b + 8]) << 8 | code(R, kx[b + 1]) << 16 |
              code(R, kx[b + 9]) << 24;
        }
        dst[r] = w;
      }
    }
  }
}

// ---- Marlin tiles from K-packed words
// ------------------------------------------------------------
//
// A 16-bit-activation Marlin tile (16 k x 64 n) is built in two steps: gather the tile's source
// codes as K-packed words per column (`TileWords`: word i of column c holds codes k = 16 kt + pf i
// .. + pf - 1 of tile column c, low bits first, as a GPTQ word does; 0 in padding), then shuffle
// them into the tile's words (marlin_tile_int4 / marlin_tile_int8). The shuffle is
// marlin::word_field_coords as repack_16bit_act unrolls it:
//   int4 word: (k, n) = (b,c0) (b+8,c0) (b,c0+8) (b+8,c0+8) (b+1,c0) (b+9,c0) (b+1,c0+8) (b+9,c0+8)
//   int8 word: k = b, b+8, b+1, b+9 of row n = c0 + 8h
// done a word of codes at a time instead of a code at a time (marlin_words_generic, which defines
// the same words field by field, stays for act-order rows). The loops run over independent lanes
// (four or eight words side by side) so that the compiler keeps them in vector registers.
struct TileWords {
  uint32_t w[4][64];  // [16 / pf][tile_slot(column)]
};

// Column c = 16 j + m (j < 4, m < 16) of a tile sits in slot 4 m + j: the four columns one
// shuffle step reads side by side.
constexpr int tile_slot(int c) {
  return 4 * (c & 15) + (c >> 4);
}

// int4: word r = 16 m + 4 q + j of the tile (t = 4 m + q, c0 = 16 j + m, m < 8) is, byte by
// byte, [lo(c0), lo(c0 + 8), hi(c0), hi(c0 + 8)] of byte q, where lo(c) pairs the low nibbles of
// column c's two words (k = 2q and k = 2q + 8) and hi(c) their high nibbles (k = 2q + 1, 2q + 9):
// a 4x4 byte transpose of those four words, for the four j side by side.
void marlin_tile_int4(const TileWords& s, uint32_t* dst) {
  uint32_t lo[64], hi[64];
  for (int i = 0; i < 64; ++i) {
    const uint32_t a = s.w[0][i], b = s.w[1][i];
    lo[i] = (a & 0x0f0f0f0fu) | ((b & 0x0f0f0f0fu) << 4);
    hi[i] = ((a >> 4) & 0x0f0f0f0fu) | (b & 0xf0f0f0f0u);
  }
  for (int m = 0; m < 8; ++m) {
    const uint32_t* A = lo + 4 * m;        // lo(16 j + m)
    const uint32_t* C = lo + 4 * (m + 8);  // lo(16 j + m + 8)
    const uint32_t* A2 = hi + 4 * m;
    const uint32_t* C2 = hi + 4 * (m + 8);
    uint32_t* out = dst + 16 * m;
    for (int j = 0; j < 4; ++j) {
      // Half-words, then bytes: byte q of row i (A, C, A2, C2) becomes byte i of word q.
      const uint32_t x0 = (A[j] & 0x0000ffffu) | (A2[j] << 16);
      const uint32_t x2 = (A[j] >> 16) | (A2[j] & 0xffff0000u);
      const uint32_t x1 = (C[j] & 0x0000ffffu) | (C2[j] << 16);
      const uint32_t x3 = (C[j] >> 16) | (C2[j] & 0xffff0000u);
      out[j] = (x0 & 0x00ff00ffu) | ((x1 & 0x00ff00ffu) << 8);
      out[4 + j] = ((x0 >> 8) & 0x00ff00ffu) | (x1 & 0xff00ff00u);
      out[8 + j] = (x2 & 0x00ff00ffu) | ((x3 & 0x00ff00ffu) << 8);
      out[12 + j] = ((x2 >> 8) & 0x00ff00ffu) | (x3 & 0xff00ff00u);
    }
  }
}

// int8: word r (t = r >> 3, j = (r & 7) >> 1, h = r & 1) of row c0 + 8 h, c0 = 16 j + (t >> 2),
// interleaves the half-word of k = b, b + 1 (word b / 4) with that of k = b + 8, b + 9 (word
// 2 + b / 4), b = 2 (t & 3).
void marlin_tile_int8(const TileWords& s, uint32_t* dst) {
  for (int r = 0; r < 256; ++r) {
    const int t = r >> 3, j = (r & 7) >> 1, h = r & 1, tt = t & 3;
    const int c = tile_slot(16 * j + (t >> 2) + 8 * h), sh = 16 * (tt & 1);
    const uint32_t lo = (s.w[tt >> 1][c] >> sh) & 0xffffu;
    const uint32_t hi = (s.w[2 + (tt >> 1)][c] >> sh) & 0xffffu;
    dst[r] = (lo & 0xffu) | (hi & 0xffu) << 8 | (lo >> 8) << 16 | (hi >> 8) << 24;
  }
}

// Where each logical row's K-packed words are (GPTQ, CT): word kw of row n at col[n] +
// kw * stride[n] bytes; nullptr for a padding row.
struct KpackedRows {
  std::vector<const uint8_t*> col;
  std::vector<int64_t> stride;
};

KpackedRows kpacked_rows(WordOrder order, int pf, const ProjSource& p) {
  KpackedRows kr;
  kr.col.assign(static_cast<size_t>(p.n), nullptr);
  kr.stride.assign(static_cast<size_t>(p.n), 0);
  for (int64_t n = 0; n < p.n; ++n) {
    const RowRef& r = p.rows[static_cast<size_t>(n)];
    if (!r.lin) continue;
    const int64_t kw_real = r.lin->k / pf;
    const bool gptq = order == WordOrder::kGptq;  // [K/pf, N] : [N, K/pf]
    kr.col[static_cast<size_t>(n)] = r.lin->words + (gptq ? r.row : r.row * kw_real) * 4;
    kr.stride[static_cast<size_t>(n)] = gptq ? r.lin->n * 4 : 4;
  }
  return kr;
}

// The words of tile (kt, nt) from GPTQ / CT rows.
void gather_kpacked(const KpackedRows& kr, int kw_per_tile, int64_t kw_real, int64_t kt, int64_t nt,
                    TileWords& s) {
  for (int i = 0; i < kw_per_tile; ++i) {
    const int64_t kw = kw_per_tile * kt + i;
    uint32_t* dst = s.w[i];
    if (kw >= kw_real) {
      std::fill(dst, dst + 64, 0u);
      continue;
    }
    for (int c = 0; c < 64; ++c) {
      const size_t n = static_cast<size_t>(64 * nt + c);
      const uint8_t* q = kr.col[n];
      dst[tile_slot(c)] = q ? wna16::load_u32(q + kw * kr.stride[n]) : 0u;
    }
  }
}

// 8x8 nibble transposes side by side: for each lane l < 8, nibble p of x[i][l] becomes nibble i
// of x[p][l] (4x4 blocks of half-words, then 2x2 blocks of bytes, then nibbles).
void transpose_nibbles_8x8(uint32_t (&x)[8][8]) {
  for (int i = 0; i < 4; ++i)
    for (int l = 0; l < 8; ++l) {
      const uint32_t a = x[i][l], b = x[i + 4][l];
      x[i][l] = (a & 0x0000ffffu) | (b << 16);
      x[i + 4][l] = (a >> 16) | (b & 0xffff0000u);
    }
  for (int i : {0, 1, 4, 5})
    for (int l = 0; l < 8; ++l) {
      const uint32_t a = x[i][l], b = x[i + 2][l];
      x[i][l] = (a & 0x00ff00ffu) | ((b & 0x00ff00ffu) << 8);
      x[i + 2][l] = ((a >> 8) & 0x00ff00ffu) | (b & 0xff00ff00u);
    }
  for (int i = 0; i < 8; i += 2)
    for (int l = 0; l < 8; ++l) {
      const uint32_t a = x[i][l], b = x[i + 1][l];
      x[i][l] = (a & 0x0f0f0f0fu) | ((b & 0x0f0f0f0fu) << 4);
      x[i + 1][l] = ((a >> 4) & 0x0f0f0f0fu) | (b & 0xf0f0f0f0u);
    }
}

// The words of tile (kt, nt) from AWQ's N-packed rows. When the tile's 64 columns are 64
// consecutive rows of one Linear (from a multiple of 8), its eight AWQ words per k are
// consecutive: eight of them (k = 8 kw .. 8 kw + 7, one word column) are one 8x8 nibble
// transpose from eight K-packed words, field p of an AWQ word being column kAwqOrder[p] of its
// eight. Other tiles (padding, gate and up in one tile) are read code by code.
void gather_awq(const ProjSource& p, int64_t kt, int64_t nt, TileWords& s) {
  const int64_t kw_real = p.k_real / 8;
  const RowRef& first = p.rows[static_cast<size_t>(64 * nt)];
  const RowRef& last = p.rows[static_cast<size_t>(64 * nt + 63)];
  const bool whole =
      first.lin && last.lin == first.lin && last.row == first.row + 63 && first.row % 8 == 0;
  for (int i = 0; i < 2; ++i) {
    const int64_t kw = 2 * kt + i;
    uint32_t* dst = s.w[i];
    if (kw >= kw_real) {
      std::fill(dst, dst + 64, 0u);
    } else if (whole) {
      const WnaLinear& L = *first.lin;
      uint32_t x[8][8];  // [k - 8 kw][word column of the tile]
      for (int r = 0; r < 8; ++r) {
        const uint8_t* row = L.words + ((8 * kw + r) * (L.n / 8) + first.row / 8) * 4;
        for (int l = 0; l < 8; ++l) x[r][l] = wna16::load_u32(row + 4 * l);
      }
      transpose_nibbles_8x8(x);
      for (int f = 0; f < 8; ++f)
        for (int l = 0; l < 8; ++l) dst[tile_slot(8 * l + kAwqOrder[f])] = x[f][l];
    } else {
      for (int c = 0; c < 64; ++c) {
        const RowRef& row = p.rows[static_cast<size_t>(64 * nt + c)];
        uint32_t w = 0;
        for (int r = 0; r < 8; ++r)
          w |= wna_code(WordOrder::kAwq, 4, row, 8 * kw + r, p.k_real) << (4 * r);
        dst[tile_slot(c)] = w;
      }
    }
  }
}

// Marlin 16-bit-activation tiles of a projection without act-order, tile by tile.
void marlin_words_tiled(WordOrder order, int bits, const ProjSource& p, uint32_t* out) {
  const int pf = 32 / bits, T = marlin::words_per_tile(bits), kw_per_tile = 16 / pf;
  const int64_t ntiles_n = p.n / 64, kw_real = p.k_real / pf;
  const KpackedRows kr = order == WordOrder::kAwq ? KpackedRows() : kpacked_rows(order, pf, p);
  TileWords s;
  // Tiles are independent: GPTQ and AWQ rows are N-contiguous, so a row of tiles (all nt for one
  // kt) reads whole source lines; compressed-tensors rows are K-contiguous, so a column of tiles
  // (all kt for one nt: 64 rows read front to back) does, from a few KiB that stay in cache.
  const bool k_inner = order == WordOrder::kCt;
  const int64_t ktiles = p.k / 16;
  for (int64_t i = 0; i < ktiles * ntiles_n; ++i) {
    const int64_t kt = k_inner ? i % ktiles : i / ntiles_n;
    const int64_t nt = k_inner ? i / ktiles : i % ntiles_n;
    if (order == WordOrder::kAwq)
      gather_awq(p, kt, nt, s);
    else
      gather_kpacked(kr, kw_per_tile, kw_real, kt, nt, s);
    uint32_t* dst = out + (kt * ntiles_n + nt) * T;
    if (bits == 4)
      marlin_tile_int4(s, dst);
    else
      marlin_tile_int8(s, dst);
  }
}

// Scale (g, n) of a source Linear.
inline const uint8_t* wna_scale(WordOrder order, const WnaLinear& L, int64_t g, int64_t n) {
  return L.scales + (order == WordOrder::kCt ? n * L.g + g : g * L.n + n) * L.scale_bytes;
}

struct MarlinProjOut {
  MoeProj proj;
  MarlinParamNames names;
  int64_t n = 0, k = 0, k_real = 0, g = 0;
  bool act_order = false, grouped = false;
  Tensor qweight, scales, qzeros, g_idx, sort;
};

using ChunkLinears = std::vector<std::array<WnaLinear, 3>>;  // [e][proj], no gate if not gated

// Every Linear of the chunk, validated as its codec would; nullopt where one is not.
std::optional<ChunkLinears> read_chunk_linears(const DirectSource& src, WordOrder order) {
  const int64_t E = src.experts(), H = src.hidden, I = src.inter;
  ChunkLinears lins(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    for (int p = 0; p < 3; ++p) {
      if (p == 0 && !src.gated) continue;
      const int64_t n = p == 2 ? H : I, k = p == 2 ? I : H;
      if (!read_wna_linear(src.quant, order, src.linears[static_cast<size_t>(e)][p], n, k,
                           &lins[static_cast<size_t>(e)][p]))
        return std::nullopt;
    }
  return lins;
}

// The two projections' output tensors (w13, w2) with their sizes: I padded to `ip`, names by the
// source method, g_idx and sort indices where the vLLM target has them. False where a Linear
// carries g_idx the plan does not expect (the canonical path refuses them: kInternal) or the
// tiles do not fit.
bool marlin_outputs(const LayoutOptions& opts, const DirectSource& src, int64_t ip,
                    const ChunkLinears& lins, MarlinProjOut (&outs)[2]) {
  const QuantParams& q = src.quant;
  const int pf = 32 / q.bits;
  const int64_t E = src.experts(), H = src.hidden, I = src.inter;
  const bool index_params = vllm_target_row(opts.vllm_target).moe_act_order;
  for (int i = 0; i < 2; ++i) {
    MarlinProjOut& o = outs[i];
    o.proj = i == 0 ? MoeProj::kW13 : MoeProj::kW2;
    o.names = marlin_param_names(opts.source_method, o.proj);
    o.n = i == 0 ? (src.gated ? 2 : 1) * ip : H;
    o.k = i == 0 ? H : ip;
    o.k_real = i == 0 ? H : I;
    o.g = groups_of(o.k, q.group_size);
    o.act_order = i == 0 ? src.g_idx_w13 : src.g_idx_w2;
    if (o.n % 64 != 0 || o.k % 16 != 0) return false;  // the word loops walk whole tiles
    // The scale rule's size_k is the real I (vLLM passes intermediate_size_per_partition).
    o.grouped = marlin_scales_grouped(opts, o.proj, q.group_size, o.g, I, q.bits,
                                      opts.vllm_w13_scale_size_k);
    const std::string& pre = opts.prefix;
    o.qweight = Tensor(pre + o.names.qweight, DType::kI32, {E, o.k / 16, o.n * 16 / pf});
    o.scales = Tensor(pre + o.names.scales, opts.act_dtype, {E, o.g, o.n});
    if (!o.names.qzeros.empty())
      o.qzeros = Tensor(pre + o.names.qzeros, DType::kI32, {E, o.g, o.n / pf});
    const int64_t gk = o.act_order ? o.k : 0;
    if (!o.names.g_idx.empty() && index_params)
      o.g_idx = Tensor(pre + o.names.g_idx, DType::kI32, {E, gk});
    o.sort = Tensor(pre + o.names.sort_indices, DType::kI32, {E, index_params ? gk : 0});
    if (!o.act_order)
      for (const auto& l : lins)
        for (int p = i == 0 ? 0 : 2; p < (i == 0 ? 2 : 3); ++p)
          if (!l[p].g_idx.empty()) return false;
  }
  return true;
}

// Logical rows of one expert's projection `o`: w2 from down; w13 = [gate; up], each padded from
// I to ip with empty rows.
ProjSource projection_rows(const MarlinProjOut& o, const std::array<WnaLinear, 3>& L, bool gated,
                           int64_t I, int64_t ip) {
  ProjSource ps;
  ps.n = o.n;
  ps.k = o.k;
  ps.k_real = o.k_real;
  ps.g = o.g;
  ps.rows.resize(static_cast<size_t>(o.n));
  for (int64_t n = 0; n < o.n; ++n) {
    RowRef& rr = ps.rows[static_cast<size_t>(n)];
    if (o.proj == MoeProj::kW2)
      rr = {&L[2], n};
    else if (n % ip < I)
      rr = {&L[gated && n / ip == 0 ? 0 : 1], n % ip};
  }
  return ps;
}

// Act-order: the layer's g_idx for this projection (gate's and up's must agree), trivial ones made
// explicit; each group must hold exactly group_size rows. Writes expert e's sort indices (and
// g_idx in sorted order) into `o` and returns the sort permutation; false where the bytes break
// a rule (declined).
bool act_order_rows(MarlinProjOut& o, const std::array<WnaLinear, 3>& L, bool gated,
                    int64_t group_size, int64_t e, std::vector<int32_t>* perm) {
  const bool w13 = o.proj == MoeProj::kW13;
  std::vector<int32_t> gi;
  for (int p = w13 ? (gated ? 0 : 1) : 2; p < (w13 ? 2 : 3); ++p) {
    std::vector<int32_t> g = L[p].g_idx;
    if (g.empty()) {
      g.resize(static_cast<size_t>(o.k));
      for (int64_t k = 0; k < o.k; ++k)
        g[static_cast<size_t>(k)] = wna16::trivial_group(k, group_size);
    }
    if (gi.empty())
      gi = std::move(g);
    else if (g != gi)
      return false;
  }
  if (group_size > 0 && o.k % group_size == 0) {
    std::vector<int64_t> count(static_cast<size_t>(o.g), 0);
    for (int32_t g : gi) ++count[static_cast<size_t>(g)];
    for (int64_t c : count)
      if (c != group_size) return false;
  }
  *perm = stable_argsort(gi.data(), o.k);
  int32_t* sort_out = o.sort.as<int32_t>() + e * o.k;
  int32_t* g_out = o.g_idx.data.empty() ? nullptr : o.g_idx.as<int32_t>() + e * o.k;
  for (int64_t k = 0; k < o.k; ++k) {
    sort_out[k] = (*perm)[static_cast<size_t>(k)];
    if (g_out) g_out[k] = gi[static_cast<size_t>((*perm)[static_cast<size_t>(k)])];
  }
  return true;
}

// Whether a 16-bit float (F16 or BF16) is finite: its exponent is not all ones.
inline bool finite_16bit(uint16_t h, DType d) {
  return d == DType::kBF16 ? (h & 0x7f80u) != 0x7f80u : (h & 0x7c00u) != 0x7c00u;
}

// One scale (F16, BF16 or F32) in the activation dtype `to` (F16 or BF16) as convert_scale
// converts it (a copy, or through float32 rounded to nearest even), inline; false where the
// scale is not finite or overflows `to` (the canonical path refuses both: declined).
inline bool scale_to_16bit(const uint8_t* p, DType from, DType to, uint16_t* out) {
  if (from == to) {
    std::memcpy(out, p, 2);
    return finite_16bit(*out, from);
  }
  float v;
  if (from == DType::kF32) {
    std::memcpy(&v, p, 4);
  } else {
    uint16_t h;
    std::memcpy(&h, p, 2);
    v = from == DType::kBF16 ? bf16_to_float(h) : f16_to_float(h);
  }
  if (!std::isfinite(v)) return false;
  *out = to == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
  return finite_16bit(*out, to);
}

// Expert e's scales of projection `o` [G, N] in the activation dtype (padding 0), permuted as
// Marlin reads them. `s` is scratch. False where a scale is not finite (declined).
bool write_marlin_scales(WordOrder order, const LayoutOptions& opts, const ProjSource& ps,
                         int64_t e, std::vector<uint16_t>& s, MarlinProjOut& o) {
  s.assign(static_cast<size_t>(o.g * o.n), 0);
  const std::string what = opts.prefix + o.names.scales;
  for (int64_t n = 0; n < o.n; ++n) {
    const RowRef& rr = ps.rows[static_cast<size_t>(n)];
    if (!rr.lin) continue;
    const DType from = rr.lin->scale_dtype;
    const bool inline_16bit = opts.act_dtype == DType::kF16 || opts.act_dtype == DType::kBF16;
    for (int64_t g = 0; g < rr.lin->g; ++g) {
      const uint8_t* p = wna_scale(order, *rr.lin, g, rr.row);
      uint16_t* dst = &s[static_cast<size_t>(g * o.n + n)];
      if (inline_16bit) {
        if (!scale_to_16bit(p, from, opts.act_dtype, dst)) return false;
        continue;
      }
      if (!std::isfinite(scale_to_float(p, from))) return false;
      convert_scale(p, from, opts.act_dtype, reinterpret_cast<uint8_t*>(dst), what);
    }
  }
  marlin_permute_scales(reinterpret_cast<uint8_t*>(s.data()), o.g, o.n, 2, o.grouped);
  std::memcpy(o.scales.data.data() + e * o.g * o.n * 2, s.data(), s.size() * 2);
  return true;
}

// Expert e's zero points of projection `o` from AWQ's qzeros [G, N/8] (fields in kAwqOrder),
// packed as Marlin reads them. `zp` is scratch.
void write_marlin_zero_points(int bits, const ProjSource& ps, int64_t e, std::vector<uint8_t>& zp,
                              MarlinProjOut& o) {
  const int pf = 32 / bits;
  zp.assign(static_cast<size_t>(o.g * o.n), 0);
  for (int64_t n = 0; n < o.n; ++n) {
    const RowRef& rr = ps.rows[static_cast<size_t>(n)];
    if (!rr.lin) continue;
    const WnaLinear& l = *rr.lin;
    for (int64_t g = 0; g < l.g; ++g) {
      const uint32_t w = wna16::load_u32(l.zeros + (g * (l.n / 8) + rr.row / 8) * 4);
      zp[static_cast<size_t>(g * o.n + n)] =
          static_cast<uint8_t>((w >> (4 * kAwqField[rr.row % 8])) & 15u);
    }
  }
  const std::vector<uint32_t> zw = marlin_pack_zero_points(zp.data(), o.g, o.n, bits, false);
  std::memcpy(o.qzeros.data.data() + e * o.g * (o.n / pf) * 4, zw.data(), zw.size() * 4);
}

// One expert's projection `o`: Marlin words (tile by tile, or field by field for act-order rows),
// scales and zero points. False where the bytes make it decline.
bool marlin_expert_projection(WordOrder order, const LayoutOptions& opts, const DirectSource& src,
                              int64_t ip, const std::array<WnaLinear, 3>& L, int64_t e,
                              std::vector<uint16_t>& s, std::vector<uint8_t>& zp,
                              MarlinProjOut& o) {
  const int bits = src.quant.bits, pf = 32 / bits;
  const ProjSource ps = projection_rows(o, L, src.gated, src.inter, ip);
  std::vector<int32_t> perm;
  if (o.act_order && !act_order_rows(o, L, src.gated, src.quant.group_size, e, &perm)) return false;
  uint32_t* words = o.qweight.as<uint32_t>() + e * (o.k * o.n / pf);
  if (!perm.empty())
    marlin_words_generic(order, bits, ps, perm.data(), words);
  else
    marlin_words_tiled(order, bits, ps, words);
  if (!write_marlin_scales(order, opts, ps, e, s, o)) return false;
  if (o.names.qzeros.empty()) return true;
  if (order != WordOrder::kAwq) return false;  // zero points come from AWQ only
  write_marlin_zero_points(bits, ps, e, zp, o);
  return true;
}

// A chunk of WNA16 experts to Marlin, for a layer the plan gave a Marlin direct row (the layout
// takes its shape and options, the row's refusals are empty: not judged again here).
std::optional<std::vector<Tensor>> marlin_direct(const LayoutOptions& opts, const DirectSource& src,
                                                 WordOrder order) {
  const QuantParams& q = src.quant;
  if (src.experts() < 1) return std::nullopt;
  const std::optional<ChunkLinears> lins = read_chunk_linears(src, order);
  if (!lins) return std::nullopt;
  const int64_t E = src.experts(), I = src.inter;
  MoeShape real;
  real.experts = E;
  real.w13.n = (src.gated ? 2 : 1) * I;
  real.w13.k = src.hidden;
  real.w2.n = src.hidden;
  real.w2.k = I;
  real.w13.quant.group_size = real.w2.quant.group_size = q.group_size;
  const int64_t ip = marlin_padded_inter(opts, real);
  // Guards the loops below rely on (the plan's layout reasons imply both): padded rows never
  // carry act-order, and scales are 16-bit.
  if (ip != I && (src.g_idx_w13 || src.g_idx_w2)) return std::nullopt;
  if (dtype_bits(opts.act_dtype) != 16) return std::nullopt;
  MarlinProjOut outs[2];
  if (!marlin_outputs(opts, src, ip, *lins, outs)) return std::nullopt;

  std::atomic<bool> declined{false};
  parallel_for(E, opts.threads, [&](int64_t e0, int64_t e1) {
    std::vector<uint16_t> s;
    std::vector<uint8_t> zp;
    for (int64_t e = e0; e < e1 && !declined; ++e)
      for (MarlinProjOut& o : outs)
        if (!marlin_expert_projection(order, opts, src, ip, (*lins)[static_cast<size_t>(e)], e, s,
                                      zp, o)) {
          declined = true;
          return;
        }
  });
  if (declined) return std::nullopt;

  const bool index_params = vllm_target_row(opts.vllm_target).moe_act_order;
  std::vector<Tensor> out;
  for (MarlinProjOut& o : outs) {
    out.push_back(std::move(o.qweight));
    out.push_back(std::move(o.scales));
    if (!o.names.qzeros.empty()) out.push_back(std::move(o.qzeros));
    if (!o.names.g_idx.empty() && index_params) out.push_back(std::move(o.g_idx));
    if (index_params) out.push_back(std::move(o.sort));
  }
  return out;
}

std::optional<std::vector<Tensor>> gptq_to_marlin(const LayoutOptions& o, const DirectSource& s) {
  return declining_errors([&] { return marlin_direct(o, s, WordOrder::kGptq); });
}
std::optional<std::vector<Tensor>> ct_pack_to_marlin(const LayoutOptions& o,
                                                     const DirectSource& s) {
  return declining_errors([&] { return marlin_direct(o, s, WordOrder::kCt); });
}
std::optional<std::vector<Tensor>> awq_to_marlin(const LayoutOptions& o, const DirectSource& s) {
  return declining_errors([&] { return marlin_direct(o, s, WordOrder::kAwq); });
}

std::vector<std::string> marlin_direct_refusals(const QuantParams& q, const LayoutOptions& opts,
                                                const MoeShape&) {
  std::vector<std::string> why;
  if (q.bits != 4 && q.bits != 8) why.push_back("bits=" + num(q.bits) + " (direct: 4 or 8)");
  if (q.method != QuantMethod::kAwq && !q.symmetric)
    why.push_back("asymmetric codes (Marlin takes zero points from AWQ only)");
  if (opts.a8) why.push_back("8-bit-activation tiles (no direct path)");
  if (opts.source_method != q.method) why.push_back("layout options for another source method");
  return why;
}

// ---- MXFP8 -> TRT-LLM MXFP8 -------------------------------------------------------------------

constexpr int64_t kMxBlock = 32;

struct MxLinear {
  const uint8_t* codes = nullptr;   // F8_E4M3 [N, K]
  const uint8_t* scales = nullptr;  // E8M0 [N, K/32]
};

// Whether any byte is an e4m3 NaN code (S.1111.111), eight at a time: (b & 0x7f) + 1 reaches
// bit 7 exactly when b & 0x7f == 0x7f, and never carries into the next byte.
bool any_e4m3_nan(const uint8_t* p, uint64_t n) {
  uint64_t i = 0, hit = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x;
    std::memcpy(&x, p + i, 8);
    hit |= (x & 0x7f7f7f7f7f7f7f7fULL) + 0x0101010101010101ULL;
  }
  if (hit & 0x8080808080808080ULL) return true;
  for (; i < n; ++i)
    if (e4m3_is_nan(p[i])) return true;
  return false;
}

bool read_mx_linear(const QuantParams& q, const LinearViews& m, int64_t n, int64_t k,
                    MxLinear* out) {
  if (!suffixes_as_codec_reads(q, m) || n <= 0 || k <= 0 || k % kMxBlock != 0) return false;
  const TensorView* w = find_view(m, "weight");
  const TensorView* s = find_view(m, "weight_scale");
  if (!w || !s || w->dtype != DType::kF8_E4M3 || !is_scale_byte_dtype(s->dtype)) return false;
  if (w->shape != Shape{n, k} || s->shape != Shape{n, k / kMxBlock}) return false;
  if (std::memchr(s->data, 255, s->nbytes)) return false;  // E8M0 NaN: the codec refuses it
  if (any_e4m3_nan(w->data, w->nbytes)) return false;      // the codec refuses NaN codes too
  out->codes = w->data;
  out->scales = s->data;
  return true;
}

std::optional<std::vector<Tensor>> mxfp8_to_trtllm(const LayoutOptions& opts,
                                                   const DirectSource& src) {
  return declining_errors([&]() -> std::optional<std::vector<Tensor>> {
    const int64_t E = src.experts(), H = src.hidden, I = src.inter;
    const int64_t R13 = src.gated ? 2 * I : I;
    if (E < 1 || src.g_idx_w13 || src.g_idx_w2) return std::nullopt;
    std::vector<std::array<MxLinear, 3>> lins(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      for (int p = 0; p < 3; ++p) {
        if (p == 0 && !src.gated) continue;
        const int64_t n = p == 2 ? H : I, k = p == 2 ? I : H;
        if (!read_mx_linear(src.quant, src.linears[static_cast<size_t>(e)][p], n, k,
                            &lins[static_cast<size_t>(e)][p]))
          return std::nullopt;
      }
    // The 128x4 scale tiles below need these (the plan's layout reasons imply them).
    if (R13 % 128 != 0 || H % 128 != 0 || I % 128 != 0) return std::nullopt;
    const std::vector<int32_t> src13 = trtllm_w13_rows(R13, src.gated);
    const std::vector<int32_t> src2 = trtllm_w2_rows(H);
    const std::string& pre = opts.prefix;
    Tensor w13(pre + "w13_weight", DType::kF8_E4M3, {E, R13, H});
    Tensor w2(pre + "w2_weight", DType::kF8_E4M3, {E, H, I});
    Tensor s13(pre + "w13_weight_scale", DType::kU8, {E, R13, H / kMxBlock});
    Tensor s2(pre + "w2_weight_scale", DType::kU8, {E, H, I / kMxBlock});
    // Row r of the output takes source row src[r] of [gate; up] (w13) or down (w2), codes by one
    // copy and scales into their 128x4 tile positions.
    const auto rows = [](const std::vector<int32_t>& map, const auto& row_of, int64_t k,
                         uint8_t* out_codes, uint8_t* out_scales) {
      const int64_t cols = k / kMxBlock;
      for (int64_t r = 0; r < static_cast<int64_t>(map.size()); ++r) {
        const auto [lin, row] = row_of(map[static_cast<size_t>(r)]);
        std::memcpy(out_codes + r * k, lin->codes + row * k, static_cast<size_t>(k));
        for (int64_t b = 0; b < cols; ++b)
          out_scales[scale_128x4_offset(r, b, cols)] = lin->scales[row * cols + b];
      }
    };
    parallel_for(E, opts.threads, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) {
        const auto& L = lins[static_cast<size_t>(e)];
        rows(
            src13,
            [&](int64_t s) {
              return std::pair<const MxLinear*, int64_t>(src.gated && s < I ? &L[0] : &L[1],
                                                         src.gated ? s % I : s);
            },
            H, w13.data.data() + e * R13 * H, s13.data.data() + e * R13 * (H / kMxBlock));
        rows(
            src2, [&](int64_t s) { return std::pair<const MxLinear*, int64_t>(&L[2], s); }, I,
            w2.data.data() + e * H * I, s2.data.data() + e * H * (I / kMxBlock));
      }
    });
    std::vector<Tensor> out;
    out.push_back(std::move(w13));
    out.push_back(std::move(w2));
    out.push_back(std::move(s13));
    out.push_back(std::move(s2));
    return out;
  });
}

std::vector<std::string> mxfp8_direct_refusals(const QuantParams& q, const LayoutOptions&,
                                               const MoeShape&) {
  std::vector<std::string> why;
  if (q.bits != 8) why.push_back("bits=" + num(q.bits) + " (MXFP8 codes are 8-bit)");
  return why;
}

}  // namespace

const std::vector<DirectPath>& direct_paths() {
  static const std::vector<DirectPath> rows = {
      {.name = "gptq->marlin",
       .source = QuantMethod::kGptq,
       .layout = "marlin",
       .refusals = marlin_direct_refusals,
       .convert = gptq_to_marlin},
      {.name = "ct-pack->marlin",
       .source = QuantMethod::kCtPackQuantized,
       .layout = "marlin",
       .refusals = marlin_direct_refusals,
       .convert = ct_pack_to_marlin},
      {.name = "awq->marlin",
       .source = QuantMethod::kAwq,
       .layout = "marlin",
       .refusals = marlin_direct_refusals,
       .convert = awq_to_marlin},
      {.name = "modelopt-mxfp8->trtllm-mxfp8",
       .source = QuantMethod::kModeloptMxfp8,
       .layout = "trtllm-mxfp8",
       .refusals = mxfp8_direct_refusals,
       .convert = mxfp8_to_trtllm},
      {.name = "ct-mxfp8->trtllm-mxfp8",
       .source = QuantMethod::kCtMxfp8,
       .layout = "trtllm-mxfp8",
       .refusals = mxfp8_direct_refusals,
       .convert = mxfp8_to_trtllm},
      {.name = "gpt-oss-mxfp4->triton-mxfp4",
       .source = QuantMethod::kGptOssMxfp4,
       .layout = "triton-mxfp4",
       .refusals = gpt_oss_mxfp4_direct_refusals,
       .convert = gpt_oss_mxfp4_to_triton},
      {.name = "gpt-oss-mxfp4->marlin-mxfp4",
       .source = QuantMethod::kGptOssMxfp4,
       .layout = "marlin-mxfp4",
       .refusals = gpt_oss_mxfp4_direct_refusals,
       .convert = gpt_oss_mxfp4_to_marlin},
  };
  return rows;
}

const DirectPath* find_direct_path(QuantMethod source, const std::string& layout,
                                   const QuantParams& q, const LayoutOptions& opts,
                                   const MoeShape& shape, std::vector<std::string>* why_not) {
  for (const DirectPath& row : direct_paths()) {
    if (row.source != source || layout != row.layout) continue;
    std::vector<std::string> why = row.refusals(q, opts, shape);
    if (why.empty()) return &row;
    if (why_not) *why_not = std::move(why);
    return nullptr;
  }
  if (why_not)
    *why_not = {std::string("no direct path from ") + quant_method_name(source) + " to " + layout};
  return nullptr;
}

}  // namespace moepack
