#include "core/threads.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace moepack {

namespace {

std::string read_small_file(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s, '\0');
  return s;
}

int cpus_of_quota(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>(std::min<long long>((quota + period - 1) / period, 1 << 20));
}

// The smallest CFS quota on this process's cgroup path (0: none).
int cgroup_cpu_limit() {
  int limit = 0;
  const auto take = [&](int cpus) {
    if (cpus > 0 && (limit == 0 || cpus < limit)) limit = cpus;
  };
  std::istringstream lines(read_small_file("/proc/self/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("0::", 0) == 0) {  // cgroup v2: walk from the process's cgroup to the root
      std::string dir = line.substr(3);
      for (;;) {
        take(cpus_of_cgroup_cpu_max(read_small_file("/sys/fs/cgroup" + dir + "/cpu.max")));
        if (dir.empty() || dir == "/") break;
        dir = dir.substr(0, dir.rfind('/'));
      }
    }
  }
  // cgroup v1, as a container sees its own (mounted at the root of the hierarchy).
  for (const char* d : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    const std::string q = read_small_file(std::string(d) + "/cpu.cfs_quota_us");
    const std::string p = read_small_file(std::string(d) + "/cpu.cfs_period_us");
    if (!q.empty() && !p.empty()) take(cpus_of_quota(std::atoll(q.c_str()), std::atoll(p.c_str())));
  }
  return limit;
}

}  // namespace

int cpus_of_cgroup_cpu_max(const std::string& text) {
  std::istringstream s(text);
  std::string quota;
  long long period = 0;
  if (!(s >> quota >> period) || quota == "max") return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != '\0') return 0;
  return cpus_of_quota(q, period);
}

int available_cpus() {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  const int quota = cgroup_cpu_limit();
  if (quota > 0 && (cpus <= 0 || quota < cpus)) cpus = quota;
  return cpus > 0 ? cpus : 1;
}

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  static const int cpus = available_cpus();
  return cpus;
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
  try {
    pool.reserve(static_cast<size_t>(workers));
  } catch (const std::bad_alloc&) {
  }
  const auto run_chunk = [&](int64_t w) {
    try {
      fn(n * w / workers, n * (w + 1) / workers);
    } catch (...) {
      errors[static_cast<size_t>(w)] = std::current_exception();
    }
  };
  // A thread that cannot be started (out of memory for its stack, a thread limit) is not an
  // abort: the chunks not yet started run on the calling thread, with the same boundaries, so
  // the result and the error named are the same. (A joinable std::thread must never be
  // destroyed: every started one is joined.)
  int64_t started = 0;
  for (; started < workers; ++started) {
    try {
      pool.emplace_back(run_chunk, started);
    } catch (...) {
      break;
    }
  }
  for (int64_t w = started; w < workers; ++w) run_chunk(w);
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace moepack
