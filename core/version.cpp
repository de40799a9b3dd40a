#include "core/version.h"

namespace moepack {
const char* moepack_version() {
  return MOEPACK_VERSION;
}
}  // namespace moepack
