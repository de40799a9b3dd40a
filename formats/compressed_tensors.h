// compressed-tensors checkpoint Linears <-> QuantTensor: pack-quantized W4A16/W8A16 (weight_packed
// I32 [N, K/pf], weight_scale [N, G], weight_zero_point, weight_g_idx, weight_shape;
// spec/wna16_marlin.md §1.3) and int-quantized W8A8 (weight I8 [N, K], weight_scale [N, 1]).
//
//   weight_packed word [n, k / pf], torch Linear orientation, low bits first along K:
//     bits  31 ....................................... 0
//           | k=pf*c+pf-1 | ... | k=pf*c+1 | k=pf*c |      stored u = q_signed + 2^(bits-1)
//   weight_zero_point word [n / pf, g], low bits first along N (asymmetric only, same offset).
//
// Mirrors compressed-tensors pack_to_int32 / unpack_from_int32
// (compressors/pack_quantized/helpers.py); the stored u is the canonical code (it carries the
// symmetric bias 2^(bits-1)), W[n, k] = (u - zu[n, g(k)]) * s[n, g(k)], zu = 2^(bits-1) when
// symmetric. A K that is not a multiple of pf is padded with zero fields in the last word.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<std::string> ct_pack_required_suffixes(const QuantParams& p);
std::vector<std::string> ct_pack_optional_suffixes(const QuantParams& p);
QuantTensor unpack_ct_pack(const QuantParams& p, const TensorMap& by_suffix, int64_t n, int64_t k);
TensorMap pack_ct_pack(const QuantParams& p, const QuantTensor& q);

std::vector<std::string> ct_int8_required_suffixes(const QuantParams& p);
std::vector<std::string> ct_int8_optional_suffixes(const QuantParams& p);
QuantTensor unpack_ct_int8(const QuantParams& p, const TensorMap& by_suffix, int64_t n, int64_t k);
TensorMap pack_ct_int8(const QuantParams& p, const QuantTensor& q);

QuantSpec ct_pack_spec_for(const QuantParams& p);
std::pair<int64_t, int64_t> ct_pack_logical_shape(
    const QuantParams& p, const std::map<std::string, TensorView>& by_suffix);
std::vector<QuantParams> ct_pack_param_space();

QuantSpec ct_int8_spec_for(const QuantParams& p);
std::vector<std::string> ct_int8_refusals(const QuantParams& p);
std::vector<QuantParams> ct_int8_param_space();

bool ct_pack_has_act_order(const QuantParams& p,
                           const std::map<std::string, TensorView>& by_suffix);

}  // namespace moepack
