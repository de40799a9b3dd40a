// vLLM 0.33's float Marlin contract on random float MoE layers (docs/marlin_float.md): the
// property-test counterpart of tests/unit/vllm_conformance.cpp for the marlin-fp8 and
// marlin-mxfp8 rows.
//
// A generator draws layers over FP8 block (DeepSeek, compressed-tensors), FP8 channel
// (compressed-tensors), FP8 per-tensor (compressed-tensors, ModelOpt) and MXFP8 (ModelOpt,
// compressed-tensors) sources -- E, H, I on and off every divisibility rule (64, 128, the MX
// block 32, the kernel's thread configurations), gated or not, bf16/fp16 activations, both vLLM
// targets -- and checks for each:
//   - which layers the row takes, stated here from vLLM 0.33's prepare_*_for_marlin and the
//     shipped kernel's instances and thread configurations, independently of the layout code;
//   - the parameters vLLM leaves on the layer (names, dtypes, shapes, the padded intermediate),
//     equal to the row's param_specs and to what pack writes;
//   - unpack(pack(x)) == x (codes exactly, scales in the dtype the layout stores them; per-tensor
//     w13 as vLLM requantises it, stated here from process_fp8_weight_tensor_strategy_moe), and
//     the reader's matmul against the canonical dequantisation.
// Seeds: FNV-1a of the suite name, mixed with MOEPACK_SUITE_SEED=<n> to sample other layers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "core/half.h"
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
  bool gated = true;
  DType act = DType::kBF16;
  VllmTarget target = VllmTarget::kV0_33;
  bool mx() const {
    return params.method == QuantMethod::kModeloptMxfp8 || params.method == QuantMethod::kCtMxfp8;
  }
  bool per_tensor() const {
    return params.method == QuantMethod::kCtFp8Tensor || params.method == QuantMethod::kModeloptFp8;
  }
  // FP8 with one scale per channel or per tensor (no blocks along K).
  bool unblocked() const { return per_tensor() || params.method == QuantMethod::kCtFp8Channel; }
  std::string str() const {
    std::ostringstream s;
    s << test::describe_params(params) << " E=" << experts << " H=" << hidden << " I=" << inter
      << (gated ? " gated" : " non-gated") << " act=" << dtype_name(act)
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
  c.params.method = std::vector<QuantMethod>{
      QuantMethod::kFp8Block,   QuantMethod::kCtFp8Block,   QuantMethod::kModeloptMxfp8,
      QuantMethod::kCtMxfp8,    QuantMethod::kCtFp8Channel, QuantMethod::kCtFp8Tensor,
      QuantMethod::kModeloptFp8}[std::uniform_int_distribution<int>(0, 6)(rng)];
  c.params.bits = 8;
  c.params.group_size = c.mx() ? 32 : c.unblocked() ? -1 : 128;
  c.params.dynamic_input = !c.per_tensor();
  c.experts = pick({1, 2, 3, 4});
  c.hidden = pick({64, 128, 192, 256, 320, 384, 512});
  c.inter = c.mx()          ? 32 * pick({1, 2, 3, 4, 5, 6, 7, 8, 12})
            : c.unblocked() ? 8 * pick({3, 4, 8, 10, 12, 16, 24, 32, 48})
                            : pick({64, 128, 192, 256, 384});
  c.gated = std::bernoulli_distribution(0.85)(rng);
  c.act = std::bernoulli_distribution(0.7)(rng) ? DType::kBF16 : DType::kF16;
  c.target = std::bernoulli_distribution(0.85)(rng) ? VllmTarget::kV0_33 : VllmTarget::kV2026_05;
  return c;
}

