// Golden fixtures shared/golden/wna16 (produced outside moepack from upstream vLLM, see
// shared/golden/README.md): GPTQ / AWQ / compressed-tensors -> Marlin, byte for byte.
// Covers every case except moe_wna16_* and the triton_* tensors of moe_ct_* (Triton layout).
#include <gtest/gtest.h>

#include <cstring>
#include <iomanip>
#include <ostream>
#include <string>

#include "core/half.h"
#include "formats/awq.h"
#include "formats/compressed_tensors.h"
#include "formats/gptq.h"
#include "formats/marlin.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::bytes_equal;
using test::Golden;
using test::load_golden;

const char* kDir = "wna16";

DType dtype_of(const Golden& g) {
  if (g.dtype == "int32") return DType::kI32;
  if (g.dtype == "uint8") return DType::kU8;
  if (g.dtype == "float32") return DType::kF32;
  if (g.dtype == "f16bits") return DType::kF16;
  if (g.dtype == "bf16bits") return DType::kBF16;
  ADD_FAILURE() << "unexpected golden dtype " << g.dtype;
  return DType::kU8;
}

Tensor to_tensor(const Golden& g, const std::string& name) {
  Tensor t;
  t.name = name;
  t.dtype = dtype_of(g);
  t.shape = g.shape;
  t.data = g.bytes;
  return t;
}

// Expert e of a stacked [E, ...] golden tensor.
Tensor expert_slice(const Golden& g, int64_t e, const std::string& name) {
  Tensor t;
  t.name = name;
  t.dtype = dtype_of(g);
  t.shape = Shape(g.shape.begin() + 1, g.shape.end());
  const size_t per = g.bytes.size() / static_cast<size_t>(g.shape[0]);
  t.data.assign(g.bytes.begin() + static_cast<long>(per * e),
                g.bytes.begin() + static_cast<long>(per * (e + 1)));
  return t;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Stacks single-expert QuantTensors along the expert axis.
QuantTensor stack(const std::vector<QuantTensor>& qs) {
  QuantTensor out = qs.at(0);
  out.experts = static_cast<int64_t>(qs.size());
  out.codes.clear();
  out.scales.clear();
  out.zeros.clear();
  out.g_idx.clear();
  bool any_g = false;
  for (const auto& q : qs) any_g = any_g || !q.g_idx.empty();
  for (const auto& q : qs) {
    out.codes.insert(out.codes.end(), q.codes.begin(), q.codes.end());
    out.scales.insert(out.scales.end(), q.scales.begin(), q.scales.end());
    out.zeros.insert(out.zeros.end(), q.zeros.begin(), q.zeros.end());
    if (any_g) {
      if (q.g_idx.empty())
        for (int64_t k = 0; k < q.k; ++k)
          out.g_idx.push_back(static_cast<int32_t>(q.group_size > 0 ? k / q.group_size : 0));
      else
        out.g_idx.insert(out.g_idx.end(), q.g_idx.begin(), q.g_idx.end());
    }
  }
  out.check_consistent("stacked");
  return out;
}

// Normalised max error of y vs reference.
double normalised_error(const std::vector<float>& y, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(y[i]) - ref[i]));
    den = std::max(den, std::abs(ref[i]));
  }
  return den == 0 ? num : num / den;
}

// The matmul through the layout's reader over the packed params against x . dequantize_expert(q)^T.
void check_matmul(const LayoutOptions& opts, const TensorMap& params, const QuantTensor& q,
                  MoeProj proj, const std::string& what) {
  const int64_t m = 3;
  std::vector<float> x(static_cast<size_t>(m * q.k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919 % 211) - 105) / 64.0f;
  for (int64_t e = 0; e < q.experts; ++e) {
    const std::vector<float> w = dequantize_expert(q, e);
    std::vector<double> ref(static_cast<size_t>(m * q.n), 0.0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t n = 0; n < q.n; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < q.k; ++k)
          acc += static_cast<double>(x[static_cast<size_t>(r * q.k + k)]) *
                 w[static_cast<size_t>(n * q.k + k)];
        ref[static_cast<size_t>(r * q.n + n)] = acc;
      }
    std::vector<float> y(static_cast<size_t>(m * q.n));
    test::layout_matmul(marlin_make_reader, opts, params, proj, e, x.data(), m, y.data());
    EXPECT_LT(normalised_error(y, ref), 1e-5) << what << " expert " << e;
  }
}

