// Direct fast paths from gpt-oss' published MXFP4 experts (formats/fp4.h `gpt-oss-mxfp4`,
// docs/gpt-oss.md) to vLLM 0.33's two Hopper-and-older MXFP4 layouts, rows of direct_paths()
// (formats/fast_path.h):
//
//   gate_up_proj_blocks U8 [E, 2I, H/32, 16]  row n: H/2 bytes, byte j = code 2j | code 2j+1 << 4
//   gate_up_proj_scales U8 [E, 2I, H/32]      E8M0 codes     (rows interleaved: 2j gate, 2j+1 up)
//   gate_up_proj_bias  BF16 [E, 2I]           down_proj_* the same over [E, H, I/32, (16)]
//
//   -> triton-mxfp4 (formats/triton_mxfp4.h): each word of the Hopper value swizzle built from its
//      four source bytes (two rows, two columns) by a table of their bf16-shaped bit fields; the
//      scales to triton_mx::scale_offset; the biases bf16 -> f32.
//   -> marlin-mxfp4 (formats/marlin_float.h, gpt-oss family): each 16 x 64 int4 Marlin tile from
//      8-byte row pieces (a source row's 16 codes of the tile are one little-endian 64-bit word),
//      one nibble spread and 4x4 byte transpose per pair of rows; scales and biases by their chunk
//      permutations (formats/layout/marlin_layout.h).
//
// Both keep the checkpoint's interleaved w13 rows as vLLM's loader does, so no source row moves:
// physical row r of a padded parameter is source row r, or zero padding. Byte-identical to
// load_moe_experts + the layout's pack (tests/e2e/fast_paths_mxfp4_e2e.cpp); they decline
// (nullopt) where the canonical path would throw: a tensor missing or of another dtype or shape,
// an E8M0 code 255 (NaN), a non-finite bias.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "formats/fast_path.h"

namespace moepack {

// Why the gpt-oss MXFP4 rows do not take a layer (empty: they do).
std::vector<std::string> gpt_oss_mxfp4_direct_refusals(const QuantParams& q,
                                                       const LayoutOptions& opts,
                                                       const MoeShape& shape);
std::optional<std::vector<Tensor>> gpt_oss_mxfp4_to_triton(const LayoutOptions& opts,
                                                           const DirectSource& src);
std::optional<std::vector<Tensor>> gpt_oss_mxfp4_to_marlin(const LayoutOptions& opts,
                                                           const DirectSource& src);

}  // namespace moepack
