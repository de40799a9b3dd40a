// TRT-LLM MXFP8 and DeepSeek-FP8-block layouts: row maps against upstream's tables and the
// spec's closed forms, step-by-step vs composed gathers, exact round trips on random legal
// shapes, thread-count invariance, the matmul through the layout's reader (reading the packed
// layout) vs the canonical dequantisation, mutants that must break it, and the refusal reasons.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "formats/fp8.h"
#include "formats/trtllm_fp8_block.h"
#include "formats/trtllm_mxfp8.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::bytes_equal;

// FlashInfer flashinfer/utils.py srcToDstBlk32RowMap / srcToDstBlk16RowMap (dst of each src).
const std::vector<int32_t> kBlk32 = {0, 8,  16, 24, 1, 9,  17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
                                     4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31};
const std::vector<int32_t> kBlk16 = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};

TEST(RowMaps, ShuffleMatchesUpstreamTables) {
  for (auto [etm, table] : {std::pair<int, const std::vector<int32_t>*>{128, &kBlk32},
                            {256, &kBlk32},
                            {64, &kBlk16},
                            {32, &kBlk16}}) {
    const int64_t B = static_cast<int64_t>(table->size());
    const int64_t rows = 4 * B;
    const auto src = shuffle_matrix_a_rows(rows, etm);
    const auto dst = invert_permutation(src);  // throws unless a permutation
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(dst[static_cast<size_t>(r)], (r / B) * B + (*table)[static_cast<size_t>(r % B)])
          << "etm " << etm << " row " << r;
  }
  EXPECT_THROW(shuffle_matrix_a_rows(48, 128), Error);  // 48 % 32 != 0
  EXPECT_NO_THROW(shuffle_matrix_a_rows(48, 64));
}

TEST(RowMaps, SwapAndReorder) {
  const auto sw = swap_w13_to_w31_rows(8);
  EXPECT_EQ(sw, (std::vector<int32_t>{4, 5, 6, 7, 0, 1, 2, 3}));
  const auto ro = gated_act_reorder_rows(8);
  EXPECT_EQ(ro, (std::vector<int32_t>{0, 4, 1, 5, 2, 6, 3, 7}));
}

std::vector<int32_t> gather_rows(const std::vector<int32_t>& v, const std::vector<int32_t>& src) {
  std::vector<int32_t> out(src.size());
  for (size_t r = 0; r < src.size(); ++r) out[r] = v[static_cast<size_t>(src[r])];
  return out;
}

TEST(RowMaps, ComposedW13EqualsStepsAndSpecClosedForm) {
  for (int64_t I : {64, 128, 256, 384}) {
    const int64_t R = 2 * I;
    std::vector<int32_t> ids(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) ids[static_cast<size_t>(r)] = static_cast<int32_t>(r);
    // Three separate gathers, in vLLM's order: swap_w13_to_w31, reorder, shuffle_matrix_a.
    auto steps = gather_rows(ids, swap_w13_to_w31_rows(R));
    steps = gather_rows(steps, gated_act_reorder_rows(R));
    steps = gather_rows(steps, shuffle_matrix_a_rows(R, 128));
    const auto composed = trtllm_w13_rows(R, true);
    EXPECT_EQ(composed, steps) << I;
    const auto sh = shuffle_matrix_a_rows(R, 128);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t s = sh[static_cast<size_t>(r)];
      const int64_t want = s % 2 == 0 ? I + s / 2 : s / 2;  // spec §3.6
      EXPECT_EQ(composed[static_cast<size_t>(r)], want);
    }
    EXPECT_EQ(trtllm_w13_rows(R, false), sh);
    EXPECT_EQ(trtllm_w2_rows(R), sh);
  }
}