// dequant_f32 [K, N] (W[k, n] = (q - z) * s[g_idx[k], n] with the scale's fp16 / bf16 *value*)
// against (a) our dequantize_expert [N, K] and (b) that formula evaluated here from the decoded
// codes, zeros and g_idx. Both exact: every product fits a float32 mantissa.
struct DequantMismatch {
  int64_t count = 0, k = -1, n = -1;
  float got = 0, want = 0;
  void add(int64_t kk, int64_t nn, float g, float w) {
    if (count++ == 0) k = kk, n = nn, got = g, want = w;
  }
};

std::ostream& operator<<(std::ostream& os, const DequantMismatch& m) {
  if (m.count == 0) return os << "none";
  return os << m.count << " values, first at [k=" << m.k << ", n=" << m.n << "]: got "
            << std::setprecision(9) << m.got << ", fixture " << m.want;
}

void expect_dequant(const std::string& c, const QuantTensor& q, const std::vector<float>& ref) {
  ASSERT_TRUE(q.scale_dtype == DType::kF16 || q.scale_dtype == DType::kBF16) << c;
  const std::vector<float> w = dequantize_expert(q, 0);
  ASSERT_EQ(ref.size(), w.size()) << c;
  const int64_t K = q.k, N = q.n, G = q.groups();
  DequantMismatch codec, formula;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      const float want = ref[static_cast<size_t>(k * N + n)];
      const float got = w[static_cast<size_t>(n * K + k)];
      if (std::memcmp(&got, &want, 4) != 0) codec.add(k, n, got, want);
      const int64_t g = q.g_idx.empty() ? (q.group_size > 0 ? k / q.group_size : 0)
                                        : q.g_idx[static_cast<size_t>(k)];
      uint16_t bits;
      std::memcpy(&bits, q.scales.data() + (n * G + g) * 2, 2);
      const float s = q.scale_dtype == DType::kF16 ? f16_to_float(bits) : bf16_to_float(bits);
      const float z = q.symmetric ? static_cast<float>(1 << (q.bits - 1))
                                  : static_cast<float>(q.zeros[static_cast<size_t>(n * G + g)]);
      const float v = (static_cast<float>(q.codes[static_cast<size_t>(n * K + k)]) - z) * s;
      if (std::memcmp(&v, &want, 4) != 0) formula.add(k, n, v, want);
    }
  EXPECT_EQ(codec.count, 0) << c << ": dequantize_expert vs dequant_f32: " << codec;
  EXPECT_EQ(formula.count, 0) << c << ": (q - z) * scale value vs dequant_f32: " << formula;
}

// ---- single-matrix repacks ------------------------------------------------------------------

class GptqRepack : public ::testing::TestWithParam<std::string> {};

TEST_P(GptqRepack, MatchesVllm) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kDir);
  const std::string c = GetParam();
  const int bits = has(c, "int8") ? 8 : 4;
  const bool a8 = has(c, "_a8"), act_order = has(c, "actorder");
  const Golden qweight = load_golden(kDir, c, "qweight"), scales = load_golden(kDir, c, "scales");
  const Golden g_idx = load_golden(kDir, c, "g_idx");
  const int64_t K = qweight.shape[0] * (32 / bits), N = qweight.shape[1], G = scales.shape[0];
  ASSERT_EQ(scales.dtype, "f16bits");

  QuantParams p;
  p.method = QuantMethod::kGptq;
  p.bits = bits;
  p.group_size = K / G;
  p.symmetric = true;
  p.act_order = act_order;
  TensorMap m;
  m["qweight"] = to_tensor(qweight, "qweight");
  m["scales"] = to_tensor(scales, "scales");
  m["g_idx"] = to_tensor(g_idx, "g_idx");
  const QuantTensor q = unpack_gptq(p, m, N, K);
  EXPECT_EQ(q.g_idx.empty(), !act_order) << c;

  // sort indices: stable argsort of g_idx, empty without act-order.
  const std::vector<int32_t> sort =
      act_order ? stable_argsort(q.g_idx.data(), K) : std::vector<int32_t>{};
  EXPECT_TRUE(bytes_equal(sort, load_golden(kDir, c, "sort_indices").bytes, 4, c + " sort"));

  const std::vector<uint32_t> words =
      marlin_repack(q.codes.data(), N, K, bits, act_order ? sort.data() : nullptr, a8);
  EXPECT_TRUE(bytes_equal(words, load_golden(kDir, c, "marlin_qweight").bytes, 4, c + " qweight"));

  // vLLM's marlin_permute_scales(size_k = K): grouped iff group_size < K and not a8.
  std::vector<uint8_t> s = scales.bytes;
  marlin_permute_scales(s.data(), G, N, 2, G > 1 && !a8);
  EXPECT_TRUE(bytes_equal(s, load_golden(kDir, c, "marlin_scales").bytes, 2, c + " scales"));

  expect_dequant(c, q, load_golden(kDir, c, "dequant_f32").as<float>());

  // The inverse recovers the permuted codes.
  const std::vector<uint8_t> back = marlin_unrepack(words.data(), N, K, bits, a8);
  int64_t diff = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      diff += back[static_cast<size_t>(n * K + k)] !=
              q.codes[static_cast<size_t>(n * K + (act_order ? sort[static_cast<size_t>(k)] : k))];
  EXPECT_EQ(diff, 0) << c << " unrepack";
}

