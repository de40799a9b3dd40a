#include "formats/humming.h"

#include <algorithm>
#include <cstring>

#include "core/threads.h"
#include "formats/layout/marlin_layout.h"
#include "formats/marlin.h"
#include "formats/moe_reader.h"
#include "formats/wna16_util.h"

namespace moepack {
namespace {

// vLLM 0.33's _prepare_and_transform_sublayer: pad_n_to_multiple=256, pad_k_to_multiple=128.
constexpr int64_t kPadN = 256, kPadK = 128;

std::string num(int64_t v) {
  return std::to_string(v);
}

const char* proj_name(MoeProj p) {
  return p == MoeProj::kW13 ? "w13" : "w2";
}

int64_t round_up(int64_t a, int64_t m) {
  return (a + m - 1) / m * m;
}

// The vLLM targets that run Humming MoE, and the humming-kernels release each pins.
const char* humming_version_of(VllmTarget t) {
  return t == VllmTarget::kV0_33 ? kHummingKernelsVersion : nullptr;
}

// LayerConfig.sm_version of a target arch (DeviceInfo: major * 10 + minor).
int sm_version_of(TargetArch a) {
  switch (a) {
    case TargetArch::kSm80:
      return 80;
    case TargetArch::kSm89:
      return 89;
    case TargetArch::kSm90:
      return 90;
    case TargetArch::kSm100:
      return 100;
    default:
      return 120;
  }
}

bool is_wna16_method(QuantMethod m) {
  return m == QuantMethod::kGptq || m == QuantMethod::kAwq || m == QuantMethod::kCtPackQuantized;
}

std::string param(const LayoutOptions& o, MoeProj p, const char* what) {
  return o.prefix + proj_name(p) + "_" + what;
}

std::string decision_key(MoeProj p) {
  return std::string(proj_name(p)) + "_b_dtype";
}

// Whether projection p's codes are recoded to sign-magnitude: the layer's decision, checked to
// name a b_dtype of these bits that the projection can have (kBadConfig naming the key).
bool recoded_of(const LayoutOptions& o, MoeProj p, int bits, bool zero_points) {
  const std::string key = decision_key(p);
  const auto it = o.layer_decisions.find(key);
  if (it == o.layer_decisions.end())
    throw Error(ErrorCode::kBadConfig, "", "layout_decisions." + key,
                "no decision for " + key +
                    " (Humming's code recoding is decided once per layer over all its experts: "
                    "make_plan records it, moepack.json carries it)");
  if (it->second == humming_b_dtype_name(bits, false)) return false;
  if (it->second == humming_b_dtype_name(bits, true) && !zero_points) return true;
  throw Error(ErrorCode::kBadConfig, "", "layout_decisions." + key,
              "\"" + it->second + "\" is not a b_dtype of these " + num(bits) + "-bit " +
                  (zero_points ? "asymmetric codes (" : "symmetric codes (") +
                  humming_b_dtype_name(bits, false) +
                  (zero_points ? "" : " or " + humming_b_dtype_name(bits, true)) + ")");
}

// weight_repack_nk's int2fp preprocessing (transform.py should_preprocess_for_int2fp): integer
// codes with bf16 activations and more than 7 bits (6 with a zero point) -- 8-bit codes here.
bool int2fp_of(const LayoutOptions& o, int bits, bool recoded) {
  return !recoded && o.act_dtype == DType::kBF16 && bits > 7;
}

// Sign-magnitude of c - 2^(b-1) (c != 0) and its inverse (a negative zero reads as 2^(b-1)).
uint8_t to_sign_magnitude(uint8_t c, int bits) {
  const int half = 1 << (bits - 1), s = c - half;
  return static_cast<uint8_t>(s < 0 ? (-s) | half : s);
}
uint8_t from_sign_magnitude(uint8_t c, int bits) {
  const int half = 1 << (bits - 1), mag = c & (half - 1);
  return static_cast<uint8_t>(c & half ? half - mag : half + mag);
}
// int2fp and its inverse for zero code z (max = 2^b - 1): the two ranges [0, max - z] and
// (max - z, max] do not overlap, so every stored value decodes to one code.
uint8_t to_int2fp(uint8_t c, int z, int max) {
  return static_cast<uint8_t>(c >= z ? c - z : max - c);
}
uint8_t from_int2fp(uint8_t c, int z, int max) {
  return static_cast<uint8_t>(c <= max - z ? c + z : max - c);
}

// One projection's extents: real and as the parameters carry them.
struct Geom {
  int64_t n = 0, k = 0, np = 0, kp = 0, g = 0, groups = 0, groups_p = 0;
};
Geom geom_of(int64_t n, int64_t k, int64_t group_size) {
  Geom x;
  x.n = n;
  x.k = k;
  x.np = round_up(n, kPadN);
  x.kp = round_up(k, kPadK);
  x.g = group_size;
  x.groups = group_size > 0 ? k / group_size : 1;
  x.groups_p = group_size > 0 ? x.kp / group_size : 1;
  return x;
}

const char* act_dtype_name(DType d) {
  return d == DType::kF16 ? "float16" : "bfloat16";
}

void add_method_reasons(const LayoutOptions& opts, const MoeShape& x,
                        std::vector<std::string>& why) {
  const QuantMethod m = opts.source_method;
  const int64_t H = x.hidden(), I = x.inter(), g = x.w13.quant.group_size;
  if (g == -1 && m == QuantMethod::kGptq)
    why.push_back(
        "GPTQ channelwise scales (group_size -1): vLLM 0.33's Humming path fails on them "
        "(LayerConfig asserts weight_scale_group_size > 0 for GROUP scales), so stock vLLM 0.33 "
        "cannot load this layer on SM90");
  if (g == -1 && m == QuantMethod::kCtPackQuantized)
    why.push_back(
        "compressed-tensors channel strategy: vLLM 0.33's CompressedTensorsWNA16MoEMethod asserts "
        "strategy == \"group\" for every backend but Marlin");
  if (g == -1 && m == QuantMethod::kAwq) why.push_back("AWQ MoE needs a real group size");
  if (g > 0 && g != 32 && g != 64 && g != 128)
    why.push_back("group_size=" + num(g) +
                  ": moepack's Humming layout takes 32, 64 and 128 (the group sizes checked "
                  "against humming-kernels 0.1.19's own transform)");
  if (m == QuantMethod::kGptq || m == QuantMethod::kAwq) {
    // AutoGPTQConfig / AutoAWQConfig.get_quant_method: check_moe_marlin_supports_config with
    // tile padding, else MoeWNA16Method (whose Humming adapter skips the recode).
    if (H % 128 != 0 || (g > 0 && I % g != 0))
      why.push_back(std::string("vLLM 0.33 loads this ") + quant_method_name(m) +
                    " layer through MoeWNA16Method (its Marlin check needs H % 128 == 0 and I % "
                    "group_size == 0; H=" +
                    num(H) + ", I=" + num(I) + "), whose Humming adapter moepack does not write");
  } else if (g > 0 && (H % g != 0 || I % g != 0)) {
    why.push_back("H=" + num(H) + " and I=" + num(I) + " must be multiples of group_size=" +
                  num(g) + " (CompressedTensorsWNA16MoEMethod.create_weights)");
  }
  if (m == QuantMethod::kGptq && !x.w13.quant.symmetric)
    why.push_back("asymmetric GPTQ: vLLM 0.33 takes symmetric GPTQ only (AutoGPTQConfig.TYPE_MAP)");
  if (m == QuantMethod::kAwq && x.w13.quant.symmetric)
    why.push_back("AWQ without zero points: vLLM's AWQ MoE takes zero_point checkpoints");
  if (m == QuantMethod::kAwq && x.w13.quant.bits != 4)
    why.push_back("AWQ MoE is 4-bit only (AutoAWQMoEMethod), bits=" + num(x.w13.quant.bits));
}

}  // namespace

std::string humming_b_dtype_name(int bits, bool recoded) {
  return recoded ? "float" + num(bits) + "e0m" + num(bits - 1) : "uint" + num(bits);
}

// ---- reasons, specs, deviations ----------------------------------------------------------------

std::vector<std::string> humming_unsupported_reasons(const LayoutOptions& opts, const MoeShape& x) {
  std::vector<std::string> why = moe_shape_problems(opts, x);
  if (!why.empty()) return why;
  const VllmTargetRow& target = vllm_target_row(opts.vllm_target);
  if (!humming_version_of(opts.vllm_target))
    why.push_back(std::string(target.follows) +
                  " has no Humming MoE path (vLLM 0.33.0 pins humming-kernels 0.1.19; "
                  "--vllm-target 0.33)");
  if (sm_version_of(opts.target_arch) != kHummingSmVersion)
    why.push_back(
        std::string("moepack writes Humming's layout for sm90 only (the LayerConfig names "
                    "the exact SM, and only sm90 is checked against humming-kernels "
                    "0.1.19's own transform); target is ") +
        target_arch_name(opts.target_arch));
  if (!is_wna16_method(opts.source_method))
    why.push_back(std::string("source method ") + quant_method_name(opts.source_method) +
                  " has no Humming WNA16 MoE path (GPTQ, AWQ and compressed-tensors "
                  "pack-quantized do)");
  if (opts.act_dtype != DType::kF16 && opts.act_dtype != DType::kBF16)
    why.push_back(std::string("activation dtype ") + dtype_name(opts.act_dtype) +
                  " (Humming WNA16 takes F16 or BF16)");
  if (opts.a8)
    why.push_back(
        "8-bit activations: vLLM 0.33 runs Humming WNA16 with 16-bit activations unless "
        "VLLM_HUMMING_INPUT_QUANT_CONFIG asks otherwise; moepack writes that default layout");
  for (const ProjShape* s : {&x.w13, &x.w2}) {
    const std::string p = s == &x.w13 ? "w13" : "w2";
    const QuantSpec& q = s->quant;
    if (q.kind != CodeKind::kUint) why.push_back(p + ": codes are not unsigned integer codes");
    if (q.bits != 4 && q.bits != 8) why.push_back(p + ": bits=" + num(q.bits) + " (Humming: 4, 8)");
    if (q.scale_block_n != 1)
      why.push_back(p + ": scales shared by " + num(q.scale_block_n) + " rows");
    if (!wna16::is_float_scale_dtype(q.scale_dtype))
      why.push_back(p + std::string(": scale dtype ") + dtype_name(q.scale_dtype));
  }
  if (x.w13.quant.bits != x.w2.quant.bits || x.w13.quant.group_size != x.w2.quant.group_size ||
      x.w13.quant.symmetric != x.w2.quant.symmetric)
    why.push_back("w13 and w2 differ in bits/group_size/symmetry");
  if (x.w13.act_order || x.w2.act_order)
    why.push_back(std::string("act-order (GPTQ desc_act / compressed-tensors actorder group): ") +
                  target.follows + " takes no act-order MoE checkpoints");
  if (is_wna16_method(opts.source_method)) add_method_reasons(opts, x, why);
  return why;
}

std::vector<ParamSpec> humming_param_specs(const LayoutOptions& opts, const MoeShape& x) {
  std::vector<ParamSpec> out;
  const int64_t E = x.experts;
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2}) {
    const ProjShape& s = p == MoeProj::kW13 ? x.w13 : x.w2;
    const Geom gm = geom_of(s.n, s.k, s.quant.group_size);
    const int b = s.quant.bits;
    out.push_back({param(opts, p, "weight"),
                   DType::kI32,
                   {E, gm.kp / 16, gm.np * 16 * b / 32},
                   param_role_of(p, ParamRole::kW13Weight)});
    out.push_back({param(opts, p, "weight_scale"),
                   opts.act_dtype,
                   {E, gm.groups_p, gm.np},
                   param_role_of(p, ParamRole::kW13Scale)});
    if (!s.quant.symmetric)
      out.push_back({param(opts, p, "zero_point"),
                     DType::kI32,
                     {E, gm.groups_p, gm.np * b / 32},
                     param_role_of(p, ParamRole::kW13Zero)});
  }
  return out;
}

