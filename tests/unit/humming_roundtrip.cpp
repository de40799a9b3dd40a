// The Humming layout (formats/humming.h): exact round trips over its whole legal shape space
// (int4 / int8, symmetric / zero points, bf16 / fp16, every group size, the padding edges, recoded
// and not), param_specs, the reader against the canonical dequantisation, the layer decision, the
// LayerConfig strings, refusals, corrupted padding, and mutants -- the layout bugs a Marlin-minded
// implementation would make -- that the matmul through the reader must catch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "formats/humming.h"
#include "formats/marlin.h"
#include "formats/moe_reader.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::bytes_equal;

struct Shape3 {
  int64_t E, H, I;
};
// Padding edges: I = 64 (w13 N 128 -> 256, w2 K 64 -> 128), 96, 192 (N 384 -> 512), 320; H = 384
// (w2 N -> 512); E = 1.
const Shape3 kShapes[] = {{1, 128, 64}, {2, 256, 96}, {2, 384, 192}, {3, 128, 320}, {1, 256, 256}};

QuantParams params_of(QuantMethod m, int bits, int64_t group, bool sym, DType dt) {
  QuantParams p;
  p.method = m;
  p.bits = bits;
  p.group_size = group;
  p.symmetric = sym;
  p.dtype = dt;
  return p;
}

LayoutOptions options_of(const QuantParams& p, DType act, const Shape3& s) {
  LayoutOptions o;
  o.act_dtype = act;
  o.gated = true;
  o.vllm_target = VllmTarget::kV0_33;
  o.source_method = p.method;
  o.prefix = "model.layers.0.mlp.experts.routed_experts.";
  o.hidden = s.H;
  o.inter = s.I;
  return o;
}

LayerExperts whole(const MoeExperts& x, int* loads = nullptr) {
  return test::whole_layer(x, 2, loads);
}

// Codes 1..2^b-1 only: a layer Humming recodes to sign-magnitude.
void drop_code_zero(QuantTensor& q, test::Rng& rng) {
  std::uniform_int_distribution<int> c(1, (1 << q.bits) - 1);
  for (auto& v : q.codes)
    if (v == 0) v = static_cast<uint8_t>(c(rng));
}

TensorMap by_name(const std::vector<Tensor>& ts) {
  TensorMap m;
  for (const auto& t : ts) m[t.name] = t;
  return m;
}

std::vector<ParamSpec> specs_of(const std::vector<Tensor>& ts) {
  std::vector<ParamSpec> out;
  for (const auto& t : ts) out.push_back({t.name, t.dtype, t.shape});
  return out;
}

// max |y - ref| / max |ref| of the matmul through the reader against the canonical dequantisation.
double reader_error(const LayoutOptions& o, const TensorMap& params, const MoeExperts& x,
                    MoeProj proj, int64_t e, test::Rng& rng) {
  const QuantTensor& q = proj == MoeProj::kW13 ? x.w13 : x.w2;
  const int64_t m = 3;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> xa(static_cast<size_t>(m * q.k)), y(static_cast<size_t>(m * q.n), NAN);
  for (auto& v : xa) v = u(rng);
  test::layout_matmul(humming_make_reader, o, params, proj, e, xa.data(), m, y.data());
  return test::matmul_error(q, e, xa, m, y);
}

struct Variant {
  QuantMethod method;
  int bits;
  bool sym;
};
const Variant kVariants[] = {{QuantMethod::kGptq, 4, true},
                             {QuantMethod::kGptq, 8, true},
                             {QuantMethod::kAwq, 4, false},
                             {QuantMethod::kCtPackQuantized, 4, true},
                             {QuantMethod::kCtPackQuantized, 4, false},
                             {QuantMethod::kCtPackQuantized, 8, true},
                             {QuantMethod::kCtPackQuantized, 8, false}};

