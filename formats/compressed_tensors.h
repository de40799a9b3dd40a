// compressed-tensors checkpoint Linears <-> QuantTensor: pack-quantized W4A16/W8A16 (weight_packed
// I32 [N, K/pf], weight_scale [N, G], weight_zero_point, weight_g_idx, weight_shape;
// spec/wna16_marlin.md §1.3) and int-quantized W8A8 (weight I8 [N, K], weight_scale [N, 1]).
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

}  // namespace moepack
