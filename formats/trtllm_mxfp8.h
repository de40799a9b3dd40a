// FlashInfer TRT-LLM-Gen MXFP8 MoE layout: W31 swap, gated row interleave, shuffle_matrix_a
// (epilogue tile 128), scales with the same row map then 128x4 interleave. spec/mxfp8_trtllm.md §3.
// Mirrors vLLM prepare_fp8_moe_layer_for_fi(is_trtllm=True) -> swap_w13_to_w31 +
// _shuffle_mxfp8_moe_weights, i.e. FlashInfer reorder_rows_for_gated_act_gemm,
// shuffle_matrix_a(., 128) and shuffle_matrix_sf_a(., 128) (= row gather + block_scale_interleave).
//
//   w13_weight       F8_E4M3 [E, 2I, H]     physical row r holds logical row trtllm_w13_rows[r]
//   w13_weight_scale U8      [E, 2I, H/32]  nominal shape; bytes of each expert are the
//                                           row-permuted [2I, H/32] E8M0 matrix, 128x4-tiled:
//     tile t = (m/128)*(C/4) + k/4 is 512 bytes = [32][4][4] indexed [m%32][(m%128)/32][k%4]
//        byte(m, k) = t*512 + (m%32)*16 + ((m%128)/32)*4 + k%4
//   w2_weight        F8_E4M3 [E, H, I]      rows by shuffle_matrix_a(H, 128)
//   w2_weight_scale  U8      [E, H, I/32]   same row map, then 128x4
// Non-gated (opts.gated == false): w13 has I rows and only the shuffle (no W31 swap, no reorder).
#pragma once

#include "formats/codec.h"
#include "formats/layout/trtllm_layout.h"

namespace moepack {

std::vector<Tensor> pack_trtllm_mxfp8_moe(const LayoutOptions& opts, const MoeExperts& experts);
MoeExperts unpack_trtllm_mxfp8_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
std::vector<ParamSpec> trtllm_mxfp8_param_specs(const LayoutOptions& opts, const MoeShape& shape);
std::vector<std::string> trtllm_mxfp8_deviations_from_vllm(const LayoutOptions& opts,
                                                           const MoeShape& shape);

// Every reason (with the numbers) these experts cannot take this layout; empty when they can.
// 2I (I non-gated), H and I must be multiples of 128 (else the 128x4 interleave pads and vLLM's
// reshape fails at load) and both projections must be MXFP8 (e4m3, group 32, U8 E8M0 scales).
std::vector<std::string> trtllm_mxfp8_unsupported_reasons(const LayoutOptions& opts,
                                                          const MoeShape& shape);

// The parameters as unpack checks them (same errors), for the layout's reader (its make_reader).
struct TrtllmLayerView {
  int64_t experts = 0, hidden = 0, inter = 0, w13_rows = 0;
};
TrtllmLayerView trtllm_mxfp8_read_layer(const LayoutOptions& opts, const TensorMap& params_by_name);
// The row's reader (TargetLayout::make_reader): e4m3 codes of the shuffled (and, for gated w13,
// W31-swapped and gate/up-interleaved) rows times their 128x4-swizzled E8M0 scales;
// act_quant: FlashInfer's MXFP8 quantisation of the activations.
reader::ProjReader trtllm_mxfp8_make_reader(const LayoutOptions& opts,
                                            const TensorMap& params_by_name, MoeProj proj,
                                            const ParamLocator& locate);
reader::ActQuant trtllm_mxfp8_act_quant(const LayoutOptions& opts);

// The index maps (formats/layout/trtllm_layout.h), under their old names.
using trtllm::scale_128x4_offset;
using trtllm::shuffle_a_src_row;

// Row maps as data (out[r] = in[src[r]]); inverses via invert_permutation.
std::vector<int32_t> shuffle_matrix_a_rows(int64_t rows, int epilogue_tile_m);
std::vector<int32_t> gated_act_reorder_rows(int64_t rows);
std::vector<int32_t> swap_w13_to_w31_rows(int64_t rows);
// The complete w13 / w2 row maps for one expert (§3.6).
std::vector<int32_t> trtllm_w13_rows(int64_t rows, bool gated);
std::vector<int32_t> trtllm_w2_rows(int64_t rows);
// 128x4 scale interleave of one [R, C] byte matrix (R % 128 == 0, C % 4 == 0) and its inverse.
std::vector<uint8_t> scale_interleave_128x4(const uint8_t* src, int64_t rows, int64_t cols);
std::vector<uint8_t> scale_deinterleave_128x4(const uint8_t* src, int64_t rows, int64_t cols);

}  // namespace moepack
