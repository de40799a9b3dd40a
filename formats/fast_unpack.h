// Fast Marlin decode: tile words -> canonical codes several codes per operation (SSE2 on
// x86-64, 64-bit integer words elsewhere), scales and zero points un-permuted and transposed
// in one pass. The inverse of the word-at-a-time pack of
// formats/fast_path.cpp (marlin_tile_int4 / marlin_tile_int8), used by the Marlin row's unpack
// (formats/marlin.cpp) for every 16-bit-activation integer layer: GPTQ int4/int8, AWQ int4 with
// zero points, compressed-tensors W4A16/W8A16, with and without act-order, every group size.
//
// The scalar definitions stay in formats/marlin.h (marlin_unrepack, marlin_unpermute_scales,
// marlin_unpack_zero_points) and unpack_marlin_moe_scalar; each function here returns exactly
// their bytes (tests/unit/fast_unpack.cpp compares them over the legal shape space). Inputs are
// what marlin.cpp's read_layer validated: the shape preconditions below are checked and a
// violation is kInternal (a caller bug), never a verdict on the bytes.
//
//   int4 16-bit-activation tile (16 k x 64 n, 128 words): word r = 16 m + 4 q + j (m < 8,
//   q < 4, j < 4) holds, nibble by nibble, codes (k, n) = (b,c) (b+8,c) (b,c+8) (b+8,c+8)
//   (b+1,c) (b+9,c) (b+1,c+8) (b+9,c+8) with b = 2q, c = 16 j + m. The low nibbles of the words
//   q = 0..3 are, byte-unzipped, codes k = 0..7 of rows c and c + 8; their high nibbles k = 8..15.
//   int8 tile (256 words): word r = 32 m + 8 q + 2 j + h holds codes k = b, b+8, b+1, b+9 of row
//   c + 8h: byte-unzipping words q = 0, 1 (and 2, 3) gives k = 0..3 and 8..11 (4..7, 12..15).
#pragma once

#include <cstddef>
#include <cstdint>

namespace moepack {

// Whether marlin_unrepack_fast decodes this variant: the 16-bit-activation tiles, 4 or 8 bits.
// (The a8 tiles go through the scalar marlin_unrepack.)
bool marlin_unrepack_fast_applies(int bits, bool a8);

// Codes [N, K] (one per byte) of the logical matrix Q'[k, n] the tiles hold, written to out_nk
// (N * K bytes): marlin_unrepack's bytes. words: [K/16, N*16/pf] uint32. N % 64 == 0, K % 16 == 0.
void marlin_unrepack_fast(const uint32_t* words, int64_t n, int64_t k, int bits, uint8_t* out_nk);

// The same bytes with 64-bit integer words only (no SIMD): what marlin_unrepack_fast runs where
// SSE2 is missing (it takes SSE2 on x86-64); tests compare both with the scalar decode.
void marlin_unrepack_swar(const uint32_t* words, int64_t n, int64_t k, int bits, uint8_t* out_nk);

// The same with the act-order rows put back: out_nk[n * K + sort[k]] = Q'[k, n]. `sort` is a
// permutation of [0, K) (checked by the caller); scratch holds N * K bytes.
void marlin_unrepack_sorted_fast(const uint32_t* words, int64_t n, int64_t k, int bits,
                                 const int32_t* sort, uint8_t* scratch, uint8_t* out_nk);

// Scales of one expert: the permuted [G, N] 16-bit elements in, canonical [N, G] out (the scale
// permutation undone and the transpose done in one pass): marlin_unpermute_scales followed by a
// [G, N] -> [N, G] transpose. G * N must be a whole number of permutation chunks (64 grouped,
// 32 single).
void marlin_unpermute_transpose_scales(const uint16_t* in_gn, int64_t g, int64_t n, bool grouped,
                                       uint16_t* out_ng);

// Zero points of one expert: words [G, N/pf] in, canonical codes [N, G] out:
// marlin_unpack_zero_points followed by the transpose. G * N % 64 == 0, N % pf == 0.
void marlin_unpack_zero_points_transposed(const uint32_t* words, int64_t g, int64_t n, int bits,
                                          bool a8, uint8_t* out_ng);

}  // namespace moepack
