// Static work splitting over std::thread. Deterministic: each index is processed by exactly one
// call of `fn`, and results are written to disjoint places, so output bytes never depend on the
// thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace moepack {

// Number of worker threads to use when the user asked for `requested` (0 = all hardware threads).
int resolve_threads(int requested);

// Calls fn(begin, end) on contiguous chunks covering [0, n) using up to `threads` threads.
// After all threads joined, the exception of the lowest chunk that threw is rethrown (chunks
// are in index order, so a caller that stops at its first failing index reports the lowest
// failing index, whatever the thread count).
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace moepack
