// vLLM 0.33's Marlin layouts for float experts (formats/marlin_float.h, docs/marlin_float.md): the
// int Marlin tile map on raw float codes, the family's scale transform, vLLM's intermediate
// padding. One implementation parameterised by the family; each row's functions pass theirs.
#include "formats/marlin_float.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "core/threads.h"
#include "formats/fp8.h"
#include "formats/layout/marlin_layout.h"
#include "formats/marlin.h"
#include "formats/moe_reader.h"
#include "formats/wna16_util.h"

namespace moepack {
namespace {

// The families of bytes, one per row; marlin-fp8 has two: block scales (kFp8) and one scale per
// output channel or per tensor (kFp8Scaled), which differ in the scale grouping and the padding;
// marlin-mxfp4 has two: compressed-tensors MXFP4 (prepare_moe_fp4_layer_for_marlin) and gpt-oss'
// (GptOssMxfp4MoEMethod's MARLIN backend: prepare_moe_mxfp4_layer_for_marlin on the loader's
// padded, interleaved w13, with the biases).
enum class Family { kFp8, kFp8Scaled, kMxfp8, kNvfp4, kMxfp4, kGptOss };

struct FamilyInfo {
  const char* layout;  // the row's name
  const char* what;    // in messages
  int bits;            // code width in the tiles
};
FamilyInfo info(Family f) {
  switch (f) {
    case Family::kFp8:
      return {"marlin-fp8", "FP8", 8};
    case Family::kFp8Scaled:
      return {"marlin-fp8", "FP8 channel / per-tensor", 8};
    case Family::kMxfp8:
      return {"marlin-mxfp8", "MXFP8", 8};
    case Family::kNvfp4:
      return {"marlin-nvfp4", "NVFP4", 4};
    case Family::kGptOss:
      return {"marlin-mxfp4", "gpt-oss MXFP4", 4};
    default:
      return {"marlin-mxfp4", "MXFP4", 4};
  }
}
// The FP8 families: e4m3 codes, scales in the activation dtype with the fused exponent bias.
bool is_fp8(Family f) {
  return f == Family::kFp8 || f == Family::kFp8Scaled;
}
// compressed-tensors FP8 tensor and ModelOpt FP8: one scale per Linear, w13 requantised to one
// per expert (process_fp8_weight_tensor_strategy_moe).
bool is_per_tensor(QuantMethod m) {
  return m == QuantMethod::kCtFp8Tensor || m == QuantMethod::kModeloptFp8;
}
// marlin-fp8's family for a source method.
Family fp8_family(QuantMethod m) {
  return m == QuantMethod::kCtFp8Channel || is_per_tensor(m) ? Family::kFp8Scaled : Family::kFp8;
}
bool is_fp4(Family f) {
  return f == Family::kNvfp4 || f == Family::kMxfp4 || f == Family::kGptOss;
}
// Families whose scales are E8M0 codes.
bool is_mx(Family f) {
  return f == Family::kMxfp8 || f == Family::kMxfp4 || f == Family::kGptOss;
}
// marlin-mxfp4's family for the source method of the options.
Family mxfp4_family(const LayoutOptions& o) {
  return o.source_method == QuantMethod::kGptOssMxfp4 ? Family::kGptOss : Family::kMxfp4;
}

std::string num(int64_t v) {
  return std::to_string(v);
}

const char* proj_name(MoeProj p) {
  return p == MoeProj::kW13 ? "w13" : "w2";
}

int64_t round_up(int64_t v, int64_t unit) {
  return (v + unit - 1) / unit * unit;
}

constexpr int64_t kFp8Block = 128;  // the only block_k vLLM 0.33's Marlin MoE kernel runs
constexpr int64_t kMxBlock = 32;
constexpr int64_t kNvBlock = 16;

// The source methods each family takes (vLLM's MoE method that runs prepare_*_for_marlin).
bool family_takes(Family f, QuantMethod m) {
  switch (f) {
    case Family::kFp8:
      return m == QuantMethod::kFp8Block || m == QuantMethod::kCtFp8Block;
    case Family::kFp8Scaled:
      // CompressedTensorsW8A8Fp8MoEMethod (channel, tensor), ModelOptFp8MoEMethod.
      return m == QuantMethod::kCtFp8Channel || is_per_tensor(m);
    case Family::kMxfp8:
      return m == QuantMethod::kModeloptMxfp8 || m == QuantMethod::kCtMxfp8;
    case Family::kNvfp4:
      // ModelOptNvFp4FusedMoE, CompressedTensorsW4A4Nvfp4MoEMethod (W4A4 and A16).
      return m == QuantMethod::kModeloptNvfp4 || m == QuantMethod::kCtNvfp4;
    case Family::kGptOss:
      // GptOssMxfp4MoEMethod (convert_gpt_oss_weight_to_mxfp4_moe_kernel_format, MARLIN).
      return m == QuantMethod::kGptOssMxfp4;
    default:
      // CompressedTensorsW4A4Mxfp4MoEMethod (prepare_moe_fp4_layer_for_marlin).
      return m == QuantMethod::kCtMxfp4;
  }
}

// The scale group along K (0: one group over all of K).
int64_t scale_group(Family f) {
  if (f == Family::kFp8Scaled) return 0;
  return f == Family::kFp8 ? kFp8Block : f == Family::kNvfp4 ? kNvBlock : kMxBlock;
}
int64_t groups_over(Family f, int64_t k) {
  const int64_t g = scale_group(f);
  return g > 0 ? k / g : 1;
}

// The intermediate size the parameters carry: FP8 / MXFP8 the next multiple of lcm(64, group)
// (marlin_moe_padded_intermediate); NVFP4 the next multiple of 64 where H % 128 == 0, else of 128
// (prepare_nvfp4_moe_layer_for_marlin); MXFP4 none (prepare_moe_fp4_layer_for_marlin); gpt-oss
// the next multiple of 128 (mxfp4_round_up_hidden_size_and_intermediate_size, MARLIN, before
// create_weights: the loader copies the checkpoint into the first rows / columns of zeros).
int64_t padded_inter_of(Family f, int64_t hidden, int64_t inter) {
  switch (f) {
    case Family::kGptOss:
      return round_up(inter, 128);
    case Family::kFp8:
      return marlin_padded_intermediate(inter, kFp8Block);
    case Family::kFp8Scaled:
      return marlin_padded_intermediate(inter, -1);  // g = 1: the next multiple of 64
    case Family::kMxfp8:
      return round_up(inter, 64);
    case Family::kNvfp4:
      return round_up(inter, hidden % 128 == 0 ? 64 : 128);
    default:
      return inter;
  }
}

// The hidden size the parameters carry: gpt-oss the next multiple of 256 (the same rounding, on
// CUDA; the layer pads the hidden states and cuts the output back), every other family H.
int64_t padded_hidden_of(Family f, int64_t hidden) {
  return f == Family::kGptOss ? round_up(hidden, 256) : hidden;
}

// vLLM's parameter names (without the prefix).
std::string weight_name(MoeProj p) {
  return std::string(proj_name(p)) + "_weight";
}
std::string scale_name(Family f, QuantMethod m, MoeProj p) {
  // Fp8MoEMethod registers block scales as *_weight_scale_inv (weight_scale_name in fp8.py).
  const bool inv = f == Family::kFp8 && m == QuantMethod::kFp8Block;
  return std::string(proj_name(p)) + (inv ? "_weight_scale_inv" : "_weight_scale");
}
DType scale_dtype(Family f, const LayoutOptions& o) {
  if (is_fp8(f)) return o.act_dtype;
  return f == Family::kNvfp4 ? DType::kF8_E4M3 : DType::kF8_E8M0;
}
// NVFP4's processed global scale, one F32 per expert (vLLM's w13_weight_scale_2 /
// w2_weight_scale_2, written by prepare_nvfp4_moe_layer_for_marlin whatever the source called it).
std::string global_name(MoeProj p) {
  return std::string(proj_name(p)) + "_weight_scale_2";
}
int scale_bytes(Family f) {
  return is_fp8(f) ? 2 : 1;
}

// fp8_fused_exponent_bias_into_scales: 2^(2^(t-1) - 2^3), t = 8 exponent bits (bf16), 5 (fp16).
float fp8_bias(DType act) {
  return act == DType::kBF16 ? std::ldexp(1.0f, 120) : std::ldexp(1.0f, 8);
}

// ---- NVFP4's scales (marlin_utils_fp4.py) ------------------------------------------------------

// nvfp4_marlin_process_global_scale: g * 2^(2^(t-1) - 2^1 - 7), t the activation dtype's exponent
// bits: 2^119 (bf16), 2^7 (fp16).
int nvfp4_global_exp(DType act) {
  return act == DType::kBF16 ? 119 : 7;
}

// The layer decision of projection p: log2 of the rescale factor prepare_nvfp4_moe_layer_for_marlin
// computes once over every expert of the projection (_nvfp4_compute_scale_factor).
std::string scale_factor_key(MoeProj p) {
  return std::string(proj_name(p)) + "_nvfp4_scale_factor_log2";
}

// _nvfp4_compute_scale_factor: 1 for fp16 activations or no positive scale; else 2^k with k =
// floor(log2(448 * 2^7 / (m * 2^7))) for the largest positive block scale m below 448, i.e. the
// largest k with m * 2^k <= 448 (m has 4 significant bits, so torch's float log2 decides alike).
int nvfp4_scale_factor_log2(DType act, float max_positive) {
  if (act == DType::kF16 || !(max_positive > 0.0f)) return 0;
  int k = 0;
  while (std::ldexp(max_positive, k + 1) <= 448.0f) ++k;
  return k;
}

int scale_factor_log2_of(const LayoutOptions& o, MoeProj p) {
  const std::string key = scale_factor_key(p);
  const auto it = o.layer_decisions.find(key);
  if (it == o.layer_decisions.end())
    throw Error(ErrorCode::kBadConfig, "", "layout_decisions." + key,
                "no decision for " + key +
                    " (NVFP4 Marlin's scale factor is decided once per layer over all its "
                    "experts: make_plan records it, moepack.json carries it)");
  const std::string& v = it->second;
  if (v.empty() || v.size() > 2 || !std::all_of(v.begin(), v.end(), ::isdigit) || std::stoi(v) > 24)
    throw Error(ErrorCode::kBadConfig, "", "layout_decisions." + key,
                "\"" + v + "\" is not a scale factor exponent 0..24");
  return std::stoi(v);
}

// nvfp4_marlin_process_scales on one e4m3 block scale: to fp16, times the layer's 2^k, times 2^7;
// values below 2 (scales under 2^-6 after the rescale, zeros, negatives) flushed to 0; then the
// high byte of (fp16 bits << 1), i.e. bits 14..7: EEEEEMMM ("S0E5M3"). The fp16 value is exact:
// an e4m3 value has 4 significant bits and 2 <= v <= 448 * 2^7 (k never lifts a scale above 448).
uint8_t nvfp4_marlin_scale_byte(uint8_t e4m3, int sf_log2) {
  const float v = std::ldexp(e4m3_to_float(e4m3), sf_log2 + 7);
  if (!(v >= 2.0f)) return 0;
  return static_cast<uint8_t>((float_to_f16(v) >> 7) & 0xffu);
}

// The e4m3 block scale whose byte is b under 2^k (byte 0: scale 0), or -1 where no e4m3 scale
// gives b (pack never writes such a byte).
int nvfp4_scale_of_byte(uint8_t b, int sf_log2) {
  if (b == 0) return 0;
  const float h = f16_to_float(static_cast<uint16_t>(b << 7));
  if (!(h >= 2.0f)) return -1;
  const float v = std::ldexp(h, -(sf_log2 + 7));
  const uint8_t c = float_to_e4m3_satfinite(v);
  return e4m3_to_float(c) == v ? c : -1;
}

// The decode global scale vLLM's NVFP4 methods hand to prepare_nvfp4_moe_layer_for_marlin: the
// gate's (shard 0) for both halves of w13; compressed-tensors' encode divisor G as 1.0 / G in fp32.
float nvfp4_decode_global(const QuantTensor& q, int64_t e) {
  const float g = q.global_scales[static_cast<size_t>(e * q.global_shards)];
  return q.global_scale == GlobalScale::kEncodeDivisor ? 1.0f / g : g;
}

// ---- reasons ------------------------------------------------------------------------------------

void proj_reasons(Family f, const ProjShape& s, const char* p, std::vector<std::string>* why) {
  const QuantSpec& q = s.quant;
  const std::string w = p;
  if (is_fp4(f) && (q.kind != CodeKind::kFp4E2M1 || q.bits != 4))
    why->push_back(w + ": codes are not float4_e2m1");
  if (!is_fp4(f) && (q.kind != CodeKind::kFp8E4M3 || q.bits != 8))
    why->push_back(w + ": codes are not float8_e4m3fn");
  if (!q.symmetric) why->push_back(w + ": zero points (float Marlin is symmetric)");
  if (s.act_order) why->push_back(w + ": act-order g_idx (float Marlin has none)");
  if (f == Family::kFp8) {
    if (q.group_size != kFp8Block)
      why->push_back(w + ": FP8 block_k=" + num(q.group_size) +
                     ": vLLM permutes the block scales with that group, but vLLM 0.33's shipped "
                     "Marlin MoE kernel has FP8 instances for group 128 and channelwise only");
    if (q.scale_block_n != kFp8Block)
      why->push_back(w + ": FP8 block_n=" + num(q.scale_block_n) + " (moepack's FP8 codecs: 128)");
    if (!wna16::is_float_scale_dtype(q.scale_dtype))
      why->push_back(w + std::string(": scale dtype ") + dtype_name(q.scale_dtype));
  } else if (f == Family::kFp8Scaled) {
    if (q.group_size > 0 || q.scale_block_n != 1)
      why->push_back(w + ": not one FP8 scale per output channel (group " + num(q.group_size) +
                     ", scale_block_n " + num(q.scale_block_n) + ")");
    if (!wna16::is_float_scale_dtype(q.scale_dtype))
      why->push_back(w + std::string(": scale dtype ") + dtype_name(q.scale_dtype));
  } else if (f == Family::kNvfp4) {
    if (q.group_size != kNvBlock || q.scale_block_n != 1 || q.scale_dtype != DType::kF8_E4M3 ||
        q.global_scale == GlobalScale::kNone)
      why->push_back(w + ": not NVFP4 (E4M3 scales per 16 along K and a global scale)");
  } else {
    if (q.group_size != kMxBlock || q.scale_block_n != 1 || !is_scale_byte_dtype(q.scale_dtype) ||
        q.global_scale != GlobalScale::kNone)
      why->push_back(w + ": not " + info(f).what + " (E8M0 scales per 32 along K)");
  }
}

std::vector<std::string> unsupported_reasons(Family f, const LayoutOptions& o, const MoeShape& x) {
  std::vector<std::string> why = moe_shape_problems(o, x);
  const FamilyInfo fi = info(f);
  if (o.vllm_target != VllmTarget::kV0_33)
    why.push_back(std::string(fi.layout) + " follows vLLM 0.33.0's prepare_*_for_marlin; --vllm-" +
                  "target " + vllm_target_name(o.vllm_target) + " is not written");
  if (!family_takes(f, o.source_method))
    why.push_back(std::string("source method ") + quant_method_name(o.source_method) +
                  " has no vLLM " + fi.what + " Marlin MoE path");
  if (o.act_dtype != DType::kBF16 && o.act_dtype != DType::kF16)
    why.push_back(std::string("activation dtype ") + dtype_name(o.act_dtype) +
                  " (Marlin takes F16 or BF16)");
  if (is_mx(f) && o.act_dtype == DType::kF16)
    why.push_back(
        "F16 activations: vLLM 0.33 prepares the layer, but its shipped Marlin MoE kernel has no "
        "fp16 instance with E8M0 scales (MXFP8/MXFP4 run with bf16 activations only)");
  proj_reasons(f, x.w13, "w13", &why);
  proj_reasons(f, x.w2, "w2", &why);
  const int64_t H = x.hidden(), I = x.inter(), ip = padded_inter_of(f, H, I);
  const int64_t hp = padded_hidden_of(f, H);
  const int64_t shards = o.gated ? 2 : 1;
  if (I <= 0 || H <= 0 || x.experts < 1) return why;
  if (f == Family::kGptOss && H % kMxBlock != 0)
    why.push_back("H=" + num(H) + " is not a multiple of 32 (MXFP4 blocks along w13's K)");
  if (f != Family::kGptOss && H % 64 != 0)
    why.push_back("H=" + num(H) + " is not a multiple of 64 (Marlin tiles)");
  if (f == Family::kFp8 && H % kFp8Block != 0)
    why.push_back("H=" + num(H) + " is not a multiple of 128: w13 would hold ceil(H/128) scale " +
                  "groups and the kernel reads group H/G, which has no FP8 instance");
  if (f == Family::kFp8 && I % x.w13.quant.scale_block_n != 0)
    why.push_back("I=" + num(I) + " is not a multiple of block_n=" +
                  num(x.w13.quant.scale_block_n) + " (validate_fp8_block_shape_moe)");
  if (is_mx(f) && I % kMxBlock != 0)
    why.push_back("I=" + num(I) + " is not a multiple of 32 (" + fi.what + " blocks along w2's K)");
  if (f == Family::kNvfp4 && I % kNvBlock != 0)
    why.push_back("I=" + num(I) + " is not a multiple of 16 (NVFP4 blocks along w2's K)");
  if (!o.gated && (f == Family::kMxfp4 || f == Family::kGptOss))
    why.push_back(
        "non-gated layer: prepare_moe_fp4_layer_for_marlin takes w13 as gate and up "
        "(n = 2I)");
  if (!o.gated && ip != I && f != Family::kNvfp4)
    why.push_back("non-gated layer with I=" + num(I) + " padded to " + num(ip) +
                  ": vLLM's float Marlin padding assumes gate and up shards");
  if (!marlin_float_gemm_runs(shards * ip, hp))
    why.push_back("w13 GEMM n=" + num(shards * ip) + ", k=" + num(hp) +
                  ": no thread configuration of the shipped Marlin MoE kernel takes it");
  if (!marlin_float_gemm_runs(hp, ip))
    why.push_back("w2 GEMM n=H=" + num(hp) + ", k=Ip=" + num(ip) +
                  ": no thread configuration of the shipped Marlin MoE kernel takes it (n % 128 "
                  "with k % 64, or n % 64 with k % 128)");
  return why;
}

void refuse(Family f, const LayoutOptions& o, const MoeExperts& x) {
  check_moe_structure(o, x);
  const std::vector<std::string> why = unsupported_reasons(f, o, moe_shape_of(x));
  if (why.empty()) return;
  std::string msg;
  for (const auto& w : why) msg += (msg.empty() ? "" : "; ") + w;
  throw Error(ErrorCode::kUnsupported, "", o.prefix + "w13_weight",
              std::string(info(f).layout) + ": " + msg);
}

// ---- geometry -----------------------------------------------------------------------------------

// One projection's extents: logical (n, k) and as the parameters carry them (np, kp), with the
// map from a physical row / column to the logical one (-1: padding).
struct ProjGeom {
  int64_t n = 0, k = 0, np = 0, kp = 0;
  int64_t inter = 0, ip = 0;  // real and padded I
  bool pad_rows = false;      // w13: each shard of ip rows holds inter real ones
  // gpt-oss w13: physical row 2j is gate j, 2j + 1 up j (the checkpoint's interleave, which
  // vLLM keeps), rows 2I.. padding.
  bool interleaved = false;
  int64_t row(int64_t r) const {
    if (interleaved) return r < 2 * inter ? (r % 2) * inter + r / 2 : -1;
    if (!pad_rows) return r < n ? r : -1;
    const int64_t s = r / ip, i = r % ip;
    return i < inter ? s * inter + i : -1;
  }
  int64_t col(int64_t c) const { return c < k ? c : -1; }
};

ProjGeom geom(Family f, MoeProj p, int64_t H, int64_t I, int64_t ip, bool gated) {
  ProjGeom g;
  g.inter = I;
  g.ip = ip;
  const int64_t hp = padded_hidden_of(f, H);
  if (p == MoeProj::kW13) {
    const int64_t shards = gated ? 2 : 1;
    g.n = shards * I;
    g.np = shards * ip;
    g.k = H;
    g.kp = hp;
    g.pad_rows = true;
    g.interleaved = f == Family::kGptOss;
  } else {
    g.n = H;
    g.np = hp;
    g.k = I;
    g.kp = ip;
  }
  return g;
}

// ---- pack ---------------------------------------------------------------------------------------

// One expert's codes [n, k] padded to [np, kp] and tiled.
std::vector<uint32_t> tile_codes(const ProjGeom& g, int bits, const uint8_t* codes) {
  std::vector<uint8_t> padded(static_cast<size_t>(g.np * g.kp), 0);
  for (int64_t r = 0; r < g.np; ++r) {
    const int64_t lr = g.row(r);
    if (lr >= 0) std::memcpy(&padded[static_cast<size_t>(r * g.kp)], codes + lr * g.k, g.k);
  }
  return marlin_repack(padded.data(), g.np, g.kp, bits, nullptr, false);
}

// vLLM's pair swap over a permuted scale matrix of `count` elements: every 4 stored as
// (0, 2, 1, 3). Its own inverse.
void pair_swap(uint8_t* m, int64_t count, int eb) {
  for (int64_t p = 0; p < count; p += 4) {
    uint8_t tmp[2];
    std::memcpy(tmp, m + (p + 1) * eb, static_cast<size_t>(eb));
    std::memcpy(m + (p + 1) * eb, m + (p + 2) * eb, static_cast<size_t>(eb));
    std::memcpy(m + (p + 2) * eb, tmp, static_cast<size_t>(eb));
  }
}

// Stores the physical [G, np] scale matrix of one expert as the kernel reads it: the 64- (more
// than one group) or 32-entry chunk permutation (marlin_permute_scales, grouped iff
// group_size < size_k, i.e. G > 1 for every size_k the prepare functions pass), then for the
// E8M0 / NVFP4 families the pair swap.
void permute_scale_matrix(uint8_t* m, int64_t groups, int64_t np, int eb, bool swap) {
  marlin_permute_scales(m, groups, np, eb, groups > 1);
  if (swap) pair_swap(m, groups * np, eb);
}
void unpermute_scale_matrix(uint8_t* m, int64_t groups, int64_t np, int eb, bool swap) {
  if (swap) pair_swap(m, groups * np, eb);
  marlin_unpermute_scales(m, groups, np, eb, groups > 1);
}

// FP8: one scale in the activation dtype, times the fused exponent bias (2^120 / 2^8); a scale
// that is not finite, or overflows on either step, is refused (vLLM would serve inf).
uint16_t fp8_stored_scale(const uint8_t* p, DType from, DType act, const std::string& what) {
  const float v = scale_to_float(p, from);
  if (!std::isfinite(v))
    throw Error(ErrorCode::kBadValue, "", what, "scale " + std::to_string(v) + " is not finite");
  uint16_t h = 0;
  convert_scale(p, from, act, reinterpret_cast<uint8_t*>(&h), what);
  const bool bf16 = act == DType::kBF16;
  const float biased = (bf16 ? bf16_to_float(h) : f16_to_float(h)) * fp8_bias(act);
  const uint16_t out = bf16 ? float_to_bf16(biased) : float_to_f16(biased);
  if (!std::isfinite(bf16 ? bf16_to_float(out) : f16_to_float(out)))
    throw Error(ErrorCode::kBadValue, "", what,
                "scale " + std::to_string(v) + " times 2^" + (bf16 ? "120" : "8") +
                    " (the fp8 exponent bias vLLM fuses into Marlin's scales) overflows " +
                    dtype_name(act) + ": vLLM would serve inf");
  return out;
}

// One expert's scales as the kernel reads them: [G, np] in the family's format, permuted. sf_log2:
// NVFP4's layer rescale exponent.
void pack_expert_scales(Family f, const LayoutOptions& o, const QuantTensor& q, const ProjGeom& g,
                        int64_t e, const std::string& what, int sf_log2, uint8_t* out) {
  const int64_t G = groups_over(f, g.kp), Gq = q.groups(), rows = q.scale_rows();
  const int eb = scale_bytes(f), qb = q.scale_bytes();
  std::memset(out, 0, static_cast<size_t>(G * g.np * eb));
  for (int64_t r = 0; r < g.np; ++r) {
    const int64_t lr = g.row(r);
    if (lr < 0) continue;
    for (int64_t gi = 0; gi < Gq; ++gi) {
      const uint8_t* src = q.scales.data() + ((e * rows + lr / q.scale_block_n) * Gq + gi) * qb;
      uint8_t* dst = out + (gi * g.np + r) * eb;
      if (is_fp8(f)) {
        const uint16_t h = fp8_stored_scale(src, q.scale_dtype, o.act_dtype, what);
        std::memcpy(dst, &h, 2);
      } else if (f == Family::kNvfp4) {
        *dst = nvfp4_marlin_scale_byte(*src, sf_log2);
      } else {
        if (*src == 255)
          throw Error(ErrorCode::kBadValue, "", what,
                      "E8M0 code 255 (NaN) at expert " + num(e) + ", row " + num(lr) + ", block " +
                          num(gi));
        *dst = *src;
      }
    }
  }
  permute_scale_matrix(out, G, g.np, eb, !is_fp8(f));
}

// NVFP4's processed global scale of each expert: the decode global times 2^119 (bf16) / 2^7
// (fp16), divided by the layer's 2^k, in fp32 as vLLM computes it; one that is not a finite
// positive float is refused (vLLM would serve inf or 0).
Tensor pack_globals(const LayoutOptions& o, const QuantTensor& q, MoeProj p, int sf_log2) {
  Tensor t(o.prefix + global_name(p), DType::kF32, {q.experts});
  float* out = reinterpret_cast<float*>(t.data.data());
  for (int64_t e = 0; e < q.experts; ++e) {
    const float g = nvfp4_decode_global(q, e);
    const float v = std::ldexp(std::ldexp(g, nvfp4_global_exp(o.act_dtype)), -sf_log2);
    if (!std::isfinite(v) || !(v > 0.0f))
      throw Error(ErrorCode::kBadValue, "", t.name,
                  "expert " + num(e) + ": decode global scale " + std::to_string(g) + " times 2^" +
                      num(nvfp4_global_exp(o.act_dtype) - sf_log2) +
                      " (nvfp4_marlin_process_global_scale) is " + std::to_string(v) +
                      " in fp32: vLLM would serve it");
    out[e] = v;
  }
  return t;
}

// ---- gpt-oss' expert biases ---------------------------------------------------------------------

std::string bias_name(MoeProj p) {
  return std::string(proj_name(p)) + "_bias";
}

// The biases of one projection as prepare_moe_mxfp4_layer_for_marlin leaves them: [E, np] in the
// layer's params_dtype (bf16: GptOssMxfp4Config takes bf16 activations only), physical row r
// holding the bias of logical row g.row(r) (the loader's interleaved rows, zeros in the padding),
// then every 32 values permuted by marlin_permute_bias (get_scale_perms' scale_perm_single: the
// 32-entry chunk permutation of ungrouped Marlin scales).
Tensor pack_biases(const LayoutOptions& o, const MoeExperts& x, MoeProj p, const ProjGeom& g) {
  const int64_t E = p == MoeProj::kW13 ? x.w13.experts : x.w2.experts;
  const std::string name = o.prefix + bias_name(p);
  const std::vector<uint8_t>& src = required_bf16_biases(x, p, g.n, name);
  Tensor t(name, DType::kBF16, {E, g.np});
  for (int64_t e = 0; e < E; ++e) {
    uint8_t* out = t.data.data() + e * g.np * 2;
    for (int64_t r = 0; r < g.np; ++r) {
      const int64_t lr = g.row(r);
      if (lr >= 0) std::memcpy(out + r * 2, src.data() + (e * g.n + lr) * 2, 2);
    }
    marlin_permute_scales(out, 1, g.np, 2, false);
  }
  return t;
}

// The biases back to [E, n] in logical row order; the padding must be zero.
std::vector<uint8_t> unpack_biases(const Tensor& t, const ProjGeom& g, int64_t E) {
  std::vector<uint8_t> out(static_cast<size_t>(E * g.n * 2));
  std::vector<uint8_t> m(static_cast<size_t>(g.np * 2));
  for (int64_t e = 0; e < E; ++e) {
    std::memcpy(m.data(), t.data.data() + e * g.np * 2, m.size());
    marlin_unpermute_scales(m.data(), 1, g.np, 2, false);
    for (int64_t r = 0; r < g.np; ++r) {
      const int64_t lr = g.row(r);
      if (lr >= 0)
        std::memcpy(&out[static_cast<size_t>((e * g.n + lr) * 2)], &m[static_cast<size_t>(r * 2)],
                    2);
      else if (m[static_cast<size_t>(r * 2)] != 0 || m[static_cast<size_t>(r * 2 + 1)] != 0)
        throw Error(ErrorCode::kBadValue, "", t.name,
                    "expert " + num(e) + ": the bias of padding row " + num(r) +
                        " is not zero (vLLM pads with zeros)");
    }
  }
  return out;
}

// process_fp8_weight_tensor_strategy_moe (fp8_utils.py), run by vLLM 0.33's per-tensor FP8 MoE
// methods before prepare_fp8_moe_layer_for_marlin: w13 keeps one scale per expert, m = the larger
// of the gate's and the up's, and both shards are requantised to it. Per shard with scale s:
// per_tensor_dequantize = the code in fp16 times s (a 0-d CUDA tensor, so s is rounded to fp16
// first; the product rounded to fp16), then static_scaled_fp8_quant = that fp16 value times
// (1.0f / m) in fp32, clamped to +-448, to e4m3 round-to-nearest-even. The codes change (the
// shard with the smaller scale, and any value the fp16 steps round or flush); the GPU fixtures
// (tests/golden/marlin_float, the _tiny_scale case) decide the fp16 rounding of s.
QuantTensor requantize_per_tensor_w13(const QuantTensor& q, int64_t inter) {
  QuantTensor out = q;
  const int eb = q.scale_bytes();
  const int64_t K = q.k;
  for (int64_t e = 0; e < q.experts; ++e) {
    const uint8_t* gate = q.scales.data() + (e * q.n) * eb;
    const uint8_t* up = q.scales.data() + (e * q.n + inter) * eb;
    const float sg = scale_to_float(gate, q.scale_dtype), su = scale_to_float(up, q.scale_dtype);
    const uint8_t* max_bytes = su > sg ? up : gate;
    const float m = std::max(sg, su), inv_m = 1.0f / m;
    for (int shard = 0; shard < 2; ++shard) {
      const float s16 = f16_to_float(float_to_f16(shard == 0 ? sg : su));
      const int64_t r0 = e * q.n + shard * inter;
      for (int64_t i = r0 * K; i < (r0 + inter) * K; ++i) {
        const float dq = f16_to_float(float_to_f16(e4m3_to_float(q.codes[i]) * s16));
        out.codes[i] = float_to_e4m3_satfinite(std::fmin(std::fmax(dq * inv_m, -448.0f), 448.0f));
      }
    }
    for (int64_t r = 0; r < q.n; ++r)
      std::memcpy(out.scales.data() + (e * q.n + r) * eb, max_bytes, static_cast<size_t>(eb));
  }
  return out;
}

struct PackedProj {
  Tensor weight, scales, globals;  // globals: NVFP4 only
};

PackedProj pack_projection(Family f, const LayoutOptions& o, const QuantTensor& q, MoeProj p,
                           const ProjGeom& g) {
  const int64_t E = q.experts, G = groups_over(f, g.kp);
  const int bits = info(f).bits, pf = 32 / bits, eb = scale_bytes(f);
  const int sf_log2 = f == Family::kNvfp4 ? scale_factor_log2_of(o, p) : 0;
  PackedProj out;
  out.weight = Tensor(o.prefix + weight_name(p), DType::kI32, {E, g.kp / 16, g.np * 16 / pf});
  out.scales =
      Tensor(o.prefix + scale_name(f, o.source_method, p), scale_dtype(f, o), {E, G, g.np});
  Tensor &w = out.weight, &s = out.scales;
  const int64_t words = g.kp * g.np / pf;
  parallel_for(E, o.threads, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const std::vector<uint32_t> t = tile_codes(g, bits, q.codes.data() + e * g.n * g.k);
      std::memcpy(w.data.data() + e * words * 4, t.data(), t.size() * 4);
      pack_expert_scales(f, o, q, g, e, s.name, sf_log2, s.data.data() + e * G * g.np * eb);
    }
  });
  if (f == Family::kNvfp4) out.globals = pack_globals(o, q, p, sf_log2);
  return out;
}

