// Direct fast paths (formats/fast_path.h) against the canonical path, byte for byte: random
// source Linears written by each codec's own pack, converted (a) canonically -- SourceCodec.unpack
// per Linear, stacked as load_moe_experts stacks them, TargetLayout.pack -- and (b) by the direct
// row from views of the same tensors. Over every codec parameter combination (bits, group sizes
// incl. channelwise, act-order with random g_idx, v1/v2 zero conventions), scale dtypes, both vLLM
// targets, both activation dtypes, vLLM's w13 scale rule, gated and not, Marlin's padding of I,
// thread counts. Where the canonical path refuses, the direct one must decline (never bytes).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/half.h"
#include "formats/codec.h"
#include "formats/fast_path.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::Rng;

// One layer's source: per expert and projection (gate, up, down) the codec's tensors by suffix.
struct SourceLayer {
  QuantParams q;
  int64_t experts = 1, hidden = 0, inter = 0;
  bool gated = true;
  bool act_order = false;  // the plan's flag for both projections
  std::vector<std::array<TensorMap, 3>> linears;
};

DirectSource views_of(const SourceLayer& s) {
  DirectSource d;
  d.quant = s.q;
  d.hidden = s.hidden;
  d.inter = s.inter;
  d.gated = s.gated;
  d.g_idx_w13 = d.g_idx_w2 = s.act_order;
  d.linears.resize(s.linears.size());
  for (size_t e = 0; e < s.linears.size(); ++e)
    for (int p = 0; p < 3; ++p)
      for (const auto& [suffix, t] : s.linears[e][p]) d.linears[e][p][suffix] = t.view();
  return d;
}

// Random Linears written by the codec's pack; gate and up of an expert share one act-order g_idx
// (vLLM's fused w13 keeps one), down has its own.
SourceLayer random_source(Rng& rng, const QuantParams& q, DType scale_dtype, int64_t E, int64_t H,
                          int64_t I, bool gated) {
  const SourceCodec* codec = find_source_codec(q.method);
  SourceLayer s;
  s.q = q;
  s.experts = E;
  s.hidden = H;
  s.inter = I;
  s.gated = gated;
  s.act_order = q.act_order && q.group_size > 0;
  QuantSpec spec = codec->spec_for(q);
  if (spec.kind == CodeKind::kUint) spec.scale_dtype = scale_dtype;
  test::RandomTensorOptions ro;
  std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(q);
  s.linears.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int32_t> g13;
    if (s.act_order) g13 = test::random_act_order_g_idx(rng, H, q.group_size);
    for (int p = 0; p < 3; ++p) {
      if (p == 0 && !gated) continue;
      const int64_t n = p == 2 ? H : I, k = p == 2 ? I : H;
      QuantTensor t = test::random_quant_tensor(rng, spec, 1, n, k, ro);
      if (s.act_order) t.g_idx = p == 2 ? test::random_act_order_g_idx(rng, I, q.group_size) : g13;
      s.linears[static_cast<size_t>(e)][p] = codec->pack(q, t);
    }
  }
  return s;
}

