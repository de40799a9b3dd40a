#include "pipeline/oracle.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "core/error.h"

namespace moepack {

OracleDecision choose_backend(const OracleQuery& q) {
  OracleDecision d;
  d.scheme = scheme_of(q.quant.method);
  const SourceCodec* codec = find_source_codec(q.quant.method);
  if (q.requested != "auto" && !find_target_layout(q.requested))
    throw Error(ErrorCode::kUsage,
                "unknown --backend \"" + q.requested + "\" (auto, " + target_layout_names() + ")");
  // Candidates for auto: every layout taking the scheme, by priority (stable: registry order).
  std::vector<const TargetLayout*> candidates;
  if (codec)
    for (const auto& t : target_layouts())
      if (std::find(t.schemes.begin(), t.schemes.end(), d.scheme) != t.schemes.end())
        candidates.push_back(&t);
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [](const TargetLayout* a, const TargetLayout* b) { return a->priority < b->priority; });
  const std::vector<std::string> scheme_reasons =
      codec && codec->refusals ? codec->refusals(q.quant) : std::vector<std::string>{};
  const LayoutOptions opts = LayoutOptions::for_layer(
      q.quant.method, q.act_dtype, q.gated, q.vllm_w13_scale_size_k, q.vllm_target, "", q.inter, 1);
  // The layer as every candidate judges it (only candidates exist when a codec reads the method).
  const MoeShape shape = codec ? moe_shape_for(q.quant, std::max<int64_t>(1, q.experts), q.hidden,
                                               q.inter, q.gated, q.act_order_w13, q.act_order_w2)
                               : MoeShape{};
  auto judge = [&](const TargetLayout& t) {
    BackendVerdict v;
    v.backend = t.name;
    v.reasons = scheme_reasons;
    if (std::find(t.archs.begin(), t.archs.end(), q.arch) == t.archs.end()) {
      std::string archs;
      for (TargetArch a : t.archs) {
        std::string n = target_arch_name(a);
        std::transform(n.begin(), n.end(), n.begin(),
                       [](unsigned char c) { return std::toupper(c); });
        archs += (archs.empty() ? "" : ", ") + n;
      }
      v.reasons.push_back(std::string(t.kernel) + " runs only on " + archs + "; target is " +
                          target_arch_name(q.arch));
    }
    if (std::find(candidates.begin(), candidates.end(), &t) == candidates.end()) {
      v.reasons.push_back(std::string("backend ") + t.name + " does not take " + d.scheme +
                          " experts (" + quant_method_name(q.quant.method) + ")");
    } else {
      for (auto& r : t.unsupported_reasons(opts, shape)) v.reasons.push_back(r);
    }
    v.supported = v.reasons.empty();
    return v;
  };

  if (q.requested != "auto") {
    d.verdicts.push_back(judge(*find_target_layout(q.requested)));
  } else {
    for (const TargetLayout* t : candidates) d.verdicts.push_back(judge(*t));
    if (candidates.empty()) {
      BackendVerdict v;
      v.backend = "none";
      v.reasons.push_back(q.quant.method == QuantMethod::kNone
                              ? "unquantized experts need no kernel layout conversion (use "
                                "--quantize mxfp8 to produce MXFP8 experts)"
                              : "no moepack backend converts " + d.scheme + " experts (" +
                                    quant_method_name(q.quant.method) + ")");
      d.verdicts.push_back(v);
    }
  }
  for (const auto& v : d.verdicts)
    if (v.supported) {
      d.chosen = v.backend;
      break;
    }
  // vLLM 0.33 ranks Humming ahead of Marlin for WNA16 on some archs (prioritize_humming);
  // moepack has no Humming layout, so it writes Marlin and says so.
  const VllmTargetRow& target = vllm_target_row(q.vllm_target);
  if (d.chosen == "marlin" && d.scheme == "wna16" &&
      std::find(target.wna16_prefers_humming.begin(), target.wna16_prefers_humming.end(), q.arch) !=
          target.wna16_prefers_humming.end()) {
    d.vllm_would_pick = "humming";
    d.vllm_note = std::string(target.follows) + " on " + target_arch_name(q.arch) +
                  " ranks Humming ahead of Marlin for WNA16 MoE (prioritize_humming); moepack "
                  "has no Humming layout and writes Marlin, which that vLLM runs when Humming "
                  "is unavailable or deselected (--moe-backend marlin)";
  }
  return d;
}

nlohmann::json OracleDecision::to_json() const {
  nlohmann::json j;
  j["scheme"] = scheme;
  j["chosen"] = chosen.empty() ? nlohmann::json(nullptr) : nlohmann::json(chosen);
  j["vllm_would_pick"] = vllm_would_pick.empty() ? chosen : vllm_would_pick;
  if (!vllm_note.empty()) j["vllm_note"] = vllm_note;
  j["candidates"] = nlohmann::json::array();
  for (const auto& v : verdicts)
    j["candidates"].push_back(
        {{"backend", v.backend}, {"supported", v.supported}, {"reasons", v.reasons}});
  return j;
}

std::string OracleDecision::explain() const {
  std::ostringstream s;
  s << "scheme " << scheme << ": " << (chosen.empty() ? "no backend" : "backend " + chosen) << "\n";
  for (const auto& v : verdicts) {
    s << "  " << (v.supported ? "+ " : "- ") << v.backend;
    if (v.supported) s << (v.backend == chosen ? " (chosen)" : " (also possible)");
    s << "\n";
    for (const auto& r : v.reasons) s << "      " << r << "\n";
  }
  if (!vllm_would_pick.empty())
    s << "  vLLM's own oracle would pick " << vllm_would_pick << ": " << vllm_note << "\n";
  return s.str();
}

}  // namespace moepack
