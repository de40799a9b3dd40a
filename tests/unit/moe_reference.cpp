// The reference MoE against a naive triple loop, the expert matmul path against the reference,
// bug detection (gate/up swapped, one corrupted expert, unwritten outputs), a quantised layer
// through dequantize_expert vs a mini backend reading its own transposed layout, and the
// deterministic random hidden states.
#include "verify/moe_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "formats/codec.h"

namespace moepack::ref {
namespace {

struct DenseLayer {
  MoeSpec spec;
  std::vector<float> w13, w2, router;  // [E, N, H], [E, H, I], [E, H]
  const float* w13_of(int64_t e) const { return w13.data() + e * spec.w13_rows() * spec.hidden; }
  const float* w2_of(int64_t e) const { return w2.data() + e * spec.hidden * spec.intermediate; }
  ExpertWeightsFn weights() const {
    return [this](int64_t e, MoeProj p) {
      const int64_t n =
          p == MoeProj::kW13 ? spec.w13_rows() * spec.hidden : spec.hidden * spec.intermediate;
      const float* src = p == MoeProj::kW13 ? w13_of(e) : w2_of(e);
      return std::vector<float>(src, src + n);
    };
  }
};

std::vector<float> uniform_floats(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

DenseLayer random_layer(int64_t E, int64_t H, int64_t I, bool gated, Activation act,
                        uint64_t seed) {
  DenseLayer l;
  l.spec.experts = E;
  l.spec.hidden = H;
  l.spec.intermediate = I;
  l.spec.gated = gated;
  l.spec.activation = act;
  l.w13 = uniform_floats(static_cast<size_t>(E * l.spec.w13_rows() * H),
                         1.0f / std::sqrt(static_cast<float>(H)), seed);
  l.w2 = uniform_floats(static_cast<size_t>(E * H * I), 1.0f / std::sqrt(static_cast<float>(I)),
                        seed + 1);
  l.router = uniform_floats(static_cast<size_t>(E * H), 1.0f, seed + 2);
  return l;
}

RouterConfig softmax_router(int64_t E, int top_k) {
  RouterConfig c;
  c.num_experts = E;
  c.top_k = top_k;
  c.renormalize = true;
  return c;
}

Routing route_layer(const DenseLayer& l, const RouterConfig& rc, const std::vector<float>& x,
                    int64_t T) {
  return route(router_logits(x.data(), T, l.spec.hidden, l.router.data(), l.spec.experts, nullptr),
               {}, rc);
}

// out[t] = sum_k w * W2 act(W13 x), every sum written as a plain loop in double.
std::vector<double> naive_moe(const DenseLayer& l, const Routing& r, const std::vector<float>& x) {
  const int64_t H = l.spec.hidden, I = l.spec.intermediate, N = l.spec.w13_rows();
  std::vector<double> out(static_cast<size_t>(r.tokens * H), 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int k = 0; k < r.top_k; ++k) {
      const int64_t e = r.expert(t, k);
      std::vector<double> h(static_cast<size_t>(N)), a(static_cast<size_t>(I));
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t j = 0; j < H; ++j) s += double(l.w13_of(e)[n * H + j]) * double(x[t * H + j]);
        h[n] = s;
      }
      for (int64_t i = 0; i < I; ++i) {
        const double v = h[i];
        const double act = l.spec.activation == Activation::kSilu ? v / (1.0 + std::exp(-v))
                                                                  : (v > 0 ? v * v : 0.0);
        a[i] = l.spec.gated ? act * h[I + i] : act;
      }
      for (int64_t o = 0; o < H; ++o) {
        double s = 0;
        for (int64_t i = 0; i < I; ++i) s += double(l.w2_of(e)[o * I + i]) * a[i];
        out[t * H + o] += r.weight(t, k) * s;
      }
    }
  }
  return out;
}

// y = x . W^T with float accumulation from the float weights: what a correct kernel computes.
ExpertMatmulFn float_matmul(const DenseLayer& l) {
  return [&l](int e, MoeProj p, const float* x, int64_t m, float* y) {
    const int64_t K = p == MoeProj::kW13 ? l.spec.hidden : l.spec.intermediate;
    const int64_t N = p == MoeProj::kW13 ? l.spec.w13_rows() : l.spec.hidden;
    const float* w = p == MoeProj::kW13 ? l.w13_of(e) : l.w2_of(e);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t n = 0; n < N; ++n) {
        float s = 0.f;
        for (int64_t k = 0; k < K; ++k) s += x[r * K + k] * w[n * K + k];
        y[r * N + n] = s;
      }
  };
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return worst / scale;
}