// The canonical path: unpack each Linear, stack [gate; up] and the experts as load_moe_experts
// does (explicit trivial g_idx when the layer is act-order), pack.
std::vector<Tensor> canonical(const SourceLayer& s, const TargetLayout& layout,
                              const LayoutOptions& opts) {
  const SourceCodec* codec = find_source_codec(s.q.method);
  const auto stack = [&](std::initializer_list<int> projs, int64_t n, int64_t k) {
    QuantTensor out;
    bool first = true;
    for (int64_t e = 0; e < s.experts; ++e) {
      const std::vector<int32_t>* g_first = nullptr;
      std::vector<int32_t> g_keep;
      for (int p : projs) {
        const QuantTensor t = codec->unpack(s.q, s.linears[static_cast<size_t>(e)][p], n, k);
        if (first) {
          out = t;
          out.experts = s.experts;
          out.n = n * static_cast<int64_t>(projs.size());
          out.codes.clear();
          out.scales.clear();
          out.zeros.clear();
          out.g_idx.clear();
          first = false;
        }
        out.codes.insert(out.codes.end(), t.codes.begin(), t.codes.end());
        out.scales.insert(out.scales.end(), t.scales.begin(), t.scales.end());
        out.zeros.insert(out.zeros.end(), t.zeros.begin(), t.zeros.end());
        if (s.act_order) {
          std::vector<int32_t> g = t.g_idx;
          if (g.empty())
            for (int64_t i = 0; i < k; ++i)
              g.push_back(static_cast<int32_t>(t.group_size > 0 ? i / t.group_size : 0));
          if (!g_first) {
            g_keep = g;
            g_first = &g_keep;
            out.g_idx.insert(out.g_idx.end(), g.begin(), g.end());
          } else if (g != *g_first) {
            throw Error(ErrorCode::kUnsupported, "", "up_proj.g_idx", "gate and up differ");
          }
        } else if (!t.g_idx.empty()) {
          throw Error(ErrorCode::kInternal, "", "g_idx",
                      "act-order g_idx in experts planned without");
        }
      }
    }
    return out;
  };
  MoeExperts x;
  x.w13 = s.gated ? stack({0, 1}, s.inter, s.hidden) : stack({1}, s.inter, s.hidden);
  x.w2 = stack({2}, s.hidden, s.inter);
  return layout.pack(opts, x);
}

void expect_same(const std::vector<Tensor>& direct, const std::vector<Tensor>& want,
                 const std::string& what) {
  ASSERT_EQ(direct.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(direct[i].name, want[i].name) << what;
    EXPECT_EQ(direct[i].dtype, want[i].dtype) << what << " " << want[i].name;
    EXPECT_EQ(direct[i].shape, want[i].shape) << what << " " << want[i].name;
    EXPECT_TRUE(test::bytes_equal(direct[i].data, want[i].data, 4, what + " " + want[i].name));
  }
}

struct Outcome {
  int compared = 0, declined_like_canonical = 0, refused_by_layout = 0, padded = 0, act_order = 0;
};

// Converts `s` both ways; checks the direct row agrees with the canonical path. A layer whose
// shape or options the layout refuses (its unsupported_reasons) never reaches a direct row: the
// plan refuses it, as the canonical path's pack does.
void check_layer(const SourceLayer& s, const char* layout_name, const LayoutOptions& opts,
                 const std::string& what, Outcome* out) {
  const TargetLayout* layout = find_target_layout(layout_name);
  ASSERT_NE(layout, nullptr);
  const MoeShape shape = moe_shape_for(s.q, s.experts, s.hidden, s.inter, s.gated,
                                       s.act_order ? 1 : 0, s.act_order ? 1 : 0);
  std::optional<std::vector<Tensor>> want;
  try {
    want = canonical(s, *layout, opts);
  } catch (const Error&) {
  }
  if (!layout->unsupported_reasons(opts, shape).empty()) {
    EXPECT_FALSE(want.has_value()) << what << ": the layout refuses, its pack converted";
    ++out->refused_by_layout;
    return;
  }
  const DirectPath* row = find_direct_path(s.q.method, layout_name, s.q, opts, shape);
  if (!row) {
    // Only params the canonical path refuses too (asymmetric GPTQ / CT on Marlin) have no row.
    EXPECT_FALSE(want.has_value()) << what << ": a layer Marlin takes has no direct path";
    return;
  }
  const std::optional<std::vector<Tensor>> direct = row->convert(opts, views_of(s));
  if (!want) {
    EXPECT_FALSE(direct.has_value()) << what << ": the canonical path refuses, direct gave bytes";
    ++out->declined_like_canonical;
    return;
  }
  ASSERT_TRUE(direct.has_value()) << what << ": declined a layer the canonical path converts";
  expect_same(*direct, *want, what);
  ++out->compared;
  if (s.act_order) ++out->act_order;
  if (opts.vllm_target == VllmTarget::kV0_33 &&
      marlin_padded_intermediate(s.inter, s.q.group_size) != s.inter &&
      std::string(layout_name) == "marlin")
    ++out->padded;
}

