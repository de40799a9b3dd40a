// The fast Marlin decode (formats/fast_unpack.h) against the scalar definitions it replaces
// (marlin_unrepack, marlin_unpermute_scales, marlin_unpack_zero_points, unpack_marlin_moe_scalar):
// byte for byte over random words and random legal layers, same errors for bad bytes, and a
// mutated tile word moving exactly the code the field map names.
#include "formats/fast_unpack.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "formats/layout/marlin_layout.h"
#include "formats/marlin.h"
#include "formats/wna16_util.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using Rng = std::mt19937_64;

std::vector<uint32_t> random_words(Rng& rng, int64_t count) {
  std::vector<uint32_t> w(static_cast<size_t>(count));
  for (auto& x : w) x = static_cast<uint32_t>(rng());
  return w;
}

std::string dims(int64_t n, int64_t k, int bits) {
  return "N=" + std::to_string(n) + " K=" + std::to_string(k) + " bits=" + std::to_string(bits);
}

// Arbitrary words (every field value, not only what a pack writes) over random tilings.
TEST(FastUnpack, TilesEqualScalarUnrepackOnRandomWords) {
  Rng rng(2701);
  for (int trial = 0; trial < 60; ++trial) {
    const int bits = trial % 2 ? 8 : 4;
    const int64_t n = 64 * (1 + static_cast<int64_t>(rng() % 5));
    const int64_t k = 16 * (1 + static_cast<int64_t>(rng() % 12));
    const std::vector<uint32_t> w = random_words(rng, n * k / marlin::pack_factor(bits));
    const std::vector<uint8_t> want = marlin_unrepack(w.data(), n, k, bits, false);
    std::vector<uint8_t> got(static_cast<size_t>(n * k), 0xee);
    marlin_unrepack_fast(w.data(), n, k, bits, got.data());
    ASSERT_TRUE(got == want) << dims(n, k, bits);
    std::vector<uint8_t> swar(got.size(), 0xee);
    marlin_unrepack_swar(w.data(), n, k, bits, swar.data());
    ASSERT_TRUE(swar == want) << dims(n, k, bits) << " (64-bit words)";
    // Act-order rows: row n's code k' lands at column sort[k'].
    std::vector<int32_t> sort(static_cast<size_t>(k));
    std::iota(sort.begin(), sort.end(), 0);
    std::shuffle(sort.begin(), sort.end(), rng);
    std::vector<uint8_t> scratch(static_cast<size_t>(n * k)), sorted(got.size(), 0xee);
    marlin_unrepack_sorted_fast(w.data(), n, k, bits, sort.data(), scratch.data(), sorted.data());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i)
        ASSERT_EQ(sorted[static_cast<size_t>(r * k + sort[static_cast<size_t>(i)])],
                  want[static_cast<size_t>(r * k + i)])
            << dims(n, k, bits) << " row " << r << " k " << i;
  }
  EXPECT_TRUE(marlin_unrepack_fast_applies(4, false));
  EXPECT_TRUE(marlin_unrepack_fast_applies(8, false));
  EXPECT_FALSE(marlin_unrepack_fast_applies(4, true));
  EXPECT_FALSE(marlin_unrepack_fast_applies(8, true));
  std::vector<uint8_t> out(64 * 32);
  const std::vector<uint32_t> w = random_words(rng, 64 * 32 / 8);
  test::expect_error([&] { marlin_unrepack_fast(w.data(), 32, 64, 4, out.data()); },
                     ErrorCode::kInternal);
}