// The 128x4 interleave built independently as the 5-D array [R/128][C/4][32][4][4].
TEST(ScaleInterleave, MatchesFiveDimArrayAndInverts) {
  std::mt19937 rng(9);
  for (auto [R, C] : {std::pair<int64_t, int64_t>{128, 4}, {256, 8}, {384, 12}, {128, 16}}) {
    std::vector<uint8_t> m(static_cast<size_t>(R * C));
    for (auto& b : m) b = static_cast<uint8_t>(rng());
    const auto il = scale_interleave_128x4(m.data(), R, C);
    std::vector<uint8_t> want(m.size());
    size_t pos = 0;
    for (int64_t a = 0; a < R / 128; ++a)
      for (int64_t b = 0; b < C / 4; ++b)
        for (int64_t i32 = 0; i32 < 32; ++i32)
          for (int64_t i4 = 0; i4 < 4; ++i4)
            for (int64_t k4 = 0; k4 < 4; ++k4)
              want[pos++] = m[static_cast<size_t>((a * 128 + i4 * 32 + i32) * C + b * 4 + k4)];
    EXPECT_TRUE(bytes_equal(il, want, 16, "interleave"));
    EXPECT_EQ(scale_deinterleave_128x4(il.data(), R, C), m);
  }
  std::vector<uint8_t> m(64 * 4);
  EXPECT_THROW(scale_interleave_128x4(m.data(), 64, 4), Error);
  EXPECT_THROW(scale_interleave_128x4(m.data(), 128, 2), Error);
}

// ---------------------------------------------------------------------------------------------
// Random experts.

// Codes avoid the two NaN bytes; scales stay in a range where products do not overflow.
QuantTensor random_mx(int64_t E, int64_t N, int64_t K, std::mt19937* rng) {
  QuantTensor q;
  q.experts = E;
  q.n = N;
  q.k = K;
  q.kind = CodeKind::kFp8E4M3;
  q.bits = 8;
  q.group_size = 32;
  q.scale_block_n = 1;
  q.scale_dtype = DType::kU8;
  q.codes.resize(static_cast<size_t>(E * N * K));
  for (auto& b : q.codes) {
    do b = static_cast<uint8_t>((*rng)());
    while ((b & 0x7f) == 0x7f);
  }
  q.scales.resize(static_cast<size_t>(E * N * (K / 32)));
  for (auto& b : q.scales) b = static_cast<uint8_t>(118 + (*rng)() % 16);
  return q;
}

QuantTensor random_block(int64_t E, int64_t N, int64_t K, std::mt19937* rng) {
  QuantTensor q;
  q.experts = E;
  q.n = N;
  q.k = K;
  q.kind = CodeKind::kFp8E4M3;
  q.bits = 8;
  q.group_size = 128;
  q.scale_block_n = 128;
  q.scale_dtype = DType::kF32;
  q.codes.resize(static_cast<size_t>(E * N * K));
  for (auto& b : q.codes) {
    do b = static_cast<uint8_t>((*rng)());
    while ((b & 0x7f) == 0x7f);
  }
  std::vector<float> s(static_cast<size_t>(E * (N / 128) * (K / 128)));
  for (auto& v : s)
    v = std::ldexp(1.0f + ((*rng)() % 4096) / 4096.0f, static_cast<int>((*rng)() % 12) - 10);
  q.scales.resize(s.size() * 4);
  std::memcpy(q.scales.data(), s.data(), q.scales.size());
  return q;
}

struct Shape3 {
  int64_t E, I, H;
};
const std::vector<Shape3> kShapes = {
    {1, 128, 128}, {2, 128, 256}, {3, 256, 128}, {1, 384, 512}, {4, 128, 384}};

TensorMap by_name(const std::vector<Tensor>& ts) {
  TensorMap m;
  for (const auto& t : ts) m.emplace(t.name, t);
  return m;
}

