#include "verify/moe_reference.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "core/threads.h"
#include "formats/layout/activation.h"
#include "formats/moe_reader.h"

namespace moepack::ref {
namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapCF = Eigen::Map<const MatF>;

// y[m, N] = x[m, K] . W[N, K]^T in double (W float, converted exactly). Few rows (the usual
// case: 64 tokens over many experts) use one dot product per output; more rows convert W a block
// of rows at a time so the double copy stays in cache and is never made whole.
void matmul_double_weight(const MatD& x, const std::vector<float>& w, int64_t n, int64_t k,
                          MatD* y) {
  MapCF wm(w.data(), n, k);
  y->resize(x.rows(), n);
  if (x.rows() <= 4) {
    Eigen::RowVectorXd row(k);
    for (int64_t r = 0; r < n; ++r) {
      row = wm.row(r).cast<double>();
      for (int64_t i = 0; i < x.rows(); ++i) (*y)(i, r) = x.row(i).dot(row);
    }
    return;
  }
  const int64_t rows =
      std::min<int64_t>(256, std::max<int64_t>(16, 262144 / std::max<int64_t>(1, k)));
  MatD wb;
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    const int64_t nb = std::min(rows, n - r0);
    wb = wm.middleRows(r0, nb).cast<double>();
    y->middleCols(r0, nb).noalias() = x * wb.transpose();
  }
}

// a[m, I] from h[m, w13_rows] (row-major, leading dimension w13_rows).
template <typename T>
void apply_activation(const MoeSpec& spec, const T* h, int64_t m, T* a) {
  const int64_t I = spec.intermediate, N = spec.w13_rows();
  const int act = static_cast<int>(spec.activation);
  for (int64_t r = 0; r < m; ++r) {
    const T* hr = h + r * N;
    T* ar = a + r * I;
    if (spec.gated) {
      for (int64_t i = 0; i < I; ++i) ar[i] = expert_glu(act, hr[i], hr[I + i]);
    } else {
      for (int64_t i = 0; i < I; ++i) ar[i] = expert_activation(act, hr[i]);
    }
  }
}

// Slots (t * top_k + k) routed to each expert, in token order.
std::vector<std::vector<int64_t>> slots_per_expert(const Routing& routing, int64_t experts) {
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(experts));
  const int64_t n = routing.tokens * routing.top_k;
  if (static_cast<int64_t>(routing.expert_ids.size()) != n ||
      static_cast<int64_t>(routing.weights.size()) != n)
    throw Error(ErrorCode::kInternal, "", "routing",
                "routing arrays hold " + std::to_string(routing.expert_ids.size()) + "/" +
                    std::to_string(routing.weights.size()) + " entries, want " + std::to_string(n));
  for (int64_t s = 0; s < n; ++s) {
    const int32_t e = routing.expert_ids[static_cast<size_t>(s)];
    if (e < 0 || e >= experts)
      throw Error(
          ErrorCode::kInternal, "", "routing",
          "expert id " + std::to_string(e) + " outside [0, " + std::to_string(experts) + ")");
    slots[static_cast<size_t>(e)].push_back(s);
  }
  return slots;
}

MoeOutput make_output(const MoeSpec& spec, const Routing& routing) {
  MoeOutput o;
  o.tokens = routing.tokens;
  o.hidden = spec.hidden;
  o.top_k = routing.top_k;
  o.out.assign(static_cast<size_t>(routing.tokens * spec.hidden), 0.0);
  o.slot_out.assign(static_cast<size_t>(routing.tokens * routing.top_k * spec.hidden), 0.0);
  return o;
}

// out[t] = sum_k w[t, k] * slot[t, k], k in order (a fixed summation order).
void combine_slots(const Routing& routing, MoeOutput* o) {
  const int64_t H = o->hidden;
  for (int64_t t = 0; t < routing.tokens; ++t) {
    double* dst = o->out.data() + t * H;
    for (int k = 0; k < routing.top_k; ++k) {
      const double w = routing.weight(t, k);
      const double* src = o->slot_out.data() + (t * routing.top_k + k) * H;
      for (int64_t h = 0; h < H; ++h) dst[h] += w * src[h];
    }
  }
}

void check_weight(const std::vector<float>& w, int64_t n, int64_t k, int64_t expert,
                  const char* what) {
  if (static_cast<int64_t>(w.size()) != n * k)
    throw Error(ErrorCode::kBadShape, "", what,
                "expert " + std::to_string(expert) + " weight holds " + std::to_string(w.size()) +
                    " values, want [" + std::to_string(n) + ", " + std::to_string(k) + "]");
}

}  // namespace