// vLLM's padded intermediate (marlin_moe_padded_intermediate in prepare_*_for_marlin).
int64_t vllm_ip(const Case& c) {
  // lcm(64, g): g = 32 (MX), 128 (block), 1 (channel / per-tensor)
  return c.mx() || c.unblocked() ? round_up(c.inter, 64) : round_up(c.inter, 128);
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
  const int64_t H = c.hidden, I = c.inter, ip = vllm_ip(c), shards = c.gated ? 2 : 1;
  if (H % 64 != 0) return false;
  if (c.mx()) {
    if (c.act != DType::kBF16 || I % 32 != 0) return false;  // no fp16 x E8M0 instance
  } else if (c.unblocked()) {
    // channelwise FP8 instances (bf16 and fp16); one scale group, any I
  } else if (H % 128 != 0 || I % 128 != 0) {  // block-128 groups along K; block_n | I
    return false;
  }
  if (!c.gated && ip != I) return false;  // vLLM's padding assumes two shards
  return thread_config(shards * ip, H) && thread_config(H, ip);
}

// The parameters vLLM 0.33 leaves on the layer (spec §6).
std::vector<ParamSpec> vllm_contract(const Case& c, const std::string& p) {
  const int64_t E = c.experts, H = c.hidden, ip = vllm_ip(c), n13 = (c.gated ? 2 : 1) * ip;
  const std::string s =
      c.params.method == QuantMethod::kFp8Block ? "_weight_scale_inv" : "_weight_scale";
  const DType sd = c.mx() ? DType::kF8_E8M0 : c.act;
  const int64_t g13 = c.mx() ? 32 : c.unblocked() ? H : 128, g2 = c.unblocked() ? ip : g13;
  return {{p + "w13_weight", DType::kI32, {E, H / 16, 4 * n13}},
          {p + "w2_weight", DType::kI32, {E, ip / 16, 4 * H}},
          {p + "w13" + s, sd, {E, H / g13, n13}},
          {p + "w2" + s, sd, {E, ip / g2, H}}};
}

std::vector<ParamSpec> specs_of(const std::vector<Tensor>& ts) {
  std::vector<ParamSpec> out;
  for (const auto& t : ts) out.push_back({t.name, t.dtype, t.shape});
  return out;
}

// Source scales as the layout stores them: FP8 block scales rounded to the activation dtype,
// E8M0 codes as they are.
std::vector<uint8_t> stored_scales(const QuantTensor& q, DType act, bool mx) {
  if (mx) return q.scales;
  std::vector<uint8_t> out;
  for (size_t i = 0; i < q.scales.size(); i += static_cast<size_t>(q.scale_bytes())) {
    const float v = scale_to_float(q.scales.data() + i, q.scale_dtype);
    const uint16_t h = act == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
    out.push_back(static_cast<uint8_t>(h & 0xff));
    out.push_back(static_cast<uint8_t>(h >> 8));
  }
  return out;
}

// vLLM 0.33's per-tensor w13 (fp8_utils.py process_fp8_weight_tensor_strategy_moe on CUDA): per
// expert m = max(gate scale, up scale); each shard's code c with scale s becomes
// e4m3_rn(clamp(fp16(fp16(c) * fp16(s)) * (1 / m), +-448)), every row's scale m.
QuantTensor vllm_requantised_w13(const QuantTensor& q, int64_t I) {
  QuantTensor out = q;
  const int eb = q.scale_bytes();
  for (int64_t e = 0; e < q.experts; ++e) {
    const float s[2] = {scale_to_float(q.scales.data() + e * q.n * eb, q.scale_dtype),
                        scale_to_float(q.scales.data() + (e * q.n + I) * eb, q.scale_dtype)};
    const int64_t max_row = s[1] > s[0] ? I : 0;
    for (int64_t r = 0; r < q.n; ++r) {
      const float sh = f16_to_float(float_to_f16(s[r / I]));
      for (int64_t k = 0; k < q.k; ++k) {
        const size_t i = static_cast<size_t>((e * q.n + r) * q.k + k);
        const float dq = f16_to_float(float_to_f16(e4m3_to_float(q.codes[i]) * sh));
        const float x = dq * (1.0f / std::max(s[0], s[1]));
        out.codes[i] = float_to_e4m3_satfinite(std::min(448.0f, std::max(-448.0f, x)));
      }
      std::copy_n(q.scales.begin() + (e * q.n + max_row) * eb, eb,
                  out.scales.begin() + (e * q.n + r) * eb);
    }
  }
  return out;
}