// One field of one word changed: exactly the code word_field_coords names changes, to the new
// field value (the fast path reads every field of every word, and puts it where the map says).
TEST(FastUnpack, MutatedTileWordMovesExactlyItsCode) {
  Rng rng(2702);
  for (int bits : {4, 8}) {
    const int64_t n = 128, k = 48;
    const int pf = marlin::pack_factor(bits), T = marlin::words_per_tile(bits);
    std::vector<uint32_t> w = random_words(rng, n * k / pf);
    std::vector<uint8_t> base(static_cast<size_t>(n * k)), got(base.size());
    marlin_unrepack_fast(w.data(), n, k, bits, base.data());
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t kt = static_cast<int64_t>(rng() % (k / 16)),
                    nt = static_cast<int64_t>(rng() % 2);
      const int r = static_cast<int>(rng() % T), f = static_cast<int>(rng() % pf);
      const size_t at = static_cast<size_t>((kt * (n / 64) + nt) * T + r);
      const uint32_t mask = (1u << bits) - 1u, old = (w[at] >> (bits * f)) & mask;
      const uint32_t now = (old + 1 + static_cast<uint32_t>(rng() % mask)) & mask;  // != old
      std::vector<uint32_t> m = w;
      m[at] = (m[at] & ~(mask << (bits * f))) | now << (bits * f);
      marlin_unrepack_fast(m.data(), n, k, bits, got.data());
      int64_t kk, nn;
      marlin::word_field_coords(bits, false, kt, nt, r, f, &kk, &nn);
      const size_t want_at = static_cast<size_t>(nn * k + kk);
      ASSERT_EQ(got[want_at], now) << "bits " << bits << " word " << at << " field " << f;
      ASSERT_EQ(base[want_at], old);
      int changed = 0;
      for (size_t i = 0; i < got.size(); ++i) changed += got[i] != base[i];
      ASSERT_EQ(changed, 1) << "bits " << bits << " word " << at << " field " << f;
    }
  }
}

TEST(FastUnpack, ScalesAndZeroPointsEqualScalarPermutations) {
  Rng rng(2703);
  for (int trial = 0; trial < 80; ++trial) {
    const bool grouped = trial % 2;
    const int64_t g = 1 + static_cast<int64_t>(rng() % 9),
                  n = 64 * (1 + static_cast<int64_t>(rng() % 4));
    std::vector<uint16_t> s(static_cast<size_t>(g * n));
    for (auto& v : s) v = static_cast<uint16_t>(rng());
    std::vector<uint8_t> bytes(s.size() * 2), want(bytes.size());
    std::memcpy(bytes.data(), s.data(), bytes.size());
    marlin_unpermute_scales(bytes.data(), g, n, 2, grouped);
    wna16::transpose_bytes(bytes.data(), g, n, 2, want.data());
    std::vector<uint16_t> got(s.size(), 0xeeee);
    marlin_unpermute_transpose_scales(s.data(), g, n, grouped, got.data());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << "G=" << g << " N=" << n;

    const int bits = trial % 4 < 2 ? 4 : 8;
    const bool a8 = trial % 3 == 0;
    const std::vector<uint32_t> zw = random_words(rng, g * n / marlin::pack_factor(bits));
    const std::vector<uint8_t> zp = marlin_unpack_zero_points(zw.data(), g, n, bits, a8);
    std::vector<uint8_t> zwant(zp.size()), zgot(zp.size(), 0xee);
    wna16::transpose_bytes(zp.data(), g, n, 1, zwant.data());
    marlin_unpack_zero_points_transposed(zw.data(), g, n, bits, a8, zgot.data());
    ASSERT_TRUE(zgot == zwant) << "G=" << g << " N=" << n << " bits " << bits << " a8 " << a8;
  }
}

// ---- whole layers: unpack_marlin_moe (fast) == unpack_marlin_moe_scalar ---------------------

struct Case {
  QuantMethod method = QuantMethod::kGptq;
  int bits = 4;
  int64_t gs = 128, E = 1, H = 128, I = 128;
  bool act_order = false, gated = true;
  DType act = DType::kF16;
  VllmTarget target = VllmTarget::kV2026_05;
  int threads = 1;
};

std::string describe(const Case& c) {
  return std::string(quant_method_name(c.method)) + " bits=" + std::to_string(c.bits) +
         " gs=" + std::to_string(c.gs) + " E=" + std::to_string(c.E) + " H=" + std::to_string(c.H) +
         " I=" + std::to_string(c.I) + " act_order=" + std::to_string(c.act_order) +
         " gated=" + std::to_string(c.gated) + " act=" + dtype_name(c.act) +
         " target=" + vllm_target_name(c.target) + " threads=" + std::to_string(c.threads);
}

