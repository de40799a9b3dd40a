#include "formats/awq.h"

#include "formats/wna16_util.h"

namespace moepack {
namespace {

using wna16::expect_dtype;
using wna16::expect_shape;

void check_awq_params(int bits, int64_t group_size, const char* what) {
  if (bits != 4)
    throw Error(ErrorCode::kUnsupported, "", what,
                "AWQ bits=" + std::to_string(bits) + " (only 4-bit AWQ exists)");
  if (group_size <= 0)
    throw Error(ErrorCode::kUnsupported, "", what,
                "AWQ needs a real group size, got group_size=" + std::to_string(group_size));
}

// Unpacks an [rows, cols/8] AWQ-order word matrix into logical [rows, cols] nibbles.
void unpack_awq_words(const Tensor& t, int64_t rows, int64_t cols, uint8_t* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols / 8; ++c) {
      const uint32_t w = wna16::load_u32(t.data.data() + (r * (cols / 8) + c) * 4);
      for (int p = 0; p < 8; ++p)
        out[r * cols + 8 * c + kAwqOrder[p]] = static_cast<uint8_t>((w >> (4 * p)) & 15u);
    }
}

// Packs logical [rows, cols] nibbles (value at (r, n) = get(r, n)) into AWQ-order words.
template <typename Get>
Tensor pack_awq_words(const std::string& name, int64_t rows, int64_t cols, Get get) {
  Tensor t(name, DType::kI32, {rows, cols / 8});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols / 8; ++c) {
      uint32_t w = 0;
      for (int p = 0; p < 8; ++p) {
        const uint32_t v = get(r, 8 * c + kAwqOrder[p]);
        if (v > 15u)
          throw Error(ErrorCode::kBadValue, "", name,
                      "value " + std::to_string(v) + " at (" + std::to_string(r) + ", " +
                          std::to_string(8 * c + kAwqOrder[p]) + ") does not fit in 4 bits");
        w |= v << (4 * p);
      }
      wna16::store_u32(t.data.data() + (r * (cols / 8) + c) * 4, w);
    }
  return t;
}

}  // namespace

std::vector<std::string> awq_required_suffixes(const QuantParams&) {
  return {"qweight", "qzeros", "scales"};
}

std::vector<std::string> awq_optional_suffixes(const QuantParams&) {
  return {};
}

QuantTensor unpack_awq(const QuantParams& p, const TensorMap& m, int64_t n, int64_t k) {
  check_awq_params(p.bits, p.group_size, "qweight");
  if (n <= 0 || k <= 0 || n % 8 != 0)
    throw Error(ErrorCode::kBadShape, "", "qweight",
                "N=" + std::to_string(n) + " K=" + std::to_string(k) +
                    ": AWQ packs 8 columns per word, N must be a positive multiple of 8");
  QuantSpec encoding;
  encoding.kind = CodeKind::kUint;
  encoding.bits = 4;
  encoding.group_size = p.group_size;
  encoding.symmetric = false;
  QuantTensor q(encoding, 1, n, k);
  const int64_t G = q.groups();

  const Tensor& qw = require_tensor(m, "qweight");
  expect_dtype(qw, "qweight", {DType::kI32, DType::kU32});
  expect_shape(qw, "qweight", {k, n / 8}, "AWQ qweight is [K, N/8]");
  std::vector<uint8_t> kn(static_cast<size_t>(k * n));
  unpack_awq_words(qw, k, n, kn.data());
  q.codes.resize(kn.size());
  wna16::transpose_bytes(kn.data(), k, n, 1, q.codes.data());

  const Tensor& qz = require_tensor(m, "qzeros");
  expect_dtype(qz, "qzeros", {DType::kI32, DType::kU32});
  expect_shape(qz, "qzeros", {G, n / 8}, "AWQ qzeros are [G, N/8]");
  std::vector<uint8_t> gn(static_cast<size_t>(G * n));
  unpack_awq_words(qz, G, n, gn.data());
  q.zeros.resize(gn.size());
  wna16::transpose_bytes(gn.data(), G, n, 1, q.zeros.data());

  const Tensor& sc = require_tensor(m, "scales");
  expect_dtype(sc, "scales", {DType::kF16, DType::kBF16, DType::kF32});
  expect_shape(sc, "scales", {G, n}, "AWQ scales are [G, N], G = " + std::to_string(G));
  wna16::check_finite_scales(sc.data.data(), G * n, sc.dtype, "scales");
  q.scale_dtype = sc.dtype;
  q.scales.resize(sc.data.size());
  wna16::transpose_bytes(sc.data.data(), G, n, q.scale_bytes(), q.scales.data());
  q.check_consistent("awq");
  return q;
}

TensorMap pack_awq(const QuantParams&, const QuantTensor& q) {
  q.check_consistent("awq");
  check_awq_params(q.bits, q.group_size, "qweight");
  if (q.experts != 1)
    throw Error(ErrorCode::kInternal, "", "qweight",
                "AWQ packs one Linear, got experts=" + std::to_string(q.experts));
  if (q.kind != CodeKind::kUint || q.symmetric || !q.g_idx.empty() || q.scale_block_n != 1 ||
      !wna16::is_float_scale_dtype(q.scale_dtype))
    throw Error(ErrorCode::kUnsupported, "", "qweight",
                "AWQ holds 4-bit codes with explicit zero points, per-row float scales and no "
                "act-order");
  const int64_t n = q.n, k = q.k, G = q.groups();
  if (n % 8 != 0)
    throw Error(ErrorCode::kBadShape, "", "qweight",
                "N=" + std::to_string(n) + " is not a multiple of 8");
  TensorMap out;
  out["qweight"] = pack_awq_words("qweight", k, n, [&](int64_t kk, int64_t nn) {
    return static_cast<uint32_t>(q.codes[static_cast<size_t>(nn * k + kk)]);
  });
  out["qzeros"] = pack_awq_words("qzeros", G, n, [&](int64_t g, int64_t nn) {
    return static_cast<uint32_t>(q.zeros[static_cast<size_t>(nn * G + g)]);
  });
  Tensor sc("scales", q.scale_dtype, {G, n});
  wna16::transpose_bytes(q.scales.data(), n, G, q.scale_bytes(), sc.data.data());
  out["scales"] = std::move(sc);
  return out;
}

QuantSpec awq_spec_for(const QuantParams& p) {
  QuantSpec s;
  s.kind = CodeKind::kUint;
  s.bits = p.bits;
  s.group_size = p.group_size;
  s.symmetric = p.symmetric;
  s.scale_dtype = DType::kF16;  // AutoAWQ writes fp16 scales
  return s;
}

std::pair<int64_t, int64_t> awq_logical_shape(const QuantParams& p,
                                              const std::map<std::string, TensorView>& by_suffix) {
  const Shape& s = linear_tensor_shape(by_suffix, "qweight");  // [K, N/pf]
  return {s[1] * (32 / p.bits), s[0]};
}

std::vector<QuantParams> awq_param_space() {
  std::vector<QuantParams> out;
  for (int64_t g : {32, 64, 128}) {
    QuantParams p;
    p.method = QuantMethod::kAwq;
    p.bits = 4;
    p.group_size = g;
    p.symmetric = false;
    p.dtype = DType::kF16;
    out.push_back(p);
  }
  return out;
}

}  // namespace moepack
