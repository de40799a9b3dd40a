#include "formats/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/half.h"
#include "formats/fp8.h"

namespace moepack {

QuantTensor::QuantTensor(const QuantSpec& spec, int64_t experts_, int64_t n_, int64_t k_)
    : QuantSpec(spec), experts(experts_), n(n_), k(k_) {
  codes.assign(static_cast<size_t>(experts * n * k), 0);
  scales.assign(static_cast<size_t>(experts * scale_rows() * groups() * scale_bytes()), 0);
  if (!symmetric) zeros.assign(static_cast<size_t>(experts * n * groups()), 0);
  if (global_scale != GlobalScale::kNone) global_scales.assign(static_cast<size_t>(experts), 0.0f);
  if (input_global_scale != GlobalScale::kNone)
    input_scales.assign(static_cast<size_t>(experts), 0.0f);
}

MoeShape moe_shape_of(const MoeExperts& x) {
  MoeShape s;
  s.experts = x.w13.experts;
  s.w13 = {x.w13.spec(), x.w13.n, x.w13.k, !x.w13.g_idx.empty()};
  s.w2 = {x.w2.spec(), x.w2.n, x.w2.k, !x.w2.g_idx.empty()};
  return s;
}

void QuantTensor::check_consistent(const std::string& what) const {
  const auto fail = [&](const std::string& m) {
    throw Error(ErrorCode::kInternal, "", what, "inconsistent QuantTensor: " + m);
  };
  if (experts < 0 || n < 0 || k < 0) fail("negative extent");
  if (static_cast<int64_t>(codes.size()) != experts * n * k) fail("codes size");
  if (static_cast<int64_t>(scales.size()) != experts * scale_rows() * groups() * scale_bytes())
    fail("scales size");
  if (!symmetric && static_cast<int64_t>(zeros.size()) != experts * n * groups())
    fail("zeros size");
  if (symmetric && !zeros.empty()) fail("symmetric tensor with zeros");
  if (!g_idx.empty() && static_cast<int64_t>(g_idx.size()) != experts * k) fail("g_idx size");
  if (global_scale == GlobalScale::kNone) {
    if (!global_scales.empty()) fail("global scales without a global scale convention");
  } else {
    if (global_shards < 1 || n % global_shards != 0) fail("global shards do not divide N");
    if (static_cast<int64_t>(global_scales.size()) != experts * global_shards)
      fail("global scales size");
  }
  if (input_global_scale == GlobalScale::kNone) {
    if (!input_scales.empty()) fail("input scales without an input scale convention");
  } else {
    if (global_scale == GlobalScale::kNone) fail("input scales without a global scale");
    if (static_cast<int64_t>(input_scales.size()) != experts * global_shards)
      fail("input scales size");
  }
}

float scale_to_float(const uint8_t* p, DType d) {
  if (is_scale_byte_dtype(d)) return e8m0_to_float(*p);
  if (d == DType::kF8_E4M3) return e4m3_to_float(*p);
  return element_as_float(p, d, "scale");
}

void convert_scale(const uint8_t* p, DType from, DType to, uint8_t* out, const std::string& what) {
  const int ob = dtype_bits(to) / 8;
  if (from == to || (is_scale_byte_dtype(from) && is_scale_byte_dtype(to))) {
    std::memcpy(out, p, static_cast<size_t>(ob));
    return;
  }
  if (is_scale_byte_dtype(to))
    throw Error(ErrorCode::kInternal, "", what,
                std::string("cannot express ") + dtype_name(from) + " scales as E8M0 codes");
  // Through float32, then round to nearest even: what torch's copy_ into the parameter does.
  const float v = scale_to_float(p, from);
  if (to == DType::kF32) {
    std::memcpy(out, &v, 4);
    return;
  }
  const uint16_t h = to == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
  if (to != DType::kBF16 && to != DType::kF16)
    throw Error(ErrorCode::kInternal, "", what,
                std::string("unsupported serving scale dtype ") + dtype_name(to));
  const float back = to == DType::kBF16 ? bf16_to_float(h) : f16_to_float(h);
  if (std::isfinite(v) && !std::isfinite(back))
    throw Error(ErrorCode::kBadValue, "", what,
                "scale " + std::to_string(v) + " overflows " + dtype_name(to));
  std::memcpy(out, &h, 2);
}

std::vector<uint8_t> convert_scales(const std::vector<uint8_t>& src, DType from, DType to,
                                    const std::string& what) {
  const int ib = dtype_bits(from) / 8, ob = dtype_bits(to) / 8;
  const size_t count = src.size() / static_cast<size_t>(ib);
  std::vector<uint8_t> out(count * static_cast<size_t>(ob));
  for (size_t i = 0; i < count; ++i)
    convert_scale(src.data() + i * ib, from, to, out.data() + i * ob, what);
  return out;
}

void dot_weight_row_into_column(const float* x, int64_t m, int64_t k, const float* w_row, float* y,
                                int64_t ldy, int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * k;
    float acc = 0.0f;
    for (int64_t kk = 0; kk < k; ++kk) acc += xi[kk] * w_row[kk];
    y[i * ldy + n] = acc;
  }
}