LayoutOptions options_for(const QuantParams& q, DType act, bool gated, bool size_k,
                          VllmTarget target, int64_t inter, int threads) {
  return LayoutOptions::for_layer(q.method, act, gated, size_k, target,
                                  vllm_param_prefix(target, "model.layers.0.mlp.experts."), inter,
                                  threads);
}

// Every WNA16 codec row Marlin reads, over its whole parameter space.
TEST(FastPaths, Wna16ToMarlinEqualsCanonical) {
  Rng rng(13);
  Outcome o;
  const std::vector<int64_t> inters = {64, 128, 192, 96, 160, 32};
  for (QuantMethod m : {QuantMethod::kGptq, QuantMethod::kCtPackQuantized, QuantMethod::kAwq}) {
    const SourceCodec* codec = find_source_codec(m);
    ASSERT_NE(codec, nullptr);
    int draw = 0;
    for (QuantParams q : codec->param_space()) {
      for (int round = 0; round < 2; ++round)
        for (VllmTarget target : {VllmTarget::kV0_33, VllmTarget::kV2026_05}) {
          ++draw;
          const DType scale_dtype = std::array<DType, 3>{
              DType::kF16, DType::kBF16, DType::kF32}[static_cast<size_t>(draw % 3)];
          const DType act = draw % 2 ? DType::kBF16 : DType::kF16;
          const bool gated = draw % 5 != 0;
          const bool size_k = draw % 7 == 0;
          const int64_t E = 1 + draw % 3, H = 128 * (1 + draw % 3);
          const int64_t I = inters[static_cast<size_t>(draw) % inters.size()];
          const int threads = 1 + draw % 3;
          const SourceLayer s = random_source(rng, q, scale_dtype, E, H, I, gated);
          const LayoutOptions opts = options_for(q, act, gated, size_k, target, I, threads);
          const std::string what =
              test::describe_params(q) + " target=" + vllm_target_name(target) +
              " scales=" + dtype_name(scale_dtype) + " act=" + dtype_name(act) +
              " E=" + std::to_string(E) + " H=" + std::to_string(H) + " I=" + std::to_string(I) +
              (gated ? " gated" : " not-gated") + (size_k ? " size_k" : "");
          SCOPED_TRACE(what);
          check_layer(s, "marlin", opts, what, &o);
        }
    }
  }
  // The sample space must reach every branch: compared layers, act-order, padded I.
  EXPECT_GT(o.compared, 60) << "layers compared";
  EXPECT_GT(o.act_order, 8);
  EXPECT_GT(o.padded, 4);
  EXPECT_GT(o.refused_by_layout, 0);
}

TEST(FastPaths, Mxfp8ToTrtllmEqualsCanonical) {
  Rng rng(14);
  Outcome o;
  for (QuantMethod m : {QuantMethod::kModeloptMxfp8, QuantMethod::kCtMxfp8}) {
    const SourceCodec* codec = find_source_codec(m);
    ASSERT_NE(codec, nullptr);
    for (const QuantParams& q : codec->param_space())
      for (int draw = 0; draw < 8; ++draw) {
        const bool gated = draw % 3 != 0;
        const int64_t E = 1 + draw % 3, H = 128 * (1 + draw % 3);
        const int64_t I = draw == 7 ? 64 : 128 * (1 + (draw / 2) % 2);  // 64: refused
        const SourceLayer s = random_source(rng, q, DType::kU8, E, H, I, gated);
        const LayoutOptions opts =
            options_for(q, DType::kBF16, gated, false, VllmTarget::kV0_33, I, 1 + draw % 3);
        const std::string what = test::describe_params(q) + " E=" + std::to_string(E) +
                                 " H=" + std::to_string(H) + " I=" + std::to_string(I) +
                                 (gated ? " gated" : " not-gated");
        SCOPED_TRACE(what);
        check_layer(s, "trtllm-mxfp8", opts, what, &o);
      }
  }
  EXPECT_GT(o.compared, 10);
  EXPECT_GT(o.refused_by_layout, 0);
}

