// --threads 0 (core/threads.h): the CPUs this process may use -- its affinity mask, bounded by a
// cgroup CPU quota -- not the machine's hardware threads.
#include <gtest/gtest.h>
#include <sched.h>

#include <nlohmann/json.hpp>

#include "core/threads.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

TEST(AvailableCpus, CgroupCpuMax) {
  EXPECT_EQ(cpus_of_cgroup_cpu_max("max 100000\n"), 0);
  EXPECT_EQ(cpus_of_cgroup_cpu_max("200000 100000\n"), 2);
  EXPECT_EQ(cpus_of_cgroup_cpu_max("150000 100000"), 2);  // rounded up
  EXPECT_EQ(cpus_of_cgroup_cpu_max("50000 100000"), 1);
  EXPECT_EQ(cpus_of_cgroup_cpu_max(""), 0);
  EXPECT_EQ(cpus_of_cgroup_cpu_max("x 100000"), 0);
  EXPECT_EQ(cpus_of_cgroup_cpu_max("100000 0"), 0);
}

TEST(AvailableCpus, AtMostTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_GE(available_cpus(), 1);
  EXPECT_LE(available_cpus(), CPU_COUNT(&set));
  EXPECT_EQ(resolve_threads(0), available_cpus());
  EXPECT_EQ(resolve_threads(3), 3);
}

// Through the binary: under `taskset -c 0` --threads 0 plans one thread (the plan says it).
TEST(AvailableCpus, TasksetBoundsThreadsZero) {
  if (test::run_command("command -v taskset >/dev/null") != 0) GTEST_SKIP() << "no taskset";
  test::TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(test::moepack_cli("synth " + src +
                              " --format gptq --layers 2 --experts 4 --hidden 256 "
                              "--inter 128"),
            0);
  std::string out, err;
  ASSERT_EQ(test::run_command("taskset -c 0 " + test::moepack_bin() + " convert " + src + " " +
                                  (tmp / "dst") + " --dry-run --json --threads 0",
                              &out, &err),
            0)
      << err;
  EXPECT_EQ(nlohmann::json::parse(out)["threads"], 1) << out;
}

}  // namespace
}  // namespace moepack
