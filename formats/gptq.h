// GPTQ (AutoGPTQ / GPTQModel) checkpoint Linear <-> QuantTensor. spec/wna16_marlin.md §1.1.
// Suffixes: qweight I32 [K/pf, N], scales [G, N], qzeros I32 [G, N/pf], g_idx I32 [K].
//
//   qweight word [k / pf, n], low bits first along K (pf = 32 / bits):
//     bits  31 ........................................ 0
//           | k=pf*r+pf-1 | ... | k=pf*r+1 | k=pf*r+0 |      (one column n)
//   qzeros word [g, n / pf], low bits first along N: | n=pf*c+pf-1 | ... | n=pf*c |
//
// Mirrors AutoGPTQ's QuantLinear.pack and vLLM's gptq_pack (quant_utils.py); dequantisation
// W[k, n] = (q - z) * s[g_idx[k], n] with z = 2^(bits-1) when symmetric (uint4b8 / uint8b128).
// Zero points: v2 ("gptq_v2") stores z; v1 ("gptq") stores the v2 word minus one per field,
// subtracted as one int32 (GPTQModel's convert_gptq_v2_to_v1_format: qzeros -= 0x11111111), so a
// zero of 0 borrows from the next field. unpack adds the word back; for words without a zero of 0
// (every AutoGPTQ file) that is the same as adding 1 per field. Canonical zeros are the real
// zeros, 0..2^bits-1.
#pragma once

#include "formats/codec.h"

namespace moepack {

// One per field of a 32-bit word: what v1 qzeros words hold less than v2 ones (0x11111111 at 4
// bits).
uint32_t gptq_v1_word_offset(int bits);

std::vector<std::string> gptq_required_suffixes(const QuantParams& p);
std::vector<std::string> gptq_optional_suffixes(const QuantParams& p);
QuantTensor unpack_gptq(const QuantParams& p, const TensorMap& by_suffix, int64_t n, int64_t k);
TensorMap pack_gptq(const QuantParams& p, const QuantTensor& q);

// For symmetric checkpoints whose qzeros are only a convention: kV1 if every stored zero field
// equals 2^(bits-1) - 1, kV2 if every one equals 2^(bits-1), else `label` (also for asymmetric
// checkpoints and empty tensors). Used to fix checkpoints whose checkpoint_format is mislabelled.
GptqFormat detect_gptq_zero_format(const TensorView& qzeros, int bits, bool symmetric,
                                   GptqFormat label);

QuantSpec gptq_spec_for(const QuantParams& p);
std::pair<int64_t, int64_t> gptq_logical_shape(const QuantParams& p,
                                               const std::map<std::string, TensorView>& by_suffix);
// Symmetric checkpoints: the v1/v2 zero convention read from the stored qzeros.
QuantParams gptq_refine(const QuantParams& p, const std::map<std::string, TensorView>& by_suffix);
std::vector<QuantParams> gptq_param_space();

bool gptq_has_act_order(const QuantParams& p, const std::map<std::string, TensorView>& by_suffix);

}  // namespace moepack
