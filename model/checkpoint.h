// A Hugging Face checkpoint directory: config, shards (validated on open), the MoE layers and
// their experts found across naming families, and everything else (copied through).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/codec.h"
#include "io/safetensors.h"
#include "model/hf_config.h"
#include "model/routing.h"

namespace moepack {

enum class MoeFamily : uint8_t {
  kMixtral,    // block_sparse_moe.experts.N.{w1,w3,w2}
  kPerExpert,  // mlp.experts.N.{gate_proj,up_proj,down_proj} (Qwen2/3-MoE, DeepSeek-V2/V3)
  kFused3d,    // mlp.experts.gate_up_proj [E, H, 2I] / down_proj [E, I, H] (Qwen3-VL/3.5-MoE,
               // Llama-4), or transformers' in-memory [E, 2I, H] / [E, H, I] (Gemma-4, Mistral-4;
               // Granite's block_sparse_moe.input_linear / output_linear): MoeLayer::fused_out_in
  kGptOss,     // mlp.experts.gate_up_proj{,_blocks,_scales,_bias}, rows interleaved gate/up
};
const char* moe_family_name(MoeFamily f);

enum Proj : int { kGate = 0, kUp = 1, kDown = 2 };

// One MoE layer's routed experts as found in the checkpoint.
struct MoeLayer {
  int64_t layer = -1;        // L of "layers.L."
  std::string module;        // "model.layers.3.mlp"
  std::string param_prefix;  // "model.layers.3.mlp.experts." (vLLM FusedMoE parameters)
  MoeFamily family = MoeFamily::kPerExpert;
  int64_t num_experts = 0;
  int64_t hidden = 0, inter = 0;  // H, I
  bool gated = true;
  // Per-expert tensors: experts[e][proj] maps suffix ("qweight", "weight_scale", ...) to the
  // full tensor name. Empty for fused families.
  std::vector<std::array<std::map<std::string, std::string>, 3>> experts;
  // Fused families: suffix -> full name for gate_up and down ("" suffix for the plain tensor).
  std::map<std::string, std::string> fused_gate_up, fused_down;
  // Fused families: gate_up [E, 2I, H] and down [E, H, I] (out, in: transformers' nn.Parameter
  // orientation) instead of [E, H, 2I] / [E, I, H]; decided from the shapes (size_fused_layer).
  bool fused_out_in = false;
  std::vector<std::string> source_tensors;  // every checkpoint tensor of these experts
};

class Checkpoint {
 public:
  // Opens DIR: config (+ side files), index or model.safetensors (the index and the shards it
  // names must agree exactly), every shard validated, MoE discovery, then the routing the config
  // describes checked against the layers (check_routing). Throws Error naming file/tensor.
  static std::unique_ptr<Checkpoint> open(const std::string& dir);
  // The same over shards already in memory (SafetensorsFile::from_bytes; tests and fuzzing):
  // `config` as parsed, the shards' tensors, then MoE discovery and the routing checks. `dir`
  // labels errors.
  static std::unique_ptr<Checkpoint> from_shards(
      const std::string& dir, HfConfig config,
      std::vector<std::pair<std::string, SafetensorsFile>> shards);

  const std::string& dir() const { return dir_; }
  const HfConfig& config() const { return config_; }
  const QuantParams& quant() const { return config_.quant; }
  bool indexed() const { return indexed_; }
  const std::vector<std::string>& shard_names() const { return shard_names_; }
  const SafetensorsFile& shard(const std::string& name) const;
  // All tensors in a stable order (shard order, then data offset).
  const std::vector<std::string>& tensor_names() const { return tensor_order_; }
  bool has_tensor(const std::string& name) const { return where_.count(name) != 0; }
  const std::string& shard_of(const std::string& tensor) const;  // throws kMissingTensor
  TensorView view(const std::string& tensor) const;              // throws kMissingTensor
  uint64_t total_tensor_bytes() const;

  const std::vector<MoeLayer>& moe_layers() const { return layers_; }
  // The router of the MoE layers as the config describes it (model/routing.h); checked against
  // every layer (expert count, router tensors). Default-constructed without MoE layers.
  const RouterConfig& router() const { return router_; }
  // Non-expert tensors (copied through), in tensor_names() order.
  const std::vector<std::string>& other_tensors() const { return others_; }
  // Non-weight files to carry over (tokenizer, generation_config, ...), relative paths.
  const std::vector<std::string>& other_files() const { return other_files_; }

