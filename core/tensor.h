// Owned and borrowed tensors: a name, a dtype, a shape and little-endian C-order bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moepack {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& shape);          // 1 for rank 0
std::string shape_str(const Shape& shape);  // "[2, 3]"

// A borrowed view (e.g. into an mmapped safetensors file).
struct TensorView {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;

  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data);
  }
};

// An owned tensor.
struct Tensor {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  std::vector<uint8_t> data;

  Tensor() = default;
  Tensor(std::string n, DType d, Shape s);  // zero-filled bytes of the right size
  static Tensor from_view(const TensorView& v);
  TensorView view() const;
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data.data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data.data());
  }
};

// Tensors of one linear layer keyed by suffix ("qweight", "scales", "weight_scale", ...)
// or one layer's output parameters keyed by full name.
using TensorMap = std::map<std::string, Tensor>;

// One F16 / BF16 / F32 element at p as float (little-endian bytes). Throws kBadDtype naming
// `what` for any other dtype. The one byte->float conversion every reader uses.
float element_as_float(const uint8_t* p, DType d, const std::string& what = "");
// Every element of a F16 / BF16 / F32 view as float (kBadDtype naming the view otherwise).
std::vector<float> to_floats(const TensorView& v);

// Typed copies for tests and codecs (memcpy: no aliasing concerns, little-endian hosts only).
template <typename T>
std::vector<T> to_vector(const TensorView& v) {
  std::vector<T> out(v.nbytes / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data, out.size() * sizeof(T));
  return out;
}
template <typename T>
Tensor make_tensor(std::string name, DType dtype, Shape shape, const std::vector<T>& values) {
  Tensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

}  // namespace moepack
