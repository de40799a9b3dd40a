#include "verify/verify_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace moepack {
namespace {

std::string sci(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3e", v);
  return buf;
}

nlohmann::json number(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

template <typename T, typename Pred>
int64_t count_if(const std::vector<T>& v, Pred p) {
  return static_cast<int64_t>(std::count_if(v.begin(), v.end(), p));
}

// The worst expert of a layer (largest error; non-finite counts as largest), or -1.
int64_t worst_expert(const LayerResult& l) {
  int64_t best = -1;
  double worst = -1.0;
  for (size_t e = 0; e < l.expert_max_abs_err.size(); ++e) {
    const double v = std::isnan(l.expert_max_abs_err[e]) ? std::numeric_limits<double>::infinity()
                                                         : l.expert_max_abs_err[e];
    if (v > worst) {
      worst = v;
      best = static_cast<int64_t>(e);
    }
  }
  return best;
}

std::string mismatch_text(const RoundTripMismatch& m) {
  std::ostringstream s;
  if (m.layer >= 0) s << "layer " << m.layer << " ";
  if (m.expert >= 0) s << "expert " << m.expert << " ";
  s << m.tensor << " [" << m.index << "]: got " << m.got << ", want " << m.want;
  return s.str();
}

nlohmann::json mismatch_json(const RoundTripMismatch& m) {
  return nlohmann::json{{"layer", m.layer}, {"expert", m.expert}, {"tensor", m.tensor},
                        {"index", m.index}, {"got", m.got},       {"want", m.want}};
}

// ---- HTML helpers ----

const char* kCss = R"css(
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1d1d1f;background:#fff}
h1{font-size:1.4em;margin:0 0 8px}h2{font-size:1.1em;margin:24px 0 8px}
.pass{color:#0a7d2c;font-weight:600}.fail{color:#c0161b;font-weight:600}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
.badge.pass{background:#0a7d2c;color:#fff}.badge.fail{background:#c0161b;color:#fff}
table{border-collapse:collapse;font-size:13px;margin:4px 0 12px}
th,td{border:1px solid #d0d0d5;padding:3px 8px;text-align:left}
th{background:#f2f2f5}td.num{text-align:right;font-variant-numeric:tabular-nums;font-family:ui-monospace,Menlo,Consolas,monospace}
tr.failrow td{background:#fdecec}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:13px}
dl.meta dt{font-weight:600}dl.meta dd{margin:0;font-family:ui-monospace,Menlo,Consolas,monospace}
.chart{margin:8px 0 16px;overflow-x:auto}
.note{font-size:13px;color:#555}
)css";

std::string status_cell(bool passed) {
  return passed ? "<td class=\"pass\">PASS</td>" : "<td class=\"fail\">FAIL</td>";
}

// log10 of a positive value clamped into [lo, hi].
double log_clamped(double v, double lo, double hi) {
  if (!(v > 0.0)) return lo;
  if (!std::isfinite(v)) return hi;
  return std::min(hi, std::max(lo, std::log10(v)));
}

// Bounds (in log10) of the positive finite values of `values`, widened to whole decades.
void log_range(const std::vector<double>& values, double* lo, double* hi) {
  double mn = std::numeric_limits<double>::infinity(), mx = -mn;
  for (double v : values) {
    if (v > 0.0 && std::isfinite(v)) {
      mn = std::min(mn, v);
      mx = std::max(mx, v);
    }
  }
  if (!std::isfinite(mn)) {
    *lo = -9.0;
    *hi = 0.0;
    return;
  }
  *lo = std::floor(std::log10(mn));
  *hi = std::ceil(std::log10(mx));
  if (*hi <= *lo) *hi = *lo + 1.0;
}

// Light yellow (t = 0) to dark red (t = 1).
std::string heat_color(double t) {
  t = std::min(1.0, std::max(0.0, t));
  const double r0 = 255, g0 = 245, b0 = 200, r1 = 140, g1 = 0, b1 = 20;
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", static_cast<int>(r0 + (r1 - r0) * t + 0.5),
                static_cast<int>(g0 + (g1 - g0) * t + 0.5),
                static_cast<int>(b0 + (b1 - b0) * t + 0.5));
  return buf;
}

std::string fmt(double v, int precision = 1) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

// Bar chart: normalised error per layer on a log axis, with the tolerance as a dashed line.
std::string norm_err_chart(const VerifyReport& r) {
  if (r.layers.empty()) return "";
  std::vector<double> values;
  for (const auto& l : r.layers) values.push_back(l.norm_err);
  for (const auto& l : r.layers) values.push_back(l.tolerance);
  double lo, hi;
  log_range(values, &lo, &hi);
  const double left = 60, top = 10, plot_h = 200, bottom = 40;
  const double bar_w = std::max(4.0, std::min(24.0, 900.0 / static_cast<double>(r.layers.size())));
  const double plot_w = bar_w * static_cast<double>(r.layers.size());
  // Room on the right for the tolerance label, which would otherwise cover the axis labels of a
  // narrow (few-layer) chart.
  const double width = left + plot_w + 120, height = top + plot_h + bottom;
  auto y_of = [&](double v) { return top + plot_h * (hi - log_clamped(v, lo, hi)) / (hi - lo); };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << fmt(width, 0) << "\" height=\""
    << fmt(height, 0) << "\" role=\"img\" aria-label=\"normalised error per layer\">";
  s << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << fmt(plot_w) << "\" height=\""
    << plot_h << "\" fill=\"#fafafa\" stroke=\"#ccc\"/>";
  for (double d = lo; d <= hi + 1e-9; d += 1.0) {
    const double y = top + plot_h * (hi - d) / (hi - lo);
    s << "<line x1=\"" << left << "\" x2=\"" << fmt(left + plot_w) << "\" y1=\"" << fmt(y)
      << "\" y2=\"" << fmt(y) << "\" stroke=\"#e4e4e8\"/>";
    s << "<text x=\"" << left - 4 << "\" y=\"" << fmt(y + 4)
      << "\" font-size=\"10\" text-anchor=\"end\">1e" << static_cast<int>(d) << "</text>";
  }
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const LayerResult& l = r.layers[i];
    const double x = left + bar_w * static_cast<double>(i);
    // At least 1 px high, so a zero error is still a visible bar.
    const double y = std::min(
        top + plot_h - 1.0,
        y_of(std::isnan(l.norm_err) ? std::numeric_limits<double>::infinity() : l.norm_err));
    s << "<rect x=\"" << fmt(x + 1) << "\" y=\"" << fmt(y) << "\" width=\"" << fmt(bar_w - 2)
      << "\" height=\"" << fmt(top + plot_h - y) << "\" fill=\""
      << (l.passed ? "#3a9d5d" : "#d23a3a") << "\"><title>layer " << l.layer << ": norm_err "
      << sci(l.norm_err) << ", max_abs_err " << sci(l.max_abs_err) << "</title></rect>";
    if (r.layers.size() <= 64 || i % 4 == 0)
      s << "<text x=\"" << fmt(x + bar_w / 2) << "\" y=\"" << fmt(top + plot_h + 12)
        << "\" font-size=\"9\" text-anchor=\"middle\">" << l.layer << "</text>";
  }
  // One tolerance line per distinct tolerance (normally one).
  std::vector<double> tols;
  for (const auto& l : r.layers)
    if (std::find(tols.begin(), tols.end(), l.tolerance) == tols.end()) tols.push_back(l.tolerance);
  for (double t : tols) {
    const double y = y_of(t);
    s << "<line x1=\"" << left << "\" x2=\"" << fmt(left + plot_w) << "\" y1=\"" << fmt(y)
      << "\" y2=\"" << fmt(y) << "\" stroke=\"#c0161b\" stroke-dasharray=\"4 3\"/>";
    s << "<text x=\"" << fmt(left + plot_w + 4) << "\" y=\"" << fmt(y + 3)
      << "\" font-size=\"10\" text-anchor=\"start\" fill=\"#c0161b\">tolerance " << sci(t)
      << "</text>";
  }
  s << "<text x=\"" << fmt(left + plot_w / 2) << "\" y=\"" << fmt(height - 6)
    << "\" font-size=\"11\" text-anchor=\"middle\">layer</text>";
  s << "<text x=\"12\" y=\"" << fmt(top + plot_h / 2)
    << "\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 12 "
    << fmt(top + plot_h / 2) << ")\">norm error</text>";
  s << "</svg>";
  return s.str();
}

// Heat map: max abs error per layer (row) x expert (column), log colour scale.
std::string expert_heatmap(const VerifyReport& r) {
  size_t experts = 0;
  for (const auto& l : r.layers) experts = std::max(experts, l.expert_max_abs_err.size());
  if (r.layers.empty() || experts == 0) return "";
  std::vector<double> values;
  for (const auto& l : r.layers)
    for (size_t e = 0; e < l.expert_max_abs_err.size(); ++e)
      if (e < l.expert_tokens.size() && l.expert_tokens[e] > 0)
        values.push_back(l.expert_max_abs_err[e]);
  double lo, hi;
  log_range(values, &lo, &hi);
  const double cell = std::max(3.0, std::min(14.0, 1000.0 / static_cast<double>(experts)));
  const double row_h = std::max(6.0, std::min(14.0, 600.0 / static_cast<double>(r.layers.size())));
  const double left = 60, top = 24, legend_h = 50;
  const double plot_w = cell * static_cast<double>(experts);
  const double plot_h = row_h * static_cast<double>(r.layers.size());
  const double width = std::max(left + plot_w + 20, 420.0), height = top + plot_h + legend_h;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << fmt(width, 0) << "\" height=\""
    << fmt(height, 0) << "\" role=\"img\" aria-label=\"max abs error per layer and expert\">";
  s << "<text x=\"" << left << "\" y=\"14\" font-size=\"11\">expert 0 .. " << experts - 1
    << " (grey: no routed tokens, black: non-finite)</text>";
  for (size_t i = 0; i < r.layers.size(); ++i) {
    const LayerResult& l = r.layers[i];
    const double y = top + row_h * static_cast<double>(i);
    if (r.layers.size() <= 64 || i % 4 == 0)
      s << "<text x=\"" << left - 4 << "\" y=\"" << fmt(y + row_h - 1)
        << "\" font-size=\"9\" text-anchor=\"end\">" << l.layer << "</text>";
    for (size_t e = 0; e < l.expert_max_abs_err.size(); ++e) {
      const double v = l.expert_max_abs_err[e];
      const int64_t n = e < l.expert_tokens.size() ? l.expert_tokens[e] : 0;
      std::string color;
      if (n == 0) {
        color = "#e6e6ea";
      } else if (!std::isfinite(v)) {
        color = "#000000";
      } else {
        color = heat_color((log_clamped(v, lo, hi) - lo) / (hi - lo));
      }
      s << "<rect x=\"" << fmt(left + cell * static_cast<double>(e)) << "\" y=\"" << fmt(y)
        << "\" width=\"" << fmt(cell) << "\" height=\"" << fmt(row_h) << "\" fill=\"" << color
        << "\"><title>layer " << l.layer << " expert " << e << ": " << n << " tokens, max abs err "
        << sci(v) << "</title></rect>";
    }
  }
  // Legend.
  const double ly = top + plot_h + 14, lw = 200;
  for (int i = 0; i < 20; ++i)
    s << "<rect x=\"" << fmt(left + lw * i / 20.0) << "\" y=\"" << fmt(ly) << "\" width=\""
      << fmt(lw / 20.0 + 0.5) << "\" height=\"10\" fill=\"" << heat_color(i / 19.0) << "\"/>";
  s << "<text x=\"" << left << "\" y=\"" << fmt(ly + 24) << "\" font-size=\"10\">1e"
    << static_cast<int>(lo) << "</text>";
  s << "<text x=\"" << fmt(left + lw) << "\" y=\"" << fmt(ly + 24)
    << "\" font-size=\"10\" text-anchor=\"end\">1e" << static_cast<int>(hi) << "</text>";
  s << "<text x=\"" << fmt(left + lw + 10) << "\" y=\"" << fmt(ly + 9)
    << "\" font-size=\"10\">max abs error of the expert's output</text>";
  s << "</svg>";
  return s.str();
}

}  // namespace

RoundTripMismatch RoundTripMismatch::bytes(int64_t layer, int64_t expert, std::string tensor,
                                           int64_t index, uint8_t got, uint8_t want) {
  char g[8], w[8];
  std::snprintf(g, sizeof(g), "0x%02x", got);
  std::snprintf(w, sizeof(w), "0x%02x", want);
  RoundTripMismatch m;
  m.layer = layer;
  m.expert = expert;
  m.tensor = std::move(tensor);
  m.index = index;
  m.got = g;
  m.want = w;
  return m;
}

LayerResult make_layer_result(int64_t layer, const std::string& backend, int64_t tokens, int top_k,
                              const ref::MoeComparison& c, double tolerance) {
  LayerResult l;
  l.layer = layer;
  l.backend = backend;
  l.tokens = tokens;
  l.top_k = top_k;
  l.max_abs_err = c.max_abs_err;
  l.norm_err = c.norm_err;
  l.ref_norm = c.ref_norm;
  l.tolerance = tolerance;
  l.passed = c.finite && std::isfinite(c.norm_err) && c.norm_err <= tolerance;
  l.expert_max_abs_err = c.expert_max_abs_err;
  l.expert_tokens = c.expert_tokens;
  return l;
}

void VerifyReport::finalize() {
  const bool any = !integrity.empty() || !round_trip.empty() || !layers.empty();
  passed = any &&
           std::all_of(integrity.begin(), integrity.end(), [](auto& c) { return c.passed; }) &&
           std::all_of(round_trip.begin(), round_trip.end(), [](auto& c) { return c.passed; }) &&
           std::all_of(layers.begin(), layers.end(), [](auto& c) { return c.passed; });
}

std::string render_text(const VerifyReport& r) {
  std::ostringstream s;
  s << "moepack verify: " << (r.passed ? "PASSED" : "FAILED") << "\n";
  if (!r.source.empty()) s << "  source:      " << r.source << "\n";
  if (!r.destination.empty()) s << "  destination: " << r.destination << "\n";
  if (!r.backend.empty()) s << "  backend:     " << r.backend << "\n";
  if (!r.model.empty()) s << "  model:       " << r.model << "\n";
  if (!r.router.empty())
    s << "  router:      " << r.router << ", experts' activation " << r.activation << "\n";

  const int64_t ip = count_if(r.integrity, [](const auto& c) { return c.passed; });
  s << "integrity: " << ip << "/" << r.integrity.size() << " passed\n";
  for (const auto& c : r.integrity)
    if (!c.passed) s << "  FAIL " << c.name << (c.detail.empty() ? "" : ": " + c.detail) << "\n";

  const int64_t rp = count_if(r.round_trip, [](const auto& c) { return c.passed; });
  s << "round trip: " << rp << "/" << r.round_trip.size() << " passed\n";
  for (const auto& c : r.round_trip) {
    if (c.passed) continue;
    s << "  FAIL " << c.name << ": " << c.mismatches << " of " << c.compared << " differ";
    if (c.first_mismatch) s << "; first at " << mismatch_text(*c.first_mismatch);
    s << "\n";
  }

  const int64_t lp = count_if(r.layers, [](const auto& c) { return c.passed; });
  if (r.numerical_skipped)
    s << "numerical: SKIPPED (--skip-numerical): no MoE output was computed"
      << (r.skipped_because.empty() ? "" : "; " + r.skipped_because) << "\n";
  else
    s << "numerical: " << lp << "/" << r.layers.size() << " layers passed (" << r.tokens
      << " tokens, seed " << r.seed << ", tolerance " << sci(r.tolerance) << ")\n";
  if (!r.layers.empty()) {
    char line[160];
    std::snprintf(line, sizeof(line), "  %6s  %-16s %12s %12s %14s  %s\n", "layer", "backend",
                  "max_abs_err", "norm_err", "worst expert", "status");
    s << line;
    for (const auto& l : r.layers) {
      const int64_t we = worst_expert(l);
      const std::string worst = we < 0 ? "-" : std::to_string(we);
      std::snprintf(line, sizeof(line), "  %6lld  %-16s %12s %12s %14s  %s\n",
                    static_cast<long long>(l.layer), l.backend.c_str(), sci(l.max_abs_err).c_str(),
                    sci(l.norm_err).c_str(), worst.c_str(), l.passed ? "ok" : "FAIL");
      s << line;
    }
  }
  for (const auto& n : r.notes) s << "note: " << n << "\n";
  return s.str();
}

nlohmann::json to_json(const VerifyReport& r) {
  nlohmann::json j;
  j["passed"] = r.passed;
  j["tool_version"] = r.tool_version;
  j["source"] = r.source;
  j["destination"] = r.destination;
  j["backend"] = r.backend;
  j["model"] = r.model;
  j["seed"] = r.seed;
  j["tokens"] = r.tokens;
  j["tolerance"] = number(r.tolerance);

  nlohmann::json integrity = nlohmann::json::array();
  for (const auto& c : r.integrity)
    integrity.push_back({{"name", c.name}, {"passed", c.passed}, {"detail", c.detail}});
  j["integrity"] = integrity;

  nlohmann::json round_trip = nlohmann::json::array();
  for (const auto& c : r.round_trip) {
    round_trip.push_back({{"name", c.name},
                          {"passed", c.passed},
                          {"compared", c.compared},
                          {"mismatches", c.mismatches},
                          {"first_mismatch", c.first_mismatch ? mismatch_json(*c.first_mismatch)
                                                              : nlohmann::json(nullptr)}});
  }
  j["round_trip"] = round_trip;

  nlohmann::json layers = nlohmann::json::array();
  double worst_norm = 0.0;
  int64_t worst_layer = -1;
  for (const auto& l : r.layers) {
    nlohmann::json errs = nlohmann::json::array();
    for (double v : l.expert_max_abs_err) errs.push_back(number(v));
    layers.push_back({{"layer", l.layer},
                      {"backend", l.backend},
                      {"tokens", l.tokens},
                      {"top_k", l.top_k},
                      {"max_abs_err", number(l.max_abs_err)},
                      {"norm_err", number(l.norm_err)},
                      {"ref_norm", number(l.ref_norm)},
                      {"tolerance", number(l.tolerance)},
                      {"passed", l.passed},
                      {"worst_expert", worst_expert(l)},
                      {"expert_max_abs_err", errs},
                      {"expert_tokens", l.expert_tokens}});
    const double v = std::isnan(l.norm_err) ? std::numeric_limits<double>::infinity() : l.norm_err;
    if (worst_layer < 0 || v > worst_norm) {
      worst_norm = v;
      worst_layer = l.layer;
    }
  }
  j["layers"] = layers;
  j["notes"] = r.notes;
  j["numerical_skipped"] = r.numerical_skipped;
  j["router"] = r.router;
  j["activation"] = r.activation;
  if (r.numerical_skipped) j["numerical_skipped_because"] = r.skipped_because;
  j["summary"] = {
      {"integrity_passed", count_if(r.integrity, [](const auto& c) { return c.passed; })},
      {"integrity_total", static_cast<int64_t>(r.integrity.size())},
      {"round_trip_passed", count_if(r.round_trip, [](const auto& c) { return c.passed; })},
      {"round_trip_total", static_cast<int64_t>(r.round_trip.size())},
      {"layers_passed", count_if(r.layers, [](const auto& c) { return c.passed; })},
      {"layers_total", static_cast<int64_t>(r.layers.size())},
      {"worst_layer", worst_layer},
      {"worst_norm_err", worst_layer < 0 ? nlohmann::json(nullptr) : number(worst_norm)}};
  return j;
}

std::string html_escape(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (char c : in) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_html(const VerifyReport& r) {
  const auto esc = html_escape;
  std::ostringstream s;
  s << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<title>moepack verify: " << (r.passed ? "PASSED" : "FAILED")
    << (r.artifact_identity.empty() ? "" : " - " + esc(r.artifact_identity)) << "</title>\n<style>"
    << kCss << "</style>\n</head>\n<body>\n";
  s << "<h1>moepack verify <span class=\"badge " << (r.passed ? "pass" : "fail") << "\">"
    << (r.passed ? "PASSED" : "FAILED") << "</span></h1>\n";
  s << "<dl class=\"meta\">";
  auto meta = [&](const char* k, const std::string& v) {
    if (!v.empty()) s << "<dt>" << k << "</dt><dd>" << esc(v) << "</dd>";
  };
  meta("artifact", r.artifact_identity);
  meta("source", r.source_identity);
  meta("backend", r.backend);
  meta("model", r.model);
  meta("tool version", r.tool_version);
  meta("hidden states", std::to_string(r.tokens) + " tokens, seed " + std::to_string(r.seed));
  meta("tolerance", sci(r.tolerance) + " (normalised error)");
  s << "</dl>\n";

  const int64_t ip = count_if(r.integrity, [](const auto& c) { return c.passed; });
  s << "<h2>Integrity: " << ip << "/" << r.integrity.size() << " passed</h2>\n";
  if (!r.integrity.empty()) {
    s << "<table><tr><th>check</th><th>status</th><th>detail</th></tr>\n";
    for (const auto& c : r.integrity)
      s << "<tr" << (c.passed ? "" : " class=\"failrow\"") << "><td>" << esc(c.name) << "</td>"
        << status_cell(c.passed) << "<td>" << esc(c.detail) << "</td></tr>\n";
    s << "</table>\n";
  }

  const int64_t rp = count_if(r.round_trip, [](const auto& c) { return c.passed; });
  s << "<h2>Round trip: " << rp << "/" << r.round_trip.size() << " passed</h2>\n";
  if (!r.round_trip.empty()) {
    s << "<table><tr><th>check</th><th>status</th><th>compared</th><th>mismatches</th>"
      << "<th>first mismatch</th></tr>\n";
    for (const auto& c : r.round_trip)
      s << "<tr" << (c.passed ? "" : " class=\"failrow\"") << "><td>" << esc(c.name) << "</td>"
        << status_cell(c.passed) << "<td class=\"num\">" << c.compared << "</td><td class=\"num\">"
        << c.mismatches << "</td><td>"
        << (c.first_mismatch ? esc(mismatch_text(*c.first_mismatch)) : "") << "</td></tr>\n";
    s << "</table>\n";
  }

  const int64_t lp = count_if(r.layers, [](const auto& c) { return c.passed; });
  if (r.numerical_skipped)
    s << "<h2>Numerical: SKIPPED</h2>\n<p class=\"note\">--skip-numerical: no MoE output was "
         "computed"
      << esc(r.skipped_because.empty() ? "" : "; " + r.skipped_because) << ".</p>\n";
  else
    s << "<h2>Numerical: " << lp << "/" << r.layers.size() << " layers passed</h2>\n";
  if (!r.layers.empty()) {
    s << "<p class=\"note\">Each MoE layer is evaluated on the same random hidden states with the "
         "model's router: reference = dequantised source weights in double; backend = the "
         "kernel layout's per-expert matmul in float. norm_err = ||out - ref|| / ||ref||.</p>\n";
    s << "<div class=\"chart\">" << norm_err_chart(r) << "</div>\n";
    s << "<table id=\"layers\"><tr><th>layer</th><th>backend</th><th>tokens</th><th>top_k</th>"
      << "<th>max abs err</th><th>norm err</th><th>tolerance</th><th>worst expert</th>"
      << "<th>experts hit</th><th>status</th></tr>\n";
    for (const auto& l : r.layers) {
      const int64_t we = worst_expert(l);
      const int64_t hit = count_if(l.expert_tokens, [](int64_t n) { return n > 0; });
      s << "<tr" << (l.passed ? "" : " class=\"failrow\"") << "><td class=\"num\">" << l.layer
        << "</td><td>" << esc(l.backend) << "</td><td class=\"num\">" << l.tokens
        << "</td><td class=\"num\">" << l.top_k << "</td><td class=\"num\">" << sci(l.max_abs_err)
        << "</td><td class=\"num\">" << sci(l.norm_err) << "</td><td class=\"num\">"
        << sci(l.tolerance) << "</td><td class=\"num\">"
        << (we < 0 ? std::string("-")
                   : std::to_string(we) + " (" +
                         sci(l.expert_max_abs_err[static_cast<size_t>(we)]) + ")")
        << "</td><td class=\"num\">" << hit << "/" << l.expert_tokens.size() << "</td>"
        << status_cell(l.passed) << "</tr>\n";
    }
    s << "</table>\n";
    const std::string heat = expert_heatmap(r);
    if (!heat.empty()) {
      s << "<h2>Max abs error by layer and expert</h2>\n<div class=\"chart\">" << heat
        << "</div>\n";
    }
  }
  if (!r.notes.empty()) {
    s << "<h2>Notes</h2>\n<ul>";
    for (const auto& n : r.notes) s << "<li>" << esc(n) << "</li>";
    s << "</ul>\n";
  }
  s << "</body>\n</html>\n";
  return s.str();
}

}  // namespace moepack