INSTANTIATE_TEST_SUITE_P(Golden, GptqRepack,
                         ::testing::Values("gptq_repack_int4", "gptq_repack_int4_a8",
                                           "gptq_repack_int4_actorder", "gptq_repack_int8",
                                           "gptq_repack_int8_a8", "gptq_repack_int8_actorder"));

class AwqRepack : public ::testing::TestWithParam<std::string> {};

TEST_P(AwqRepack, MatchesVllm) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kDir);
  const std::string c = GetParam();
  const Golden qweight = load_golden(kDir, c, "qweight"), qzeros = load_golden(kDir, c, "qzeros");
  const Golden scales = load_golden(kDir, c, "scales");
  const int64_t K = qweight.shape[0], N = qweight.shape[1] * 8, G = scales.shape[0];
  EXPECT_EQ(scales.dtype, has(c, "bfloat16") ? "bf16bits" : "f16bits");
  QuantParams p;
  p.method = QuantMethod::kAwq;
  p.bits = 4;
  p.group_size = K / G;
  p.symmetric = false;
  TensorMap m;
  m["qweight"] = to_tensor(qweight, "qweight");
  m["qzeros"] = to_tensor(qzeros, "qzeros");
  m["scales"] = to_tensor(scales, "scales");
  const QuantTensor q = unpack_awq(p, m, N, K);
  EXPECT_EQ(q.scale_dtype, has(c, "bfloat16") ? DType::kBF16 : DType::kF16);

  const std::vector<uint32_t> words = marlin_repack(q.codes.data(), N, K, 4, nullptr, false);
  EXPECT_TRUE(bytes_equal(words, load_golden(kDir, c, "marlin_qweight").bytes, 4, c + " qweight"));

  std::vector<uint8_t> zp(static_cast<size_t>(G * N));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g)
      zp[static_cast<size_t>(g * N + n)] = q.zeros[static_cast<size_t>(n * G + g)];
  const std::vector<uint32_t> zw = marlin_pack_zero_points(zp.data(), G, N, 4, false);
  EXPECT_TRUE(bytes_equal(zw, load_golden(kDir, c, "marlin_qzeros").bytes, 4, c + " qzeros"));
  EXPECT_EQ(marlin_unpack_zero_points(zw.data(), G, N, 4, false), zp);

  std::vector<uint8_t> s = scales.bytes;
  marlin_permute_scales(s.data(), G, N, 2, G > 1);
  EXPECT_TRUE(bytes_equal(s, load_golden(kDir, c, "marlin_scales").bytes, 2, c + " scales"));
  marlin_unpermute_scales(s.data(), G, N, 2, G > 1);
  EXPECT_EQ(s, scales.bytes);

  expect_dequant(c, q, load_golden(kDir, c, "dequant_f32").as<float>());

  // And back to the checkpoint bytes.
  const TensorMap again = pack_awq(p, q);
  EXPECT_TRUE(bytes_equal(again.at("qweight").data, qweight.bytes, 4, c + " awq qweight"));
  EXPECT_TRUE(bytes_equal(again.at("qzeros").data, qzeros.bytes, 4, c + " awq qzeros"));
}

INSTANTIATE_TEST_SUITE_P(Golden, AwqRepack,
                         ::testing::Values("awq_repack_int4_float16", "awq_repack_int4_bfloat16"));

