// The float Marlin rows (formats/marlin_float.h) beyond the registry suite: every padding edge of
// vLLM 0.33's intermediate padding, each refusal with its numbers, bad scale values, corrupted
// parameters that unpack must name, and mutants of the packed bytes that a layout bug would
// produce, which must break the reader's matmul (what verify computes). Byte equality with vLLM
// itself is tests/golden/marlin_float.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/half.h"
#include "formats/codec.h"
#include "formats/layout/marlin_layout.h"
#include "formats/marlin.h"
#include "formats/marlin_float.h"
#include "formats/moe_reader.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::Rng;

QuantParams mx_params(QuantMethod m = QuantMethod::kModeloptMxfp8) {
  QuantParams q;
  q.method = m;
  q.bits = 8;
  q.group_size = 32;
  return q;
}
QuantParams fp8_block_params(QuantMethod m = QuantMethod::kFp8Block) {
  QuantParams q;
  q.method = m;
  q.bits = 8;
  q.group_size = 128;
  return q;
}

LayoutOptions options(const QuantParams& q, int64_t inter, DType act = DType::kBF16,
                      bool gated = true) {
  return LayoutOptions::for_layer(q.method, act, gated, false, VllmTarget::kV0_33,
                                  "model.layers.0.mlp.experts.routed_experts.", inter, 1);
}

TensorMap by_name(const std::vector<Tensor>& ts) {
  TensorMap m;
  for (const auto& t : ts) m[t.name] = t;
  return m;
}

MoeExperts random_layer(Rng& rng, const QuantParams& q, int64_t E, int64_t H, int64_t I,
                        bool gated = true) {
  return test::random_moe_experts(rng, moe_shape_for(q, E, H, I, gated), {});
}

// max |y - ref| / max |ref| of the reader's matmul over `params` against the canonical
// dequantisation of `x` (what the layout should hold), expert e.
double reader_error(Rng& rng, test::MakeReaderFn make, const LayoutOptions& o,
                    const TensorMap& params, const MoeExperts& x, MoeProj p, int64_t e = 0) {
  const QuantTensor& q = p == MoeProj::kW13 ? x.w13 : x.w2;
  const int64_t m = 3;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> xa(static_cast<size_t>(m * q.k)), y(static_cast<size_t>(m * q.n));
  for (auto& v : xa) v = u(rng);
  test::layout_matmul(make, o, params, p, e, xa.data(), m, y.data());
  return test::matmul_error(q, e, xa, m, y);
}

const std::string kPre = "model.layers.0.mlp.experts.routed_experts.";

// ---- padding ------------------------------------------------------------------------------------

// vLLM 0.33 pads I to a multiple of 64 (MXFP8) per gate/up shard and along w2's K; every edge
// reads back exactly, the padded parameters have the padded shapes, and the reader hides them.
TEST(MarlinFloat, Mxfp8PaddingEdgesRoundTrip) {
  Rng rng(11);
  const TargetLayout& row = *find_target_layout("marlin-mxfp8");
  for (int64_t I : {32, 64, 96, 128, 160, 224, 288}) {
    for (int64_t H : {128, 256, 192}) {
      const QuantParams q = mx_params();
      const LayoutOptions o = options(q, I);
      const MoeShape s = moe_shape_for(q, 2, H, I, true);
      const int64_t ip = (I + 63) / 64 * 64;
      if (H % 128 != 0 && ip % 128 != 0) {
        EXPECT_FALSE(row.unsupported_reasons(o, s).empty()) << "H=" << H << " I=" << I;
        continue;
      }
      SCOPED_TRACE("H=" + std::to_string(H) + " I=" + std::to_string(I));
      ASSERT_TRUE(row.unsupported_reasons(o, s).empty()) << row.unsupported_reasons(o, s)[0];
      EXPECT_EQ(row.padded_inter(o, s), ip);
      const MoeExperts x = random_layer(rng, q, 2, H, I);
      const std::vector<Tensor> packed = row.pack(o, x);
      ASSERT_EQ(packed.size(), 4u);
      EXPECT_EQ(packed[0].shape, (Shape{2, H / 16, 2 * ip * 16 / 4}));
      EXPECT_EQ(packed[1].shape, (Shape{2, ip / 16, H * 16 / 4}));
      EXPECT_EQ(packed[2].shape, (Shape{2, H / 32, 2 * ip}));
      EXPECT_EQ(packed[3].shape, (Shape{2, ip / 32, H}));
      EXPECT_EQ(packed[2].dtype, DType::kF8_E8M0);
      const TensorMap params = by_name(packed);
      const MoeExperts back = row.unpack(o, params);
      EXPECT_EQ(back.w13.codes, x.w13.codes);
      EXPECT_EQ(back.w13.scales, x.w13.scales);
      EXPECT_EQ(back.w2.codes, x.w2.codes);
      EXPECT_EQ(back.w2.scales, x.w2.scales);
      for (MoeProj p : {MoeProj::kW13, MoeProj::kW2})
        EXPECT_LT(reader_error(rng, row.make_reader, o, params, x, p, 1), 1e-5);
    }
  }
}