TEST(Humming, RoundTripSpecsReaderOverTheLegalSpace) {
  test::Rng rng(23);
  int cases = 0, recoded = 0;
  for (const Variant& v : kVariants)
    for (int64_t g : {32, 64, 128})
      for (DType act : {DType::kBF16, DType::kF16})
        for (const Shape3& s : kShapes)
          for (bool no_zero : {false, true}) {
            // 4-bit codes read alike in both dtypes: one of them per combination; 8-bit codes
            // differ (int2fp with bf16 only): both.
            if (v.bits == 4 && (act == DType::kF16) != (((s.I + g) / 32 + no_zero) % 2 == 1))
              continue;
            const QuantParams p = params_of(v.method, v.bits, g, v.sym, act);
            const MoeShape shape = moe_shape_for(p, s.E, s.H, s.I, true);
            LayoutOptions o = options_of(p, act, s);
            if (!humming_unsupported_reasons(o, shape).empty()) continue;
            SCOPED_TRACE(test::describe_params(p) + " E=" + std::to_string(s.E) +
                         " H=" + std::to_string(s.H) + " I=" + std::to_string(s.I) +
                         (no_zero ? " no code 0" : ""));
            test::RandomTensorOptions ro;
            MoeExperts x = test::random_moe_experts(rng, shape, ro);
            if (no_zero) {
              drop_code_zero(x.w13, rng);
              drop_code_zero(x.w2, rng);
            }
            o.layer_decisions = humming_decide_layer(o, shape, whole(x));
            const bool rc = no_zero && v.sym;
            EXPECT_EQ(o.layer_decisions.at("w13_b_dtype"), humming_b_dtype_name(v.bits, rc));
            recoded += rc;
            const std::vector<Tensor> packed = pack_humming_moe(o, x);
            EXPECT_EQ(humming_param_specs(o, shape), specs_of(packed));
            const TensorMap params = by_name(packed);
            const MoeExperts back = unpack_humming_moe(o, params);
            for (const auto* pr : {&back.w13, &back.w2}) {
              const QuantTensor& src = pr == &back.w13 ? x.w13 : x.w2;
              EXPECT_TRUE(bytes_equal(pr->codes, src.codes, 16, "codes"));
              EXPECT_TRUE(bytes_equal(pr->zeros, src.zeros, 16, "zeros"));
              EXPECT_EQ(pr->scale_dtype, act);
              EXPECT_EQ(pr->group_size, g);
              // The source's scales as the activation dtype holds them.
              EXPECT_TRUE(bytes_equal(pr->scales,
                                      convert_scales(src.scales, src.scale_dtype, act, "scales"),
                                      16, "scales"));
            }
            test::ReaderCheck how;
            how.whole_expert = cases % 8 == 0;
            how.samples = 400;
            test::expect_reader_matches(rng, *find_target_layout("humming"), o, params, back, how);
            EXPECT_LT(reader_error(o, params, back, MoeProj::kW13, s.E - 1, rng), 1e-5);
            EXPECT_LT(reader_error(o, params, back, MoeProj::kW2, 0, rng), 1e-5);
            // Threads and chunks: packing a slice of the experts gives the slice.
            LayoutOptions o4 = o;
            o4.threads = 3;
            const std::vector<Tensor> again = pack_humming_moe(o4, x);
            for (size_t i = 0; i < packed.size(); ++i)
              EXPECT_TRUE(bytes_equal(again[i].data, packed[i].data, 16, packed[i].name));
            ++cases;
          }
  EXPECT_GE(cases, 100);
  EXPECT_GE(recoded, 15);
}