TEST(ScalesChannelwise, SinglePermutation) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kDir);
  const Golden s = load_golden(kDir, "scales_channelwise", "scales");
  ASSERT_EQ(s.dtype, "bf16bits");
  std::vector<uint8_t> v = s.bytes;
  marlin_permute_scales(v.data(), s.shape[0], s.shape[1], 2, false);
  EXPECT_TRUE(bytes_equal(v, load_golden(kDir, "scales_channelwise", "marlin_scales").bytes, 2,
                          "channelwise scales"));
}

// ---- whole MoE layers ---------------------------------------------------------------------------

void expect_layer(const std::string& c, const LayoutOptions& opts, const MoeExperts& x,
                  const std::vector<std::string>& out_names) {
  const std::vector<Tensor> params = pack_marlin_moe(opts, x);
  TensorMap by_name;
  for (const auto& t : params) by_name[t.name] = t;
  EXPECT_EQ(params.size(), out_names.size()) << c << ": parameter count";
  for (const auto& name : out_names) {
    const Golden g = load_golden(kDir, c, "out_" + name);
    auto it = by_name.find(opts.prefix + name);
    ASSERT_NE(it, by_name.end()) << c << ": missing " << name;
    EXPECT_EQ(it->second.shape, g.shape) << c << " " << name;
    EXPECT_EQ(it->second.dtype, dtype_of(g)) << c << " " << name;
    EXPECT_TRUE(bytes_equal(it->second.data, g.bytes, 4, c + " " + name));
  }
  // Thread count never changes bytes.
  LayoutOptions threaded = opts;
  threaded.threads = 3;
  const std::vector<Tensor> again = pack_marlin_moe(threaded, x);
  ASSERT_EQ(again.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(again[i].data, params[i].data) << c << " threads=3 " << params[i].name;
  // The kernel's-eye product equals the canonical dequantisation.
  check_matmul(opts, by_name, x.w13, MoeProj::kW13, c + " w13");
  check_matmul(opts, by_name, x.w2, MoeProj::kW2, c + " w2");
  // Unpack returns the (act-dtype) canonical input.
  const MoeExperts back = unpack_marlin_moe(opts, by_name);
  EXPECT_EQ(back.w13.codes, x.w13.codes) << c;
  EXPECT_EQ(back.w2.codes, x.w2.codes) << c;
  EXPECT_EQ(back.w13.g_idx, x.w13.g_idx) << c;
  EXPECT_EQ(back.w2.g_idx, x.w2.g_idx) << c;
  EXPECT_EQ(back.w13.zeros, x.w13.zeros) << c;
  EXPECT_EQ(back.w2.zeros, x.w2.zeros) << c;
  if (x.w13.scale_dtype == opts.act_dtype) {
    EXPECT_EQ(back.w13.scales, x.w13.scales) << c;
    EXPECT_EQ(back.w2.scales, x.w2.scales) << c;
  }
}

class MoeGptq : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeGptq, MatchesVllm) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kDir);
  const std::string c = GetParam();
  const int bits = has(c, "int8") ? 8 : 4, pf = 32 / bits;
  const bool act_order = has(c, "actorder");
  MoeExperts x;
  for (const char* proj : {"w13", "w2"}) {
    const std::string pr = proj;
    const Golden qw = load_golden(kDir, c, "in_" + pr + "_qweight");
    const Golden sc = load_golden(kDir, c, "in_" + pr + "_scales");
    const Golden gi = load_golden(kDir, c, "in_" + pr + "_g_idx");
    ASSERT_EQ(sc.dtype, "f16bits");
    const int64_t E = qw.shape[0], K = qw.shape[1] * pf, N = qw.shape[2], G = sc.shape[1];
    QuantParams p;
    p.method = QuantMethod::kGptq;
    p.bits = bits;
    p.group_size = K / G;
    p.act_order = act_order;
    std::vector<QuantTensor> qs;
    for (int64_t e = 0; e < E; ++e) {
      TensorMap m;
      m["qweight"] = expert_slice(qw, e, "qweight");
      m["scales"] = expert_slice(sc, e, "scales");
      m["g_idx"] = expert_slice(gi, e, "g_idx");
      qs.push_back(unpack_gptq(p, m, N, K));
    }
    (pr == "w13" ? x.w13 : x.w2) = stack(qs);
  }
  LayoutOptions opts;
  opts.act_dtype = DType::kF16;
  opts.source_method = QuantMethod::kGptq;
  opts.prefix = "model.layers.0.mlp.experts.";
  expect_layer(c, opts, x,
               {"w13_qweight", "w2_qweight", "w13_scales", "w2_scales", "w13_g_idx", "w2_g_idx",
                "w13_g_idx_sort_indices", "w2_g_idx_sort_indices"});
}

