// The result of `moepack verify DST --source SRC` and its three renderings.
//
//   VerifyReport
//   ├─ integrity[]   (checksums, manifest, tensor set)         name, passed, detail
//   ├─ round_trip[]  (backend layout -> canonical == source)   name, passed, compared, mismatches,
//   │                                                          first mismatch (layer, expert,
//   │                                                          tensor, index, got, want)
//   └─ layers[]      (numerical MoE check per layer)           max_abs_err, norm_err <= tolerance,
//                                                              per-expert max error + token counts
//
// render_text: a terminal summary. to_json: stable keys (documented in docs/verify.md; non-finite
// numbers become null). render_html: one self-contained page (inline CSS and SVG, no scripts, no
// external resources), every string HTML-escaped.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "verify/moe_reference.h"

namespace moepack {

// Default normalised-error tolerance: the reference and the backend dequantise identical codes
// and scales, so only float-vs-double accumulation differs (~1e-6); a layout bug gives O(1).
constexpr double kDefaultVerifyTolerance = 1e-3;
constexpr int64_t kDefaultVerifyTokens = 64;
constexpr uint64_t kDefaultVerifySeed = 0;

struct IntegrityCheck {
  std::string name;  // "sha256 model-00001-of-00002.safetensors", "manifest", ...
  bool passed = false;
  std::string detail;  // what was found when it failed (or a short note)
};

// Where a decoded tensor first differs from the source.
struct RoundTripMismatch {
  int64_t layer = -1;     // -1 when not per layer
  int64_t expert = -1;    // -1 when not per expert
  std::string tensor;     // "w13 codes", "model.layers.3.mlp.experts.w2_scales", ...
  int64_t index = -1;     // flat element index within `tensor` (within the expert when expert >= 0)
  std::string got, want;  // values as text ("0x3c", "1.5")

  // Byte values as "0x3c".
  static RoundTripMismatch bytes(int64_t layer, int64_t expert, std::string tensor, int64_t index,
                                 uint8_t got, uint8_t want);
};

struct RoundTripCheck {
  std::string name;  // "layer 3 w13 codes", ...
  bool passed = false;
  int64_t compared = 0;    // elements compared
  int64_t mismatches = 0;  // elements that differ
  std::optional<RoundTripMismatch> first_mismatch;
};

struct LayerResult {
  int64_t layer = 0;
  std::string backend;  // target layout name
  int64_t tokens = 0;   // hidden states evaluated
  int top_k = 0;
  double max_abs_err = 0.0;
  double norm_err = 0.0;  // ||out - ref|| / ||ref||
  double ref_norm = 0.0;
  double tolerance = kDefaultVerifyTolerance;
  bool passed = false;                     // finite and norm_err <= tolerance
  std::vector<double> expert_max_abs_err;  // [E] over the expert's unweighted outputs
  std::vector<int64_t> expert_tokens;      // [E] tokens routed to each expert
};

// A LayerResult from a numerical comparison (passed = finite && norm_err <= tolerance).
LayerResult make_layer_result(int64_t layer, const std::string& backend, int64_t tokens, int top_k,
                              const ref::MoeComparison& comparison, double tolerance);

// Where a verify's time went (not part of the report's verdict or of to_json: the CLI prints it
// as the "stages" of its --json "run" object). Busy seconds summed over the threads that did the
// work, so a stage can exceed the wall time.
struct VerifyTiming {
  int lanes = 1;  // threads preparing chunks (ChunkPipeline's workers; 1: the loop itself)
  double read_hash_seconds =
      0;  // chunks copied out of the mapped shards, parameters hashed (TensorHasher, integrity 1)
  double decode_seconds = 0;    // the layout's unpack; with --source, its load and exact compare
  double wait_seconds = 0;      // the layer loop waiting for a prepared chunk
  double evaluate_seconds = 0;  // the MoE: CPU evaluation, or the copies up + launches (cuda)
  // --device cuda: the chunk workers filling each chunk's pinned staging (its readers built over
  // it: the layout's parameters copied, the reference packed, the biases)
  double stage_seconds = 0;
  double device_seconds = 0;  // --device cuda: the MoE kernels on the device (CUDA events)
};

struct VerifyReport {
  std::string tool_version;
  std::string source;       // SRC path (stdout only: text and --json)
  std::string destination;  // DST path (stdout only)
  // What the HTML report (a file: no machine path in it) names instead of the paths: the
  // artifact by its moepack.json's SHA-256, the source by the fingerprint it was checked against.
  std::string artifact_identity, source_identity;
  std::string backend;  // target layout name
  std::string model;    // architecture / model_type, for the title
  // What the numerical check computed, by the model type (model/routing.h): "olmoe: softmax top-4"
  // and "silu"; empty with --skip-numerical.
  std::string router, activation;
  uint64_t seed = kDefaultVerifySeed;
  int64_t tokens = kDefaultVerifyTokens;
  double tolerance = kDefaultVerifyTolerance;
  std::vector<IntegrityCheck> integrity;
  std::vector<RoundTripCheck> round_trip;
  std::vector<LayerResult> layers;
  std::vector<std::string> notes;  // e.g. "layers 0-2 are dense: no MoE check"
  // verify --skip-numerical: no layer's MoE was computed (layers is empty); `skipped_because`
  // says what moepack could not have computed (an unknown router or activation), or "".
  bool numerical_skipped = false;
  std::string skipped_because;
  bool passed = false;  // set by finalize()
  VerifyTiming timing;

  // passed = every integrity, round-trip and layer check passed and at least one check ran.
  void finalize();
};

std::string render_text(const VerifyReport& report);
nlohmann::json to_json(const VerifyReport& report);
std::string render_html(const VerifyReport& report);

// HTML-escapes & < > " ' (exposed for tests and other HTML writers).
std::string html_escape(const std::string& s);

}  // namespace moepack
