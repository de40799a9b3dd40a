// FlashInfer TRT-LLM-Gen DeepSeek FP8 block MoE layout (spec/mxfp8_trtllm.md §5): one row map
// per projection (W31 swap then shuffle_matrix_a with epilogue tile 64), written straight into
// BlockMajorK [K/128, M, 128]; scales only get the W31 swap of their 128-row blocks.
#include "formats/trtllm_fp8_block.h"

#include <cmath>
#include <cstring>

#include "core/threads.h"
#include "formats/fp8.h"
#include "formats/fp8_block.h"
#include "formats/moe_reader.h"
#include "formats/trtllm_mxfp8.h"

namespace moepack {
namespace {

constexpr int64_t kBlock = 128;
constexpr int kEpilogueTileM = 64;  // vLLM _shuffle_deepseek_fp8_moe_weights

std::string num(int64_t v) {
  return std::to_string(v);
}
std::string param(const LayoutOptions& o, const char* name) {
  return o.prefix + name;
}

void not_block_reasons(const ProjShape& s, const char* what, std::vector<std::string>* out) {
  const QuantSpec& q = s.quant;
  if (q.kind != CodeKind::kFp8E4M3 || q.bits != 8)
    out->push_back(std::string(what) + " codes are not float8_e4m3fn");
  if (q.group_size != kBlock)
    out->push_back(std::string(what) + " group_size " + num(q.group_size) +
                   ", FP8 block needs 128");
  if (q.scale_block_n != kBlock)
    out->push_back(std::string(what) + " scale_block_n " + num(q.scale_block_n) +
                   ", FP8 block needs 128");
  // Stored as F32; BF16 / F16 source scales (compressed-tensors FP8_BLOCK) widen exactly.
  if (q.scale_dtype != DType::kF32 && q.scale_dtype != DType::kBF16 && q.scale_dtype != DType::kF16)
    out->push_back(std::string(what) + " scale dtype " + dtype_name(q.scale_dtype) +
                   ", FP8 block needs F32, BF16 or F16");
  if (!q.symmetric) out->push_back(std::string(what) + " has zero points, FP8 block is symmetric");
  if (s.act_order) out->push_back(std::string(what) + " has g_idx (act-order)");
}

float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// pack: NaN / Inf / negative and sub-1e-10 scales are refused (vLLM would clamp the latter,
// which no unpack can undo). unpack: only NaN / Inf / negative.
void check_scales(const std::vector<uint8_t>& bytes, const std::string& name, bool for_pack) {
  for (size_t i = 0; i < bytes.size() / 4; ++i) {
    const float v = load_f32(bytes.data() + 4 * i);
    if (!std::isfinite(v) || v < 0.0f)
      throw Error(ErrorCode::kBadValue, "", name,
                  "scale " + std::to_string(v) + " at flat index " + num(static_cast<int64_t>(i)) +
                      " (must be finite and >= 0)");
    if (for_pack && v < kTrtllmFp8BlockMinScale)
      throw Error(ErrorCode::kBadValue, "", name,
                  "scale " + std::to_string(v) + " at flat index " + num(static_cast<int64_t>(i)) +
                      " is below 1e-10: vLLM clamps it for the FlashInfer kernel and the clamp "
                      "cannot be undone");
  }
}

// Weight row map (out[r] = in[src[r]]) and the W31 position of each physical row.
std::vector<int32_t> weight_rows(int64_t rows, bool swap) {
  std::vector<int32_t> src = shuffle_matrix_a_rows(rows, kEpilogueTileM);
  if (!swap) return src;
  const std::vector<int32_t> sw = swap_w13_to_w31_rows(rows);
  for (auto& s : src) s = sw[static_cast<size_t>(s)];
  return src;
}

QuantTensor block_tensor(int64_t e, int64_t n, int64_t k) {
  QuantTensor q(fp8_block_spec(kBlock, kBlock), e, n, k);
  q.codes.resize(static_cast<size_t>(e * n * k));
  q.scales.resize(static_cast<size_t>(e * (n / kBlock) * (k / kBlock) * 4));
  return q;
}

// One expert [M, K] -> BlockMajorK [K/128, M, 128] with rows gathered by src (or the inverse).
void to_block_major(const std::vector<int32_t>& src, const uint8_t* in, int64_t rows, int64_t k,
                    uint8_t* out) {
  for (int64_t kb = 0; kb < k / kBlock; ++kb)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(out + (kb * rows + r) * kBlock,
                  in + src[static_cast<size_t>(r)] * k + kb * kBlock, kBlock);
}
void from_block_major(const std::vector<int32_t>& src, const uint8_t* in, int64_t rows, int64_t k,
                      uint8_t* out) {
  for (int64_t kb = 0; kb < k / kBlock; ++kb)
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(out + src[static_cast<size_t>(r)] * k + kb * kBlock,
                  in + (kb * rows + r) * kBlock, kBlock);
}

// Scale rows (128-row blocks) of one expert: out[b] = in[swap[b]] (an involution).
void swap_scale_rows(const uint8_t* in, int64_t srows, int64_t scols, bool swap, uint8_t* out) {
  const int64_t row_bytes = scols * 4;
  for (int64_t b = 0; b < srows; ++b) {
    const int64_t s = swap ? (b + srows / 2) % srows : b;
    std::memcpy(out + b * row_bytes, in + s * row_bytes, static_cast<size_t>(row_bytes));
  }
}

}  // namespace

std::vector<std::string> trtllm_fp8_block_unsupported_reasons(const LayoutOptions& opts,
                                                              const MoeShape& x) {
  std::vector<std::string> out;
  not_block_reasons(x.w13, "w13", &out);
  not_block_reasons(x.w2, "w2", &out);
  const int64_t H = x.w13.k, I = x.w2.k;
  if (H % kBlock != 0)
    out.push_back("H=" + num(H) +
                  " is not a multiple of 128 (BlockMajorK of w13 and the 128-row scale blocks "
                  "of w2)");
  if (I % kBlock != 0)
    out.push_back("I=" + num(I) + " is not a multiple of 128 (" +
                  (opts.gated ? std::string("the W31 swap must move whole 128-row scale blocks, "
                                            "and ")
                              : std::string()) +
                  "BlockMajorK of w2 along I)");
  return out;
}

std::vector<Tensor> pack_trtllm_fp8_block_moe(const LayoutOptions& opts, const MoeExperts& x) {
  check_moe_structure(opts, x);
  const auto reasons = trtllm_fp8_block_unsupported_reasons(opts, moe_shape_of(x));
  if (!reasons.empty()) {
    std::string msg = "TRT-LLM FP8 block layout refused: ";
    for (size_t i = 0; i < reasons.size(); ++i) msg += (i ? "; " : "") + reasons[i];
    throw Error(ErrorCode::kUnsupported, "", param(opts, "w13_weight"), msg);
  }
  const std::vector<uint8_t> scales13 = convert_scales(x.w13.scales, x.w13.scale_dtype, DType::kF32,
                                                       param(opts, "w13_weight_scale_inv"));
  const std::vector<uint8_t> scales2 = convert_scales(x.w2.scales, x.w2.scale_dtype, DType::kF32,
                                                      param(opts, "w2_weight_scale_inv"));
  check_scales(scales13, param(opts, "w13_weight_scale_inv"), true);
  check_scales(scales2, param(opts, "w2_weight_scale_inv"), true);
  const int64_t E = x.w13.experts, H = x.w13.k, I = x.w2.k, R13 = x.w13.n;
  const auto src13 = weight_rows(R13, opts.gated);
  const auto src2 = weight_rows(H, false);
  const int64_t s13 = (R13 / kBlock) * (H / kBlock) * 4, s2 = (H / kBlock) * (I / kBlock) * 4;

  Tensor w13(param(opts, "w13_weight"), DType::kF8_E4M3, {E, H / kBlock, R13, kBlock});
  Tensor w2(param(opts, "w2_weight"), DType::kF8_E4M3, {E, I / kBlock, H, kBlock});
  Tensor sc13(param(opts, "w13_weight_scale_inv"), DType::kF32, {E, R13 / kBlock, H / kBlock});
  Tensor sc2(param(opts, "w2_weight_scale_inv"), DType::kF32, {E, H / kBlock, I / kBlock});
  parallel_for(E, opts.threads, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      to_block_major(src13, x.w13.codes.data() + e * R13 * H, R13, H,
                     w13.data.data() + e * R13 * H);
      to_block_major(src2, x.w2.codes.data() + e * H * I, H, I, w2.data.data() + e * H * I);
      swap_scale_rows(scales13.data() + e * s13, R13 / kBlock, H / kBlock, opts.gated,
                      sc13.data.data() + e * s13);
      std::memcpy(sc2.data.data() + e * s2, scales2.data() + e * s2, static_cast<size_t>(s2));
    }
  });
  std::vector<Tensor> out;
  out.push_back(std::move(w13));
  out.push_back(std::move(w2));
  out.push_back(std::move(sc13));
  out.push_back(std::move(sc2));
  return out;
}

