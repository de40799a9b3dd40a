#include "core/progress.h"

namespace moepack {

ProgressCounter::ProgressCounter(const ProgressFn& fn, const char* unit, int64_t units_total,
                                 uint64_t bytes_total)
    : fn_(fn) {
  state_.unit = unit;
  state_.layers_total = units_total;
  state_.bytes_total = bytes_total;
  if (fn_) fn_(state_);
}

void ProgressCounter::add(int64_t units, uint64_t bytes) {
  if (!fn_) return;
  std::lock_guard<std::mutex> lock(mu_);
  state_.layers_done += units;
  state_.bytes_done += bytes;
  state_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  fn_(state_);
}

}  // namespace moepack
