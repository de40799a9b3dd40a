// The fused Marlin MoE kernel (kernels/include/marlin_moe.cuh) against the CPU definition: the
// layer packed by pack_marlin_moe, each routed (token, slot) run through reader_expert_matmul over
// the layout's readers (formats/marlin.cpp marlin_make_reader) for w13 and w2 with the serving
// kernel's roundings (activations in the activation dtype, silu(gate)*up rounded to it), combined
// in double. Skips without a device.
//
// Tolerance: the kernel accumulates in fp32 in another order (mma fragments, split-K, group
// partial sums scaled in fp32), so h can round to the neighbouring 16-bit value where the CPU
// did not: per output element |gpu - cpu| <= 2^-7 * sum_s w_s sum_i |W2[n, i] h_i| (two ulps of
// bf16 on every h_i, far above fp32 summation error) plus 1e-6, and the relative L2 error over
// all outputs <= 2e-3. A corrupted Marlin word fails both (checked below, so the test can fail).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>

#include "core/half.h"
#include "formats/marlin.h"
#include "formats/moe_reader.h"
#include "kernels/marlin_moe.h"
#include "kernels/moepack_cuda.h"
#include "tests/test_util.h"

using namespace moepack;
using moepack::test::Rng;

namespace {

struct Case {
  int64_t experts, hidden, inter, group;  // group -1: channelwise
  bool gated, bf16;
  int64_t tokens;
  int32_t top_k;
};

std::string describe(const Case& c) {
  std::ostringstream o;
  o << "E=" << c.experts << " H=" << c.hidden << " I=" << c.inter << " group=" << c.group
    << (c.gated ? " gated" : " relu2") << (c.bf16 ? " bf16" : " fp16") << " tokens=" << c.tokens
    << " top_k=" << c.top_k;
  return o.str();
}

struct Layer {
  MoeExperts experts;
  LayoutOptions opts;
  TensorMap params;
  reader::ProjReader r13, r2;  // the layout's readers over `params` (host memory)
  MarlinMoeHostLayer host;
};

Layer make_layer(Rng& rng, const Case& c) {
  Layer L;
  QuantSpec spec;
  spec.kind = CodeKind::kUint;
  spec.bits = 4;
  spec.group_size = c.group;
  spec.symmetric = true;
  spec.scale_dtype = c.bf16 ? DType::kBF16 : DType::kF16;
  test::RandomTensorOptions ro;
  const int64_t n13 = c.gated ? 2 * c.inter : c.inter;
  L.experts.w13 = test::random_quant_tensor(rng, spec, c.experts, n13, c.hidden, ro);
  L.experts.w2 = test::random_quant_tensor(rng, spec, c.experts, c.hidden, c.inter, ro);
  L.opts.act_dtype = c.bf16 ? DType::kBF16 : DType::kF16;
  L.opts.gated = c.gated;
  L.opts.source_method = QuantMethod::kGptq;
  for (const Tensor& t : pack_marlin_moe(L.opts, L.experts)) L.params[t.name] = t;
  L.r13 = marlin_make_reader(L.opts, L.params, MoeProj::kW13, host_param);
  L.r2 = marlin_make_reader(L.opts, L.params, MoeProj::kW2, host_param);

  MarlinMoeHostLayer& h = L.host;
  h.experts = c.experts;
  h.hidden = c.hidden;
  h.inter = c.inter;
  h.gated = c.gated;
  h.bf16 = c.bf16;
  const auto words = [&](const char* name) {
    const Tensor& t = L.params.at(name);
    return std::vector<uint32_t>(t.as<uint32_t>(), t.as<uint32_t>() + t.data.size() / 4);
  };
  const auto halves = [&](const char* name) {
    const Tensor& t = L.params.at(name);
    return std::vector<uint16_t>(t.as<uint16_t>(), t.as<uint16_t>() + t.data.size() / 2);
  };
  h.w13 = words("w13_qweight");
  h.w2 = words("w2_qweight");
  h.s13 = halves("w13_scales");
  h.s2 = halves("w2_scales");
  h.groups13 = L.params.at("w13_scales").shape[1];
  h.groups2 = L.params.at("w2_scales").shape[1];
  return L;
}

struct Routing {
  std::vector<uint16_t> x;  // [T, H] activation bits
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routing make_routing(Rng& rng, const Case& c) {
  Routing r;
  std::uniform_real_distribution<float> u(-1.f, 1.f), w(0.05f, 1.f);
  r.x.resize(static_cast<size_t>(c.tokens * c.hidden));
  for (uint16_t& v : r.x) v = c.bf16 ? float_to_bf16(u(rng)) : float_to_f16(u(rng));
  std::vector<int32_t> all(static_cast<size_t>(c.experts));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < c.tokens; ++t) {
    // Skewed routing: expert 0 is popular, so some experts fill several m-blocks.
    std::shuffle(all.begin(), all.end(), rng);
    if (t % 2 == 0) std::swap(all[0], *std::find(all.begin(), all.end(), 0));
    for (int s = 0; s < c.top_k; ++s) {
      r.ids.push_back(all[static_cast<size_t>(s)]);
      r.weights.push_back(w(rng));
    }
  }
  return r;
}

float act_round(float v, bool bf16) {
  return bf16 ? bf16_to_float(float_to_bf16(v)) : f16_to_float(float_to_f16(v));
}

// CPU reference and the per-element tolerance bound.
void reference(const Layer& L, const Case& c, const Routing& r, std::vector<double>* out,
               std::vector<double>* bound) {
  const int64_t H = c.hidden, I = c.inter, n13 = c.gated ? 2 * I : I;
  out->assign(static_cast<size_t>(c.tokens * H), 0.0);
  bound->assign(out->size(), 0.0);
  std::vector<std::vector<float>> w2(static_cast<size_t>(c.experts));
  for (int64_t e = 0; e < c.experts; ++e)
    w2[static_cast<size_t>(e)] = dequantize_expert(L.experts.w2, e);
  std::vector<float> x(static_cast<size_t>(H)), h13(static_cast<size_t>(n13)),
      h(static_cast<size_t>(I)), y(static_cast<size_t>(H));
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t k = 0; k < H; ++k) {
      const uint16_t b = r.x[static_cast<size_t>(t * H + k)];
      x[static_cast<size_t>(k)] = c.bf16 ? bf16_to_float(b) : f16_to_float(b);
    }
    for (int s = 0; s < c.top_k; ++s) {
      const int32_t e = r.ids[static_cast<size_t>(t * c.top_k + s)];
      const double wt = r.weights[static_cast<size_t>(t * c.top_k + s)];
      reader_expert_matmul(L.r13, e, x.data(), 1, h13.data());
      for (int64_t i = 0; i < I; ++i) {
        float v;
        if (c.gated) {
          const float g = h13[static_cast<size_t>(i)], u = h13[static_cast<size_t>(I + i)];
          v = g / (1.f + std::exp(-g)) * u;
        } else {
          const float g = std::max(h13[static_cast<size_t>(i)], 0.f);
          v = g * g;
        }
        h[static_cast<size_t>(i)] = act_round(v, c.bf16);
      }
      reader_expert_matmul(L.r2, e, h.data(), 1, y.data());
      const std::vector<float>& W = w2[static_cast<size_t>(e)];
      for (int64_t n = 0; n < H; ++n) {
        double abs_sum = 0;
        for (int64_t i = 0; i < I; ++i)
          abs_sum += std::fabs(static_cast<double>(W[static_cast<size_t>(n * I + i)]) *
                               h[static_cast<size_t>(i)]);
        (*out)[static_cast<size_t>(t * H + n)] += wt * y[static_cast<size_t>(n)];
        (*bound)[static_cast<size_t>(t * H + n)] += wt * abs_sum;
      }
    }
  }
}

