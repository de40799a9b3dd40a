// What verify checks of a converted checkpoint's per-layer layout record beside its tensors: the
// layout's decisions (TargetLayout::decide_layer) and serving configuration
// (TargetLayout::layer_config) in moepack.json, against what this moepack derives from the
// manifest's own fields -- so that an artifact whose recorded configuration disagrees with its
// tensors and options, or was made for another kernel version or SM (Humming's LayerConfig), is
// refused before anything is computed, naming the field.
#pragma once

#include <string>

#include "formats/codec.h"
#include "pipeline/manifest.h"

namespace moepack {

// Throws kBadConfig (file `manifest_file`) naming the field ("target_arch", "layers[2].
// layout_config.w13_layer_config.sm_version: recorded 89, this layer's is 90"):
//   - the manifest's target arch is not one the layout's kernel runs on;
//   - a layer records decisions or a configuration the layout does not make;
//   - a layer's layout_config differs from layout.layer_config(options, shape) for the manifest's
//     options, the layer's extents and its recorded decisions (every key; inside a JSON object
//     every field; and then the exact text, which Humming keys its kernels with).
//   - a parallel output: the same per rank (layers[i].ranks[r], one entry per rank where the
//     layout records anything, none at layer level), against the rank's options (its I, its
//     recorded decisions) and shape (its I, its experts).
void check_layout_records(const Manifest& manifest, const TargetLayout& layout,
                          const std::string& manifest_file);

}  // namespace moepack