std::vector<Tensor> pack(Family f, const LayoutOptions& o, const MoeExperts& x) {
  refuse(f, o, x);
  const int64_t H = x.w13.k, I = x.w2.k, ip = padded_inter_of(f, H, I);
  const bool requant = f == Family::kFp8Scaled && is_per_tensor(o.source_method) && o.gated;
  const QuantTensor requantized = requant ? requantize_per_tensor_w13(x.w13, I) : QuantTensor{};
  PackedProj w13 = pack_projection(f, o, requant ? requantized : x.w13, MoeProj::kW13,
                                   geom(f, MoeProj::kW13, H, I, ip, o.gated));
  PackedProj w2 =
      pack_projection(f, o, x.w2, MoeProj::kW2, geom(f, MoeProj::kW2, H, I, ip, o.gated));
  // vLLM's order: both weights, then both scales (then NVFP4's global scales, gpt-oss' biases).
  std::vector<Tensor> out;
  out.push_back(std::move(w13.weight));
  out.push_back(std::move(w2.weight));
  out.push_back(std::move(w13.scales));
  out.push_back(std::move(w2.scales));
  if (f == Family::kNvfp4) {
    out.push_back(std::move(w13.globals));
    out.push_back(std::move(w2.globals));
  }
  if (f == Family::kGptOss)
    for (MoeProj p : {MoeProj::kW13, MoeProj::kW2})
      out.push_back(pack_biases(o, x, p, geom(f, p, H, I, ip, o.gated)));
  return out;
}

