#include "pipeline/oracle.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "core/error.h"

namespace moepack {

namespace {

const TargetLayout* find_layout(const std::vector<TargetLayout>& layouts, const std::string& name) {
  for (const auto& t : layouts)
    if (name == t.name) return &t;
  return nullptr;
}

bool takes_scheme(const TargetLayout& t, const std::string& scheme) {
  return std::find(t.schemes.begin(), t.schemes.end(), scheme) != t.schemes.end();
}

bool runs_on(const std::vector<TargetArch>& archs, TargetArch a) {
  return std::find(archs.begin(), archs.end(), a) != archs.end();
}

// "SM100" / "SM90, SM100": arch names as the messages print them.
std::string arch_list(const std::vector<TargetArch>& archs) {
  std::string s;
  for (TargetArch a : archs) {
    std::string n = target_arch_name(a);
    std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::toupper(c); });
    s += (s.empty() ? "" : ", ") + n;
  }
  return s;
}

const VllmTargetRow& find_target(const std::vector<VllmTargetRow>& targets, VllmTarget t) {
  for (const auto& r : targets)
    if (r.target == t) return r;
  throw Error(ErrorCode::kInternal,
              "no vLLM target row for --vllm-target " + std::to_string(static_cast<int>(t)));
}

// The target_layouts() row that writes what an order's backend reads, if moepack has one that
// takes the scheme.
const TargetLayout* written_by(const VllmBackend& b, const std::vector<TargetLayout>& layouts,
                               const std::string& scheme) {
  const TargetLayout* t = b.layout ? find_layout(layouts, b.layout) : nullptr;
  return t && takes_scheme(*t, scheme) ? t : nullptr;
}

// What every verdict of one query shares.
struct Judge {
  const OracleQuery& q;
  std::string scheme;
  bool has_codec = false;
  std::vector<std::string> scheme_reasons;  // the codec row's refusals
  LayoutOptions opts;
  MoeShape shape;

  BackendVerdict operator()(const TargetLayout& t) const {
    BackendVerdict v;
    v.backend = t.name;
    v.reasons = scheme_reasons;
    if (!runs_on(t.archs, q.arch))
      v.reasons.push_back(std::string(t.kernel) + " runs only on " + arch_list(t.archs) +
                          "; target is " + target_arch_name(q.arch));
    if (!has_codec || !takes_scheme(t, scheme)) {
      v.reasons.push_back(std::string("backend ") + t.name + " does not take " + scheme +
                          " experts (" + quant_method_name(q.quant.method) + ")");
    } else {
      for (auto& r : t.unsupported_reasons(opts, shape)) v.reasons.push_back(r);
    }
    v.supported = v.reasons.empty();
    return v;
  }
};

// `auto`'s candidates: the layout rows the target's order names that take the scheme, in that
// order, each judged; `none` with the reason when there is none.
std::vector<BackendVerdict> auto_verdicts(const VllmBackendOrder* order,
                                          const std::vector<TargetLayout>& layouts,
                                          const Judge& judge) {
  std::vector<BackendVerdict> out;
  if (order)
    for (const VllmBackend& b : order->backends) {
      const TargetLayout* t = written_by(b, layouts, judge.scheme);
      const auto seen = [&](const BackendVerdict& v) { return t && v.backend == t->name; };
      if (t && std::none_of(out.begin(), out.end(), seen)) out.push_back(judge(*t));
    }
  if (out.empty()) {
    BackendVerdict v;
    v.backend = "none";
    v.reasons.push_back(judge.q.quant.method == QuantMethod::kNone
                            ? "unquantized experts need no kernel layout conversion (use "
                              "--quantize mxfp8 to produce MXFP8 experts)"
                            : "no moepack backend converts " + judge.scheme + " experts (" +
                                  quant_method_name(judge.q.quant.method) + ")");
    out.push_back(v);
  }
  return out;
}