TEST(Humming, DecisionIsTheWholeLayersAndStopsAtTheFirstZero) {
  test::Rng rng(5);
  const QuantParams p = params_of(QuantMethod::kGptq, 4, 128, true, DType::kBF16);
  const Shape3 s{6, 256, 128};
  const MoeShape shape = moe_shape_for(p, s.E, s.H, s.I, true);
  LayoutOptions o = options_of(p, DType::kBF16, s);
  MoeExperts x = test::random_moe_experts(rng, shape, {});
  drop_code_zero(x.w13, rng);
  drop_code_zero(x.w2, rng);
  int loads = 0;
  EXPECT_EQ(humming_decide_layer(o, shape, whole(x, &loads)).at("w13_b_dtype"), "float4e0m3");
  EXPECT_EQ(loads, 4);  // expert 0, then 2 at a time: every expert read
  // One code 0 in the LAST expert's w2 keeps w2 uint4 (a chunk alone would have recoded it).
  x.w2.codes.back() = 0;
  loads = 0;
  const auto d = humming_decide_layer(o, shape, whole(x, &loads));
  EXPECT_EQ(d.at("w13_b_dtype"), "float4e0m3");
  EXPECT_EQ(d.at("w2_b_dtype"), "uint4");
  // Code 0 in expert 0 of both: one load.
  x.w13.codes[0] = 0;
  x.w2.codes[0] = 0;
  loads = 0;
  const auto d0 = humming_decide_layer(o, shape, whole(x, &loads));
  EXPECT_EQ(loads, 1);
  EXPECT_EQ(d0.at("w13_b_dtype"), "uint4");
  // Chunks of the layer pack with the layer's decision: a chunk with a code 0 under a
  // float4e0m3 decision is refused, never silently recoded otherwise.
  o.layer_decisions = {{"w13_b_dtype", "float4e0m3"}, {"w2_b_dtype", "uint4"}};
  test::expect_error([&] { pack_humming_moe(o, x); }, ErrorCode::kBadValue);
  // No decision: refused, naming it.
  o.layer_decisions.clear();
  const Error e = test::expect_error([&] { pack_humming_moe(o, x); }, ErrorCode::kBadConfig);
  EXPECT_NE(e.tensor().find("w13_b_dtype"), std::string::npos);
  // A decision that is no b_dtype of these codes.
  o.layer_decisions = {{"w13_b_dtype", "uint8"}, {"w2_b_dtype", "uint4"}};
  test::expect_error([&] { pack_humming_moe(o, x); }, ErrorCode::kBadConfig);
}

TEST(Humming, LayerConfigAndSchemas) {
  const QuantParams p = params_of(QuantMethod::kCtPackQuantized, 8, 64, false, DType::kF16);
  const Shape3 s{2, 320, 96};
  const MoeShape shape = moe_shape_for(p, s.E, s.H, s.I, true);
  LayoutOptions o = options_of(p, DType::kF16, s);
  o.layer_decisions = {{"w13_b_dtype", "uint8"}, {"w2_b_dtype", "uint8"}};
  const nlohmann::json w13 =
      nlohmann::json::parse(humming_layer_config_json(o, shape, MoeProj::kW13));
  EXPECT_EQ(w13["sm_version"], 90);
  EXPECT_EQ(w13["shape_n"], 256);  // 2I = 192 -> 256
  EXPECT_EQ(w13["pad_shape_n"], 64);
  EXPECT_EQ(w13["shape_k"], 384);  // H = 320 -> 384
  EXPECT_EQ(w13["pad_shape_k"], 64);
  EXPECT_EQ(w13["b_dtype"], "uint8");
  EXPECT_EQ(w13["a_dtype"], "float16");
  EXPECT_EQ(w13["has_zero_point"], true);
  EXPECT_EQ(w13["weight_scale_group_size"], 64);
  const nlohmann::json w2 =
      nlohmann::json::parse(humming_layer_config_json(o, shape, MoeProj::kW2));
  EXPECT_EQ(w2["shape_n"], 512);
  EXPECT_EQ(w2["shape_k"], 128);
  EXPECT_EQ(w2["pad_shape_k"], 32);
  std::map<std::string, std::string> cfg;
  for (const auto& [k, v] : humming_layer_config(o, shape)) cfg[k] = v;
  EXPECT_EQ(cfg.at("kernel_package"), "humming-kernels");
  EXPECT_EQ(cfg.at("kernel_version"), "0.1.19");
  EXPECT_EQ(cfg.at("sm_version"), "90");
  EXPECT_TRUE(nlohmann::json::parse(cfg.at("w2_weight_schema"))["bs_dtype"].is_null());  // CT
  o.source_method = QuantMethod::kAwq;
  for (const auto& [k, v] : humming_layer_config(o, shape)) cfg[k] = v;
  EXPECT_EQ(nlohmann::json::parse(cfg.at("w2_weight_schema"))["bs_dtype"], "float16");
}

