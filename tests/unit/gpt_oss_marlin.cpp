// gpt-oss MXFP4 through marlin-mxfp4 (formats/marlin_float.h, docs/gpt-oss.md "Marlin"), on
// random legal layers, against an independent restatement of what vLLM 0.33 does to the layer:
//   1. GptOssMxfp4MoEMethod.create_weights on sizes rounded by
//      mxfp4_round_up_hidden_size_and_intermediate_size (MARLIN: Ip = I up to 128, Hp = H up to
//      256): zero parameters w13 [E, 2Ip, Hp/2] U8, scales [E, 2Ip, Hp/32], w2 [E, Hp, Ip/2],
//      [E, Hp, Ip/32], w13_bias [E, 2Ip] / w2_bias [E, Hp] BF16;
//   2. RoutedExperts.weight_loader's gpt_oss_mxfp4 branch: the checkpoint's tensors copied into
//      the leading rows / columns (param.data[:, :dim1, :dim2].copy_), w13's rows kept
//      interleaved (row 2j gate j, 2j + 1 up j);
//   3. prepare_moe_mxfp4_layer_for_marlin: each expert's codes through gptq_marlin_repack
//      (moepack's marlin_repack, byte-exact with vLLM's on the H100 fixtures of
//      tests/golden/marlin_float), each expert's scales transposed to [Hp/32 or Ip/32, N] and
//      permuted by marlin_permute_scales (64-chunk scale_perm: grouped), every 4 stored as
//      (0, 2, 1, 3) (mxfp4_marlin_process_scales), each expert's biases in 32-chunks permuted by
//      marlin_permute_bias (scale_perm_single).
// The permutations are written out here from get_scale_perms, not taken from the layout code.
// Also: the reader against the canonical dequantisation, and mutants (gate/up swapped, the
// interleave ignored) that must break the matmul.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "core/half.h"
#include "formats/codec.h"
#include "formats/marlin.h"
#include "formats/moe_reader.h"
#include "formats/parallel.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::Rng;

int64_t round_up(int64_t v, int64_t u) {
  return (v + u - 1) / u * u;
}

// get_scale_perms (vLLM 0.33 quantization/utils/marlin_utils.py).
std::vector<int> scale_perm() {
  std::vector<int> p;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) p.push_back(i + 8 * j);
  return p;
}
std::vector<int> scale_perm_single() {
  std::vector<int> p;
  for (int i = 0; i < 4; ++i)
    for (int j : {0, 1, 8, 9, 16, 17, 24, 25}) p.push_back(2 * i + j);
  return p;
}

// x.reshape(-1, len(perm))[:, perm] over elements of `eb` bytes.
std::vector<uint8_t> gather_chunks(const std::vector<uint8_t>& x, const std::vector<int>& perm,
                                   int eb) {
  std::vector<uint8_t> out(x.size());
  const size_t len = perm.size(), chunk = len * static_cast<size_t>(eb);
  for (size_t c = 0; c < x.size() / chunk; ++c)
    for (size_t i = 0; i < len; ++i)
      std::memcpy(&out[c * chunk + i * eb], &x[c * chunk + static_cast<size_t>(perm[i]) * eb],
                  static_cast<size_t>(eb));
  return out;
}

struct VllmLayer {
  std::vector<uint8_t> w13_weight, w2_weight, w13_scale, w2_scale, w13_bias, w2_bias;
};