std::vector<std::string> humming_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  // The bytes and the LayerConfig are vLLM 0.33's: at tensor_parallel_size 1 without expert
  // parallelism the recode decision over all experts is vLLM's own, and for a parallel output
  // make_plan decides per rank over the rank's share, as each rank of vLLM does.
  return {};
}

// ---- the layer decision and configuration ------------------------------------------------------

std::map<std::string, std::string> humming_decide_layer(const LayoutOptions&, const MoeShape& x,
                                                        const LayerExperts& layer) {
  const int b13 = x.w13.quant.bits, b2 = x.w2.quant.bits;
  // Only symmetric codes are recoded (an integer zero point keeps offset binary).
  bool zero_seen[2] = {!x.w13.quant.symmetric, !x.w2.quant.symmetric};
  const int64_t step = std::max<int64_t>(1, layer.max_per_load);
  // Expert 0 alone first: a real checkpoint holds a code 0 in both projections almost surely
  // there, so the usual cost is one expert.
  for (int64_t e = 0; e < layer.experts && !(zero_seen[0] && zero_seen[1]);) {
    const int64_t end = std::min(layer.experts, e == 0 ? 1 : e + step);
    const MoeExperts chunk = layer.load(e, end);
    const QuantTensor* q[2] = {&chunk.w13, &chunk.w2};
    for (int i = 0; i < 2; ++i)
      if (!zero_seen[i])
        zero_seen[i] = std::find(q[i]->codes.begin(), q[i]->codes.end(), 0) != q[i]->codes.end();
    e = end;
  }
  return {{decision_key(MoeProj::kW13), humming_b_dtype_name(b13, !zero_seen[0])},
          {decision_key(MoeProj::kW2), humming_b_dtype_name(b2, !zero_seen[1])}};
}

