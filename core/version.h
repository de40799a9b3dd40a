#pragma once

namespace moepack {
// The tool version recorded in every manifest (CMake project version).
const char* moepack_version();
}  // namespace moepack
