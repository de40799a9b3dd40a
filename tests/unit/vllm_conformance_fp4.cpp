// vLLM 0.33's FP4 Marlin contract on random FP4 MoE layers (docs/marlin_float.md): the
// property-test counterpart of tests/unit/vllm_conformance_float.cpp for the marlin-nvfp4 and
// marlin-mxfp4 rows.
//
// A generator draws layers over ModelOpt NVFP4, compressed-tensors NVFP4 and compressed-tensors
// MXFP4 sources -- E, H, I on and off every rule (H % 64 and % 128, which decides NVFP4's padding
// unit, I % 16 / 32 / 64, the kernel's thread configurations), gated or not, bf16/fp16
// activations, both vLLM targets, block scales normalised or not (NVFP4's rescale factor), gate/up
// global scales equal or not -- and checks for each:
//   - which layers the row takes, stated here from vLLM 0.33's prepare_nvfp4_moe_layer_for_marlin /
//     prepare_moe_fp4_layer_for_marlin and the shipped kernel's instances and thread
//     configurations, independently of the layout code;
//   - the parameters vLLM leaves on the layer (names, dtypes, shapes, the padded intermediate),
//     equal to the row's param_specs and to what pack writes;
//   - the processed global scale of every expert (w13/w2_weight_scale_2), computed here from the
//     source's global scales by nvfp4_marlin_process_global_scale's formula;
//   - unpack(pack(x)) == vLLM's reading of x (test::marlin_nvfp4_view: codes exactly, small block
//     scales flushed, one decode global per expert), and the reader's matmul against it.
// Seeds: FNV-1a of the suite name, mixed with MOEPACK_SUITE_SEED=<n> to sample other layers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "formats/codec.h"
#include "formats/fp8.h"
#include "tests/test_util.h"
#include "tests/unit/vllm_conformance_common.h"

