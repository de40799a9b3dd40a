#include "pipeline/progress.h"

#include <cmath>
#include <cstdio>

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

}  // namespace moepack