std::string humming_layer_config_json(const LayoutOptions& opts, const MoeShape& x, MoeProj p) {
  const ProjShape& s = p == MoeProj::kW13 ? x.w13 : x.w2;
  const Geom gm = geom_of(s.n, s.k, s.quant.group_size);
  const bool zp = !s.quant.symmetric;
  const std::string act = act_dtype_name(opts.act_dtype);
  const auto str = [](const std::string& v) { return "\"" + v + "\""; };
  const auto boolean = [](bool v) { return std::string(v ? "true" : "false"); };
  // LayerConfig's fields in declaration order, json.dumps' default separators (humming/config/
  // base.py BaseHummingConfig.to_str).
  const std::vector<std::pair<const char*, std::string>> fields = {
      {"sm_version", num(sm_version_of(opts.target_arch))},
      {"shape_n", num(gm.np)},
      {"shape_k", num(gm.kp)},
      {"pad_shape_n", num(gm.np - gm.n)},
      {"pad_shape_k", num(gm.kp - gm.k)},
      {"num_experts", num(x.experts)},
      {"b_dtype", str(humming_b_dtype_name(s.quant.bits, recoded_of(opts, p, s.quant.bits, zp)))},
      {"a_dtype", str(act)},
      {"c_dtype", str(act)},
      {"bs_dtype", str(act)},
      {"as_dtype", "null"},
      {"input_quant_mode", str("none")},
      {"input_scale_group_size", "0"},
      {"weight_scale_group_size", num(s.quant.group_size)},
      {"weight_scale_group_size_n", "0"},
      {"weight_scale_type", str("group")},
      {"weight_scale_2_type", str("none")},
      {"use_int_weight_scale", boolean(false)},
      {"use_fused_e8m0_scale", boolean(false)},
      {"has_zero_point", boolean(zp)},
      {"is_fp_zero_point", boolean(false)},
      {"has_bias", boolean(false)},
      {"use_packed_k_layout", boolean(false)},
  };
  std::string out = "{";
  for (const auto& [k, v] : fields)
    out += (out.size() > 1 ? ", \"" : "\"") + std::string(k) + "\": " + v;
  return out + "}";
}

