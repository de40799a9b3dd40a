#include "formats/moe_reader.h"

#include <cstring>

#include "formats/marlin.h"

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
    default:
      throw Error(ErrorCode::kUnsupported, "", lo.prefix,
                  std::string("no GPU reader yet for layout ") + layout.name);
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
  if (q.kind == CodeKind::kUint && !q.g_idx.empty()) {
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
