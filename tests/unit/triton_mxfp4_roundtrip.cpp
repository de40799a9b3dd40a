// triton-mxfp4 (formats/triton_mxfp4.h, docs/triton_mxfp4.md) on random legal gpt-oss layers,
// against an independent restatement of what vLLM 0.33 does to the layer for Mxfp4MoeBackend.TRITON
// on sm90, written as the torch operations it runs, not as index formulas:
//   1. create_weights on sizes from mxfp4_round_up_hidden_size_and_intermediate_size (TRITON on
//      CUDA: Ip = I up to 64, H as is), the gpt-oss loader's copy into the leading rows / columns
//      (w13's rows kept interleaved: 2j gate j, 2j + 1 up j);
//   2. _swizzle_mxfp4: the scale's groups padded to a multiple of 4 (sm90), then per expert
//      HopperMXValueLayout.swizzle_data on the [rows, K/2] bytes (pad rows to 16 and bytes to 32,
//      view as [rows/16, 1, 2, 4, 2, 1, bytes/32, 4, 2, 4, 1, 1], permute (0, 3, 6, 10, 4, 9, 7,
//      1, 8, 2, 5, 11), flatten to [rows/4, bytes*4], _pack_bits over every 4 bytes) and
//      HopperMXScaleLayout(num_warps=8).swizzle_data on the [rows, G] scales (pad rows to 256 and
//      G to 2, view as [rows/256, 2, 8, 2, 8, G/2, 2], permute (0, 2, 5, 1, 4, 6, 3), flatten to
//      [rows/32, G*32]); the biases to float32.
// Also: the reader against the canonical dequantisation, mutants that must break the matmul,
// every refusal and every unpack error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>

#include "core/half.h"
#include "formats/codec.h"
#include "formats/moe_reader.h"
#include "formats/parallel.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::Rng;

int64_t round_up(int64_t v, int64_t u) {
  return (v + u - 1) / u * u;
}

