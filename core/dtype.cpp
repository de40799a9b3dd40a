#include "core/dtype.h"

#include <array>

namespace moepack {
namespace {
struct DTypeRow {
  DType dtype;
  const char* name;
  int bits;
};
// Names and bit sizes as the safetensors reference reader defines them.
constexpr std::array<DTypeRow, 22> kDTypes = {{
    {DType::kBOOL, "BOOL", 8},
    {DType::kF4, "F4", 4},
    {DType::kF6_E2M3, "F6_E2M3", 6},
    {DType::kF6_E3M2, "F6_E3M2", 6},
    {DType::kU8, "U8", 8},
    {DType::kI8, "I8", 8},
    {DType::kF8_E5M2, "F8_E5M2", 8},
    {DType::kF8_E4M3, "F8_E4M3", 8},
    {DType::kF8_E8M0, "F8_E8M0", 8},
    {DType::kF8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {DType::kF8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {DType::kI16, "I16", 16},
    {DType::kU16, "U16", 16},
    {DType::kF16, "F16", 16},
    {DType::kBF16, "BF16", 16},
    {DType::kI32, "I32", 32},
    {DType::kU32, "U32", 32},
    {DType::kF32, "F32", 32},
    {DType::kC64, "C64", 64},
    {DType::kF64, "F64", 64},
    {DType::kI64, "I64", 64},
    {DType::kU64, "U64", 64},
}};
}  // namespace

int dtype_bits(DType d) {
  return kDTypes[static_cast<size_t>(d)].bits;
}
const char* dtype_name(DType d) {
  return kDTypes[static_cast<size_t>(d)].name;
}

std::optional<DType> parse_dtype(const std::string& s) {
  for (const auto& row : kDTypes)
    if (s == row.name) return row.dtype;
  return std::nullopt;
}

std::optional<uint64_t> dtype_bytes(DType d, uint64_t numel) {
  const uint64_t bits = static_cast<uint64_t>(dtype_bits(d));
  if (numel != 0 && numel > UINT64_MAX / bits) return std::nullopt;
  const uint64_t total = numel * bits;
  if (total % 8 != 0) return std::nullopt;
  return total / 8;
}

}  // namespace moepack