void expect_same_experts(const MoeExperts& a, const MoeExperts& b, const std::string& what) {
  EXPECT_TRUE(bytes_equal(a.w13.codes, b.w13.codes, 32, what + " w13 codes"));
  EXPECT_TRUE(bytes_equal(a.w13.scales, b.w13.scales, 4, what + " w13 scales"));
  EXPECT_TRUE(bytes_equal(a.w2.codes, b.w2.codes, 32, what + " w2 codes"));
  EXPECT_TRUE(bytes_equal(a.w2.scales, b.w2.scales, 4, what + " w2 scales"));
  EXPECT_EQ(a.w13.n, b.w13.n);
  EXPECT_EQ(a.w13.k, b.w13.k);
  EXPECT_EQ(a.w2.n, b.w2.n);
  EXPECT_EQ(a.w2.k, b.w2.k);
  EXPECT_EQ(a.w13.group_size, b.w13.group_size);
  EXPECT_EQ(a.w13.scale_block_n, b.w13.scale_block_n);
  EXPECT_EQ(a.w13.scale_dtype, b.w13.scale_dtype);
}

// y = x . W^T from the canonical dequantisation, double accumulate.
std::vector<float> reference_matmul(const QuantTensor& q, int64_t e, const std::vector<float>& x,
                                    int64_t m) {
  const auto w = dequantize_expert(q, e);
  std::vector<float> y(static_cast<size_t>(m * q.n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = 0; n < q.n; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < q.k; ++k)
        acc += double(x[static_cast<size_t>(i * q.k + k)]) * w[static_cast<size_t>(n * q.k + k)];
      y[static_cast<size_t>(i * q.n + n)] = static_cast<float>(acc);
    }
  return y;
}

double normalised_error(const std::vector<float>& y, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    num = std::max(num, std::fabs(double(y[i]) - ref[i]));
    den = std::max(den, std::fabs(double(ref[i])));
  }
  EXPECT_GT(den, 0.0);
  return num / den;
}

std::vector<float> random_x(int64_t m, int64_t k, std::mt19937* rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = nd(*rng);
  return x;
}

// The layer's matmul as verify computes it (the layout's reader, reader_expert_matmul) against the
// canonical dequantisation.
double matmul_error(test::MakeReaderFn make_reader, const LayoutOptions& opts,
                    const TensorMap& params, const MoeExperts& x, MoeProj proj, int64_t e,
                    std::mt19937* rng) {
  const QuantTensor& q = proj == MoeProj::kW13 ? x.w13 : x.w2;
  const int64_t m = 3;
  const auto xin = random_x(m, q.k, rng);
  std::vector<float> y(static_cast<size_t>(m * q.n), NAN);
  test::layout_matmul(make_reader, opts, params, proj, e, xin.data(), m, y.data());
  return normalised_error(y, reference_matmul(q, e, xin, m));
}

// ---------------------------------------------------------------------------------------------
// MXFP8.