std::vector<std::pair<std::string, std::string>> humming_layer_config(const LayoutOptions& opts,
                                                                      const MoeShape& x) {
  std::vector<std::pair<std::string, std::string>> out = {
      {"kernel_package", kHummingKernelsPackage},
      {"kernel_version",
       humming_version_of(opts.vllm_target) ? humming_version_of(opts.vllm_target) : "none"},
      {"sm_version", num(sm_version_of(opts.target_arch))}};
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2})
    out.push_back(
        {std::string(proj_name(p)) + "_layer_config", humming_layer_config_json(opts, x, p)});
  // The final HummingWeightSchema per sublayer: GPTQ and AWQ name the params dtype as bs_dtype
  // (to_humming_schema), compressed-tensors leaves it None.
  const std::string bs = opts.source_method == QuantMethod::kCtPackQuantized
                             ? "null"
                             : "\"" + std::string(act_dtype_name(opts.act_dtype)) + "\"";
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2}) {
    const ProjShape& s = p == MoeProj::kW13 ? x.w13 : x.w2;
    const bool zp = !s.quant.symmetric;
    out.push_back({std::string(proj_name(p)) + "_weight_schema",
                   "{\"b_dtype\": \"" +
                       humming_b_dtype_name(s.quant.bits, recoded_of(opts, p, s.quant.bits, zp)) +
                       "\", \"bs_dtype\": " + bs +
                       ", \"weight_scale_group_size\": " + num(s.quant.group_size) +
                       ", \"weight_scale_group_size_n\": 0, \"weight_scale_type\": \"group\", "
                       "\"weight_scale_2_type\": \"none\", \"has_zero_point\": " +
                       (zp ? "true" : "false") +
                       ", \"is_fp_zero_point\": false, \"hadamard_block_size\": 0}"});
  }
  out.push_back({"input_schema", "{}"});
  return out;
}

// ---- pack
// ----------------------------------------------------------------------------------------

