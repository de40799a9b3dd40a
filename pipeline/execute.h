// execute_plan(): writes what a Plan says, deciding nothing of its own.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "pipeline/plan.h"
#include "pipeline/progress.h"

namespace moepack {

struct ConvertResult {
  std::string dst;
  uint64_t bytes_written = 0;
  int64_t tensors = 0;
  double seconds = 0;
  // Busy time per stage. The converting thread: load (read + unpack to canonical or quantise),
  // pack (backend layout), write_wait (waiting for the writer to take a chunk: the writer is the
  // bottleneck). The writers at the same time: copy (checksum + write of copy-through tensors, on
  // a thread of their own), write (checksum + write of converted chunks), writer_idle (waiting for
  // a chunk: the converter is the bottleneck). Then finish (what fsync is left, config, manifest,
  // rename). The threads overlap, so the stages add up to more than `seconds`.
  std::map<std::string, double> stage_seconds;
  // Peak resident memory during the conversion, sampled every 10 ms: anonymous (what the
  // conversion holds; bounded by the chunks in flight) apart from file-backed (mapped source pages,
  // which the kernel can drop).
  uint64_t peak_rss_anon_bytes = 0;
  uint64_t peak_rss_file_bytes = 0;
};

// One chunk [e0, e1) of a planned layer, converted by the layer's direct path (pl.direct) or
// loaded through the source codec (or quantised) and packed into the layout, each parameter
// checked against the plan (kInternal when it differs): everything convert does to those experts
// except writing. `lap(stage)` is called after "load"
// and "pack" when given.
std::vector<Tensor> convert_chunk(const Plan& plan, const Checkpoint& ckpt, const PlannedLayer& pl,
                                  int64_t e0, int64_t e1,
                                  const std::function<void(const char*)>& lap = {});

// The chunk's source tensors as views into the mapped checkpoint, with the layer's refined params
// (PlannedLayer::source_quant) and act-order flags: what the layer's direct path converts.
DirectSource direct_source(const Checkpoint& ckpt, const PlannedLayer& pl, int64_t e0, int64_t e1);

// The chunk's planned parameters through the canonical form only (load_moe_experts with the
// layer's refined params, or the quantise recipe, then the layout's pack), unchecked against the
// plan: what convert_chunk falls back to when a layer has no direct path (formats/fast_path.h) or
// its direct path declines the chunk's bytes. The reference every direct path must equal byte for
// byte.
std::vector<Tensor> convert_chunk_canonical(const Plan& plan, const Checkpoint& ckpt,
                                            const PlannedLayer& pl, int64_t e0, int64_t e1,
                                            const std::function<void(const char*)>& lap = {});

// A parallel plan's chunk (experts [e0, e1) of the layer, canonical): each rank's parameters, the
// layout's pack of the rank's share (TargetLayout::tensor_parallel's split, or its experts for
// expert parallel) with the rank's options, named rank_tensor_key(rank, ranks, name). An
// expert-parallel rank without experts in [e0, e1) has none.
std::vector<Tensor> pack_ranks(const Plan& plan, const PlannedLayer& pl, const MoeExperts& experts,
                               int64_t e0, int64_t e1);

// Runs convert_chunk over every chunk of every planned layer and discards the bytes: refuses
// (throws the same Error) exactly what execute_plan would refuse while reading the source.
// `inspect` validates with it; `progress` gets layers and their source tensor bytes read.
void validate_plan(const Plan& plan, const Checkpoint& ckpt, const ProgressFn& progress = {});

// Reads every MoE layer's experts through the source codec (or as dense floats for unquantized
// checkpoints), chunk by chunk, and discards them: the input checks of convert without a target
// (for when no backend takes the checkpoint on the target inspected).
// Progress as validate_plan's.
void validate_source(const Checkpoint& ckpt, int threads, uint64_t chunk_bytes = 1ull << 30,
                     const ProgressFn& progress = {});

// Writes the planned checkpoint atomically (temp sibling, fsync, rename). Never leaves a
// partial output behind.
ConvertResult execute_plan(const Plan& plan, const Checkpoint& ckpt,
                           const ProgressFn& progress = {});

// The steps execute_plan is made of, shared with the shard-parallel path (pipeline/parts.h).
// Writes the planned tensors with these indices into plan.tensors through `writer`, which must
// hold exactly them; busy time per stage is added to stage_seconds. Four threads overlap:
// a reader reads the mapped source bytes of chunk n+1 once, hashing each source tensor (which
// brings their pages in for the converter), the calling thread converts chunk n
// (convert_chunk, itself multi-threaded), a writer checksums and writes chunk n-1 on
// plan.writers threads (ShardedWriter::write_parts), and a copy thread writes the copy-through
// tensors straight from the mapped source beside them. At most kChunksInFlight converted
// chunks exist at once, so memory is bounded by chunks, not layers. The bytes written and
// their order per tensor are those of the plain one-chunk-after-the-other loop, so the output
// does not depend on the overlap, the thread count or the writer count.
constexpr int kChunksInFlight = 3;  // being converted, queued, being written
// A layer converted by a direct path (formats/fast_path.h) goes through the pipeline in chunks of
// about this many output bytes (the plan's chunks cut smaller, at least --threads experts each):
// the source bytes the reader hashed are still in the last-level cache when the converter reads
// them, and the converted bytes when the writer hashes and writes them, so each byte comes from
// memory once. The plan's chunk (--chunk-size) stays the bound.
constexpr uint64_t kPipelineChunkBytes = uint64_t{8} << 20;
// Experts per pipeline chunk of planned layer `pl` (of `experts` experts): for a direct-path
// layer, enough experts for about `chunk_bytes` of its output, at least plan.threads (the
// direct paths split a chunk by experts between the workers), at most the plan's chunk (the
// memory bound); the plan's chunk for any other layer.
int64_t pipeline_experts_per_chunk(const Plan& plan, const PlannedLayer& pl, int64_t experts,
                                   uint64_t chunk_bytes);
// Returns the SHA-256 of every source tensor those tensors were made from (the source fingerprint
// moepack.json records): the converted layers' tensors as the reader hashed them, the copied ones
// as the writer hashed them while writing their (identical) bytes. No byte is read twice for it.
std::map<std::string, std::string> write_planned_tensors(
    const Plan& plan, const Checkpoint& ckpt, ShardedWriter& writer,
    const std::vector<size_t>& tensors, const ProgressFn& progress,
    std::map<std::string, double>& stage_seconds);
// The source's other files, config.json (the source's with plan.config_patch set and the
// manifest's SHA-256 in quantization_config) and moepack.json (tensor SHA-256s from
// `checksums`, the source's from `source_sha`), into DIR.
void write_config_and_files(const Plan& plan, const Checkpoint& ckpt, const std::string& dir,
                            const std::map<std::string, std::string>& checksums,
                            const std::map<std::string, std::string>& source_sha);

}  // namespace moepack
