// Direct fast paths: a chunk of a layer's experts from the source tensors straight to a target
// layout's parameters, without the canonical one-byte-per-code MoeExperts in between.
//
//   canonical:  source views --copy--> TensorMap --SourceCodec.unpack--> QuantTensor (per Linear)
//               --stack [gate; up]--> MoeExperts --TargetLayout.pack--> std::vector<Tensor>
//   direct:     source views --DirectPath.convert--> std::vector<Tensor>
//
// The byte-identity rule: for every input, a direct path returns exactly the parameters
// (names, order, dtypes, shapes, bytes) that the canonical path returns, or declines (nullopt).
// It declines on anything in the bytes it does not vouch for -- a dtype or shape the codec would
// refuse, a NaN scale, an act-order g_idx the layout refuses, gate and up with different g_idx --
// and the canonical path then converts the chunk and gives the reference result or error. So a
// direct path never decides an error message, and the canonical path stays the reference and the
// test oracle (tests/unit/fast_paths.cpp compares both over the whole legal shape space).
//
// Whether a layer takes a direct path is the plan's decision (pipeline/plan.cpp, from params,
// options and shapes alone: the layout's unsupported_reasons chose the layout, then
// find_direct_path and the row's refusals); `convert --no-fast-path` forces the canonical one.
// A row's convert runs only on layers the plan gave it and does not judge the layout, the
// options or the params again; it declines only on bytes. Plain C++, no I/O: the pipeline hands
// over views into the mapped source.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/codec.h"

namespace moepack {

// The source tensors of a chunk of one layer's experts, by suffix, as the checkpoint holds them.
struct DirectSource {
  QuantParams quant;  // the layer's refined params (the plan's PlannedLayer::source_quant)
  int64_t hidden = 0, inter = 0;  // H, I of the layer
  bool gated = true;
  // linears[e][p]: expert e of the chunk (0-based), p = 0 gate, 1 up, 2 down (model/checkpoint.h
  // Proj order); suffix -> view. The gate map is empty when the layer is not gated.
  std::vector<std::array<std::map<std::string, TensorView>, 3>> linears;
  // The plan's act-order flags (ExpertRange::g_idx_w13 / g_idx_w2): explicit g_idx, trivial ones
  // made explicit, or none at all.
  bool g_idx_w13 = false, g_idx_w2 = false;
  // Fused experts (gpt-oss): the layer's whole [E_layer, ...] tensors by suffix ("blocks",
  // "scales", "bias"), [0] gate_up (rows interleaved as the checkpoint stores them), [1] down; the
  // chunk is experts [first_expert, first_expert + experts()) of them, and `linears` holds that
  // many empty entries. Both maps are empty for per-expert layers.
  std::array<std::map<std::string, TensorView>, 2> fused;
  int64_t first_expert = 0;
  int64_t experts() const { return static_cast<int64_t>(linears.size()); }
};

// One (source method, target layout) pair converted without the canonical form.
struct DirectPath {
  const char* name;    // "gptq->marlin", for plans and messages
  QuantMethod source;  // the checkpoint's method
  const char* layout;  // TargetLayout::name
  // Why this pair does not take a layer with these params, options and shape (one sentence
  // each); empty = it does. Decided without bytes, like TargetLayout::unsupported_reasons.
  std::vector<std::string> (*refusals)(const QuantParams&, const LayoutOptions&, const MoeShape&);
  // The layout's parameters for the chunk, byte-identical to the canonical path's; nullopt when
  // the bytes hold anything the direct path does not vouch for (see above). Called only for a
  // layer the plan gave this row: the layout takes its shape and options, `refusals` is empty.
  std::optional<std::vector<Tensor>> (*convert)(const LayoutOptions&, const DirectSource&);
};

// The explicit table of direct pairs (formats/fast_path.cpp).
const std::vector<DirectPath>& direct_paths();
// The row for this pair, or nullptr. `why_not` (optional) receives the reasons when no row takes
// the layer: no row for the pair, or the row's refusals.
const DirectPath* find_direct_path(QuantMethod source, const std::string& layout,
                                   const QuantParams& q, const LayoutOptions& opts,
                                   const MoeShape& shape,
                                   std::vector<std::string>* why_not = nullptr);

}  // namespace moepack