TrtllmLayerView trtllm_fp8_block_read_layer(const LayoutOptions& opts, const TensorMap& params) {
  const std::string n13 = param(opts, "w13_weight"), n2 = param(opts, "w2_weight"),
                    ns13 = param(opts, "w13_weight_scale_inv"),
                    ns2 = param(opts, "w2_weight_scale_inv");
  const Tensor& w13 = require_tensor(params, n13, "TRT-LLM FP8 block layout");
  const Tensor& w2 = require_tensor(params, n2, "TRT-LLM FP8 block layout");
  const Tensor& sc13 = require_tensor(params, ns13, "TRT-LLM FP8 block layout");
  const Tensor& sc2 = require_tensor(params, ns2, "TRT-LLM FP8 block layout");
  for (const Tensor* t : {&w13, &w2})
    if (t->dtype != DType::kF8_E4M3)
      throw Error(ErrorCode::kBadDtype, "", t->name,
                  std::string("dtype ") + dtype_name(t->dtype) + ", expected F8_E4M3");
  for (const Tensor* t : {&sc13, &sc2})
    if (t->dtype != DType::kF32)
      throw Error(ErrorCode::kBadDtype, "", t->name,
                  std::string("dtype ") + dtype_name(t->dtype) + ", expected F32");
  if (w13.shape.size() != 4 || w2.shape.size() != 4 || w13.shape[3] != kBlock ||
      w2.shape[3] != kBlock)
    throw Error(ErrorCode::kBadShape, "", n13,
                "w13 " + shape_str(w13.shape) + " / w2 " + shape_str(w2.shape) +
                    " must be BlockMajorK [E, K/128, M, 128]");
  const int64_t E = w13.shape[0], H = w13.shape[1] * kBlock, R13 = w13.shape[2],
                I = w2.shape[1] * kBlock;
  const int64_t want13 = opts.gated ? 2 * I : I;
  if (w2.shape != Shape{E, I / kBlock, H, kBlock} || R13 != want13 || H <= 0 || I <= 0)
    throw Error(ErrorCode::kBadShape, "", n2,
                "w13 " + shape_str(w13.shape) + " and w2 " + shape_str(w2.shape) +
                    " do not form one " + (opts.gated ? "gated" : "non-gated") + " MoE layer");
  if (sc13.shape != Shape{E, R13 / kBlock, H / kBlock})
    throw Error(ErrorCode::kBadShape, "", ns13,
                "shape " + shape_str(sc13.shape) + ", expected " +
                    shape_str({E, R13 / kBlock, H / kBlock}));
  if (sc2.shape != Shape{E, H / kBlock, I / kBlock})
    throw Error(
        ErrorCode::kBadShape, "", ns2,
        "shape " + shape_str(sc2.shape) + ", expected " + shape_str({E, H / kBlock, I / kBlock}));
  check_scales(sc13.data, ns13, false);
  check_scales(sc2.data, ns2, false);

  TrtllmLayerView v;
  v.experts = E;
  v.hidden = H;
  v.inter = I;
  v.w13_rows = R13;
  return v;
}

