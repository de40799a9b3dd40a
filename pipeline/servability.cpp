#include "pipeline/servability.h"

#include <algorithm>
#include <sstream>

#include "formats/parallel.h"
#include "pipeline/manifest.h"

namespace moepack {
using nlohmann::json;

namespace {

std::string how_of(ServingPath path, const std::string& method, const std::string& backend,
                   const std::string& builder) {
  if (path == ServingPath::kVllmMethod) return "vLLM's " + method + " (" + backend + ")";
  if (path == ServingPath::kKernelBuilder) return "kernel builder " + builder;
  return "";
}

bool target_served(VllmTarget t) {
  const auto v = served_vllm_targets();
  return std::find(v.begin(), v.end(), t) != v.end();
}

// Why an output for `target` is not served when no row serves that target at all.
std::string target_reason(VllmTarget target) {
  std::string served;
  for (VllmTarget t : served_vllm_targets())
    served += std::string(served.empty() ? "" : ", ") + vllm_target_name(t);
  return std::string("moepack-vllm serves --vllm-target ") + served + " only; this output is for " +
         vllm_target_row(target).follows + " (--vllm-target " + vllm_target_name(target) +
         "), which no moepack-vllm serves: it converts and verifies, and is for another loader";
}

// "TP 1 only, no expert parallelism" (whole experts), "TP 8 only, no expert parallelism, each
// rank reading its own expert files", "expert parallel 4 (linear; ...) only, ...".
std::string parallel_text(const Parallelism& p) {
  if (p.expert > 1)
    return "expert parallel " + std::to_string(p.expert) + " (" +
           expert_placement_name(p.placement) + "; --tensor-parallel-size " +
           std::to_string(p.expert) +
           " --enable-expert-parallel) only, each rank reading its own expert files";
  if (p.tensor > 1)
    return "TP " + std::to_string(p.tensor) +
           " only, no expert parallelism, each rank reading its own expert files";
  return "TP 1 only, no expert parallelism";
}

}  // namespace

std::vector<VllmTarget> served_vllm_targets() {
  std::vector<VllmTarget> out;
  for (const VllmTargetRow& row : vllm_target_rows()) {
    bool any = false;
    for (const TargetLayout& l : target_layouts())
      for (const VllmServing& s : l.vllm_serving)
        any |= s.target == row.target && s.path != ServingPath::kNone;
    if (any) out.push_back(row.target);
  }
  return out;
}

Servability servability(const TargetLayout& layout, VllmTarget target, QuantMethod experts) {
  Servability s;
  s.backend = layout.name;
  s.vllm_target = target;
  s.archs = layout.archs;
  if (!target_served(target)) {
    s.reason = target_reason(target);
    return s;
  }
  const VllmServing v = find_vllm_serving(layout, target, experts);
  s.path = v.path;
  s.servable = v.path != ServingPath::kNone;
  s.how = how_of(v.path, v.vllm_method ? v.vllm_method : "", v.vllm_backend ? v.vllm_backend : "",
                 v.kernel_builder ? v.kernel_builder : "");
  if (!s.servable) s.reason = v.reason ? v.reason : "";
  return s;
}

Servability servability(const Manifest& m) {
  Servability s;
  s.backend = m.backend;
  s.vllm_target = m.vllm_target;
  if (!m.serving) {  // manifest_version 1
    if (const TargetLayout* l = find_target_layout(m.backend)) s.archs = l->archs;
    s.reason =
        "its moepack.json (manifest_version 1) records no serving path, and moepack-vllm reads "
        "version 2 or later: convert it again with this moepack";
    return s;
  }
  const ManifestServing& ms = *m.serving;
  for (const auto& a : ms.archs)
    if (auto arch = target_arch_from_name(a)) s.archs.push_back(*arch);
  if (!target_served(m.vllm_target)) {
    s.reason = target_reason(m.vllm_target);
    return s;
  }
  s.path = ms.path;
  s.servable = ms.path != ServingPath::kNone;
  s.how = how_of(ms.path, ms.vllm_method, ms.vllm_backend, ms.kernel_builder);
  if (!s.servable) s.reason = ms.reason;
  if (m.parallel) mark_parallel(m.parallel->parallel, s);
  return s;
}

void mark_parallel(const Parallelism& p, Servability& s) {
  // moepack-vllm serves a parallel output by the row's path, each rank reading its own tensors
  // (docs/vllm.md "Serving it"); only rows with a tensor-parallel split are written for it.
  s.parallel = p;
}

json Servability::to_json() const {
  json arch_names = json::array();
  for (TargetArch a : archs) arch_names.push_back(target_arch_name(a));
  json j = {{"servable", servable},
            {"plugin", "moepack-vllm"},
            {"vllm", vllm_target_row(vllm_target).follows},
            {"vllm_target", vllm_target_name(vllm_target)},
            {"backend", backend},
            {"path", serving_path_name(path)},
            {"archs", arch_names},
            {"tensor_parallel_size", parallel.tensor},
            {"expert_parallel", parallel.expert > 1}};
  if (parallel.expert > 1) {
    j["expert_parallel_size"] = parallel.expert;
    j["expert_placement"] = expert_placement_name(parallel.placement);
  }
  if (servable)
    j["how"] = how;
  else
    j["reason"] = reason;
  return j;
}

std::string Servability::to_text() const {
  if (!servable) return "NOT servable by moepack-vllm (" + backend + "): " + reason;
  std::string archs_text;
  for (TargetArch a : archs)
    archs_text += (archs_text.empty() ? "" : "/") + std::string(target_arch_name(a));
  return "servable by moepack-vllm in " + std::string(vllm_target_row(vllm_target).follows) + " (" +
         how + "), " + parallel_text(parallel) + ", on " + archs_text;
}

std::string served_matrix_markdown() {
  std::ostringstream s;
  s << "| source format | backend | GPUs |";
  for (const VllmTargetRow& t : vllm_target_rows()) s << " `--vllm-target " << t.name << "` |";
  s << "\n| --- | --- | --- |";
  for (size_t i = 0; i < vllm_target_rows().size(); ++i) s << " --- |";
  s << "\n";
  // Each codec's method, then the methods --quantize writes (from bf16/fp16 experts).
  std::vector<std::pair<std::string, QuantParams>> formats;
  for (const SourceCodec& c : source_codecs()) {
    QuantParams q;
    q.method = c.method;
    formats.push_back({c.name, q});
  }
  for (const QuantizeRecipe& r : quantize_recipes()) {
    const std::string name = std::string("bf16/fp16 + `--quantize ") + r.format + "`";
    if (std::none_of(formats.begin(), formats.end(), [&](auto& f) { return f.first == name; }))
      formats.push_back({name, r.target_params(DType::kBF16)});
  }
  for (const auto& [name, q] : formats) {
    const std::string scheme = scheme_of(q.method);
    for (const TargetLayout& l : target_layouts()) {
      if (std::find(l.schemes.begin(), l.schemes.end(), scheme) == l.schemes.end()) continue;
      std::string archs;
      for (TargetArch a : l.archs)
        archs += (archs.empty() ? "" : ", ") + std::string(target_arch_name(a));
      s << "| " << name << " | `" << l.name << "` | " << archs << " |";
      for (const VllmTargetRow& t : vllm_target_rows()) {
        const Servability v = servability(l, t.target, q.method);
        // A row with a tensor-parallel split is also written (and served) per rank, except for
        // sources written whole only (gpt-oss).
        const bool whole_only = l.tensor_parallel.unsupported || written_whole_only(q.method);
        s << (!v.servable  ? " not served |"
              : whole_only ? " **served** (TP 1, no EP) |"
                           : " **served** (TP 1; TP N / EP N per rank) |");
      }
      s << "\n";
    }
  }
  return s.str();
}

}  // namespace moepack
