// AutoAWQ GEMM checkpoint Linear <-> QuantTensor. spec/wna16_marlin.md §1.2. qweight I32 [K, N/8]
// (AWQ nibble order 0,2,4,6,1,3,5,7), qzeros I32 [G, N/8], scales [G, N].
//
//   qweight word [k, c], packed along N, nibble p (bits 4p..4p+3) holds column 8c + P[p]:
//     bits  31    27    23    19    15    11     7     3   0
//           | n+7 | n+5 | n+3 | n+1 | n+6 | n+4 | n+2 | n+0 |      n = 8c, P = (0,2,4,6,1,3,5,7)
//   qzeros word [g, c]: the same order. Codes 0..15 logical 0..7 pack to 0x75316420.
//
// Mirrors AutoAWQ's WQLinear_GEMM.from_linear packing and vLLM's awq_pack (quant_utils.py).
// W[k, n] = (q - z[k / gs, n]) * s[k / gs, n] with real zero points (no "+1"). 4-bit only and a
// real group size, as vLLM's AWQ MoE requires. Canonical: symmetric = false, codes 0..15.
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<std::string> awq_required_suffixes(const QuantParams& p);
std::vector<std::string> awq_optional_suffixes(const QuantParams& p);
QuantTensor unpack_awq(const QuantParams& p, const TensorMap& by_suffix, int64_t n, int64_t k);
TensorMap pack_awq(const QuantParams& p, const QuantTensor& q);

// AWQ field order: field p of a word holds logical column 8c + kAwqOrder[p].
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

QuantSpec awq_spec_for(const QuantParams& p);
std::pair<int64_t, int64_t> awq_logical_shape(const QuantParams& p,
                                              const std::map<std::string, TensorView>& by_suffix);
std::vector<QuantParams> awq_param_space();

}  // namespace moepack
