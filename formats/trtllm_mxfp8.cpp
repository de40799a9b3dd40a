// FlashInfer TRT-LLM-Gen MXFP8 MoE layout (spec/mxfp8_trtllm.md §3.1-§3.6). All transforms are
// row maps (out[r] = in[src[r]]) composed into one gather per projection; scales take the same
// row map and then the 128x4 interleave. Unpack applies the inverse maps (invert_permutation).
#include "formats/trtllm_mxfp8.h"

#include <cstring>

#include "core/threads.h"
#include "formats/fp8.h"
#include "formats/moe_reader.h"
#include "formats/mxfp8.h"

namespace moepack {
namespace {

constexpr int64_t kMxBlock = 32;

std::string num(int64_t v) {
  return std::to_string(v);
}

std::string param(const LayoutOptions& o, const char* name) {
  return o.prefix + name;
}

void not_mxfp8_reasons(const ProjShape& s, const char* what, std::vector<std::string>* out) {
  const QuantSpec& q = s.quant;
  if (q.kind != CodeKind::kFp8E4M3 || q.bits != 8)
    out->push_back(std::string(what) + " codes are not float8_e4m3fn (MXFP8 needs e4m3)");
  if (q.group_size != kMxBlock)
    out->push_back(std::string(what) + " group_size " + num(q.group_size) + ", MXFP8 needs 32");
  if (q.scale_block_n != 1)
    out->push_back(std::string(what) + " scale_block_n " + num(q.scale_block_n) +
                   ", MXFP8 needs one scale row per output row");
  if (!is_scale_byte_dtype(q.scale_dtype))
    out->push_back(std::string(what) + " scale dtype " + dtype_name(q.scale_dtype) +
                   ", MXFP8 needs U8/F8_E8M0 (E8M0 codes)");
  if (!q.symmetric) out->push_back(std::string(what) + " has zero points, MXFP8 is symmetric");
  if (s.act_order) out->push_back(std::string(what) + " has g_idx (act-order)");
}

// Applies the row map to one expert's codes and scales, writing swizzled scale bytes.
void pack_expert(const std::vector<int32_t>& src, const uint8_t* codes, const uint8_t* scales,
                 int64_t rows, int64_t k, uint8_t* out_codes, uint8_t* out_scales) {
  const int64_t cols = k / kMxBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = src[static_cast<size_t>(r)];
    std::memcpy(out_codes + r * k, codes + s * k, static_cast<size_t>(k));
    for (int64_t b = 0; b < cols; ++b)
      out_scales[scale_128x4_offset(r, b, cols)] = scales[s * cols + b];
  }
}

void unpack_expert(const std::vector<int32_t>& src, const uint8_t* in_codes,
                   const uint8_t* in_scales, int64_t rows, int64_t k, uint8_t* codes,
                   uint8_t* scales) {
  const int64_t cols = k / kMxBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = src[static_cast<size_t>(r)];
    std::memcpy(codes + s * k, in_codes + r * k, static_cast<size_t>(k));
    for (int64_t b = 0; b < cols; ++b)
      scales[s * cols + b] = in_scales[scale_128x4_offset(r, b, cols)];
  }
}

}  // namespace

