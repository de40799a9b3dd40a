#include "formats/triton_int8.h"

#include <cstring>

#include "core/half.h"
#include "formats/moe_reader.h"

namespace moepack {
namespace {

std::string num(int64_t v) {
  return std::to_string(v);
}

std::string param(const LayoutOptions& o, MoeProj p, const char* what) {
  return o.prefix + (p == MoeProj::kW13 ? "w13_" : "w2_") + what;
}

void projection_reasons(const ProjShape& s, const std::string& w, std::vector<std::string>* r) {
  const QuantSpec& q = s.quant;
  if (q.kind != CodeKind::kInt || q.bits != 8)
    r->push_back(w + ": not signed int8 codes (W8A8 int8 MoE holds int-quantized int8 only)");
  if (q.group_size > 0)
    r->push_back(w + ": group size " + num(q.group_size) +
                 "; CompressedTensorsW8A8Int8MoEMethod requires channel strategy");
  if (q.scale_block_n != 1) r->push_back(w + ": scales shared by several output rows");
  if (!q.symmetric) r->push_back(w + ": asymmetric (zero points); W8A8 int8 MoE is symmetric");
  if (s.act_order) r->push_back(w + ": g_idx (act-order) present");
  if (q.scale_dtype != DType::kF32 && q.scale_dtype != DType::kBF16 && q.scale_dtype != DType::kF16)
    r->push_back(w + std::string(": scale dtype ") + dtype_name(q.scale_dtype) +
                 " (expected F32, BF16 or F16)");
}

}  // namespace

std::vector<std::string> triton_int8_unsupported_reasons(const LayoutOptions& o,
                                                         const MoeShape& x) {
  std::vector<std::string> r = moe_shape_problems(o, x);
  projection_reasons(x.w13, "w13", &r);
  projection_reasons(x.w2, "w2", &r);
  return r;
}

std::vector<std::string> triton_int8_deviations_from_vllm(const LayoutOptions&, const MoeShape&) {
  return {};
}

std::vector<Tensor> pack_triton_int8_moe(const LayoutOptions& o, const MoeExperts& x) {
  x.w13.check_consistent("w13");
  x.w2.check_consistent("w2");
  const auto shapes = moe_shape_problems(o, x);
  if (!shapes.empty()) throw Error(ErrorCode::kBadShape, "", "w13/w2", shapes.front());
  const auto reasons = triton_int8_unsupported_reasons(o, moe_shape_of(x));
  if (!reasons.empty()) {
    std::string msg = "W8A8 int8 Triton MoE layout cannot hold these experts:";
    for (const auto& s : reasons) msg += "\n  - " + s;
    throw Error(ErrorCode::kUnsupported, "", o.prefix + "w13_weight", msg);
  }
  std::vector<Tensor> out;
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2}) {
    const QuantTensor& q = p == MoeProj::kW13 ? x.w13 : x.w2;
    Tensor w(param(o, p, "weight"), DType::kI8, {q.experts, q.n, q.k});
    std::memcpy(w.data.data(), q.codes.data(), q.codes.size());
    Tensor s(param(o, p, "weight_scale"), DType::kF32, {q.experts, q.n, 1});
    float* sd = s.as<float>();
    for (int64_t i = 0; i < q.experts * q.n; ++i)
      sd[i] = scale_to_float(q.scales.data() + i * q.scale_bytes(), q.scale_dtype);
    out.push_back(std::move(w));
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

const Tensor& need_rank3(const TensorMap& m, const std::string& name, DType dt) {
  const Tensor& t = require_tensor(m, name);
  if (t.dtype != dt)
    throw Error(ErrorCode::kBadDtype, "", name,
                std::string("expected ") + dtype_name(dt) + ", got " + dtype_name(t.dtype));
  if (t.shape.size() != 3)
    throw Error(ErrorCode::kBadShape, "", name, "expected rank 3, got " + shape_str(t.shape));
  if (static_cast<int64_t>(t.data.size()) != numel(t.shape) * dtype_bits(dt) / 8)
    throw Error(ErrorCode::kBadShape, "", name, "byte size does not match its shape");
  return t;
}

struct Params {
  const Tensor *w13, *w2, *s13, *s2;
};

Params read_params(const LayoutOptions& o, const TensorMap& m) {
  Params p{&need_rank3(m, param(o, MoeProj::kW13, "weight"), DType::kI8),
           &need_rank3(m, param(o, MoeProj::kW2, "weight"), DType::kI8),
           &need_rank3(m, param(o, MoeProj::kW13, "weight_scale"), DType::kF32),
           &need_rank3(m, param(o, MoeProj::kW2, "weight_scale"), DType::kF32)};
  const int64_t E = p.w13->shape[0], N13 = p.w13->shape[1], H = p.w13->shape[2];
  const int64_t shards = o.gated ? 2 : 1;
  const int64_t I = p.w2->shape[2];
  if (p.w2->shape != Shape{E, H, I} || N13 != shards * I)
    throw Error(ErrorCode::kBadShape, "", p.w2->name,
                shape_str(p.w2->shape) + " does not match w13_weight " + shape_str(p.w13->shape));
  if (p.s13->shape != Shape{E, N13, 1})
    throw Error(ErrorCode::kBadShape, "", p.s13->name,
                "expected " + shape_str({E, N13, 1}) + ", got " + shape_str(p.s13->shape));
  if (p.s2->shape != Shape{E, H, 1})
    throw Error(ErrorCode::kBadShape, "", p.s2->name,
                "expected " + shape_str({E, H, 1}) + ", got " + shape_str(p.s2->shape));
  return p;
}

}  // namespace

