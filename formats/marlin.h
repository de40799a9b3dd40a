// vLLM Marlin MoE layout (GPTQ / AWQ / compressed-tensors WNA16 -> Marlin tiles, permuted scales,
// Marlin zero points, act-order sort indices). spec/wna16_marlin.md §3-7, §10.
//
// Mirrors vLLM's gptq_marlin_moe_repack / awq_marlin_moe_repack, marlin_moe_permute_scales and
// moe_awq_to_marlin_zero_points as called by _process_weights_marlin / _process_awq_weights_marlin
// / CompressedTensorsWNA16MarlinMoEMethod (docs/marlin.md has the diagrams).
//
//   qweight [E, K/16, N*16/pf] int32: row kt = the N/64 tiles of k-rows [16kt, 16kt+16),
//   each tile 16(k) x 64(n) codes = 1024/pf words (a8: 32 x 32 tiles), word r field f holds
//   Q'[k, n] given by marlin::word_field_coords (formats/layout/marlin_layout.h), where
//   Q'[k, n] = Q[sort_indices[k], n] under act-order.
//   scales [E, G, N] in the activation dtype, 64-entry (grouped) or 32-entry (single) permuted.
//   qzeros [E, G, N/pf] int32 (AWQ only): 64-permuted, interleaved, packed along N.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<Tensor> pack_marlin_moe(const LayoutOptions& opts, const MoeExperts& experts);
// The row's unpack: the 16-bit-activation tiles through the word-at-a-time decode
// (formats/fast_unpack.h), the a8 tiles through the scalar one. Same bytes and errors as
// unpack_marlin_moe_scalar, the definition (STYLE.md §4), which tests compare it with.
MoeExperts unpack_marlin_moe(const LayoutOptions& opts, const TensorMap& params_by_name);
MoeExperts unpack_marlin_moe_scalar(const LayoutOptions& opts, const TensorMap& params_by_name);
// unpack_marlin_moe without the codes where their decode is a pure per-tile gather (every layer
// but one whose padded I is cropped back): QuantTensor::codes left EMPTY, everything else
// decoded and validated as unpack_marlin_moe does (the same errors: the act-order sort indices
// checked to be permutations); the caller decodes the codes elsewhere through marlin_code_map
// (verify --device cuda: on the device, kernels/moe_runtime.h MarlinCodeDecode). Where the decode
// crops, the codes are held (the caller tells by codes.empty()).
MoeExperts unpack_marlin_moe_without_codes(const LayoutOptions& opts,
                                           const TensorMap& params_by_name);
// Whether unpack_marlin_moe_without_codes reads the codes (qweight) of a layer whose w2 qweight
// has shape `w2_qweight_shape` ([E, K/16, ...]: its K is the intermediate size the parameters
// carry, the padded I): where it crops the padding, the one case it decodes them on the host.
// Elsewhere it reads only qweight's shape and size.
bool marlin_without_codes_reads_codes(const LayoutOptions& opts, const Shape& w2_qweight_shape);
std::vector<std::string> marlin_deviations_from_vllm(const LayoutOptions& opts,
                                                     const MoeShape& shape);
std::vector<std::string> marlin_option_deviations(const LayoutOptions& opts);
std::vector<ParamSpec> marlin_param_specs(const LayoutOptions& opts, const MoeShape& shape);
// The intermediate size the parameters carry: I, or for a target that pads (vLLM 0.33,
// marlin_moe_padded_intermediate) the next multiple of lcm(64, group_size). Padding is zeros:
// codes 0, scales 0, zero points 0 -- per gate/up shard of w13 and in w2's K rows and groups.
int64_t marlin_padded_inter(const LayoutOptions& opts, const MoeShape& shape);

// Everything the Marlin MoE kernel (or vLLM's Marlin MoE path) cannot take for experts of this
// shape, one sentence with the numbers per reason; empty = supported. pack_marlin_moe throws
// kUnsupported with all of them joined, and with marlin_g_idx_reasons.
std::vector<std::string> marlin_unsupported_reasons(const LayoutOptions& opts,
                                                    const MoeShape& shape);
// What the bytes add: an act-order g_idx whose groups do not hold exactly group_size rows.
std::vector<std::string> marlin_g_idx_reasons(const MoeExperts& experts);

// vLLM parameter names of one projection (without opts.prefix) for a source method.
struct MarlinParamNames {
  std::string qweight, scales, qzeros, g_idx, sort_indices;  // qzeros / g_idx "" when absent
};
MarlinParamNames marlin_param_names(QuantMethod source_method, MoeProj proj);