// Steps 1-3 above on canonical experts x ([gate; up], biases raw BF16).
VllmLayer vllm_marlin_gpt_oss(const MoeExperts& x) {
  const int64_t E = x.w13.experts, H = x.w13.k, I = x.w2.k;
  const int64_t hp = round_up(H, 256), ip = round_up(I, 128);
  VllmLayer out;
  for (int p = 0; p < 2; ++p) {
    const QuantTensor& q = p == 0 ? x.w13 : x.w2;
    const int64_t n = q.n, k = q.k, np = p == 0 ? 2 * ip : hp, kp = p == 0 ? hp : ip;
    const std::vector<uint8_t>& bias = p == 0 ? x.w13_bias : x.w2_bias;
    for (int64_t e = 0; e < E; ++e) {
      // The checkpoint's rows (w13 interleaved) into the zero parameter.
      std::vector<uint8_t> codes(static_cast<size_t>(np * kp), 0),
          sc(static_cast<size_t>(np * kp / 32), 0);
      std::vector<uint8_t> b(static_cast<size_t>(np * 2), 0);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t dst = p == 0 ? (r < I ? 2 * r : 2 * (r - I) + 1) : r;
        std::memcpy(&codes[static_cast<size_t>(dst * kp)],
                    &q.codes[static_cast<size_t>((e * n + r) * k)], static_cast<size_t>(k));
        std::memcpy(&sc[static_cast<size_t>(dst * kp / 32)],
                    &q.scales[static_cast<size_t>((e * n + r) * (k / 32))],
                    static_cast<size_t>(k / 32));
        std::memcpy(&b[static_cast<size_t>(dst * 2)], &bias[static_cast<size_t>((e * n + r) * 2)],
                    2);
      }
      const std::vector<uint32_t> tiles = marlin_repack(codes.data(), np, kp, 4, nullptr, false);
      std::vector<uint8_t>& w = p == 0 ? out.w13_weight : out.w2_weight;
      const size_t at = w.size();
      w.resize(at + tiles.size() * 4);
      std::memcpy(&w[at], tiles.data(), tiles.size() * 4);
      // scales[i].T: [kp/32, np], then the grouped permutation and the pair swap.
      std::vector<uint8_t> t(sc.size());
      for (int64_t r = 0; r < np; ++r)
        for (int64_t g = 0; g < kp / 32; ++g)
          t[static_cast<size_t>(g * np + r)] = sc[static_cast<size_t>(r * (kp / 32) + g)];
      std::vector<uint8_t> s = gather_chunks(t, scale_perm(), 1);
      for (size_t i = 0; i + 3 < s.size(); i += 4) std::swap(s[i + 1], s[i + 2]);
      std::vector<uint8_t>& so = p == 0 ? out.w13_scale : out.w2_scale;
      so.insert(so.end(), s.begin(), s.end());
      const std::vector<uint8_t> pb = gather_chunks(b, scale_perm_single(), 2);
      std::vector<uint8_t>& bo = p == 0 ? out.w13_bias : out.w2_bias;
      bo.insert(bo.end(), pb.begin(), pb.end());
    }
  }
  return out;
}

QuantParams gpt_oss_params() {
  return find_source_codec(QuantMethod::kGptOssMxfp4)->param_space().front();
}

LayoutOptions gpt_oss_options(int64_t H, int64_t I) {
  LayoutOptions o;
  o.source_method = QuantMethod::kGptOssMxfp4;
  o.vllm_target = VllmTarget::kV0_33;
  o.prefix = "model.layers.0.mlp.experts.routed_experts.";
  o.hidden = H;
  o.inter = I;
  return o;
}

MoeExperts draw_layer(Rng& rng, const LayoutOptions& o, int64_t E, int64_t H, int64_t I) {
  const MoeShape s = moe_shape_for(gpt_oss_params(), E, H, I, true);
  test::RandomTensorOptions ro;
  ro.scales = test::ScaleValues::kModerate;
  MoeExperts x = test::random_moe_experts(rng, s, ro);
  test::add_declared_biases(rng, find_target_layout("marlin-mxfp4")->param_specs(o, s), &x);
  return x;
}

TensorMap by_name(const std::vector<Tensor>& ts) {
  TensorMap m;
  for (const auto& t : ts) m.emplace(t.name, t);
  return m;
}

TEST(GptOssMarlin, BytesEqualVllmsStepsOnRandomLegalLayers) {
  Rng rng(2611);
  const TargetLayout& row = *find_target_layout("marlin-mxfp4");
  int cases = 0;
  for (int draw = 0; draw < 24; ++draw) {
    auto pick = [&rng](std::initializer_list<int64_t> v) {
      return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng));
    };
    const int64_t E = pick({1, 2, 3}), H = 32 * pick({1, 2, 3, 5, 8, 9}),
                  I = 32 * pick({1, 2, 3, 4, 5, 8});
    const LayoutOptions o = gpt_oss_options(H, I);
    const MoeShape s = moe_shape_for(gpt_oss_params(), E, H, I, true);
    std::ostringstream trace;
    trace << "E=" << E << " H=" << H << " I=" << I;
    SCOPED_TRACE(trace.str());
    // vLLM 0.33 prepares every gated gpt-oss layer of MXFP4 extents (the padding makes the
    // kernel's thread configurations hold).
    ASSERT_TRUE(row.unsupported_reasons(o, s).empty());
    const MoeExperts x = draw_layer(rng, o, E, H, I);
    const VllmLayer want = vllm_marlin_gpt_oss(x);
    const TensorMap got = by_name(row.pack(o, x));
    const std::string& p = o.prefix;
    for (const auto& [name, bytes] : {std::make_pair(p + "w13_weight", &want.w13_weight),
                                      {p + "w2_weight", &want.w2_weight},
                                      {p + "w13_weight_scale", &want.w13_scale},
                                      {p + "w2_weight_scale", &want.w2_scale},
                                      {p + "w13_bias", &want.w13_bias},
                                      {p + "w2_bias", &want.w2_bias}}) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_TRUE(test::bytes_equal(got.at(name).data, *bytes, 16, name));
    }
    EXPECT_EQ(got.size(), 6u);
    // Exact inverse, biases included.
    const MoeExperts back = row.unpack(o, got);
    EXPECT_EQ(back.w13.codes, x.w13.codes);
    EXPECT_EQ(back.w13.scales, x.w13.scales);
    EXPECT_EQ(back.w2.codes, x.w2.codes);
    EXPECT_EQ(back.w2.scales, x.w2.scales);
    EXPECT_EQ(back.w13_bias, x.w13_bias);
    EXPECT_EQ(back.w2_bias, x.w2_bias);
    ++cases;
  }
  EXPECT_EQ(cases, 24);
}