// Bytes the canonical path refuses make the direct path decline (the canonical error stands).
TEST(FastPaths, DeclinesWhatTheCanonicalPathRefuses) {
  Rng rng(15);
  QuantParams q;
  q.method = QuantMethod::kGptq;
  q.bits = 4;
  q.group_size = 32;
  q.symmetric = true;
  q.act_order = true;
  q.dtype = DType::kF16;
  const LayoutOptions opts =
      options_for(q, DType::kBF16, true, false, VllmTarget::kV2026_05, 128, 2);
  const DirectPath* row = &direct_paths().front();
  ASSERT_STREQ(row->name, "gptq->marlin");
  const SourceLayer good = random_source(rng, q, DType::kF16, 2, 256, 128, true);
  ASSERT_TRUE(row->convert(opts, views_of(good)).has_value());
  const TargetLayout* marlin = find_target_layout("marlin");

  // `codec_refuses`: the codec's unpack throws (the suffix rule is load_moe_experts').
  const auto expect_declined = [&](SourceLayer s, const std::string& what,
                                   bool codec_refuses = true) {
    SCOPED_TRACE(what);
    EXPECT_FALSE(row->convert(opts, views_of(s)).has_value());
    if (codec_refuses) {
      EXPECT_THROW(canonical(s, *marlin, opts), Error);
    }
  };
  {  // a NaN scale
    SourceLayer s = good;
    Tensor& sc = s.linears[1][2].at("scales");
    const uint16_t nan = 0x7e00;
    std::memcpy(sc.data.data() + 6, &nan, 2);
    expect_declined(s, "NaN scale");
  }
  {  // gate and up with different g_idx
    SourceLayer s = good;
    Tensor& g = s.linears[0][1].at("g_idx");
    std::vector<int32_t> v = test::random_act_order_g_idx(rng, 256, 32);
    std::memcpy(g.data.data(), v.data(), v.size() * 4);
    expect_declined(s, "gate/up g_idx differ");
  }
  {  // a group holding more than group_size rows
    SourceLayer s = good;
    for (int p = 0; p < 2; ++p) {
      Tensor& g = s.linears[1][p].at("g_idx");
      int32_t zero = 0;
      std::memcpy(g.data.data() + 4 * 40, &zero, 4);
    }
    expect_declined(s, "g_idx group sizes");
  }
  {  // g_idx out of range
    SourceLayer s = good;
    Tensor& g = s.linears[0][2].at("g_idx");
    int32_t big = 1000;
    std::memcpy(g.data.data(), &big, 4);
    expect_declined(s, "g_idx range");
  }
  {  // a wrong qweight shape
    SourceLayer s = good;
    Tensor& w = s.linears[0][2].at("qweight");
    w.shape = {w.shape[1], w.shape[0]};
    expect_declined(s, "qweight shape");
  }
  {  // an unknown tensor
    SourceLayer s = good;
    s.linears[1][0]["bias"] = Tensor("bias", DType::kF16, {128});
    expect_declined(s, "unknown suffix", false);
  }
}