namespace {

// One expert of one projection: the padded [Np, Kp] codes the tiles hold.
std::vector<uint8_t> tile_codes(const QuantTensor& q, const Geom& gm, int64_t e, bool recoded,
                                bool int2fp, const std::string& what) {
  const int b = q.bits, max = (1 << b) - 1;
  const int64_t N = gm.n, K = gm.k, G = gm.groups;
  std::vector<uint8_t> c(static_cast<size_t>(gm.np * gm.kp), 0);
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* src = q.codes.data() + (e * N + n) * K;
    uint8_t* dst = c.data() + n * gm.kp;
    if (!recoded) {
      std::memcpy(dst, src, static_cast<size_t>(K));
      continue;
    }
    for (int64_t k = 0; k < K; ++k) {
      if (src[k] == 0)
        throw Error(ErrorCode::kBadValue, "", what,
                    "expert " + num(e) + " has code 0 at (n=" + num(n) + ", k=" + num(k) +
                        "), but the layer's decision " + humming_b_dtype_name(b, true) +
                        " holds only for a projection without code 0");
      dst[k] = to_sign_magnitude(src[k], b);
    }
  }
  if (!int2fp) return c;
  // After padding: padded rows and groups have zero code 0 (asymmetric) or 2^(b-1).
  for (int64_t n = 0; n < gm.np; ++n)
    for (int64_t k = 0; k < gm.kp; ++k) {
      int z = 1 << (b - 1);
      if (!q.symmetric) {
        const int64_t grp = k / gm.g;
        z = n < N && grp < G ? q.zeros[static_cast<size_t>((e * N + n) * G + grp)] : 0;
      }
      uint8_t& v = c[static_cast<size_t>(n * gm.kp + k)];
      v = to_int2fp(v, z, max);
    }
  return c;
}

void pack_projection(const LayoutOptions& opts, const QuantTensor& q, MoeProj p,
                     std::vector<Tensor>& out) {
  const Geom gm = geom_of(q.n, q.k, q.group_size);
  const int b = q.bits;
  const int64_t E = q.experts, N = q.n, G = gm.groups, Np = gm.np, Gp = gm.groups_p;
  const bool recoded = recoded_of(opts, p, b, !q.symmetric);
  const bool int2fp = int2fp_of(opts, b, recoded);
  Tensor weight(param(opts, p, "weight"), DType::kI32, {E, gm.kp / 16, Np * 16 * b / 32});
  Tensor scale(param(opts, p, "weight_scale"), opts.act_dtype, {E, Gp, Np});
  Tensor zero;
  if (!q.symmetric) zero = Tensor(param(opts, p, "zero_point"), DType::kI32, {E, Gp, Np * b / 32});
  const size_t wbytes = weight.data.size() / static_cast<size_t>(E);
  parallel_for(E, opts.threads, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const std::vector<uint8_t> c = tile_codes(q, gm, e, recoded, int2fp, weight.name);
      const std::vector<uint32_t> words = marlin_repack(c.data(), Np, gm.kp, b, nullptr, false);
      std::memcpy(weight.data.data() + e * wbytes, words.data(), wbytes);
      // Scales: [N, G] -> the activation dtype, padded with 0 to [Gp, Np], 64-permuted.
      std::vector<uint8_t> s(static_cast<size_t>(Gp * Np * 2), 0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < G; ++g)
          convert_scale(q.scales.data() + ((e * N + n) * G + g) * q.scale_bytes(), q.scale_dtype,
                        opts.act_dtype, s.data() + (g * Np + n) * 2, scale.name);
      marlin_permute_scales(s.data(), Gp, Np, 2, true);
      std::memcpy(scale.data.data() + e * Gp * Np * 2, s.data(), s.size());
      if (q.symmetric) continue;
      // Zero points: [N, G] codes padded with 0 to [Gp, Np], 64-permuted, packed in order.
      std::vector<uint8_t> z(static_cast<size_t>(Gp * Np), 0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < G; ++g) z[g * Np + n] = q.zeros[(e * N + n) * G + g];
      marlin_permute_scales(z.data(), Gp, Np, 1, true);
      const int per = 32 / b;
      uint8_t* dst = zero.data.data() + e * Gp * Np * b / 8;
      for (int64_t w = 0; w < Gp * Np / per; ++w) {
        uint32_t word = 0;
        for (int i = 0; i < per; ++i) word |= static_cast<uint32_t>(z[w * per + i]) << (b * i);
        wna16::store_u32(dst + 4 * w, word);
      }
    }
  });
  out.push_back(std::move(weight));
  out.push_back(std::move(scale));
  if (!q.symmetric) out.push_back(std::move(zero));
}

}  // namespace

