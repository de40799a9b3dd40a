// safetensors dtypes. Declared in the reference reader's order, which is increasing alignment
// (safetensors `Dtype` enum; spec/checkpoints.md §4.2).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace moepack {

enum class DType : uint8_t {
  kBOOL,
  kF4,
  kF6_E2M3,
  kF6_E3M2,
  kU8,
  kI8,
  kF8_E5M2,
  kF8_E4M3,
  kF8_E8M0,
  kF8_E4M3FNUZ,
  kF8_E5M2FNUZ,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};

int dtype_bits(DType d);          // 4 for F4, 6 for F6_*, 8..128
const char* dtype_name(DType d);  // "F16", ...
std::optional<DType> parse_dtype(const std::string& s);
// Byte size of `numel` elements; nullopt when the bit count is not a whole number of bytes.
std::optional<uint64_t> dtype_bytes(DType d, uint64_t numel);
inline bool is_scale_byte_dtype(DType d) {
  return d == DType::kU8 || d == DType::kF8_E8M0;
}

}  // namespace moepack