Activation activation_from_hf(const std::string& hidden_act) {
  return activation_from_name(hidden_act);
}

void MoeSpec::validate() const {
  if (experts <= 0 || hidden <= 0 || intermediate <= 0)
    throw Error(ErrorCode::kBadShape, "", "experts",
                "MoE shape E=" + std::to_string(experts) + " H=" + std::to_string(hidden) +
                    " I=" + std::to_string(intermediate) + " must be positive");
  if (activation == Activation::kSwigluOai && !gated)
    throw Error(ErrorCode::kUnsupported, "", "experts",
                "the clamped SwiGLU (swigluoai) needs gated experts (w13 = [gate; up])");
}

std::vector<float> router_logits(const float* x, int64_t tokens, int64_t hidden,
                                 const float* router_weight, int64_t experts,
                                 const float* router_bias) {
  MapCF xm(x, tokens, hidden);
  MapCF wm(router_weight, experts, hidden);
  MatD acc = xm.cast<double>() * wm.cast<double>().transpose();
  std::vector<float> logits(static_cast<size_t>(tokens * experts));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < experts; ++e)
      logits[static_cast<size_t>(t * experts + e)] =
          static_cast<float>(acc(t, e) + (router_bias ? static_cast<double>(router_bias[e]) : 0.0));
  return logits;
}

namespace {

using Slots = std::vector<std::vector<int64_t>>;

// Fills o->slot_out for the slots of experts [first, last) from the reference in double.
// Expert e's bias of one projection: the chunk's (indexed from `first`) or the spec's, or null.
const float* bias_of(const std::vector<float>* chunk, const float* spec_bias, int64_t e,
                     int64_t first, int64_t width) {
  if (chunk) return chunk->empty() ? nullptr : chunk->data() + (e - first) * width;
  return spec_bias ? spec_bias + e * width : nullptr;
}

void reference_slots(const MoeSpec& spec, const Routing& routing, const Slots& slots,
                     const float* x, const ExpertWeightsFn& weights, int64_t first, int64_t last,
                     const ChunkBiases* biases, MoeOutput* o) {
  const int64_t H = spec.hidden, I = spec.intermediate, N = spec.w13_rows();
  parallel_for(last - first, spec.threads, [&](int64_t b, int64_t end) {
    MatD xe, h, a, y;
    for (int64_t e = first + b; e < first + end; ++e) {
      const auto& es = slots[static_cast<size_t>(e)];
      const int64_t m = static_cast<int64_t>(es.size());
      if (m == 0) continue;
      xe.resize(m, H);
      for (int64_t r = 0; r < m; ++r) {
        const int64_t t = es[static_cast<size_t>(r)] / routing.top_k;
        for (int64_t c = 0; c < H; ++c) xe(r, c) = static_cast<double>(x[t * H + c]);
      }
      {
        const std::vector<float> w13 = weights(e, MoeProj::kW13);
        check_weight(w13, N, H, e, "w13");
        matmul_double_weight(xe, w13, N, H, &h);
      }
      if (const float* b13 =
              bias_of(biases ? &biases->ref_w13 : nullptr, spec.w13_bias, e, first, N))
        for (int64_t r = 0; r < m; ++r)
          for (int64_t n = 0; n < N; ++n) h(r, n) += static_cast<double>(b13[n]);
      a.resize(m, I);
      apply_activation<double>(spec, h.data(), m, a.data());
      {
        const std::vector<float> w2 = weights(e, MoeProj::kW2);
        check_weight(w2, H, I, e, "w2");
        matmul_double_weight(a, w2, H, I, &y);
      }
      if (const float* b2 = bias_of(biases ? &biases->ref_w2 : nullptr, spec.w2_bias, e, first, H))
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < H; ++c) y(r, c) += static_cast<double>(b2[c]);
      for (int64_t r = 0; r < m; ++r)
        std::copy(y.row(r).data(), y.row(r).data() + H,
                  o->slot_out.data() + es[static_cast<size_t>(r)] * H);
    }
  });
}