// vLLM's pick is a layout moepack writes whose kernel fails on this layer (kernel_failures: vLLM
// picks it anyway and fails at run time, or computes wrong): the layouts moepack writes for the
// backends after it in vLLM's order, each judged -- the first that takes the layer is what `auto`
// writes, served by that vLLM with its --moe-backend; `none` saying why when none does.
std::vector<BackendVerdict> past_failing_pick(const VllmBackendOrder& order,
                                              const std::vector<VllmOrderVerdict>& judged,
                                              size_t pick, const std::vector<TargetLayout>& layouts,
                                              const Judge& judge, const VllmTargetRow& target,
                                              std::vector<BackendVerdict> out) {
  for (size_t j = pick + 1; j < order.backends.size(); ++j)
    if (const TargetLayout* t = written_by(order.backends[j], layouts, judge.scheme)) {
      out.push_back(judge(*t));
      if (out.back().supported) return out;
    }
  BackendVerdict none;
  none.backend = "none";
  none.reasons.push_back(std::string(target.follows) + " on " + target_arch_name(judge.q.arch) +
                         " picks " + judged[pick].backend +
                         " for this layer, whose kernel fails "
                         "on it, and no later backend of its order that moepack writes takes it");
  out.push_back(std::move(none));
  return out;
}

// `auto` for an order that writes only vLLM's pick (VllmBackendOrder::auto_writes_only_vllm_pick):
// the layouts moepack writes up to the backend vLLM would run, each judged (those before it are
// why vLLM does not run them); when vLLM's pick is not one moepack writes, `none` saying so and
// which layouts `--backend` can still write for the layer.
std::vector<BackendVerdict> vllm_pick_verdicts(const VllmBackendOrder& order,
                                               const std::vector<VllmOrderVerdict>& judged,
                                               const std::vector<TargetLayout>& layouts,
                                               const Judge& judge, const VllmTargetRow& target) {
  std::vector<BackendVerdict> out;
  size_t i = 0;
  for (; i < order.backends.size(); ++i) {
    if (const TargetLayout* t = written_by(order.backends[i], layouts, judge.scheme))
      out.push_back(judge(*t));
    if (judged[i].vllm_runs) break;
  }
  if (i < judged.size() && judged[i].moepack_writes && judged[i].kernel_fails.empty()) return out;
  if (i < judged.size() && judged[i].moepack_writes)
    return past_failing_pick(order, judged, i, layouts, judge, target, std::move(out));
  BackendVerdict none;
  none.backend = "none";
  const std::string where = std::string(target.follows) + " on " + target_arch_name(judge.q.arch);
  if (i < judged.size())
    none.reasons.push_back(
        where + " runs " + judged[i].backend + " for this layer, which reads " + judged[i].reads +
        (judged[i].layout.empty() ? " (nothing to convert: serve the checkpoint as it is)"
                                  : "; moepack writes no " + judged[i].layout + " layout yet"));
  else
    none.reasons.push_back(where + " runs none of its " + judge.scheme +
                           " MoE backends for this layer");
  for (size_t j = i + 1; j < judged.size(); ++j)
    if (judged[j].moepack_writes && judged[j].vllm_runs)
      none.reasons.push_back(
          "--backend " + judged[j].layout + " writes " + judged[j].backend + "'s layout instead" +
          (judged[j].moe_backend.empty()
               ? ""
               : ", which that vLLM runs with --moe-backend " + judged[j].moe_backend));
  out.push_back(std::move(none));
  return out;
}