std::vector<ParamSpec> param_specs(Family f, const LayoutOptions& o, const MoeShape& x) {
  const int64_t E = x.experts, H = x.hidden(), I = x.inter(), ip = padded_inter_of(f, H, I);
  const int pf = 32 / info(f).bits;
  const ProjGeom g13 = geom(f, MoeProj::kW13, H, I, ip, o.gated),
                 g2 = geom(f, MoeProj::kW2, H, I, ip, o.gated);
  const QuantMethod m = o.source_method;
  std::vector<ParamSpec> out = {{o.prefix + weight_name(MoeProj::kW13),
                                 DType::kI32,
                                 {E, g13.kp / 16, g13.np * 16 / pf},
                                 ParamRole::kW13Weight},
                                {o.prefix + weight_name(MoeProj::kW2),
                                 DType::kI32,
                                 {E, g2.kp / 16, g2.np * 16 / pf},
                                 ParamRole::kW2Weight},
                                {o.prefix + scale_name(f, m, MoeProj::kW13),
                                 scale_dtype(f, o),
                                 {E, groups_over(f, g13.kp), g13.np},
                                 ParamRole::kW13Scale},
                                {o.prefix + scale_name(f, m, MoeProj::kW2),
                                 scale_dtype(f, o),
                                 {E, groups_over(f, g2.kp), g2.np},
                                 ParamRole::kW2Scale}};
  if (f == Family::kNvfp4) {
    out.push_back(
        {o.prefix + global_name(MoeProj::kW13), DType::kF32, {E}, ParamRole::kW13GlobalScale});
    out.push_back(
        {o.prefix + global_name(MoeProj::kW2), DType::kF32, {E}, ParamRole::kW2GlobalScale});
  }
  if (f == Family::kGptOss) {
    out.push_back(
        {o.prefix + bias_name(MoeProj::kW13), DType::kBF16, {E, g13.np}, ParamRole::kW13Bias});
    out.push_back(
        {o.prefix + bias_name(MoeProj::kW2), DType::kBF16, {E, g2.np}, ParamRole::kW2Bias});
  }
  return out;
}

