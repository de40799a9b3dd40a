// FP8 channel / per-tensor checkpoint Linear <-> QuantTensor (formats/fp8_scaled.h).
#include "formats/fp8_scaled.h"

#include <cmath>
#include <cstring>

#include "formats/fp8.h"

namespace moepack {
namespace {

bool is_float_dtype(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

std::string num(int64_t v) {
  return std::to_string(v);
}

// A weight or input scale multiplies every value it covers: NaN, inf, zero or negative ones
// cannot come from a quantiser (compressed-tensors and ModelOpt clamp amax away from zero) and
// would poison or erase the whole row.
void check_positive_scales(const Tensor& s, const std::string& suffix) {
  const int eb = dtype_bits(s.dtype) / 8;
  const size_t count = s.data.size() / static_cast<size_t>(eb);
  for (size_t i = 0; i < count; ++i) {
    const float v = scale_to_float(s.data.data() + i * static_cast<size_t>(eb), s.dtype);
    if (!std::isfinite(v) || !(v > 0.0f))
      throw Error(ErrorCode::kBadValue, "", suffix,
                  "scale " + std::to_string(v) + " at index " + std::to_string(i) +
                      " (must be finite and > 0)");
  }
}

const Tensor& read_weight(const TensorMap& by_suffix, int64_t n, int64_t k, const char* what) {
  if (n <= 0 || k <= 0)
    throw Error(ErrorCode::kBadShape, "", "weight",
                "N=" + num(n) + ", K=" + num(k) + " must be positive");
  const Tensor& w = require_tensor(by_suffix, "weight", what);
  if (w.dtype != DType::kF8_E4M3)
    throw Error(ErrorCode::kBadDtype, "", "weight",
                std::string("dtype ") + dtype_name(w.dtype) + ", expected F8_E4M3");
  if (w.shape != Shape{n, k})
    throw Error(ErrorCode::kBadShape, "", "weight",
                "shape " + shape_str(w.shape) + ", expected " + shape_str(Shape{n, k}));
  check_e4m3_codes(w.data, k, "weight");
  return w;
}

const Tensor& read_scale(const TensorMap& by_suffix, const std::string& suffix, const char* what,
                         bool f32_only) {
  const Tensor& s = require_tensor(by_suffix, suffix, what);
  if (f32_only ? s.dtype != DType::kF32 : !is_float_dtype(s.dtype))
    throw Error(ErrorCode::kBadDtype, "", suffix,
                std::string("dtype ") + dtype_name(s.dtype) +
                    (f32_only ? ", expected F32" : ", expected F32, BF16 or F16"));
  return s;
}

// The one scale of a per-tensor scale tensor ([] or [1]).
const Tensor& read_scalar(const TensorMap& by_suffix, const std::string& suffix, const char* what,
                          bool f32_only) {
  const Tensor& s = read_scale(by_suffix, suffix, what, f32_only);
  if (numel(s.shape) != 1 || s.shape.size() > 1)
    throw Error(ErrorCode::kBadShape, "", suffix,
                "shape " + shape_str(s.shape) + ", expected [] or [1] (one per-tensor scale)");
  check_positive_scales(s, suffix);
  return s;
}

QuantSpec spec_with(DType scale_dtype) {
  QuantSpec s;
  s.kind = CodeKind::kFp8E4M3;
  s.bits = 8;
  s.group_size = -1;
  s.scale_block_n = 1;
  s.symmetric = true;
  s.scale_dtype = scale_dtype;
  return s;
}

void check_packable(const QuantTensor& q, const char* what) {
  if (q.kind != CodeKind::kFp8E4M3 || q.bits != 8 || q.group_size > 0 || q.scale_block_n != 1 ||
      !q.zeros.empty() || !q.g_idx.empty() || q.global_scale != GlobalScale::kNone ||
      !is_float_dtype(q.scale_dtype))
    throw Error(ErrorCode::kUnsupported, "", "weight",
                std::string("not ") + what + " (e4m3 codes, one float scale per row; have group " +
                    num(q.group_size) + ", scale_block_n " + num(q.scale_block_n) +
                    ", scale dtype " + dtype_name(q.scale_dtype) + ")");
  if (q.experts != 1)
    throw Error(ErrorCode::kInternal, "", "weight",
                "source codecs pack one Linear, got " + num(q.experts) + " experts");
  q.check_consistent(what);
}

bool is_modelopt(const QuantParams& p) {
  return p.method == QuantMethod::kModeloptFp8;
}

// A packed Linear: the e4m3 codes under `weight` and its (checked) scale tensor.
TensorMap weight_and_scale(const QuantTensor& q, Tensor scale) {
  check_positive_scales(scale, "weight_scale");
  Tensor w("weight", DType::kF8_E4M3, {q.n, q.k});
  w.data = q.codes;
  TensorMap out;
  out.emplace("weight", std::move(w));
  out.emplace("weight_scale", std::move(scale));
  return out;
}

// Every legal parameter set of a channel or per-tensor FP8 source: one per activation dtype.
std::vector<QuantParams> fp8_scaled_param_space(QuantMethod method, bool dynamic_input) {
  std::vector<QuantParams> out;
  for (DType d : {DType::kBF16, DType::kF16}) {
    QuantParams p;
    p.method = method;
    p.bits = 8;
    p.group_size = -1;
    p.dtype = d;
    p.dynamic_input = dynamic_input;
    out.push_back(p);
  }
  return out;
}

}  // namespace

QuantSpec fp8_scaled_spec_for(const QuantParams& p) {
  return spec_with(is_modelopt(p) ? DType::kF32 : p.dtype);
}

// ---- compressed-tensors FP8 channel ----------------------------------------------------------

std::vector<std::string> ct_fp8_channel_required_suffixes(const QuantParams&) {
  return {"weight", "weight_scale"};
}

std::vector<std::string> ct_fp8_channel_optional_suffixes(const QuantParams&) {
  // Listed so that a static activation scale reaches unpack and is refused there by name.
  return {"input_scale"};
}

QuantTensor unpack_ct_fp8_channel(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                                  int64_t k) {
  if (find_tensor(by_suffix, "input_scale") || !p.dynamic_input)
    throw Error(ErrorCode::kUnsupported, "", "input_scale",
                "static input scales with channel weights (FP8 channel MoE quantises activations "
                "per token at run time)");
  const Tensor& w = read_weight(by_suffix, n, k, "FP8 channel Linear");
  const Tensor& s = read_scale(by_suffix, "weight_scale", "FP8 channel Linear", false);
  if (s.shape != Shape{n, 1})
    throw Error(ErrorCode::kBadShape, "", "weight_scale",
                "shape " + shape_str(s.shape) + ", expected " + shape_str(Shape{n, 1}) +
                    " (one scale per output channel)");
  check_positive_scales(s, "weight_scale");
  QuantTensor q(spec_with(s.dtype), 1, n, k);
  q.codes = w.data;
  q.scales = s.data;
  q.check_consistent("ct_fp8_channel");
  return q;
}

TensorMap pack_ct_fp8_channel(const QuantParams&, const QuantTensor& q) {
  check_packable(q, "an FP8 channel tensor");
  Tensor s("weight_scale", q.scale_dtype, {q.n, 1});
  s.data = q.scales;
  return weight_and_scale(q, std::move(s));
}

std::vector<std::string> ct_fp8_channel_refusals(const QuantParams& p) {
  if (p.dynamic_input) return {};
  return {
      "static input scales with channel weights are not supported (vLLM's FP8 channel MoE "
      "quantises activations per token)"};
}

std::vector<QuantParams> ct_fp8_channel_param_space() {
  return fp8_scaled_param_space(QuantMethod::kCtFp8Channel, /*dynamic_input=*/true);
}

// ---- per-tensor: compressed-tensors FP8 tensor, ModelOpt FP8 ----------------------------------

std::vector<std::string> fp8_tensor_required_suffixes(const QuantParams&) {
  return {"weight", "weight_scale"};
}

std::vector<std::string> fp8_tensor_optional_suffixes(const QuantParams&) {
  return {"input_scale"};
}

QuantTensor unpack_fp8_tensor(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                              int64_t k) {
  const char* what = is_modelopt(p) ? "ModelOpt FP8 Linear" : "FP8 tensor Linear";
  const Tensor& w = read_weight(by_suffix, n, k, what);
  const Tensor& s = read_scalar(by_suffix, "weight_scale", what, is_modelopt(p));
  // The static activation scale: vLLM keeps the max over experts on the layer and Marlin's 16-bit
  // activations never read it, but where a checkpoint has one it must be a scale.
  if (find_tensor(by_suffix, "input_scale"))
    read_scalar(by_suffix, "input_scale", what, is_modelopt(p));
  const int eb = dtype_bits(s.dtype) / 8;
  QuantTensor q(spec_with(s.dtype), 1, n, k);
  q.codes = w.data;
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(q.scales.data() + r * eb, s.data.data(), static_cast<size_t>(eb));
  q.check_consistent("fp8_tensor");
  return q;
}

TensorMap pack_fp8_tensor(const QuantParams& p, const QuantTensor& q) {
  check_packable(q, "an FP8 per-tensor tensor");
  const int eb = q.scale_bytes();
  for (int64_t r = 1; r < q.n; ++r)
    if (std::memcmp(q.scales.data() + r * eb, q.scales.data(), static_cast<size_t>(eb)) != 0)
      throw Error(ErrorCode::kUnsupported, "", "weight_scale",
                  "row " + num(r) +
                      " has another scale than row 0: a per-tensor FP8 Linear "
                      "holds one");
  if (is_modelopt(p) && q.scale_dtype != DType::kF32)
    throw Error(ErrorCode::kUnsupported, "", "weight_scale",
                std::string("ModelOpt FP8 scales are F32, have ") + dtype_name(q.scale_dtype));
  // ModelOpt saves 0-d scales, compressed-tensors [1].
  Tensor s("weight_scale", q.scale_dtype, is_modelopt(p) ? Shape{} : Shape{1});
  s.data.assign(q.scales.begin(), q.scales.begin() + eb);
  return weight_and_scale(q, std::move(s));
}

std::vector<std::string> fp8_tensor_refusals(const QuantParams& p) {
  if (p.method != QuantMethod::kCtFp8Tensor || !p.dynamic_input) return {};
  // CompressedTensorsW8A8Fp8MoEMethod maps a dynamic tensor activation to kFp8Dynamic128Sym
  // (ct2vllm_act), a pair vLLM 0.33's oracle orders apart from the static one; not written.
  return {
      "compressed-tensors per-tensor FP8 weights with dynamic activations are not supported "
      "(static input scales only, compressed-tensors' FP8 preset)"};
}

std::vector<QuantParams> ct_fp8_tensor_param_space() {
  return fp8_scaled_param_space(QuantMethod::kCtFp8Tensor, /*dynamic_input=*/false);
}

std::vector<QuantParams> modelopt_fp8_param_space() {
  return fp8_scaled_param_space(QuantMethod::kModeloptFp8, /*dynamic_input=*/false);
}

}  // namespace moepack