TEST(TrtllmMxfp8, RoundTripThreadsAndMatmul) {
  std::mt19937 rng(42);
  for (bool gated : {true, false}) {
    for (const auto& s : kShapes) {
      MoeExperts x;
      x.w13 = random_mx(s.E, gated ? 2 * s.I : s.I, s.H, &rng);
      x.w2 = random_mx(s.E, s.H, s.I, &rng);
      LayoutOptions opts;
      opts.gated = gated;
      opts.prefix = "layers.1.experts.";
      ASSERT_TRUE(trtllm_mxfp8_unsupported_reasons(opts, moe_shape_of(x)).empty());
      EXPECT_TRUE(trtllm_mxfp8_deviations_from_vllm(opts, moe_shape_of(x)).empty());
      const auto p1 = pack_trtllm_mxfp8_moe(opts, x);
      opts.threads = 4;
      const auto p4 = pack_trtllm_mxfp8_moe(opts, x);
      ASSERT_EQ(p1.size(), p4.size());
      for (size_t i = 0; i < p1.size(); ++i) {
        EXPECT_EQ(p1[i].name, p4[i].name);
        EXPECT_TRUE(bytes_equal(p1[i].data, p4[i].data, 16, "threads " + p1[i].name));
      }
      const TensorMap params = by_name(p1);
      EXPECT_EQ(params.at(opts.prefix + "w13_weight").shape,
                (Shape{s.E, gated ? 2 * s.I : s.I, s.H}));
      EXPECT_EQ(params.at(opts.prefix + "w13_weight_scale").shape,
                (Shape{s.E, gated ? 2 * s.I : s.I, s.H / 32}));
      EXPECT_EQ(params.at(opts.prefix + "w2_weight_scale").shape, (Shape{s.E, s.H, s.I / 32}));
      expect_same_experts(unpack_trtllm_mxfp8_moe(opts, params), x, "mxfp8");
      opts.threads = 1;
      expect_same_experts(unpack_trtllm_mxfp8_moe(opts, params), x, "mxfp8 t1");
      for (int64_t e : {int64_t{0}, s.E - 1}) {
        EXPECT_LT(matmul_error(trtllm_mxfp8_make_reader, opts, params, x, MoeProj::kW13, e, &rng),
                  1e-5);
        EXPECT_LT(matmul_error(trtllm_mxfp8_make_reader, opts, params, x, MoeProj::kW2, e, &rng),
                  1e-5);
      }
    }
  }
}

// Mutants of the packed bytes that a layout bug would produce must break the reader's matmul.
TEST(TrtllmMxfp8, MatmulCatchesLayoutMutants) {
  std::mt19937 rng(7);
  const int64_t E = 1, I = 128, H = 256, R = 2 * I;
  MoeExperts x;
  x.w13 = random_mx(E, R, H, &rng);
  x.w2 = random_mx(E, H, I, &rng);
  LayoutOptions opts;
  const TensorMap good = by_name(pack_trtllm_mxfp8_moe(opts, x));
  ASSERT_LT(matmul_error(trtllm_mxfp8_make_reader, opts, good, x, MoeProj::kW13, 0, &rng), 1e-5);
  const int64_t C = H / 32;

  // (a) gate/up not swapped: rows by reorder + shuffle only.
  {
    TensorMap bad = good;
    auto src = gather_rows(gated_act_reorder_rows(R), shuffle_matrix_a_rows(R, 128));
    auto& w = bad.at("w13_weight").data;
    std::vector<uint8_t> lin(static_cast<size_t>(R * C));
    for (int64_t r = 0; r < R; ++r) {
      const int64_t s = src[static_cast<size_t>(r)];
      std::memcpy(w.data() + r * H, x.w13.codes.data() + s * H, static_cast<size_t>(H));
      std::memcpy(lin.data() + r * C, x.w13.scales.data() + s * C, static_cast<size_t>(C));
    }
    bad.at("w13_weight_scale").data = scale_interleave_128x4(lin.data(), R, C);
    EXPECT_GT(matmul_error(trtllm_mxfp8_make_reader, opts, bad, x, MoeProj::kW13, 0, &rng), 1e-2);
  }
  // (b) scales row-permuted but not interleaved.
  {
    TensorMap bad = good;
    const auto src = trtllm_w13_rows(R, true);
    std::vector<uint8_t> lin(static_cast<size_t>(R * C));
    for (int64_t r = 0; r < R; ++r)
      std::memcpy(lin.data() + r * C, x.w13.scales.data() + src[static_cast<size_t>(r)] * C,
                  static_cast<size_t>(C));
    bad.at("w13_weight_scale").data = lin;
    EXPECT_GT(matmul_error(trtllm_mxfp8_make_reader, opts, bad, x, MoeProj::kW13, 0, &rng), 1e-2);
  }
  // (c) w2 not shuffled.
  {
    TensorMap bad = good;
    bad.at("w2_weight").data = x.w2.codes;
    EXPECT_GT(matmul_error(trtllm_mxfp8_make_reader, opts, bad, x, MoeProj::kW2, 0, &rng), 1e-2);
  }
}