bool any_contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

TEST(Humming, RefusesWhatStockVllm033CannotRunOnHumming) {
  const Shape3 s{2, 256, 128};
  const auto reasons = [&](const QuantParams& p, LayoutOptions o, int64_t H = 256, int64_t I = 128,
                           bool act_order = false) {
    return humming_unsupported_reasons(
        o, moe_shape_for(p, s.E, H, I, true, act_order ? 1 : 0, act_order ? 1 : 0));
  };
  const QuantParams gptq = params_of(QuantMethod::kGptq, 4, 128, true, DType::kBF16);
  const LayoutOptions o = options_of(gptq, DType::kBF16, s);
  EXPECT_TRUE(reasons(gptq, o).empty());
  EXPECT_TRUE(any_contains(reasons(params_of(QuantMethod::kGptq, 4, -1, true, DType::kBF16), o),
                           "GPTQ channelwise"));
  LayoutOptions oct = o;
  oct.source_method = QuantMethod::kCtPackQuantized;
  EXPECT_TRUE(any_contains(
      reasons(params_of(QuantMethod::kCtPackQuantized, 4, -1, true, DType::kBF16), oct),
      "channel strategy"));
  EXPECT_TRUE(any_contains(reasons(gptq, o, 256, 128, true), "act-order"));
  EXPECT_TRUE(any_contains(reasons(gptq, o, 320, 128), "MoeWNA16Method"));  // H % 128
  EXPECT_TRUE(any_contains(reasons(gptq, o, 256, 96), "MoeWNA16Method"));   // I % 128
  EXPECT_TRUE(
      reasons(params_of(QuantMethod::kCtPackQuantized, 4, 32, true, DType::kBF16), oct, 320, 96)
          .empty());  // compressed-tensors goes through Humming and pads H
  EXPECT_TRUE(any_contains(reasons(params_of(QuantMethod::kGptq, 4, 16, true, DType::kBF16), o),
                           "group_size=16"));
  EXPECT_TRUE(any_contains(reasons(params_of(QuantMethod::kGptq, 4, 128, false, DType::kBF16), o),
                           "asymmetric GPTQ"));
  LayoutOptions spec = o;
  spec.vllm_target = VllmTarget::kV2026_05;
  EXPECT_TRUE(any_contains(reasons(gptq, spec), "no Humming MoE path"));
  LayoutOptions a8 = o;
  a8.a8 = true;
  EXPECT_TRUE(any_contains(reasons(gptq, a8), "8-bit activations"));
  // pack refuses with the same reasons.
  test::Rng rng(1);
  const QuantParams ch = params_of(QuantMethod::kGptq, 4, -1, true, DType::kBF16);
  const MoeExperts x = test::random_moe_experts(rng, moe_shape_for(ch, 1, 256, 128, true), {});
  LayoutOptions od = o;
  od.layer_decisions = {{"w13_b_dtype", "uint4"}, {"w2_b_dtype", "uint4"}};
  test::expect_error([&] { pack_humming_moe(od, x); }, ErrorCode::kUnsupported);
}

struct Packed {
  QuantParams p;
  Shape3 s;
  LayoutOptions o;
  MoeExperts x;
  TensorMap params;
};