struct Case {
  int64_t E, H, I;
  int top_k;
  int64_t T;
  bool gated;
  Activation act;
};

TEST(MoeReference, MatchesNaiveTripleLoop) {
  const Case cases[] = {
      {6, 16, 8, 2, 10, true, Activation::kSilu},   {1, 8, 4, 1, 3, true, Activation::kSilu},
      {8, 24, 40, 3, 17, true, Activation::kSilu},  {5, 16, 12, 2, 9, false, Activation::kRelu2},
      {4, 300, 20, 4, 5, false, Activation::kSilu}, {3, 12, 600, 2, 7, true, Activation::kRelu2},
  };
  uint64_t seed = 11;
  for (const Case& c : cases) {
    SCOPED_TRACE("E=" + std::to_string(c.E) + " H=" + std::to_string(c.H) +
                 " I=" + std::to_string(c.I) + " gated=" + std::to_string(c.gated));
    const DenseLayer l = random_layer(c.E, c.H, c.I, c.gated, c.act, seed);
    const std::vector<float> x = random_hidden_states(c.T, c.H, seed++);
    const Routing r = route_layer(l, softmax_router(c.E, c.top_k), x, c.T);
    const MoeOutput ref = moe_reference(l.spec, r, x.data(), l.weights());
    const std::vector<double> naive = naive_moe(l, r, x);
    ASSERT_EQ(ref.out.size(), naive.size());
    EXPECT_LT(max_rel_diff(ref.out, naive), 1e-12);
    double nz = 0;
    for (double v : naive) nz += std::fabs(v);
    EXPECT_GT(nz, 0.0);  // the case exercises something
  }
}

TEST(MoeReference, RouterOverloadAndThreadsGiveIdenticalBits) {
  DenseLayer l = random_layer(7, 32, 16, true, Activation::kSilu, 5);
  const int64_t T = 23;
  const std::vector<float> x = random_hidden_states(T, 32, 77);
  const RouterConfig rc = softmax_router(7, 2);
  const MoeOutput a = moe_reference(l.spec, rc, x.data(), T, l.router, {}, {}, l.weights());
  l.spec.threads = 3;
  const MoeOutput b = moe_reference(l.spec, route_layer(l, rc, x, T), x.data(), l.weights());
  ASSERT_EQ(a.out.size(), b.out.size());
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(double)));
  EXPECT_EQ(0,
            std::memcmp(a.slot_out.data(), b.slot_out.data(), a.slot_out.size() * sizeof(double)));
}

TEST(MoeReference, RouterLogitsWithBias) {
  // x = [1, 2], W = [[1, 0], [0.5, -1], [2, 2]], bias = [0.25, 0, -1]: [1.25, -1.5, 5].
  const std::vector<float> x = {1.f, 2.f}, w = {1.f, 0.f, 0.5f, -1.f, 2.f, 2.f},
                           b = {0.25f, 0.f, -1.f};
  const std::vector<float> l = router_logits(x.data(), 1, 2, w.data(), 3, b.data());
  EXPECT_EQ(l, (std::vector<float>{1.25f, -1.5f, 5.f}));
}

TEST(MoeViaExpertMatmul, ExactFloatMatmulMatchesReference) {
  const Case cases[] = {{8, 256, 128, 2, 64, true, Activation::kSilu},
                        {16, 128, 64, 4, 64, true, Activation::kSilu},
                        {6, 96, 160, 2, 40, false, Activation::kRelu2}};
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const DenseLayer l = random_layer(c.E, c.H, c.I, c.gated, c.act, seed);
    const std::vector<float> x = random_hidden_states(c.T, c.H, seed++);
    const RouterConfig rc = softmax_router(c.E, c.top_k);
    const MoeLayerCheck chk =
        check_moe_layer(l.spec, rc, x.data(), c.T, l.router, {}, {}, l.weights(), float_matmul(l));
    EXPECT_TRUE(chk.comparison.finite);
    EXPECT_LT(chk.comparison.norm_err, 1e-5);
    EXPECT_GT(chk.comparison.norm_err, 0.0);  // float vs double really differ
    EXPECT_GT(chk.comparison.ref_norm, 0.0);
    ASSERT_EQ(chk.comparison.expert_tokens.size(), static_cast<size_t>(c.E));
    int64_t total = 0;
    for (int64_t n : chk.comparison.expert_tokens) total += n;
    EXPECT_EQ(total, c.T * c.top_k);
  }
}

