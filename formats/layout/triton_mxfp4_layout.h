// The OAI Triton kernels' Hopper MXFP4 layouts (vLLM 0.33.0's vendored triton_kernels,
// tensor_details/layout_details/hopper_value.py HopperMXValueLayout (mma_version 3) and
// hopper_scale.py HopperMXScaleLayout), as index maps over one expert's bytes, shared by
// formats/triton_mxfp4.cpp and its reader (formats/layout/moe_reader.h). Raw integers only.
//
// vLLM's _swizzle_mxfp4 (quantization/utils/mxfp4_utils.py) hands both layouts the transpose of
// the [M, K/2] byte rows (M output rows, byte b of a row = code 2b | code 2b+1 << 4) with mx_axis
// 1; each layout transposes back (_maybe_mT), so both swizzle the [M, cols] matrix and the
// triton Tensor's storage is the transpose of a contiguous buffer: the buffer below, which is
// what moepack writes.
//
// Values: M padded to 16 rows, the K/2 bytes of a row to kbp (a multiple of 32), zeros. Byte
// (m, b) lands in 32-bit word `value_word(m, b)` of the row-major [Mp/4, kbp] words (= [Mp/4,
// kbp*4] bytes), slot `value_slot(m, b)` of the four bytes a word packs (_pack_bits): with
// m = 16 r0 + 8 w0 + 2 t0 + s0 and b = 32 r1 + 8 kt1 + 4 w1 + t1 (the reshape of
// swizzle_data, permuted to [r0, t0 | r1, s0, t1, kt1, w1, w0]),
//   word row = 4 r0 + t0, word column = 32 r1 + 16 s0 + 4 t1 + kt1, slot = 2 w1 + w0.
// _pack_bits spreads each byte's two codes as bf16-shaped bit fields: the low nibbles (even
// columns) of the word's four bytes in bits 0..15, the high nibbles (odd columns) in 16..31:
//   slot 0: sign bit 15, exponent-mantissa bits 6..8      slot 2: sign bit 9,  bits 0..2
//   slot 1: sign bit 12, bits 3..5                        slot 3: sign bit 14, exponent bits
//                                                                 10..11, mantissa bit 13
// Scales (E8M0 codes, [M, G] with G = K/32): vLLM pads G to a multiple of 4 on sm90 (the #47303
// patch in _swizzle_mxfp4), the layout M to 32 * num_warps rows (256 for vLLM's num_warps 8) and
// G to 2, zeros; with m = 32nw r + 16nw a + 16 w + 8 b + c (w < nw) and g = 2 gg + d, scale
// (m, g) is byte `scale_offset` of the row-major [Mp/32, gp*32] bytes:
//   row = nw r + w, column = 64 gg + 32 a + 4 c + 2 d + b.
#pragma once

#include <cstdint>

#include "formats/layout/hd.h"

namespace moepack::triton_mx {

// The 32-bit word (index into the expert's row-major [mp/4, kbp] words) holding byte (m, b).
MOEPACK_HD int64_t value_word(int64_t m, int64_t b, int64_t kbp) {
  const int64_t row = 4 * (m >> 4) + ((m >> 1) & 3);
  const int64_t col = 32 * (b >> 5) + 16 * (m & 1) + 4 * (b & 3) + ((b >> 3) & 3);
  return row * kbp + col;
}
// Which of the word's four packed bytes byte (m, b) is.
MOEPACK_HD int value_slot(int64_t m, int64_t b) {
  return static_cast<int>(2 * ((b >> 2) & 1) + ((m >> 3) & 1));
}
// The bits of e2m1 code c (4 bits) in slot `slot`, half `high` (0: the byte's low nibble).
MOEPACK_HD uint32_t value_bits(uint32_t c, int slot, int high) {
  uint32_t v;
  switch (slot) {
    case 0:
      v = ((c & 8u) << 12) | ((c & 7u) << 6);
      break;
    case 1:
      v = ((c & 8u) << 9) | ((c & 7u) << 3);
      break;
    case 2:
      v = ((c & 8u) << 6) | (c & 7u);
      break;
    default:
      v = ((c & 8u) << 11) | ((c & 6u) << 9) | ((c & 1u) << 13);
      break;
  }
  return v << (16 * high);
}
// The e2m1 code in slot `slot`, half `high` of word w (the inverse of value_bits; _unpack_bits).
MOEPACK_HD uint32_t value_code(uint32_t w, int slot, int high) {
  const uint32_t h = (w >> (16 * high)) & 0xFFFFu;
  switch (slot) {
    case 0:
      return (((h >> 15) & 1u) << 3) | ((h >> 6) & 7u);
    case 1:
      return (((h >> 12) & 1u) << 3) | ((h >> 3) & 7u);
    case 2:
      return (((h >> 9) & 1u) << 3) | (h & 7u);
    default:
      return (((h >> 14) & 1u) << 3) | (((h >> 10) & 3u) << 1) | ((h >> 13) & 1u);
  }
}
// The little-endian word at word index `word` of bytes p (any alignment).
MOEPACK_HD uint32_t load_word(const uint8_t* p, int64_t word) {
  const uint8_t* b = p + 4 * word;
  return static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
         (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
}
// Byte offset of scale (m, g) in the expert's row-major [msp/32, gp*32] bytes, num_warps nw.
MOEPACK_HD int64_t scale_offset(int64_t m, int64_t g, int64_t gp, int64_t nw) {
  const int64_t r = m / (32 * nw), a = (m / (16 * nw)) & 1, w = (m >> 4) % nw;
  const int64_t b = (m >> 3) & 1, c = m & 7;
  return (nw * r + w) * (gp * 32) + 64 * (g >> 1) + 32 * a + 4 * c + 2 * (g & 1) + b;
}

}  // namespace moepack::triton_mx
