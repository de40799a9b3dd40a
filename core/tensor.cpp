#include "core/tensor.h"

#include "core/error.h"

namespace moepack {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Tensor::Tensor(std::string n, DType d, Shape s)
    : name(std::move(n)), dtype(d), shape(std::move(s)) {
  auto bytes = dtype_bytes(dtype, static_cast<uint64_t>(numel(shape)));
  if (!bytes) throw Error(ErrorCode::kInternal, "", name, "tensor size is not whole bytes");
  data.assign(*bytes, 0);
}

Tensor Tensor::from_view(const TensorView& v) {
  Tensor t;
  t.name = v.name;
  t.dtype = v.dtype;
  t.shape = v.shape;
  t.data.assign(v.data, v.data + v.nbytes);
  return t;
}

TensorView Tensor::view() const {
  TensorView v;
  v.name = name;
  v.dtype = dtype;
  v.shape = shape;
  v.data = data.data();
  v.nbytes = data.size();
  return v;
}

}  // namespace moepack
