// Random Marlin MoE artifacts (vLLM's parameters of one layer, as `convert` writes them) for the
// code-decode tests: tests/unit/marlin_code_map.cpp (the host side) and
// tests/cuda/marlin_code_decode_cuda.cpp (the device decoder against the scalar unpack).
#pragma once

#include <string>
#include <vector>

#include "formats/codec.h"
#include "tests/test_util.h"

namespace moepack::test {

struct MarlinCase {
  QuantMethod method = QuantMethod::kGptq;
  int bits = 4;
  int64_t group_size = 128;
  bool act_order = false;
  bool a8 = false;
  int64_t experts = 1, hidden = 128, inter = 64;
  VllmTarget target = VllmTarget::kV2026_05;  // kV0_33: no act-order, I padded to a tile
};

inline std::string marlin_case_name(const MarlinCase& c) {
  return std::string(quant_method_name(c.method)) + " int" + std::to_string(c.bits) + " g" +
         std::to_string(c.group_size) + (c.act_order ? " act-order" : "") + (c.a8 ? " a8" : "") +
         " E" + std::to_string(c.experts) + " H" + std::to_string(c.hidden) + " I" +
         std::to_string(c.inter) + " vllm " + vllm_target_name(c.target);
}

struct MarlinArtifact {
  LayoutOptions lo;
  MoeExperts source;  // what was packed
  TensorMap params;   // the Marlin row's parameters, by name
};

inline MarlinArtifact random_marlin_artifact(Rng& rng, const MarlinCase& c) {
  QuantParams p;
  p.method = c.method;
  p.bits = c.bits;
  p.group_size = c.group_size;
  p.act_order = c.act_order;
  p.symmetric = c.method != QuantMethod::kAwq;
  const MoeShape s = moe_shape_for(p, c.experts, c.hidden, c.inter, true);
  MarlinArtifact a;
  a.lo.act_dtype = DType::kBF16;
  a.lo.gated = true;
  a.lo.a8 = c.a8;
  a.lo.vllm_target = c.target;
  a.lo.source_method = c.method;
  a.lo.prefix = "model.layers.3.mlp.experts.";
  a.lo.inter = c.inter;
  a.lo.hidden = c.hidden;
  a.lo.threads = 2;
  RandomTensorOptions ro;
  ro.act_order = c.act_order;
  if (p.symmetric) ro.zero_lo = ro.zero_hi = 1 << (c.bits - 1);
  a.source = random_moe_experts(rng, s, ro);
  for (Tensor& t : find_target_layout("marlin")->pack(a.lo, a.source))
    a.params.emplace(t.name, std::move(t));
  return a;
}

// GPTQ int4 and int8, AWQ int4 (zero points), CT W4A16; act-order; group sizes -1 / 32 / 128;
// 8-bit-activation tiles; 1..5 experts; shapes at the smallest legal tile multiples and larger;
// vLLM 0.33's target (I a whole tile: nothing to crop).
inline std::vector<MarlinCase> marlin_cases() {
  using M = QuantMethod;
  return {
      {M::kGptq, 4, 128, false, false, 1, 128, 128},
      {M::kGptq, 4, 128, true, false, 3, 256, 256},
      {M::kGptq, 4, 32, true, false, 2, 128, 64},
      {M::kGptq, 4, -1, false, false, 5, 384, 192},
      {M::kGptq, 8, 128, false, false, 2, 256, 128},
      {M::kGptq, 8, 32, true, false, 3, 128, 192},
      {M::kGptq, 8, -1, false, false, 1, 128, 64},
      {M::kAwq, 4, 128, false, false, 4, 256, 128},
      {M::kAwq, 4, 32, false, false, 1, 128, 64},
      {M::kCtPackQuantized, 4, 128, false, false, 2, 256, 384},
      {M::kCtPackQuantized, 4, 32, true, false, 3, 128, 64},
      {M::kGptq, 4, -1, false, true, 2, 128, 64},
      {M::kGptq, 8, 128, false, true, 3, 256, 128},
      {M::kGptq, 4, 128, false, false, 2, 256, 256, VllmTarget::kV0_33},
      {M::kAwq, 4, 64, false, false, 2, 128, 192, VllmTarget::kV0_33},
  };
}

// A layer whose I vLLM 0.33 pads (unpack crops it: codes held even by
// unpack_marlin_moe_without_codes).
inline MarlinCase marlin_padded_case() {
  return {QuantMethod::kGptq, 4, 32, false, false, 2, 128, 96, VllmTarget::kV0_33};
}

}  // namespace moepack::test