INSTANTIATE_TEST_SUITE_P(Golden, MoeGptq,
                         ::testing::Values("moe_gptq_int4", "moe_gptq_int4_actorder",
                                           "moe_gptq_int8", "moe_gptq_int8_actorder"));

TEST(MoeAwq, MatchesVllm) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kDir);
  const std::string c = "moe_awq_int4";
  MoeExperts x;
  for (const char* proj : {"w13", "w2"}) {
    const std::string pr = proj;
    const Golden qw = load_golden(kDir, c, "in_" + pr + "_qweight");
    const Golden qz = load_golden(kDir, c, "in_" + pr + "_qzeros");
    const Golden sc = load_golden(kDir, c, "in_" + pr + "_scales");
    ASSERT_EQ(sc.dtype, "bf16bits");
    const int64_t E = qw.shape[0], K = qw.shape[1], N = qw.shape[2] * 8, G = sc.shape[1];
    QuantParams p;
    p.method = QuantMethod::kAwq;
    p.bits = 4;
    p.group_size = K / G;
    p.symmetric = false;
    std::vector<QuantTensor> qs;
    for (int64_t e = 0; e < E; ++e) {
      TensorMap m;
      m["qweight"] = expert_slice(qw, e, "qweight");
      m["qzeros"] = expert_slice(qz, e, "qzeros");
      m["scales"] = expert_slice(sc, e, "scales");
      qs.push_back(unpack_awq(p, m, N, K));
    }
    (pr == "w13" ? x.w13 : x.w2) = stack(qs);
  }
  LayoutOptions opts;
  opts.act_dtype = DType::kBF16;
  opts.source_method = QuantMethod::kAwq;
  expect_layer(c, opts, x,
               {"w13_qweight", "w2_qweight", "w13_scales", "w2_scales", "w13_qzeros", "w2_qzeros",
                "w13_g_idx_sort_indices", "w2_g_idx_sort_indices"});
}

class MoeCt : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeCt, MatchesVllm) {
  MOEPACK_SKIP_WITHOUT_GOLDEN(kDir);
  const std::string c = GetParam();
  const int bits = has(c, "int8") ? 8 : 4, pf = 32 / bits;
  MoeExperts x;
  for (const char* proj : {"w13", "w2"}) {
    const std::string pr = proj;
    const Golden wp = load_golden(kDir, c, "disk_" + pr + "_weight_packed");
    const Golden sc = load_golden(kDir, c, "disk_" + pr + "_weight_scale");
    ASSERT_EQ(sc.dtype, "f16bits");
    const int64_t E = wp.shape[0], N = wp.shape[1], K = wp.shape[2] * pf, G = sc.shape[2];
    QuantParams p;
    p.method = QuantMethod::kCtPackQuantized;
    p.bits = bits;
    p.group_size = K / G;
    std::vector<QuantTensor> qs;
    for (int64_t e = 0; e < E; ++e) {
      TensorMap m;
      m["weight_packed"] = expert_slice(wp, e, "weight_packed");
      m["weight_scale"] = expert_slice(sc, e, "weight_scale");
      qs.push_back(unpack_ct_pack(p, m, N, K));
      // The codec's own inverse reproduces the checkpoint bytes.
      const TensorMap again = pack_ct_pack(p, qs.back());
      EXPECT_EQ(again.at("weight_packed").data, m["weight_packed"].data) << c << " " << pr;
    }
    (pr == "w13" ? x.w13 : x.w2) = stack(qs);
  }
  LayoutOptions opts;
  opts.act_dtype = DType::kF16;
  opts.source_method = QuantMethod::kCtPackQuantized;
  expect_layer(
      c, opts, x,
      {"w13_weight_packed", "w2_weight_packed", "w13_weight_scale", "w2_weight_scale",
       "w13_weight_g_idx", "w2_weight_g_idx", "w13_g_idx_sort_indices", "w2_g_idx_sort_indices"});
}

INSTANTIATE_TEST_SUITE_P(Golden, MoeCt, ::testing::Values("moe_ct_int4", "moe_ct_int8"));

}  // namespace
}  // namespace moepack
