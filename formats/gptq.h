// GPTQ (AutoGPTQ / GPTQModel) checkpoint Linear <-> QuantTensor. spec/wna16_marlin.md §1.1.
// Suffixes: qweight I32 [K/pf, N], scales [G, N], qzeros I32 [G, N/pf], g_idx I32 [K].
#pragma once

#include "formats/codec.h"

namespace moepack {

std::vector<std::string> gptq_required_suffixes(const QuantParams& p);
std::vector<std::string> gptq_optional_suffixes(const QuantParams& p);
QuantTensor unpack_gptq(const QuantParams& p, const TensorMap& by_suffix, int64_t n, int64_t k);
TensorMap pack_gptq(const QuantParams& p, const QuantTensor& q);

// For symmetric checkpoints: kV1 if every stored zero field is 2^(b-1)-1, kV2 if every one is
// 2^(b-1), else `label` (fixes mislabelled checkpoint_format).
GptqFormat detect_gptq_zero_format(const TensorView& qzeros, int bits, bool symmetric,
                                   GptqFormat label);

}  // namespace moepack
