// The verify report: pass/fail logic, stable JSON keys, text summary, and a self-contained,
// escaped HTML page with the layer table and the SVG charts.
#include "verify/verify_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

namespace moepack {
namespace {

std::set<std::string> keys_of(const nlohmann::json& j) {
  std::set<std::string> k;
  for (auto it = j.begin(); it != j.end(); ++it) k.insert(it.key());
  return k;
}

size_t count_of(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

LayerResult layer(int64_t index, double norm_err, std::vector<double> expert_err,
                  std::vector<int64_t> expert_tokens) {
  ref::MoeComparison c;
  c.max_abs_err = norm_err * 10;
  c.norm_err = norm_err;
  c.ref_norm = 3.0;
  c.finite = std::isfinite(norm_err);
  c.expert_max_abs_err = std::move(expert_err);
  c.expert_tokens = std::move(expert_tokens);
  return make_layer_result(index, "marlin", 64, 2, c, 1e-3);
}

VerifyReport sample_report() {
  VerifyReport r;
  r.tool_version = "0.1.0";
  r.source = "/models/src <a&b>";
  r.destination = "/models/dst \"quoted\" 'x'";
  r.source_identity = "fingerprint <a&b>";
  r.artifact_identity = "moepack.json \"quoted\" 'x'";
  r.backend = "marlin";
  r.model = "<script>alert(1)</script>";
  r.integrity.push_back({"sha256 model.safetensors", true, ""});
  r.integrity.push_back({"manifest", false, "missing key <layout>"});
  RoundTripCheck ok;
  ok.name = "layer 1 w13 codes";
  ok.passed = true;
  ok.compared = 100;
  r.round_trip.push_back(ok);
  RoundTripCheck bad;
  bad.name = "layer 2 w2 scales";
  bad.passed = false;
  bad.compared = 200;
  bad.mismatches = 3;
  bad.first_mismatch = RoundTripMismatch::bytes(2, 5, "w2_scales", 17, 0x3c, 0x3d);
  r.round_trip.push_back(bad);
  r.layers.push_back(layer(1, 2e-7, {1e-6, 0.0, 3e-6, 2e-6}, {10, 0, 60, 58}));
  r.layers.push_back(layer(2, 0.7, {1e-6, 0.9, 3e-6, 2e-6}, {30, 40, 30, 28}));
  r.layers.push_back(layer(3, std::numeric_limits<double>::quiet_NaN(),
                           {1e-6, std::numeric_limits<double>::infinity(), 3e-6, 2e-6},
                           {30, 40, 30, 28}));
  r.notes.push_back("layers 0 is dense & skipped");
  r.finalize();
  return r;
}

TEST(VerifyReport, LayerPassesAtTheTolerance) {
  EXPECT_TRUE(layer(0, 1e-3, {}, {}).passed);
  EXPECT_FALSE(layer(0, 1.0001e-3, {}, {}).passed);
  EXPECT_FALSE(layer(0, std::numeric_limits<double>::infinity(), {}, {}).passed);
  EXPECT_FALSE(layer(0, std::numeric_limits<double>::quiet_NaN(), {}, {}).passed);
  ref::MoeComparison c;
  c.norm_err = 0.0;
  c.finite = false;  // NaN somewhere in the backend output
  EXPECT_FALSE(make_layer_result(0, "x", 1, 1, c, 1e-3).passed);
}

TEST(VerifyReport, FinalizeRequiresEveryCheckAndAtLeastOne) {
  VerifyReport r;
  r.finalize();
  EXPECT_FALSE(r.passed);  // nothing was checked
  r.layers.push_back(layer(0, 1e-7, {1e-7}, {64}));
  r.integrity.push_back({"sha256", true, ""});
  r.finalize();
  EXPECT_TRUE(r.passed);
  r.round_trip.push_back(RoundTripCheck{"w13 codes", false, 1, 1, std::nullopt});
  r.finalize();
  EXPECT_FALSE(r.passed);
  r.round_trip.back().passed = true;
  r.integrity.push_back({"manifest", false, "bad"});
  r.finalize();
  EXPECT_FALSE(r.passed);
  r.integrity.back().passed = true;
  r.layers.push_back(layer(1, 5e-3, {1e-2}, {64}));
  r.finalize();
  EXPECT_FALSE(r.passed);
}

TEST(VerifyReport, JsonHasStableKeys) {
  const VerifyReport r = sample_report();
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(keys_of(j), (std::set<std::string>{
                            "passed", "tool_version", "source", "destination", "backend", "model",
                            "router", "activation", "numerical_skipped", "seed", "tokens",
                            "tolerance", "integrity", "round_trip", "layers", "notes", "summary"}));
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["source"], r.source);
  EXPECT_EQ(keys_of(j["integrity"][0]), (std::set<std::string>{"name", "passed", "detail"}));
  EXPECT_EQ(keys_of(j["round_trip"][1]),
            (std::set<std::string>{"name", "passed", "compared", "mismatches", "first_mismatch"}));
  EXPECT_TRUE(j["round_trip"][0]["first_mismatch"].is_null());
  const nlohmann::json& m = j["round_trip"][1]["first_mismatch"];
  EXPECT_EQ(keys_of(m),
            (std::set<std::string>{"layer", "expert", "tensor", "index", "got", "want"}));
  EXPECT_EQ(m["layer"], 2);
  EXPECT_EQ(m["expert"], 5);
  EXPECT_EQ(m["index"], 17);
  EXPECT_EQ(m["got"], "0x3c");
  EXPECT_EQ(m["want"], "0x3d");
  ASSERT_EQ(j["layers"].size(), 3u);
  EXPECT_EQ(keys_of(j["layers"][0]),
            (std::set<std::string>{"layer", "backend", "tokens", "top_k", "max_abs_err", "norm_err",
                                   "ref_norm", "tolerance", "passed", "worst_expert",
                                   "expert_max_abs_err", "expert_tokens"}));
  EXPECT_TRUE(j["layers"][0]["passed"].get<bool>());
  EXPECT_FALSE(j["layers"][1]["passed"].get<bool>());
  EXPECT_DOUBLE_EQ(j["layers"][1]["norm_err"].get<double>(), 0.7);
  EXPECT_EQ(j["layers"][1]["worst_expert"], 1);
  EXPECT_EQ(j["layers"][0]["expert_tokens"], (std::vector<int64_t>{10, 0, 60, 58}));
  // Non-finite numbers are null (JSON has no NaN/Inf).
  EXPECT_TRUE(j["layers"][2]["norm_err"].is_null());
  EXPECT_TRUE(j["layers"][2]["expert_max_abs_err"][1].is_null());
  EXPECT_EQ(j["layers"][2]["worst_expert"], 1);
  EXPECT_EQ(keys_of(j["summary"]),
            (std::set<std::string>{"integrity_passed", "integrity_total", "round_trip_passed",
                                   "round_trip_total", "layers_passed", "layers_total",
                                   "worst_layer", "worst_norm_err"}));
  EXPECT_EQ(j["summary"]["layers_passed"], 1);
  EXPECT_EQ(j["summary"]["layers_total"], 3);
  EXPECT_EQ(j["summary"]["worst_layer"], 3);  // NaN counts as the worst
  // The dump parses back (valid JSON even with the special characters).
  EXPECT_EQ(nlohmann::json::parse(j.dump()), j);
}

TEST(VerifyReport, TextSummary) {
  const std::string t = render_text(sample_report());
  EXPECT_NE(t.find("moepack verify: FAILED"), std::string::npos);
  EXPECT_NE(t.find("integrity: 1/2 passed"), std::string::npos);
  EXPECT_NE(t.find("FAIL manifest: missing key <layout>"), std::string::npos);
  EXPECT_NE(t.find("round trip: 1/2 passed"), std::string::npos);
  EXPECT_NE(t.find("layer 2 expert 5 w2_scales [17]: got 0x3c, want 0x3d"), std::string::npos);
  EXPECT_NE(t.find("numerical: 1/3 layers passed"), std::string::npos);
  EXPECT_NE(t.find("7.000e-01"), std::string::npos);
  EXPECT_EQ(count_of(t, "FAIL\n"), 2u);  // layers 2 and 3
}

TEST(VerifyReport, HtmlIsSelfContainedAndEscaped) {
  const VerifyReport r = sample_report();
  const std::string h = render_html(r);
  EXPECT_EQ(h.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(h.find("<table id=\"layers\">"), std::string::npos);
  EXPECT_NE(h.find("<svg"), std::string::npos);
  EXPECT_NE(h.find("</html>"), std::string::npos);
  EXPECT_NE(h.find("<style>"), std::string::npos);
  // Escaped user strings; no script or markup injected.
  EXPECT_EQ(h.find("<script"), std::string::npos);
  EXPECT_NE(h.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(h.find("fingerprint &lt;a&amp;b&gt;"), std::string::npos);
  EXPECT_NE(h.find("moepack.json &quot;quoted&quot; &#39;x&#39;"), std::string::npos);
  // The report is a file: it names the artifact and the source by content, never by path.
  EXPECT_EQ(h.find("/models/"), std::string::npos);
  EXPECT_NE(h.find("missing key &lt;layout&gt;"), std::string::npos);
  EXPECT_NE(h.find("dense &amp; skipped"), std::string::npos);
  // No external resources.
  for (const char* bad : {"src=", "href=", "<link", "@import", "url(", "<img", "<iframe"})
    EXPECT_EQ(h.find(bad), std::string::npos) << bad;
  // One layer row per layer, two failing; one heat-map cell per (layer, expert).
  EXPECT_EQ(count_of(h, "<tr class=\"failrow\"><td class=\"num\">"), 2u);
  EXPECT_EQ(count_of(h, "<title>layer "), 3u /*bars*/ + 3u * 4u /*cells*/);
  EXPECT_EQ(count_of(h, "<svg"), 2u);
  EXPECT_EQ(count_of(h, "<svg"), count_of(h, "</svg>"));
  EXPECT_NE(h.find("tolerance 1.000e-03"), std::string::npos);
}

TEST(VerifyReport, HtmlWithoutLayersHasNoCharts) {
  VerifyReport r;
  r.integrity.push_back({"sha256", true, ""});
  r.finalize();
  const std::string h = render_html(r);
  EXPECT_EQ(h.find("<svg"), std::string::npos);
  EXPECT_NE(h.find("PASSED"), std::string::npos);
}

TEST(VerifyReport, HtmlEscape) {
  EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(html_escape(""), "");
}

}  // namespace
}  // namespace moepack