// FP8 block: I is a multiple of 128 (vLLM refuses other block_n multiples), so Ip = I; w13 has
// H/128 groups, w2 I/128 (one group: the 32-entry permutation).
TEST(MarlinFloat, Fp8BlockShapesRoundTrip) {
  Rng rng(12);
  const TargetLayout& row = *find_target_layout("marlin-fp8");
  for (QuantMethod m : {QuantMethod::kFp8Block, QuantMethod::kCtFp8Block})
    for (DType act : {DType::kBF16, DType::kF16})
      for (auto [H, I] :
           {std::pair<int64_t, int64_t>{128, 128}, {256, 128}, {128, 256}, {384, 384}}) {
        SCOPED_TRACE(std::string(quant_method_name(m)) + " " + dtype_name(act) +
                     " H=" + std::to_string(H) + " I=" + std::to_string(I));
        const QuantParams q = fp8_block_params(m);
        const LayoutOptions o = options(q, I, act);
        const MoeExperts x = random_layer(rng, q, 2, H, I);
        ASSERT_TRUE(row.unsupported_reasons(o, moe_shape_of(x)).empty());
        const std::vector<Tensor> packed = row.pack(o, x);
        const std::string sname =
            m == QuantMethod::kFp8Block ? "w13_weight_scale_inv" : "w13_weight_scale";
        EXPECT_EQ(packed[2].name, kPre + sname);
        EXPECT_EQ(packed[2].dtype, act);
        EXPECT_EQ(packed[2].shape, (Shape{2, H / 128, 2 * I}));
        const TensorMap params = by_name(packed);
        const MoeExperts back = row.unpack(o, params);
        EXPECT_EQ(back.w13.codes, x.w13.codes);
        EXPECT_EQ(back.w2.codes, x.w2.codes);
        EXPECT_EQ(back.w13.scales, convert_scales(x.w13.scales, x.w13.scale_dtype, act, "s"));
        for (MoeProj p : {MoeProj::kW13, MoeProj::kW2})
          EXPECT_LT(reader_error(rng, row.make_reader, o, params, back, p, 1), 1e-5);
      }
}

// The stored FP8 scale is the activation-dtype scale times 2^120 (bf16) / 2^8 (fp16).
TEST(MarlinFloat, Fp8ScalesCarryTheFusedExponentBias) {
  Rng rng(13);
  const TargetLayout& row = *find_target_layout("marlin-fp8");
  const QuantParams q = fp8_block_params();
  for (DType act : {DType::kBF16, DType::kF16}) {
    MoeExperts x = random_layer(rng, q, 1, 128, 128);
    const float s0 = 0.375f;
    for (size_t i = 0; i < x.w13.scales.size(); i += 4) std::memcpy(&x.w13.scales[i], &s0, 4);
    const std::vector<Tensor> packed = row.pack(options(q, 128, act), x);
    const uint16_t h = packed[2].as<uint16_t>()[0];
    const float stored = act == DType::kBF16 ? bf16_to_float(h) : f16_to_float(h);
    EXPECT_EQ(stored, std::ldexp(s0, act == DType::kBF16 ? 120 : 8)) << dtype_name(act);
  }
}

// ---- refusals -----------------------------------------------------------------------------------

bool any_contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