Packed make_packed(const QuantParams& p, const Shape3& s, bool no_zero, uint64_t seed) {
  Packed k;
  k.p = p;
  k.s = s;
  test::Rng rng(seed);
  const MoeShape shape = moe_shape_for(p, s.E, s.H, s.I, true);
  k.o = options_of(p, p.dtype, s);
  k.x = test::random_moe_experts(rng, shape, {});
  if (no_zero) {
    drop_code_zero(k.x.w13, rng);
    drop_code_zero(k.x.w2, rng);
  }
  k.o.layer_decisions = humming_decide_layer(k.o, shape, whole(k.x));
  k.params = by_name(pack_humming_moe(k.o, k.x));
  return k;
}

TEST(Humming, CorruptedPaddingIsRefusedByUnpack) {
  const Packed k = make_packed(params_of(QuantMethod::kAwq, 4, 64, false, DType::kBF16),
                               {1, 384, 192}, false, 3);
  const std::string pre = k.o.prefix;
  for (const char* name :
       {"w13_weight", "w13_weight_scale", "w13_zero_point", "w2_weight", "w2_weight_scale"}) {
    TensorMap bad = k.params;
    auto& d = bad.at(pre + name).data;
    d[d.size() - 1] ^=
        0x10;  // the last tile / group / column: padding (N 384 -> 512, K 192 -> 256)
    const Error e = test::expect_error([&] { unpack_humming_moe(k.o, bad); }, ErrorCode::kBadValue);
    EXPECT_NE(e.message().find("padding"), std::string::npos) << name << ": " << e.message();
  }
  // int8 without zero point: padded codes are 255 after int2fp (bf16), 0 with fp16.
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const Packed k8 =
        make_packed(params_of(QuantMethod::kGptq, 8, 64, true, dt), {1, 128, 64}, false, 4);
    const std::vector<uint8_t>& w = k8.params.at(pre + "w13_weight").data;
    uint32_t last = 0;
    std::memcpy(&last, w.data() + w.size() - 4, 4);
    EXPECT_EQ(last, dt == DType::kBF16 ? 0xffffffffu : 0u);
  }
}

