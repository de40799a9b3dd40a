// How the fused Marlin MoE kernel (kernels/include/marlin_moe.cuh) meets mma.sync m16n8k16
// fragments in the Marlin layout (int4, 16-bit activations): which fields of a word form which
// B-fragment register, and where an accumulator column's scale sits in a permuted scale row.
// Pure index maps, proven on the CPU against marlin_layout.h by tests/unit/marlin_fragment.cpp.
//
// Lane t = 4g + c of a warp loads words 4t..4t+3 of tile (kt, nt) (one 16-byte load); word 4t+j
// is its B fragment for 16-column sub-tile j: the n8 half `half` covers columns
// 64nt + 16j + 8half + g, register `reg` rows 16kt + 2c + 8reg + {0, 1} (low, high 16 bits).
#pragma once

#include "formats/layout/hd.h"

namespace moepack::marlin {

// Field holding element `elem` (0: low, 1: high 16 bits) of B register `reg` of n8 half `half`.
MOEPACK_HD int b_fragment_field(int half, int reg, int elem) {
  return 2 * half + reg + 4 * elem;
}
// Right shift that brings that register's two fields to bits 0..3 and 16..19 of the word.
MOEPACK_HD int b_fragment_shift(int half, int reg) {
  return 4 * b_fragment_field(half, reg, 0);
}

// Position, relative to 64-column tile nt's start in a permuted scale row, of the scale of
// accumulator column 64nt + 8s + 2c (C fragment of n8 sub-tile s, lane c = t % 4); column + 1
// sits fragment_scale_next further. Grouped rows are 8x8-transposed 64-chunks, single
// (channelwise) rows 32-chunks out[8a + m] = in[2a + 8(m/2) + m%2] (marlin_layout.h).
MOEPACK_HD int fragment_scale_offset(bool grouped, int s, int c) {
  return grouped ? 16 * c + s : 32 * (s >> 2) + 8 * c + 2 * (s & 3);
}
MOEPACK_HD int fragment_scale_next(bool grouped) {
  return grouped ? 8 : 1;
}

}  // namespace moepack::marlin