TEST(MarlinFloat, RefusesWhatTheShippedKernelCannotRun) {
  const TargetLayout& mx = *find_target_layout("marlin-mxfp8");
  const TargetLayout& fp8 = *find_target_layout("marlin-fp8");
  const QuantParams qm = mx_params(), qb = fp8_block_params();
  const auto reasons = [](const TargetLayout& row, const QuantParams& q, int64_t H, int64_t I,
                          DType act = DType::kBF16, bool gated = true,
                          VllmTarget t = VllmTarget::kV0_33) {
    LayoutOptions o = options(q, I, act, gated);
    o.vllm_target = t;
    return row.unsupported_reasons(o, moe_shape_for(q, 4, H, I, gated));
  };
  // MX with fp16 activations: no fp16 x E8M0 kernel instance.
  EXPECT_TRUE(any_contains(reasons(mx, qm, 256, 128, DType::kF16), "no fp16 instance"));
  // H % 128 != 0 and Ip % 128 != 0: the down GEMM (n = H) has no thread configuration.
  EXPECT_TRUE(any_contains(reasons(mx, qm, 192, 64), "w2 GEMM n=H=192, k=Ip=64"));
  EXPECT_TRUE(reasons(mx, qm, 192, 96).empty());  // Ip = 128
  // H % 64 (tiles), I % 32 (MX blocks along w2's K).
  EXPECT_TRUE(any_contains(reasons(mx, qm, 160, 128), "H=160 is not a multiple of 64"));
  EXPECT_TRUE(any_contains(reasons(mx, qm, 256, 48), "I=48 is not a multiple of 32"));
  // Non-gated layers that need padding: vLLM's padding helpers assume two shards.
  EXPECT_TRUE(any_contains(reasons(mx, qm, 256, 96, DType::kBF16, false), "non-gated"));
  EXPECT_TRUE(reasons(mx, qm, 256, 128, DType::kBF16, false).empty());
  // FP8 block: H % 128, block_k other than 128.
  EXPECT_TRUE(any_contains(reasons(fp8, qb, 192, 128), "H=192 is not a multiple of 128"));
  MoeShape s = moe_shape_for(qb, 4, 256, 128, true);
  s.w13.quant.group_size = s.w2.quant.group_size = 64;
  EXPECT_TRUE(any_contains(fp8.unsupported_reasons(options(qb, 128), s), "block_k=64"));
  // Other sources and targets.
  EXPECT_TRUE(any_contains(reasons(fp8, qm, 256, 128), "no vLLM FP8 Marlin MoE path"));
  EXPECT_TRUE(any_contains(reasons(mx, qm, 256, 128, DType::kBF16, true, VllmTarget::kV2026_05),
                           "2026-05"));
  // pack refuses with the same reasons (kUnsupported), nothing written.
  Rng rng(14);
  const MoeExperts x = random_layer(rng, qm, 1, 192, 64);
  test::expect_error([&] { mx.pack(options(qm, 64), x); }, ErrorCode::kUnsupported);
}

TEST(MarlinFloat, GemmThreadConfigs) {
  EXPECT_TRUE(marlin_float_gemm_runs(256, 64));
  EXPECT_TRUE(marlin_float_gemm_runs(192, 128));
  EXPECT_FALSE(marlin_float_gemm_runs(192, 64));
  EXPECT_FALSE(marlin_float_gemm_runs(256, 96));  // MXFP4 I = 96: the down GEMM's k
  EXPECT_FALSE(marlin_float_gemm_runs(0, 128));
}

// ---- bad values ---------------------------------------------------------------------------------

TEST(MarlinFloat, BadScalesAreRefusedNamingTheParameter) {
  Rng rng(15);
  {
    const QuantParams q = mx_params();
    MoeExperts x = random_layer(rng, q, 1, 128, 128);
    x.w2.scales[5] = 255;  // E8M0 NaN
    const Error e =
        test::expect_error([&] { find_target_layout("marlin-mxfp8")->pack(options(q, 128), x); },
                           ErrorCode::kBadValue);
    EXPECT_EQ(e.tensor(), kPre + "w2_weight_scale");
  }
  const QuantParams q = fp8_block_params();
  for (const auto& [act, value] : {std::pair<DType, float>{DType::kBF16, 300.0f},
                                   {DType::kF16, 256.0f},
                                   {DType::kBF16, std::nanf("")}}) {
    MoeExperts x = random_layer(rng, q, 1, 128, 128);
    std::memcpy(&x.w13.scales[0], &value, 4);
    const Error e =
        test::expect_error([&] { find_target_layout("marlin-fp8")->pack(options(q, 128, act), x); },
                           ErrorCode::kBadValue);
    EXPECT_EQ(e.tensor(), kPre + "w13_weight_scale_inv");
  }
}