namespace moepack {
namespace {

using test::Rng;

using conformance::suite_seed;

int64_t round_up(int64_t v, int64_t unit) {
  return (v + unit - 1) / unit * unit;
}

struct Case {
  QuantParams params;
  int64_t experts = 1, hidden = 128, inter = 128;
  bool gated = true, normalised = true, gate_up_equal = true;
  DType act = DType::kBF16;
  VllmTarget target = VllmTarget::kV0_33;
  bool nv() const { return params.method != QuantMethod::kCtMxfp4; }
  std::string str() const {
    std::ostringstream s;
    s << test::describe_params(params) << " E=" << experts << " H=" << hidden << " I=" << inter
      << (gated ? " gated" : " non-gated") << " act=" << dtype_name(act)
      << (normalised ? "" : " unnormalised") << (gate_up_equal ? "" : " gate/up globals differ")
      << " vllm-target=" << vllm_target_name(target);
    if (const char* env = std::getenv("MOEPACK_SUITE_SEED")) s << " MOEPACK_SUITE_SEED=" << env;
    return s.str();
  }
};

Case draw_case(Rng& rng) {
  auto pick = [&rng](std::initializer_list<int64_t> v) {
    return *(v.begin() + std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng));
  };
  Case c;
  c.params =
      find_source_codec(std::vector<QuantMethod>{
                            QuantMethod::kModeloptNvfp4, QuantMethod::kCtNvfp4,
                            QuantMethod::kCtMxfp4}[std::uniform_int_distribution<int>(0, 2)(rng)])
          ->param_space()
          .front();
  c.experts = pick({1, 2, 3, 4});
  c.hidden = pick({64, 128, 192, 256, 320, 384, 512});
  c.inter = c.nv() ? 16 * pick({1, 2, 3, 4, 5, 6, 8, 9, 12, 16}) : 32 * pick({1, 2, 3, 4, 6, 8});
  c.gated = std::bernoulli_distribution(0.85)(rng);
  c.act = std::bernoulli_distribution(0.7)(rng) ? DType::kBF16 : DType::kF16;
  c.target = std::bernoulli_distribution(0.85)(rng) ? VllmTarget::kV0_33 : VllmTarget::kV2026_05;
  c.normalised = std::bernoulli_distribution(0.5)(rng);
  c.gate_up_equal = std::bernoulli_distribution(0.7)(rng);
  return c;
}

// vLLM's padded intermediate: prepare_nvfp4_moe_layer_for_marlin pads I to 64 where H % 128 == 0,
// else to 128; prepare_moe_fp4_layer_for_marlin does not pad.
int64_t vllm_ip(const Case& c) {
  if (!c.nv()) return c.inter;
  return round_up(c.inter, c.hidden % 128 == 0 ? 64 : 128);
}

// The shipped kernel's thread configurations (thread_n, thread_k): (64, 128), (128, 64),
// (128, 128), (256, 64).
bool thread_config(int64_t n, int64_t k) {
  for (auto [tn, tk] : {std::pair<int64_t, int64_t>{64, 128}, {128, 64}, {128, 128}, {256, 64}})
    if (n % tn == 0 && k % tk == 0) return true;
  return false;
}

// Whether vLLM 0.33 prepares the layer and its shipped kernel runs it.
bool vllm_takes(const Case& c) {
  if (c.target != VllmTarget::kV0_33) return false;  // the rows write 0.33's bytes only
  const int64_t H = c.hidden, ip = vllm_ip(c), shards = c.gated ? 2 : 1;
  if (H % 64 != 0) return false;  // NVFP4 asserts it; every tile map needs it
  if (!c.nv() && (c.act != DType::kBF16 || !c.gated))
    return false;  // no fp16 x E8M0 instance; w13 taken as 2I rows
  return thread_config(shards * ip, H) && thread_config(H, ip);
}

// The parameters vLLM 0.33 leaves on the layer (fpmarlin spec §6).
std::vector<ParamSpec> vllm_contract(const Case& c, const std::string& p) {
  const int64_t E = c.experts, H = c.hidden, ip = vllm_ip(c), n13 = (c.gated ? 2 : 1) * ip;
  const DType sd = c.nv() ? DType::kF8_E4M3 : DType::kF8_E8M0;
  const int64_t g = c.nv() ? 16 : 32;
  std::vector<ParamSpec> out = {{p + "w13_weight", DType::kI32, {E, H / 16, 2 * n13}},
                                {p + "w2_weight", DType::kI32, {E, ip / 16, 2 * H}},
                                {p + "w13_weight_scale", sd, {E, H / g, n13}},
                                {p + "w2_weight_scale", sd, {E, ip / g, H}}};
  if (c.nv()) {
    out.push_back({p + "w13_weight_scale_2", DType::kF32, {E}});
    out.push_back({p + "w2_weight_scale_2", DType::kF32, {E}});
  }
  return out;
}

std::vector<ParamSpec> specs_of(const std::vector<Tensor>& ts) {
  std::vector<ParamSpec> out;
  for (const auto& t : ts) out.push_back({t.name, t.dtype, t.shape});
  return out;
}

// Random experts as the producers write them: NVFP4 block scales normalised (largest near 448,
// ModelOpt's and llm-compressor's global/local split) or not (largest well below: vLLM rescales),
// the up half's global scale the gate's or another.
MoeExperts draw_experts(Rng& rng, const Case& c, const MoeShape& s) {
  test::RandomTensorOptions ro;
  ro.scales = test::ScaleValues::kModerate;
  MoeExperts x = test::random_moe_experts(rng, s, ro);
  if (!c.nv()) return x;
  std::uniform_int_distribution<int> normal(c.normalised ? 0x60 : 0x30, c.normalised ? 0x7e : 0x50);
  for (QuantTensor* q : {&x.w13, &x.w2}) {
    for (uint8_t& b : q->scales) b = static_cast<uint8_t>(normal(rng));
    q->scales[0] = 0x03;  // one e4m3 subnormal block: flushed unless the rescale lifts it
    if (c.gate_up_equal && q->global_shards == 2)
      for (int64_t e = 0; e < q->experts; ++e)
        q->global_scales[static_cast<size_t>(2 * e + 1)] =
            q->global_scales[static_cast<size_t>(2 * e)];
  }
  return x;
}

// nvfp4_marlin_process_global_scale(g, dt) / scale_factor with g the method's decode global:
// g * 2^(2^(t-1) - 2 - 7) / sf, t = 8 (bf16) or 5 (fp16).
float processed_global(const QuantTensor& q, int64_t e, DType act, double sf) {
  const float stored = q.global_scales[static_cast<size_t>(e * q.global_shards)];
  const float g = q.global_scale == GlobalScale::kEncodeDivisor ? 1.0f / stored : stored;
  const int t = act == DType::kBF16 ? 8 : 5;
  return static_cast<float>(static_cast<double>(g) * std::exp2((1 << (t - 1)) - 2 - 7) / sf);
}

// _nvfp4_compute_scale_factor over one projection's block scales.
double scale_factor(const QuantTensor& q, DType act) {
  if (act != DType::kBF16) return 1.0;
  double largest = 0.0;
  for (uint8_t b : q.scales) largest = std::max(largest, static_cast<double>(e4m3_to_float(b)));
  return largest > 0.0 && largest < 448.0 ? std::exp2(std::floor(std::log2(448.0 / largest))) : 1.0;
}

struct Tally {
  int supported = 0, refused = 0, padded = 0, nv = 0, mx = 0, rescaled = 0, flushed = 0;
};

void check_case(Rng& rng, const Case& c, Tally* tally) {
  const TargetLayout& row = *find_target_layout(c.nv() ? "marlin-nvfp4" : "marlin-mxfp4");
  const MoeShape s = moe_shape_for(c.params, c.experts, c.hidden, c.inter, c.gated);
  const std::string prefix = vllm_param_prefix(c.target, "model.layers.0.mlp.experts.");
  LayoutOptions o = LayoutOptions::for_layer(c.params.method, c.act, c.gated, false, c.target,
                                             prefix, c.inter, 1);
  const std::vector<std::string> reasons = row.unsupported_reasons(o, s);
  std::string why;
  for (const auto& r : reasons) why += "\n  " + r;
  ASSERT_EQ(reasons.empty(), vllm_takes(c)) << "reasons:" << why;
  if (!reasons.empty()) {
    ++tally->refused;
    return;
  }
  ++tally->supported;
  tally->padded += vllm_ip(c) != c.inter;
  ++(c.nv() ? tally->nv : tally->mx);
  EXPECT_EQ(row.padded_inter ? row.padded_inter(o, s) : c.inter, vllm_ip(c));

  const MoeExperts x = draw_experts(rng, c, s);
  if (row.decide_layer) o.layer_decisions = row.decide_layer(o, s, test::whole_layer(x, 1));
  const std::vector<Tensor> packed = row.pack(o, x);
  const std::vector<ParamSpec> declared = row.param_specs(o, s);
  EXPECT_EQ(declared, specs_of(packed));
  EXPECT_EQ(declared, vllm_contract(c, prefix));

  TensorMap params;
  for (const auto& t : packed) params[t.name] = t;
  const MoeExperts back = row.unpack(o, params);
  for (MoeProj proj : {MoeProj::kW13, MoeProj::kW2}) {
    const QuantTensor& got = proj == MoeProj::kW13 ? back.w13 : back.w2;
    const QuantTensor& src = proj == MoeProj::kW13 ? x.w13 : x.w2;
    const QuantTensor want = c.nv() ? test::marlin_nvfp4_view(src, c.act) : src;
    const std::string pn = proj == MoeProj::kW13 ? "w13" : "w2";
    SCOPED_TRACE(pn);
    ASSERT_EQ(got.n, want.n);
    ASSERT_EQ(got.k, want.k);
    EXPECT_TRUE(test::bytes_equal(got.codes, want.codes, 16, "codes"));
    EXPECT_TRUE(test::bytes_equal(got.scales, want.scales, 16, "scales"));
    EXPECT_TRUE(test::bytes_equal(got.global_scales, want.global_scales, 16, "global scales"));
    if (c.nv()) {
      const double sf = scale_factor(src, c.act);
      tally->rescaled += sf > 1.0;
      tally->flushed += want.scales != src.scales;
      const Tensor& g2 = params.at(prefix + pn + "_weight_scale_2");
      for (int64_t e = 0; e < c.experts; ++e)
        EXPECT_EQ(g2.as<float>()[e], processed_global(src, e, c.act, sf)) << "expert " << e;
    }
    conformance::expect_reader_matmul_matches(rng, row, o, params, proj, got, c.experts);
  }
}

TEST(VllmConformanceFp4, ContractRoundTripAndMatmulOnRandomFp4Layers) {
  Rng rng(suite_seed("vllm_conformance/marlin-fp4"));
  Tally tally;
  if (!conformance::run_draws(rng, 300, draw_case,
                              [&](const Case& c) { check_case(rng, c, &tally); }))
    return;
  std::cout << "[ marlin-nvfp4 / marlin-mxfp4 ] " << tally.supported << " supported (" << tally.nv
            << " NVFP4, " << tally.mx << " MXFP4, " << tally.padded << " padded, " << tally.rescaled
            << " rescaled projections, " << tally.flushed << " with flushed scales), "
            << tally.refused << " refused\n";
  EXPECT_GE(tally.nv, 20);
  EXPECT_GE(tally.mx, 10);
  EXPECT_GE(tally.padded, 5);
  EXPECT_GE(tally.rescaled, 5);
  EXPECT_GE(tally.flushed, 5);
  EXPECT_GE(tally.refused, 20);
}

}  // namespace
}  // namespace moepack