// ---- read back ----------------------------------------------------------------------------------

struct LayerView {
  int64_t experts = 0, hidden = 0, inter = 0, ip = 0;
  const Tensor* weight[2] = {nullptr, nullptr};
  const Tensor* scales[2] = {nullptr, nullptr};
  const Tensor* globals[2] = {nullptr, nullptr};  // NVFP4
  const Tensor* biases[2] = {nullptr, nullptr};   // gpt-oss
  int sf_log2[2] = {0, 0};                        // NVFP4: the layer's rescale exponents
  ProjGeom g[2];
};

// The parameters as the kernel reads them, validated (unpack and the reader share it).
LayerView read_layer(Family f, const LayoutOptions& o, const TensorMap& params) {
  const FamilyInfo fi = info(f);
  if (!family_takes(f, o.source_method))
    throw Error(ErrorCode::kUnsupported, "", o.prefix + "w13_weight",
                std::string("no ") + fi.layout + " parameters for source method " +
                    quant_method_name(o.source_method));
  LayerView L;
  for (int i = 0; i < 2; ++i) {
    const MoeProj p = i == 0 ? MoeProj::kW13 : MoeProj::kW2;
    L.weight[i] = &require_tensor(params, o.prefix + weight_name(p), fi.layout);
    L.scales[i] = &require_tensor(params, o.prefix + scale_name(f, o.source_method, p), fi.layout);
    wna16::expect_dtype(*L.weight[i], L.weight[i]->name, {DType::kI32});
    if (is_fp8(f))
      wna16::expect_dtype(*L.scales[i], L.scales[i]->name, {o.act_dtype});
    else if (f == Family::kNvfp4)
      wna16::expect_dtype(*L.scales[i], L.scales[i]->name, {DType::kF8_E4M3, DType::kU8});
    else
      wna16::expect_dtype(*L.scales[i], L.scales[i]->name, {DType::kF8_E8M0, DType::kU8});
    if (f == Family::kNvfp4) {
      L.globals[i] = &require_tensor(params, o.prefix + global_name(p), fi.layout);
      wna16::expect_dtype(*L.globals[i], L.globals[i]->name, {DType::kF32});
      L.sf_log2[i] = scale_factor_log2_of(o, p);
    }
    if (f == Family::kGptOss) {
      L.biases[i] = &require_tensor(params, o.prefix + bias_name(p), fi.layout);
      wna16::expect_dtype(*L.biases[i], L.biases[i]->name, {DType::kBF16});
    }
    if (L.weight[i]->shape.size() != 3 || L.scales[i]->shape.size() != 3)
      throw Error(ErrorCode::kBadShape, "", L.weight[i]->name,
                  "weight " + shape_str(L.weight[i]->shape) + " and scales " +
                      shape_str(L.scales[i]->shape) + " must be 3-D [E, ...]");
  }
  const int pf = 32 / fi.bits;
  const int64_t E = L.weight[0]->shape[0], hp = L.weight[0]->shape[1] * 16,
                ip = L.weight[1]->shape[1] * 16;
  if (hp % 64 != 0 || ip % 64 != 0 || (f == Family::kFp8 && hp % kFp8Block != 0))
    throw Error(ErrorCode::kBadShape, "", L.weight[0]->name,
                "H=" + num(hp) + ", Ip=" + num(ip) + " are not Marlin " + fi.what + " extents");
  int64_t H = hp;
  if (o.hidden > 0 && o.hidden != hp) {
    if (o.hidden > hp || padded_hidden_of(f, o.hidden) != hp)
      throw Error(ErrorCode::kBadShape, "", L.weight[0]->name,
                  "parameters carry H=" + num(hp) + ", which is not how vLLM 0.33 pads the " +
                      "layer's H=" + num(o.hidden) + " for " + fi.layout);
    H = o.hidden;
  }
  int64_t I = ip;
  if (o.inter > 0 && o.inter != ip) {
    if (o.inter > ip || padded_inter_of(f, H, o.inter) != ip)
      throw Error(ErrorCode::kBadShape, "", L.weight[1]->name,
                  "parameters carry I=" + num(ip) + ", which is not how vLLM 0.33 pads the " +
                      "layer's I=" + num(o.inter) + " for " + fi.layout);
    I = o.inter;
  }
  L.experts = E;
  L.hidden = H;
  L.inter = I;
  L.ip = ip;
  for (int i = 0; i < 2; ++i) {
    const ProjGeom g = geom(f, i == 0 ? MoeProj::kW13 : MoeProj::kW2, H, I, ip, o.gated);
    wna16::expect_shape(*L.weight[i], L.weight[i]->name, {E, g.kp / 16, g.np * 16 / pf});
    wna16::expect_shape(*L.scales[i], L.scales[i]->name, {E, groups_over(f, g.kp), g.np});
    if (L.globals[i]) wna16::expect_shape(*L.globals[i], L.globals[i]->name, {E});
    if (L.biases[i]) wna16::expect_shape(*L.biases[i], L.biases[i]->name, {E, g.np});
    L.g[i] = g;
  }
  return L;
}