std::vector<Tensor> pack_humming_moe(const LayoutOptions& opts, const MoeExperts& x) {
  x.w13.check_consistent("w13");
  x.w2.check_consistent("w2");
  const std::vector<std::string> why = humming_unsupported_reasons(opts, moe_shape_of(x));
  if (!why.empty()) {
    std::string msg;
    for (const auto& w : why) msg += (msg.empty() ? "" : "; ") + w;
    throw Error(ErrorCode::kUnsupported, "", opts.prefix + "w13_weight", "Humming MoE: " + msg);
  }
  std::vector<Tensor> out;
  pack_projection(opts, x.w13, MoeProj::kW13, out);
  pack_projection(opts, x.w2, MoeProj::kW2, out);
  return out;
}

// ---- reading
// -------------------------------------------------------------------------------------

namespace {

struct ProjTensors {
  const Tensor* weight = nullptr;
  const Tensor* scale = nullptr;
  const Tensor* zero = nullptr;
};

// The parameters of projection p, their dtypes and ranks checked; the zero points' presence.
ProjTensors proj_tensors(const LayoutOptions& opts, const TensorMap& params, MoeProj p) {
  ProjTensors t;
  const std::string wn = param(opts, p, "weight"), sn = param(opts, p, "weight_scale"),
                    zn = param(opts, p, "zero_point");
  t.weight = &require_tensor(params, wn);
  t.scale = &require_tensor(params, sn);
  t.zero = find_tensor(params, zn);
  wna16::expect_dtype(*t.weight, wn, {DType::kI32});
  if (t.weight->shape.size() != 3)
    throw Error(ErrorCode::kBadShape, "", wn,
                "shape " + shape_str(t.weight->shape) + ", expected [E, Kp/16, Np*16*bits/32]");
  if (t.scale->dtype != opts.act_dtype)
    throw Error(ErrorCode::kBadDtype, "", sn,
                std::string("dtype ") + dtype_name(t.scale->dtype) +
                    ", Humming reads scales in the activation dtype " + dtype_name(opts.act_dtype));
  if (t.scale->shape.size() != 3)
    throw Error(ErrorCode::kBadShape, "", sn,
                "shape " + shape_str(t.scale->shape) + ", expected [E, Gp, Np]");
  if (t.zero) wna16::expect_dtype(*t.zero, zn, {DType::kI32});
  return t;
}

// The real size of a padded extent: `want` (the layer's, from the options) when given, else the
// padded one; kBadShape unless rounding it up gives the parameters' extent.
int64_t real_extent(int64_t want, int64_t padded, int64_t multiple, const std::string& what,
                    const std::string& name) {
  const int64_t real = want > 0 ? want : padded;
  if (padded <= 0 || round_up(real, multiple) != padded)
    throw Error(ErrorCode::kBadShape, "", name,
                what + "=" + num(real) + " pads to " + num(round_up(real, multiple)) +
                    " (Humming pads to a multiple of " + num(multiple) +
                    "), the parameters carry " + num(padded));
  return real;
}

}  // namespace