std::vector<int32_t> shuffle_matrix_a_rows(int64_t rows, int epilogue_tile_m) {
  const int64_t block = epilogue_tile_m % 128 == 0 ? 32 : 16;
  if (rows <= 0 || rows % block != 0)
    throw Error(ErrorCode::kBadShape, "", "",
                "shuffle_matrix_a: M=" + num(rows) + " is not a positive multiple of " +
                    num(block) + " (epilogue_tile_m " + num(epilogue_tile_m) + ")");
  std::vector<int32_t> src(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    src[static_cast<size_t>(r)] = static_cast<int32_t>(shuffle_a_src_row(r, block));
  return src;
}

std::vector<int32_t> gated_act_reorder_rows(int64_t rows) {
  if (rows <= 0 || rows % 2 != 0)
    throw Error(ErrorCode::kBadShape, "", "",
                "reorder_rows_for_gated_act_gemm: M=" + num(rows) + " is not even");
  std::vector<int32_t> src(static_cast<size_t>(rows));
  const int64_t half = rows / 2;
  for (int64_t j = 0; j < half; ++j) {
    src[static_cast<size_t>(2 * j)] = static_cast<int32_t>(j);
    src[static_cast<size_t>(2 * j + 1)] = static_cast<int32_t>(half + j);
  }
  return src;
}

std::vector<int32_t> swap_w13_to_w31_rows(int64_t rows) {
  if (rows <= 0 || rows % 2 != 0)
    throw Error(ErrorCode::kBadShape, "", "", "swap_w13_to_w31: rows=" + num(rows) + " is odd");
  std::vector<int32_t> src(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    src[static_cast<size_t>(r)] = static_cast<int32_t>((r + rows / 2) % rows);
  return src;
}

std::vector<int32_t> trtllm_w13_rows(int64_t rows, bool gated) {
  std::vector<int32_t> shuffle = shuffle_matrix_a_rows(rows, 128);
  if (!gated) return shuffle;
  // out = shuffle(reorder(swap(x))): out[r] = x[swap[reorder[shuffle[r]]]].
  const std::vector<int32_t> reorder = gated_act_reorder_rows(rows);
  const std::vector<int32_t> swap = swap_w13_to_w31_rows(rows);
  for (auto& s : shuffle) s = swap[static_cast<size_t>(reorder[static_cast<size_t>(s)])];
  return shuffle;
}

std::vector<int32_t> trtllm_w2_rows(int64_t rows) {
  return shuffle_matrix_a_rows(rows, 128);
}

std::vector<uint8_t> scale_interleave_128x4(const uint8_t* src, int64_t rows, int64_t cols) {
  if (rows % 128 != 0 || cols % 4 != 0 || rows < 0 || cols < 0)
    throw Error(ErrorCode::kBadShape, "", "",
                "128x4 interleave of [" + num(rows) + ", " + num(cols) +
                    "] would pad (rows must be a multiple of 128, cols of 4)");
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < cols; ++k) out[scale_128x4_offset(m, k, cols)] = src[m * cols + k];
  return out;
}

std::vector<uint8_t> scale_deinterleave_128x4(const uint8_t* src, int64_t rows, int64_t cols) {
  if (rows % 128 != 0 || cols % 4 != 0 || rows < 0 || cols < 0)
    throw Error(ErrorCode::kBadShape, "", "",
                "128x4 deinterleave of [" + num(rows) + ", " + num(cols) +
                    "]: rows must be a multiple of 128, cols of 4");
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < cols; ++k) out[m * cols + k] = src[scale_128x4_offset(m, k, cols)];
  return out;
}

std::vector<std::string> trtllm_mxfp8_unsupported_reasons(const LayoutOptions& opts,
                                                          const MoeShape& x) {
  std::vector<std::string> out;
  not_mxfp8_reasons(x.w13, "w13", &out);
  not_mxfp8_reasons(x.w2, "w2", &out);
  const int64_t H = x.w13.k, I = x.w2.k, r13 = x.w13.n;
  if (r13 % 128 != 0)
    out.push_back(std::string("w13 rows ") + (opts.gated ? "2I" : "I") + "=" + num(r13) +
                  " is not a multiple of 128 (shuffle_matrix_sf_a / 128x4 interleave would pad)");
  if (H % 128 != 0)
    out.push_back("H=" + num(H) + " is not a multiple of 128 (w2 rows and w13 scale columns H/32=" +
                  num(H / kMxBlock) + " must tile 128x4 without padding)");
  if (I % 128 != 0)
    out.push_back("I=" + num(I) + " is not a multiple of 128 (w2 scale columns I/32=" +
                  num(I / kMxBlock) + " must be a multiple of 4 without padding)");
  return out;
}