// The reader's weight(e, n, k) in the logical [gate; up] order is the canonical dequantisation;
// gate/up swapped, or the interleave read as [gate; up] halves, breaks the matmul.
TEST(GptOssMarlin, ReaderMatchesAndCatchesGateUpMutants) {
  Rng rng(2612);
  const TargetLayout& row = *find_target_layout("marlin-mxfp4");
  const int64_t E = 2, H = 96, I = 160;
  const LayoutOptions o = gpt_oss_options(H, I);
  const MoeExperts x = draw_layer(rng, o, E, H, I);
  const TensorMap good = by_name(row.pack(o, x));
  const int64_t m = 3;
  std::vector<float> xa(static_cast<size_t>(m * H));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : xa) v = u(rng);
  auto error = [&](const TensorMap& params, const QuantTensor& want) {
    reader::ProjReader r = row.make_reader(o, params, MoeProj::kW13, host_param);
    std::vector<float> y(static_cast<size_t>(m * want.n));
    reader_expert_matmul(r, 1, xa.data(), m, y.data());
    return test::matmul_error(want, 1, xa, m, y);
  };
  EXPECT_LE(error(good, x.w13), 1e-5);
  // Gate and up exchanged in the canonical form before packing.
  MoeExperts swapped = x;
  const int64_t K = H, G = H / 32;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < 2 * I; ++r) {
      const int64_t to = (r + I) % (2 * I);
      std::memcpy(&swapped.w13.codes[static_cast<size_t>((e * 2 * I + to) * K)],
                  &x.w13.codes[static_cast<size_t>((e * 2 * I + r) * K)], static_cast<size_t>(K));
      std::memcpy(&swapped.w13.scales[static_cast<size_t>((e * 2 * I + to) * G)],
                  &x.w13.scales[static_cast<size_t>((e * 2 * I + r) * G)], static_cast<size_t>(G));
    }
  EXPECT_GT(error(by_name(row.pack(o, swapped)), x.w13), 0.1);
  // The interleave ignored: the reader of a compressed-tensors layout (halves padded per shard)
  // over the same bytes cannot read gpt-oss' rows.
  reader::ProjReader r = row.make_reader(o, good, MoeProj::kW13, host_param);
  r.marlin_float.interleaved_w13 = 0;
  std::vector<float> y(static_cast<size_t>(m * 2 * I));
  reader_expert_matmul(r, 1, xa.data(), m, y.data());
  EXPECT_GT(test::matmul_error(x.w13, 1, xa, m, y), 0.1);
}

// What marlin-mxfp4 refuses for gpt-oss: fp16 activations (no fp16 x E8M0 kernel instance), a
// non-gated layer, biases missing or not BF16, and tensor / expert parallelism (vLLM's gpt-oss
// loader splits its own way).
TEST(GptOssMarlin, RefusesWhatItCannotWrite) {
  Rng rng(2613);
  const TargetLayout& row = *find_target_layout("marlin-mxfp4");
  const int64_t E = 2, H = 64, I = 64;
  LayoutOptions o = gpt_oss_options(H, I);
  const MoeShape s = moe_shape_for(gpt_oss_params(), E, H, I, true);
  LayoutOptions f16 = o;
  f16.act_dtype = DType::kF16;
  EXPECT_FALSE(row.unsupported_reasons(f16, s).empty());
  LayoutOptions ng = o;
  ng.gated = false;
  EXPECT_FALSE(
      row.unsupported_reasons(ng, moe_shape_for(gpt_oss_params(), E, H, I, false)).empty());
  const MoeExperts x = draw_layer(rng, o, E, H, I);
  MoeExperts nobias = x;
  nobias.w13_bias.clear();
  nobias.w2_bias.clear();
  test::expect_error([&] { row.pack(o, nobias); }, ErrorCode::kUnsupported);
  MoeExperts f32 = x;
  f32.bias_dtype = DType::kF32;
  test::expect_error([&] { row.pack(o, f32); }, ErrorCode::kUnsupported);
  for (int tp : {1, 2}) {
    Parallelism par;
    (tp == 2 ? par.tensor : par.expert) = 2;
    EXPECT_FALSE(parallel_reasons(row, o, s, par).empty());
  }
  // A nonzero bias in the padding is no vLLM layer.
  TensorMap bad = by_name(row.pack(o, x));
  std::vector<uint8_t>& b = bad.at(o.prefix + "w13_bias").data;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0x3f;
  test::expect_error([&] { row.unpack(o, bad); }, ErrorCode::kBadValue);
}

}  // namespace
}  // namespace moepack