HummingLayerView humming_read_layer(const LayoutOptions& opts, const TensorMap& params) {
  if (opts.act_dtype != DType::kF16 && opts.act_dtype != DType::kBF16)
    throw Error(
        ErrorCode::kUnsupported, "", opts.prefix + "w13_weight",
        std::string("Humming activations are F16 or BF16, got ") + dtype_name(opts.act_dtype));
  const ProjTensors t[2] = {proj_tensors(opts, params, MoeProj::kW13),
                            proj_tensors(opts, params, MoeProj::kW2)};
  HummingLayerView L;
  L.experts = t[0].weight->shape[0];
  L.zero_points = t[0].zero != nullptr;
  const std::string w2n = param(opts, MoeProj::kW2, "weight");
  // Bits from w2's word count per row of 16 K-values: Np * 16 * bits / 32.
  const int64_t np2 = t[1].scale->shape[2], x2 = t[1].weight->shape[2];
  if (np2 <= 0 || (x2 != np2 * 2 && x2 != np2 * 4))
    throw Error(ErrorCode::kBadShape, "", w2n,
                "shape " + shape_str(t[1].weight->shape) + " with Np=" + num(np2) +
                    " implies no 4- or 8-bit packing");
  L.bits = x2 == np2 * 2 ? 4 : 8;
  const int64_t kp13 = t[0].weight->shape[1] * 16, kp2 = t[1].weight->shape[1] * 16;
  L.hidden = real_extent(opts.hidden, kp13, kPadK, "H", param(opts, MoeProj::kW13, "weight"));
  real_extent(L.hidden, np2, kPadN, "H", w2n);
  L.inter = real_extent(opts.inter, kp2, kPadK, "I", w2n);
  const int64_t n13 = (opts.gated ? 2 : 1) * L.inter;
  const int64_t gp13 = t[0].scale->shape[1];
  if (gp13 <= 0 || kp13 % gp13 != 0)
    throw Error(ErrorCode::kBadShape, "", param(opts, MoeProj::kW13, "weight_scale"),
                "Gp=" + num(gp13) + " groups do not divide Kp=" + num(kp13));
  L.group_size = kp13 / gp13;
  for (int i = 0; i < 2; ++i) {
    const MoeProj p = i == 0 ? MoeProj::kW13 : MoeProj::kW2;
    HummingLayerView::Proj& v = L.proj[i];
    v.n = i == 0 ? n13 : L.hidden;
    v.k = i == 0 ? L.hidden : L.inter;
    const Geom gm = geom_of(v.n, v.k, L.group_size);
    if (v.k % L.group_size != 0)
      throw Error(ErrorCode::kBadShape, "", param(opts, p, "weight_scale"),
                  "K=" + num(v.k) + " is not a multiple of group_size=" + num(L.group_size));
    v.np = gm.np;
    v.kp = gm.kp;
    v.groups = gm.groups;
    v.groups_p = gm.groups_p;
    const int64_t E = L.experts, b = L.bits;
    wna16::expect_shape(*t[i].weight, param(opts, p, "weight"), {E, v.kp / 16, v.np * 16 * b / 32},
                        "Humming tiles of the padded [Np, Kp]");
    wna16::expect_shape(*t[i].scale, param(opts, p, "weight_scale"), {E, v.groups_p, v.np});
    if ((t[i].zero != nullptr) != L.zero_points)
      throw Error(ErrorCode::kMissingTensor, "", param(opts, p, "zero_point"),
                  "w13 and w2 must both have zero points or neither");
    if (t[i].zero)
      wna16::expect_shape(*t[i].zero, param(opts, p, "zero_point"), {E, v.groups_p, v.np * b / 32});
    v.recoded = recoded_of(opts, p, L.bits, L.zero_points);
    v.int2fp = int2fp_of(opts, L.bits, v.recoded);
  }
  const QuantMethod m = opts.source_method;
  if (m == QuantMethod::kAwq && !L.zero_points)
    throw Error(ErrorCode::kMissingTensor, "", param(opts, MoeProj::kW13, "zero_point"),
                "AWQ Humming parameters carry zero points");
  if (m == QuantMethod::kGptq && L.zero_points)
    throw Error(ErrorCode::kBadShape, "", param(opts, MoeProj::kW13, "zero_point"),
                "GPTQ Humming parameters carry no zero points (vLLM 0.33's GPTQ is symmetric)");
  return L;
}

reader::ActQuant humming_act_quant(const LayoutOptions& lo) {
  return act_quant_16bit(lo);
}

reader::ProjReader humming_make_reader(const LayoutOptions& lo, const TensorMap& params,
                                       MoeProj proj, const ParamLocator& locate) {
  const HummingLayerView L = humming_read_layer(lo, params);
  const HummingLayerView::Proj& v = L.proj[proj == MoeProj::kW13 ? 0 : 1];
  reader::ProjReader r = blank_reader(reader::Kind::kHumming, humming_act_quant(lo));
  r.experts = L.experts;
  r.n = v.n;
  r.k = v.k;
  reader::HummingParams& h = r.humming;
  h.weight = static_cast<const uint32_t*>(locate_param(locate, params, param(lo, proj, "weight")));
  h.scales =
      static_cast<const uint16_t*>(locate_param(locate, params, param(lo, proj, "weight_scale")));
  if (L.zero_points)
    h.zeros =
        static_cast<const uint32_t*>(locate_param(locate, params, param(lo, proj, "zero_point")));
  h.bits = L.bits;
  h.code_map = v.recoded  ? reader::kHummingSignMagnitude
               : v.int2fp ? reader::kHummingInt2fp
                          : reader::kHummingOffsetBinary;
  h.scale_type = lo.act_dtype == DType::kBF16 ? reader::kScaleBf16 : reader::kScaleF16;
  h.kp = v.kp;
  h.np = v.np;
  h.groups_p = v.groups_p;
  h.group_size = L.group_size;
  h.tiles_n = v.np / 64;
  h.words_per_expert = v.kp * v.np * L.bits / 32;
  return r;
}

// ---- unpack
// --------------------------------------------------------------------------------------