std::vector<Tensor> pack_trtllm_mxfp8_moe(const LayoutOptions& opts, const MoeExperts& x) {
  check_moe_structure(opts, x);
  const auto reasons = trtllm_mxfp8_unsupported_reasons(opts, moe_shape_of(x));
  if (!reasons.empty()) {
    std::string msg = "TRT-LLM MXFP8 layout refused: ";
    for (size_t i = 0; i < reasons.size(); ++i) msg += (i ? "; " : "") + reasons[i];
    throw Error(ErrorCode::kUnsupported, "", param(opts, "w13_weight"), msg);
  }
  const int64_t E = x.w13.experts, H = x.w13.k, I = x.w2.k, R13 = x.w13.n;
  const auto src13 = trtllm_w13_rows(R13, opts.gated);
  const auto src2 = trtllm_w2_rows(H);

  Tensor w13(param(opts, "w13_weight"), DType::kF8_E4M3, {E, R13, H});
  Tensor w2(param(opts, "w2_weight"), DType::kF8_E4M3, {E, H, I});
  Tensor s13(param(opts, "w13_weight_scale"), DType::kU8, {E, R13, H / kMxBlock});
  Tensor s2(param(opts, "w2_weight_scale"), DType::kU8, {E, H, I / kMxBlock});
  parallel_for(E, opts.threads, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      pack_expert(src13, x.w13.codes.data() + e * R13 * H,
                  x.w13.scales.data() + e * R13 * (H / kMxBlock), R13, H,
                  w13.data.data() + e * R13 * H, s13.data.data() + e * R13 * (H / kMxBlock));
      pack_expert(src2, x.w2.codes.data() + e * H * I, x.w2.scales.data() + e * H * (I / kMxBlock),
                  H, I, w2.data.data() + e * H * I, s2.data.data() + e * H * (I / kMxBlock));
    }
  });
  std::vector<Tensor> out;
  out.push_back(std::move(w13));
  out.push_back(std::move(w2));
  out.push_back(std::move(s13));
  out.push_back(std::move(s2));
  return out;
}

TrtllmLayerView trtllm_mxfp8_read_layer(const LayoutOptions& opts, const TensorMap& params) {
  const std::string n13 = param(opts, "w13_weight"), n2 = param(opts, "w2_weight"),
                    ns13 = param(opts, "w13_weight_scale"), ns2 = param(opts, "w2_weight_scale");
  const Tensor& w13 = require_tensor(params, n13, "TRT-LLM MXFP8 layout");
  const Tensor& w2 = require_tensor(params, n2, "TRT-LLM MXFP8 layout");
  const Tensor& s13 = require_tensor(params, ns13, "TRT-LLM MXFP8 layout");
  const Tensor& s2 = require_tensor(params, ns2, "TRT-LLM MXFP8 layout");
  for (const Tensor* t : {&w13, &w2})
    if (t->dtype != DType::kF8_E4M3)
      throw Error(ErrorCode::kBadDtype, "", t->name,
                  std::string("dtype ") + dtype_name(t->dtype) + ", expected F8_E4M3");
  for (const Tensor* t : {&s13, &s2})
    if (!is_scale_byte_dtype(t->dtype))
      throw Error(ErrorCode::kBadDtype, "", t->name,
                  std::string("dtype ") + dtype_name(t->dtype) + ", expected U8 (E8M0)");
  if (w13.shape.size() != 3 || w2.shape.size() != 3)
    throw Error(ErrorCode::kBadShape, "", n13,
                "w13 " + shape_str(w13.shape) + " / w2 " + shape_str(w2.shape) + " must be 3-D");
  const int64_t E = w13.shape[0], R13 = w13.shape[1], H = w13.shape[2], I = w2.shape[2];
  const int64_t want13 = opts.gated ? 2 * I : I;
  if (w2.shape != Shape{E, H, I} || R13 != want13)
    throw Error(ErrorCode::kBadShape, "", n2,
                "w13 " + shape_str(w13.shape) + " and w2 " + shape_str(w2.shape) +
                    " do not form one " + (opts.gated ? "gated" : "non-gated") + " MoE layer");
  if (R13 % 128 != 0 || H % 128 != 0 || I % 128 != 0)
    throw Error(ErrorCode::kBadShape, "", n13,
                "w13 rows " + num(R13) + ", H=" + num(H) + ", I=" + num(I) +
                    " must all be multiples of 128 in this layout");
  if (s13.shape != Shape{E, R13, H / kMxBlock})
    throw Error(
        ErrorCode::kBadShape, "", ns13,
        "shape " + shape_str(s13.shape) + ", expected " + shape_str({E, R13, H / kMxBlock}));
  if (s2.shape != Shape{E, H, I / kMxBlock})
    throw Error(ErrorCode::kBadShape, "", ns2,
                "shape " + shape_str(s2.shape) + ", expected " + shape_str({E, H, I / kMxBlock}));

  TrtllmLayerView v;
  v.experts = E;
  v.hidden = H;
  v.inter = I;
  v.w13_rows = R13;
  return v;
}

