// What a routed expert computes between its two projections, shared by the CPU reference
// (verify/moe_reference.cpp) and the CUDA runtime (kernels/include/moe_fused.cuh), so that both
// evaluate one formula. `act` is the value of moepack::Activation (model/routing.h).
//
//   gated (w13 = [gate; up]):  silu       silu(g) * u                      (SiLU-GLU, most MoEs)
//                              gelu_tanh  gelu_tanh(g) * u                 (Gemma-4)
//                              swigluoai  g' = min(g, 7), u' = clamp(u, -7, 7),
//                                         (u' + 1) * g' * sigmoid(1.702 g') (gpt-oss)
//   not gated (w13 = up):      relu2      relu(x)^2                        (Nemotron-H style)
//
// gpt-oss' clamped SwiGLU mirrors transformers GptOssExperts._apply_gate (alpha 1.702, limit
// 7.0) and vLLM's SwigluOAIAndMul (which reads w13 interleaved gate/up: the same function of each
// (gate, up) pair). gelu_tanh is torch's gelu(approximate="tanh").
#pragma once

#include <cmath>

#include "formats/layout/hd.h"

namespace moepack {

// moepack::Activation's values, for code that cannot include the model tier.
constexpr int kActSilu = 0;
constexpr int kActRelu2 = 1;
constexpr int kActGeluTanh = 2;
constexpr int kActSwigluOai = 3;

constexpr double kSwigluOaiAlpha = 1.702;
constexpr double kSwigluOaiLimit = 7.0;

template <class T>
MOEPACK_HD T act_exp(T v) {
#ifdef __CUDA_ARCH__
  return exp(v);
#else
  return std::exp(v);
#endif
}

template <class T>
MOEPACK_HD T act_tanh(T v) {
#ifdef __CUDA_ARCH__
  return tanh(v);
#else
  return std::tanh(v);
#endif
}

// The activation of one value (the gate of a gated expert, the output of a non-gated one).
template <class T>
MOEPACK_HD T expert_activation(int act, T v) {
  if (act == kActRelu2) {
    const T r = v > T(0) ? v : T(0);
    return r * r;
  }
  if (act == kActGeluTanh) {
    const T c = T(0.7978845608028654);  // sqrt(2 / pi)
    return T(0.5) * v * (T(1) + act_tanh(c * (v + T(0.044715) * v * v * v)));
  }
  return v / (T(1) + act_exp(-v));  // silu
}

// A gated expert's intermediate value from its gate and up values.
template <class T>
MOEPACK_HD T expert_glu(int act, T gate, T up) {
  if (act == kActSwigluOai) {
    const T limit = T(kSwigluOaiLimit);
    const T g = gate > limit ? limit : gate;  // NaN passes, as torch.clamp
    const T u = up > limit ? limit : (up < -limit ? -limit : up);
    return (u + T(1)) * (g / (T(1) + act_exp(-T(kSwigluOaiAlpha) * g)));
  }
  return expert_activation(act, gate) * up;
}

}  // namespace moepack
