// Marlin repack throughput: the scalar path (1 thread), the threaded path, and the CUDA kernel
// (when a device is present), on one MoE layer's w13 of random int4 codes. Every variant's bytes
// are compared with the scalar path's; the table is the last thing printed.
//
//   bench_repack [experts=32] [hidden=2048] [inter=768] [bits=4]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/threads.h"
#include "formats/marlin.h"
#include "formats/quantize.h"
#include "kernels/moepack_cuda.h"

using namespace moepack;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t E = argc > 1 ? std::atoll(argv[1]) : 32;
  const int64_t H = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int64_t I = argc > 3 ? std::atoll(argv[3]) : 768;
  const int bits = argc > 4 ? std::atoi(argv[4]) : 4;
  const int64_t N = 2 * I, K = H;  // w13: [2I, H]
  std::vector<uint8_t> codes(static_cast<size_t>(E * N * K));
  Rng rng(42);
  for (auto& c : codes) c = static_cast<uint8_t>(rng.next_u64() & ((1u << bits) - 1));
  const double mb = static_cast<double>(E * N * K) * bits / 8 / 1e6;  // packed bytes produced
  std::printf("layer w13: E=%lld N=%lld K=%lld int%d, %.1f MB packed\n", (long long)E, (long long)N,
              (long long)K, bits, mb);

  auto run_cpu = [&](int threads, std::vector<uint32_t>* out) {
    const int64_t words = N * K * bits / 32;
    out->assign(static_cast<size_t>(E * words), 0);
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(E, threads, [&](int64_t b, int64_t e) {
      for (int64_t x = b; x < e; ++x) {
        const auto w = marlin_repack(codes.data() + x * N * K, N, K, bits, nullptr, false);
        std::memcpy(out->data() + x * words, w.data(), w.size() * 4);
      }
    });
    return seconds_since(t0);
  };
  std::vector<uint32_t> ref, threaded;
  const double t1 = run_cpu(1, &ref);
  const int hw = resolve_threads(0);
  const double tn = run_cpu(hw, &threaded);
  const bool threaded_ok = threaded == ref;

  double tg = -1;
  bool gpu_ok = false;
  const CudaDeviceInfo dev = cuda_device_info();
  if (dev.available) {
    const int64_t words = N * K * bits / 32;
    std::vector<uint32_t> gpu(static_cast<size_t>(E * words));
    cuda_marlin_repack(codes.data(), N, K, bits, nullptr);  // warm-up: context, module load
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t x = 0; x < E; ++x) {
      const auto w = cuda_marlin_repack(codes.data() + x * N * K, N, K, bits, nullptr);
      std::memcpy(gpu.data() + x * words, w.data(), w.size() * 4);
    }
    tg = seconds_since(t0);
    gpu_ok = gpu == ref;
  }
  std::printf("\n%-28s %10s %12s %8s\n", "variant", "seconds", "MB/s packed", "bytes");
  std::printf("%-28s %10.3f %12.1f %8s\n", "scalar, 1 thread", t1, mb / t1, "ref");
  std::printf("%-28s %10.3f %12.1f %8s\n", ("threaded, " + std::to_string(hw) + " threads").c_str(),
              tn, mb / tn, threaded_ok ? "equal" : "DIFFER");
  if (dev.available)
    std::printf("%-28s %10.3f %12.1f %8s\n", ("cuda " + dev.name).substr(0, 28).c_str(), tg,
                mb / tg, gpu_ok ? "equal" : "DIFFER");
  else
    std::printf("%-28s %10s\n", "cuda", "no device");
  return (threaded_ok && (!dev.available || gpu_ok)) ? 0 : 1;
}
