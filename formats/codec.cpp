#include "formats/codec.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/half.h"
#include "formats/fp8.h"

namespace moepack {

const char* quant_method_name(QuantMethod m) {
  switch (m) {
    case QuantMethod::kNone:
      return "none";
    case QuantMethod::kGptq:
      return "gptq";
    case QuantMethod::kAwq:
      return "awq";
    case QuantMethod::kCtPackQuantized:
      return "compressed-tensors-pack-quantized";
    case QuantMethod::kCtIntQuantized:
      return "compressed-tensors-int-quantized";
    case QuantMethod::kCtMxfp8:
      return "compressed-tensors-mxfp8";
    case QuantMethod::kModeloptMxfp8:
      return "modelopt-mxfp8";
    case QuantMethod::kModeloptFp8:
      return "modelopt-fp8";
    case QuantMethod::kFp8Block:
      return "fp8-block";
  }
  return "unknown";
}

std::optional<QuantMethod> parse_quant_method(const std::string& name) {
  // Every value of the underlying type, so a method added to the enum is found without a list.
  for (int i = 0; i <= UINT8_MAX; ++i) {
    const auto m = static_cast<QuantMethod>(i);
    const std::string n = quant_method_name(m);
    if (n == name && n != "unknown") return m;
  }
  return std::nullopt;
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
}

float scale_to_float(const uint8_t* p, DType d) {
  switch (d) {
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_float(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_float(h);
    }
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kU8:
    case DType::kF8_E8M0:
      return e8m0_to_float(*p);
    default:
      throw Error(ErrorCode::kInternal, std::string("unsupported scale dtype ") + dtype_name(d));
  }
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

std::vector<std::string> moe_shape_problems(const LayoutOptions& o, const MoeExperts& x) {
  const auto num = [](int64_t v) { return std::to_string(v); };
  std::vector<std::string> r;
  const int64_t shards = o.gated ? 2 : 1;
  if (x.w13.experts != x.w2.experts)
    r.push_back("w13 has " + num(x.w13.experts) + " experts but w2 has " + num(x.w2.experts));
  if (x.w13.k != x.w2.n)
    r.push_back("w13 K (hidden " + num(x.w13.k) + ") != w2 N (" + num(x.w2.n) + ")");
  if (x.w13.n != shards * x.w2.k)
    r.push_back("w13 N " + num(x.w13.n) + " != " + num(shards) + " x w2 K (intermediate " +
                num(x.w2.k) + ")" + (o.gated ? " for a gated layer" : " for a non-gated layer"));
  if (x.w13.experts < 1) r.push_back("no experts");
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
  if (it == m.end()) throw Error(ErrorCode::kMissingTensor, "", key, what + " lacks '" + key + "'");
  return it->second;
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
  for (int64_t n = 0; n < q.n; ++n) {
    const int64_t srow = n / q.scale_block_n;
    for (int64_t k = 0; k < q.k; ++k) {
      int64_t g = gi ? gi[k] : (q.group_size > 0 ? k / q.group_size : 0);
      const float s = scale_value(q, (e * SR + srow) * G + g);
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

}  // namespace moepack
