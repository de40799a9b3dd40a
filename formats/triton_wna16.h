// vLLM Triton moe_wna16 layout (MoeWNA16Method and CompressedTensorsWNA16MoEMethod): N-major uint8
// codes, group-size halving, packed zeros. spec/wna16_marlin.md §8-9.
//
// Mirrors vLLM 9aaf83ef: quantization/moe_wna16.py (MoeWNA16Method.create_weights and its custom
// moe_wna16_weight_loader) and compressed_tensors_moe_wna16.py (process_weights_after_loading);
// the kernel that reads it is fused_moe.py `fused_moe_kernel_gptq_awq`.
//
// One expert, one projection (N output rows, K inputs), nb = 4 or 8 bits:
//
//   qweight  U8 [N, K*nb/8]   int4: byte b of row n = code[n, 2b] | code[n, 2b+1] << 4
//                             int8: byte k of row n = code[n, k]
//   scales   act dtype [N, G*f]   column c holds canonical group c / f (f = halving factor)
//   qzeros   U8 [N*nb/8, G*f] (zero points only, int4): byte [n/2, c] =
//            (z[2(n/2), c/f] + 16 * z[2(n/2)+1, c/f]) mod 256   -- low nibble = even n
//
//   kernel:  code = (byte >> 4*(k%2)) & 15,  zp = (zbyte >> 4*(n%2)) & 15  (8 / 128 without zeros)
//            W[n, k] = (code - zp) * scale[n, k / gs'],  gs' = group size after halving
//
// moe_wna16 names (GPTQ and AWQ): w13_qweight, w2_qweight, w13_scales, w2_scales, w13_qzeros,
// w2_qzeros. compressed-tensors names: w13_weight_packed, w2_weight_packed, w13_weight_scale,
// w2_weight_scale (same bytes, no halving, no zeros). w13 rows: [gate (I); up (I)].
//
// Group-size halving (create_weights): gs' = gs; while I % gs' or H % gs': gs' //= 2 (must stay
// >= 32); f = gs / gs'. Scales and zeros are repeated f times along the group axis. The scale
// tensor has ceil(K/gs)*f columns (the sizing later upstream calls scale_num_groups; at 9aaf83ef
// it was K/gs', equal whenever gs divides K, i.e. whenever no halving was needed).
//
// GPTQ zero points: the loader unpacks the stored (v1: zero-1) nibbles, adds 1 in uint8 and
// re-packs lo + 16*hi in uint8, so a canonical zero of 16 (stored 15) leaves nibble 0 and carries
// into the neighbouring nibble (or out of the byte). We write exactly those bytes; unpack reads a
// GPTQ nibble pair back unambiguously because canonical GPTQ zeros are 1..16 (a zero of 0, which
// only a GPTQ v2 checkpoint can hold, is refused: vLLM would add 1 to it).
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<Tensor> pack_triton_wna16_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_triton_wna16_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
std::vector<std::string> triton_wna16_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeShape& shape);
std::vector<ParamSpec> triton_wna16_param_specs(const LayoutOptions& opts, const MoeShape& shape);

// Every reason experts of this shape cannot be written in this layout (empty = supported).
// pack throws kUnsupported listing all of them plus what the bytes add (zero points the nibbles
// cannot express). Shape disagreements between w13 and w2 are reported too (pack throws
// kBadShape for those first).
std::vector<std::string> triton_wna16_unsupported_reasons(const LayoutOptions& opts,
                                                          const MoeShape& shape);

// unpack when the checkpoint's group size is known (the halving factor is then exact). The plain
// unpack infers it from the shapes and picks the largest group size whose repeated scale/zero
// columns are all equal (a smaller true group size with coincidentally repeated scales decodes
// to the same weights).
MoeExperts unpack_triton_wna16_moe_with_group_size(const LayoutOptions& opts,
                                                   const TensorMap& params_by_name,
                                                   int64_t group_size);

// The layer as unpack reads it (the same shape checks and group choice, the same errors), for
// the reader (triton_wna16_make_reader).
struct TritonWna16LayerView {
  struct Proj {
    std::string qweight, scales, qzeros;  // full names; qzeros "" without zero points
    int64_t n = 0, k = 0, row_bytes = 0, scale_cols = 0;
  };
  Proj proj[2];                                // w13, w2
  int64_t experts = 0, kernel_group_size = 0;  // the (halved) group size the kernel indexes by
  int bits = 4;
  bool zero_points = false;
};
TritonWna16LayerView triton_wna16_read_layer(const LayoutOptions& opts,
                                             const TensorMap& params_by_name);
// The row's reader (TargetLayout::make_reader): fused_moe_kernel_gptq_awq's dequantisation, with
// the (halved) group size the kernel indexes by and the zero nibbles as vLLM's loader stored them
// (a GPTQ zero of 16 wraps to 0); act_quant: the activation dtype.
reader::ProjReader triton_wna16_make_reader(const LayoutOptions& opts,
                                            const TensorMap& params_by_name, MoeProj proj,
                                            const ParamLocator& locate);
reader::ActQuant triton_wna16_act_quant(const LayoutOptions& opts);

// vLLM's halving loop. Returns false where vLLM's `assert group_size >= 32` would fire.
bool triton_wna16_halve_group_size(int64_t group_size, int64_t intermediate, int64_t hidden,
                                   int64_t* effective, int64_t* factor);

}  // namespace moepack