// Whether and why the target vLLM runs each backend of its order for this layer: a backend
// moepack writes is judged by its layout row, the others by their archs and vllm_refusals.
std::vector<VllmOrderVerdict> judge_vllm_order(const VllmBackendOrder& order,
                                               const VllmTargetRow& target, const Judge& judge,
                                               const std::vector<TargetLayout>& layouts) {
  std::vector<VllmOrderVerdict> out;
  for (const VllmBackend& b : order.backends) {
    VllmOrderVerdict v;
    v.backend = b.name;
    v.moe_backend = b.moe_backend ? b.moe_backend : "";
    v.layout = b.layout ? b.layout : "";
    v.reads = b.reads;
    if (const TargetLayout* t = written_by(b, layouts, judge.scheme)) {
      v.moepack_writes = true;
      // vLLM's oracle checks no kernel_failures shape: it picks the backend and fails there.
      if (t->kernel_failures) v.kernel_fails = t->kernel_failures(judge.opts, judge.shape);
      for (auto& r : judge(*t).reasons)
        if (std::find(v.kernel_fails.begin(), v.kernel_fails.end(), r) == v.kernel_fails.end())
          v.reasons.push_back(std::move(r));
    } else {
      v.reasons = judge.scheme_reasons;
      if (!runs_on(b.archs, judge.q.arch))
        v.reasons.push_back(std::string(b.name) + " runs only on " + arch_list(b.archs) +
                            "; target is " + target_arch_name(judge.q.arch));
      if (b.vllm_refusals)
        for (auto& r : b.vllm_refusals(target, judge.q.quant, judge.shape)) v.reasons.push_back(r);
    }
    v.vllm_runs = v.reasons.empty();
    out.push_back(std::move(v));
  }
  return out;
}

// vLLM's pick against moepack's choice, in words built from the rows; "" when they agree.
std::string vllm_note(const OracleDecision& d, const VllmOrderVerdict* pick,
                      const VllmTargetRow& target, const OracleQuery& q) {
  if (d.vllm_would_pick == d.chosen || d.vllm_order.empty()) return "";
  const std::string where = std::string(target.follows) + " on " + target_arch_name(q.arch);
  std::string s;
  if (!pick) {
    s = where + " runs none of its " + d.scheme + " MoE backends for this layer";
  } else {
    s = where + " would run " + pick->backend;
    if (pick->moepack_writes) {
      s += " (moepack's " + pick->layout + " layout)";
      if (!pick->kernel_fails.empty())
        s += ", whose kernel fails on this layer (its oracle checks no shape): " +
             pick->kernel_fails.front();
    } else {
      s += ", which reads " + pick->reads;
      s += pick->layout.empty() ? ": there is nothing to convert, serve the checkpoint as it is"
                                : "; moepack has no " + pick->layout + " layout yet";
      if (pick->layout.empty() && !pick->moe_backend.empty())
        s += " (--moe-backend " + pick->moe_backend + ")";
    }
  }
  if (d.chosen.empty()) {
    // An order whose `auto` writes only vLLM's pick: what --backend can still write.
    for (const auto& v : d.vllm_order)
      if (&v != pick && v.moepack_writes && v.vllm_runs)
        return s + "; --backend " + v.layout + " writes " + v.backend + "'s layout instead" +
               (v.moe_backend.empty()
                    ? ""
                    : ", which that vLLM runs with --moe-backend " + v.moe_backend);
    return s;
  }
  const bool asked = q.requested != "auto";
  if (pick && !pick->moepack_writes && !pick->layout.empty() && !asked)
    s += " and writes " + d.chosen;
  else
    s += "; moepack writes " + d.chosen + (asked ? " (--backend " + d.chosen + ")" : "");
  for (const auto& v : d.vllm_order)
    if (v.moepack_writes && v.layout == d.chosen && !v.moe_backend.empty())
      return s + ", which that vLLM runs with --moe-backend " + v.moe_backend;
  return s;
}

}  // namespace

