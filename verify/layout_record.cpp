#include "verify/layout_record.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/parallel.h"

namespace moepack {
namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& file, const std::string& what) {
  throw Error(ErrorCode::kBadConfig, file, "", what);
}

// A text as JSON when it is one; discarded otherwise.
json as_json(const std::string& text) {
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

std::string shown(const json& v) {
  return v.is_string() ? "\"" + v.get<std::string>() + "\"" : v.dump();
}

// Recorded text `got` of key `where` against the derived `want`: the first differing field
// when both are JSON objects, else the texts.
void compare_text(const std::string& file, const std::string& where, const std::string& got,
                  const std::string& want) {
  if (got == want) return;
  const json g = as_json(got), w = as_json(want);
  if (g.is_object() && w.is_object()) {
    for (const auto& item : w.items()) {
      if (!g.contains(item.key()))
        refuse(file, where + "." + item.key() + ": missing (expected " + shown(item.value()) + ")");
      if (g[item.key()] != item.value())
        refuse(file, where + "." + item.key() + ": recorded " + shown(g[item.key()]) +
                         ", this layer's is " + shown(item.value()));
    }
    for (const auto& item : g.items())
      if (!w.contains(item.key()))
        refuse(file, where + "." + item.key() + ": not a field this moepack writes");
    refuse(file, where + ": the fields agree but not the text (expected exactly " + want +
                     "; the kernel is keyed by that text)");
  }
  refuse(file, where + ": recorded \"" + got + "\", this layer's is \"" + want + "\"");
}

std::string arch_names(const std::vector<TargetArch>& archs) {
  std::string s;
  for (TargetArch a : archs) s += std::string(s.empty() ? "" : ", ") + target_arch_name(a);
  return s;
}

// One record (a layer's, or one rank's of a parallel output) against what the layout derives
// for options `lo` (its decisions included) and `shape`; `at` is the record's field path.
void check_record(const std::string& file, const std::string& at, const TargetLayout& layout,
                  const std::map<std::string, std::string>& decisions,
                  const std::map<std::string, std::string>& config, const LayoutOptions& lo,
                  const MoeShape& shape) {
  if (!layout.decide_layer && !decisions.empty())
    refuse(file, at + "layout_decisions: layout " + layout.name + " makes no decisions");
  if (!layout.layer_config) {
    if (!config.empty())
      refuse(file, at + "layout_config: layout " + layout.name + " records no configuration");
    return;
  }
  std::vector<std::pair<std::string, std::string>> want;
  try {
    want = layout.layer_config(lo, shape);
  } catch (const Error& e) {
    refuse(file, at + (e.tensor().empty() ? "" : e.tensor() + ": ") + e.message());
  }
  for (const auto& [key, text] : want) {
    const auto it = config.find(key);
    if (it == config.end())
      refuse(file, at + "layout_config." + key + ": missing (expected \"" + text + "\")");
    compare_text(file, at + "layout_config." + key, it->second, text);
  }
  for (const auto& recorded : config) {
    const std::string& key = recorded.first;
    // A named copy: C++17 lambdas cannot capture a structured binding (clang rejects it).
    if (std::none_of(want.begin(), want.end(), [&](const auto& w) { return w.first == key; }))
      refuse(file, at + "layout_config." + key + ": not a key layout " + layout.name + " records");
  }
}

void check_layer(const Manifest& m, const TargetLayout& layout, size_t i, const std::string& file) {
  const ManifestLayer& ml = m.layers[i];
  const std::string at = "layers[" + std::to_string(i) + "].";
  const MoeShape shape =
      moe_shape_for(m.target_quant_params, ml.experts, ml.hidden, ml.inter, ml.gated);
  if (!m.parallel) {
    check_record(file, at, layout, ml.layout_decisions, ml.layout_config,
                 layout_options_of(m, ml, 1), shape);
    return;
  }
  // A parallel output: each rank decided on its share and is configured for its shape.
  const Parallelism& par = m.parallel->parallel;
  if (!ml.layout_decisions.empty() || !ml.layout_config.empty())
    refuse(file, at + (ml.layout_decisions.empty() ? "layout_config" : "layout_decisions") +
                     ": a parallel output records them per rank (" + at + "ranks)");
  const bool records = layout.decide_layer || layout.layer_config;
  if (records && ml.rank_layouts.size() != static_cast<size_t>(par.ranks()))
    refuse(file, at + "ranks: layout " + layout.name +
                     " records its decisions and configuration "
                     "per rank; expected " +
                     std::to_string(par.ranks()) + " entries, got " +
                     std::to_string(ml.rank_layouts.size()));
  for (size_t r = 0; r < ml.rank_layouts.size(); ++r) {
    const ManifestLayer::RankLayout& rl = ml.rank_layouts[r];
    check_record(file, at + "ranks[" + std::to_string(r) + "].", layout, rl.layout_decisions,
                 rl.layout_config, rank_options_of(m, ml, static_cast<int>(r), 1),
                 rank_shape(shape, par, static_cast<int>(r)));
  }
}

}  // namespace

void check_layout_records(const Manifest& m, const TargetLayout& layout, const std::string& file) {
  if (std::find(layout.archs.begin(), layout.archs.end(), m.target_arch) == layout.archs.end())
    refuse(file, std::string("target_arch: ") + target_arch_name(m.target_arch) + ", but " +
                     layout.kernel + " runs only on " + arch_names(layout.archs));
  for (size_t i = 0; i < m.layers.size(); ++i) check_layer(m, layout, i, file);
}

}  // namespace moepack
