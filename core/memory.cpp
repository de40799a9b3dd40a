#include "core/memory.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>  // defines __GLIBC__ (via features.h) for the check below
#include <cstring>

#include "core/sha256.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace moepack {

void keep_freed_memory_for_reuse() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);         // large blocks from the heap, not per-block mmaps
  mallopt(M_TRIM_THRESHOLD, -1);  // never trim: freed heap is reused by the next layer (size_t max)
  // Grow the heap in large steps, but never in steps a data-size limit (ulimit -d / -v) makes
  // the first growth fail: a 64 MiB step under `ulimit -d 60M` refused every allocation.
  size_t pad = size_t{64} << 20;
  for (int resource : {RLIMIT_DATA, RLIMIT_AS}) {
    struct rlimit lim {};
    if (getrlimit(resource, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
      pad = std::min<size_t>(pad, static_cast<size_t>(lim.rlim_cur / 16));
  }
  mallopt(M_TOP_PAD, static_cast<int>(pad));
#endif
}

ResidentMemory resident_memory() {
  ResidentMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return m;
  char line[256];
  while (std::fgets(line, sizeof(line), f)) {
    unsigned long long kib = 0;
    if (std::sscanf(line, "RssAnon: %llu kB", &kib) == 1)
      m.anon_bytes = kib * 1024;
    else if (std::sscanf(line, "RssFile: %llu kB", &kib) == 1 ||
             std::sscanf(line, "RssShmem: %llu kB", &kib) == 1)
      m.file_bytes += kib * 1024;
  }
  std::fclose(f);
  return m;
}

PeakMemorySampler::PeakMemorySampler(int period_ms) {
  sample();
  thread_ = std::thread([this, period_ms] {
    while (!stop_.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
      sample();
    }
  });
}

PeakMemorySampler::~PeakMemorySampler() {
  stop();
}

void PeakMemorySampler::sample() {
  const ResidentMemory m = resident_memory();
  uint64_t a = peak_anon_.load(), f = peak_file_.load();
  while (m.anon_bytes > a && !peak_anon_.compare_exchange_weak(a, m.anon_bytes)) {
  }
  while (m.file_bytes > f && !peak_file_.compare_exchange_weak(f, m.file_bytes)) {
  }
}

ResidentMemory PeakMemorySampler::stop() {
  if (!stop_.exchange(true) && thread_.joinable()) thread_.join();
  sample();
  ResidentMemory m;
  m.anon_bytes = peak_anon_.load();
  m.file_bytes = peak_file_.load();
  return m;
}

void advise_willneed(const void* data, size_t len) {
  if (len == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + len;
  // Advice only: a failure (e.g. memory not from mmap in tests) changes nothing.
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);
}

void release_mapped(const void* data, size_t len) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  // Whole pages only: a page shared with bytes outside the range stays.
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + len) & ~(page - 1);
  if (len == 0 || end <= begin) return;
  // Advice only: a failure leaves the pages resident and changes no byte.
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

std::string sha256_hex_read_once(const void* data, size_t len, bool release) {
  if (!release) return sha256_hex(data, len);
  constexpr size_t kPiece = size_t{4} << 20;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto* bytes = static_cast<const uint8_t*>(data);
  Sha256 sha;
  // Each release starts at `kept`: the page a piece ends inside is dropped with the next piece.
  size_t kept = 0;
  for (size_t off = 0; off < len;) {
    const size_t n = std::min(kPiece, len - off);
    sha.update(bytes + off, n);
    off += n;
    release_mapped(bytes + kept, off - kept);
    const uintptr_t start = reinterpret_cast<uintptr_t>(bytes);
    const uintptr_t page_of_end = (start + off) & ~(page - 1);
    if (page_of_end > start + kept) kept = static_cast<size_t>(page_of_end - start);
  }
  return sha.hex_digest();
}

void prefetch_mapped(const void* data, size_t len) {
  if (len == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + len;
  advise_willneed(data, len);
  volatile unsigned char sink = 0;
  for (uintptr_t p = std::max(begin, reinterpret_cast<uintptr_t>(data)); p < end;
       p = (p & ~(page - 1)) + page)
    sink = static_cast<unsigned char>(sink + *reinterpret_cast<const volatile unsigned char*>(p));
  (void)sink;
}

}  // namespace moepack