// A symmetric compressed-tensors zero point that is not the symmetric zero is refused by the
// codec: the direct path declines it, and takes the symmetric one.
TEST(FastPaths, CtSymmetricZeroPoints) {
  Rng rng(16);
  QuantParams q = find_source_codec(QuantMethod::kCtPackQuantized)->param_space().front();
  q.bits = 4;
  q.group_size = 128;
  q.symmetric = true;
  q.act_order = false;
  const LayoutOptions opts = options_for(q, DType::kBF16, true, false, VllmTarget::kV0_33, 128, 1);
  const DirectPath* row =
      find_direct_path(q.method, "marlin", q, opts, moe_shape_for(q, 1, 128, 128, true, 0, 0));
  ASSERT_NE(row, nullptr);
  SourceLayer s = random_source(rng, q, DType::kBF16, 1, 128, 128, true);
  Tensor zp("weight_zero_point", DType::kI32, {128 / 8, 1});
  for (int64_t i = 0; i < 16; ++i) {
    const uint32_t w = 0x88888888u;  // the packed symmetric zero in every field
    std::memcpy(zp.data.data() + 4 * i, &w, 4);
  }
  s.linears[0][0]["weight_zero_point"] = zp;
  const auto want = canonical(s, *find_target_layout("marlin"), opts);
  const auto direct = row->convert(opts, views_of(s));
  ASSERT_TRUE(direct.has_value());
  expect_same(*direct, want, "symmetric zero points");
  const uint32_t odd = 0x88888887u;
  std::memcpy(s.linears[0][0]["weight_zero_point"].data.data(), &odd, 4);
  EXPECT_FALSE(row->convert(opts, views_of(s)).has_value());
}

// Scales are converted to the activation dtype inline: a NaN or an infinity anywhere, or a
// value that overflows the activation dtype (F32 65520 or BF16's largest into F16, FLT_MAX into
// BF16), declines as the canonical path refuses it; the largest values that fit convert to the
// canonical bytes.
TEST(FastPaths, ScaleConversionDeclinesNonFiniteAndOverflow) {
  Rng rng(17);
  QuantParams q;
  q.method = QuantMethod::kGptq;
  q.bits = 4;
  q.group_size = 32;
  q.symmetric = true;
  q.dtype = DType::kF16;
  const TargetLayout* marlin = find_target_layout("marlin");
  // Bit patterns per scale dtype: largest finite, -largest, +inf, -inf, a NaN, then (F32 only)
  // 65504 (F16's largest) and 65520 (rounds to F16 infinity).
  const std::vector<std::pair<DType, std::vector<uint32_t>>> values = {
      {DType::kF16, {0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e01}},
      {DType::kBF16, {0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc1}},
      {DType::kF32,
       {0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00001, 0x477fe000, 0x477ff000}}};
  int converted = 0, declined = 0;
  for (DType act : {DType::kF16, DType::kBF16})
    for (const auto& [scale_dtype, bits] : values) {
      const LayoutOptions opts = options_for(q, act, true, false, VllmTarget::kV0_33, 128, 2);
      const DirectPath* row =
          find_direct_path(q.method, "marlin", q, opts, moe_shape_for(q, 2, 256, 128, true, 0, 0));
      ASSERT_NE(row, nullptr);
      const SourceLayer good = random_source(rng, q, scale_dtype, 2, 256, 128, true);
      const size_t eb = dtype_bits(scale_dtype) / 8;
      for (size_t i = 0; i < bits.size(); ++i) {
        SourceLayer s = good;
        const int p = static_cast<int>(rng() % 3);
        Tensor& sc = s.linears[rng() % 2][p].at("scales");
        const size_t at = eb * (rng() % (sc.data.size() / eb));
        std::memcpy(sc.data.data() + at, &bits[i], eb);  // little-endian: the low bytes
        const std::string what = std::string(dtype_name(scale_dtype)) + " scale bits " +
                                 std::to_string(bits[i]) + " to " + dtype_name(act) +
                                 ", projection " + std::to_string(p) + ", byte " +
                                 std::to_string(at);
        SCOPED_TRACE(what);
        std::optional<std::vector<Tensor>> want;
        try {
          want = canonical(s, *marlin, opts);
        } catch (const Error&) {
        }
        const std::optional<std::vector<Tensor>> direct = row->convert(opts, views_of(s));
        if (i >= 2 && i <= 4) {
          EXPECT_FALSE(want.has_value()) << "a non-finite scale converted";
        }
        if (!want) {
          EXPECT_FALSE(direct.has_value());
          ++declined;
          continue;
        }
        ASSERT_TRUE(direct.has_value());
        expect_same(*direct, *want, what);
        ++converted;
      }
    }
  // Non-finite: 3 per pair; overflow: into F16 BF16's and F32's largest (both signs) and F32
  // 65520, into BF16 F32's largest (both signs: FLT_MAX rounds to nearest even up to infinity).
  EXPECT_EQ(declined, 2 * 3 * 3 + 5 + 2);
  EXPECT_EQ(converted, 2 * (5 + 5 + 7) - declined);
}