// Fills o->slot_out for the slots of experts [first, last) through the backend's matmul.
void backend_slots(const MoeSpec& spec, const Routing& routing, const Slots& slots, const float* x,
                   const ExpertMatmulFn& matmul, int64_t first, int64_t last,
                   const ChunkBiases* biases, MoeOutput* o) {
  const int64_t H = spec.hidden, I = spec.intermediate, N = spec.w13_rows();
  parallel_for(last - first, spec.threads, [&](int64_t b, int64_t end) {
    std::vector<float> xe, h, a, y;
    for (int64_t e = first + b; e < first + end; ++e) {
      const auto& es = slots[static_cast<size_t>(e)];
      const int64_t m = static_cast<int64_t>(es.size());
      if (m == 0) continue;
      xe.resize(static_cast<size_t>(m * H));
      for (int64_t r = 0; r < m; ++r) {
        const int64_t t = es[static_cast<size_t>(r)] / routing.top_k;
        std::copy(x + t * H, x + (t + 1) * H, xe.data() + r * H);
      }
      // NaN-filled outputs expose a backend that leaves part of y unwritten.
      h.assign(static_cast<size_t>(m * N), std::nanf(""));
      matmul(static_cast<int>(e), MoeProj::kW13, xe.data(), m, h.data());
      if (const float* b13 =
              bias_of(biases ? &biases->got_w13 : nullptr, spec.w13_bias, e, first, N))
        for (int64_t r = 0; r < m; ++r)
          for (int64_t n = 0; n < N; ++n) h[static_cast<size_t>(r * N + n)] += b13[n];
      a.resize(static_cast<size_t>(m * I));
      apply_activation<float>(spec, h.data(), m, a.data());
      y.assign(static_cast<size_t>(m * H), std::nanf(""));
      matmul(static_cast<int>(e), MoeProj::kW2, a.data(), m, y.data());
      if (const float* b2 = bias_of(biases ? &biases->got_w2 : nullptr, spec.w2_bias, e, first, H))
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < H; ++c) y[static_cast<size_t>(r * H + c)] += b2[c];
      for (int64_t r = 0; r < m; ++r) {
        double* dst = o->slot_out.data() + es[static_cast<size_t>(r)] * H;
        for (int64_t c = 0; c < H; ++c)
          dst[c] = static_cast<double>(y[static_cast<size_t>(r * H + c)]);
      }
    }
  });
}

}  // namespace

void check_router_shapes(const MoeSpec& spec, const RouterConfig& router,
                         const std::vector<float>& router_weight,
                         const std::vector<float>& router_bias) {
  if (router.num_experts != spec.experts)
    throw Error(ErrorCode::kBadShape, "", "router.weight",
                "router has " + std::to_string(router.num_experts) + " experts, layer has " +
                    std::to_string(spec.experts));
  if (static_cast<int64_t>(router_weight.size()) != spec.experts * spec.hidden)
    throw Error(ErrorCode::kBadShape, "", "router.weight",
                "router weight holds " + std::to_string(router_weight.size()) + " values, want [" +
                    std::to_string(spec.experts) + ", " + std::to_string(spec.hidden) + "]");
  if (!router_bias.empty() && static_cast<int64_t>(router_bias.size()) != spec.experts)
    throw Error(ErrorCode::kBadShape, "", "router.bias",
                "router bias holds " + std::to_string(router_bias.size()) + " values, want " +
                    std::to_string(spec.experts));
}

LayerRouting route_layer(const RouterConfig& cfg, const float* x, int64_t tokens, int64_t hidden,
                         const RouterTensors& t) {
  if (static_cast<int64_t>(t.weight.size()) != cfg.num_experts * hidden)
    throw Error(ErrorCode::kBadShape, "", "router.weight",
                "router weight holds " + std::to_string(t.weight.size()) + " values, want [" +
                    std::to_string(cfg.num_experts) + ", " + std::to_string(hidden) + "]");
  if (!t.bias.empty() && static_cast<int64_t>(t.bias.size()) != cfg.num_experts)
    throw Error(ErrorCode::kBadShape, "", "router.bias",
                "router bias holds " + std::to_string(t.bias.size()) + " values, want " +
                    std::to_string(cfg.num_experts));
  const std::vector<float> in = router_input(cfg, x, tokens, hidden, t.input_scale);
  const std::vector<float> logits =
      router_logits(in.data(), tokens, hidden, t.weight.data(), cfg.num_experts,
                    t.bias.empty() ? nullptr : t.bias.data());
  LayerRouting lr;
  lr.routing = route(logits, t.correction_bias, cfg, t.per_expert_scale);
  lr.expert_input.assign(x, x + static_cast<size_t>(tokens * hidden));
  if (cfg.weights_on_input) {
    // top_k 1 (RouterConfig::validate): expert(x * w) with weight 1 is the block's output.
    for (int64_t tok = 0; tok < tokens; ++tok) {
      const double w = lr.routing.weight(tok, 0);
      float* row = lr.expert_input.data() + tok * hidden;
      for (int64_t h = 0; h < hidden; ++h) row[h] = static_cast<float>(row[h] * w);
      lr.routing.weights[static_cast<size_t>(tok)] = 1.0;
    }
  }
  return lr;
}