std::vector<std::string> moe_shape_problems(const LayoutOptions& o, const MoeShape& x) {
  const auto num = [](int64_t v) { return std::to_string(v); };
  std::vector<std::string> r;
  const int64_t shards = o.gated ? 2 : 1;
  if (x.w13.k != x.w2.n)
    r.push_back("w13 K (hidden " + num(x.w13.k) + ") != w2 N (" + num(x.w2.n) + ")");
  if (x.w13.n != shards * x.w2.k)
    r.push_back("w13 N " + num(x.w13.n) + " != " + num(shards) + " x w2 K (intermediate " +
                num(x.w2.k) + ")" + (o.gated ? " for a gated layer" : " for a non-gated layer"));
  if (x.experts < 1) r.push_back("no experts");
  return r;
}

std::vector<std::string> moe_shape_problems(const LayoutOptions& o, const MoeExperts& x) {
  std::vector<std::string> r;
  if (x.w13.experts != x.w2.experts)
    r.push_back("w13 has " + std::to_string(x.w13.experts) + " experts but w2 has " +
                std::to_string(x.w2.experts));
  for (auto& p : moe_shape_problems(o, moe_shape_of(x))) r.push_back(std::move(p));
  return r;
}

void check_moe_structure(const LayoutOptions& opts, const MoeExperts& x) {
  const std::vector<std::string> problems = moe_shape_problems(opts, x);
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems) msg += (msg.empty() ? "" : "; ") + p;
    throw Error(ErrorCode::kBadShape, "", opts.prefix + "w13_weight", msg);
  }
  x.w13.check_consistent(opts.prefix + "w13_weight");
  x.w2.check_consistent(opts.prefix + "w2_weight");
}

const Tensor& require_tensor(const TensorMap& m, const std::string& key, const std::string& what) {
  auto it = m.find(key);
  if (it == m.end())
    throw Error(ErrorCode::kMissingTensor, "", key,
                what.empty() ? "required tensor is missing" : what + " lacks '" + key + "'");
  return it->second;
}