QuantTensor random_proj(Rng& rng, const Case& c, int64_t n, int64_t k) {
  QuantTensor q;
  q.experts = c.E;
  q.n = n;
  q.k = k;
  q.bits = c.bits;
  q.group_size = c.gs;
  q.symmetric = c.method != QuantMethod::kAwq;
  q.scale_dtype = c.act;
  const int64_t G = q.groups();
  q.codes.resize(static_cast<size_t>(c.E * n * k));
  for (auto& v : q.codes) v = static_cast<uint8_t>(rng() & ((1u << c.bits) - 1u));
  q.scales.resize(static_cast<size_t>(c.E * n * G * 2));
  for (size_t i = 0; i < q.scales.size(); i += 2) {
    const uint16_t h = 0x2000 + static_cast<uint16_t>(rng() % 0x1000);  // finite, positive
    std::memcpy(q.scales.data() + i, &h, 2);
  }
  if (!q.symmetric) {
    q.zeros.resize(static_cast<size_t>(c.E * n * G));
    for (auto& z : q.zeros) z = static_cast<uint8_t>(rng() & ((1u << c.bits) - 1u));
  }
  if (c.act_order)
    for (int64_t e = 0; e < c.E; ++e) {
      const std::vector<int32_t> g = test::random_act_order_g_idx(rng, k, c.gs);
      q.g_idx.insert(q.g_idx.end(), g.begin(), g.end());
    }
  return q;
}

Case random_case(Rng& rng) {
  Case c;
  const QuantMethod methods[] = {QuantMethod::kGptq, QuantMethod::kAwq,
                                 QuantMethod::kCtPackQuantized};
  c.method = methods[rng() % 3];
  const bool awq = c.method == QuantMethod::kAwq;
  c.bits = awq ? 4 : (rng() % 2 ? 8 : 4);
  const int64_t groups[] = {-1, 32, 64, 128};
  c.gs = awq ? groups[1 + rng() % 3] : groups[rng() % 4];
  c.E = 1 + static_cast<int64_t>(rng() % 5);
  c.H = 128 * (1 + static_cast<int64_t>(rng() % 3));
  c.target = rng() % 3 == 0 ? VllmTarget::kV0_33 : VllmTarget::kV2026_05;
  // 0.33 pads I up to a tile: odd multiples of the group size reach the padding.
  const int64_t step =
      c.target == VllmTarget::kV0_33 && c.gs > 0 ? c.gs : std::max<int64_t>(64, c.gs);
  c.I = step * (1 + static_cast<int64_t>(rng() % (384 / step)));
  if (c.target == VllmTarget::kV0_33 && rng() % 2) {  // an I the target pads
    c.gs = 32;
    c.I = 32 * (1 + 2 * static_cast<int64_t>(rng() % 5));
  }
  c.act_order = !awq && c.gs > 0 && c.target == VllmTarget::kV2026_05 && rng() % 2;
  c.gated = rng() % 4 != 0;
  c.act = rng() % 2 ? DType::kBF16 : DType::kF16;
  c.threads = 1 + static_cast<int>(rng() % 9);
  return c;
}

LayoutOptions options_of(const Case& c) {
  LayoutOptions o;
  o.act_dtype = c.act;
  o.source_method = c.method;
  o.gated = c.gated;
  o.vllm_target = c.target;
  o.inter = c.I;
  o.threads = c.threads;
  o.prefix = "model.layers.3.mlp.experts.";
  return o;
}

TensorMap packed_layer(Rng& rng, const Case& c) {
  MoeExperts x;
  x.w13 = random_proj(rng, c, c.gated ? 2 * c.I : c.I, c.H);
  x.w2 = random_proj(rng, c, c.H, c.I);
  TensorMap m;
  for (auto& t : pack_marlin_moe(options_of(c), x)) m[t.name] = std::move(t);
  return m;
}