struct Comparison {
  double rel_l2 = 0, worst_ratio = 0;  // worst |d| / tolerance
  int64_t worst_index = -1, over = 0;
};

Comparison compare(const std::vector<float>& gpu, const std::vector<double>& ref,
                   const std::vector<double>& bound) {
  Comparison c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(gpu[i] - ref[i]);
    num += d * d;
    den += ref[i] * ref[i];
    const double tol = std::ldexp(bound[i], -7) + 1e-6;
    if (d > tol) ++c.over;
    if (d / tol > c.worst_ratio) {
      c.worst_ratio = d / tol;
      c.worst_index = static_cast<int64_t>(i);
    }
  }
  c.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  return c;
}

bool have_device() {
  return cuda_device_info().available;
}

}  // namespace

TEST(MarlinMoeCuda, MatchesCpuExpertMatmul) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  Rng rng(1212);
  const std::vector<Case> cases = {
      // decode shapes (16-row m-blocks, split-K warps) and prefill shapes (64-row m-blocks)
      {8, 256, 128, 128, true, true, 1, 2},
      {8, 256, 128, 128, true, true, 5, 4},
      {8, 256, 128, 128, true, true, 200, 4},
      {8, 256, 128, 128, true, false, 33, 4},
      {8, 384, 192, 64, true, true, 7, 3},
      {8, 384, 192, 64, true, false, 130, 3},
      {4, 256, 128, -1, true, true, 9, 2},
      {4, 256, 128, -1, true, false, 100, 2},
      {6, 128, 256, 32, false, true, 11, 2},
      {6, 128, 256, 32, false, true, 90, 3},
      {3, 512, 64, 64, true, true, 1, 1},
      {16, 256, 128, 128, true, true, 64, 8},
      // more experts than align threads (each thread scans a run of experts), both block shapes
      {1100, 128, 64, 64, true, true, 300, 4},
      {1100, 128, 128, 64, false, false, 2500, 8},
      // w2 K of 24 k-tiles: 8-tile split-K units leave k-slice warps idle
      {8, 128, 384, 128, true, true, 6, 2},
      {8, 128, 384, 128, true, true, 150, 4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    const Layer L = make_layer(rng, c);
    const Routing r = make_routing(rng, c);
    std::vector<double> ref, bound;
    reference(L, c, r, &ref, &bound);
    const std::vector<float> gpu =
        cuda_marlin_moe_forward(L.host, r.x, r.ids, r.weights, c.tokens, c.top_k);
    ASSERT_EQ(gpu.size(), ref.size());
    const Comparison cmp = compare(gpu, ref, bound);
    EXPECT_EQ(cmp.over, 0) << "worst element " << cmp.worst_index << ": gpu "
                           << gpu[static_cast<size_t>(cmp.worst_index)] << " cpu "
                           << ref[static_cast<size_t>(cmp.worst_index)] << " ratio "
                           << cmp.worst_ratio;
    EXPECT_LT(cmp.rel_l2, 2e-3);
    std::printf("%s: rel_l2 %.3g, worst |d|/tol %.3g\n", describe(c).c_str(), cmp.rel_l2,
                cmp.worst_ratio);
  }
}

