// execute_plan(): writes what a Plan says, deciding nothing of its own.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "pipeline/plan.h"

namespace moepack {

using ProgressFn = std::function<void(const std::string& stage, int64_t done, int64_t total)>;

struct ConvertResult {
  std::string dst;
  uint64_t bytes_written = 0;
  int64_t tensors = 0;
  double seconds = 0;
  // Wall time per stage: copy (copy-through tensors), load (read + unpack to canonical or
  // quantise), pack (backend layout), write (checksum + write of converted tensors), finish
  // (fsync, config, manifest, rename).
  std::map<std::string, double> stage_seconds;
};

// Writes the planned checkpoint atomically (temp sibling, fsync, rename). Never leaves a
// partial output behind.
ConvertResult execute_plan(const Plan& plan, const Checkpoint& ckpt,
                           const ProgressFn& progress = {});

}  // namespace moepack
