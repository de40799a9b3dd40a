#include "core/threads.h"

#include <algorithm>
#include <exception>
#include <thread>
#include <vector>

namespace moepack {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(resolve_threads(threads), n));
  if (workers == 1) {
    fn(0, n);
    return;
  }
  // One slot per chunk: the error rethrown is the one of the lowest chunk, so a failing input
  // is named the same way whatever the thread count or the timing.
  std::vector<std::exception_ptr> errors(static_cast<size_t>(workers));
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t begin = n * w / workers, end = n * (w + 1) / workers;
    pool.emplace_back([&, w, begin, end] {
      try {
        fn(begin, end);
      } catch (...) {
        errors[static_cast<size_t>(w)] = std::current_exception();
      }
    });
  }
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace moepack