// The comparison can fail: one flipped nibble pattern in a routed expert's w13 or a swapped
// pair of w2 scales is caught.
TEST(MarlinMoeCuda, CorruptedLayoutIsCaught) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  Rng rng(77);
  const Case c{8, 256, 128, 128, true, true, 16, 2};
  Layer L = make_layer(rng, c);
  const Routing r = make_routing(rng, c);
  std::vector<double> ref, bound;
  reference(L, c, r, &ref, &bound);
  const int32_t e = r.ids[0];
  const size_t per_expert13 = L.host.w13.size() / static_cast<size_t>(c.experts);
  MarlinMoeHostLayer bad = L.host;
  for (size_t i = 0; i < 64; ++i) bad.w13[static_cast<size_t>(e) * per_expert13 + i] ^= 0x88888888u;
  Comparison cmp =
      compare(cuda_marlin_moe_forward(bad, r.x, r.ids, r.weights, c.tokens, c.top_k), ref, bound);
  EXPECT_GT(cmp.over, 0);
  bad = L.host;
  const size_t per_expert_s2 = L.host.s2.size() / static_cast<size_t>(c.experts);
  std::swap(bad.s2[static_cast<size_t>(e) * per_expert_s2 + 1],
            bad.s2[static_cast<size_t>(e) * per_expert_s2 + 9]);
  cmp = compare(cuda_marlin_moe_forward(bad, r.x, r.ids, r.weights, c.tokens, c.top_k), ref, bound);
  EXPECT_GT(cmp.over, 0);
}

TEST(MarlinMoeCuda, RefusesUnsupportedShapes) {
  MarlinMoeHostLayer l;
  l.experts = 2;
  l.hidden = 96;  // not a multiple of 64
  l.inter = 64;
  // With CUDA the shape is refused before any device call; without, every entry is kNoCuda.
  try {
    cuda_marlin_moe_forward(l, {}, {}, {}, 0, 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ErrorCode::kUnsupported || e.code() == ErrorCode::kNoCuda) << e.what();
    if (e.code() == ErrorCode::kUnsupported) {
      EXPECT_NE(std::string(e.what()).find("hidden size"), std::string::npos) << e.what();
    }
  }
}
