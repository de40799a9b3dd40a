// Writes a set of tensors whose names, dtypes and shapes are known up front as HF shards:
// one model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json
// when the total exceeds the shard size limit. Tensors may be written in any order and from
// any thread; each tensor's SHA-256 is recorded for the manifest.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "io/safetensors.h"

namespace moepack {

struct ShardPlan {
  std::vector<std::string> shard_names;               // in order
  std::vector<std::vector<SafetensorsEntry>> shards;  // tensors of each shard, in order
  std::map<std::string, size_t> shard_of;             // tensor -> index into shard_names
  std::vector<uint64_t> shard_file_bytes;             // exact file sizes (header included)
  uint64_t total_tensor_bytes = 0;
  bool indexed() const { return shard_names.size() > 1; }
  // Whether no shard holds a tensor (an empty group: planned as one empty file, dropped by
  // append_shards).
  bool empty() const { return shard_of.empty(); }
};

// Greedy in the given order: a new shard starts when the next tensor would push the current
// one's tensor bytes past max_shard_bytes (a single larger tensor gets a shard of its own).
// Files are named `stem`.safetensors (one) or `stem`-0000i-of-0000n.safetensors.
ShardPlan plan_shards(const std::vector<SafetensorsEntry>& tensors, uint64_t max_shard_bytes,
                      const std::string& stem = "model");
// Appends `more`'s shards (file names distinct from `into`'s) to `into`: one plan over several
// groups of files (a parallel output's shared tensors and each rank's).
void append_shards(ShardPlan& into, const ShardPlan& more);

// One piece of a tensor for ShardedWriter::write_parts: bytes [offset, offset + len) of `name`.
struct TensorPart {
  std::string name;
  const void* data = nullptr;
  uint64_t len = 0;
  uint64_t offset = 0;
};

// Writes the planned shards. Besides the writes, a background thread (the flusher) starts each
// shard's writeback every kWritebackBytes written (SafetensorsWriter::start_writeback) and fsyncs
// and closes a shard as soon as its last byte is written, so that the disk works while later
// tensors are converted and finish() has little left to wait for. Its errors (kIo) are rethrown
// by the next write or by finish().
class ShardedWriter {
 public:
  static constexpr uint64_t kWritebackBytes = uint64_t{64} << 20;
  ShardedWriter(const std::string& dir, ShardPlan plan);
  ~ShardedWriter();  // stops the flusher; an unfinished output is left for its AtomicOutputDir
  ShardedWriter(const ShardedWriter&) = delete;
  ShardedWriter& operator=(const ShardedWriter&) = delete;
  // Writes the whole tensor `name` (len must equal its planned size). Thread-safe.
  void write(const std::string& name, const void* data, uint64_t len);
  // Writes bytes [offset, offset + len) of tensor `name`. A tensor's parts must arrive in order
  // (offset = what was written of it so far), each from one thread at a time; different tensors
  // may be written concurrently. The checksum is kept running across parts.
  void write_part(const std::string& name, const void* data, uint64_t len, uint64_t offset);
  // write_part for a batch of parts of distinct tensors on up to `writers` threads (0: the CPUs
  // available): each part is checksummed by one thread, the largest first, in pieces of
  // kPieceBytes, each piece pwritten by that thread right after it is hashed (one pass over the
  // bytes, from cache) unless an idle thread took it first: idle threads write the remaining
  // pieces from each part's end. The bytes and checksums are those of write_part called part by
  // part. Errors of any thread are rethrown after all joined (the first part's in the batch).
  static constexpr uint64_t kPieceBytes = uint64_t{1} << 20;
  void write_parts(const std::vector<TensorPart>& parts, int writers);
  // Closes every shard (fsync) and writes the index when sharded. Throws if anything is missing.
  void finish();
  const ShardPlan& plan() const { return plan_; }
  std::map<std::string, std::string> checksums() const;  // tensor -> sha256 hex

 private:
  struct Flusher;
  size_t shard_index(const std::string& name, uint64_t* tensor_bytes) const;
  // Checks that `offset` continues the tensor's running checksum and `len` stays within it.
  std::pair<uint64_t, Sha256>* begin_part(const std::string& name, uint64_t len, uint64_t offset,
                                          uint64_t total);
  void end_part(const std::string& name, std::pair<uint64_t, Sha256>* state, uint64_t len,
                uint64_t total);
  // pwrite of one range of a tensor already checked, then tells the flusher.
  void write_range(size_t shard, const std::string& name, const void* data, uint64_t len,
                   uint64_t offset);
  // Stops and joins the flusher, after the requests made so far when `drain`.
  void stop_flusher(bool drain) noexcept;

  std::string dir_;
  ShardPlan plan_;
  std::vector<std::unique_ptr<SafetensorsWriter>> writers_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> sha_;
  std::map<std::string, std::pair<uint64_t, Sha256>> partial_;  // bytes so far, running hash
  std::unique_ptr<std::mutex[]> shard_write_mu_;                // one pwrite per shard at a time
  std::unique_ptr<Flusher> flusher_;
};

}  // namespace moepack
