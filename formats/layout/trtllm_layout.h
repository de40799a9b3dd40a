// FlashInfer TRT-LLM-Gen layout index maps shared by formats/trtllm_*.cpp and the readers
// (formats/layout/moe_reader.h): the 128x4 scale swizzle and shuffle_matrix_a's row map
// (spec/mxfp8_trtllm.md §3.3-3.4), and NVFP4's unfolded global scale (unfold_global).
#pragma once

#include <cstdint>

#include "formats/layout/fp_bits.h"
#include "formats/layout/hd.h"

namespace moepack::trtllm {

// Byte offset of scale (m, k) of an [R, cols] matrix in the 128x4 interleaved buffer
// (FlashInfer get_sf_out_offset_128x4 / computeSFIndex(SWIZZLED_128x4), unpadded case).
MOEPACK_HD int64_t scale_128x4_offset(int64_t m, int64_t k, int64_t cols) {
  return ((m / 128) * (cols / 4) + k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
}
// shuffle_matrix_a's source row for output row r with B-row blocks (B = 32 or 16).
MOEPACK_HD int64_t shuffle_a_src_row(int64_t r, int64_t block) {
  const int64_t w = r % block;
  return (r - w) + (w % 8) * (block / 8) + w / 8;
}
// Its inverse: the output row that source row s lands in.
MOEPACK_HD int64_t shuffle_a_dst_row(int64_t s, int64_t block) {
  const int64_t v = s % block, per = block / 8;
  return (s - v) + (v % per) * 8 + v / per;
}

// The row a gated w13's logical row n (gate j = n < inter, up j = n - inter) holds before
// shuffle_matrix_a: TRT-LLM's interleave up0, gate0, up1, gate1, ... (vLLM's W31 swap plus
// reorder_rows_for_gated_act_gemm, or gpt-oss' swap_every_two_rows of its interleaved rows).
// Rows from 2 * inter on are padding.
MOEPACK_HD int64_t gated_w13_prerow(int64_t n, int64_t inter) {
  return n < inter ? 2 * n + 1 : 2 * (n - inter);
}

// ModelOpt NVFP4 on vLLM's TRT-LLM experts keeps only the product p = fl(g * a) of a weight global
// scale g and the activation scale a (w13_weight_scale_2 *= w13_input_scale): the canonical g it
// stands for is the smallest positive float whose product with a rounds to p (every g of that
// class gives the same bytes), or NaN where none does. Float multiplication by a is monotonic, so
// the class is an interval next to fl(p / a).
MOEPACK_HD float unfold_global(float p, float a) {
  const float nan = hd::bits_as_float(hd::kQuietNanBits);
  if (!(p > 0.0f) || !(a > 0.0f) || !hd::is_finite_bits(p) || !hd::is_finite_bits(a)) return nan;
  float g = p / a;
  for (int i = 0; i < 4 && g * a < p; ++i) g = hd::bits_as_float(hd::float_as_bits(g) + 1u);
  for (int i = 0; i < 4 && g * a > p; ++i) g = hd::bits_as_float(hd::float_as_bits(g) - 1u);
  if (!(g * a == p)) return nan;
  for (int i = 0; i < 4; ++i) {
    const float lower = hd::bits_as_float(hd::float_as_bits(g) - 1u);
    if (!(lower > 0.0f) || !(lower * a == p)) break;
    g = lower;
  }
  return g;
}

}  // namespace moepack::trtllm
