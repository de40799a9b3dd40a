// vLLM's parameter contract on every legal WNA16 input, per --vllm-target (docs/vllm_targets.md).
//
// A generator draws layers over the whole legal space -- E, H, I, group size (-1, 32, 64, 128,
// and sizes that force Triton's group halving or Marlin's tile padding), bits, act-order with one
// or many groups, fp16/bf16 models and activations, zero points, source methods, gated or not, and
// extents that sit exactly on each divisibility rule -- and runs both WNA16 layouts for both
// targets over it:
//   - which layers each target takes (an act-order layer for 0.33 is refused naming 2026-05);
//   - the parameters vLLM creates for that target (names, dtypes, shapes), stated here from vLLM's
//     create_weights / process_weights_after_loading independently of the layout code, equal to
//     the row's param_specs and to what pack writes;
//   - unpack(pack(x)) == x exactly (padding dropped), and the reader's matmul against the canonical
//     dequantisation of x.
// Seeds: FNV-1a of the suite name, mixed with MOEPACK_SUITE_SEED=<n> to sample other layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <sstream>

#include "core/half.h"
#include "formats/codec.h"
#include "formats/triton_wna16.h"
#include "tests/test_util.h"
#include "tests/unit/vllm_conformance_common.h"

namespace moepack {
namespace {

using test::Rng;

using conformance::suite_seed;

int64_t lcm64(int64_t gs) {
  const int64_t g = gs > 0 ? gs : 1;
  return std::lcm<int64_t>(64, g);
}

int64_t round_up(int64_t v, int64_t unit) {
  return (v + unit - 1) / unit * unit;
}

// One drawn layer.
struct Case {
  QuantParams params;
  int64_t experts = 1, hidden = 128, inter = 128;
  bool gated = true;
  DType act = DType::kBF16;
  std::string str() const {
    std::ostringstream s;
    s << test::describe_params(params) << " E=" << experts << " H=" << hidden << " I=" << inter
      << (gated ? " gated" : " non-gated") << " act=" << dtype_name(act);
    if (const char* env = std::getenv("MOEPACK_SUITE_SEED")) s << " MOEPACK_SUITE_SEED=" << env;
    return s.str();
  }
};

template <typename T>
T pick(Rng& rng, const std::vector<T>& v) {
  return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
}

// Intermediate sizes that sit on (or just off) each rule for this group size: I == gs, I == 64,
// max(64, gs), lcm(64, gs) and multiples, multiples of gs that are not multiples of 64 (Marlin
// pads them for 0.33), sizes that force Triton's halving (gs not dividing I), and free multiples
// of 8 (int4 / int8 packing on K and N).
int64_t draw_inter(Rng& rng, int64_t gs) {
  const int64_t g = gs > 0 ? gs : 8;
  std::vector<int64_t> v = {64,
                            std::max<int64_t>(64, g),
                            lcm64(gs),
                            2 * lcm64(gs),
                            3 * g,
                            5 * g,
                            g * (2 * std::uniform_int_distribution<int64_t>(0, 3)(rng) + 1)};
  if (gs > 0) v.push_back(gs);
  if (gs >= 64) v.push_back(gs / 2);  // halving: gs does not divide I
  v.push_back(8 * std::uniform_int_distribution<int64_t>(1, 48)(rng));
  int64_t i = pick(rng, v);
  return std::min<int64_t>(std::max<int64_t>(i, 8), 512);
}

Case draw_case(Rng& rng) {
  Case c;
  QuantParams& p = c.params;
  p.method = pick(rng, std::vector<QuantMethod>{QuantMethod::kGptq, QuantMethod::kGptq,
                                                QuantMethod::kAwq, QuantMethod::kCtPackQuantized});
  p.bits = p.method == QuantMethod::kAwq ? 4 : pick(rng, std::vector<int>{4, 8});
  p.group_size = pick(rng, std::vector<int64_t>{-1, 32, 64, 128});
  if (p.method == QuantMethod::kAwq && p.group_size < 0) p.group_size = 128;
  p.symmetric = p.method != QuantMethod::kAwq;
  if (p.method == QuantMethod::kGptq && p.bits == 4 && std::bernoulli_distribution(0.2)(rng))
    p.symmetric = false;  // asymmetric GPTQ (Triton only)
  p.act_order = p.method != QuantMethod::kAwq && p.group_size > 0 && p.symmetric &&
                std::bernoulli_distribution(0.35)(rng);
  if (p.method == QuantMethod::kCtPackQuantized) p.actorder = p.act_order ? "group" : "";
  p.gptq_format = GptqFormat::kV1;
  p.dtype = pick(rng, std::vector<DType>{DType::kBF16, DType::kF16});
  c.experts = std::uniform_int_distribution<int64_t>(1, 3)(rng);
  c.hidden = pick(rng, std::vector<int64_t>{128, 256, 384, 128 * 4, 192, 64});
  c.inter = draw_inter(rng, p.group_size);
  // Act-order with exactly one group in w2 (I == group size) is the case vLLM still sizes [E, K].
  if (p.act_order && std::bernoulli_distribution(0.5)(rng)) c.inter = p.group_size;
  c.gated = std::bernoulli_distribution(0.8)(rng);
  c.act = pick(rng, std::vector<DType>{DType::kBF16, DType::kF16});
  return c;
}

// ---- the contract, stated from vLLM -----------------------------------------------------------

struct Names {
  std::string qweight, scales, qzeros, g_idx;
};
Names vllm_names(QuantMethod m, const std::string& p, bool marlin) {
  if (m == QuantMethod::kCtPackQuantized)
    return {p + "_weight_packed", p + "_weight_scale", "", marlin ? p + "_weight_g_idx" : ""};
  if (m == QuantMethod::kAwq) return {p + "_qweight", p + "_scales", p + "_qzeros", ""};
  return {p + "_qweight", p + "_scales", marlin ? "" : p + "_qzeros", marlin ? p + "_g_idx" : ""};
}

std::string module_prefix() {
  return "model.layers.7.mlp.experts.";
}

// Marlin MoE parameters after process_weights_after_loading (spec §7; vLLM 0.33 int_wna16.py
// _process_weights_marlin / _process_awq_weights_marlin with marlin_moe_padded_intermediate).
std::vector<ParamSpec> marlin_contract(VllmTarget t, const Case& c) {
  const bool v033 = t == VllmTarget::kV0_33;
  const std::string pre = module_prefix() + (v033 ? "routed_experts." : "");
  const int64_t gs = c.params.group_size, E = c.experts, H = c.hidden;
  const int64_t ip = v033 ? round_up(c.inter, lcm64(gs)) : c.inter;
  const int64_t n13 = (c.gated ? 2 : 1) * ip, pf = 32 / c.params.bits;
  const int64_t g13 = gs > 0 ? H / gs : 1, g2 = gs > 0 ? ip / gs : 1;
  std::vector<ParamSpec> out;
  const auto proj = [&](const std::string& p, int64_t n, int64_t k, int64_t g) {
    const Names nm = vllm_names(c.params.method, p, true);
    out.push_back({pre + nm.qweight, DType::kI32, {E, k / 16, n * 16 / pf}});
    out.push_back({pre + nm.scales, c.act, {E, g, n}});
    if (!nm.qzeros.empty()) out.push_back({pre + nm.qzeros, DType::kI32, {E, g, n / pf}});
    if (v033) return;  // vLLM 0.33 creates no g_idx / sort-index parameters
    const int64_t gk = c.params.act_order ? k : 0;  // every projection of an act-order layer
    if (!nm.g_idx.empty()) out.push_back({pre + nm.g_idx, DType::kI32, {E, gk}});
    out.push_back({pre + p + "_g_idx_sort_indices", DType::kI32, {E, gk}});
  };
  proj("w13", n13, H, g13);
  proj("w2", H, ip, g2);
  return out;
}

// Triton moe_wna16 parameters (spec §8-9): K / gs' scale columns, gs' halved until it divides
// I and H (not for compressed-tensors).
std::vector<ParamSpec> triton_contract(VllmTarget t, const Case& c) {
  const std::string pre =
      module_prefix() + (t == VllmTarget::kV0_33 ? std::string("routed_experts.") : "");
  const int64_t E = c.experts, H = c.hidden, I = c.inter, n13 = (c.gated ? 2 : 1) * I;
  int64_t eff = c.params.group_size;
  if (c.params.method != QuantMethod::kCtPackQuantized)
    while (I % eff != 0 || H % eff != 0) eff /= 2;
  std::vector<ParamSpec> out;
  const auto proj = [&](const std::string& p, int64_t n, int64_t k) {
    const Names nm = vllm_names(c.params.method, p, false);
    out.push_back({pre + nm.qweight, DType::kU8, {E, n, k * c.params.bits / 8}});
    out.push_back({pre + nm.scales, c.act, {E, n, k / eff}});
    if (!c.params.symmetric) out.push_back({pre + nm.qzeros, DType::kU8, {E, n / 2, k / eff}});
  };
  proj("w13", n13, H);
  proj("w2", H, I);
  return out;
}

// Whether Marlin takes the layer for this target (spec §7 method selection; vLLM 0.33
// check_moe_marlin_supports_config with allow_tile_padding, and no MoE act-order).
bool marlin_takes(VllmTarget t, const Case& c) {
  const QuantParams& p = c.params;
  const int64_t gs = p.group_size;
  if (p.method == QuantMethod::kAwq ? (p.bits != 4 || gs <= 0) : !p.symmetric) return false;
  if (c.hidden % 128 != 0) return false;
  if (t == VllmTarget::kV0_33) return !p.act_order && (gs <= 0 || c.inter % gs == 0);
  return c.inter % std::max<int64_t>(64, gs) == 0;
}

std::string specs_str(const std::vector<ParamSpec>& v) {
  std::string s;
  for (const auto& p : v)
    s += "\n  " + p.name + " " + dtype_name(p.dtype) + " " + shape_str(p.shape);
  return s;
}

std::vector<ParamSpec> specs_of(const std::vector<Tensor>& ts) {
  std::vector<ParamSpec> out;
  for (const auto& t : ts) out.push_back({t.name, t.dtype, t.shape});
  return out;
}

// The source scales as the layout stores them (activation dtype): through float32, then round to
// nearest even.
std::vector<uint8_t> scales_in(const QuantTensor& q, DType to) {
  if (q.scale_dtype == to) return q.scales;
  std::vector<uint8_t> out;
  for (size_t i = 0; i < q.scales.size(); i += static_cast<size_t>(q.scale_bytes())) {
    const float v = scale_to_float(q.scales.data() + i, q.scale_dtype);
    const uint16_t h = to == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
    out.push_back(static_cast<uint8_t>(h & 0xff));
    out.push_back(static_cast<uint8_t>(h >> 8));
  }
  return out;
}

std::vector<int32_t> explicit_g_idx(const QuantTensor& q) {
  if (!q.g_idx.empty() || q.group_size <= 0) return q.g_idx;
  std::vector<int32_t> g(static_cast<size_t>(q.experts * q.k));
  for (int64_t e = 0; e < q.experts; ++e)
    for (int64_t k = 0; k < q.k; ++k) g[static_cast<size_t>(e * q.k + k)] = k / q.group_size;
  return g;
}

void expect_round_trip(const QuantTensor& got, const QuantTensor& want, DType act,
                       const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.experts, want.experts);
  ASSERT_EQ(got.n, want.n);
  ASSERT_EQ(got.k, want.k);
  EXPECT_TRUE(test::bytes_equal(got.codes, want.codes, 16, "codes"));
  EXPECT_TRUE(test::bytes_equal(got.scales, scales_in(want, act), 16, "scales"));
  EXPECT_TRUE(test::bytes_equal(got.zeros, want.zeros, 16, "zeros"));
  // An act-order projection with one group reads back as its explicit trivial g_idx.
  if (!got.g_idx.empty() || !want.g_idx.empty()) {
    EXPECT_TRUE(test::bytes_equal(explicit_g_idx(got), explicit_g_idx(want), 16, "g_idx"));
  }
}

// Random experts for the layer; an act-order projection whose K holds one group gets the
// trivial g_idx made explicit, as the loader makes it (the plan forces it for act-order layers).
MoeExperts draw_experts(Rng& rng, const MoeShape& s, const QuantParams& p) {
  test::RandomTensorOptions ro;
  ro.scales = test::ScaleValues::kModerate;
  std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(p);
  if (p.method == QuantMethod::kGptq) {  // what vLLM's GPTQ Triton loader can express
    ro.zero_lo = std::max(ro.zero_lo, 1);
    ro.zero_hi = std::min(ro.zero_hi, (1 << p.bits) - 1);
  }
  MoeExperts x = test::random_moe_experts(rng, s, ro);
  for (QuantTensor* q : {&x.w13, &x.w2})
    if ((q == &x.w13 ? s.w13 : s.w2).act_order && q->g_idx.empty()) q->g_idx = explicit_g_idx(*q);
  return x;
}

struct Tally {
  int supported = 0, refused = 0, padded = 0, halved_narrowed = 0, act_order_one_group = 0;
};

void check_case(Rng& rng, const TargetLayout& row, VllmTarget target, const Case& c, Tally* tally) {
  const bool marlin = std::string(row.name) == "marlin";
  const MoeShape s = moe_shape_for(c.params, c.experts, c.hidden, c.inter, c.gated);
  const LayoutOptions o =
      LayoutOptions::for_layer(c.params.method, c.act, c.gated, false, target,
                               vllm_param_prefix(target, module_prefix()), c.inter, 1);
  const std::vector<std::string> reasons = row.unsupported_reasons(o, s);
  if (marlin) {
    std::string why;
    for (const auto& r : reasons) why += "\n  " + r;
    EXPECT_EQ(reasons.empty(), marlin_takes(target, c)) << "reasons:" << why;
  }
  if (target == VllmTarget::kV0_33 && c.params.act_order) {
    // No WNA16 layout takes act-order for 0.33; the refusal names the target that does.
    EXPECT_FALSE(reasons.empty());
    if (marlin) {
      const bool names_2026_05 = std::any_of(reasons.begin(), reasons.end(), [](const auto& r) {
        return r.find("--vllm-target 2026-05") != std::string::npos;
      });
      EXPECT_TRUE(names_2026_05);
    }
  }
  if (!reasons.empty()) {
    ++tally->refused;
    return;
  }
  ++tally->supported;
  const int64_t ip = row.padded_inter ? row.padded_inter(o, s) : c.inter;
  tally->padded += ip != c.inter;
  tally->act_order_one_group +=
      c.params.act_order && c.params.group_size > 0 && c.inter <= c.params.group_size;
  if (!marlin && c.params.group_size > 0 &&
      (c.inter % c.params.group_size != 0 || c.hidden % c.params.group_size != 0))
    ++tally->halved_narrowed;

  const MoeExperts x = draw_experts(rng, s, c.params);
  const std::vector<Tensor> packed = row.pack(o, x);
  const std::vector<ParamSpec> declared = row.param_specs(o, s);
  const std::vector<ParamSpec> contract =
      marlin ? marlin_contract(target, c) : triton_contract(target, c);
  EXPECT_EQ(declared, specs_of(packed))
      << "param_specs:" << specs_str(declared) << "\npack:" << specs_str(specs_of(packed));
  EXPECT_EQ(declared, contract) << "param_specs:" << specs_str(declared)
                                << "\nvLLM:" << specs_str(contract);

  TensorMap params;
  for (const auto& t : packed) params[t.name] = t;
  const MoeExperts back = row.unpack(o, params);
  expect_round_trip(back.w13, x.w13, c.act, "w13");
  expect_round_trip(back.w2, x.w2, c.act, "w2");

  for (MoeProj proj : {MoeProj::kW13, MoeProj::kW2}) {
    SCOPED_TRACE(proj == MoeProj::kW13 ? "w13" : "w2");
    const QuantTensor& q = proj == MoeProj::kW13 ? back.w13 : back.w2;
    conformance::expect_reader_matmul_matches(rng, row, o, params, proj, q, c.experts);
  }
}

class VllmConformance : public ::testing::TestWithParam<const char*> {};

TEST_P(VllmConformance, ContractRoundTripAndMatmulOnRandomLegalLayers) {
  const TargetLayout* row = find_target_layout(GetParam());
  ASSERT_NE(row, nullptr);
  Rng rng(suite_seed(std::string("vllm_conformance/") + GetParam()));
  for (const VllmTargetRow& target : vllm_target_rows()) {
    Tally tally;
    for (int i = 0; i < 200; ++i) {
      const Case c = draw_case(rng);
      SCOPED_TRACE(std::string(row->name) + " --vllm-target " + target.name + " " + c.str());
      try {
        check_case(rng, *row, target.target, c, &tally);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "threw " << e.what();
      }
      if (::testing::Test::HasFailure()) return;  // the first failing draw says enough
    }
    std::cout << "[ " << row->name << " " << target.name << " ] " << tally.supported
              << " supported (" << tally.padded << " padded, " << tally.halved_narrowed
              << " halved with a narrowed group, " << tally.act_order_one_group
              << " act-order with a one-group projection), " << tally.refused << " refused\n";
    EXPECT_GE(tally.supported, 20);
    if (std::string(row->name) == "marlin" && target.marlin_pads_intermediate) {
      EXPECT_GE(tally.padded, 3);
    }
    if (std::string(row->name) == "marlin" && target.moe_act_order) {
      EXPECT_GE(tally.act_order_one_group, 2);
    }
    if (std::string(row->name) == "triton-wna16") {
      EXPECT_GE(tally.halved_narrowed, 2);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Wna16, VllmConformance, ::testing::Values("marlin", "triton-wna16"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           std::string s = p.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// ---- named cases -------------------------------------------------------------------------------

MoeExperts one_layer(Rng& rng, const QuantParams& p, int64_t e, int64_t h, int64_t i) {
  return draw_experts(rng, moe_shape_for(p, e, h, i, true), p);
}

QuantParams gptq(int bits, int64_t gs, bool act_order) {
  QuantParams p;
  p.method = QuantMethod::kGptq;
  p.bits = bits;
  p.group_size = gs;
  p.act_order = act_order;
  p.dtype = DType::kF16;
  return p;
}

TEST(VllmTargets, RowsNameTheirVllmAndTheDefaultIsTheNewestRelease) {
  EXPECT_EQ(newest_vllm_target(), VllmTarget::kV0_33);
  EXPECT_STREQ(vllm_target_name(VllmTarget::kV0_33), "0.33");
  EXPECT_STREQ(vllm_target_name(VllmTarget::kV2026_05), "2026-05");
  EXPECT_EQ(parse_vllm_target("2026-05"), VllmTarget::kV2026_05);
  const Error e = test::expect_error([] { parse_vllm_target("0.34"); }, ErrorCode::kUsage);
  EXPECT_NE(std::string(e.what()).find("0.33, 2026-05"), std::string::npos) << e.what();
  for (const auto& r : vllm_target_rows()) EXPECT_NE(std::string(r.follows), "");
}

TEST(VllmTargets, MarlinPaddedIntermediateIsTheNextMultipleOfLcm64GroupSize) {
  EXPECT_EQ(marlin_padded_intermediate(64, -1), 64);
  EXPECT_EQ(marlin_padded_intermediate(72, -1), 128);
  EXPECT_EQ(marlin_padded_intermediate(96, 32), 128);
  EXPECT_EQ(marlin_padded_intermediate(128, 128), 128);
  EXPECT_EQ(marlin_padded_intermediate(256, 128), 256);
  EXPECT_EQ(marlin_padded_intermediate(384, 128), 384);
  EXPECT_EQ(marlin_padded_intermediate(160, 32), 192);
}

// Issue 10, class 1: I == group_size gives w2 one group; vLLM@9aaf83ef still creates w2_g_idx
// and w2_g_idx_sort_indices [E, K].
TEST(VllmTargets, ActOrderLayerWithOneGroupW2HasEKIndexParams) {
  Rng rng(1);
  const QuantParams p = gptq(4, 128, true);
  const MoeShape s = moe_shape_for(p, 2, 256, 128, true);
  EXPECT_TRUE(s.w2.act_order) << "act-order is the layer's, whatever w2's group count";
  const LayoutOptions o = LayoutOptions::for_layer(p.method, DType::kBF16, true, false,
                                                   VllmTarget::kV2026_05, "m.experts.", 128, 1);
  const TargetLayout& marlin = *find_target_layout("marlin");
  ASSERT_TRUE(marlin.unsupported_reasons(o, s).empty());
  const std::vector<Tensor> out = marlin.pack(o, draw_experts(rng, s, p));
  std::map<std::string, Shape> shapes;
  for (const auto& t : out) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes.at("m.experts.w2_g_idx"), (Shape{2, 128}));
  EXPECT_EQ(shapes.at("m.experts.w2_g_idx_sort_indices"), (Shape{2, 128}));
  EXPECT_EQ(shapes.at("m.experts.w13_g_idx"), (Shape{2, 256}));
}

TEST(VllmTargets, ActOrderFor033IsRefusedNamingTheTargetThatTakesIt) {
  const QuantParams p = gptq(4, 128, true);
  const MoeShape s = moe_shape_for(p, 2, 256, 256, true);
  const LayoutOptions o = LayoutOptions::for_layer(
      p.method, DType::kBF16, true, false, VllmTarget::kV0_33, "m.experts.routed_experts.", 256, 1);
  for (const char* name : {"marlin", "triton-wna16"}) {
    const auto reasons = find_target_layout(name)->unsupported_reasons(o, s);
    EXPECT_FALSE(reasons.empty()) << name;
  }
  std::string all;
  for (const auto& r : find_target_layout("marlin")->unsupported_reasons(o, s)) all += r;
  EXPECT_NE(all.find("act-order"), std::string::npos) << all;
  EXPECT_NE(all.find("vLLM 0.33.0"), std::string::npos) << all;
  EXPECT_NE(all.find("--vllm-target 2026-05"), std::string::npos) << all;
}

// Issue 10, class 2: I = 64 with group 128 halves to gs' = 64; w2 scales are [E, H, I / gs'].
TEST(VllmTargets, TritonHalvedGroupNarrowsW2ScalesToIOverHalvedGroup) {
  Rng rng(2);
  QuantParams p = gptq(4, 128, false);
  p.symmetric = false;
  const TargetLayout& triton = *find_target_layout("triton-wna16");
  const LayoutOptions o = LayoutOptions::for_layer(p.method, DType::kBF16, true, false,
                                                   VllmTarget::kV2026_05, "m.experts.", 64, 1);
  const MoeShape s = moe_shape_for(p, 3, 256, 64, true);
  p.symmetric = true;  // zero points with I not a multiple of gs cannot load in vLLM (refused)
  const MoeShape sym = moe_shape_for(p, 3, 256, 64, true);
  EXPECT_FALSE(triton.unsupported_reasons(o, s).empty());
  ASSERT_TRUE(triton.unsupported_reasons(o, sym).empty());
  const MoeExperts x = draw_experts(rng, sym, p);
  TensorMap params;
  for (auto& t : triton.pack(o, x)) params[t.name] = t;
  EXPECT_EQ(params.at("m.experts.w2_scales").shape, (Shape{3, 256, 1}));
  EXPECT_EQ(params.at("m.experts.w13_scales").shape, (Shape{3, 128, 4}));
  const MoeExperts back = unpack_triton_wna16_moe_with_group_size(o, params, 128);
  expect_round_trip(back.w2, x.w2, DType::kBF16, "w2");
  const MoeExperts inferred = triton.unpack(o, params);
  EXPECT_TRUE(test::bytes_equal(inferred.w2.codes, x.w2.codes, 16, "w2 codes"));
}

// Padding (0.33): every padded code, scale and zero point is zero, unpack drops it exactly, and a
// non-zero pad is refused rather than dropped.
TEST(VllmTargets, MarlinPaddingIsZeroRoundTripsAndANonZeroPadIsRefused) {
  Rng rng(3);
  QuantParams p;
  p.method = QuantMethod::kAwq;
  p.bits = 4;
  p.group_size = 32;
  p.symmetric = false;
  p.dtype = DType::kF16;
  const int64_t E = 2, H = 128, I = 96, ip = 128;
  const MoeExperts x = one_layer(rng, p, E, H, I);
  const LayoutOptions o = LayoutOptions::for_layer(
      p.method, DType::kF16, true, false, VllmTarget::kV0_33, "m.experts.routed_experts.", I, 1);
  const TargetLayout& marlin = *find_target_layout("marlin");
  ASSERT_TRUE(marlin.unsupported_reasons(o, moe_shape_of(x)).empty());
  EXPECT_EQ(marlin.padded_inter(o, moe_shape_of(x)), ip);
  TensorMap params;
  for (auto& t : marlin.pack(o, x)) params[t.name] = t;
  EXPECT_EQ(params.at("m.experts.routed_experts.w2_qweight").shape, (Shape{E, ip / 16, H * 2}));
  EXPECT_EQ(params.at("m.experts.routed_experts.w2_scales").shape, (Shape{E, ip / 32, H}));
  // The whole padded layer decodes with zeros in every padded place.
  LayoutOptions whole = o;
  whole.inter = 0;
  const MoeExperts padded = marlin.unpack(whole, params);
  ASSERT_EQ(padded.w13.n, 2 * ip);
  int64_t padded_codes = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < 2 * ip; ++r) {
      if (r % ip < I) continue;
      for (int64_t k = 0; k < H; ++k) {
        padded_codes += padded.w13.codes[static_cast<size_t>((e * 2 * ip + r) * H + k)] != 0;
      }
    }
  EXPECT_EQ(padded_codes, 0);
  expect_round_trip(marlin.unpack(o, params).w13, x.w13, DType::kF16, "w13");
  // A pad scale made non-zero would reach the output: unpack refuses it.
  Tensor& s13 = params.at("m.experts.routed_experts.w13_scales");
  LayoutOptions wrong_inter = o;
  std::fill(s13.data.begin(), s13.data.end(), uint8_t{0x3c});  // every scale 1.0 (F16 0x3c3c)
  const Error err = test::expect_error([&] { marlin.unpack(o, params); }, ErrorCode::kBadValue);
  EXPECT_NE(std::string(err.what()).find("padding"), std::string::npos) << err.what();
  // I = 128 carried is not how 0.33 pads an I of 64 (64 needs no padding): a manifest that says
  // so does not match the parameters.
  wrong_inter.inter = 64;
  test::expect_error([&] { marlin.unpack(wrong_inter, params); }, ErrorCode::kBadShape);
}

}  // namespace
}  // namespace moepack
