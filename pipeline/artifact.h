// What binds a converted checkpoint into one artifact (docs/manifest.md "Binding"):
//
//   config.json   = output_config(source config.json, config_patch(facts, weights' block)),
//                   quantization_config.manifest_sha256 = SHA-256 of moepack.json's bytes
//   moepack.json  records config_digests(config.json): a SHA-256 per field (per member of an
//                   object field), every field but manifest_sha256 -- so neither file can be
//                   edited without the other noticing
//
// The config patch is a function of facts both a Plan (convert) and a Manifest (verify) hold, so
// verify --source recomputes config.json exactly from the source's and names the first field
// that differs; without the source it checks the recorded digests, naming the field.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/codec.h"

namespace moepack {

class Checkpoint;
struct Manifest;
struct Plan;

// The facts config.json's moepack blocks are written from.
struct ConfigPatchInputs {
  std::string version;        // moepack's version that converted
  std::string source_format;  // quant_method_name of the source
  std::string backend, layout;
  int layout_version = 0;
  TargetArch arch = TargetArch::kSm90;
  DType act_dtype = DType::kBF16;
  VllmTarget vllm_target = VllmTarget::kV0_33;
  // --tensor-parallel-size / --expert-parallel (formats/parallel.h): the deployment the experts
  // were sharded for, which the plugin checks the engine against. Whole experts by default.
  Parallelism parallel;
};
ConfigPatchInputs config_patch_inputs(const Plan& plan);
ConfigPatchInputs config_patch_inputs(const Manifest& manifest);

// The top-level keys config.json gets over the source's: the quant_method "moepack" block (the
// quantization the weights carry nested whole; tensor_parallel_size, and for expert parallelism
// expert_parallel_size and expert_placement, the deployment the experts were written for) and
// the "moepack" block. manifest_sha256 is null:
// the writer fills it once the manifest's bytes exist.
nlohmann::json config_patch(const ConfigPatchInputs& in,
                            const nlohmann::json& weights_quantization_config);
// The quantization_config a --quantize mxfp8 output's weights carry: only the experts were
// quantised, so every other 2-D Linear weight of the checkpoint is listed as ignored.
nlohmann::json mxfp8_quantization_config(const Checkpoint& ckpt, const std::string& version);

// The source's config.json with the patch's keys set and no stale text_config.quantization_config.
nlohmann::json output_config(const nlohmann::json& source_config, const nlohmann::json& patch);

// {field: SHA-256 of its JSON text} for every top-level field of a config, an object of member
// digests for a field that is an object; quantization_config.manifest_sha256 is left out.
nlohmann::json config_digests(const nlohmann::json& config);
// The first field of `config` that differs from `digests` (config_digests of what convert wrote),
// as "<field>: <why>", or "" when every field is as recorded.
std::string config_digest_mismatch(const nlohmann::json& config, const nlohmann::json& digests);
// The path of the first difference between two JSON values ("quantization_config.backend",
// "mlp_only_layers[0]"), "(top level)" for different kinds at the top, "" when equal.
std::string json_first_difference(const nlohmann::json& got, const nlohmann::json& want);

// SHA-256 of DIR/moepack.json's bytes (a regular file of at most kMaxManifestBytes; kBadConfig or
// kIo otherwise), as config.json's quantization_config.manifest_sha256 records it.
std::string manifest_file_sha256(const std::string& dir);

// Whether DIR's config.json (parsed: `config`) is bound to its manifest `m`: its
// quantization_config.manifest_sha256 is moepack.json's digest and (manifest_version >= 3) every
// field is as config_digests recorded. "" when bound, else "config.json: <field>: <why>".
std::string config_binding_problem(const std::string& dir, const Manifest& m,
                                   const nlohmann::json& config);

// The config.json convert writes from `src` under the facts `m` records, with manifest_sha256 set:
// verify --source compares the converted config.json with it field by field.
nlohmann::json expected_output_config(const Manifest& m, const Checkpoint& src,
                                      const std::string& manifest_sha256);

}  // namespace moepack