ErrorCode code_of(const std::function<void()>& f, std::string* msg = nullptr,
                  std::string* tensor = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (msg) *msg = e.message();
    if (tensor) *tensor = e.tensor();
    return e.code();
  }
  return ErrorCode::kInternal;
}

bool any_contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

TEST(TrtllmMxfp8, RefusalReasons) {
  std::mt19937 rng(3);
  LayoutOptions opts;
  {  // I = 64: 2I = 128 is fine, I is not; H = 96 is not.
    MoeExperts x;
    x.w13 = random_mx(1, 128, 96, &rng);
    x.w2 = random_mx(1, 96, 64, &rng);
    const auto r = trtllm_mxfp8_unsupported_reasons(opts, moe_shape_of(x));
    EXPECT_EQ(r.size(), 2u);
    EXPECT_TRUE(any_contains(r, "H=96"));
    EXPECT_TRUE(any_contains(r, "I=64"));
    std::string msg;
    EXPECT_EQ(code_of([&] { pack_trtllm_mxfp8_moe(opts, x); }, &msg), ErrorCode::kUnsupported);
    EXPECT_NE(msg.find("H=96"), std::string::npos);
    EXPECT_NE(msg.find("I=64"), std::string::npos);
  }
  {  // non-gated I = 64: w13 rows 64.
    LayoutOptions ng;
    ng.gated = false;
    MoeExperts x;
    x.w13 = random_mx(1, 64, 128, &rng);
    x.w2 = random_mx(1, 128, 64, &rng);
    const auto r = trtllm_mxfp8_unsupported_reasons(ng, moe_shape_of(x));
    EXPECT_TRUE(any_contains(r, "w13 rows I=64"));
    EXPECT_TRUE(any_contains(r, "I=64"));
  }
  {  // not MXFP8: group 128, F16 scales.
    MoeExperts x;
    x.w13 = random_mx(1, 256, 128, &rng);
    x.w2 = random_mx(1, 128, 128, &rng);
    x.w13.group_size = 128;
    x.w13.scale_dtype = DType::kF16;
    x.w13.scales.assign(static_cast<size_t>(256 * 1 * 2), 0x3c);
    const auto r = trtllm_mxfp8_unsupported_reasons(opts, moe_shape_of(x));
    EXPECT_TRUE(any_contains(r, "group_size 128"));
    EXPECT_TRUE(any_contains(r, "F16"));
    EXPECT_EQ(code_of([&] { pack_trtllm_mxfp8_moe(opts, x); }), ErrorCode::kUnsupported);
  }
  {  // inconsistent layer: kBadShape.
    MoeExperts x;
    x.w13 = random_mx(1, 256, 128, &rng);
    x.w2 = random_mx(1, 256, 128, &rng);
    EXPECT_EQ(code_of([&] { pack_trtllm_mxfp8_moe(opts, x); }), ErrorCode::kBadShape);
  }
  {  // unpack: a missing parameter is named.
    MoeExperts x;
    x.w13 = random_mx(1, 256, 128, &rng);
    x.w2 = random_mx(1, 128, 128, &rng);
    opts.prefix = "p.";
    TensorMap params = by_name(pack_trtllm_mxfp8_moe(opts, x));
    params.erase("p.w2_weight_scale");
    std::string tensor;
    EXPECT_EQ(code_of([&] { unpack_trtllm_mxfp8_moe(opts, params); }, nullptr, &tensor),
              ErrorCode::kMissingTensor);
    EXPECT_EQ(tensor, "p.w2_weight_scale");
  }
}

// ---------------------------------------------------------------------------------------------
// DeepSeek FP8 block.