MoeExperts unpack_trtllm_fp8_block_moe(const LayoutOptions& opts, const TensorMap& params) {
  const TrtllmLayerView v = trtllm_fp8_block_read_layer(opts, params);
  const int64_t E = v.experts, R13 = v.w13_rows, H = v.hidden, I = v.inter;
  const Tensor& w13 = params.at(param(opts, "w13_weight"));
  const Tensor& w2 = params.at(param(opts, "w2_weight"));
  const Tensor& sc13 = params.at(param(opts, "w13_weight_scale_inv"));
  const Tensor& sc2 = params.at(param(opts, "w2_weight_scale_inv"));
  MoeExperts x;
  x.w13 = block_tensor(E, R13, H);
  x.w2 = block_tensor(E, H, I);
  const auto src13 = weight_rows(R13, opts.gated);
  const auto src2 = weight_rows(H, false);
  const int64_t s13 = (R13 / kBlock) * (H / kBlock) * 4, s2 = (H / kBlock) * (I / kBlock) * 4;
  parallel_for(E, opts.threads, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      from_block_major(src13, w13.data.data() + e * R13 * H, R13, H,
                       x.w13.codes.data() + e * R13 * H);
      from_block_major(src2, w2.data.data() + e * H * I, H, I, x.w2.codes.data() + e * H * I);
      // The W31 swap of scale blocks is its own inverse.
      swap_scale_rows(sc13.data.data() + e * s13, R13 / kBlock, H / kBlock, opts.gated,
                      x.w13.scales.data() + e * s13);
      std::memcpy(x.w2.scales.data() + e * s2, sc2.data.data() + e * s2, static_cast<size_t>(s2));
    }
  });
  return x;
}

