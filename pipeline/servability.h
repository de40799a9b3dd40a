// Whether the moepack-vllm plugin (integrations/vllm/) serves an output, and if not why: derived
// from the layout rows' vllm_serving entries (formats/codec.h, the same data build_manifest
// exports into moepack.json's "serving" and the plugin reads), never from a table of its own.
//
// What a row says is completed with what every output is written for: the vLLM line of its
// --vllm-target (the plugin serves only the targets some row serves), the layout kernel's GPU
// archs, and the parallelism the experts were written for (convert --tensor-parallel-size /
// --expert-parallel; whole experts, TP 1 and no EP, by default: config.json's
// quantization_config.tensor_parallel_size and expert_parallel_size, which the plugin checks).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/codec.h"

namespace moepack {

struct Manifest;

struct Servability {
  bool servable = false;
  std::string backend;  // the layout (--backend name)
  VllmTarget vllm_target = VllmTarget::kV0_33;
  ServingPath path = ServingPath::kNone;
  std::string how;                 // servable: "vLLM's Fp8MoEMethod (...)" / "kernel builder ..."
  std::vector<TargetArch> archs;   // the GPUs the layout's kernel runs on
  std::string reason;              // not servable: why, one sentence
  Parallelism parallel;            // the deployment the output is written for (mark_parallel)
  nlohmann::json to_json() const;  // {"servable", "plugin", "vllm", "backend", ...}
  // One line: "servable by moepack-vllm in vLLM 0.33 (kernel builder wna16-marlin), TP 1, no EP,
  // sm80/sm89/sm90/sm100" or "NOT servable by moepack-vllm: <reason>".
  std::string to_text() const;
};

// The vLLM targets some layout row serves (the plugin's vLLM lines), in vllm_target_rows() order.
std::vector<VllmTarget> served_vllm_targets();

// An output of `layout` for `target` whose experts are `experts` (the plan's target_quant method).
Servability servability(const TargetLayout& layout, VllmTarget target, QuantMethod experts);
// A converted checkpoint, from its moepack.json ("serving" as the conversion recorded it).
Servability servability(const Manifest& m);
// The parallelism an output is written for (formats/parallel.h), recorded in `s`: moepack-vllm
// serves it at that degree only, each rank reading its own expert files.
void mark_parallel(const Parallelism& p, Servability& s);

// The README's served matrix (markdown, a header row and one row per source format x layout it
// can be written in), every vLLM target a column: tests/unit/servability.cpp checks the README
// holds exactly this between its "served-matrix" markers.
std::string served_matrix_markdown();

}  // namespace moepack
