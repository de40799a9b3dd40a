// FP4 (e2m1) checkpoint Linears <-> QuantTensor, and their quantisers: the tensors and bit order
// are in formats/fp4.h, the conventions in docs/nvfp4.md and docs/mxfp4.md.
#include "formats/fp4.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "formats/fp8.h"

namespace moepack {
namespace {

constexpr int64_t kNvBlock = 16;
constexpr int64_t kMxBlock = 32;

std::string num(int64_t v) {
  return std::to_string(v);
}

// A float as it is stored, to 9 significant digits (1e-39 stays visible).
std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

void check_shape(const Tensor& t, const std::string& suffix, const Shape& want) {
  if (t.shape != want)
    throw Error(ErrorCode::kBadShape, "", suffix,
                "shape " + shape_str(t.shape) + ", expected " + shape_str(want));
}

void check_dims(int64_t n, int64_t k, int64_t block, const std::string& suffix,
                const char* format) {
  if (n <= 0 || k <= 0)
    throw Error(ErrorCode::kBadShape, "", suffix,
                "N=" + num(n) + ", K=" + num(k) + " must be positive");
  if (k % block != 0)
    throw Error(ErrorCode::kBadShape, "", suffix,
                "K=" + num(k) + " is not a multiple of the " + format + " block " + num(block));
}

// Two codes per byte, the even k in the low nibble -> one code per byte. `shape` is how the
// format stores the n * k / 2 bytes ([N, K/2] unless given: gpt-oss [N, K/32, 16]).
std::vector<uint8_t> unpack_nibbles(const Tensor& w, const std::string& suffix, int64_t n,
                                    int64_t k, const Shape& shape = {}) {
  if (w.dtype != DType::kU8)
    throw Error(ErrorCode::kBadDtype, "", suffix,
                std::string("dtype ") + dtype_name(w.dtype) + ", expected U8 (two e2m1 per byte)");
  check_shape(w, suffix, shape.empty() ? Shape{n, k / 2} : shape);
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (size_t i = 0; i < w.data.size(); ++i) {
    codes[2 * i] = w.data[i] & 0x0f;
    codes[2 * i + 1] = static_cast<uint8_t>(w.data[i] >> 4);
  }
  return codes;
}

Tensor pack_nibbles(const QuantTensor& q, const std::string& suffix, const Shape& shape = {}) {
  Tensor w(suffix, DType::kU8, shape.empty() ? Shape{q.n, q.k / 2} : shape);
  w.data.resize(static_cast<size_t>(q.n * q.k / 2));
  for (size_t i = 0; i < w.data.size(); ++i) {
    const uint8_t lo = q.codes[2 * i], hi = q.codes[2 * i + 1];
    if ((lo | hi) > 0x0f)
      throw Error(ErrorCode::kInternal, "", suffix,
                  "canonical e2m1 code above 15 at flat index " + num(static_cast<int64_t>(2 * i)));
    w.data[i] = static_cast<uint8_t>(lo | hi << 4);
  }
  return w;
}

// NVFP4 block scales: float8_e4m3fn [N, K/16], never NaN (0x7f / 0xff; e4m3fn has no inf).
std::vector<uint8_t> read_e4m3_block_scales(const Tensor& s, int64_t n, int64_t k) {
  if (s.dtype != DType::kF8_E4M3)
    throw Error(ErrorCode::kBadDtype, "", "weight_scale",
                std::string("dtype ") + dtype_name(s.dtype) + ", expected F8_E4M3");
  check_shape(s, "weight_scale", {n, k / kNvBlock});
  check_e4m3_scale_codes(s.data, k / kNvBlock, "weight_scale");
  return s.data;
}

// MX block scales: E8M0 codes [N, K/32] as U8 or F8_E8M0, through the one check of their values
// (check_e8m0_scale_codes).
std::vector<uint8_t> read_e8m0_block_scales(const Tensor& s, const std::string& suffix, int64_t n,
                                            int64_t k) {
  if (!is_scale_byte_dtype(s.dtype))
    throw Error(ErrorCode::kBadDtype, "", suffix,
                std::string("dtype ") + dtype_name(s.dtype) + ", expected U8 or F8_E8M0");
  check_shape(s, suffix, {n, k / kMxBlock});
  check_e8m0_scale_codes(s.data, k / kMxBlock, suffix);
  return s.data;
}

// The one F32 of a global scale tensor ([] or [1]); refuses 0, negative, NaN and inf (vLLM
// divides by it or multiplies every block by it: any of these poisons the whole Linear), and an
// encode divisor whose reciprocal, the decode scale vLLM computes (1.0 / weight_global_scale), is
// infinite.
float read_global_scale(const TensorMap& by_suffix, const std::string& suffix,
                        GlobalScale convention) {
  const Tensor& t = require_tensor(by_suffix, suffix, "NVFP4 Linear");
  if (t.dtype != DType::kF32)
    throw Error(ErrorCode::kBadDtype, "", suffix,
                std::string("dtype ") + dtype_name(t.dtype) + ", expected F32");
  if (numel(t.shape) != 1 || t.shape.size() > 1)
    throw Error(ErrorCode::kBadShape, "", suffix,
                "shape " + shape_str(t.shape) + ", expected [] or [1] (one global scale)");
  float g;
  std::memcpy(&g, t.data.data(), 4);
  if (!std::isfinite(g) || !(g > 0.0f))
    throw Error(ErrorCode::kBadValue, "", suffix,
                "global scale " + float_text(g) + ": must be positive and finite");
  if (convention == GlobalScale::kEncodeDivisor && !std::isfinite(1.0f / g))
    throw Error(ErrorCode::kBadValue, "", suffix,
                "global scale " + float_text(g) +
                    " (an encode divisor): its reciprocal, the decode scale, is infinite");
  return g;
}

// The tensor names of one NVFP4 format: weight, second-level weight scale, activation scale.
struct Nvfp4Names {
  const char* weight;
  const char* global;
  const char* input;
};

// W4A4 (QuantSpec::input_global_scale set) reads the Linear's activation global scale too, with
// the global scale's checks (vLLM divides by it or multiplies the weights' alphas by it).
QuantTensor unpack_nvfp4(const QuantSpec& spec, const TensorMap& by_suffix, int64_t n, int64_t k,
                         const Nvfp4Names& names) {
  check_dims(n, k, kNvBlock, names.weight, "NVFP4");
  const Tensor& w = require_tensor(by_suffix, names.weight, "NVFP4 Linear");
  const Tensor& s = require_tensor(by_suffix, "weight_scale", "NVFP4 Linear");
  QuantTensor q(spec, 1, n, k);
  q.codes = unpack_nibbles(w, names.weight, n, k);
  q.scales = read_e4m3_block_scales(s, n, k);
  q.global_scales = {read_global_scale(by_suffix, names.global, spec.global_scale)};
  if (spec.input_global_scale != GlobalScale::kNone)
    q.input_scales = {read_global_scale(by_suffix, names.input, spec.input_global_scale)};
  q.check_consistent("nvfp4");
  return q;
}

void check_packable(const QuantTensor& q, const QuantSpec& want, const char* format) {
  if (q.spec() != want || !q.zeros.empty() || !q.g_idx.empty())
    throw Error(ErrorCode::kUnsupported, "", "weight",
                std::string("not a ") + format + " tensor (e2m1 codes, group " +
                    num(want.group_size) + ", scale dtype " + dtype_name(want.scale_dtype) +
                    ", no zeros, no g_idx; have group " + num(q.group_size) + ", scale dtype " +
                    dtype_name(q.scale_dtype) + ")");
  if (q.experts != 1)
    throw Error(ErrorCode::kInternal, "", "weight",
                "source codecs pack one Linear, got " + num(q.experts) + " experts");
  if (q.global_scale != GlobalScale::kNone && q.global_shards != 1)
    throw Error(ErrorCode::kInternal, "", "weight",
                "one Linear has one global scale, got " + num(q.global_shards) + " shards");
  check_dims(q.n, q.k, want.group_size, "weight", format);
  q.check_consistent(format);
}

Tensor one_f32(const std::string& name, const Shape& shape, float v) {
  Tensor t(name, DType::kF32, shape);
  t.data.resize(4);
  std::memcpy(t.data.data(), &v, 4);
  return t;
}

TensorMap pack_nvfp4(const QuantTensor& q, const QuantSpec& want, const Nvfp4Names& names,
                     const Shape& global_shape) {
  check_packable(q, want, "NVFP4");
  TensorMap out;
  out.emplace(names.weight, pack_nibbles(q, names.weight));
  Tensor s("weight_scale", DType::kF8_E4M3, {q.n, q.k / kNvBlock});
  s.data = q.scales;
  out.emplace("weight_scale", std::move(s));
  out.emplace(names.global, one_f32(names.global, global_shape, q.global_scales.at(0)));
  if (q.input_global_scale != GlobalScale::kNone)
    out.emplace(names.input, one_f32(names.input, global_shape, q.input_scales.at(0)));
  return out;
}

QuantSpec fp4_spec(int64_t group, DType scale_dtype, GlobalScale gs) {
  QuantSpec s;
  s.kind = CodeKind::kFp4E2M1;
  s.bits = 4;
  s.group_size = group;
  s.scale_dtype = scale_dtype;
  s.global_scale = gs;
  return s;
}

QuantParams fp4_params(QuantMethod m, int64_t group, bool dynamic_input = true) {
  QuantParams p;
  p.method = m;
  p.bits = 4;
  p.group_size = group;
  p.dynamic_input = dynamic_input;
  return p;
}

// An NVFP4 format's spec: W4A4 (dynamic_input false) carries the activation global scale in the
// weight global scale's convention.
QuantSpec nvfp4_spec(const QuantParams& p, GlobalScale convention) {
  QuantSpec s = fp4_spec(kNvBlock, DType::kF8_E4M3, convention);
  if (!p.dynamic_input) s.input_global_scale = convention;
  return s;
}

constexpr Nvfp4Names kModeloptNames = {"weight", "weight_scale_2", "input_scale"};
constexpr Nvfp4Names kCtNvfp4Names = {"weight_packed", "weight_global_scale", "input_global_scale"};

}  // namespace

// ---- ModelOpt NVFP4 ----------------------------------------------------------------------------

std::vector<std::string> modelopt_nvfp4_required_suffixes(const QuantParams& p) {
  if (!p.dynamic_input) return {"weight", "weight_scale", "weight_scale_2", "input_scale"};
  return {"weight", "weight_scale", "weight_scale_2"};
}
std::vector<std::string> modelopt_nvfp4_optional_suffixes(const QuantParams& p) {
  if (!p.dynamic_input) return {};
  return {"input_scale"};  // not read for a weight-only config
}
QuantSpec modelopt_nvfp4_spec_for(const QuantParams& p) {
  return nvfp4_spec(p, GlobalScale::kDecodeMultiplier);
}
QuantTensor unpack_modelopt_nvfp4(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                                  int64_t k) {
  return unpack_nvfp4(modelopt_nvfp4_spec_for(p), by_suffix, n, k, kModeloptNames);
}
TensorMap pack_modelopt_nvfp4(const QuantParams& p, const QuantTensor& q) {
  // ModelOpt saves weight_scale_2 and input_scale as 0-d tensors
  // (NVFP4QTensor.get_weights_scaling_factor_2, the input quantizer's amax / (6 * 448)).
  return pack_nvfp4(q, modelopt_nvfp4_spec_for(p), kModeloptNames, {});
}
std::pair<int64_t, int64_t> modelopt_nvfp4_logical_shape(
    const QuantParams&, const std::map<std::string, TensorView>& by_suffix) {
  const Shape& s = linear_tensor_shape(by_suffix, "weight");  // [N, K/2]
  return {s[0], 2 * s[1]};
}
std::vector<QuantParams> modelopt_nvfp4_param_space() {
  // Weight-only and W4A4 (the activation global scale on every Linear).
  return {fp4_params(QuantMethod::kModeloptNvfp4, kNvBlock),
          fp4_params(QuantMethod::kModeloptNvfp4, kNvBlock, /*dynamic_input=*/false)};
}

// ---- compressed-tensors nvfp4-pack-quantized ----------------------------------------------------

std::vector<std::string> ct_nvfp4_required_suffixes(const QuantParams& p) {
  if (!p.dynamic_input)
    return {"weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"};
  return {"weight_packed", "weight_scale", "weight_global_scale"};
}
std::vector<std::string> ct_nvfp4_optional_suffixes(const QuantParams& p) {
  if (!p.dynamic_input) return {};
  return {"input_global_scale"};  // not read for NVFP4A16
}
QuantSpec ct_nvfp4_spec_for(const QuantParams& p) {
  return nvfp4_spec(p, GlobalScale::kEncodeDivisor);
}
QuantTensor unpack_ct_nvfp4(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                            int64_t k) {
  return unpack_nvfp4(ct_nvfp4_spec_for(p), by_suffix, n, k, kCtNvfp4Names);
}
TensorMap pack_ct_nvfp4(const QuantParams& p, const QuantTensor& q) {
  return pack_nvfp4(q, ct_nvfp4_spec_for(p), kCtNvfp4Names, {1});
}
std::vector<QuantParams> ct_nvfp4_param_space() {
  // Weight-only and W4A4 (the activation global scale on every Linear).
  return {fp4_params(QuantMethod::kCtNvfp4, kNvBlock),
          fp4_params(QuantMethod::kCtNvfp4, kNvBlock, /*dynamic_input=*/false)};
}

std::pair<int64_t, int64_t> ct_fp4_logical_shape(
    const QuantParams&, const std::map<std::string, TensorView>& by_suffix) {
  const Shape& s = linear_tensor_shape(by_suffix, "weight_packed");  // [N, K/2]
  return {s[0], 2 * s[1]};
}

// ---- compressed-tensors mxfp4-pack-quantized ----------------------------------------------------

std::vector<std::string> ct_mxfp4_required_suffixes(const QuantParams&) {
  return {"weight_packed", "weight_scale"};
}
std::vector<std::string> ct_mxfp4_optional_suffixes(const QuantParams&) {
  return {"input_global_scale"};
}
QuantSpec ct_mxfp4_spec_for(const QuantParams&) {
  return fp4_spec(kMxBlock, DType::kU8, GlobalScale::kNone);
}
QuantTensor unpack_ct_mxfp4(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                            int64_t k) {
  check_dims(n, k, kMxBlock, "weight_packed", "MXFP4");
  const Tensor& w = require_tensor(by_suffix, "weight_packed", "MXFP4 Linear");
  const Tensor& s = require_tensor(by_suffix, "weight_scale", "MXFP4 Linear");
  QuantTensor q(ct_mxfp4_spec_for(p), 1, n, k);
  q.codes = unpack_nibbles(w, "weight_packed", n, k);
  q.scales = read_e8m0_block_scales(s, "weight_scale", n, k);
  q.check_consistent("mxfp4");
  return q;
}
TensorMap pack_ct_mxfp4(const QuantParams& p, const QuantTensor& q) {
  QuantSpec want = ct_mxfp4_spec_for(p);
  // U8 and F8_E8M0 hold the same codes; compressed-tensors writes uint8.
  if (q.scale_dtype == DType::kF8_E8M0) want.scale_dtype = DType::kF8_E8M0;
  check_packable(q, want, "MXFP4");
  TensorMap out;
  out.emplace("weight_packed", pack_nibbles(q, "weight_packed"));
  Tensor s("weight_scale", DType::kU8, {q.n, q.k / kMxBlock});
  s.data = q.scales;
  out.emplace("weight_scale", std::move(s));
  return out;
}
std::vector<QuantParams> ct_mxfp4_param_space() {
  return {fp4_params(QuantMethod::kCtMxfp4, kMxBlock)};
}

// ---- gpt-oss MXFP4 (quant_method "mxfp4") -------------------------------------------------------

std::vector<std::string> gpt_oss_mxfp4_required_suffixes(const QuantParams&) {
  return {"blocks", "scales"};
}
std::vector<std::string> gpt_oss_mxfp4_optional_suffixes(const QuantParams&) {
  return {};
}
QuantSpec gpt_oss_mxfp4_spec_for(const QuantParams&) {
  return fp4_spec(kMxBlock, DType::kU8, GlobalScale::kNone);
}
QuantTensor unpack_gpt_oss_mxfp4(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                                 int64_t k) {
  check_dims(n, k, kMxBlock, "blocks", "MXFP4");
  const Tensor& w = require_tensor(by_suffix, "blocks", "gpt-oss MXFP4 expert");
  const Tensor& s = require_tensor(by_suffix, "scales", "gpt-oss MXFP4 expert");
  QuantTensor q(gpt_oss_mxfp4_spec_for(p), 1, n, k);
  q.codes = unpack_nibbles(w, "blocks", n, k, {n, k / kMxBlock, kMxBlock / 2});
  q.scales = read_e8m0_block_scales(s, "scales", n, k);
  q.check_consistent("gpt-oss mxfp4");
  return q;
}
TensorMap pack_gpt_oss_mxfp4(const QuantParams& p, const QuantTensor& q) {
  QuantSpec want = gpt_oss_mxfp4_spec_for(p);
  if (q.scale_dtype == DType::kF8_E8M0) want.scale_dtype = DType::kF8_E8M0;
  check_packable(q, want, "MXFP4");
  TensorMap out;
  out.emplace("blocks", pack_nibbles(q, "blocks", {q.n, q.k / kMxBlock, kMxBlock / 2}));
  Tensor s("scales", DType::kU8, {q.n, q.k / kMxBlock});
  s.data = q.scales;
  out.emplace("scales", std::move(s));
  return out;
}
std::pair<int64_t, int64_t> gpt_oss_mxfp4_logical_shape(
    const QuantParams&, const std::map<std::string, TensorView>& by_suffix) {
  auto it = by_suffix.find("blocks");
  if (it == by_suffix.end())
    throw Error(ErrorCode::kMissingTensor, "", "blocks", "expert has no 'blocks' tensor");
  const Shape& s = it->second.shape;  // [N, K/32, 16]
  if (s.size() != 3 || s[2] != kMxBlock / 2)
    throw Error(ErrorCode::kBadShape, "", "blocks",
                "shape " + shape_str(s) + ", expected [N, K/32, 16] (32 e2m1 codes per block)");
  return {s[0], s[1] * kMxBlock};
}
std::vector<QuantParams> gpt_oss_mxfp4_param_space() {
  return {fp4_params(QuantMethod::kGptOssMxfp4, kMxBlock)};
}

// ---- quantisers ---------------------------------------------------------------------------------

uint8_t float_to_e2m1(float x) {
  const float a = std::fabs(x);
  // Midpoints between neighbouring magnitudes; a tie goes to the even code (<= below an even
  // code's upper midpoint, < below an odd one's). Counted without branches: synth quantises
  // gpt-oss-120b's 115 G weights through here, and random values defeat branch prediction.
  // NaN compares false everywhere and takes the largest magnitude, as an if-chain's else would.
  const int m = std::isnan(a) ? 7
                              : (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) +
                                    (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(m | (std::signbit(x) ? 8 : 0));
}

QuantTensor quantize_nvfp4(const float* w, int64_t n, int64_t k, float g, GlobalScale convention) {
  check_dims(n, k, kNvBlock, "weight", "NVFP4");
  if (!std::isfinite(g) || !(g > 0.0f) || convention == GlobalScale::kNone)
    throw Error(ErrorCode::kInternal, "", "", "quantize_nvfp4: bad global scale");
  QuantTensor q(fp4_spec(kNvBlock, DType::kF8_E4M3, convention), 1, n, k);
  const float stored = convention == GlobalScale::kDecodeMultiplier ? g : 1.0f / g;
  q.global_scales = {stored};
  const int64_t blocks = n * (k / kNvBlock);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = w + b * kNvBlock;
    float amax = 0.0f;
    for (int64_t i = 0; i < kNvBlock; ++i) {
      if (!std::isfinite(x[i]))
        throw Error(ErrorCode::kBadValue, "", "",
                    "quantize_nvfp4: non-finite input at flat index " + num(b * kNvBlock + i));
      amax = std::fmax(amax, std::fabs(x[i]));
    }
    const uint8_t s = float_to_e4m3_satfinite(amax / 6.0f / g);
    q.scales[static_cast<size_t>(b)] = s;
    // The value the block decodes with, in the stored convention (dequantize_expert's order).
    const float eff = convention == GlobalScale::kDecodeMultiplier ? e4m3_to_float(s) * stored
                                                                   : e4m3_to_float(s) / stored;
    for (int64_t i = 0; i < kNvBlock; ++i)
      q.codes[static_cast<size_t>(b * kNvBlock + i)] =
          eff > 0.0f ? float_to_e2m1(x[i] / eff) : static_cast<uint8_t>(0);
  }
  return q;
}

QuantTensor quantize_mxfp4(const float* w, int64_t n, int64_t k) {
  check_dims(n, k, kMxBlock, "weight", "MXFP4");
  QuantTensor q(fp4_spec(kMxBlock, DType::kU8, GlobalScale::kNone), 1, n, k);
  const int64_t blocks = n * (k / kMxBlock);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = w + b * kMxBlock;
    float amax = 0.0f;
    for (int64_t i = 0; i < kMxBlock; ++i) {
      if (!std::isfinite(x[i]))
        throw Error(ErrorCode::kBadValue, "", "",
                    "quantize_mxfp4: non-finite input at flat index " + num(b * kMxBlock + i));
      // Finite here, so a plain compare is fmax (which is a libm call per value).
      const float a = std::fabs(x[i]);
      amax = a > amax ? a : amax;
    }
    int c = 0;
    if (amax > 0.0f) {
      int e;
      std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1): floor(log2(amax)) = e - 1
      c = std::min(254, std::max(0, (e - 1) - 2 + 127));
    }
    q.scales[static_cast<size_t>(b)] = static_cast<uint8_t>(c);
    const float inv = std::ldexp(1.0f, 127 - c);  // exact: 2^(127-c) for c in [0, 254]
    for (int64_t i = 0; i < kMxBlock; ++i)
      q.codes[static_cast<size_t>(b * kMxBlock + i)] = float_to_e2m1(x[i] * inv);
  }
  return q;
}

}  // namespace moepack
