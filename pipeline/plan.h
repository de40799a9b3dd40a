// Plans apart from doing (STYLE.md §11): make_plan() decides everything a conversion will write
// -- per output tensor its sources, codec pair, dtype, shape, bytes and shard; the copy-through
// set; the shard layout; per layer the backend, the source codec's refined params, the chunk size
// and the conversion path (direct or canonical) -- so that execution only follows it.
// `convert --dry-run` prints it; execute_plan() writes exactly it.
// Tensor bytes read while planning: act-order g_idx (whether a layer is act-order), the tensors
// of one Linear per layer that the codec's `refine` reads (GPTQ: expert 0's first qzeros, for the
// v1/v2 zero convention), and for a layout with a decide_layer hook the experts it asks for
// (Humming: until both projections show a code 0, usually expert 0 alone). Nothing else.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/fast_path.h"
#include "io/shard_writer.h"
#include "model/checkpoint.h"
#include "model/hf_hub.h"
#include "pipeline/oracle.h"

namespace moepack {

// The activation dtypes a converted checkpoint is served in (--act-dtype bf16|fp16; Marlin
// stores its scales in it). make_plan, the manifest and part.json readers hold to it.
inline bool is_act_dtype(DType d) {
  return d == DType::kBF16 || d == DType::kF16;
}

// A field that changes the output bytes must also be recorded for `merge` in part_options_json /
// part_options_from_json (pipeline/parts.cpp): merge re-plans from the recorded flags, and a
// forgotten one makes every part look foreign (exit 3), never a silently different output.
struct ConvertOptions {
  std::string src, dst;
  std::string backend = "auto";
  // --target-arch and --vllm-target, parsed where the flags are read (tools/: parse_target_arch,
  // parse_vllm_target); their names are written only where they are serialised (moepack.json,
  // config.json's moepack block, part.json) and read back by target_arch_from_name /
  // vllm_target_from_name.
  TargetArch target_arch = TargetArch::kSm90;
  DType act_dtype = DType::kBF16;
  std::string quantize;                  // "" or "mxfp8" (bf16/fp16 experts -> MXFP8)
  std::string mx_recipe = "flashinfer";  // or "modelopt"
  bool vllm_w13_scale_size_k = false;    // reproduce vLLM's loader instead of the kernel layout
  // The vLLM the output is for (--vllm-target): names, shapes, act-order and padding follow it.
  VllmTarget vllm_target = newest_vllm_target();
  uint64_t max_shard_bytes = 5000000000ull;
  int threads = 0;
  // --writers: threads that checksum and write the output at once (0: as many as --threads).
  // Output bytes do not depend on it.
  int writers = 0;
  bool force = false;
  // Canonical-form bytes of experts converted at once within a layer (one code per byte, or a
  // float per weight with --quantize): bounds memory for layers larger than RAM allows.
  uint64_t chunk_bytes = 1ull << 30;
  // --no-fast-path: every layer through the canonical form (load_moe_experts + pack), never a
  // direct path (formats/fast_path.h). Output bytes are the same either way, so it is not a
  // part option.
  bool no_fast_path = false;
  // --include / --exclude: which of the source's non-weight files are carried (model/hf_hub.h;
  // by default every one but other weight formats). Recorded in moepack.json and part.json.
  FileRule files;
  // --tensor-parallel-size / --expert-parallel (formats/parallel.h): every MoE layer written as
  // the parameters each rank of that vLLM 0.33 deployment holds after post-processing, each
  // rank's into its own shard files (model-rankRR-of-NN*.safetensors). Whole experts by default;
  // such an output is byte for byte what it was before parallel outputs existed.
  Parallelism parallel;
};

struct PlannedTensor {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t bytes = 0;
  bool converted = false;            // false: copied through byte-identically
  int64_t layer = -1;                // index into Checkpoint::moe_layers() when converted
  std::string codec;                 // "gptq->marlin", "copy"
  std::vector<std::string> sources;  // source tensor names (brace patterns for expert sets)
  // A parallel output's per-rank parameter: the rank holding it (-1: every rank reads it, or the
  // output is not parallel). Its name is rank_tensor_key(rank, ranks, the layout's name).
  int rank = -1;
};

struct PlannedLayer {
  int64_t index = -1;  // into Checkpoint::moe_layers()
  std::string module, param_prefix;
  // The source codec's params for this layer's experts: the checkpoint's, refined by the codec
  // row's `refine` on expert 0's first Linear (refined_source_params, model/checkpoint.h: GPTQ's
  // v1/v2 zero convention from its stored qzeros). Execution takes them as they are, on both
  // paths: the direct path's DirectSource::quant and load_moe_experts. With --quantize, the
  // checkpoint's (unquantized) params.
  QuantParams source_quant;
  OracleDecision decision;
  std::vector<std::string> deviations;
  // Act-order is the layer's: the config declares it (with a real group size) or an expert
  // carries a non-trivial g_idx; then both projections carry g_idx (trivial ones made explicit).
  bool act_order_w13 = false, act_order_w2 = false;
  MoeShape shape;            // what the layout was judged and sized on
  int64_t inter_padded = 0;  // the I the parameters carry (> shape.inter() where the target pads)
  LayoutOptions layout_options;  // exactly what pack takes for this layer (with the layout's
                                 // decisions over the whole layer: layer_decisions)
  // A parallel output of a layout with decisions (TargetLayout::decide_layer): each rank's,
  // made over the rank's share of the layer as vLLM 0.33 post-processes each rank's slice alone
  // (layout_options.layer_decisions stays empty: no rank holds the whole layer). Empty otherwise.
  std::vector<std::map<std::string, std::string>> rank_decisions;
  int64_t experts_per_chunk = 0;  // experts converted at once (--chunk-size, kMinChunksPerLayer)
  int64_t chunks = 0;
  // The direct fast path that converts this layer's chunks (byte-identical to the canonical
  // path, which takes any chunk whose bytes it declines), or null: the canonical path, for
  // `canonical_why`. In --dry-run / inspect output only, never in moepack.json.
  const DirectPath* direct = nullptr;
  std::string canonical_why;
};

struct Plan {
  ConvertOptions options;
  std::string source_format;  // quant_method_name of the source
  std::string backend;        // chosen for every MoE layer
  std::string layout_name;
  int layout_version = 0;
  const TargetLayout* layout = nullptr;             // the registry row of `backend`
  const SourceCodec* source_codec = nullptr;        // null when the experts are quantised here
  const QuantizeRecipe* quantize_recipe = nullptr;  // --quantize: experts read as floats, quantised
                                                    // by this row  // the registry row doing it
  int threads = 1;  // resolved worker count; output bytes never depend on it
  int writers = 1;  // resolved writer count (checksum + write); output bytes never depend on it
  // Top-level keys config.json gets over the source's (quantization_config for --quantize, the
  // moepack block).
  nlohmann::json config_patch;
  TargetArch arch = TargetArch::kSm90;
  VllmTarget vllm_target = VllmTarget::kV0_33;
  // The checkpoint's params as its config gives them (moepack.json records these; each layer's
  // refined ones are PlannedLayer::source_quant), and the params of what the layout packs.
  QuantParams source_quant, target_quant;
  std::vector<PlannedLayer> layers;
  std::vector<PlannedTensor> tensors;  // output order
  ShardPlan shards;
  std::vector<std::string> copied_files;    // the source's non-weight files carried
  std::vector<LeftOutFile> left_out_files;  // and those options.files leaves out
  std::vector<std::string> deviations;      // union over layers, deduplicated
  uint64_t total_bytes() const { return shards.total_tensor_bytes; }
  nlohmann::json to_json() const;
  std::string to_text() const;
};

// The chunk rule: the experts of one layer converted at once. As many as `chunk_bytes`
// (--chunk-size) holds at `bytes_per_expert` (canonical_expert_bytes), at least 1, and at most
// ceil(experts / kMinChunksPerLayer), so that the overlapped convert pipeline
// (pipeline/execute.h) holds a bounded fraction of a layer, not several layers: it holds up to
// kChunksInFlight converted chunks plus one chunk's canonical form, which then stays within about
// 1.25 packed layers (int4: canonical = 2 x packed) instead of 4. One rule for convert
// (PlannedLayer::experts_per_chunk), inspect's validate_source and verify, so that verify holds
// what convert holds.
constexpr int64_t kMinChunksPerLayer = 4;
int64_t experts_per_chunk(uint64_t chunk_bytes, int64_t experts, uint64_t bytes_per_expert);
// Canonical bytes of one expert: one byte per code of w13 (`w13_rows` = 2I gated, I not) and w2,
// or a float per weight where the experts are read as floats (--quantize; unquantized sources).
uint64_t canonical_expert_bytes(int64_t w13_rows, int64_t hidden, int64_t inter, bool floats);

// Throws kUnsupported listing every reason when a layer cannot be converted.
Plan make_plan(const Checkpoint& ckpt, const ConvertOptions& opts);

// Experts [e0, e1) of a planned layer in canonical form, as the layout's pack receives them on the
// canonical path: the source codec's unpack with the layer's refined params (the act-order g_idx
// as planned), or with --quantize the recipe over the dense experts. What convert_chunk packs and
// what a layout's decide_layer reads at plan time.
MoeExperts load_planned_experts(const Plan& plan, const Checkpoint& ckpt, const PlannedLayer& pl,
                                int64_t e0, int64_t e1);

// The options rank `rank` of a parallel output packs layer `pl` with: the layer's, with the
// rank's intermediate size (rank_layout_options) and its own decisions (rank_decisions). The
// layer's own options for whole experts.
LayoutOptions planned_rank_options(const PlannedLayer& pl, const Parallelism& par, int rank);

// Rank `rank`'s share of experts [e0, e1) of a whole layer's `experts` (global ids): its
// tensor-parallel split by the layout's rule, or under expert parallelism the rank's experts
// among them in its local order (0 experts, no bytes, when it holds none of them).
MoeExperts rank_share_of(const TargetLayout& row, const Parallelism& par, bool gated,
                         int64_t layer_experts, const MoeExperts& experts, int rank, int64_t e0,
                         int64_t e1);

}  // namespace moepack