void padding_error(const LayoutOptions& o, const std::string& what, int64_t e) {
  throw Error(ErrorCode::kBadValue, "", o.prefix + what,
              "expert " + num(e) +
                  ": the intermediate padding is not zero (vLLM pads with zero codes and scales)");
}

// One expert's codes [n, k] from the tiles, the padding checked to be zero.
void untile_codes(const LayoutOptions& o, const ProjGeom& g, int bits, const uint32_t* words,
                  int64_t e, const std::string& what, uint8_t* codes) {
  const std::vector<uint8_t> padded = marlin_unrepack(words, g.np, g.kp, bits, false);
  for (int64_t r = 0; r < g.np; ++r) {
    const uint8_t* row = &padded[static_cast<size_t>(r * g.kp)];
    const int64_t lr = g.row(r);
    const auto nonzero = [](const uint8_t* b, int64_t n) {
      return std::any_of(b, b + n, [](uint8_t v) { return v != 0; });
    };
    if (lr < 0 ? nonzero(row, g.kp) : nonzero(row + g.k, g.kp - g.k)) padding_error(o, what, e);
    if (lr >= 0) std::memcpy(codes + lr * g.k, row, static_cast<size_t>(g.k));
  }
}

// One expert's scales back to the canonical [rows, G]: FP8 block scales read once per 128-row
// block (every column of a block must hold the same one), the exponent bias removed exactly.
void unpack_expert_scales(Family f, const LayoutOptions& o, const LayerView& L, int i, int64_t e,
                          QuantTensor* q) {
  const ProjGeom& g = L.g[i];
  const Tensor& st = *L.scales[i];
  const int64_t G = groups_over(f, g.kp), Gq = q->groups(), rows = q->scale_rows();
  const int eb = scale_bytes(f);
  std::vector<uint8_t> m(st.data.begin() + e * G * g.np * eb,
                         st.data.begin() + (e + 1) * G * g.np * eb);
  unpermute_scale_matrix(m.data(), G, g.np, eb, !is_fp8(f));
  std::vector<uint8_t> seen(static_cast<size_t>(rows * Gq), 0);
  for (int64_t r = 0; r < g.np; ++r)
    for (int64_t gi = 0; gi < G; ++gi) {
      const uint8_t* v = &m[static_cast<size_t>((gi * g.np + r) * eb)];
      const int64_t lr = g.row(r);
      if (lr < 0 || gi >= Gq) {
        if (std::any_of(v, v + eb, [](uint8_t b) { return b != 0; }))
          padding_error(o, st.name.substr(o.prefix.size()), e);
        continue;
      }
      uint8_t* dst = q->scales.data() + ((e * rows + lr / q->scale_block_n) * Gq + gi) * eb;
      uint8_t val[2] = {v[0], eb > 1 ? v[1] : uint8_t{0}};
      if (f == Family::kNvfp4) {
        const int c = nvfp4_scale_of_byte(v[0], L.sf_log2[i]);
        if (c < 0)
          throw Error(ErrorCode::kBadValue, "", st.name,
                      "expert " + num(e) + ": byte " + num(v[0]) + " (row " + num(lr) + ", block " +
                          num(gi) + ") is no E4M3 block scale under the layer's " +
                          "scale factor 2^" + num(L.sf_log2[i]) +
                          " (nvfp4_marlin_process_scales writes 0 or a value of at least 2)");
        val[0] = static_cast<uint8_t>(c);
      }
      if (is_fp8(f)) {
        uint16_t h;
        std::memcpy(&h, v, 2);
        const bool bf16 = o.act_dtype == DType::kBF16;
        const float s = (bf16 ? bf16_to_float(h) : f16_to_float(h)) / fp8_bias(o.act_dtype);
        h = bf16 ? float_to_bf16(s) : float_to_f16(s);
        std::memcpy(val, &h, 2);
      }
      uint8_t& first = seen[static_cast<size_t>((lr / q->scale_block_n) * Gq + gi)];
      if (first && std::memcmp(dst, val, static_cast<size_t>(eb)) != 0)
        throw Error(ErrorCode::kBadValue, "", st.name,
                    "expert " + num(e) +
                        ": the columns of one FP8 scale block hold different "
                        "scales (row " +
                        num(lr) + ", group " + num(gi) + ")");
      std::memcpy(dst, val, static_cast<size_t>(eb));
      first = 1;
    }
}

