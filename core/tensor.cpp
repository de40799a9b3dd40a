#include "core/tensor.h"

#include "core/checked.h"
#include "core/error.h"
#include "core/half.h"

namespace moepack {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      throw Error(ErrorCode::kBadShape, "", "", "negative extent in shape " + shape_str(shape));
    n = checked_mul(n, d, "shape " + shape_str(shape));
  }
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

float element_as_float(const uint8_t* p, DType d, const std::string& what) {
  uint16_t h = 0;
  float f = 0.0f;
  switch (d) {
    case DType::kBF16:
      std::memcpy(&h, p, 2);
      return bf16_to_float(h);
    case DType::kF16:
      std::memcpy(&h, p, 2);
      return f16_to_float(h);
    case DType::kF32:
      std::memcpy(&f, p, 4);
      return f;
    default:
      throw Error(ErrorCode::kBadDtype, "", what,
                  std::string("expected BF16/F16/F32 values, got ") + dtype_name(d));
  }
}

std::vector<float> to_floats(const TensorView& v) {
  const int64_t count = numel(v.shape);
  const int eb = dtype_bits(v.dtype) / 8;
  if (eb == 0 || static_cast<uint64_t>(count) * static_cast<uint64_t>(eb) > v.nbytes)
    throw Error(ErrorCode::kBadShape, "", v.name, "holds fewer bytes than its shape needs");
  std::vector<float> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    out[static_cast<size_t>(i)] = element_as_float(v.data + i * eb, v.dtype, v.name);
  return out;
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
