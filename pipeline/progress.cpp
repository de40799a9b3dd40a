#include "pipeline/progress.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moepack {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

std::string progress_line(const ConvertProgress& p) {
  char buf[160];
  const double rate =
      p.seconds > 0 && p.bytes_done > 0 ? static_cast<double>(p.bytes_done) / p.seconds : 0;
  std::string eta = "?";
  if (rate > 0) {
    const uint64_t left = p.bytes_total > p.bytes_done ? p.bytes_total - p.bytes_done : 0;
    const long long s = std::llround(static_cast<double>(left) / rate);
    char e[32];
    if (s >= 3600)
      std::snprintf(e, sizeof(e), "%lldh%02lldm", s / 3600, s / 60 % 60);
    else if (s >= 60)
      std::snprintf(e, sizeof(e), "%lldm%02llds", s / 60, s % 60);
    else
      std::snprintf(e, sizeof(e), "%llds", s);
    eta = e;
  }
  std::snprintf(buf, sizeof(buf), "layers %lld/%lld  %s/%s  %.0f MB/s  ETA %s",
                static_cast<long long>(p.layers_done), static_cast<long long>(p.layers_total),
                human_bytes(p.bytes_done).c_str(), human_bytes(p.bytes_total).c_str(), rate / 1e6,
                eta.c_str());
  return buf;
}

ProgressMode parse_progress_mode(std::string_view text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "tty") return ProgressMode::kTty;
  if (text == "plain") return ProgressMode::kPlain;
  if (text == "json") return ProgressMode::kJson;
  if (text == "none") return ProgressMode::kNone;
  throw Error(ErrorCode::kUsage,
              "unknown --progress \"" + std::string(text) + "\" (" + kProgressModeNames + ")");
}

ProgressPrinter::ProgressPrinter(ProgressMode mode, bool stderr_terminal, bool json_result,
                                 std::string command)
    : command_(std::move(command)) {
  if (mode == ProgressMode::kAuto)
    mode = json_result       ? ProgressMode::kNone
           : stderr_terminal ? ProgressMode::kTty
                             : ProgressMode::kPlain;
  if (const char* every = std::getenv("MOEPACK_PROGRESS_SECONDS")) every_ = std::atof(every);
  next_plain_ = every_;
  const std::string prefix = "moepack: " + (command_.empty() ? "" : command_ + ": ");
  switch (mode) {
    case ProgressMode::kTty:
      fn_ = [this](const ConvertProgress& p) {
        std::fprintf(stderr, "\r\033[K%s%s", command_.empty() ? "" : (command_ + ": ").c_str(),
                     progress_line(p).c_str());
        std::fflush(stderr);
        shown_ = true;
      };
      break;
    case ProgressMode::kPlain:
      fn_ = [this, prefix](const ConvertProgress& p) {
        if (!due(p)) return;
        std::fprintf(stderr, "%s%s\n", prefix.c_str(), progress_line(p).c_str());
        std::fflush(stderr);
      };
      break;
    case ProgressMode::kJson:
      fn_ = [this](const ConvertProgress& p) {
        if (!due(p)) return;
        const nlohmann::json j = {{"progress", command_.empty() ? "convert" : command_},
                                  {"layers_done", p.layers_done},
                                  {"layers_total", p.layers_total},
                                  {"bytes_done", p.bytes_done},
                                  {"bytes_total", p.bytes_total},
                                  {"seconds", p.seconds}};
        std::fprintf(stderr, "%s\n", j.dump().c_str());
        std::fflush(stderr);
      };
      break;
    default:
      break;
  }
}

bool ProgressPrinter::due(const ConvertProgress& p) {
  const bool done = p.bytes_total > 0 && p.bytes_done >= p.bytes_total;
  if (!done && p.seconds < next_plain_) return false;
  if (done && (done_shown_ || !any_shown_)) return false;  // a short run stays quiet
  done_shown_ = done;
  any_shown_ = true;
  next_plain_ = p.seconds + every_;
  return true;
}

void ProgressPrinter::clear() {
  if (shown_) std::fprintf(stderr, "\r\033[K");
  shown_ = false;
}

}  // namespace moepack
