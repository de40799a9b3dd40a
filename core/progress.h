// Where a long command stands (convert's MoE layers written, verify's layers checked, inspect's
// layers validated, merge's and synth's tensors written), as the work reports it. Printing it is
// the CLI's job (pipeline/progress.h: ProgressPrinter); this tier only counts, so that every tier
// that does long work (synth/ included) can report.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>

namespace moepack {

struct ConvertProgress {
  int64_t layers_done = 0, layers_total = 0;  // units of work done: `unit`
  uint64_t bytes_done = 0, bytes_total = 0;   // tensor bytes written, checked or read
  double seconds = 0;                         // since the work began
  const char* unit = "layers";                // what layers_done counts: "layers" or "tensors"
};

// Called from one thread at a time, after each piece of work.
using ProgressFn = std::function<void(const ConvertProgress&)>;

// Counts work done by any number of threads and hands it to a ProgressFn, one call at a time
// (under a lock): the state at construction (nothing done), then after every add(). A no-op
// without a function.
class ProgressCounter {
 public:
  ProgressCounter(const ProgressFn& fn, const char* unit, int64_t units_total,
                  uint64_t bytes_total);
  ProgressCounter(const ProgressCounter&) = delete;
  ProgressCounter& operator=(const ProgressCounter&) = delete;
  // `units` more of the unit done, `bytes` more bytes (either may be 0). Thread-safe.
  void add(int64_t units, uint64_t bytes);

 private:
  const ProgressFn fn_;
  std::mutex mu_;
  ConvertProgress state_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace moepack