reader::ActQuant trtllm_fp8_block_act_quant(const LayoutOptions&) {
  return reader::ActQuant::kFp8PerTokenGroup128;
}

reader::ProjReader trtllm_fp8_block_make_reader(const LayoutOptions& opts, const TensorMap& params,
                                                MoeProj proj, const ParamLocator& locate) {
  const TrtllmLayerView L = trtllm_fp8_block_read_layer(opts, params);
  const bool w13 = proj == MoeProj::kW13;
  reader::ProjReader r =
      blank_reader(reader::Kind::kTrtllmFp8Block, trtllm_fp8_block_act_quant(opts));
  r.experts = L.experts;
  r.n = w13 ? L.w13_rows : L.hidden;
  r.k = w13 ? L.hidden : L.inter;
  reader::TrtllmFp8BlockParams& t = r.trtllm_fp8_block;
  t.weight = static_cast<const uint8_t*>(
      locate_param(locate, params, param(opts, w13 ? "w13_weight" : "w2_weight")));
  t.weight_scale_inv = static_cast<const float*>(locate_param(
      locate, params, param(opts, w13 ? "w13_weight_scale_inv" : "w2_weight_scale_inv")));
  t.w31 = w13 && opts.gated ? 1 : 0;
  t.k_blocks = r.k / kBlock;
  return r;
}

std::vector<std::string> trtllm_fp8_block_deviations_from_vllm(const LayoutOptions&,
                                                               const MoeShape&) {
  // vLLM's clamp to >= 1e-10 never changes a value we accept (smaller scales are refused).
  return {};
}

std::vector<ParamSpec> trtllm_fp8_block_param_specs(const LayoutOptions& opts, const MoeShape& x) {
  const int64_t E = x.experts, H = x.w13.k, I = x.w2.k, R13 = x.w13.n;
  return {
      {param(opts, "w13_weight"),
       DType::kF8_E4M3,
       {E, H / kBlock, R13, kBlock},
       ParamRole::kW13Weight},
      {param(opts, "w2_weight"), DType::kF8_E4M3, {E, I / kBlock, H, kBlock}, ParamRole::kW2Weight},
      {param(opts, "w13_weight_scale_inv"),
       DType::kF32,
       {E, R13 / kBlock, H / kBlock},
       ParamRole::kW13Scale},
      {param(opts, "w2_weight_scale_inv"),
       DType::kF32,
       {E, H / kBlock, I / kBlock},
       ParamRole::kW2Scale}};
}

}  // namespace moepack
