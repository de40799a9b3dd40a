// One MoE layer spread over the ranks of a tensor- or expert-parallel vLLM 0.33 deployment.
//
//   tensor parallel, tp ranks (RoutedExperts._load_w13 / _load_w2, layers/fused_moe/
//   routed_experts.py: narrow(shard_dim, loaded.shape[shard_dim] // tp * tp_rank, ...)):
//     w13 [E, 2I, H] = [gate; up]   rank r: [gate rows rI'..(r+1)I'; up rows rI'..(r+1)I']
//     w2  [E, H, I]                 rank r: K columns rI'..(r+1)I', scale groups rI'/g..
//                                   (I' = I / tp; a single w2 group -- channelwise -- is loaded
//                                   whole on every rank: _load_per_channel_weight_scale)
//   then each rank post-processes its slice as a layer of intermediate size I' (Marlin pads I'
//   and permutes the scales for I', vLLM's loader with size_k = I').
//
//   expert parallel, ep ranks (determine_expert_map, layers/fused_moe/expert_map_manager.py):
//     linear       rank r: experts [r*(E/ep) + min(r, E%ep), + E/ep + (r < E%ep))
//     round_robin  rank r: experts r, r+ep, r+2ep, ...
//   every expert whole; each rank's parameters are the whole layer's rows of its experts (every
//   layout packs experts independently: the registry suite checks it).
//
// The rows of formats/registry.cpp name their TensorParallelSplit; the canonical one is here.
#pragma once

#include <string>
#include <vector>

#include "formats/codec.h"

namespace moepack {

// The most ranks a parallel output is written for (--tensor-parallel-size, --expert-parallel).
constexpr int kMaxParallelRanks = 1024;

// The canonical tensor-parallel split (TensorParallelSplit::reasons / split for every layout that
// post-processes a narrowed checkpoint slice as a smaller layer): what vLLM 0.33 refuses (I not a
// multiple of tp: FusedMoEConfig asserts it) and what its loader would cut wrong without an error
// (a scale group, a block of block-scaled rows or a packed int32 word of the checkpoint straddling
// two ranks), and act-order (vLLM 0.33 takes none; its w2 g_idx per rank is not modelled).
std::vector<std::string> tp_canonical_reasons(const LayoutOptions& whole, const MoeShape& shape,
                                              int tp);
MoeExperts tp_canonical_split(const MoeExperts& whole, bool gated, int tp, int rank);

// The inverse of tp_canonical_split: the whole layer's experts from every rank's (in rank order).
// A single w2 group (channelwise), which every rank holds whole, is taken from rank 0.
MoeExperts tp_canonical_merge(const std::vector<MoeExperts>& ranks, bool gated);

// One rank's shape and layout options: I / tp for tensor parallel, the rank's expert count for
// expert parallel (LayoutOptions::inter is the rank's real I: the layouts pad and permute for it).
MoeShape rank_shape(const MoeShape& whole, const Parallelism& p, int rank);
LayoutOptions rank_layout_options(const LayoutOptions& whole, const Parallelism& p);

// Whether experts of this source method are written for one rank only, whatever the layout
// (gpt-oss: vLLM 0.33's gpt-oss loader shards them its own way; parallel_reasons says why).
bool written_whole_only(QuantMethod source);

// Every reason `row` cannot be written for this parallelism: the row's tensor-parallel rule (or
// that it has none), experts per rank (a rank without experts), and the row's own
// unsupported_reasons on each distinct rank shape, prefixed with the rank's sizes. Empty for
// whole experts.
std::vector<std::string> parallel_reasons(const TargetLayout& row, const LayoutOptions& whole,
                                          const MoeShape& shape, const Parallelism& p);

// The experts of `parts` one after the other (same spec and n, k each).
QuantTensor concat_experts(const std::vector<QuantTensor>& parts);

// How many experts of `rank`'s tensors come from global experts [e0, e1): all of them without
// expert parallelism or for rank -1 (a tensor every rank reads).
int64_t chunk_experts(const Parallelism& p, int64_t experts, int rank, int64_t e0, int64_t e1);

// Experts `ids` (indices into q's experts, in that order) of q.
QuantTensor select_experts(const QuantTensor& q, const std::vector<int64_t>& ids);

// The directory a rank's tensors live in, inside the output ("rank03-of-08"); the key of one of
// its tensors in moepack.json and in a part ("rank03-of-08/model.layers.1.mlp.experts...").
std::string rank_dir_name(int rank, int ranks);
std::string rank_tensor_key(int rank, int ranks, const std::string& name);
// The rank of a key rank_tensor_key(rank, ranks, ...) made, or -1 for any other name; the name
// without its rank directory (the name itself when it has none).
int rank_of_tensor_key(const std::string& key, int ranks);
std::string rank_tensor_name(const std::string& key);

}  // namespace moepack