void expect_same(const MoeExperts& a, const MoeExperts& b, const std::string& what) {
  const QuantTensor* x[2] = {&a.w13, &a.w2};
  const QuantTensor* y[2] = {&b.w13, &b.w2};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(x[i]->spec().bits, y[i]->spec().bits) << what;
    EXPECT_EQ(x[i]->group_size, y[i]->group_size) << what;
    EXPECT_EQ(x[i]->symmetric, y[i]->symmetric) << what;
    EXPECT_EQ(x[i]->experts, y[i]->experts) << what;
    EXPECT_EQ(x[i]->n, y[i]->n) << what;
    EXPECT_EQ(x[i]->k, y[i]->k) << what;
    EXPECT_TRUE(x[i]->codes == y[i]->codes) << what << " codes of proj " << i;
    EXPECT_TRUE(x[i]->scales == y[i]->scales) << what << " scales of proj " << i;
    EXPECT_TRUE(x[i]->zeros == y[i]->zeros) << what << " zeros of proj " << i;
    EXPECT_TRUE(x[i]->g_idx == y[i]->g_idx) << what << " g_idx of proj " << i;
  }
}

// Random legal layers, then random bytes in every weight and scale word (what a pack writes and
// what it never would): the fast unpack equals the scalar one byte for byte.
TEST(FastUnpack, LayersEqualScalarUnpack) {
  Rng rng(2704);
  int act_order = 0, zero_points = 0, int8 = 0, padded = 0, refused = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const Case c = random_case(rng);
    TensorMap m = packed_layer(rng, c);
    const LayoutOptions o = options_of(c);
    if (trial % 2)  // arbitrary words: every field value, not a pack's image
      for (auto& [name, t] : m)
        if (name.find("qweight") != std::string::npos ||
            name.find("weight_packed") != std::string::npos ||
            name.find("qzeros") != std::string::npos)
          for (auto& b : t.data) b = static_cast<uint8_t>(rng());
    // Random words in vLLM 0.33's intermediate padding are refused: the same error from both.
    MoeExperts want;
    try {
      want = unpack_marlin_moe_scalar(o, m);
    } catch (const Error& err) {
      const Error again = test::expect_error([&] { unpack_marlin_moe(o, m); }, err.code());
      EXPECT_EQ(std::string(again.what()), std::string(err.what())) << describe(c);
      ++refused;
      continue;
    }
    const MoeExperts got = unpack_marlin_moe(o, m);
    expect_same(got, want, describe(c));
    act_order += c.act_order;
    zero_points += c.method == QuantMethod::kAwq;
    int8 += c.bits == 8;
    const std::string w2 = o.prefix + marlin_param_names(c.method, MoeProj::kW2).qweight;
    padded += want.w2.k != m.at(w2).shape[1] * 16;
    if (HasFailure()) return;
  }
  EXPECT_GT(act_order, 10);
  EXPECT_GT(zero_points, 10);
  EXPECT_GT(int8, 10);
  EXPECT_GT(padded, 3);
  EXPECT_GT(refused, 3);
}

// Bad bytes the decode refuses: the same error (code, tensor, message) from both paths.
TEST(FastUnpack, SameErrorsAsScalarUnpack) {
  Rng rng(2705);
  for (int trial = 0; trial < 12; ++trial) {
    Case c;
    c.act_order = true;
    c.E = 1 + trial % 5;
    c.bits = trial % 2 ? 8 : 4;
    c.gs = 32;
    c.I = 128;
    c.threads = 1 + trial % 4;
    TensorMap m = packed_layer(rng, c);
    const LayoutOptions o = options_of(c);
    const std::string sort_name = o.prefix + (trial % 3 ? "w2" : "w13") + "_g_idx_sort_indices";
    Tensor& sort = m.at(sort_name);
    const int64_t K = sort.shape[1];
    const int64_t e = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.E));
    const int64_t at = e * K + static_cast<int64_t>(rng() % static_cast<uint64_t>(K));
    // A repeated index (no permutation), or one outside [0, K).
    sort.as<int32_t>()[at] = trial % 2 ? sort.as<int32_t>()[at == e * K ? at + 1 : at - 1]
                                       : static_cast<int32_t>(K + trial);
    const Error a =
        test::expect_error([&] { unpack_marlin_moe_scalar(o, m); }, ErrorCode::kBadValue);
    const Error b = test::expect_error([&] { unpack_marlin_moe(o, m); }, ErrorCode::kBadValue);
    EXPECT_EQ(std::string(b.what()), std::string(a.what())) << describe(c);
    EXPECT_NE(std::string(a.what()).find(sort_name), std::string::npos) << a.what();
  }
}

}  // namespace
}  // namespace moepack
