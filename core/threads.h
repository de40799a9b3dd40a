// Static work splitting over std::thread. Deterministic: each index is processed by exactly one
// call of `fn`, and results are written to disjoint places, so output bytes never depend on the
// thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace moepack {

// Number of worker threads to use when the user asked for `requested` (0 = available_cpus()).
int resolve_threads(int requested);

// The CPUs this process may use: its affinity mask (sched_getaffinity: taskset, cpusets, Slurm's
// binding), further bounded by a CFS quota (cgroup v2 cpu.max of its cgroup and the ones above
// it, cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us; rounded up). At least 1.
int available_cpus();

// A cgroup v2 cpu.max ("max 100000", "150000 100000"): the CPUs the quota allows, rounded up;
// 0 for no limit or text that is not a quota.
int cpus_of_cgroup_cpu_max(const std::string& text);

// Calls fn(begin, end) on contiguous chunks covering [0, n) using up to `threads` threads.
// After all threads joined, the exception of the lowest chunk that threw is rethrown (chunks
// are in index order, so a caller that stops at its first failing index reports the lowest
// failing index, whatever the thread count).
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace moepack
