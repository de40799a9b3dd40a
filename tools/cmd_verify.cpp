// moepack verify DST [--source SRC] [--tokens 64] [--seed 0] [--tolerance 1e-3]
//                [--device cpu|cuda] [--chunk-size 1GiB] [--skip-numerical]
//                [--report FILE.html] [--json]
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "core/error.h"
#include "io/atomic_dir.h"
#include "tools/cli.h"
#include "tools/flags.h"
#include "verify/verify.h"

namespace moepack::cli {

namespace {
// --report FILE: its folder exists and is writable, and FILE is not a directory -- checked before
// a verify that may take minutes (exit 5 naming the path).
void check_report_path(const std::string& report) {
  namespace fs = std::filesystem;
  const fs::path p(report);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorCode::kIo, report, "",
                "cannot write the report: the folder " + dir.string() + " does not exist");
  if (fs::is_directory(p, ec))
    throw Error(ErrorCode::kIo, report, "", "cannot write the report: it is a directory");
  if (::access(dir.c_str(), W_OK) != 0)
    throw Error(ErrorCode::kIo, report, "",
                "cannot write the report: the folder " + dir.string() + " is not writable");
}
}  // namespace

Runner add_verify(CLI::App& app, Globals& g) {
  auto o = std::make_shared<VerifyOptions>();
  auto report = std::make_shared<std::string>();
  auto chunk = std::make_shared<std::string>("1GiB");
  app.add_option("dst", o->dst,
                 "Converted checkpoint directory (or its Hugging Face cache snapshot / hub id)")
      ->required();
  app.add_option(
      "--source", o->source,
      "Source checkpoint (a directory, Hugging Face cache snapshot or hub id, as convert's SRC): "
      "enables the exact round-trip check and the source reference");
  app.add_option("--tokens", o->tokens, "Random hidden states per MoE layer")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--seed", o->seed, "Seed of the hidden states")->capture_default_str();
  app.add_option("--tolerance", o->tolerance, "Normalised error tolerance per layer")
      ->check(real_at_least(0))
      ->capture_default_str();
  app.add_option("--device", o->device, "cpu|cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--threads", o->threads,
                 "Worker threads (0: the CPUs this process may use: affinity and cgroup quota)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_option("--chunk-size", *chunk,
                 "Experts of a layer checked at once, as canonical bytes (as convert's: bounds "
                 "memory for very large layers; the verdict does not depend on it)")
      ->capture_default_str();
  app.add_option("--report", *report, "Write a self-contained HTML report");
  app.add_flag("--skip-numerical", o->skip_numerical,
               "Check integrity and the exact round trip only: no router, activation or MoE "
               "output (for a model whose router or activation moepack cannot compute)");
  return [o, report, chunk, &g] {
    o->chunk_bytes = parse_size("--chunk-size", *chunk);
    o->dst = resolve_checkpoint_arg(o->dst, g);
    if (!o->source.empty()) o->source = resolve_checkpoint_arg(o->source, g);
    if (!report->empty()) check_report_path(*report);  // before the work, not after it
    CommandRun run(g.progress, stderr_is_terminal(), g.json, "verify");
    o->progress = run.fn();
    const VerifyReport r = run_verify(*o);
    RunSummary sum = run.finish();
    const ConvertProgress& last = run.last();
    sum.what = human_bytes(last.bytes_total) + " of expert parameters in " +
               std::to_string(last.layers_total) + " MoE layer(s) checked";
    sum.source_bytes = sum.rate_bytes = last.bytes_total;
    sum.verdict = r.passed ? "PASSED" : "FAILED";
    if (g.json) {
      auto j = to_json(r);
      j["ok"] = r.passed;
      if (!report->empty()) j["report"] = *report;
      j["run"] = summary_json(sum);
      const VerifyTiming& t = r.timing;
      j["run"]["stages"] = {{"lanes", t.lanes},
                            {"read_hash_seconds", t.read_hash_seconds},
                            {"decode_seconds", t.decode_seconds},
                            {"wait_seconds", t.wait_seconds},
                            {"evaluate_seconds", t.evaluate_seconds},
                            {"stage_seconds", t.stage_seconds},
                            {"device_seconds", t.device_seconds}};
      print_json(j);
    } else {
      std::cout << render_text(r) << summary_line(sum);
    }
    // After the verdict is out (a failure here does not hide it), whole or not at all: a full
    // disk leaves no empty or cut report behind.
    if (!report->empty()) write_file_atomically(*report, render_html(r));
    return r.passed ? 0 : static_cast<int>(ExitCode::kVerifyFailed);
  };
}

}  // namespace moepack::cli
