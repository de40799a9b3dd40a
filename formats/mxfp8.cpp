// MXFP8 checkpoint Linear <-> QuantTensor, and the MXFP8 quantisers (spec/mxfp8_trtllm.md §1, §6).
//
//   weight       F8_E4M3 [N, K]      row n, K contiguous: S EEEE MMM per byte
//   weight_scale U8/F8_E8M0 [N, K/32] byte c = 2^(c-127) for the 32 codes k in [32b, 32b+32)
//
// Canonical: kind kFp8E4M3, bits 8, group_size 32, scale_block_n 1, symmetric, scale_dtype U8
// (E8M0 codes). Mirrors ModelOptMxFp8FusedMoE.create_weights (vLLM) and ModelOpt MXFP8QTensor.
#include "formats/mxfp8.h"

#include <cmath>
#include <cstring>

#include "formats/fp8.h"

namespace moepack {
namespace {

constexpr int64_t kMxBlock = 32;

void check_shape(const Tensor& t, const std::string& suffix, const Shape& want) {
  if (t.shape != want)
    throw Error(ErrorCode::kBadShape, "", suffix,
                "shape " + shape_str(t.shape) + ", expected " + shape_str(want));
}

}  // namespace

std::vector<std::string> mxfp8_required_suffixes(const QuantParams&) {
  return {"weight", "weight_scale"};
}

std::vector<std::string> mxfp8_optional_suffixes(const QuantParams&) {
  // Static activation scales of W8A8 exports; the MXFP8 kernels quantise activations
  // dynamically, so unpack ignores it.
  return {"input_scale"};
}

QuantTensor unpack_mxfp8(const QuantParams&, const TensorMap& by_suffix, int64_t n, int64_t k) {
  if (n <= 0 || k <= 0)
    throw Error(ErrorCode::kBadShape, "", "weight",
                "N=" + std::to_string(n) + ", K=" + std::to_string(k) + " must be positive");
  if (k % kMxBlock != 0)
    throw Error(ErrorCode::kBadShape, "", "weight",
                "K=" + std::to_string(k) + " is not a multiple of the MXFP8 block 32");
  const Tensor& w = require_tensor(by_suffix, "weight", "MXFP8 Linear");
  const Tensor& s = require_tensor(by_suffix, "weight_scale", "MXFP8 Linear");
  if (w.dtype != DType::kF8_E4M3)
    throw Error(ErrorCode::kBadDtype, "", "weight",
                std::string("dtype ") + dtype_name(w.dtype) + ", expected F8_E4M3");
  if (!is_scale_byte_dtype(s.dtype))
    throw Error(ErrorCode::kBadDtype, "", "weight_scale",
                std::string("dtype ") + dtype_name(s.dtype) + ", expected U8 or F8_E8M0");
  check_shape(w, "weight", {n, k});
  check_shape(s, "weight_scale", {n, k / kMxBlock});
  check_e8m0_scale_codes(s.data, k / kMxBlock, "weight_scale");

  check_e4m3_codes(w.data, k, "weight");
  QuantTensor q(mxfp8_spec_for(QuantParams{}), 1, n, k);
  q.codes = w.data;
  q.scales = s.data;
  q.check_consistent("mxfp8");
  return q;
}

TensorMap pack_mxfp8(const QuantParams&, const QuantTensor& q) {
  if (q.kind != CodeKind::kFp8E4M3 || q.bits != 8 || q.group_size != kMxBlock ||
      q.scale_block_n != 1 || !is_scale_byte_dtype(q.scale_dtype) || !q.zeros.empty() ||
      !q.g_idx.empty())
    throw Error(ErrorCode::kUnsupported, "", "weight",
                "not an MXFP8 tensor (need e4m3 codes, group 32, one E8M0 byte scale per row "
                "and block, no zeros, no g_idx; have group " +
                    std::to_string(q.group_size) + ", scale_block_n " +
                    std::to_string(q.scale_block_n) + ", scale dtype " + dtype_name(q.scale_dtype) +
                    ")");
  if (q.experts != 1)
    throw Error(ErrorCode::kInternal, "", "weight",
                "source codecs pack one Linear, got " + std::to_string(q.experts) + " experts");
  if (q.k % kMxBlock != 0)
    throw Error(ErrorCode::kBadShape, "", "weight",
                "K=" + std::to_string(q.k) + " is not a multiple of the MXFP8 block 32");
  q.check_consistent("mxfp8");
  TensorMap out;
  Tensor w("weight", DType::kF8_E4M3, {q.n, q.k});
  w.data = q.codes;
  // ModelOpt and vLLM store E8M0 scales as uint8 (MXFP8_SCALE_DTYPE = torch.uint8).
  Tensor s("weight_scale", DType::kU8, {q.n, q.k / kMxBlock});
  s.data = q.scales;
  out.emplace("weight", std::move(w));
  out.emplace("weight_scale", std::move(s));
  return out;
}

QuantTensor make_mxfp8_tensor(int64_t experts, int64_t n, int64_t k) {
  QuantTensor q(mxfp8_spec_for(QuantParams{}), experts, n, k);
  q.codes.resize(static_cast<size_t>(experts * n * k));
  q.scales.resize(static_cast<size_t>(experts * n * (k / kMxBlock)));
  return q;
}

QuantTensor quantize_mxfp8(const float* w, int64_t experts, int64_t n, int64_t k, MxRecipe recipe) {
  if (experts <= 0 || n <= 0 || k <= 0 || k % kMxBlock != 0)
    throw Error(ErrorCode::kBadShape, "", "",
                "quantize_mxfp8: E=" + std::to_string(experts) + ", N=" + std::to_string(n) +
                    ", K=" + std::to_string(k) + " (K must be a positive multiple of 32)");
  QuantTensor q = make_mxfp8_tensor(experts, n, k);
  const int64_t blocks = experts * n * (k / kMxBlock);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = w + b * kMxBlock;
    uint8_t* out = q.codes.data() + b * kMxBlock;
    float amax = 0.0f;
    for (int64_t i = 0; i < kMxBlock; ++i) {
      if (!std::isfinite(x[i]))
        throw Error(
            ErrorCode::kBadValue, "", "",
            "quantize_mxfp8: non-finite input at flat index " + std::to_string(b * kMxBlock + i));
      amax = std::fmax(amax, std::fabs(x[i]));
    }
    const uint8_t c = mxfp8_scale_code_for_amax(amax);
    q.scales[static_cast<size_t>(b)] = c;
    if (c == 0 && recipe == MxRecipe::kFlashInfer) {
      // The FlashInfer kernel multiplies by a zero reciprocal scale: +-0 keeping each sign.
      for (int64_t i = 0; i < kMxBlock; ++i) out[i] = std::signbit(x[i]) ? 0x80 : 0x00;
      continue;
    }
    // 2^(127-c) is exact in float32 for c in [0, 254] (2^-127 is a float32 subnormal), and
    // x * 2^(127-c) is exact unless it underflows far below e4m3's smallest step.
    const float inv = std::ldexp(1.0f, 127 - static_cast<int>(c));
    for (int64_t i = 0; i < kMxBlock; ++i) out[i] = float_to_e4m3_satfinite(x[i] * inv);
  }
  return q;
}

QuantSpec mxfp8_spec_for(const QuantParams&) {
  QuantSpec s;
  s.kind = CodeKind::kFp8E4M3;
  s.bits = 8;
  s.group_size = kMxBlock;
  s.scale_dtype = DType::kU8;
  return s;
}

std::vector<QuantParams> mxfp8_param_space() {
  QuantParams p;
  p.method = QuantMethod::kModeloptMxfp8;
  p.bits = 8;
  p.group_size = kMxBlock;
  return {p};
}

}  // namespace moepack
