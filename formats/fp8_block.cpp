// DeepSeek-style FP8 block checkpoint Linear <-> QuantTensor (spec/checkpoints.md §3.2,
// spec/mxfp8_trtllm.md §5). Mirrors vLLM Fp8MoEMethod.create_weights (block_quant).
//
//   weight           F8_E4M3 [N, K]
//   weight_scale_inv F32 [ceil(N/128), ceil(K/128)]   x[n, k] = e4m3(w[n, k]) * s[n/128, k/128]
//
// Canonical: kind kFp8E4M3, bits 8, group_size 128 (along K), scale_block_n 128 (along N),
// scale_dtype F32, symmetric.
#include "formats/fp8_block.h"

#include <cmath>
#include <cstring>

#include "formats/fp8.h"

namespace moepack {
namespace {

constexpr int64_t kBlock = 128;

void check_block_params(const QuantParams& p, const char* scale = "weight_scale_inv") {
  if (p.block_n != kBlock || p.block_k != kBlock)
    throw Error(ErrorCode::kUnsupported, "", scale,
                "weight_block_size [" + std::to_string(p.block_n) + ", " +
                    std::to_string(p.block_k) + "]: only [128, 128] is supported");
}

// Scales are dequant multipliers: NaN, Inf or negative ones cannot come from a real
// quantiser and would poison every output they touch.
void check_scales(const std::vector<uint8_t>& bytes, const std::string& what,
                  DType dtype = DType::kF32) {
  const int eb = dtype_bits(dtype) / 8;
  const size_t count = bytes.size() / static_cast<size_t>(eb);
  for (size_t i = 0; i < count; ++i) {
    const float v = scale_to_float(bytes.data() + i * static_cast<size_t>(eb), dtype);
    if (!std::isfinite(v) || v < 0.0f)
      throw Error(ErrorCode::kBadValue, "", what,
                  "scale " + std::to_string(v) + " at flat index " + std::to_string(i) +
                      " (must be finite and >= 0)");
  }
}

}  // namespace

std::vector<std::string> fp8_block_required_suffixes(const QuantParams&) {
  return {"weight", "weight_scale_inv"};
}

std::vector<std::string> fp8_block_optional_suffixes(const QuantParams&) {
  // activation_scheme "dynamic": no input_scale in block-FP8 checkpoints.
  return {};
}

QuantTensor unpack_fp8_block(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                             int64_t k) {
  check_block_params(p);
  if (n <= 0 || k <= 0)
    throw Error(ErrorCode::kBadShape, "", "weight",
                "N=" + std::to_string(n) + ", K=" + std::to_string(k) + " must be positive");
  const Tensor& w = require_tensor(by_suffix, "weight", "FP8 block Linear");
  const Tensor& s = require_tensor(by_suffix, "weight_scale_inv", "FP8 block Linear");
  if (w.dtype != DType::kF8_E4M3)
    throw Error(ErrorCode::kBadDtype, "", "weight",
                std::string("dtype ") + dtype_name(w.dtype) + ", expected F8_E4M3");
  if (s.dtype != DType::kF32)
    throw Error(ErrorCode::kBadDtype, "", "weight_scale_inv",
                std::string("dtype ") + dtype_name(s.dtype) + ", expected F32");
  const Shape ws{n, k}, ss{(n + kBlock - 1) / kBlock, (k + kBlock - 1) / kBlock};
  if (w.shape != ws)
    throw Error(ErrorCode::kBadShape, "", "weight",
                "shape " + shape_str(w.shape) + ", expected " + shape_str(ws));
  if (s.shape != ss)
    throw Error(ErrorCode::kBadShape, "", "weight_scale_inv",
                "shape " + shape_str(s.shape) + ", expected " + shape_str(ss));
  check_scales(s.data, "weight_scale_inv");
  check_e4m3_codes(w.data, k, "weight");

  QuantTensor q(fp8_block_spec(kBlock, kBlock), 1, n, k);
  q.codes = w.data;
  q.scales = s.data;
  q.check_consistent("fp8_block");
  return q;
}

TensorMap pack_fp8_block(const QuantParams& p, const QuantTensor& q) {
  check_block_params(p);
  if (q.kind != CodeKind::kFp8E4M3 || q.bits != 8 || q.group_size != kBlock ||
      q.scale_block_n != kBlock || q.scale_dtype != DType::kF32 || !q.zeros.empty() ||
      !q.g_idx.empty())
    throw Error(ErrorCode::kUnsupported, "", "weight",
                "not an FP8 128x128 block tensor (have group " + std::to_string(q.group_size) +
                    ", scale_block_n " + std::to_string(q.scale_block_n) + ", scale dtype " +
                    dtype_name(q.scale_dtype) + ")");
  if (q.experts != 1)
    throw Error(ErrorCode::kInternal, "", "weight",
                "source codecs pack one Linear, got " + std::to_string(q.experts) + " experts");
  q.check_consistent("fp8_block");
  check_scales(q.scales, "weight_scale_inv");
  TensorMap out;
  Tensor w("weight", DType::kF8_E4M3, {q.n, q.k});
  w.data = q.codes;
  Tensor s("weight_scale_inv", DType::kF32, {q.scale_rows(), q.groups()});
  s.data = q.scales;
  out.emplace("weight", std::move(w));
  out.emplace("weight_scale_inv", std::move(s));
  return out;
}

QuantSpec fp8_block_spec_for(const QuantParams& p) {
  return fp8_block_spec(p.block_n, p.block_k);
}

QuantSpec fp8_block_spec(int64_t block_n, int64_t block_k) {
  QuantSpec s;
  s.kind = CodeKind::kFp8E4M3;
  s.bits = 8;
  s.group_size = block_k;
  s.scale_block_n = block_n;
  s.scale_dtype = DType::kF32;
  return s;
}

std::vector<QuantParams> fp8_block_param_space() {
  QuantParams p;
  p.method = QuantMethod::kFp8Block;
  p.bits = 8;
  p.group_size = 128;
  return {p};
}

// ---- compressed-tensors FP8_BLOCK --------------------------------------------------------------

std::vector<std::string> ct_fp8_block_required_suffixes(const QuantParams&) {
  return {"weight", "weight_scale"};
}

std::vector<std::string> ct_fp8_block_optional_suffixes(const QuantParams&) {
  // Listed so that static activation scales reach unpack and are refused there by name.
  return {"input_scale"};
}

QuantTensor unpack_ct_fp8_block(const QuantParams& p, const TensorMap& by_suffix, int64_t n,
                                int64_t k) {
  check_block_params(p, "weight_scale");
  if (find_tensor(by_suffix, "input_scale") || !p.dynamic_input)
    throw Error(ErrorCode::kUnsupported, "", "input_scale",
                "static input scales (FP8 block MoE quantises activations per token group at run "
                "time)");
  if (n <= 0 || k <= 0)
    throw Error(ErrorCode::kBadShape, "", "weight",
                "N=" + std::to_string(n) + ", K=" + std::to_string(k) + " must be positive");
  const Tensor& w = require_tensor(by_suffix, "weight", "FP8 block Linear");
  const Tensor& s = require_tensor(by_suffix, "weight_scale", "FP8 block Linear");
  if (w.dtype != DType::kF8_E4M3)
    throw Error(ErrorCode::kBadDtype, "", "weight",
                std::string("dtype ") + dtype_name(w.dtype) + ", expected F8_E4M3");
  if (s.dtype != DType::kBF16 && s.dtype != DType::kF16 && s.dtype != DType::kF32)
    throw Error(ErrorCode::kBadDtype, "", "weight_scale",
                std::string("dtype ") + dtype_name(s.dtype) + ", expected BF16, F16 or F32");
  const Shape ws{n, k}, ss{(n + kBlock - 1) / kBlock, (k + kBlock - 1) / kBlock};
  if (w.shape != ws)
    throw Error(ErrorCode::kBadShape, "", "weight",
                "shape " + shape_str(w.shape) + ", expected " + shape_str(ws));
  if (s.shape != ss)
    throw Error(ErrorCode::kBadShape, "", "weight_scale",
                "shape " + shape_str(s.shape) + ", expected " + shape_str(ss) +
                    " ([ceil(N/128), ceil(K/128)])");
  check_scales(s.data, "weight_scale", s.dtype);
  check_e4m3_codes(w.data, k, "weight");
  QuantSpec spec = fp8_block_spec(kBlock, kBlock);
  spec.scale_dtype = s.dtype;
  QuantTensor q(spec, 1, n, k);
  q.codes = w.data;
  q.scales = s.data;
  q.check_consistent("ct_fp8_block");
  return q;
}

TensorMap pack_ct_fp8_block(const QuantParams& p, const QuantTensor& q) {
  check_block_params(p, "weight_scale");
  if (q.kind != CodeKind::kFp8E4M3 || q.bits != 8 || q.group_size != kBlock ||
      q.scale_block_n != kBlock || !q.zeros.empty() || !q.g_idx.empty() ||
      (q.scale_dtype != DType::kBF16 && q.scale_dtype != DType::kF16 &&
       q.scale_dtype != DType::kF32))
    throw Error(ErrorCode::kUnsupported, "", "weight",
                "not an FP8 128x128 block tensor with float scales (have group " +
                    std::to_string(q.group_size) + ", scale_block_n " +
                    std::to_string(q.scale_block_n) + ", scale dtype " + dtype_name(q.scale_dtype) +
                    ")");
  if (q.experts != 1)
    throw Error(ErrorCode::kInternal, "", "weight",
                "source codecs pack one Linear, got " + std::to_string(q.experts) + " experts");
  q.check_consistent("ct_fp8_block");
  check_scales(q.scales, "weight_scale", q.scale_dtype);
  TensorMap out;
  Tensor w("weight", DType::kF8_E4M3, {q.n, q.k});
  w.data = q.codes;
  Tensor s("weight_scale", q.scale_dtype, {q.scale_rows(), q.groups()});
  s.data = q.scales;
  out.emplace("weight", std::move(w));
  out.emplace("weight_scale", std::move(s));
  return out;
}

QuantSpec ct_fp8_block_spec_for(const QuantParams& p) {
  QuantSpec s = fp8_block_spec(p.block_n, p.block_k);
  s.scale_dtype = p.dtype;  // compressed-tensors writes scales in the model dtype
  return s;
}

std::vector<std::string> ct_fp8_block_refusals(const QuantParams& p) {
  if (p.dynamic_input) return {};
  return {
      "static input scales are not supported (FP8 block MoE quantises activations at run time)"};
}

std::vector<QuantParams> ct_fp8_block_param_space() {
  std::vector<QuantParams> out;
  for (DType d : {DType::kBF16, DType::kF16}) {
    QuantParams p;
    p.method = QuantMethod::kCtFp8Block;
    p.bits = 8;
    p.group_size = 128;
    p.dtype = d;
    out.push_back(p);
  }
  return out;
}

}  // namespace moepack