struct Tally {
  int supported = 0, refused = 0, padded = 0, mx = 0, fp8 = 0, channel = 0, per_tensor = 0;
  int requantised = 0;  // per-tensor layers whose w13 codes vLLM changes
};

void check_case(Rng& rng, const Case& c, Tally* tally) {
  const TargetLayout& row = *find_target_layout(c.mx() ? "marlin-mxfp8" : "marlin-fp8");
  const MoeShape s = moe_shape_for(c.params, c.experts, c.hidden, c.inter, c.gated);
  const std::string prefix = vllm_param_prefix(c.target, "model.layers.0.mlp.experts.");
  const LayoutOptions o = LayoutOptions::for_layer(c.params.method, c.act, c.gated, false, c.target,
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
  ++(c.mx()           ? tally->mx
     : c.per_tensor() ? tally->per_tensor
     : c.unblocked()  ? tally->channel
                      : tally->fp8);
  EXPECT_EQ(row.padded_inter(o, s), vllm_ip(c));

  test::RandomTensorOptions ro;
  ro.scales = test::ScaleValues::kModerate;
  MoeExperts x = test::random_moe_experts(rng, s, ro);
  test::make_per_tensor_legal(c.params.method, &x);
  const std::vector<Tensor> packed = row.pack(o, x);
  const std::vector<ParamSpec> declared = row.param_specs(o, s);
  EXPECT_EQ(declared, specs_of(packed));
  EXPECT_EQ(declared, vllm_contract(c, prefix));

  TensorMap params;
  for (const auto& t : packed) params[t.name] = t;
  const MoeExperts back = row.unpack(o, params);
  for (MoeProj proj : {MoeProj::kW13, MoeProj::kW2}) {
    const QuantTensor& got = proj == MoeProj::kW13 ? back.w13 : back.w2;
    const QuantTensor want = proj == MoeProj::kW13 && c.per_tensor() && c.gated
                                 ? vllm_requantised_w13(x.w13, c.inter)
                             : proj == MoeProj::kW13 ? x.w13
                                                     : x.w2;
    if (proj == MoeProj::kW13 && want.codes != x.w13.codes) ++tally->requantised;
    SCOPED_TRACE(proj == MoeProj::kW13 ? "w13" : "w2");
    ASSERT_EQ(got.n, want.n);
    ASSERT_EQ(got.k, want.k);
    EXPECT_TRUE(test::bytes_equal(got.codes, want.codes, 16, "codes"));
    EXPECT_TRUE(test::bytes_equal(got.scales, stored_scales(want, c.act, c.mx()), 16, "scales"));
    conformance::expect_reader_matmul_matches(rng, row, o, params, proj, got, c.experts);
  }
}

TEST(VllmConformanceFloat, ContractRoundTripAndMatmulOnRandomFloatLayers) {
  Rng rng(suite_seed("vllm_conformance/marlin-float"));
  Tally tally;
  if (!conformance::run_draws(rng, 500, draw_case,
                              [&](const Case& c) { check_case(rng, c, &tally); }))
    return;
  std::cout << "[ marlin-fp8 / marlin-mxfp8 ] " << tally.supported << " supported (" << tally.fp8
            << " FP8 block, " << tally.channel << " FP8 channel, " << tally.per_tensor
            << " FP8 per-tensor (" << tally.requantised << " w13 requantised), " << tally.mx
            << " MXFP8, " << tally.padded << " padded), " << tally.refused << " refused\n";
  EXPECT_GE(tally.fp8, 20);
  EXPECT_GE(tally.channel, 15);
  EXPECT_GE(tally.per_tensor, 15);
  EXPECT_GE(tally.requantised, 10);
  EXPECT_GE(tally.mx, 20);
  EXPECT_GE(tally.padded, 5);
  EXPECT_GE(tally.refused, 20);
}

}  // namespace
}  // namespace moepack
