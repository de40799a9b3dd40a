// Where a long command stands (convert's layers written, verify's layers checked, ...), and the
// printer every command shares for it on stderr (--progress auto|tty|plain|json|none).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

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
// lines ("" for convert's historic "moepack: layers ...").
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

}  // namespace moepack
