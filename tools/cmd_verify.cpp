// moepack verify DST [--source SRC] [--tokens 64] [--seed 0] [--tolerance 1e-3]
//                [--device cpu|cuda] [--chunk-size 1GiB] [--report FILE.html] [--json]
#include <fstream>
#include <iostream>

#include "core/error.h"
#include "tools/cli.h"
#include "tools/flags.h"
#include "verify/verify.h"

namespace moepack::cli {

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
      ->capture_default_str();
  app.add_option("--seed", o->seed, "Seed of the hidden states")->capture_default_str();
  app.add_option("--tolerance", o->tolerance, "Normalised error tolerance per layer")
      ->capture_default_str();
  app.add_option("--device", o->device, "cpu|cuda")->capture_default_str();
  app.add_option("--threads", o->threads, "Worker threads (0: all cores)")->capture_default_str();
  app.add_option("--chunk-size", *chunk,
                 "Experts of a layer checked at once, as canonical bytes (as convert's: bounds "
                 "memory for very large layers; the verdict does not depend on it)")
      ->capture_default_str();
  app.add_option("--report", *report, "Write a self-contained HTML report");
  return [o, report, chunk, &g] {
    o->chunk_bytes = parse_size("--chunk-size", *chunk);
    o->dst = resolve_checkpoint_arg(o->dst, g);
    if (!o->source.empty()) o->source = resolve_checkpoint_arg(o->source, g);
    const VerifyReport r = run_verify(*o);
    if (!report->empty()) {
      std::ofstream f(*report);
      f << render_html(r);
      if (!f) throw Error(ErrorCode::kIo, *report, "", "cannot write the report");
    }
    if (g.json) {
      auto j = to_json(r);
      j["ok"] = r.passed;
      print_json(j);
    } else {
      std::cout << render_text(r);
    }
    return r.passed ? 0 : static_cast<int>(ExitCode::kVerifyFailed);
  };
}

}  // namespace moepack::cli
