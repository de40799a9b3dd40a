// execute_plan(): writes what a Plan says, deciding nothing of its own.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "pipeline/plan.h"

namespace moepack {

using ProgressFn = std::function<void(const std::string& stage, int64_t done, int64_t total)>;

struct ConvertResult {
  std::string dst;
  uint64_t bytes_written = 0;
  int64_t tensors = 0;
  double seconds = 0;
  // Wall time per stage: copy (copy-through tensors), load (read + unpack to canonical or
  // quantise), pack (backend layout), write (checksum + write of converted tensors), finish
  // (fsync, config, manifest, rename).
  std::map<std::string, double> stage_seconds;
};

// One chunk [e0, e1) of a planned layer, loaded through the source codec (or quantised) and
// packed into the layout, each parameter checked against the plan (kInternal when it differs):
// everything convert does to those experts except writing. `lap(stage)` is called after "load"
// and "pack" when given.
std::vector<Tensor> convert_chunk(const Plan& plan, const Checkpoint& ckpt, const PlannedLayer& pl,
                                  int64_t e0, int64_t e1,
                                  const std::function<void(const char*)>& lap = {});

// Runs convert_chunk over every chunk of every planned layer and discards the bytes: refuses
// (throws the same Error) exactly what execute_plan would refuse while reading the source.
// `inspect` validates with it.
void validate_plan(const Plan& plan, const Checkpoint& ckpt);

// Reads every MoE layer's experts through the source codec (or as dense floats for unquantized
// checkpoints), chunk by chunk, and discards them: the input checks of convert without a target
// (for when no backend takes the checkpoint on the target inspected).
void validate_source(const Checkpoint& ckpt, int threads, uint64_t chunk_bytes = 1ull << 30);

// Writes the planned checkpoint atomically (temp sibling, fsync, rename). Never leaves a
// partial output behind.
ConvertResult execute_plan(const Plan& plan, const Checkpoint& ckpt,
                           const ProgressFn& progress = {});

// The steps execute_plan is made of, shared with the shard-parallel path (pipeline/parts.h).
// Writes the planned tensors with these indices into plan.tensors (copy-through ones from the
// mapped source, converted ones by whole MoE layers, chunk by chunk) through `writer`, which
// must hold exactly them; wall time per stage is added to stage_seconds.
void write_planned_tensors(const Plan& plan, const Checkpoint& ckpt, ShardedWriter& writer,
                           const std::vector<size_t>& tensors, const ProgressFn& progress,
                           std::map<std::string, double>& stage_seconds);
// The source's other files, config.json (the source's with plan.config_patch set and the
// manifest's SHA-256 in quantization_config) and moepack.json (tensor SHA-256s from
// `checksums`), into DIR.
void write_config_and_files(const Plan& plan, const Checkpoint& ckpt, const std::string& dir,
                            const std::map<std::string, std::string>& checksums);

}  // namespace moepack
