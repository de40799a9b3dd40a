// Micro-benchmark (not a test): the Marlin row's unpack per thread, the word-at-a-time decode
// (unpack_marlin_moe) against the scalar definition (unpack_marlin_moe_scalar), and the canonical
// codes' nibble pack (pack_code_nibbles against pack_code_nibbles_scalar). One chunk of a
// Qwen3-30B-A3B-shaped layer (H=2048, I=768, gated) as verify decodes it; prints GB/s of
// canonical codes produced (E * N * K bytes) per second of one thread. Run by
// bench/unpack_bench.sh; results in bench/RESULTS.md.
//
//   moepack_unpack_bench [EXPERTS] [REPEATS]   (defaults 4 and 8)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>

#include "formats/marlin.h"
#include "formats/moe_reader.h"

namespace moepack {
namespace {

struct Variant {
  const char* name;
  QuantMethod method;
  int bits;
  int64_t gs;
  bool act_order;
};

QuantTensor random_proj(std::mt19937_64& rng, const Variant& v, int64_t E, int64_t n, int64_t k) {
  QuantTensor q;
  q.experts = E;
  q.n = n;
  q.k = k;
  q.bits = v.bits;
  q.group_size = v.gs;
  q.symmetric = v.method != QuantMethod::kAwq;
  q.scale_dtype = DType::kBF16;
  const int64_t G = q.groups();
  q.codes.resize(static_cast<size_t>(E * n * k));
  for (auto& c : q.codes) c = static_cast<uint8_t>(rng() & ((1u << v.bits) - 1u));
  q.scales.resize(static_cast<size_t>(E * n * G * 2));
  for (size_t i = 0; i < q.scales.size(); i += 2) {
    const uint16_t h = 0x3c00 + static_cast<uint16_t>(rng() % 0x100);
    std::memcpy(q.scales.data() + i, &h, 2);
  }
  if (!q.symmetric) {
    q.zeros.resize(static_cast<size_t>(E * n * G));
    for (auto& z : q.zeros) z = static_cast<uint8_t>(rng() & 15u);
  }
  if (v.act_order)
    for (int64_t e = 0; e < E; ++e) {
      std::vector<int32_t> g(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) g[static_cast<size_t>(i)] = static_cast<int32_t>(i / v.gs);
      std::shuffle(g.begin(), g.end(), rng);
      q.g_idx.insert(q.g_idx.end(), g.begin(), g.end());
    }
  return q;
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best of `repeats` runs of fn, in CPU seconds of this thread (the 2-core machine is shared:
// wall time would count the other processes' share).
double best_seconds(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = thread_cpu_seconds();
    fn();
    best = std::min(best, thread_cpu_seconds() - t0);
  }
  return best;
}

}  // namespace
}  // namespace moepack

int main(int argc, char** argv) {
  using namespace moepack;
  const int64_t E = argc > 1 ? std::atoll(argv[1]) : 4;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 8;
  const int64_t H = 2048, I = 768;
  const Variant variants[] = {
      {"gptq int4 g128", QuantMethod::kGptq, 4, 128, false},
      {"gptq int4 g128 act-order", QuantMethod::kGptq, 4, 128, true},
      {"gptq int8 g128", QuantMethod::kGptq, 8, 128, false},
      {"awq int4 g128 zero points", QuantMethod::kAwq, 4, 128, false},
      {"ct w4a16 channelwise", QuantMethod::kCtPackQuantized, 4, -1, false},
  };
  std::mt19937_64 rng(27);
  std::printf(
      "unpack of %lld experts (H=%lld, I=%lld, gated), 1 thread, best of %d, thread CPU time\n",
      static_cast<long long>(E), static_cast<long long>(H), static_cast<long long>(I), repeats);
  std::printf("%-28s %12s %12s %9s\n", "variant", "scalar GB/s", "fast GB/s", "speed-up");
  for (const Variant& v : variants) {
    MoeExperts x;
    x.w13 = random_proj(rng, v, E, 2 * I, H);
    x.w2 = random_proj(rng, v, E, H, I);
    LayoutOptions o;
    o.source_method = v.method;
    o.act_dtype = DType::kBF16;
    o.threads = 1;
    o.vllm_target = VllmTarget::kV2026_05;
    TensorMap m;
    for (auto& t : pack_marlin_moe(o, x)) m[t.name] = std::move(t);
    const double codes = static_cast<double>(x.w13.codes.size() + x.w2.codes.size());
    const double scalar = best_seconds(repeats, [&] { unpack_marlin_moe_scalar(o, m); });
    const double fast = best_seconds(repeats, [&] { unpack_marlin_moe(o, m); });
    std::printf("%-28s %12.2f %12.2f %8.1fx\n", v.name, codes / scalar / 1e9, codes / fast / 1e9,
                scalar / fast);
  }
  // The canonical codes of the same chunk packed two per byte (MoeRuntime::upload_nibbles).
  std::vector<uint8_t> codes(static_cast<size_t>(E * 3 * I * H));
  for (auto& c : codes) c = static_cast<uint8_t>(rng() & 15u);
  std::vector<uint8_t> out(codes.size() / 2 + 1);
  const double scalar = best_seconds(
      repeats, [&] { pack_code_nibbles_scalar(codes.data(), codes.size(), false, out.data()); });
  const double fast = best_seconds(
      repeats, [&] { pack_code_nibbles(codes.data(), codes.size(), false, out.data()); });
  const double n = static_cast<double>(codes.size());
  std::printf("%-28s %12.2f %12.2f %8.1fx\n", "pack_code_nibbles", n / scalar / 1e9, n / fast / 1e9,
              scalar / fast);
  return 0;
}