// Step by step as vLLM does it: swap (gated), shuffle_matrix_a(., 64), convert_to_block_layout.
std::vector<uint8_t> block_steps(const QuantTensor& q, int64_t e, bool swap) {
  const int64_t M = q.n, K = q.k;
  std::vector<uint8_t> a(q.codes.begin() + e * M * K, q.codes.begin() + (e + 1) * M * K);
  std::vector<uint8_t> b(a.size());
  if (swap)
    for (int64_t r = 0; r < M; ++r)
      std::memcpy(b.data() + r * K, a.data() + ((r + M / 2) % M) * K, static_cast<size_t>(K));
  else
    b = a;
  const auto sh = shuffle_matrix_a_rows(M, 64);
  for (int64_t r = 0; r < M; ++r)
    std::memcpy(a.data() + r * K, b.data() + sh[static_cast<size_t>(r)] * K,
                static_cast<size_t>(K));
  std::vector<uint8_t> out(a.size());
  for (int64_t kb = 0; kb < K / 128; ++kb)
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < 128; ++j)
        out[static_cast<size_t>((kb * M + r) * 128 + j)] =
            a[static_cast<size_t>(r * K + kb * 128 + j)];
  return out;
}

TEST(TrtllmFp8Block, StepsRoundTripThreadsAndMatmul) {
  std::mt19937 rng(11);
  for (bool gated : {true, false}) {
    for (const auto& s : kShapes) {
      MoeExperts x;
      x.w13 = random_block(s.E, gated ? 2 * s.I : s.I, s.H, &rng);
      x.w2 = random_block(s.E, s.H, s.I, &rng);
      LayoutOptions opts;
      opts.gated = gated;
      ASSERT_TRUE(trtllm_fp8_block_unsupported_reasons(opts, moe_shape_of(x)).empty());
      EXPECT_TRUE(trtllm_fp8_block_deviations_from_vllm(opts, moe_shape_of(x)).empty());
      const auto p1 = pack_trtllm_fp8_block_moe(opts, x);
      opts.threads = 3;
      const auto p3 = pack_trtllm_fp8_block_moe(opts, x);
      for (size_t i = 0; i < p1.size(); ++i)
        EXPECT_TRUE(bytes_equal(p1[i].data, p3[i].data, 16, "threads " + p1[i].name));
      const TensorMap params = by_name(p1);
      const Tensor& w13 = params.at("w13_weight");
      const int64_t R = x.w13.n;
      EXPECT_EQ(w13.shape, (Shape{s.E, s.H / 128, R, 128}));
      EXPECT_EQ(params.at("w2_weight").shape, (Shape{s.E, s.I / 128, s.H, 128}));
      EXPECT_EQ(params.at("w13_weight_scale_inv").shape, (Shape{s.E, R / 128, s.H / 128}));
      EXPECT_EQ(params.at("w2_weight_scale_inv").shape, (Shape{s.E, s.H / 128, s.I / 128}));
      for (int64_t e = 0; e < s.E; ++e) {
        const auto want13 = block_steps(x.w13, e, gated);
        EXPECT_TRUE(bytes_equal(w13.data.data() + e * R * s.H, static_cast<size_t>(R * s.H),
                                want13.data(), want13.size(), 128, "w13 steps"));
        const auto want2 = block_steps(x.w2, e, false);
        EXPECT_TRUE(bytes_equal(params.at("w2_weight").data.data() + e * s.H * s.I,
                                static_cast<size_t>(s.H * s.I), want2.data(), want2.size(), 128,
                                "w2 steps"));
        // Scale rows: W31 swap of the 128-row blocks (gated), nothing else.
        const int64_t SR = R / 128, SC = s.H / 128;
        for (int64_t b = 0; b < SR; ++b) {
          const int64_t from = gated ? (b + SR / 2) % SR : b;
          EXPECT_EQ(0, std::memcmp(
                           params.at("w13_weight_scale_inv").data.data() + ((e * SR + b) * SC) * 4,
                           x.w13.scales.data() + ((e * SR + from) * SC) * 4,
                           static_cast<size_t>(SC * 4)));
        }
      }
      expect_same_experts(unpack_trtllm_fp8_block_moe(opts, params), x, "fp8 block");
      for (int64_t e : {int64_t{0}, s.E - 1}) {
        EXPECT_LT(
            matmul_error(trtllm_fp8_block_make_reader, opts, params, x, MoeProj::kW13, e, &rng),
            1e-5);
        EXPECT_LT(
            matmul_error(trtllm_fp8_block_make_reader, opts, params, x, MoeProj::kW2, e, &rng),
            1e-5);
      }
    }
  }
}