namespace {

// The padding pack writes, checked: anything else would reach the output through the padded
// channels or groups (a NaN scale times a zero activation) or is not what vLLM leaves.
void padding_error(const std::string& what, int64_t e, const std::string& where) {
  throw Error(ErrorCode::kBadValue, "", what,
              "expert " + num(e) + ": the padding (" + where +
                  ") is not what Humming's transform writes (zero codes, scales and zero points)");
}

// Logical zero codes [Gp, Np] of expert e: unpacked in order, then the 64-permutation undone.
std::vector<uint8_t> zero_codes(const Tensor& zero, const HummingLayerView::Proj& v, int bits,
                                int64_t e) {
  const int64_t Np = v.np, Gp = v.groups_p;
  const int per = 32 / bits;
  std::vector<uint8_t> z(static_cast<size_t>(Gp * Np));
  const uint8_t* src = zero.data.data() + e * Gp * Np * bits / 8;
  for (int64_t w = 0; w < Gp * Np / per; ++w) {
    const uint32_t word = wna16::load_u32(src + 4 * w);
    for (int i = 0; i < per; ++i)
      z[w * per + i] = static_cast<uint8_t>((word >> (bits * i)) & ((1u << bits) - 1u));
  }
  marlin_unpermute_scales(z.data(), Gp, Np, 1, true);
  return z;
}

// Expert e of one projection back to canonical codes, scales and zero points.
void unpack_expert(const HummingLayerView& L, const HummingLayerView::Proj& v, const Tensor& weight,
                   const Tensor& scale, const Tensor* zero, int64_t e, QuantTensor& q) {
  const int b = L.bits, max = (1 << b) - 1, half = 1 << (b - 1);
  const int64_t N = v.n, K = v.k, G = v.groups, Np = v.np, Kp = v.kp, Gp = v.groups_p;
  const std::vector<uint8_t> c =
      marlin_unrepack(weight.as<uint32_t>() + e * (Kp * Np * b / 32), Np, Kp, b, false);
  const std::vector<uint8_t> z = zero ? zero_codes(*zero, v, b, e) : std::vector<uint8_t>();
  // A padded code is 0, or after int2fp 0 -> 2^b - 1 (no zero point) / 0 (zero point 0).
  const uint8_t pad_code = v.int2fp && !zero ? static_cast<uint8_t>(max) : 0;
  for (int64_t n = 0; n < Np; ++n)
    for (int64_t k = 0; k < Kp; ++k) {
      uint8_t code = c[static_cast<size_t>(n * Kp + k)];
      if (n >= N || k >= K) {
        if (code != pad_code) padding_error(weight.name, e, "n=" + num(n) + ", k=" + num(k));
        continue;
      }
      if (v.recoded) code = from_sign_magnitude(code, b);
      if (v.int2fp) code = from_int2fp(code, zero ? z[(k / L.group_size) * Np + n] : half, max);
      q.codes[static_cast<size_t>((e * N + n) * K + k)] = code;
    }
  std::vector<uint8_t> s(scale.data.begin() + e * Gp * Np * 2,
                         scale.data.begin() + (e + 1) * Gp * Np * 2);
  marlin_unpermute_scales(s.data(), Gp, Np, 2, true);
  for (int64_t g = 0; g < Gp; ++g)
    for (int64_t n = 0; n < Np; ++n) {
      const uint8_t* sp = &s[static_cast<size_t>((g * Np + n) * 2)];
      if (n >= N || g >= G) {
        if (sp[0] || sp[1] || (zero && z[g * Np + n]))
          padding_error(scale.name, e, "group " + num(g) + ", n=" + num(n));
        continue;
      }
      std::memcpy(&q.scales[static_cast<size_t>(((e * N + n) * G + g) * 2)], sp, 2);
      if (zero) q.zeros[static_cast<size_t>((e * N + n) * G + g)] = z[g * Np + n];
    }
}

}  // namespace

MoeExperts unpack_humming_moe(const LayoutOptions& opts, const TensorMap& params) {
  const HummingLayerView L = humming_read_layer(opts, params);
  MoeExperts out;
  for (int i = 0; i < 2; ++i) {
    const MoeProj p = i == 0 ? MoeProj::kW13 : MoeProj::kW2;
    const HummingLayerView::Proj& v = L.proj[i];
    QuantSpec spec;
    spec.kind = CodeKind::kUint;
    spec.bits = L.bits;
    spec.group_size = L.group_size;
    spec.symmetric = !L.zero_points;
    spec.scale_dtype = opts.act_dtype;
    QuantTensor& q = i == 0 ? out.w13 : out.w2;
    q = QuantTensor(spec, L.experts, v.n, v.k);
    const Tensor& weight = require_tensor(params, param(opts, p, "weight"));
    const Tensor& scale = require_tensor(params, param(opts, p, "weight_scale"));
    const Tensor* zero = find_tensor(params, param(opts, p, "zero_point"));
    parallel_for(L.experts, opts.threads, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) unpack_expert(L, v, weight, scale, zero, e, q);
    });
  }
  return out;
}

}  // namespace moepack
