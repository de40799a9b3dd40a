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
  std::snprintf(buf, sizeof(buf), "%s %lld/%lld  %s/%s  %.0f MB/s  ETA %s", p.unit,
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
        const std::string unit = p.unit;
        const nlohmann::json j = {{"progress", command_.empty() ? "convert" : command_},
                                  {unit + "_done", p.layers_done},
                                  {unit + "_total", p.layers_total},
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

std::string summary_line(const RunSummary& s) {
  const double rate = s.seconds > 0 ? static_cast<double>(s.rate_bytes) / s.seconds : 0;
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.2f", s.seconds);
  return "summary: " + s.what + " in " + secs + " s (" + human_bytes(static_cast<uint64_t>(rate)) +
         "/s), peak memory " + human_bytes(s.peak.anon_bytes) + " anonymous + " +
         human_bytes(s.peak.file_bytes) + " mapped, verdict " + s.verdict + "\n";
}

nlohmann::json summary_json(const RunSummary& s) {
  const double rate = s.seconds > 0 ? static_cast<double>(s.rate_bytes) / s.seconds : 0;
  return {{"source_bytes", s.source_bytes},
          {"output_bytes", s.output_bytes},
          {"seconds", s.seconds},
          {"bytes_per_second", rate},
          {"peak_rss_anon_bytes", s.peak.anon_bytes},
          {"peak_rss_file_bytes", s.peak.file_bytes},
          {"verdict", s.verdict}};
}

CommandRun::CommandRun(ProgressMode mode, bool stderr_terminal, bool json_result,
                       std::string command)
    : printer_(mode, stderr_terminal, json_result, std::move(command)) {
  fn_ = [this](const ConvertProgress& p) {
    last_ = p;
    if (printer_.fn()) printer_.fn()(p);
  };
}

RunSummary CommandRun::finish() {
  if (!finished_) {
    summary_.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    summary_.peak = memory_.stop();
    printer_.clear();
    finished_ = true;
  }
  return summary_;
}

}  // namespace moepack