TEST(TrtllmFp8Block, MatmulCatchesUnswappedScales) {
  std::mt19937 rng(12);
  MoeExperts x;
  x.w13 = random_block(1, 256, 256, &rng);
  x.w2 = random_block(1, 256, 128, &rng);
  LayoutOptions opts;
  TensorMap params = by_name(pack_trtllm_fp8_block_moe(opts, x));
  ASSERT_LT(matmul_error(trtllm_fp8_block_make_reader, opts, params, x, MoeProj::kW13, 0, &rng),
            1e-5);
  params.at("w13_weight_scale_inv").data = x.w13.scales;  // forgot the W31 swap of scales
  EXPECT_GT(matmul_error(trtllm_fp8_block_make_reader, opts, params, x, MoeProj::kW13, 0, &rng),
            1e-2);
}

TEST(TrtllmFp8Block, Refusals) {
  std::mt19937 rng(13);
  LayoutOptions opts;
  {
    MoeExperts x;
    x.w13 = random_block(1, 128, 128, &rng);  // I = 64
    x.w2 = random_block(1, 128, 128, &rng);
    x.w2.k = 64;
    x.w2.codes.resize(128 * 64);
    x.w2.group_size = 128;
    const auto r = trtllm_fp8_block_unsupported_reasons(opts, moe_shape_of(x));
    EXPECT_TRUE(any_contains(r, "I=64"));
    std::string msg;
    EXPECT_EQ(code_of([&] { pack_trtllm_fp8_block_moe(opts, x); }, &msg), ErrorCode::kUnsupported);
    EXPECT_NE(msg.find("I=64"), std::string::npos);
  }
  {  // an MXFP8 tensor is not FP8 block.
    MoeExperts x;
    x.w13 = random_mx(1, 256, 128, &rng);
    x.w2 = random_mx(1, 128, 128, &rng);
    const auto r = trtllm_fp8_block_unsupported_reasons(opts, moe_shape_of(x));
    EXPECT_TRUE(any_contains(r, "group_size 32"));
    EXPECT_TRUE(any_contains(r, "scale dtype U8"));
  }
  for (float bad : {1e-11f, 0.0f, NAN, -1.0f, INFINITY}) {
    MoeExperts x;
    x.w13 = random_block(1, 256, 128, &rng);
    x.w2 = random_block(1, 128, 128, &rng);
    std::memcpy(x.w2.scales.data(), &bad, 4);
    std::string tensor;
    EXPECT_EQ(code_of([&] { pack_trtllm_fp8_block_moe(opts, x); }, nullptr, &tensor),
              ErrorCode::kBadValue)
        << bad;
    EXPECT_EQ(tensor, "w2_weight_scale_inv");
  }
  {  // exactly the clamp floor is accepted and round-trips.
    MoeExperts x;
    x.w13 = random_block(1, 256, 128, &rng);
    x.w2 = random_block(1, 128, 128, &rng);
    std::memcpy(x.w13.scales.data(), &kTrtllmFp8BlockMinScale, 4);
    const auto params = by_name(pack_trtllm_fp8_block_moe(opts, x));
    expect_same_experts(unpack_trtllm_fp8_block_moe(opts, params), x, "min scale");
  }
}

}  // namespace
}  // namespace moepack