TEST(MarlinFloat, UnpackNamesCorruptedPadding) {
  Rng rng(16);
  const QuantParams q = mx_params();
  const TargetLayout& row = *find_target_layout("marlin-mxfp8");
  const LayoutOptions o = options(q, 96);
  const MoeExperts x = random_layer(rng, q, 1, 128, 96);
  TensorMap params = by_name(row.pack(o, x));
  // The last word of w2 holds padded K rows only for the last tile row (k >= 96).
  {
    TensorMap bad = params;
    auto& w = bad.at(kPre + "w2_weight");
    w.data[w.data.size() - 1] ^= 0x11;
    test::expect_error([&] { row.unpack(o, bad); }, ErrorCode::kBadValue);
  }
  // A nonzero scale in the padded rows of w13's gate shard (physical row 100 of 256).
  {
    TensorMap bad = params;
    auto& s = bad.at(kPre + "w13_weight_scale");
    // Find the stored position of (group 0, row 100) through the permutation and pair swap.
    const int64_t j = 100;
    const int64_t pos = marlin::pair_swap_pos((j / 64) * 64 + marlin::scale_perm_dst(true, j % 64));
    s.data[static_cast<size_t>(pos)] = 127;
    const Error e = test::expect_error([&] { row.unpack(o, bad); }, ErrorCode::kBadValue);
    EXPECT_NE(e.message().find("padding"), std::string::npos) << e.message();
  }
  // FP8 block: one column of a 128-column block scale differs from the others.
  {
    const QuantParams qb = fp8_block_params();
    const TargetLayout& fr = *find_target_layout("marlin-fp8");
    const LayoutOptions ob = options(qb, 128);
    TensorMap bp = by_name(fr.pack(ob, random_layer(rng, qb, 1, 256, 128)));
    auto& s = bp.at(kPre + "w13_weight_scale_inv");
    s.data[2] ^= 0x01;
    test::expect_error([&] { fr.unpack(ob, bp); }, ErrorCode::kBadValue);
  }
}

// ---- mutants ------------------------------------------------------------------------------------

// w13 with gate and up exchanged (each expert's first and second half of rows).
MoeExperts swap_gate_up(MoeExperts x) {
  const int64_t E = x.w13.experts, N = x.w13.n, K = x.w13.k, half = N / 2;
  const int64_t sb = x.w13.scale_bytes(), G = x.w13.groups(), rows = x.w13.scale_rows();
  MoeExperts y = x;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < N; ++r)
      std::memcpy(&y.w13.codes[(e * N + (r + half) % N) * K], &x.w13.codes[(e * N + r) * K],
                  static_cast<size_t>(K));
    const int64_t hr = rows / 2;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(&y.w13.scales[(e * rows + (r + hr) % rows) * G * sb],
                  &x.w13.scales[(e * rows + r) * G * sb], static_cast<size_t>(G * sb));
  }
  return y;
}