MoeOutput moe_reference(const MoeSpec& spec, const Routing& routing, const float* x,
                        const ExpertWeightsFn& weights) {
  spec.validate();
  MoeOutput o = make_output(spec, routing);
  reference_slots(spec, routing, slots_per_expert(routing, spec.experts), x, weights, 0,
                  spec.experts, nullptr, &o);
  combine_slots(routing, &o);
  return o;
}

ExpertMatmulFn reader_matmul(const reader::ProjReader& w13, const reader::ProjReader& w2,
                             int64_t first_expert) {
  return [w13, w2, first_expert](int e, MoeProj p, const float* x, int64_t m, float* y) {
    reader_expert_matmul(p == MoeProj::kW13 ? w13 : w2, e - first_expert, x, m, y);
  };
}

MoeOutput moe_via_expert_matmul(const MoeSpec& spec, const Routing& routing, const float* x,
                                const ExpertMatmulFn& matmul) {
  spec.validate();
  MoeOutput o = make_output(spec, routing);
  backend_slots(spec, routing, slots_per_expert(routing, spec.experts), x, matmul, 0, spec.experts,
                nullptr, &o);
  combine_slots(routing, &o);
  return o;
}

MoeOutput moe_reference(const MoeSpec& spec, const RouterConfig& router, const float* x,
                        int64_t tokens, const std::vector<float>& router_weight,
                        const std::vector<float>& router_bias,
                        const std::vector<float>& correction_bias, const ExpertWeightsFn& weights) {
  spec.validate();
  if (static_cast<int64_t>(router_weight.size()) != spec.experts * spec.hidden)
    throw Error(ErrorCode::kBadShape, "", "router.weight",
                "router weight holds " + std::to_string(router_weight.size()) + " values, want [" +
                    std::to_string(spec.experts) + ", " + std::to_string(spec.hidden) + "]");
  const std::vector<float> logits =
      router_logits(x, tokens, spec.hidden, router_weight.data(), spec.experts,
                    router_bias.empty() ? nullptr : router_bias.data());
  return moe_reference(spec, route(logits, correction_bias, router), x, weights);
}

MoeComparison compare_moe(const MoeOutput& ref, const MoeOutput& got, const Routing& routing,
                          int64_t experts) {
  if (ref.out.size() != got.out.size() || ref.slot_out.size() != got.slot_out.size() ||
      ref.hidden != got.hidden || ref.top_k != routing.top_k || got.top_k != routing.top_k)
    throw Error(ErrorCode::kInternal, "", "moe_output", "compared MoE outputs differ in shape");
  MoeComparison c;
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < ref.out.size(); ++i) {
    const double d = got.out[i] - ref.out[i];
    if (!std::isfinite(got.out[i])) c.finite = false;
    c.max_abs_err = std::max(c.max_abs_err, std::fabs(d));
    diff2 += d * d;
    ref2 += ref.out[i] * ref.out[i];
  }
  c.ref_norm = std::sqrt(ref2);
  const double diff_norm = std::sqrt(diff2);
  if (!c.finite) {
    c.max_abs_err = std::numeric_limits<double>::infinity();
    c.norm_err = std::numeric_limits<double>::infinity();
  } else if (c.ref_norm > 0.0) {
    c.norm_err = diff_norm / c.ref_norm;
  } else {
    c.norm_err = diff_norm == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  }
  c.expert_tokens = routing.tokens_per_expert(experts);
  c.expert_max_abs_err.assign(static_cast<size_t>(experts), 0.0);
  const int64_t H = ref.hidden;
  for (int64_t s = 0; s < routing.tokens * routing.top_k; ++s) {
    const int32_t e = routing.expert_ids[static_cast<size_t>(s)];
    double& worst = c.expert_max_abs_err[static_cast<size_t>(e)];
    for (int64_t h = 0; h < H; ++h) {
      const double g = got.slot_out[static_cast<size_t>(s * H + h)];
      const double d = std::isfinite(g)
                           ? std::fabs(g - ref.slot_out[static_cast<size_t>(s * H + h)])
                           : std::numeric_limits<double>::infinity();
      worst = std::max(worst, d);
    }
  }
  return c;
}