// A Marlin-minded Humming writer: per-half intermediate padding, interleaved zero points, no
// recode, no int2fp, single-permuted scales. Each must break the matmul through the reader.
TEST(Humming, MatmulCatchesLayoutMutants) {
  test::Rng rng(11);
  const std::string pre = "model.layers.0.mlp.experts.routed_experts.";
  // (a) I = 96 padded per half as Marlin does (gate 0..95, zeros, up 128..223): same shapes.
  {
    const Packed k = make_packed(params_of(QuantMethod::kGptq, 4, 32, true, DType::kBF16),
                                 {1, 128, 96}, false, 21);
    MoeExperts padded;
    const int64_t H = 128, I = 96, Ip = 128;
    padded.w13 = QuantTensor(k.x.w13.spec(), 1, 2 * Ip, H);
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t r = 0; r < I; ++r) {
        std::memcpy(&padded.w13.codes[(s * Ip + r) * H], &k.x.w13.codes[(s * I + r) * H], H);
        std::memcpy(&padded.w13.scales[(s * Ip + r) * (H / 32) * 2],
                    &k.x.w13.scales[(s * I + r) * (H / 32) * 2], (H / 32) * 2);
      }
    padded.w2 = k.x.w2;
    LayoutOptions om = k.o;
    om.inter = Ip;
    om.layer_decisions = {{"w13_b_dtype", "uint4"}, {"w2_b_dtype", "uint4"}};
    TensorMap bad = k.params;
    bad[pre + "w13_weight"] = by_name(pack_humming_moe(om,
                                                       [&] {
                                                         MoeExperts y = padded;
                                                         y.w2 =
                                                             QuantTensor(k.x.w2.spec(), 1, H, Ip);
                                                         return y;
                                                       }()))
                                  .at(pre + "w13_weight");
    bad[pre + "w13_weight_scale"] =
        by_name(pack_humming_moe(om,
                                 [&] {
                                   MoeExperts y = padded;
                                   y.w2 = QuantTensor(k.x.w2.spec(), 1, H, Ip);
                                   return y;
                                 }()))
            .at(pre + "w13_weight_scale");
    EXPECT_GT(reader_error(k.o, bad, k.x, MoeProj::kW13, 0, rng), 1e-2);
  }
  // (b) zero points interleaved like Marlin's (marlin_zero_points).
  {
    const Packed k = make_packed(params_of(QuantMethod::kAwq, 4, 64, false, DType::kBF16),
                                 {1, 256, 128}, false, 22);
    const int64_t Gp = 256 / 64, Np = 256;
    std::vector<uint8_t> zp(static_cast<size_t>(Gp * Np));
    for (int64_t n = 0; n < Np; ++n)
      for (int64_t g = 0; g < Gp; ++g) zp[g * Np + n] = k.x.w13.zeros[n * Gp + g];
    TensorMap bad = k.params;
    const auto words = marlin_pack_zero_points(zp.data(), Gp, Np, 4, false);
    std::memcpy(bad.at(pre + "w13_zero_point").data.data(), words.data(), words.size() * 4);
    EXPECT_GT(reader_error(k.o, bad, k.x, MoeProj::kW13, 0, rng), 1e-2);
  }
  // (c) a layer without code 0 written without the recode (offset binary under float4e0m3).
  {
    const Packed k = make_packed(params_of(QuantMethod::kGptq, 4, 128, true, DType::kBF16),
                                 {1, 256, 128}, true, 23);
    ASSERT_EQ(k.o.layer_decisions.at("w13_b_dtype"), "float4e0m3");
    LayoutOptions plain = k.o;
    plain.layer_decisions = {{"w13_b_dtype", "uint4"}, {"w2_b_dtype", "uint4"}};
    TensorMap bad = k.params;
    bad[pre + "w13_weight"] = by_name(pack_humming_moe(plain, k.x)).at(pre + "w13_weight");
    EXPECT_GT(reader_error(k.o, bad, k.x, MoeProj::kW13, 0, rng), 1e-2);
  }
  // (d) bf16 int8 written without int2fp (as fp16 activations would be).
  {
    const Packed k = make_packed(params_of(QuantMethod::kGptq, 8, 128, true, DType::kBF16),
                                 {1, 256, 128}, false, 24);
    LayoutOptions fp16 = k.o;
    fp16.act_dtype = DType::kF16;
    MoeExperts x16 = k.x;
    for (QuantTensor* q : {&x16.w13, &x16.w2}) {
      q->scales = convert_scales(q->scales, DType::kBF16, DType::kF16, "scales");
      q->scale_dtype = DType::kF16;
    }
    TensorMap bad = k.params;
    bad[pre + "w2_weight"] = by_name(pack_humming_moe(fp16, x16)).at(pre + "w2_weight");
    EXPECT_GT(reader_error(k.o, bad, k.x, MoeProj::kW2, 0, rng), 1e-2);
  }
  // (e) scales with the 32-entry (channelwise) permutation.
  {
    const Packed k = make_packed(params_of(QuantMethod::kGptq, 4, 32, true, DType::kBF16),
                                 {1, 256, 128}, false, 25);
    TensorMap bad = k.params;
    auto& s = bad.at(pre + "w2_weight_scale").data;
    marlin_unpermute_scales(s.data(), 128 / 32, 256, 2, true);
    marlin_permute_scales(s.data(), 128 / 32, 256, 2, false);
    EXPECT_GT(reader_error(k.o, bad, k.x, MoeProj::kW2, 0, rng), 1e-2);
  }
  // (f) one flipped weight byte moves the output.
  {
    const Packed k =
        make_packed(params_of(QuantMethod::kCtPackQuantized, 4, 128, true, DType::kBF16),
                    {1, 256, 128}, false, 26);
    TensorMap bad = k.params;
    bad.at(pre + "w13_weight").data[100] ^= 0x77;
    EXPECT_GT(reader_error(k.o, bad, k.x, MoeProj::kW13, 0, rng), 1e-4);
  }
}

}  // namespace
}  // namespace moepack