// What unpack decodes to. NVFP4: the e4m3 block scales the kernel's bytes hold (flushed ones 0)
// and one decode global scale per expert and projection (w13's serves gate and up alike, vLLM's
// rule), whatever the source's convention and shards were.
QuantSpec canonical_spec(Family f, const LayoutOptions& o) {
  QuantSpec s;
  s.kind = is_fp4(f) ? CodeKind::kFp4E2M1 : CodeKind::kFp8E4M3;
  s.bits = info(f).bits;
  s.symmetric = true;
  s.group_size = scale_group(f);
  s.scale_block_n = 1;
  if (is_fp8(f)) {
    s.group_size = f == Family::kFp8 ? kFp8Block : -1;
    s.scale_block_n = f == Family::kFp8 ? kFp8Block : 1;
    s.scale_dtype = o.act_dtype;
  } else if (f == Family::kNvfp4) {
    s.scale_dtype = DType::kF8_E4M3;
    s.global_scale = GlobalScale::kDecodeMultiplier;
  } else {
    s.scale_dtype = DType::kU8;
  }
  return s;
}

// The decode global scales back from NVFP4's processed ones (exact: powers of two).
void unpack_globals(const LayoutOptions& o, const LayerView& L, int i, QuantTensor* q) {
  const Tensor& t = *L.globals[i];
  const float* v = t.as<float>();
  for (int64_t e = 0; e < L.experts; ++e) {
    if (!std::isfinite(v[e]) || !(v[e] > 0.0f))
      throw Error(ErrorCode::kBadValue, "", t.name,
                  "expert " + num(e) + ": global scale " + std::to_string(v[e]) +
                      " is not a finite positive float");
    q->global_scales[static_cast<size_t>(e)] =
        std::ldexp(v[e], L.sf_log2[i] - nvfp4_global_exp(o.act_dtype));
  }
}

