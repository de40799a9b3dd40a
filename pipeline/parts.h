// Shard-parallel conversion: a plan split into n work units that separate processes (array tasks
// of a job engine, on any machines) convert on their own, and `merge`, which assembles the parts
// into exactly the bytes a single convert writes.
//
//   DST.parts/                      parts_dir(DST)
//     0-of-4/                       part_dir_name(0, 4): one unit, written atomically
//       part.safetensors            the unit's output tensors, in plan order
//       part.json                   plan digest, unit, flags, per tensor bytes + SHA-256, and the
//                                   SHA-256 of every source tensor the task read (no path)
//     1-of-4/ ...
//   DST/                            merge: the plan's shards, index, config.json, moepack.json
//
// The split is a pure function of the plan (source + flags) and n: split_plan() never looks at
// the machine, the thread count or the chunk size. A MoE layer is never split (it is converted
// as a whole), copy-through tensors are distributed one by one; units are balanced by bytes.
// docs/scale-out.md describes the recipes and the failure rules.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pipeline/execute.h"
#include "pipeline/plan.h"

namespace moepack {

struct ShardSpec {
  int64_t index = 0, count = 1;  // unit index of count (0 <= index < count)
};
// Parses "i/n" (0 <= i < n, 1 <= n <= kMaxShards). Throws kUsage.
ShardSpec parse_shard_spec(const std::string& text);
constexpr int64_t kMaxShards = 100000;

struct WorkUnit {
  int64_t index = 0;
  uint64_t bytes = 0;                // output tensor bytes the unit writes
  std::vector<size_t> tensors;       // indices into Plan::tensors, ascending (plan order)
  std::vector<size_t> layers;        // indices into Plan::layers, ascending
  std::vector<std::string> modules;  // of those layers
};

// Splits the plan's output into `count` units balanced by bytes: items (a MoE layer with all its
// converted tensors, or one copy-through tensor) in decreasing size, ties in plan order, each
// to the unit with the fewest bytes so far, ties to the lowest index. Units may be empty when
// count exceeds the number of items.
std::vector<WorkUnit> split_plan(const Plan& plan, int64_t count);
nlohmann::json units_json(const Plan& plan, const std::vector<WorkUnit>& units);

// SHA-256 (hex) of everything that decides the output bytes: the manifest the plan would write
// (tool and layout versions, flags, layers, tensors, shards, files), the patched config.json,
// and the source's identity (config, every shard's name, size and tensor table, other files'
// names and sizes, and a digest of the first and last 64 KiB of every shard's data): a cheap
// early check. The rest of the tensor data is not read here; each task hashes the source tensors
// it reads (part.json "source_tensors") and merge checks them all against the source.
std::string plan_digest(const Plan& plan, const Checkpoint& ckpt);

// The convert flags that decide the output bytes, as recorded in part.json and read back by
// merge. Threads, chunk size and --force do not change bytes and are not recorded.
nlohmann::json part_options_json(const ConvertOptions& o);
ConvertOptions part_options_from_json(const nlohmann::json& j, const std::string& file);

// Checks every field of a part.json already parsed as JSON, as merge reads it (kBadConfig naming
// FILE and the field). The fuzz target tests/fuzz/part_json_fuzz.cpp drives it.
void validate_part_json(const nlohmann::json& j, const std::string& file);

std::string parts_dir(const std::string& dst);            // "DST.parts"
std::string part_dir_name(int64_t index, int64_t count);  // "i-of-n"

struct PartResult {
  std::string dir;
  bool skipped = false;  // an identical complete part was already there
  WorkUnit unit;
  ConvertResult convert;
};

// Converts unit spec.index of spec.count into parts_dir(dst)/i-of-n, atomically. An existing
// complete part of the same plan is skipped (re-running a task is idempotent); an existing part
// of another plan, or an unreadable one, is kOutputExists unless plan.options.force.
PartResult execute_part(const Plan& plan, const Checkpoint& ckpt, const ShardSpec& spec,
                        const ProgressFn& progress = {});

struct MergeOptions {
  std::string dst;
  std::string source;  // SRC (required: the parts record no path, only what they read)
  bool force = false;
  bool remove_parts = false;  // delete DST.parts after the output is in place
  int threads = 0;
  ProgressFn progress;  // tensors copied from the parts into the output, and their bytes
};

struct MergeResult {
  std::string dst, source;
  int64_t parts = 0;
  uint64_t bytes_written = 0;
  int64_t tensors = 0, shards = 0;
  double seconds = 0;
};

// Checks that parts_dir(dst) holds every part of one split, each complete and from the plan the
// source and the recorded flags give now, and that the source's tensors hash (SHA-256) to what the
// parts recorded reading (kBadValue naming the source file and tensor otherwise), then writes the
// plan's output atomically (same shards, index, config.json and moepack.json as execute_plan),
// verifying every tensor against the checksum its part recorded. A missing, duplicated, foreign,
// unfinished or corrupted part throws an invalid-input error (exit 3) naming it, before anything is
// published.
MergeResult merge_parts(const MergeOptions& opts);

}  // namespace moepack