TEST(MoeViaExpertMatmul, OnlyRoutedTokensAreGathered) {
  const DenseLayer l = random_layer(8, 32, 16, true, Activation::kSilu, 3);
  const int64_t T = 19;
  const std::vector<float> x = random_hidden_states(T, 32, 4);
  const Routing r = route_layer(l, softmax_router(8, 2), x, T);
  const std::vector<int64_t> counts = r.tokens_per_expert(8);
  std::vector<int64_t> seen(8, 0);
  int calls = 0;
  const ExpertMatmulFn inner = float_matmul(l);
  moe_via_expert_matmul(l.spec, r, x.data(),
                        [&](int e, MoeProj p, const float* in, int64_t m, float* y) {
                          ++calls;
                          EXPECT_GT(m, 0);
                          if (p == MoeProj::kW13) seen[e] = m;
                          inner(e, p, in, m, y);
                        });
  EXPECT_EQ(seen, counts);
  int hit = 0;
  for (int64_t n : counts) hit += n > 0;
  EXPECT_EQ(calls, 2 * hit);
}

TEST(MoeViaExpertMatmul, SwappedGateAndUpIsCaught) {
  const DenseLayer l = random_layer(8, 128, 64, true, Activation::kSilu, 21);
  const std::vector<float> x = random_hidden_states(64, 128, 22);
  const ExpertMatmulFn good = float_matmul(l);
  const int64_t I = l.spec.intermediate;
  // A layout bug: the backend's w13 rows come out as [up; gate].
  const ExpertMatmulFn swapped = [&](int e, MoeProj p, const float* in, int64_t m, float* y) {
    good(e, p, in, m, y);
    if (p != MoeProj::kW13) return;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t i = 0; i < I; ++i) std::swap(y[r * 2 * I + i], y[r * 2 * I + I + i]);
  };
  const MoeLayerCheck chk = check_moe_layer(l.spec, softmax_router(8, 2), x.data(), 64, l.router,
                                            {}, {}, l.weights(), swapped);
  EXPECT_GT(chk.comparison.norm_err, 0.1);
  for (size_t e = 0; e < 8; ++e)
    if (chk.comparison.expert_tokens[e] > 0) {
      EXPECT_GT(chk.comparison.expert_max_abs_err[e], 1e-3) << "expert " << e;
    }
}

TEST(MoeViaExpertMatmul, OneCorruptedExpertIsAttributed) {
  const DenseLayer l = random_layer(8, 64, 32, true, Activation::kSilu, 31);
  const std::vector<float> x = random_hidden_states(64, 64, 32);
  const ExpertMatmulFn good = float_matmul(l);
  const Routing r = route_layer(l, softmax_router(8, 2), x, 64);
  const std::vector<int64_t> counts = r.tokens_per_expert(8);
  int bad = 0;
  while (counts[static_cast<size_t>(bad)] == 0) ++bad;
  // Expert `bad`'s w2 output rows shifted by one (an off-by-one in a row shuffle).
  const ExpertMatmulFn broken = [&](int e, MoeProj p, const float* in, int64_t m, float* y) {
    good(e, p, in, m, y);
    if (e != bad || p != MoeProj::kW2) return;
    const int64_t H = l.spec.hidden;
    for (int64_t row = 0; row < m; ++row)
      std::rotate(y + row * H, y + row * H + 1, y + (row + 1) * H);
  };
  const MoeOutput ref = moe_reference(l.spec, r, x.data(), l.weights());
  const MoeOutput got = moe_via_expert_matmul(l.spec, r, x.data(), broken);
  const MoeComparison c = compare_moe(ref, got, r, 8);
  EXPECT_GT(c.norm_err, 1e-2);
  for (int e = 0; e < 8; ++e) {
    if (e == bad) {
      EXPECT_GT(c.expert_max_abs_err[e], 1e-2);
    } else {
      EXPECT_LT(c.expert_max_abs_err[e], 1e-4) << "expert " << e;
    }
  }
}