MoeExperts unpack(Family f, const LayoutOptions& o, const TensorMap& params) {
  const LayerView L = read_layer(f, o, params);
  const int bits = info(f).bits, pf = 32 / bits;
  MoeExperts x;
  QuantTensor* qs[2] = {&x.w13, &x.w2};
  for (int i = 0; i < 2; ++i) {
    const ProjGeom& g = L.g[i];
    *qs[i] = QuantTensor(canonical_spec(f, o), L.experts, g.n, g.k);
    const uint32_t* words = L.weight[i]->as<uint32_t>();
    parallel_for(L.experts, o.threads, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) {
        untile_codes(o, g, bits, words + e * (g.kp * g.np / pf), e,
                     i == 0 ? "w13_weight" : "w2_weight", qs[i]->codes.data() + e * g.n * g.k);
        unpack_expert_scales(f, o, L, i, e, qs[i]);
      }
    });
    if (f == Family::kNvfp4) unpack_globals(o, L, i, qs[i]);
    if (f == Family::kGptOss)
      (i == 0 ? x.w13_bias : x.w2_bias) = unpack_biases(*L.biases[i], g, L.experts);
  }
  return x;
}

reader::ProjReader make_reader(Family f, const LayoutOptions& o, const TensorMap& params,
                               MoeProj proj, const ParamLocator& locate) {
  const LayerView L = read_layer(f, o, params);
  const int i = proj == MoeProj::kW13 ? 0 : 1;
  const ProjGeom& g = L.g[i];
  reader::ProjReader r = blank_reader(reader::Kind::kMarlinFloat, marlin_float_act_quant(o));
  r.experts = L.experts;
  r.n = g.n;
  r.k = g.k;
  reader::MarlinFloatParams& m = r.marlin_float;
  m.qweight = static_cast<const uint32_t*>(locate_param(locate, params, L.weight[i]->name));
  m.scales = locate_param(locate, params, L.scales[i]->name);
  m.bits = info(f).bits;
  m.scale_type = is_fp8(f)             ? reader_scale_type(o.act_dtype, L.scales[i]->name)
                 : f == Family::kNvfp4 ? static_cast<int32_t>(reader::kScaleS0e5m3)
                                       : static_cast<int32_t>(reader::kScaleE8m0);
  m.grouped_scales = groups_over(f, g.kp) > 1 ? 1 : 0;
  m.pair_swap = is_fp8(f) ? 0 : 1;
  m.padded_w13 = proj == MoeProj::kW13 && L.inter != L.ip && !g.interleaved ? 1 : 0;
  m.interleaved_w13 = g.interleaved ? 1 : 0;
  m.scale_mult = is_fp8(f) ? 1.0f / fp8_bias(o.act_dtype) : 1.0f;
  m.global_mult = 1.0f;
  m.global_scale = nullptr;
  if (f == Family::kNvfp4) {
    // The S0E5M3 value is scale * 2^(k+7); the processed global g * 2^(119 or 7) / 2^k.
    m.scale_mult = std::ldexp(1.0f, -(L.sf_log2[i] + 7));
    m.global_mult = std::ldexp(1.0f, L.sf_log2[i] - nvfp4_global_exp(o.act_dtype));
    m.global_scale = static_cast<const float*>(locate_param(locate, params, L.globals[i]->name));
  }
  m.kp = g.kp;
  m.np = g.np;
  m.groups = groups_over(f, g.kp);
  m.group_size = m.groups > 1 ? scale_group(f) : 0;
  m.inter = L.inter;
  m.padded_inter = L.ip;
  m.tiles_n = g.np / 64;
  m.words_per_expert = g.kp * g.np / (32 / m.bits);
  return r;
}

}  // namespace

bool marlin_float_gemm_runs(int64_t n, int64_t k) {
  return n > 0 && k > 0 && ((n % 64 == 0 && k % 128 == 0) || (n % 128 == 0 && k % 64 == 0));
}

reader::ActQuant marlin_float_act_quant(const LayoutOptions& opts) {
  return act_quant_16bit(opts);
}

