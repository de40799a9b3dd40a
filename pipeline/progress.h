// Where a conversion stands, for the one updating progress line on a terminal (tools/).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace moepack {

struct ConvertProgress {
  int64_t layers_done = 0, layers_total = 0;  // MoE layers written completely
  uint64_t bytes_done = 0, bytes_total = 0;   // tensor bytes written (copy-through + converted)
  double seconds = 0;                         // since writing began
};

// Called from one thread at a time (the writer), after each piece written.
using ProgressFn = std::function<void(const ConvertProgress&)>;

// One line, no newline: "layers 3/8  612.0 MiB/1.6 GiB  412 MB/s  ETA 3s". The rate is bytes
// written over time so far; the ETA is the bytes left at that rate ("ETA ?" before any byte).
std::string progress_line(const ConvertProgress& p);

// "0 B", "1.5 KiB", "612.0 MiB", "1.6 GiB" (powers of 1024): the CLI's byte counts and the
// progress line's.
std::string human_bytes(uint64_t bytes);

}  // namespace moepack
