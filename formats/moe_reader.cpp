#include "formats/moe_reader.h"

#include <cstring>

#include "formats/marlin.h"
#include "formats/triton_int8.h"
#include "formats/triton_wna16.h"
#include "formats/trtllm_fp8_block.h"
#include "formats/trtllm_mxfp8.h"

namespace moepack {
namespace {

using reader::ActQuant;
using reader::Kind;
using reader::ProjReader;

std::string num(int64_t v) {
  return std::to_string(v);
}

ProjReader blank_reader(Kind kind, ActQuant act) {
  ProjReader r;
  std::memset(&r, 0, sizeof r);
  r.kind = kind;
  r.act = act;
  return r;
}

int32_t scale_type_of(DType d, const std::string& what) {
  switch (d) {
    case DType::kF16:
      return reader::kScaleF16;
    case DType::kBF16:
      return reader::kScaleBf16;
    case DType::kF32:
      return reader::kScaleF32;
    default:
      if (is_scale_byte_dtype(d)) return reader::kScaleE8m0;
      throw Error(ErrorCode::kBadDtype, "", what,
                  std::string("no reader for scale dtype ") + dtype_name(d));
  }
}

const void* located(const ParamLocator& locate, const TensorMap& params, const std::string& name) {
  const Tensor& t = require_tensor(params, name);
  const void* p = locate(name, t);
  if (!p && !t.data.empty())
    throw Error(ErrorCode::kInternal, "", name, "the parameter locator returned no address");
  return p;
}

// ---- Marlin ----------------------------------------------------------------------------------

ProjReader marlin_reader(const LayoutOptions& lo, const TensorMap& params, MoeProj proj,
                         const ParamLocator& locate) {
  const MarlinLayerView L = marlin_read_layer(lo, params);
  const MarlinLayerView::Proj& v = L.proj[proj == MoeProj::kW13 ? 0 : 1];
  const int64_t shards = lo.gated ? 2 : 1;
  // The real I when the target padded it (read_layer accepted lo.inter as its padding).
  const int64_t I = lo.inter > 0 && lo.inter < L.inter ? lo.inter : L.inter;
  const std::string& pre = lo.prefix;
  ProjReader r =
      blank_reader(Kind::kMarlin, lo.act_dtype == DType::kBF16 ? ActQuant::kBf16 : ActQuant::kFp16);
  r.experts = L.experts;
  r.n = proj == MoeProj::kW13 ? shards * I : L.hidden;
  r.k = proj == MoeProj::kW13 ? L.hidden : I;
  r.p[0] = located(locate, params, pre + v.names.qweight);
  r.p[1] = located(locate, params, pre + v.names.scales);
  if (v.zero_points) r.p[2] = located(locate, params, pre + v.names.qzeros);
  if (v.act_order) {
    r.p[3] = located(locate, params, pre + v.names.g_idx);
    r.p[4] = located(locate, params, pre + v.names.sort_indices);
  }
  const int pf = 32 / L.bits;
  r.i32[0] = L.bits;
  r.i32[1] = lo.a8 ? 1 : 0;
  r.i32[2] = lo.act_dtype == DType::kBF16 ? reader::kScaleBf16 : reader::kScaleF16;
  // The kernel's rule (marlin_expert_matmul), whatever rule the loader used.
  r.i32[3] = !lo.a8 && v.groups > 1 ? 1 : 0;
  r.i32[4] = proj == MoeProj::kW13 && I != L.inter ? 1 : 0;
  r.i64[0] = v.k;
  r.i64[1] = v.n;
  r.i64[2] = v.groups;
  r.i64[3] = L.group_size > 0 && v.groups > 1 ? L.group_size : 0;
  r.i64[4] = I;
  r.i64[5] = L.inter;
  r.i64[6] = v.n / marlin::tile_n(lo.a8);
  r.i64[7] = v.k * v.n / pf;
  return r;
}

// ---- Triton WNA16 ------------------------------------------------------------------------------

ProjReader triton_wna16_reader(const LayoutOptions& lo, const TensorMap& params, MoeProj proj,
                               const ParamLocator& locate) {
  const TritonWna16LayerView L = triton_wna16_read_layer(lo, params);
  const TritonWna16LayerView::Proj& v = L.proj[proj == MoeProj::kW13 ? 0 : 1];
  ProjReader r = blank_reader(Kind::kTritonWna16,
                              lo.act_dtype == DType::kF16 ? ActQuant::kFp16 : ActQuant::kBf16);
  r.experts = L.experts;
  r.n = v.n;
  r.k = v.k;
  r.p[0] = located(locate, params, v.qweight);
  r.p[1] = located(locate, params, v.scales);
  if (!v.qzeros.empty()) r.p[2] = located(locate, params, v.qzeros);
  r.i32[0] = L.bits;
  r.i32[1] = lo.act_dtype == DType::kF16 ? reader::kScaleF16 : reader::kScaleBf16;
  r.i64[0] = v.row_bytes;
  r.i64[1] = v.scale_cols;
  r.i64[2] = L.kernel_group_size;
  return r;
}

// ---- Triton W8A8 int8 --------------------------------------------------------------------------

ProjReader triton_int8_reader(const LayoutOptions& lo, const TensorMap& params, MoeProj proj,
                              const ParamLocator& locate) {
  const TritonInt8LayerView L = triton_int8_read_layer(lo, params);
  const int i = proj == MoeProj::kW13 ? 0 : 1;
  const std::string w = lo.prefix + (i == 0 ? "w13_" : "w2_");
  ProjReader r = blank_reader(Kind::kTritonInt8, ActQuant::kInt8PerToken);
  r.experts = L.experts;
  r.n = L.n[i];
  r.k = L.k[i];
  r.p[0] = located(locate, params, w + "weight");
  r.p[1] = located(locate, params, w + "weight_scale");
  return r;
}

// ---- TRT-LLM MXFP8 and FP8 block -------------------------------------------------------------

ProjReader trtllm_mxfp8_reader(const LayoutOptions& lo, const TensorMap& params, MoeProj proj,
                               const ParamLocator& locate) {
  const TrtllmLayerView L = trtllm_mxfp8_read_layer(lo, params);
  const bool w13 = proj == MoeProj::kW13;
  const std::string w = lo.prefix + (w13 ? "w13_" : "w2_");
  ProjReader r = blank_reader(Kind::kTrtllmMxfp8, ActQuant::kMxfp8Block32);
  r.experts = L.experts;
  r.n = w13 ? L.w13_rows : L.hidden;
  r.k = w13 ? L.hidden : L.inter;
  r.p[0] = located(locate, params, w + "weight");
  r.p[1] = located(locate, params, w + "weight_scale");
  r.i32[0] = w13 && lo.gated ? 1 : 0;
  r.i64[0] = r.k / 32;
  return r;
}

ProjReader trtllm_fp8_block_reader(const LayoutOptions& lo, const TensorMap& params, MoeProj proj,
                                   const ParamLocator& locate) {
  const TrtllmLayerView L = trtllm_fp8_block_read_layer(lo, params);
  const bool w13 = proj == MoeProj::kW13;
  const std::string w = lo.prefix + (w13 ? "w13_" : "w2_");
  ProjReader r = blank_reader(Kind::kTrtllmFp8Block, ActQuant::kFp8PerTokenGroup128);
  r.experts = L.experts;
  r.n = w13 ? L.w13_rows : L.hidden;
  r.k = w13 ? L.hidden : L.inter;
  r.p[0] = located(locate, params, w + "weight");
  r.p[1] = located(locate, params, w + "weight_scale_inv");
  r.i32[0] = w13 && lo.gated ? 1 : 0;
  r.i64[0] = r.k / 128;
  return r;
}

}  // namespace

const void* host_param(const std::string&, const Tensor& host_tensor) {
  return host_tensor.data.data();
}

const void* host_buffer(const void* host_ptr, size_t) {
  return host_ptr;
}

Kind reader_kind_of(const TargetLayout& layout) {
  const std::string name = layout.name;
  if (name == "marlin") return Kind::kMarlin;
  if (name == "triton-wna16") return Kind::kTritonWna16;
  if (name == "triton-int8") return Kind::kTritonInt8;
  if (name == "trtllm-mxfp8") return Kind::kTrtllmMxfp8;
  if (name == "trtllm-fp8-block") return Kind::kTrtllmFp8Block;
  throw Error(ErrorCode::kUnsupported, "", name, "no GPU reader for layout " + name);
}

ActQuant act_quant_of(const TargetLayout& layout, const LayoutOptions& lo) {
  switch (reader_kind_of(layout)) {
    case Kind::kMarlin:
    case Kind::kTritonWna16:
      return lo.act_dtype == DType::kF16 ? ActQuant::kFp16 : ActQuant::kBf16;
    case Kind::kTritonInt8:
      return ActQuant::kInt8PerToken;
    case Kind::kTrtllmMxfp8:
      return ActQuant::kMxfp8Block32;
    case Kind::kTrtllmFp8Block:
      return ActQuant::kFp8PerTokenGroup128;
    default:
      return ActQuant::kNone;
  }
}

ProjReader make_layout_reader(const TargetLayout& layout, const LayoutOptions& lo,
                              const TensorMap& params, MoeProj proj, const ParamLocator& locate) {
  switch (reader_kind_of(layout)) {
    case Kind::kMarlin:
      return marlin_reader(lo, params, proj, locate);
    case Kind::kTritonWna16:
      return triton_wna16_reader(lo, params, proj, locate);
    case Kind::kTritonInt8:
      return triton_int8_reader(lo, params, proj, locate);
    case Kind::kTrtllmMxfp8:
      return trtllm_mxfp8_reader(lo, params, proj, locate);
    default:
      return trtllm_fp8_block_reader(lo, params, proj, locate);
  }
}

ProjReader make_canonical_reader(const QuantTensor& q, ActQuant act, const BufferLocator& locate) {
  q.check_consistent("canonical reader");
  ProjReader r = blank_reader(Kind::kCanonical, act);
  r.experts = q.experts;
  r.n = q.n;
  r.k = q.k;
  const auto at = [&](const void* p, size_t bytes) -> const void* {
    if (bytes == 0) return nullptr;
    const void* d = locate(p, bytes);
    if (!d) throw Error(ErrorCode::kInternal, "", "canonical reader", "the locator returned null");
    return d;
  };
  r.p[0] = at(q.codes.data(), q.codes.size());
  r.p[1] = at(q.scales.data(), q.scales.size());
  if (!q.symmetric) r.p[2] = at(q.zeros.data(), q.zeros.size());
  if (!q.g_idx.empty()) r.p[3] = at(q.g_idx.data(), q.g_idx.size() * 4);
  if (!q.g_idx.empty()) {  // weight() follows g_idx into the scales
    const int64_t G = q.groups();
    for (size_t i = 0; i < q.g_idx.size(); ++i)
      if (q.g_idx[i] < 0 || q.g_idx[i] >= G)
        throw Error(ErrorCode::kBadValue, "", "g_idx",
                    "g_idx[" + num(static_cast<int64_t>(i)) + "] = " + num(q.g_idx[i]) +
                        " outside [0, " + num(G) + ")");
  }
  r.i32[0] = q.kind == CodeKind::kUint  ? reader::kCodeUint
             : q.kind == CodeKind::kInt ? reader::kCodeInt
                                        : reader::kCodeFp8;
  r.i32[1] = q.bits;
  r.i32[2] = scale_type_of(q.scale_dtype, "scales");
  r.i64[0] = q.group_size;
  r.i64[1] = q.groups();
  r.i64[2] = q.scale_block_n;
  r.i64[3] = q.scale_rows();
  return r;
}

}  // namespace moepack
