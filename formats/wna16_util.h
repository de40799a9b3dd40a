// Small helpers shared by the WNA16 source codecs (gptq, awq, compressed_tensors) and the Marlin
// layout: tensor lookup with named errors, dtype/shape checks that print the numbers, scale
// element access, byte transposes and g_idx normalisation. Internal to formats/.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "core/half.h"
#include "formats/codec.h"

namespace moepack::wna16 {

inline void expect_dtype(const Tensor& t, const std::string& what,
                         std::initializer_list<DType> ok) {
  for (DType d : ok)
    if (t.dtype == d) return;
  std::string list;
  for (DType d : ok) list += std::string(list.empty() ? "" : "/") + dtype_name(d);
  throw Error(ErrorCode::kBadDtype, "", what,
              std::string("dtype ") + dtype_name(t.dtype) + ", expected " + list);
}

inline void expect_shape(const Tensor& t, const std::string& what, const Shape& want,
                         const std::string& why = "") {
  if (t.shape != want)
    throw Error(ErrorCode::kBadShape, "", what,
                "shape " + shape_str(t.shape) + ", expected " + shape_str(want) +
                    (why.empty() ? "" : " (" + why + ")"));
  // A Tensor built by hand could disagree with its own shape; never read past the bytes.
  const auto bytes = dtype_bytes(t.dtype, static_cast<uint64_t>(numel(t.shape)));
  if (!bytes || *bytes != t.data.size())
    throw Error(ErrorCode::kBadShape, "", what,
                "holds " + std::to_string(t.data.size()) + " bytes, shape " + shape_str(t.shape) +
                    " needs " + std::to_string(bytes ? *bytes : 0));
}

inline bool is_float_scale_dtype(DType d) {
  return d == DType::kF16 || d == DType::kBF16 || d == DType::kF32;
}

// NaN / Inf scales make every dequantised weight of their group meaningless: refuse them.
inline void check_finite_scales(const uint8_t* data, int64_t count, DType d,
                                const std::string& what) {
  const int eb = dtype_bits(d) / 8;
  for (int64_t i = 0; i < count; ++i) {
    const float v = scale_to_float(data + i * eb, d);
    if (!std::isfinite(v))
      throw Error(ErrorCode::kBadValue, "", what,
                  "scale " + std::to_string(i) + " is " + (std::isnan(v) ? "NaN" : "Inf"));
  }
}

// [rows, cols] of elem_bytes-wide elements -> [cols, rows].
inline void transpose_bytes(const uint8_t* in, int64_t rows, int64_t cols, int elem_bytes,
                            uint8_t* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(out + (c * rows + r) * elem_bytes, in + (r * cols + c) * elem_bytes,
                  static_cast<size_t>(elem_bytes));
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}
inline void store_u32(uint8_t* p, uint32_t w) {
  std::memcpy(p, &w, 4);
}

// Group of input row k without act-order.
inline int32_t trivial_group(int64_t k, int64_t group_size) {
  return group_size > 0 ? static_cast<int32_t>(k / group_size) : 0;
}

// Validates g_idx values against the group count (kBadValue naming `what`) and returns them, or
// an empty vector when they are exactly k / group_size (no act-order: canonical keeps it empty).
inline std::vector<int32_t> normalise_g_idx(const Tensor& t, const std::string& what, int64_t k,
                                            int64_t group_size, int64_t groups) {
  expect_dtype(t, what, {DType::kI32});
  expect_shape(t, what, {k}, "one group index per input row K");
  std::vector<int32_t> g = to_vector<int32_t>(t.view());
  bool trivial = true;
  for (int64_t i = 0; i < k; ++i) {
    if (g[i] < 0 || g[i] >= groups)
      throw Error(ErrorCode::kBadValue, "", what,
                  "g_idx[" + std::to_string(i) + "] = " + std::to_string(g[i]) + " outside [0, " +
                      std::to_string(groups) + ")");
    trivial = trivial && g[i] == trivial_group(i, group_size);
  }
  if (trivial) g.clear();
  return g;
}

// Whether the g_idx tensor under `suffix` (if any) is a real act-order: not k / group_size.
// A tensor that is not I32 counts as one, so that the codec's unpack reports it.
inline bool has_nontrivial_g_idx(const QuantParams& q,
                                 const std::map<std::string, TensorView>& by_suffix,
                                 const std::string& suffix) {
  if (!q.act_order) return false;
  auto it = by_suffix.find(suffix);
  if (it == by_suffix.end()) return false;
  const TensorView& v = it->second;
  if (v.dtype != DType::kI32) return true;
  const int64_t k = static_cast<int64_t>(v.nbytes / 4);
  for (int64_t i = 0; i < k; ++i)
    if (static_cast<int32_t>(load_u32(v.data + 4 * i)) != trivial_group(i, q.group_size))
      return true;
  return false;
}

inline Tensor i32_tensor(const std::string& name, Shape shape, const std::vector<uint32_t>& words) {
  Tensor t(name, DType::kI32, std::move(shape));
  if (!words.empty()) std::memcpy(t.data.data(), words.data(), t.data.size());
  return t;
}

}  // namespace moepack::wna16