// MXFP8 codes are checked eight bytes at a time: a NaN code (S.1111.111) at any byte of a word
// declines, the codes next to it (S.1111.110, the largest finite) convert.
TEST(FastPaths, Mxfp8NanCodesAnywhere) {
  Rng rng(18);
  const QuantParams q = find_source_codec(QuantMethod::kModeloptMxfp8)->param_space().front();
  const LayoutOptions opts = options_for(q, DType::kBF16, true, false, VllmTarget::kV0_33, 128, 1);
  const TargetLayout* layout = find_target_layout("trtllm-mxfp8");
  const DirectPath* row = find_direct_path(q.method, "trtllm-mxfp8", q, opts,
                                           moe_shape_for(q, 1, 128, 128, true, 0, 0));
  ASSERT_NE(row, nullptr);
  const SourceLayer good = random_source(rng, q, DType::kU8, 1, 128, 128, true);
  ASSERT_TRUE(row->convert(opts, views_of(good)).has_value());
  for (uint8_t code : {uint8_t{0x7f}, uint8_t{0xff}, uint8_t{0x7e}, uint8_t{0xfe}})
    for (size_t at :
         {size_t{0}, size_t{3}, size_t{7}, size_t{8 * 100 + 5}, size_t{128 * 128 - 1}}) {
      SourceLayer s = good;
      const int p = static_cast<int>(at % 3);
      std::memcpy(s.linears[0][p].at("weight").data.data() + at, &code, 1);
      const std::string what = "code " + std::to_string(code) + " at byte " + std::to_string(at) +
                               " of projection " + std::to_string(p);
      SCOPED_TRACE(what);
      const std::optional<std::vector<Tensor>> direct = row->convert(opts, views_of(s));
      if ((code & 0x7f) == 0x7f) {
        EXPECT_FALSE(direct.has_value());
        EXPECT_THROW(canonical(s, *layout, opts), Error);
      } else {
        ASSERT_TRUE(direct.has_value());
        expect_same(*direct, canonical(s, *layout, opts), what);
      }
    }
}

TEST(FastPaths, RowsAndRefusals) {
  QuantParams q;
  q.method = QuantMethod::kGptq;
  q.bits = 4;
  q.group_size = 128;
  q.symmetric = false;
  const LayoutOptions opts = options_for(q, DType::kBF16, true, false, VllmTarget::kV0_33, 128, 1);
  const MoeShape shape = moe_shape_for(q, 1, 128, 128, true, 0, 0);
  std::vector<std::string> why;
  EXPECT_EQ(find_direct_path(q.method, "marlin", q, opts, shape, &why), nullptr);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_NE(why[0].find("asymmetric"), std::string::npos);
  EXPECT_EQ(find_direct_path(q.method, "triton-wna16", q, opts, shape, &why), nullptr);
  EXPECT_NE(why.at(0).find("no direct path"), std::string::npos);
  for (const DirectPath& row : direct_paths()) {
    EXPECT_NE(find_target_layout(row.layout), nullptr) << row.name;
    EXPECT_NE(find_source_codec(row.source), nullptr) << row.name;
  }
}

}  // namespace
}  // namespace moepack