// torch's x.view(sizes).permute(perm).contiguous() over bytes.
std::vector<uint8_t> permute_nd(const std::vector<uint8_t>& x, const std::vector<int64_t>& sizes,
                                const std::vector<int>& perm) {
  const size_t d = sizes.size();
  std::vector<int64_t> stride(d, 1);
  for (size_t i = d - 1; i > 0; --i) stride[i - 1] = stride[i] * sizes[i];
  std::vector<int64_t> out_sizes(d);
  for (size_t i = 0; i < d; ++i) out_sizes[i] = sizes[static_cast<size_t>(perm[i])];
  std::vector<uint8_t> out(x.size());
  std::vector<int64_t> idx(d, 0);  // index into the output
  for (size_t o = 0; o < out.size(); ++o) {
    int64_t src = 0;
    for (size_t i = 0; i < d; ++i) src += idx[i] * stride[static_cast<size_t>(perm[i])];
    out[o] = x[static_cast<size_t>(src)];
    for (size_t i = d; i-- > 0;) {
      if (++idx[i] < out_sizes[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

// [rows, cols] bytes zero-padded to [prow, pcol].
std::vector<uint8_t> pad2(const std::vector<uint8_t>& x, int64_t rows, int64_t cols, int64_t prow,
                          int64_t pcol) {
  std::vector<uint8_t> out(static_cast<size_t>(prow * pcol), 0);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(&out[static_cast<size_t>(r * pcol)], &x[static_cast<size_t>(r * cols)],
                static_cast<size_t>(cols));
  return out;
}

// hopper_value.py _pack_bits on the last dimension's groups of 4 bytes.
std::vector<uint8_t> pack_bits(const std::vector<uint8_t>& x) {
  auto cf = [](uint32_t v) { return ((v & 8u) << 12) | ((v & 7u) << 6); };
  auto c4 = [](uint32_t v) { return ((v & 8u) << 11) | ((v & 6u) << 9) | ((v & 1u) << 13); };
  std::vector<uint8_t> out(x.size());
  for (size_t i = 0; i < x.size(); i += 4) {
    const uint32_t first = cf(x[i]) | (cf(x[i] >> 4) << 16);
    const uint32_t second = cf(x[i + 1]) | (cf(x[i + 1] >> 4) << 16);
    const uint32_t third = cf(x[i + 2]) | (cf(x[i + 2] >> 4) << 16);
    const uint32_t fourth = c4(x[i + 3]) | (c4(x[i + 3] >> 4) << 16);
    const uint32_t w = first | (second >> 3) | (third >> 6) | fourth;
    std::memcpy(&out[i], &w, 4);
  }
  return out;
}

struct VllmLayer {
  std::vector<uint8_t> w13_weight, w2_weight, w13_scale, w2_scale, w13_bias, w2_bias;
};

void append(std::vector<uint8_t>* to, const std::vector<uint8_t>& x) {
  to->insert(to->end(), x.begin(), x.end());
}

// Steps 1-2 above on canonical experts x ([gate; up], biases raw BF16).
VllmLayer vllm_triton_gpt_oss(const MoeExperts& x) {
  const int64_t E = x.w13.experts, H = x.w13.k, I = x.w2.k, ip = round_up(I, 64);
  VllmLayer out;
  for (int p = 0; p < 2; ++p) {
    const QuantTensor& q = p == 0 ? x.w13 : x.w2;
    const int64_t rows = p == 0 ? 2 * ip : H, cols = p == 0 ? H : ip, G = q.k / 32;
    for (int64_t e = 0; e < E; ++e) {
      // The loader's parameter: bytes [rows, cols/2] (low nibble = even column), scales
      // [rows, cols/32], the checkpoint's rows (w13: interleaved) in front.
      std::vector<uint8_t> w(static_cast<size_t>(rows * cols / 2), 0);
      std::vector<uint8_t> s(static_cast<size_t>(rows * cols / 32), 0);
      for (int64_t lr = 0; lr < q.n; ++lr) {
        const int64_t r = p == 0 ? (lr < I ? 2 * lr : 2 * (lr - I) + 1) : lr;
        for (int64_t c = 0; c < q.k; ++c)
          w[static_cast<size_t>(r * cols / 2 + c / 2)] |= static_cast<uint8_t>(
              (q.codes[static_cast<size_t>((e * q.n + lr) * q.k + c)] & 15) << (4 * (c % 2)));
        for (int64_t g = 0; g < G; ++g)
          s[static_cast<size_t>(r * cols / 32 + g)] =
              q.scales[static_cast<size_t>((e * q.n + lr) * G + g)];
      }
      const int64_t mp = round_up(rows, 16), kb = cols / 2, kbp = round_up(kb, 32);
      std::vector<uint8_t> v =
          permute_nd(pad2(w, rows, kb, mp, kbp), {mp / 16, 1, 2, 4, 2, 1, kbp / 32, 4, 2, 4, 1, 1},
                     {0, 3, 6, 10, 4, 9, 7, 1, 8, 2, 5, 11});
      append(p == 0 ? &out.w13_weight : &out.w2_weight, pack_bits(v));
      const int64_t g4 = round_up(cols / 32, 4), msp = round_up(rows, 256), gp = round_up(g4, 2);
      std::vector<uint8_t> sw = pad2(pad2(s, rows, cols / 32, rows, g4), rows, g4, msp, gp);
      append(p == 0 ? &out.w13_scale : &out.w2_scale,
             permute_nd(sw, {msp / 256, 2, 8, 2, 8, gp / 2, 2}, {0, 2, 5, 1, 4, 6, 3}));
      // Biases: the loader's rows, bf16 -> float32.
      const std::vector<uint8_t>& b = p == 0 ? x.w13_bias : x.w2_bias;
      for (int64_t r = 0; r < rows; ++r) {
        int64_t lr = r;
        if (p == 0) lr = r < 2 * I ? (r % 2) * I + r / 2 : -1;
        uint16_t h = 0;
        if (lr >= 0) std::memcpy(&h, &b[static_cast<size_t>((e * q.n + lr) * 2)], 2);
        const float f = bf16_to_float(h);
        uint8_t fb[4];
        std::memcpy(fb, &f, 4);
        (p == 0 ? out.w13_bias : out.w2_bias)
            .insert((p == 0 ? out.w13_bias : out.w2_bias).end(), fb, fb + 4);
      }
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
  o.target_arch = TargetArch::kSm90;
  o.prefix = "model.layers.0.mlp.experts.routed_experts.";
  o.hidden = H;
  o.inter = I;
  return o;
}

const TargetLayout& row() {
  return *find_target_layout("triton-mxfp4");
}

MoeExperts draw_layer(Rng& rng, const LayoutOptions& o, int64_t E, int64_t H, int64_t I) {
  const MoeShape s = moe_shape_for(gpt_oss_params(), E, H, I, true);
  test::RandomTensorOptions ro;
  ro.scales = test::ScaleValues::kModerate;
  MoeExperts x = test::random_moe_experts(rng, s, ro);
  test::add_declared_biases(rng, row().param_specs(o, s), &x);
  return x;
}

TensorMap by_name(const std::vector<Tensor>& ts) {
  TensorMap m;
  for (const auto& t : ts) m.emplace(t.name, t);
  return m;
}

TEST(TritonMxfp4, BytesEqualVllmsStepsOnRandomLegalLayers) {
  Rng rng(2621);
  int cases = 0;
  for (int draw = 0; draw < 24; ++draw) {
    auto pick = [&rng](std::initializer_list<int64_t> v) {
      return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng));
    };
    // Shapes matmul_ogs runs on Hopper: H % 64 == 0, H > 128, 2Ip > 128 (docs/triton_mxfp4.md).
    const int64_t E = pick({1, 2, 3}), H = 64 * pick({3, 4, 5, 9, 13, 45}),
                  I = 32 * pick({3, 4, 5, 7, 8, 10});
    const LayoutOptions o = gpt_oss_options(H, I);
    const MoeShape s = moe_shape_for(gpt_oss_params(), E, H, I, true);
    std::ostringstream trace;
    trace << "E=" << E << " H=" << H << " I=" << I;
    SCOPED_TRACE(trace.str());
    ASSERT_TRUE(row().unsupported_reasons(o, s).empty());
    EXPECT_EQ(row().padded_inter(o, s), round_up(I, 64));
    const MoeExperts x = draw_layer(rng, o, E, H, I);
    const VllmLayer want = vllm_triton_gpt_oss(x);
    const std::vector<Tensor> packed = row().pack(o, x);
    std::vector<ParamSpec> specs;
    for (const Tensor& t : packed) specs.push_back({t.name, t.dtype, t.shape});
    EXPECT_EQ(row().param_specs(o, s), specs);
    const TensorMap got = by_name(packed);
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
    const MoeExperts back = row().unpack(o, got);
    EXPECT_EQ(back.w13.codes, x.w13.codes);
    EXPECT_EQ(back.w13.scales, x.w13.scales);
    EXPECT_EQ(back.w2.codes, x.w2.codes);
    EXPECT_EQ(back.w2.scales, x.w2.scales);
    EXPECT_EQ(back.w13_bias, x.w13_bias);
    EXPECT_EQ(back.w2_bias, x.w2_bias);
    test::expect_reader_matches(rng, row(), o, got, x);
    ++cases;
  }
  EXPECT_EQ(cases, 24);
}

// Corruptions a layout bug would make must break the reader's matmul: gate and up exchanged, the
// interleave ignored, the scale swizzle read for another num_warps, slots of the value word
// exchanged.
TEST(TritonMxfp4, MatmulCatchesLayoutMutants) {
  Rng rng(2622);
  const int64_t E = 2, H = 192, I = 160;
  const LayoutOptions o = gpt_oss_options(H, I);
  const MoeExperts x = draw_layer(rng, o, E, H, I);
  const TensorMap good = by_name(row().pack(o, x));
  const int64_t m = 3;
  std::vector<float> xa(static_cast<size_t>(m * H));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : xa) v = u(rng);
  auto error = [&](const reader::ProjReader& r) {
    std::vector<float> y(static_cast<size_t>(m * x.w13.n));
    reader_expert_matmul(r, 1, xa.data(), m, y.data());
    return test::matmul_error(x.w13, 1, xa, m, y);
  };
  const reader::ProjReader r = row().make_reader(o, good, MoeProj::kW13, host_param);
  EXPECT_LE(error(r), 1e-5);
  MoeExperts swapped = x;
  const int64_t K = H, G = H / 32;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < 2 * I; ++n) {
      const int64_t to = (n + I) % (2 * I);
      std::memcpy(&swapped.w13.codes[static_cast<size_t>((e * 2 * I + to) * K)],
                  &x.w13.codes[static_cast<size_t>((e * 2 * I + n) * K)], static_cast<size_t>(K));
      std::memcpy(&swapped.w13.scales[static_cast<size_t>((e * 2 * I + to) * G)],
                  &x.w13.scales[static_cast<size_t>((e * 2 * I + n) * G)], static_cast<size_t>(G));
    }
  EXPECT_GT(error(row().make_reader(o, by_name(row().pack(o, swapped)), MoeProj::kW13, host_param)),
            0.1);
  reader::ProjReader flat = r;
  flat.triton_mxfp4.interleaved_w13 = 0;
  EXPECT_GT(error(flat), 0.1);
  reader::ProjReader warps4 = r;
  warps4.triton_mxfp4.num_warps = 4;
  EXPECT_GT(error(warps4), 0.1);
  // Every value word's four bytes stored in reverse (the bit fields of the wrong slots).
  TensorMap bad = good;
  std::vector<uint8_t>& w = bad.at(o.prefix + "w13_weight").data;
  for (size_t i = 0; i + 3 < w.size(); i += 4) std::reverse(w.begin() + i, w.begin() + i + 4);
  EXPECT_GT(error(row().make_reader(o, bad, MoeProj::kW13, host_param)), 0.1);
}

// What triton-mxfp4 refuses: every source but gpt-oss, archs but sm90, other vLLM targets, fp16
// activations, a non-gated layer, biases missing or not BF16, tensor / expert parallelism.
TEST(TritonMxfp4, RefusesWhatItCannotWrite) {
  Rng rng(2623);
  const int64_t E = 2, H = 192, I = 96;
  const LayoutOptions o = gpt_oss_options(H, I);
  const MoeShape s = moe_shape_for(gpt_oss_params(), E, H, I, true);
  ASSERT_TRUE(row().unsupported_reasons(o, s).empty());
  auto refused = [&](LayoutOptions lo, const MoeShape& sh, const std::string& word) {
    const std::vector<std::string> why = row().unsupported_reasons(lo, sh);
    ASSERT_EQ(why.size(), 1u) << word;
    EXPECT_NE(why[0].find(word), std::string::npos) << why[0];
  };
  LayoutOptions lo = o;
  lo.act_dtype = DType::kF16;
  refused(lo, s, "bf16");
  lo = o;
  lo.target_arch = TargetArch::kSm100;
  refused(lo, s, "Hopper");
  lo = o;
  lo.vllm_target = VllmTarget::kV2026_05;
  refused(lo, s, "--vllm-target");
  lo = o;
  lo.gated = false;
  refused(lo, moe_shape_for(gpt_oss_params(), E, H, I, false), "non-gated");
  const QuantParams ct = find_source_codec(QuantMethod::kCtMxfp4)->param_space().front();
  lo = o;
  lo.source_method = QuantMethod::kCtMxfp4;
  refused(lo, moe_shape_for(ct, E, H, I, true), "OAI Triton");
  MoeShape odd = moe_shape_for(gpt_oss_params(), E, H, I, true);
  odd.w2.k = 176;
  odd.w13.n = 352;
  refused(o, odd, "I=176");
  // What the kernel does not run (an H200 run of bench/gpu_triton_mxfp4.sh).
  refused(gpt_oss_options(192, 64), moe_shape_for(gpt_oss_params(), E, 192, 64, true),
          "w13 GEMM N = 2Ip = 128");
  refused(gpt_oss_options(128, 96), moe_shape_for(gpt_oss_params(), E, 128, 96, true),
          "w2 GEMM N = H = 128");
  refused(gpt_oss_options(224, 96), moe_shape_for(gpt_oss_params(), E, 224, 96, true),
          "H=224 is not a multiple of 64");
  const MoeExperts x = draw_layer(rng, o, E, H, I);
  MoeExperts nobias = x;
  nobias.w13_bias.clear();
  nobias.w2_bias.clear();
  test::expect_error([&] { row().pack(o, nobias); }, ErrorCode::kUnsupported);
  MoeExperts f32 = x;
  f32.bias_dtype = DType::kF32;
  test::expect_error([&] { row().pack(o, f32); }, ErrorCode::kUnsupported);
  for (int tp : {1, 2}) {
    Parallelism par;
    (tp == 2 ? par.tensor : par.expert) = 2;
    EXPECT_FALSE(parallel_reasons(row(), o, s, par).empty());
  }
}

// Bytes no vLLM layer holds are refused by unpack and the reader's builder alike, naming the
// parameter: nonzero padding codes, scales and biases, a bias that is no bf16 value, shapes that
// do not follow from H and I, a missing parameter.
TEST(TritonMxfp4, UnpackRefusesWhatVllmNeverWrites) {
  Rng rng(2624);
  const int64_t E = 1, H = 192, I = 96;  // I padded to 128
  const LayoutOptions o = gpt_oss_options(H, I);
  const TensorMap good = by_name(row().pack(o, draw_layer(rng, o, E, H, I)));
  const std::string& p = o.prefix;
  auto fails = [&](const std::function<void(TensorMap*)>& corrupt, ErrorCode code,
                   const std::string& name) {
    TensorMap bad = good;
    corrupt(&bad);
    const Error err = test::expect_error([&] { row().unpack(o, bad); }, code);
    EXPECT_EQ(err.tensor(), name);
  };
  // Every byte of the value buffer's padding, and of the scales', must be zero: set them all.
  fails(
      [&](TensorMap* m) {
        for (auto& b : m->at(p + "w2_weight").data) b |= 0x41;
      },
      ErrorCode::kBadValue, p + "w2_weight");
  fails(
      [&](TensorMap* m) {
        for (auto& b : m->at(p + "w13_weight_scale").data) b = 127;
      },
      ErrorCode::kBadValue, p + "w13_weight_scale");
  fails([&](TensorMap* m) { m->at(p + "w13_bias").data[0] ^= 1; }, ErrorCode::kBadValue,
        p + "w13_bias");
  fails(
      [&](TensorMap* m) {
        std::vector<uint8_t>& b = m->at(p + "w13_bias").data;
        const float one = 1.0f;
        std::memcpy(&b[b.size() - 4], &one, 4);  // the last padding row
      },
      ErrorCode::kBadValue, p + "w13_bias");
  fails([&](TensorMap* m) { m->at(p + "w2_weight_scale").shape[1] += 1; }, ErrorCode::kBadShape,
        p + "w2_weight_scale");
  fails([&](TensorMap* m) { m->erase(p + "w2_bias"); }, ErrorCode::kMissingTensor, p + "w2_bias");
  TensorMap shape_bad = good;
  shape_bad.at(p + "w13_weight").shape[2] -= 4;
  EXPECT_THROW(row().make_reader(o, shape_bad, MoeProj::kW13, host_param), Error);
}

}  // namespace
}  // namespace moepack