ChunkedMoeLayerCheck::ChunkedMoeLayerCheck(const MoeSpec& spec, const RouterConfig& router,
                                           const float* x, int64_t tokens,
                                           const std::vector<float>& router_weight,
                                           const std::vector<float>& router_bias,
                                           const std::vector<float>& correction_bias)
    : spec_(spec), x_(x) {
  spec_.validate();
  check_router_shapes(spec_, router, router_weight, router_bias);
  const std::vector<float> logits =
      router_logits(x, tokens, spec_.hidden, router_weight.data(), spec_.experts,
                    router_bias.empty() ? nullptr : router_bias.data());
  start(route(logits, correction_bias, router));
}

ChunkedMoeLayerCheck::ChunkedMoeLayerCheck(const MoeSpec& spec, Routing routing, const float* x)
    : spec_(spec), x_(x) {
  spec_.validate();
  start(std::move(routing));
}

void ChunkedMoeLayerCheck::start(Routing routing) {
  routing_ = std::move(routing);
  slots_ = slots_per_expert(routing_, spec_.experts);
  ref_ = make_output(spec_, routing_);
  got_ = make_output(spec_, routing_);
}

void check_chunk_biases(const MoeSpec& spec, int64_t first, int64_t last,
                        const ChunkBiases& biases) {
  for (const auto& [v, width] : {std::make_pair(&biases.ref_w13, spec.w13_rows()),
                                 {&biases.ref_w2, spec.hidden},
                                 {&biases.got_w13, spec.w13_rows()},
                                 {&biases.got_w2, spec.hidden}})
    if (!v->empty() && static_cast<int64_t>(v->size()) != (last - first) * width)
      throw Error(ErrorCode::kBadShape, "", "expert biases",
                  std::to_string(v->size()) + " bias values for " + std::to_string(last - first) +
                      " experts of " + std::to_string(width));
}

void ChunkedMoeLayerCheck::evaluate(int64_t first, int64_t last, const ExpertWeightsFn& weights,
                                    const ExpertMatmulFn& matmul, const ChunkBiases* biases) {
  if (first < 0 || last > spec_.experts || first > last)
    throw Error(ErrorCode::kInternal, "", "experts",
                "expert range [" + std::to_string(first) + ", " + std::to_string(last) +
                    ") outside the layer's " + std::to_string(spec_.experts));
  if (biases) check_chunk_biases(spec_, first, last, *biases);
  reference_slots(spec_, routing_, slots_, x_, weights, first, last, biases, &ref_);
  backend_slots(spec_, routing_, slots_, x_, matmul, first, last, biases, &got_);
}

MoeLayerCheck ChunkedMoeLayerCheck::finish() {
  combine_slots(routing_, &ref_);
  combine_slots(routing_, &got_);
  MoeLayerCheck check;
  check.comparison = compare_moe(ref_, got_, routing_, spec_.experts);
  check.routing = std::move(routing_);
  return check;
}

MoeLayerCheck check_moe_layer(const MoeSpec& spec, const RouterConfig& router, const float* x,
                              int64_t tokens, const std::vector<float>& router_weight,
                              const std::vector<float>& router_bias,
                              const std::vector<float>& correction_bias,
                              const ExpertWeightsFn& weights, const ExpertMatmulFn& matmul) {
  ChunkedMoeLayerCheck check(spec, router, x, tokens, router_weight, router_bias, correction_bias);
  check.evaluate(0, spec.experts, weights, matmul);
  return check.finish();
}

std::vector<float> random_hidden_states(int64_t tokens, int64_t hidden, uint64_t seed) {
  if (tokens < 0 || hidden < 0)
    throw Error(ErrorCode::kBadShape, "", "hidden_states",
                "negative shape [" + std::to_string(tokens) + ", " + std::to_string(hidden) + "]");
  std::mt19937_64 gen(seed);
  // 53 random bits -> a double in [0, 1) with every value exactly representable.
  auto uniform = [&gen]() { return static_cast<double>(gen() >> 11) * 0x1.0p-53; };
  const double two_pi = 6.283185307179586476925286766559;
  const size_t n = static_cast<size_t>(tokens * hidden);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - uniform();  // (0, 1]: log never sees 0
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(r * std::cos(two_pi * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(two_pi * u2));
  }
  return out;
}

}  // namespace moepack::ref