 private:
  void add_shard(const std::string& name, SafetensorsFile file);  // its tensors, deduplicated
  void discover_moe();
  void check_routing();
  std::string dir_;
  HfConfig config_;
  bool indexed_ = false;
  std::vector<std::string> shard_names_;
  std::map<std::string, SafetensorsFile> shards_;
  std::map<std::string, std::string> where_;  // tensor -> shard
  std::vector<std::string> tensor_order_;
  std::vector<MoeLayer> layers_;
  RouterConfig router_;
  std::vector<std::string> others_;
  std::vector<std::string> other_files_;
};

// Logical (N, K) of one checkpoint Linear from its tensors, per quantization method.
std::pair<int64_t, int64_t> linear_shape(const Checkpoint& ckpt, const QuantParams& q,
                                         const std::map<std::string, std::string>& by_suffix);

// A chunk of a layer's experts [begin, end) (end -1: to the last). g_idx_w13 / g_idx_w2 force
// (1) or forbid (0) explicit g_idx in the result, so that every chunk of a layer has the same
// parameter shapes even when one chunk's act-order g_idx happen to be trivial; -1 decides from
// the loaded experts.
struct ExpertRange {
  int64_t begin = 0, end = -1;
  int g_idx_w13 = -1, g_idx_w2 = -1;
};

// The source codec's params for the experts of `layer`: ckpt.quant(), corrected by the codec
// row's `refine` on the tensors of expert 0's first Linear (gate, or up when not gated); GPTQ
// reads its qzeros for the v1/v2 zero convention. The one place refine runs: make_plan records
// the result per layer (PlannedLayer::source_quant) and execution takes it from there.
QuantParams refined_source_params(const Checkpoint& ckpt, const MoeLayer& layer);

// Fused 3-D (or gpt-oss) experts stored in float although the config declares `declared`
// (a producer that left them as they were: auto-round 0.15.1 on Llama4ForCausalLM): throws
// kUnsupported naming the tensor, its dtype and the method. Returns otherwise.
void refuse_float_fused_experts(const Checkpoint& ckpt, const MoeLayer& layer,
                                QuantMethod declared);

// One layer's experts (or a chunk of them) in canonical form (w13 = [gate; up] on N, w2),
// unpacked through the source codec with params `q` (refined_source_params: the plan's
// PlannedLayer::source_quant), `threads` workers over experts. Refuses gate/up with different
// act-order g_idx.
MoeExperts load_moe_experts(const Checkpoint& ckpt, const MoeLayer& layer, const QuantParams& q,
                            int threads, const ExpertRange& range = {});
// The same with refined_source_params(ckpt, layer), for readers without a plan (verify,
// inspect's validate_source, tests).
MoeExperts load_moe_experts(const Checkpoint& ckpt, const MoeLayer& layer, int threads,
                            const ExpertRange& range = {});

// The expert biases of a fused layer (gpt-oss: gate_up_proj_bias [E, 2I] with gate/up
// interleaved, down_proj_bias [E, H]) as float, w13's in the canonical [gate; up] order; both
// empty for a layer without biases. Per-expert layers never have any here: their readers refuse
// a bias tensor (load_moe_experts, load_dense_experts).
struct ExpertBiases {
  std::vector<float> w13;  // [E, 2I] ([gate; up]) or [E, I]
  std::vector<float> w2;   // [E, H]
  bool empty() const { return w13.empty() && w2.empty(); }
};
ExpertBiases load_expert_biases(const Checkpoint& ckpt, const MoeLayer& layer,
                                const ExpertRange& range = {});

// Unquantized experts as float [E, N, K] for w13 ([gate; up]) and w2 (bf16/fp16/fp32 sources,
// all families incl. fused 3-D and gpt-oss interleaved).
struct DenseExperts {
  int64_t experts = 0, hidden = 0, inter = 0;
  bool gated = true;
  std::vector<float> w13;  // [E, 2I or I, H]
  std::vector<float> w2;   // [E, H, I]
};
DenseExperts load_dense_experts(const Checkpoint& ckpt, const MoeLayer& layer,
                                const ExpertRange& range = {});

}  // namespace moepack