MoeExperts unpack_trtllm_mxfp8_moe(const LayoutOptions& opts, const TensorMap& params) {
  const TrtllmLayerView v = trtllm_mxfp8_read_layer(opts, params);
  const int64_t E = v.experts, R13 = v.w13_rows, H = v.hidden, I = v.inter;
  const Tensor& w13 = params.at(param(opts, "w13_weight"));
  const Tensor& w2 = params.at(param(opts, "w2_weight"));
  const Tensor& s13 = params.at(param(opts, "w13_weight_scale"));
  const Tensor& s2 = params.at(param(opts, "w2_weight_scale"));
  MoeExperts x;
  x.w13 = make_mxfp8_tensor(E, R13, H);
  x.w2 = make_mxfp8_tensor(E, H, I);
  const auto src13 = trtllm_w13_rows(R13, opts.gated);
  const auto src2 = trtllm_w2_rows(H);
  parallel_for(E, opts.threads, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      unpack_expert(
          src13, w13.data.data() + e * R13 * H, s13.data.data() + e * R13 * (H / kMxBlock), R13, H,
          x.w13.codes.data() + e * R13 * H, x.w13.scales.data() + e * R13 * (H / kMxBlock));
      unpack_expert(src2, w2.data.data() + e * H * I, s2.data.data() + e * H * (I / kMxBlock), H, I,
                    x.w2.codes.data() + e * H * I, x.w2.scales.data() + e * H * (I / kMxBlock));
    }
  });
  return x;
}

reader::ActQuant trtllm_mxfp8_act_quant(const LayoutOptions&) {
  return reader::ActQuant::kMxfp8Block32;
}

reader::ProjReader trtllm_mxfp8_make_reader(const LayoutOptions& opts, const TensorMap& params,
                                            MoeProj proj, const ParamLocator& locate) {
  const TrtllmLayerView L = trtllm_mxfp8_read_layer(opts, params);
  const bool w13 = proj == MoeProj::kW13;
  reader::ProjReader r = blank_reader(reader::Kind::kTrtllmMxfp8, trtllm_mxfp8_act_quant(opts));
  r.experts = L.experts;
  r.n = w13 ? L.w13_rows : L.hidden;
  r.k = w13 ? L.hidden : L.inter;
  reader::TrtllmMxfp8Params& t = r.trtllm_mxfp8;
  t.weight = static_cast<const uint8_t*>(
      locate_param(locate, params, param(opts, w13 ? "w13_weight" : "w2_weight")));
  t.weight_scale = static_cast<const uint8_t*>(
      locate_param(locate, params, param(opts, w13 ? "w13_weight_scale" : "w2_weight_scale")));
  t.w31_gated = w13 && opts.gated ? 1 : 0;
  t.scale_cols = r.k / kMxBlock;
  return r;
}

std::vector<std::string> trtllm_mxfp8_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  // Byte-identical to vLLM 52a31cc prepare_fp8_moe_layer_for_fi(is_trtllm=True) for every
  // shape we accept (we refuse the padded shapes vLLM cannot load either).
  return {};
}

std::vector<ParamSpec> trtllm_mxfp8_param_specs(const LayoutOptions& opts, const MoeShape& x) {
  const int64_t E = x.experts, H = x.w13.k, I = x.w2.k, R13 = x.w13.n;
  return {
      {param(opts, "w13_weight"), DType::kF8_E4M3, {E, R13, H}, ParamRole::kW13Weight},
      {param(opts, "w2_weight"), DType::kF8_E4M3, {E, H, I}, ParamRole::kW2Weight},
      {param(opts, "w13_weight_scale"), DType::kU8, {E, R13, H / kMxBlock}, ParamRole::kW13Scale},
      {param(opts, "w2_weight_scale"), DType::kU8, {E, H, I / kMxBlock}, ParamRole::kW2Scale}};
}

}  // namespace moepack
