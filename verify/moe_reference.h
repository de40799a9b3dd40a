// The CPU reference MoE and the same MoE computed through a backend's per-expert matmul.
//
//   x [T, H] --router--> Routing (top_k experts + weights per token)
//   per expert e, X_e = rows of x routed to e (m_e rows, in token order):
//     h = X_e . W13_e^T (+ b13_e)  [m_e, 2I] gated (rows [gate; up]) or [m_e, I]
//     a = act(h[:, :I]) * h[:, I:] (gated)   |   a = act(h) (non-gated)      [m_e, I]
//     y = a . W2_e^T (+ b2_e)      [m_e, H]   (expert biases: gpt-oss)
//   out[t] = sum_k w[t, k] * y_{e(t,k)}[t]                                   [T, H]
//
// moe_reference: weights from dequantize_expert (float), everything else in double (fp64
// accumulate). moe_via_expert_matmul: each matmul is the backend's (reader_matmul: the layout's
// readers, reading the packed layout as the kernel does); activations in float like the kernel.
// Both keep every slot's (token, k) expert output so errors can be attributed to an expert.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/codec.h"
#include "verify/router.h"

namespace moepack::ref {

// What the experts compute between their projections: the model tier's (model/routing.h,
// computed by formats/layout/activation.h).
using moepack::Activation;
using moepack::activation_name;

// Parses a config.json hidden_act; throws kUnsupported for anything else (activation_from_name).
Activation activation_from_hf(const std::string& hidden_act);

// The shape and activation of one MoE layer's routed experts.
struct MoeSpec {
  int64_t experts = 0;       // E
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I (per expert)
  Activation activation = Activation::kSilu;
  bool gated = true;  // w13 = [gate; up] (2I rows) and out = act(gate) * up; else w13 has I rows
  // Expert biases (gpt-oss), not owned, or null: w13_bias [E, w13_rows()] in w13's row order
  // ([gate; up]) and w2_bias [E, H], added to each projection's output (h = x W13^T + b13,
  // y = a W2^T + b2), as vLLM's fused MoE with has_bias and transformers' GptOssExperts do.
  const float* w13_bias = nullptr;
  const float* w2_bias = nullptr;
  // Experts evaluated in parallel; callbacks must then be thread-safe. Results never depend on
  // it (each expert writes its own slots; sums are taken in a fixed order afterwards).
  int threads = 1;
  int64_t w13_rows() const { return gated ? 2 * intermediate : intermediate; }
  void validate() const;  // kBadShape on non-positive sizes
};

// One expert's dense weights, row-major [N, K]: w13 [2I or I, H], w2 [H, I]. Called once per
// (expert, projection) that has routed tokens, so a layer can be dequantised one expert at a time
// (typically dequantize_expert(layer.w13, e)).
using ExpertWeightsFn = std::function<std::vector<float>(int64_t expert, MoeProj proj)>;

// y[m, N] = x[m, K] . W_e^T for one expert's projection, the way the backend computes it
// (verify: reader_matmul over the layout's readers of the chunk).
using ExpertMatmulFn =
    std::function<void(int expert, MoeProj proj, const float* x, int64_t m, float* y)>;

// The backend's matmul through the layout's two readers of one chunk of experts whose first
// expert is layer expert `first_expert` (formats/moe_reader.h reader_expert_matmul): expert ids
// are the layer's, the readers are copied in.
ExpertMatmulFn reader_matmul(const reader::ProjReader& w13, const reader::ProjReader& w2,
                             int64_t first_expert = 0);

// Router logits [T, E] = x [T, H] . router_weight [E, H]^T (+ router_bias [E] if non-null),
// accumulated in double and rounded to float (the router input of `route`).
std::vector<float> router_logits(const float* x, int64_t tokens, int64_t hidden,
                                 const float* router_weight, int64_t experts,
                                 const float* router_bias);

// A layer's routing of x [T, H] and what its experts read: x, or for a router weighting the
// expert input (Llama-4, top_k 1) x * w with combine weights 1, which is the same MoE. kBadShape
// naming the router tensor that does not fit.
struct LayerRouting {
  Routing routing;
  std::vector<float> expert_input;  // [T, H]
};
LayerRouting route_layer(const RouterConfig& cfg, const float* x, int64_t tokens, int64_t hidden,
                         const RouterTensors& t);

// The output of one MoE evaluation.
struct MoeOutput {
  int64_t tokens = 0, hidden = 0;
  int top_k = 0;
  std::vector<double> out;       // [T, H] = sum_k w[t,k] * slot[t,k]
  std::vector<double> slot_out;  // [T, top_k, H] the UNWEIGHTED output of expert e(t,k) on token t
};

// Reference in double. x [T, H] float. Throws kBadShape if a weight has the wrong size.
MoeOutput moe_reference(const MoeSpec& spec, const Routing& routing, const float* x,
                        const ExpertWeightsFn& weights);

// The same MoE through `matmul` (float inputs/outputs, float activation, per-expert gather).
MoeOutput moe_via_expert_matmul(const MoeSpec& spec, const Routing& routing, const float* x,
                                const ExpertMatmulFn& matmul);

// Convenience: route with the real router, then moe_reference. router_bias and correction_bias
// may be empty.
MoeOutput moe_reference(const MoeSpec& spec, const RouterConfig& router, const float* x,
                        int64_t tokens, const std::vector<float>& router_weight,
                        const std::vector<float>& router_bias,
                        const std::vector<float>& correction_bias, const ExpertWeightsFn& weights);

// kBadShape naming router.weight / router.bias when the router does not fit the layer (the checks
// every numerical path makes before routing).
void check_router_shapes(const MoeSpec& spec, const RouterConfig& router,
                         const std::vector<float>& router_weight,
                         const std::vector<float>& router_bias);

// Errors of `got` against `ref` (same routing).
struct MoeComparison {
  double max_abs_err = 0.0;  // max |got.out - ref.out|
  double norm_err = 0.0;     // ||got.out - ref.out||_F / ||ref.out||_F (0/0 = 0, x/0 = inf)
  double ref_norm = 0.0;     // ||ref.out||_F
  std::vector<double> expert_max_abs_err;  // [E] max |got.slot - ref.slot| over e's slots
  std::vector<int64_t> expert_tokens;      // [E] tokens routed to e
  bool finite = true;                      // got.out has no NaN/Inf
};
MoeComparison compare_moe(const MoeOutput& ref, const MoeOutput& got, const Routing& routing,
                          int64_t experts);

// One whole numerical check of a layer: route x with the real router, evaluate the reference
// from `weights` and the backend through `matmul`, compare.
struct MoeLayerCheck {
  Routing routing;
  MoeComparison comparison;
};
MoeLayerCheck check_moe_layer(const MoeSpec& spec, const RouterConfig& router, const float* x,
                              int64_t tokens, const std::vector<float>& router_weight,
                              const std::vector<float>& router_bias,
                              const std::vector<float>& correction_bias,
                              const ExpertWeightsFn& weights, const ExpertMatmulFn& matmul);

// check_moe_layer a range of experts at a time, so that a caller can hold one chunk of a layer's
// experts in memory (verify: decode, compare and evaluate a chunk, then drop it). Routing is
// computed once; each evaluate() fills the slots of its experts on both sides; finish() combines
// and compares. The result equals check_moe_layer's for any split of [0, E) into ranges (each
// expert evaluated exactly once); experts never evaluated contribute zero outputs.
// One chunk's expert biases (gpt-oss), indexed from the chunk's first expert: w13 [e, w13_rows()]
// in w13's row order, w2 [e, H]; an empty vector is no bias. The reference adds ref_*, the backend
// side got_* (the layout's own, as unpack decodes them), so that a layout that loses or moves
// its biases fails the numerical check too.
struct ChunkBiases {
  std::vector<float> ref_w13, ref_w2, got_w13, got_w2;
};

// kBadShape naming "expert biases" when a non-empty bias of `biases` does not hold
// (last - first) x its width values (the CPU path's evaluate and verify's CUDA path check it).
void check_chunk_biases(const MoeSpec& spec, int64_t first, int64_t last,
                        const ChunkBiases& biases);

class ChunkedMoeLayerCheck {
 public:
  // Throws kBadShape when the router does not match the spec (as check_moe_layer).
  ChunkedMoeLayerCheck(const MoeSpec& spec, const RouterConfig& router, const float* x,
                       int64_t tokens, const std::vector<float>& router_weight,
                       const std::vector<float>& router_bias,
                       const std::vector<float>& correction_bias);
  // A routing computed already (route_layer) of the experts' input x [T, H] (kept by pointer).
  ChunkedMoeLayerCheck(const MoeSpec& spec, Routing routing, const float* x);
  // Experts [first, last): the callbacks receive layer-wide expert ids. `biases` (or null: the
  // spec's): the chunk's expert biases, the reference's and the backend's apart.
  void evaluate(int64_t first, int64_t last, const ExpertWeightsFn& weights,
                const ExpertMatmulFn& matmul, const ChunkBiases* biases = nullptr);
  MoeLayerCheck finish();  // once

 private:
  void start(Routing routing);

  MoeSpec spec_;
  const float* x_;
  Routing routing_;
  std::vector<std::vector<int64_t>> slots_;
  MoeOutput ref_, got_;
};

// Random hidden states [tokens, hidden], i.i.d. normal(0, 1), fixed by `seed`: std::mt19937_64
// (its output sequence is fixed by the standard), 53-bit uniform doubles, Box-Muller (both
// outputs of each pair used) -- not std::normal_distribution, whose output is
// implementation-defined.
std::vector<float> random_hidden_states(int64_t tokens, int64_t hidden, uint64_t seed);

}  // namespace moepack::ref
