// AutoAWQ GEMM checkpoint Linear <-> QuantTensor. spec/wna16_marlin.md §1.2. qweight I32 [K, N/8]
// (AWQ nibble order 0,2,4,6,1,3,5,7), qzeros I32 [G, N/8], scales [G, N].
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<std::string> awq_required_suffixes(const QuantParams& p);
std::vector<std::string> awq_optional_suffixes(const QuantParams& p);
QuantTensor unpack_awq(const QuantParams& p, const TensorMap& by_suffix, int64_t n, int64_t k);
TensorMap pack_awq(const QuantParams& p, const QuantTensor& q);

}  // namespace moepack