TEST(MoeViaExpertMatmul, UnwrittenOutputIsNonFinite) {
  const DenseLayer l = random_layer(4, 32, 16, true, Activation::kSilu, 41);
  const std::vector<float> x = random_hidden_states(8, 32, 42);
  const ExpertMatmulFn good = float_matmul(l);
  // A backend that leaves the last output column of w2 unwritten.
  const ExpertMatmulFn lazy = [&](int e, MoeProj p, const float* in, int64_t m, float* y) {
    if (p == MoeProj::kW13) return good(e, p, in, m, y);
    std::vector<float> tmp(static_cast<size_t>(m * 32));
    good(e, p, in, m, tmp.data());
    for (int64_t r = 0; r < m; ++r) std::copy(&tmp[r * 32], &tmp[r * 32] + 31, y + r * 32);
  };
  const MoeLayerCheck chk = check_moe_layer(l.spec, softmax_router(4, 2), x.data(), 8, l.router, {},
                                            {}, l.weights(), lazy);
  EXPECT_FALSE(chk.comparison.finite);
  EXPECT_TRUE(std::isinf(chk.comparison.norm_err));
}

TEST(MoeReference, BadWeightSizeIsReported) {
  const DenseLayer l = random_layer(2, 8, 4, true, Activation::kSilu, 1);
  const std::vector<float> x = random_hidden_states(4, 8, 1);
  const Routing r = route_layer(l, softmax_router(2, 1), x, 4);
  try {
    moe_reference(l.spec, r, x.data(), [](int64_t, MoeProj) { return std::vector<float>(5); });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadShape);
    EXPECT_EQ(e.tensor(), "w13");
  }
}

