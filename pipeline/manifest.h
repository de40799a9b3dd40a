// moepack.json: what a converted checkpoint is and how it was made -- tool and layout versions,
// source format and parameters, backend, target arch, activation dtype, deliberate deviations
// from vLLM's loader, and per output tensor its shard, dtype, shape, sources and SHA-256.
// Deterministic: no timestamps, no absolute paths, nothing about the machine that ran it.
//
// The file is untrusted input to `verify` and `inspect`: it is read in one place
// (read_manifest / parse_manifest), which checks every field and turns any defect into
// kBadConfig naming the file and the field ("layers[0].experts: expected an integer, got "x"").
// Readers use the typed Manifest only. docs/manifest.md describes the format.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "formats/codec.h"

namespace moepack {

struct Plan;       // pipeline/plan.h: only build_manifest needs it
class Checkpoint;  // model/checkpoint.h

// 2: adds "serving" and each layer's "param_roles" (what the moepack-vllm plugin reads).
// 3: binds the artifact (pipeline/artifact.h): "config", a SHA-256 per field of the config.json
//    convert wrote; drops source.name (the last component of however SRC was spelled: output
//    bytes depend only on the source's bytes).
// 4: the source's fingerprint, source.tensor_sha256: the SHA-256 of every source tensor, hashed
//    by convert while it read them (merge and verify --source check it).
// Versions 1 to 3 still read, for verify and inspect.
constexpr int kManifestVersion = 4;
// Far above any real manifest (tens of MB for the largest models); bounds what a hostile
// moepack.json can make the reader allocate.
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

std::string moepack_version_string();

struct ManifestTool {
  std::string name;     // "moepack"
  std::string version;  // moepack_version_string() of the converter
};

struct ManifestSource {
  std::string name;    // manifest_version < 3 only: the last component of SRC as spelled
  std::string format;  // quant_method_name of the source
  QuantParams quant_params;
  nlohmann::json quantization_config;  // the source's, as found (null when it had none)
  std::string model_type;
  uint64_t tensor_bytes = 0;
  // manifest_version >= 4: every source tensor's name -> SHA-256 (64 lowercase hex digits) of its
  // bytes as convert read them.
  std::map<std::string, std::string> tensor_sha256;
};

// Present when the conversion quantised unquantised experts (--quantize).
struct ManifestQuantize {
  std::string format;  // "mxfp8"
  std::string recipe;  // "flashinfer" or "modelopt"
};

struct ManifestLayout {
  std::string name;
  int version = 0;
};

// How the moepack-vllm plugin serves the conversion (the layout row's VllmServing for the target
// and the experts' method), plus the target archs the layout's kernel runs on.
struct ManifestServing {
  ServingPath path = ServingPath::kNone;
  std::string vllm_method, vllm_backend;  // path vllm-method
  std::string kernel_builder;             // path kernel-builder
  std::string reason;                     // path none
  std::vector<std::string> archs;         // target_arch_name of each
};

struct ManifestOptions {
  bool vllm_w13_scale_size_k = false;
};

struct ManifestLayer {
  std::string module;        // "model.layers.1.mlp"
  int64_t layer = -1;        // L of "layers.L.", -1 when the module has none
  std::string family;        // moe_family_name: "per-expert", "mixtral", ...
  std::string param_prefix;  // what the layer's parameter names start with (with the target's
                             // child: "...mlp.experts.routed_experts." for 0.33)
  int64_t experts = 0, hidden = 0, inter = 0;  // E, H, I (each >= 1); I is the real one
  int64_t inter_padded = 0;  // the I the parameters carry (>= inter; absent in the file: inter)
  bool gated = true;
  std::vector<std::string> params;  // output tensor names, each a key of Manifest::tensors
  std::vector<std::string> deviations_from_vllm;
  // Each parameter's role (manifest_version >= 2: exactly the params; empty in version 1).
  std::map<std::string, ParamRole> param_roles;
  // What the layout decided from the whole layer's codes (TargetLayout::decide_layer: Humming's
  // "w13_b_dtype" / "w2_b_dtype") and what its serving runtime needs beside the parameters
  // (TargetLayout::layer_config: Humming's version, SM and LayerConfig strings). Empty, and absent
  // from the file, for layouts without those hooks.
  std::map<std::string, std::string> layout_decisions;
  std::map<std::string, std::string> layout_config;
  // A parallel output of a layout with those hooks: the same per rank ("ranks", one entry per
  // rank of Manifest::parallel), each rank's decisions over its share of the layer and its
  // configuration for its shape; the layer-level two are then empty. Empty otherwise.
  struct RankLayout {
    std::map<std::string, std::string> layout_decisions;
    std::map<std::string, std::string> layout_config;
  };
  std::vector<RankLayout> rank_layouts;
};

struct ManifestShard {
  std::string name;  // a plain file name inside the output directory
  uint64_t file_bytes = 0;
};

struct ManifestTensor {
  std::string shard;  // a ManifestShard::name
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t bytes = 0;      // = shape x dtype
  std::string sha256;      // 64 lowercase hex digits
  bool converted = false;  // "action": "convert"; false: "copy" (copied through byte for byte)
  std::string codec;       // "gptq->marlin", "copy"
  std::vector<std::string> sources;  // source tensor names (brace patterns for expert sets)
};

// A parallel output (convert --tensor-parallel-size / --expert-parallel; formats/parallel.h): each
// rank's parameters are tensors "rankRR-of-NN/<name>" in shard files of its own.
struct ManifestRank {
  std::vector<std::string> shards;  // the rank's own shard files (it also reads the shared ones)
  uint64_t tensor_bytes = 0;        // its parameters' bytes
  // SHA-256 over "<name> <sha256>\n" of its parameters in name order (rank_digest).
  std::string sha256;
  std::vector<int64_t> experts;  // global expert ids in local order (expert parallel)
};
struct ManifestParallel {
  Parallelism parallel;
  std::vector<ManifestRank> ranks;  // parallel.ranks() entries
};

struct Manifest {
  int manifest_version = kManifestVersion;
  ManifestTool tool;
  ManifestSource source;
  QuantParams target_quant_params;  // differs from the source's with --quantize
  std::optional<ManifestQuantize> quantize;
  std::string backend;
  ManifestLayout layout;
  TargetArch target_arch = TargetArch::kSm90;  // written as target_arch_name: "sm90", ...
  // The vLLM the parameters are for (--vllm-target). A manifest without the field was written
  // before targets existed, for vLLM@9aaf83ef: it reads as 2026-05.
  VllmTarget vllm_target = VllmTarget::kV2026_05;
  DType act_dtype = DType::kBF16;  // BF16 or F16
  ManifestOptions options;
  std::optional<ManifestServing> serving;  // manifest_version >= 2
  std::vector<std::string> deviations_from_vllm;
  std::vector<ManifestLayer> layers;  // at least one
  std::vector<ManifestShard> shards;
  std::vector<std::string> files;  // copied non-weight files, relative paths
  // The --include / --exclude globs of the conversion (model/hf_hub.h FileRule), written only
  // when given ("files_rule"), and the source's non-weight files the rule left out, written only
  // when there are some ("files_left_out"): verify --source applies the rule to the source again
  // and checks both lists.
  std::vector<std::string> files_include, files_exclude;
  std::vector<std::string> files_left_out;
  std::map<std::string, ManifestTensor> tensors;
  // config_digests of the config.json convert wrote (manifest_version >= 3; null before).
  nlohmann::json config;
  std::optional<ManifestParallel> parallel;  // "parallel": absent for whole experts
  // The experts a parameter of layer `l` leads with: the rank's for a parallel output.
  int64_t param_experts(const ManifestLayer& l, const std::string& param) const;
};

// A rank's digest: SHA-256 over "<name> <sha256>\n" of `tensors` (name order).
std::string rank_digest(const std::map<std::string, std::string>& sha256_by_tensor);

// What a conversion following PLAN records; sha256_by_tensor holds every output tensor's,
// source_sha256 every source tensor's (ckpt.tensor_names(); kInternal naming one missing).
Manifest build_manifest(const Plan& plan, const Checkpoint& ckpt,
                        const std::map<std::string, std::string>& sha256_by_tensor,
                        const std::map<std::string, std::string>& source_sha256);
nlohmann::json to_json(const Manifest& manifest);
nlohmann::json to_json(const ManifestLayer& layer);      // one entry of "layers"
nlohmann::json to_json(const ManifestServing& serving);  // "serving"
// The exact bytes write_manifest writes (the digest in config.json's quantization_config is
// the SHA-256 of these).
std::string manifest_text(const Manifest& manifest);
void write_manifest(const std::string& path, const Manifest& manifest);

// Checks the source against a recorded fingerprint (Manifest::source.tensor_sha256, or what the
// parts of a --shard split recorded): every source tensor is recorded and hashes (SHA-256, with
// `threads` workers) to its record, and nothing else is recorded. The first difference in
// ckpt.tensor_names() order throws: kBadValue naming the source shard file and the tensor when
// the bytes differ (a source edited, or another copy than the one converted), kBadConfig when a
// tensor is unrecorded or a recorded one is absent. `recorded_by` names the record in messages.
void check_source_fingerprint(const Checkpoint& ckpt,
                              const std::map<std::string, std::string>& recorded, int threads,
                              const std::string& recorded_by);

// DIR/moepack.json.
std::string manifest_path(const std::string& dir);
// Checks every field (presence, type, range, names that must parse, cross-references: layer
// params and tensor shards exist). Throws kBadConfig naming FILE and the field path.
Manifest parse_manifest(const nlohmann::json& j, const std::string& file);
// Reads and parses manifest_path(DIR). Throws kBadConfig naming the file when it is missing,
// not a regular file, larger than kMaxManifestBytes, not JSON or malformed; kIo when it cannot
// be read.
Manifest read_manifest(const std::string& dir);

// The options a manifest layer's parameters were packed with (what make_plan gave pack): the
// target's method, activation dtype, gated, --vllm-w13-scale-size-k, vLLM target, target arch,
// the layer's parameter prefix, real H and I, and its recorded layout decisions.
LayoutOptions layout_options_of(const Manifest& manifest, const ManifestLayer& layer, int threads);
// Rank `rank`'s of a parallel output: the rank's intermediate size (rank_layout_options) and its
// recorded decisions (layer.rank_layouts). layout_options_of for a whole-experts output.
LayoutOptions rank_options_of(const Manifest& manifest, const ManifestLayer& layer, int rank,
                              int threads);

nlohmann::json quant_params_json(const QuantParams& q);
// Inverse of quant_params_json (for verify: the source params the conversion used). Throws
// kBadConfig naming FILE and the field.
QuantParams quant_params_from_json(const nlohmann::json& j, const std::string& file);

}  // namespace moepack
