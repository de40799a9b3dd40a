// Process-wide allocator policy for streaming conversions, and what the process holds.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>

namespace moepack {

// A conversion allocates and frees a few hundred MB of canonical codes per MoE layer. glibc
// serves such blocks with fresh mmaps and unmaps them on free, so every layer pays the page faults
// again (measured: 12.8 s -> 9.0 s for a 1.65 GiB GPTQ->Marlin conversion on 2 cores with this
// on). Keeping freed memory in the heap lets the next layer reuse it; peak memory stays one layer.
// No-op outside glibc.
void keep_freed_memory_for_reuse();

// Resident memory split the way the kernel counts it (/proc/self/status): anonymous pages (heap,
// stacks: what a conversion really holds) apart from file-backed ones (the mapped source shards,
// page cache the kernel may drop at any time). Zeros where /proc is not there.
struct ResidentMemory {
  uint64_t anon_bytes = 0;  // RssAnon
  uint64_t file_bytes = 0;  // RssFile (+ RssShmem)
};
ResidentMemory resident_memory();

// Samples resident_memory() on a thread of its own every `period_ms` from construction until
// stop() (or destruction) and keeps the peaks. A read of /proc/self/status costs a few
// microseconds; at 10 ms that is far below 0.1 % of one core.
class PeakMemorySampler {
 public:
  explicit PeakMemorySampler(int period_ms = 10);
  ~PeakMemorySampler();
  PeakMemorySampler(const PeakMemorySampler&) = delete;
  PeakMemorySampler& operator=(const PeakMemorySampler&) = delete;
  // Stops sampling (idempotent) and returns the peaks, each taken separately, including one last
  // sample at the stop.
  ResidentMemory stop();

 private:
  void sample();
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_anon_{0}, peak_file_{0};
  std::thread thread_;
};

// Brings the pages of [data, data + len) of a read-only file mapping into the page cache and this
// process's page table ahead of use (madvise WILLNEED, then one read per page), so that the thread
// that later reads them does not stop on page faults or disk reads. Touches nothing else and
// changes no byte; a no-op for len == 0.
void prefetch_mapped(const void* data, size_t len);
// Only the advice (madvise WILLNEED over the pages of the range): for a reader that then reads
// every byte itself (convert's source hashing, pipeline/execute.cpp).
void advise_willneed(const void* data, size_t len);

// The opposite, for a reader that is done with a range: drops the whole pages inside [data,
// data + len) of a read-only MAP_PRIVATE file mapping from this process's page table (madvise
// DONTNEED), so that what a streaming reader has consumed stops counting as its resident memory
// (RssFile). The page cache keeps them; a later read faults them back in with the same bytes.
// Never call it on anything else: on anonymous or written memory DONTNEED discards the contents.
void release_mapped(const void* data, size_t len);

// SHA-256 (lowercase hex) of [data, data + len), for a reader that reads the range once. With
// `release` (the range lies in a read-only MAP_PRIVATE file mapping, as for release_mapped) it is
// hashed a piece at a time and each piece's pages are dropped as soon as they are hashed, so
// hashing a tensor of any size holds about one piece of it resident, not the whole tensor (a
// fused 3-D expert tensor is a whole layer's experts: gpt-oss' gate_up_proj_blocks is 1 GB).
// Without `release` it is sha256_hex.
std::string sha256_hex_read_once(const void* data, size_t len, bool release);

}  // namespace moepack
