// Bounded verify: under a data-segment cap (RLIMIT_DATA, `ulimit -d`) far below what one whole
// MoE layer needs, `verify --source` completes chunk by chunk with --chunk-size, as convert does;
// a shell cannot hold 300 MB under the same cap, which shows the cap bites.
//
// RLIMIT_DATA counts the heap and private writable mappings but not the read-only mappings of
// the shards (page cache, reclaimable), so it caps exactly what grows with the layer size.
// RLIMIT_AS (`prlimit --as`) would also count the mapped shards: see docs/verify.md.
//
// The CUDA path (`verify --device cuda`, skipped without a device) the same way, on a layer of
// 128 experts at H = 2048, I = 768 (604 MB of canonical codes, twice that with the source): the
// CUDA driver and runtime need data segment of their own, so the cap is what a verify of a tiny
// model needs on this machine (found by trying caps) plus 128 MiB.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/moepack_cuda.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
using test::moepack_bin;
using test::run_command;
using test::TempDir;

#if defined(__SANITIZE_ADDRESS__)
#define MOEPACK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOEPACK_ASAN 1
#endif
#endif

// 128 MiB of data segment. moepack's allocator policy (core/memory.h) grows the heap in 64 MiB
// steps, so the process needs about 64 MiB before it converts anything.
constexpr int kCapKib = 128 * 1024;

int capped(const std::string& args, std::string* err = nullptr) {
  return run_command(
      "ulimit -d " + std::to_string(kCapKib) + " && exec " + moepack_bin() + " " + args, nullptr,
      err);
}

TEST(VerifyMemory, LayerLargerThanTheCapVerifiesChunkByChunk) {
#ifdef MOEPACK_ASAN
  GTEST_SKIP() << "ASan reserves terabytes of shadow memory: a data-segment cap cannot apply";
#endif
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  // One MoE layer of 32 experts, H = 1024, I = 768: 75.5 MB of canonical codes, held twice
  // (decoded and source) by a whole-layer verify -- well over the cap.
  ASSERT_EQ(run_command(moepack_bin() + " synth " + src +
                        " --format gptq --layers 2 --experts 32 --hidden 1024 --inter 768"),
            0);
  std::string err;
  // convert stays within the cap with the same --chunk-size.
  ASSERT_EQ(capped("convert " + src + " " + dst + " --threads 1 --chunk-size 8MiB", &err), 0)
      << err;
  err.clear();
  EXPECT_EQ(capped("verify " + dst + " --source " + src + " --threads 1 --chunk-size 8MiB", &err),
            0)
      << err;
  err.clear();
  EXPECT_EQ(capped("verify " + dst + " --threads 1 --chunk-size 8MiB", &err), 0) << err;
  // The cap is real: under it a shell cannot hold 300 MB in a variable (the allocation is
  // refused), while without it the same command succeeds. (A whole-layer verify no longer exists
  // to show it: verify, like convert, takes at least kMinChunksPerLayer chunks a layer whatever
  // --chunk-size says.)
  const std::string hold = "bash -c 'x=$(head -c 300000000 /dev/zero | tr \"\\0\" a); echo ${#x}'";
  std::string out;
  ASSERT_EQ(run_command(hold, &out), 0);
  EXPECT_EQ(out, "300000000\n");
  EXPECT_NE(run_command("ulimit -d " + std::to_string(kCapKib) + " && " + hold, nullptr, nullptr),
            0);
}

// The smallest cap (KiB) of `caps` under which `args` exits 0, or -1.
int64_t smallest_cap(const std::vector<int64_t>& caps, const std::string& args) {
  for (int64_t cap : caps)
    if (run_command("ulimit -d " + std::to_string(cap) + " && exec " + moepack_bin() + " " + args,
                    nullptr, nullptr) == 0)
      return cap;
  return -1;
}

TEST(VerifyMemory, CudaLayerLargerThanTheCapVerifiesChunkByChunk) {
#ifdef MOEPACK_ASAN
  GTEST_SKIP() << "ASan reserves terabytes of shadow memory: a data-segment cap cannot apply";
#endif
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device";
  TempDir tmp;
  const std::string tiny_src = tmp / "tiny_src", tiny = tmp / "tiny", src = tmp / "src",
                    dst = tmp / "dst";
  ASSERT_EQ(run_command(moepack_bin() + " synth " + tiny_src +
                        " --format gptq --layers 2 --experts 8 --hidden 256 --inter 128"),
            0);
  ASSERT_EQ(run_command(moepack_bin() + " convert " + tiny_src + " " + tiny +
                        " --target-arch sm90 --backend marlin"),
            0);
  // What the process needs whatever the layer: the CUDA context, the runtime's two staging areas
  // (64 MiB each at least), threads' stacks. Caps in MiB, tried in order.
  std::vector<int64_t> caps;
  for (int64_t mib : {128, 192, 256, 320, 384, 512, 640, 768, 1024}) caps.push_back(mib * 1024);
  const std::string flags = " --device cuda --threads 2 --chunk-size 8MiB";
  const int64_t floor_kib = smallest_cap(caps, "verify " + tiny + " --source " + tiny_src + flags);
  ASSERT_GT(floor_kib, 0) << "verify --device cuda of a tiny model fails under every cap up to "
                             "1 GiB of data segment";
  const int64_t cap_kib = floor_kib + 128 * 1024;
  // One MoE layer of 128 experts: 604 MB of canonical codes decoded, as many of the source's --
  // a whole-layer verify holds both, far over the cap.
  constexpr int64_t kLayerCodes = 128LL * (2 * 768 * 2048 + 2048 * 768);
  ASSERT_LT(cap_kib * 1024, kLayerCodes) << "the cap would not bite: " << cap_kib << " KiB";
  ASSERT_EQ(run_command(moepack_bin() + " synth " + src +
                        " --format gptq --layers 2 --experts 128 --hidden 2048 --inter 768"),
            0);
  ASSERT_EQ(run_command(moepack_bin() + " convert " + src + " " + dst +
                        " --target-arch sm90 --backend marlin"),
            0);
  for (const std::string& with : {" --source " + src, std::string()}) {
    SCOPED_TRACE(with);
    std::string err;
    EXPECT_EQ(run_command("ulimit -d " + std::to_string(cap_kib) + " && exec " + moepack_bin() +
                              " verify " + dst + with + flags,
                          nullptr, &err),
              0)
        << "under " << cap_kib << " KiB (tiny model: " << floor_kib << " KiB)\n"
        << err;
  }
  // The cap is real: the same cap refuses a shell holding the layer's codes' worth of bytes.
  const std::string hold = "bash -c 'x=$(head -c " + std::to_string(kLayerCodes) +
                           " /dev/zero | tr \"\\0\" a); echo ${#x}'";
  EXPECT_NE(run_command("ulimit -d " + std::to_string(cap_kib) + " && " + hold, nullptr, nullptr),
            0);
}

}  // namespace
}  // namespace moepack