// The layer as read_layer validates it for unpack (same errors), with the act-order parameters
// of every expert checked (sort indices a permutation, sorted g_idx inside [0, G)): what the
// reader (marlin_make_reader) needs.
struct MarlinLayerView {
  struct Proj {
    MarlinParamNames names;            // without opts.prefix
    int64_t n = 0, k = 0, groups = 0;  // as the parameters carry them (padded I included)
    bool act_order = false, zero_points = false;
  };
  Proj proj[2];  // w13, w2
  int64_t experts = 0, hidden = 0, inter = 0, group_size = -1;
  int bits = 4;
};
MarlinLayerView marlin_read_layer(const LayoutOptions& opts, const TensorMap& params_by_name);
// The row's reader (TargetLayout::make_reader): one projection of the experts params_by_name
// holds, read as the Marlin MoE kernel reads them (the kernel's scale rule, whatever rule the
// loader used; the padded intermediate hidden); act_quant: the activation dtype.
reader::ProjReader marlin_make_reader(const LayoutOptions& opts, const TensorMap& params_by_name,
                                      MoeProj proj, const ParamLocator& locate);
reader::ActQuant marlin_act_quant(const LayoutOptions& opts);

// Scale permutation choice for one projection (§4.2-4.3). Kernel rule: grouped iff the
// projection has more than one group and not a8. With opts.vllm_w13_scale_size_k, vLLM's loader
// rule: grouped iff group_size != -1, group_size < size_k (the size_k vLLM passes for this
// method and projection) and not a8. `intermediate` = I (w2's K).
bool marlin_scales_grouped(const LayoutOptions& opts, MoeProj proj, int64_t group_size,
                           int64_t groups, int64_t intermediate, int bits, bool vllm_rule);

// Single-matrix building blocks (also used by tests against the golden gptq_repack_* cases).
// codes: logical Q as [N, K] (canonical orientation); perm: [K] or empty. Returns int32 words
// [K/16, N*16/pf] (bits 4 or 8; a8 = 8-bit-activation tiles).
std::vector<uint32_t> marlin_repack(const uint8_t* codes_nk, int64_t n, int64_t k, int bits,
                                    const int32_t* perm, bool a8);
// Inverse: words -> codes [N, K] of the logical (permuted) matrix Q'[k, n] = Q[perm[k], n].
std::vector<uint8_t> marlin_unrepack(const uint32_t* words, int64_t n, int64_t k, int bits,
                                     bool a8);
// Where each code of a Marlin-tiled [N, K] matrix lies, as data (the device's code decoder,
// kernels/moe_runtime.h MarlinCodeDecode, reads it; built from word_field_coords, the table
// marlin_unrepack decodes by): every tile holds tile_n x tile_k codes in words_per_tile words;
// word_field[nn * tile_k + kk] = r * pack_factor + f: code (nn, kk) of a tile sits in field f
// (bits [bits*f, bits*f + bits)) of its word r. Tile (kt, nt) of expert e is words
// [e * K*N/pf + (kt * (N / tile_n) + nt) * words_per_tile, + words_per_tile). A bijection
// between the tile's codes and its fields.
struct MarlinCodeMap {
  int bits = 4;
  bool a8 = false;
  int tile_n = 0, tile_k = 0, pack_factor = 0, words_per_tile = 0;
  std::vector<int32_t> word_field;  // [tile_n * tile_k]
};
// kUnsupported for bits other than 4 and 8 (as marlin_unrepack).
MarlinCodeMap marlin_code_map(int bits, bool a8);

// Scale permutations on a row-major [G, N] tensor of elem_bytes-wide elements (§4.1).
void marlin_permute_scales(uint8_t* data, int64_t rows, int64_t n, int elem_bytes, bool grouped);
void marlin_unpermute_scales(uint8_t* data, int64_t rows, int64_t n, int elem_bytes, bool grouped);
// Zero points: codes [G, N] -> int32 [G, N/pf] and back (§5.1).
std::vector<uint32_t> marlin_pack_zero_points(const uint8_t* zp_gn, int64_t g, int64_t n, int bits,
                                              bool a8);
std::vector<uint8_t> marlin_unpack_zero_points(const uint32_t* words, int64_t g, int64_t n,
                                               int bits, bool a8);

}  // namespace moepack
