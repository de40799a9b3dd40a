// Plans apart from doing (STYLE.md §11): make_plan() decides everything a conversion will write
// -- per output tensor its sources, codec pair, dtype, shape, bytes and shard; the copy-through
// set; the shard layout -- without touching tensor bytes. `convert --dry-run` prints it;
// execute_plan() writes exactly it.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/fast_path.h"
#include "io/shard_writer.h"
#include "model/checkpoint.h"
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
  std::string target_arch = "sm90";
  DType act_dtype = DType::kBF16;
  std::string quantize;                  // "" or "mxfp8" (bf16/fp16 experts -> MXFP8)
  std::string mx_recipe = "flashinfer";  // or "modelopt"
  bool vllm_w13_scale_size_k = false;    // reproduce vLLM's loader instead of the kernel layout
  // The vLLM the output is for (--vllm-target): names, shapes, act-order and padding follow it.
  std::string vllm_target = vllm_target_name(newest_vllm_target());
  uint64_t max_shard_bytes = 5000000000ull;
  int threads = 0;
  bool force = false;
  // Canonical-form bytes of experts converted at once within a layer (one code per byte, or a
  // float per weight with --quantize): bounds memory for layers larger than RAM allows.
  uint64_t chunk_bytes = 1ull << 30;
  // --no-fast-path: every layer through the canonical form (load_moe_experts + pack), never a
  // direct path (formats/fast_path.h). Output bytes are the same either way, so it is not a
  // part option.
  bool no_fast_path = false;
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
};

struct PlannedLayer {
  int64_t index = -1;  // into Checkpoint::moe_layers()
  std::string module, param_prefix;
  OracleDecision decision;
  std::vector<std::string> deviations;
  // Act-order is the layer's: the config declares it (with a real group size) or an expert
  // carries a non-trivial g_idx; then both projections carry g_idx (trivial ones made explicit).
  bool act_order_w13 = false, act_order_w2 = false;
  MoeShape shape;            // what the layout was judged and sized on
  int64_t inter_padded = 0;  // the I the parameters carry (> shape.inter() where the target pads)
  LayoutOptions layout_options;   // exactly what pack takes for this layer
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
  // Top-level keys config.json gets over the source's (quantization_config for --quantize, the
  // moepack block).
  nlohmann::json config_patch;
  TargetArch arch = TargetArch::kSm90;
  VllmTarget vllm_target = VllmTarget::kV0_33;
  QuantParams source_quant, target_quant;
  std::vector<PlannedLayer> layers;
  std::vector<PlannedTensor> tensors;  // output order
  ShardPlan shards;
  std::vector<std::string> copied_files;
  std::vector<std::string> deviations;  // union over layers, deduplicated
  uint64_t total_bytes() const { return shards.total_tensor_bytes; }
  nlohmann::json to_json() const;
  std::string to_text() const;
};

// Experts of one layer handled at once within a budget of `chunk_bytes` canonical bytes (at
// least 1, at most `experts`). convert (PlannedLayer::experts_per_chunk) and verify share it, so
// verify holds what convert holds.
int64_t experts_per_chunk(uint64_t chunk_bytes, int64_t experts, uint64_t bytes_per_expert);
// make_plan splits every layer of more than one expert into at least this many chunks (fewer
// experts each than --chunk-size allows where needed), so that the overlapped convert pipeline
// (pipeline/execute.h) holds a bounded fraction of a layer, not several layers.
constexpr int64_t kMinChunksPerLayer = 4;

// Throws kUnsupported listing every reason when a layer cannot be converted.
Plan make_plan(const Checkpoint& ckpt, const ConvertOptions& opts);

}  // namespace moepack
