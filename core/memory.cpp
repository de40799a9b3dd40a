#include "core/memory.h"

#include <cstdlib>  // defines __GLIBC__ (via features.h) for the check below

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace moepack {

void keep_freed_memory_for_reuse() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);         // large blocks from the heap, not per-block mmaps
  mallopt(M_TRIM_THRESHOLD, -1);  // never trim: freed heap is reused by the next layer (size_t max)
  mallopt(M_TOP_PAD, 64 << 20);   // grow the heap in large steps
#endif
}

}  // namespace moepack