TEST(Activation, FromHfConfig) {
  EXPECT_EQ(activation_from_hf("silu"), Activation::kSilu);
  EXPECT_EQ(activation_from_hf("relu2"), Activation::kRelu2);
  EXPECT_EQ(activation_from_hf("gelu_pytorch_tanh"), Activation::kGeluTanh);  // Gemma-4
  // The erf GELU is another function: refused, never approximated.
  try {
    activation_from_hf("gelu");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

// A quantised layer: the reference dequantises through dequantize_expert (canonical codes
// [E, N, K], fp32 scales per group of 16 along K); a mini "backend" stores the codes transposed
// [E, K, N] with its own scale table and computes from that layout.
TEST(CheckMoeLayer, QuantisedLayerThroughDequantizeExpert) {
  const int64_t E = 6, H = 64, I = 32, T = 64, gs = 16;
  auto make_q = [&](int64_t n, int64_t k, uint64_t seed) {
    QuantTensor q;
    q.experts = E;
    q.n = n;
    q.k = k;
    q.kind = CodeKind::kUint;
    q.bits = 4;
    q.group_size = gs;
    q.symmetric = true;
    q.scale_dtype = DType::kF32;
    std::mt19937_64 g(seed);
    q.codes.resize(static_cast<size_t>(E * n * k));
    for (auto& c : q.codes) c = static_cast<uint8_t>(g() & 15);
    std::vector<float> s(static_cast<size_t>(E * n * q.groups()));
    for (auto& v : s) v = 0.01f + static_cast<float>(g() % 1000) * 1e-5f;
    q.scales.resize(s.size() * 4);
    std::memcpy(q.scales.data(), s.data(), q.scales.size());
    q.check_consistent("test");
    return q;
  };
  MoeExperts layer;
  layer.w13 = make_q(2 * I, H, 1);
  layer.w2 = make_q(H, I, 2);
  // The backend's own layout: codes transposed to [E, K, N], scales as float [E, G, N].
  struct Packed {
    int64_t n, k, groups;
    std::vector<uint8_t> codes_kn;
    std::vector<float> scales_gn;
  };
  auto pack = [&](const QuantTensor& q) {
    Packed p{q.n, q.k, q.groups(), std::vector<uint8_t>(q.codes.size()),
             std::vector<float>(static_cast<size_t>(E * q.groups() * q.n))};
    for (int64_t e = 0; e < E; ++e)
      for (int64_t n = 0; n < q.n; ++n) {
        for (int64_t k = 0; k < q.k; ++k)
          p.codes_kn[(e * q.k + k) * q.n + n] = q.codes[(e * q.n + n) * q.k + k];
        for (int64_t g = 0; g < q.groups(); ++g)
          std::memcpy(&p.scales_gn[(e * q.groups() + g) * q.n + n],
                      &q.scales[((e * q.n + n) * q.groups() + g) * 4], 4);
      }
    return p;
  };
  const Packed p13 = pack(layer.w13), p2 = pack(layer.w2);
  auto backend = [&](bool bug) -> ExpertMatmulFn {
    return [&, bug](int e, MoeProj proj, const float* x, int64_t m, float* y) {
      const Packed& p = proj == MoeProj::kW13 ? p13 : p2;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t n = 0; n < p.n; ++n) {
          float acc = 0.f;
          for (int64_t k = 0; k < p.k; ++k) {
            // The bug: scale group taken from the wrong axis position (k+1).
            const int64_t g = bug ? std::min<int64_t>((k + 1) / gs, p.groups - 1) : k / gs;
            const float w = (static_cast<float>(p.codes_kn[(e * p.k + k) * p.n + n]) - 8.f) *
                            p.scales_gn[(e * p.groups + g) * p.n + n];
            acc += x[r * p.k + k] * w;
          }
          y[r * p.n + n] = acc;
        }
    };
  };
  MoeSpec spec;
  spec.experts = E;
  spec.hidden = H;
  spec.intermediate = I;
  const ExpertWeightsFn weights = [&](int64_t e, MoeProj proj) {
    return dequantize_expert(proj == MoeProj::kW13 ? layer.w13 : layer.w2, e);
  };
  const std::vector<float> router = uniform_floats(static_cast<size_t>(E * H), 0.2f, 9);
  const std::vector<float> x = random_hidden_states(T, H, 0);
  const RouterConfig rc = softmax_router(E, 2);
  const MoeLayerCheck ok =
      check_moe_layer(spec, rc, x.data(), T, router, {}, {}, weights, backend(false));
  EXPECT_LT(ok.comparison.norm_err, 1e-5);
  const MoeLayerCheck bad =
      check_moe_layer(spec, rc, x.data(), T, router, {}, {}, weights, backend(true));
  EXPECT_GT(bad.comparison.norm_err, 1e-3);
}

TEST(RandomHiddenStates, DeterministicForASeed) {
  const std::vector<float> a = random_hidden_states(64, 33, 1234);
  const std::vector<float> b = random_hidden_states(64, 33, 1234);
  const std::vector<float> c = random_hidden_states(64, 33, 1235);
  ASSERT_EQ(a.size(), 64u * 33u);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float)));
  // A prefix of a longer draw is the same draw (tokens are generated in order).
  const std::vector<float> longer = random_hidden_states(65, 33, 1234);
  EXPECT_EQ(0, std::memcmp(a.data(), longer.data(), a.size() * sizeof(float)));
}

TEST(RandomHiddenStates, FollowsTheDocumentedAlgorithm) {
  // mt19937_64's sequence is fixed by the standard (its 10000th output from the default seed
  // 5489 is 9981545732273789042); the first pair is Box-Muller on 53-bit uniforms.
  std::mt19937_64 check;
  check.discard(9999);
  ASSERT_EQ(check(), 9981545732273789042ull);
  std::mt19937_64 g(42);
  const double u1 = 1.0 - static_cast<double>(g() >> 11) / 9007199254740992.0;
  const double u2 = static_cast<double>(g() >> 11) / 9007199254740992.0;
  const double rad = std::sqrt(-2.0 * std::log(u1));
  const std::vector<float> v = random_hidden_states(1, 2, 42);
  EXPECT_EQ(v[0], static_cast<float>(rad * std::cos(2.0 * M_PI * u2)));
  EXPECT_EQ(v[1], static_cast<float>(rad * std::sin(2.0 * M_PI * u2)));
}

TEST(RandomHiddenStates, StandardNormalMoments) {
  const std::vector<float> v = random_hidden_states(1000, 101, 7);  // odd count too
  double sum = 0, sq = 0;
  for (float f : v) {
    ASSERT_TRUE(std::isfinite(f));
    sum += f;
    sq += double(f) * f;
  }
  const double n = static_cast<double>(v.size()), mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.02);
}

}  // namespace
}  // namespace moepack::ref