// ---- marlin-fp8 ---------------------------------------------------------------------------------

std::vector<std::string> marlin_fp8_unsupported_reasons(const LayoutOptions& o, const MoeShape& x) {
  return unsupported_reasons(fp8_family(o.source_method), o, x);
}
std::vector<ParamSpec> marlin_fp8_param_specs(const LayoutOptions& o, const MoeShape& x) {
  return param_specs(fp8_family(o.source_method), o, x);
}
std::vector<Tensor> pack_marlin_fp8_moe(const LayoutOptions& o, const MoeExperts& x) {
  return pack(fp8_family(o.source_method), o, x);
}
MoeExperts unpack_marlin_fp8_moe(const LayoutOptions& o, const TensorMap& params) {
  return unpack(fp8_family(o.source_method), o, params);
}
reader::ProjReader marlin_fp8_make_reader(const LayoutOptions& o, const TensorMap& params,
                                          MoeProj proj, const ParamLocator& locate) {
  return make_reader(fp8_family(o.source_method), o, params, proj, locate);
}
std::vector<std::string> marlin_fp8_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  // Byte-identical to prepare_fp8_moe_layer_for_marlin for every layer the row takes
  // (tests/golden/marlin_float.cpp, fixtures made by vLLM 0.33.0 on an H100).
  return {};
}
MoeExperts marlin_fp8_vllm_loaded(const LayoutOptions& o, const MoeExperts& x) {
  MoeExperts out = x;
  if (is_per_tensor(o.source_method) && o.gated) out.w13 = requantize_per_tensor_w13(x.w13, x.w2.k);
  return out;
}
int64_t marlin_fp8_padded_inter(const LayoutOptions& o, const MoeShape& x) {
  return padded_inter_of(fp8_family(o.source_method), x.hidden(), x.inter());
}

// ---- marlin-mxfp8 -------------------------------------------------------------------------------

std::vector<std::string> marlin_mxfp8_unsupported_reasons(const LayoutOptions& o,
                                                          const MoeShape& x) {
  return unsupported_reasons(Family::kMxfp8, o, x);
}
std::vector<ParamSpec> marlin_mxfp8_param_specs(const LayoutOptions& o, const MoeShape& x) {
  return param_specs(Family::kMxfp8, o, x);
}
std::vector<Tensor> pack_marlin_mxfp8_moe(const LayoutOptions& o, const MoeExperts& x) {
  return pack(Family::kMxfp8, o, x);
}
MoeExperts unpack_marlin_mxfp8_moe(const LayoutOptions& o, const TensorMap& params) {
  return unpack(Family::kMxfp8, o, params);
}
reader::ProjReader marlin_mxfp8_make_reader(const LayoutOptions& o, const TensorMap& params,
                                            MoeProj proj, const ParamLocator& locate) {
  return make_reader(Family::kMxfp8, o, params, proj, locate);
}
std::vector<std::string> marlin_mxfp8_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  // Byte-identical to prepare_mxfp8_moe_layer_for_marlin (bf16; fp16 is refused).
  return {};
}
int64_t marlin_mxfp8_padded_inter(const LayoutOptions&, const MoeShape& x) {
  return padded_inter_of(Family::kMxfp8, x.hidden(), x.inter());
}

// ---- marlin-nvfp4 -------------------------------------------------------------------------------

std::vector<std::string> marlin_nvfp4_unsupported_reasons(const LayoutOptions& o,
                                                          const MoeShape& x) {
  return unsupported_reasons(Family::kNvfp4, o, x);
}
std::vector<ParamSpec> marlin_nvfp4_param_specs(const LayoutOptions& o, const MoeShape& x) {
  return param_specs(Family::kNvfp4, o, x);
}
std::vector<Tensor> pack_marlin_nvfp4_moe(const LayoutOptions& o, const MoeExperts& x) {
  return pack(Family::kNvfp4, o, x);
}
MoeExperts unpack_marlin_nvfp4_moe(const LayoutOptions& o, const TensorMap& params) {
  return unpack(Family::kNvfp4, o, params);
}
reader::ProjReader marlin_nvfp4_make_reader(const LayoutOptions& o, const TensorMap& params,
                                            MoeProj proj, const ParamLocator& locate) {
  return make_reader(Family::kNvfp4, o, params, proj, locate);
}
std::vector<std::string> marlin_nvfp4_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  // Byte-identical to prepare_nvfp4_moe_layer_for_marlin (tests/golden/marlin_float.cpp, vLLM
  // 0.33.0 on an H100), including where vLLM changes values: the up half dequantised with the
  // gate's global scale, block scales under 2^-6 after the rescale flushed to 0.
  return {};
}
int64_t marlin_nvfp4_padded_inter(const LayoutOptions&, const MoeShape& x) {
  return padded_inter_of(Family::kNvfp4, x.hidden(), x.inter());
}

std::map<std::string, std::string> marlin_nvfp4_decide_layer(const LayoutOptions& o,
                                                             const MoeShape&,
                                                             const LayerExperts& layer) {
  // The largest positive block scale of each projection over every expert (padding adds zeros).
  float max_positive[2] = {0.0f, 0.0f};
  const int64_t step = std::max<int64_t>(1, layer.max_per_load);
  for (int64_t e = 0; e < layer.experts; e += step) {
    const MoeExperts chunk = layer.load(e, std::min(layer.experts, e + step));
    const QuantTensor* q[2] = {&chunk.w13, &chunk.w2};
    for (int i = 0; i < 2; ++i)
      for (uint8_t b : q[i]->scales) {
        const float v = e4m3_to_float(b);
        if (v > max_positive[i]) max_positive[i] = v;
      }
  }
  return {
      {scale_factor_key(MoeProj::kW13), num(nvfp4_scale_factor_log2(o.act_dtype, max_positive[0]))},
      {scale_factor_key(MoeProj::kW2), num(nvfp4_scale_factor_log2(o.act_dtype, max_positive[1]))}};
}

// ---- marlin-mxfp4 -------------------------------------------------------------------------------

std::vector<std::string> marlin_mxfp4_unsupported_reasons(const LayoutOptions& o,
                                                          const MoeShape& x) {
  return unsupported_reasons(mxfp4_family(o), o, x);
}
std::vector<ParamSpec> marlin_mxfp4_param_specs(const LayoutOptions& o, const MoeShape& x) {
  return param_specs(mxfp4_family(o), o, x);
}
std::vector<Tensor> pack_marlin_mxfp4_moe(const LayoutOptions& o, const MoeExperts& x) {
  return pack(mxfp4_family(o), o, x);
}
MoeExperts unpack_marlin_mxfp4_moe(const LayoutOptions& o, const TensorMap& params) {
  return unpack(mxfp4_family(o), o, params);
}
reader::ProjReader marlin_mxfp4_make_reader(const LayoutOptions& o, const TensorMap& params,
                                            MoeProj proj, const ParamLocator& locate) {
  return make_reader(mxfp4_family(o), o, params, proj, locate);
}
std::vector<std::string> marlin_mxfp4_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  // Byte-identical to prepare_moe_fp4_layer_for_marlin / prepare_moe_mxfp4_layer_for_marlin
  // (bf16; fp16 is refused).
  return {};
}
int64_t marlin_mxfp4_padded_inter(const LayoutOptions& o, const MoeShape& x) {
  return padded_inter_of(mxfp4_family(o), x.hidden(), x.inter());
}

}  // namespace moepack