TEST(MarlinFloat, MatmulCatchesLayoutMutants) {
  Rng rng(17);
  // MXFP8, I = 96 (padded to 128): gate/up swapped, pair swap dropped, scales not permuted,
  // padding not per shard.
  {
    const QuantParams q = mx_params();
    const TargetLayout& row = *find_target_layout("marlin-mxfp8");
    const int64_t H = 256, I = 96, ip = 128;
    const LayoutOptions o = options(q, I);
    const MoeExperts x = random_layer(rng, q, 1, H, I);
    const TensorMap good = by_name(row.pack(o, x));
    ASSERT_LT(reader_error(rng, row.make_reader, o, good, x, MoeProj::kW13), 1e-5);
    ASSERT_LT(reader_error(rng, row.make_reader, o, good, x, MoeProj::kW2), 1e-5);
    const TensorMap swapped = by_name(row.pack(o, swap_gate_up(x)));
    EXPECT_GT(reader_error(rng, row.make_reader, o, swapped, x, MoeProj::kW13), 0.1);

    const std::string sn = kPre + "w13_weight_scale";
    // The scales as vLLM permutes them, without the pair swap: undo it on the good bytes.
    TensorMap no_swap = good;
    auto& ns = no_swap.at(sn).data;
    for (size_t p = 0; p + 3 < ns.size(); p += 4) std::swap(ns[p + 1], ns[p + 2]);
    EXPECT_GT(reader_error(rng, row.make_reader, o, no_swap, x, MoeProj::kW13), 0.1);
    // The scales transposed to [G, N] but not permuted (nor swapped).
    TensorMap no_perm = good;
    auto& np = no_perm.at(sn).data;
    for (int64_t g = 0; g < H / 32; ++g)
      for (int64_t r = 0; r < 2 * ip; ++r) {
        const int64_t s = r / ip, i = r % ip;
        np[static_cast<size_t>(g * 2 * ip + r)] =
            i < I ? x.w13.scales[static_cast<size_t>((s * I + i) * (H / 32) + g)] : 0;
      }
    EXPECT_GT(reader_error(rng, row.make_reader, o, no_perm, x, MoeProj::kW13), 0.1);
    // The scales of the w2 matrix written in group-major order without the 64-permutation.
    TensorMap w2_no_perm = good;
    auto& w2s = w2_no_perm.at(kPre + "w2_weight_scale").data;
    for (int64_t g = 0; g < ip / 32; ++g)
      for (int64_t n = 0; n < H; ++n)
        w2s[static_cast<size_t>(g * H + n)] =
            g < I / 32 ? x.w2.scales[static_cast<size_t>(n * (I / 32) + g)] : 0;
    EXPECT_GT(reader_error(rng, row.make_reader, o, w2_no_perm, x, MoeProj::kW2), 0.1);
  }
  // FP8 block: gate/up swapped, exponent bias dropped, K groups reversed (a 128-column block
  // holds one value, so the in-row permutation alone is invisible).
  {
    const QuantParams q = fp8_block_params();
    const TargetLayout& row = *find_target_layout("marlin-fp8");
    const int64_t H = 256, I = 256;
    const LayoutOptions o = options(q, I);
    const MoeExperts x0 = random_layer(rng, q, 1, H, I);
    const TensorMap good = by_name(row.pack(o, x0));
    const MoeExperts x = row.unpack(o, good);  // scales in bf16, as the kernel reads them
    ASSERT_LT(reader_error(rng, row.make_reader, o, good, x, MoeProj::kW13), 1e-5);
    const TensorMap swapped = by_name(row.pack(o, swap_gate_up(x0)));
    EXPECT_GT(reader_error(rng, row.make_reader, o, swapped, x, MoeProj::kW13), 0.1);
    const std::string sn = kPre + "w13_weight_scale_inv";
    TensorMap no_bias = good;
    uint16_t* s = no_bias.at(sn).as<uint16_t>();
    for (size_t i = 0; i < no_bias.at(sn).data.size() / 2; ++i)
      s[i] = float_to_bf16(std::ldexp(bf16_to_float(s[i]), -120));
    EXPECT_GT(reader_error(rng, row.make_reader, o, no_bias, x, MoeProj::kW13), 0.1);
    TensorMap reversed = good;
    auto& rv = reversed.at(sn).data;
    const size_t row_bytes = static_cast<size_t>(2 * I * 2);
    std::vector<uint8_t> tmp(rv.begin(), rv.begin() + static_cast<std::ptrdiff_t>(row_bytes));
    std::copy(rv.begin() + static_cast<std::ptrdiff_t>(row_bytes), rv.end(), rv.begin());
    std::copy(tmp.begin(), tmp.end(), rv.begin() + static_cast<std::ptrdiff_t>(row_bytes));
    EXPECT_GT(reader_error(rng, row.make_reader, o, reversed, x, MoeProj::kW13), 0.1);
  }
}

}  // namespace
}  // namespace moepack