const Tensor* find_tensor(const TensorMap& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

static float scale_value(const QuantTensor& q, int64_t index) {
  return scale_to_float(q.scales.data() + index * q.scale_bytes(), q.scale_dtype);
}

std::vector<float> dequantize_expert(const QuantTensor& q, int64_t e) {
  const int64_t G = q.groups(), SR = q.scale_rows();
  std::vector<float> out(static_cast<size_t>(q.n * q.k));
  const uint8_t* codes = q.codes.data() + e * q.n * q.k;
  const int32_t* gi = q.g_idx.empty() ? nullptr : q.g_idx.data() + e * q.k;
  const float bias = q.kind == CodeKind::kUint ? static_cast<float>(1 << (q.bits - 1)) : 0.0f;
  const int64_t shard_rows = q.global_scale == GlobalScale::kNone ? q.n : q.n / q.global_shards;
  for (int64_t n = 0; n < q.n; ++n) {
    const int64_t srow = n / q.scale_block_n;
    const float global =
        q.global_scale == GlobalScale::kNone
            ? 1.0f
            : q.global_scales[static_cast<size_t>(e * q.global_shards + n / shard_rows)];
    for (int64_t k = 0; k < q.k; ++k) {
      int64_t g = gi ? gi[k] : (q.group_size > 0 ? k / q.group_size : 0);
      float s = scale_value(q, (e * SR + srow) * G + g);
      if (q.global_scale == GlobalScale::kDecodeMultiplier) s = s * global;
      if (q.global_scale == GlobalScale::kEncodeDivisor) s = s / global;
      const uint8_t c = codes[n * q.k + k];
      float v = 0.0f;
      switch (q.kind) {
        case CodeKind::kUint: {
          const float z = q.symmetric ? bias : static_cast<float>(q.zeros[(e * q.n + n) * G + g]);
          v = (static_cast<float>(c) - z) * s;
          break;
        }
        case CodeKind::kInt:
          v = static_cast<float>(static_cast<int8_t>(c)) * s;
          break;
        case CodeKind::kFp8E4M3:
          v = e4m3_to_float(c) * s;
          break;
        case CodeKind::kFp4E2M1:
          v = e2m1_to_float(c) * s;
          break;
      }
      out[static_cast<size_t>(n * q.k + k)] = v;
    }
  }
  return out;
}

std::vector<int32_t> invert_permutation(const std::vector<int32_t>& perm) {
  std::vector<int32_t> inv(perm.size(), -1);
  for (size_t i = 0; i < perm.size(); ++i) {
    const int32_t p = perm[i];
    if (p < 0 || static_cast<size_t>(p) >= perm.size() || inv[static_cast<size_t>(p)] != -1)
      throw Error(ErrorCode::kBadValue, "not a permutation (index " + std::to_string(i) + ")");
    inv[static_cast<size_t>(p)] = static_cast<int32_t>(i);
  }
  return inv;
}

std::vector<int32_t> stable_argsort(const int32_t* values, int64_t count) {
  std::vector<int32_t> idx(static_cast<size_t>(count));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [values](int32_t a, int32_t b) { return values[a] < values[b]; });
  return idx;
}

const Shape& linear_tensor_shape(const std::map<std::string, TensorView>& by_suffix,
                                 const std::string& suffix) {
  auto it = by_suffix.find(suffix);
  if (it == by_suffix.end())
    throw Error(ErrorCode::kMissingTensor, "", suffix, "linear has no '" + suffix + "' tensor");
  if (it->second.shape.size() != 2)
    throw Error(ErrorCode::kBadShape, "", suffix,
                "expected a 2-D tensor, got " + shape_str(it->second.shape));
  return it->second.shape;
}

const std::vector<uint8_t>& required_bf16_biases(const MoeExperts& x, MoeProj p, int64_t n,
                                                 const std::string& name) {
  const bool w13 = p == MoeProj::kW13;
  const std::vector<uint8_t>& src = w13 ? x.w13_bias : x.w2_bias;
  const int64_t want = (w13 ? x.w13.experts : x.w2.experts) * n * 2;
  if (x.bias_dtype != DType::kBF16)
    throw Error(ErrorCode::kUnsupported, "", name,
                std::string("expert biases in ") + dtype_name(x.bias_dtype) +
                    ": vLLM 0.33's gpt-oss loader holds them in bf16 (moepack takes bf16 only)");
  if (src.size() != static_cast<size_t>(want))
    throw Error(ErrorCode::kUnsupported, "", name,
                std::string("gpt-oss experts without their ") + (w13 ? "w13" : "w2") + " biases (" +
                    std::to_string(src.size()) + " bytes, want " + std::to_string(want) +
                    "): vLLM's gpt-oss layer always adds them");
  return src;
}

}  // namespace moepack