TritonInt8LayerView triton_int8_read_layer(const LayoutOptions& o, const TensorMap& m) {
  const Params p = read_params(o, m);
  TritonInt8LayerView v;
  v.experts = p.w13->shape[0];
  v.n[0] = p.w13->shape[1];
  v.k[0] = p.w13->shape[2];
  v.n[1] = p.w2->shape[1];
  v.k[1] = p.w2->shape[2];
  return v;
}

MoeExperts unpack_triton_int8_moe(const LayoutOptions& o, const TensorMap& m) {
  const Params p = read_params(o, m);
  MoeExperts x;
  for (MoeProj pr : {MoeProj::kW13, MoeProj::kW2}) {
    const Tensor& w = pr == MoeProj::kW13 ? *p.w13 : *p.w2;
    const Tensor& s = pr == MoeProj::kW13 ? *p.s13 : *p.s2;
    QuantTensor& q = pr == MoeProj::kW13 ? x.w13 : x.w2;
    q.experts = w.shape[0];
    q.n = w.shape[1];
    q.k = w.shape[2];
    q.kind = CodeKind::kInt;
    q.bits = 8;
    q.group_size = -1;
    q.scale_block_n = 1;
    q.symmetric = true;
    q.scale_dtype = DType::kF32;
    q.codes = w.data;
    q.scales = s.data;
  }
  return x;
}

reader::ActQuant triton_int8_act_quant(const LayoutOptions&) {
  return reader::ActQuant::kInt8PerToken;
}

reader::ProjReader triton_int8_make_reader(const LayoutOptions& o, const TensorMap& m, MoeProj proj,
                                           const ParamLocator& locate) {
  const TritonInt8LayerView L = triton_int8_read_layer(o, m);
  const int i = proj == MoeProj::kW13 ? 0 : 1;
  reader::ProjReader r = blank_reader(reader::Kind::kTritonInt8, triton_int8_act_quant(o));
  r.experts = L.experts;
  r.n = L.n[i];
  r.k = L.k[i];
  reader::TritonInt8Params& t = r.triton_int8;
  t.weight = static_cast<const int8_t*>(locate_param(locate, m, param(o, proj, "weight")));
  t.weight_scale =
      static_cast<const float*>(locate_param(locate, m, param(o, proj, "weight_scale")));
  return r;
}

std::vector<ParamSpec> triton_int8_param_specs(const LayoutOptions& o, const MoeShape& x) {
  std::vector<ParamSpec> out;
  for (MoeProj p : {MoeProj::kW13, MoeProj::kW2}) {
    const ProjShape& s = p == MoeProj::kW13 ? x.w13 : x.w2;
    out.push_back({param(o, p, "weight"),
                   DType::kI8,
                   {x.experts, s.n, s.k},
                   param_role_of(p, ParamRole::kW13Weight)});
    out.push_back({param(o, p, "weight_scale"),
                   DType::kF32,
                   {x.experts, s.n, 1},
                   param_role_of(p, ParamRole::kW13Scale)});
  }
  return out;
}

}  // namespace moepack
