// The printer every long command shares for its progress on stderr (--progress
// auto|tty|plain|json|none; the progress itself: core/progress.h), and the summary that closes
// its result (source -> output bytes, time, rate, peak memory, verdict).
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/memory.h"
#include "core/progress.h"  // ConvertProgress, ProgressFn, ProgressCounter

namespace moepack {

// One line, no newline: "layers 3/8  612.0 MiB/1.6 GiB  412 MB/s  ETA 3s" ("tensors 9/40 ..."
// for merge and synth: the progress's unit). The rate is bytes done over time so far; the ETA is
// the bytes left at that rate ("ETA ?" before any byte).
std::string progress_line(const ConvertProgress& p);

// "0 B", "1.5 KiB", "612.0 MiB", "1.6 GiB" (powers of 1024): the CLI's byte counts and the
// progress line's.
std::string human_bytes(uint64_t bytes);

// --progress: "tty" one updating line (cleared before the result), "plain" a line at most every
// few seconds (logs without a terminal: Slurm, Kubernetes), "json" the same as one JSON object
// a line, "none" nothing; "auto" is tty on a terminal, plain without one, none when the result
// goes out as JSON.
enum class ProgressMode { kAuto, kTty, kPlain, kJson, kNone };
// "auto" ... "none" -> the mode; throws Error{kUsage} naming --progress for anything else.
ProgressMode parse_progress_mode(std::string_view text);
constexpr const char* kProgressModeNames = "auto|tty|plain|json|none";

// Prints a command's progress on stderr in one mode (auto resolved from `stderr_terminal` and
// `json_result`). Plain and json lines come at most every kPlainEverySeconds
// ($MOEPACK_PROGRESS_SECONDS overrides it) and once more when the work is done, except for a run
// shorter than the interval, which stays quiet. `command` names the work in plain and json
// lines ("" for convert's historic "moepack: layers ..."); a JSON line is
// {"progress": command, "<unit>_done", "<unit>_total", "bytes_done", "bytes_total", "seconds"}.
class ProgressPrinter {
 public:
  static constexpr double kPlainEverySeconds = 5;
  ProgressPrinter(ProgressMode mode, bool stderr_terminal, bool json_result, std::string command);
  ProgressPrinter(const ProgressPrinter&) = delete;
  ProgressPrinter& operator=(const ProgressPrinter&) = delete;
  ~ProgressPrinter() { clear(); }
  // Empty when nothing is printed: callers may skip the bookkeeping.
  const ProgressFn& fn() const { return fn_; }
  // Clears the terminal line (before a result or an error message is printed).
  void clear();

 private:
  bool due(const ConvertProgress& p);
  ProgressFn fn_;
  std::string command_;
  bool shown_ = false;
  double every_ = kPlainEverySeconds;
  double next_plain_ = kPlainEverySeconds;  // the first line after one interval of work
  bool done_shown_ = false, any_shown_ = false;
};

// The closing summary of a long command: `what` it did in bytes ("1.6 GiB source -> 1.7 GiB
// written"), the bytes its rate is of, time, peak memory (anonymous apart from mapped file pages,
// core/memory.h) and the verdict ("written", "PASSED", ...).
struct RunSummary {
  std::string what;
  uint64_t source_bytes = 0;  // read (0: no source)
  uint64_t output_bytes = 0;  // written (0: nothing written)
  uint64_t rate_bytes = 0;    // the bytes the rate is of
  double seconds = 0;
  ResidentMemory peak;
  std::string verdict;
};
// "summary: <what> in 1.2 s (412.0 MiB/s), peak memory 1.0 GiB anonymous + 2.0 GiB mapped,
// verdict <verdict>\n"
std::string summary_line(const RunSummary& s);
// The same as the "run" object of a --json result: source_bytes, output_bytes, seconds,
// bytes_per_second, peak_rss_anon_bytes, peak_rss_file_bytes, verdict.
nlohmann::json summary_json(const RunSummary& s);

// A long command's run as its runner sees it: its progress printer, the last progress reported,
// and the time and peak memory (sampled, core/memory.h) from construction to finish().
class CommandRun {
 public:
  CommandRun(ProgressMode mode, bool stderr_terminal, bool json_result, std::string command);
  // Records each progress and prints it; hand it to the work.
  const ProgressFn& fn() const { return fn_; }
  const ConvertProgress& last() const { return last_; }
  // Stops the clock and the sampler and clears the terminal line (idempotent); then a summary
  // with `what`, the bytes and the verdict filled in by the caller.
  RunSummary finish();

 private:
  ProgressPrinter printer_;
  ConvertProgress last_;
  ProgressFn fn_;
  PeakMemorySampler memory_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool finished_ = false;
  RunSummary summary_;
};

}  // namespace moepack