OracleDecision choose_backend(const OracleQuery& q, const std::vector<TargetLayout>& layouts,
                              const std::vector<VllmTargetRow>& targets) {
  OracleDecision d;
  d.scheme = scheme_of(q.quant.method);
  const SourceCodec* codec = find_source_codec(q.quant.method);
  if (q.requested != "auto" && !find_layout(layouts, q.requested)) {
    std::string names;
    for (const auto& t : layouts) names += std::string(", ") + t.name;
    throw Error(ErrorCode::kUsage, "unknown --backend \"" + q.requested + "\" (auto" + names + ")");
  }
  const VllmTargetRow& target = find_target(targets, q.vllm_target);
  const VllmBackendOrder* order = codec ? vllm_backend_order(target, d.scheme, q.arch) : nullptr;
  LayoutOptions opts = LayoutOptions::for_layer(
      q.quant.method, q.act_dtype, q.gated, q.vllm_w13_scale_size_k, q.vllm_target, "", q.inter, 1);
  opts.target_arch = q.arch;
  const Judge judge{
      q, d.scheme, codec != nullptr,
      codec && codec->refusals ? codec->refusals(q.quant) : std::vector<std::string>{}, opts,
      // The layer as every candidate judges it (only candidates exist when a codec reads it).
      codec ? moe_shape_for(q.quant, std::max<int64_t>(1, q.experts), q.hidden, q.inter, q.gated,
                            q.act_order_w13, q.act_order_w2)
            : MoeShape{}};

  // What the target vLLM would run: the first backend of its order that runs here.
  const VllmOrderVerdict* pick = nullptr;
  if (order) {
    d.vllm_order = judge_vllm_order(*order, target, judge, layouts);
    d.vllm_order_source = order->source;
    for (const auto& v : d.vllm_order)
      if (v.vllm_runs) {
        pick = &v;
        break;
      }
  }

  if (q.requested != "auto")
    d.verdicts = {judge(*find_layout(layouts, q.requested))};
  else if (order && order->auto_writes_only_vllm_pick)
    d.verdicts = vllm_pick_verdicts(*order, d.vllm_order, layouts, judge, target);
  else
    d.verdicts = auto_verdicts(order, layouts, judge);
  for (const auto& v : d.verdicts)
    if (v.supported) {
      d.chosen = v.backend;
      break;
    }
  if (pick)
    d.vllm_would_pick = pick->moepack_writes         ? pick->layout
                        : !pick->moe_backend.empty() ? pick->moe_backend
                                                     : pick->backend;
  d.vllm_note = vllm_note(d, pick, target, q);
  return d;
}

nlohmann::json OracleDecision::to_json() const {
  using nlohmann::json;
  auto string_or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json j;
  j["scheme"] = scheme;
  j["chosen"] = string_or_null(chosen);
  j["vllm_would_pick"] = string_or_null(vllm_would_pick);
  if (!vllm_note.empty()) j["vllm_note"] = vllm_note;
  j["candidates"] = json::array();
  for (const auto& v : verdicts)
    j["candidates"].push_back(
        {{"backend", v.backend}, {"supported", v.supported}, {"reasons", v.reasons}});
  j["vllm_order"] = json::array();
  for (const auto& v : vllm_order) {
    j["vllm_order"].push_back({{"backend", v.backend},
                               {"moe_backend", string_or_null(v.moe_backend)},
                               {"layout", string_or_null(v.layout)},
                               {"moepack_writes", v.moepack_writes},
                               {"vllm_runs", v.vllm_runs},
                               {"reads", v.reads},
                               {"reasons", v.reasons}});
    if (!v.kernel_fails.empty()) j["vllm_order"].back()["kernel_fails"] = v.kernel_fails;
  }
  j["vllm_order_source"] = string_or_null(vllm_order_source);
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
  if (!vllm_order.empty()) {
    // vLLM's names; [layout] where moepack writes it, (x) where vLLM would not run it here.
    s << "  vLLM's order:";
    for (size_t i = 0; i < vllm_order.size(); ++i) {
      const auto& v = vllm_order[i];
      s << (i ? ", " : " ") << v.backend;
      if (v.moepack_writes) s << " [" << v.layout << "]";
      if (!v.vllm_runs) s << " (x)";
      if (!v.kernel_fails.empty()) s << " (picked; its kernel fails here)";
    }
    s << "\n    (" << vllm_order_source << ")\n";
  }
  if (!vllm_note.empty())
    s << "  vLLM's own oracle would pick " << (vllm_would_pick.empty() ? "none" : vllm_would_pick)
      << ": " << vllm_note << "\n";
  return s.str();
}

}  // namespace moepack
