// moepack synth OUT --format F [--family qwen3|mixtral|deepseek|fused3d|gpt_oss] [...]
#include <iostream>

#include "synth/synth.h"
#include "tools/cli.h"
#include "tools/flags.h"

namespace moepack::cli {

Runner add_synth(CLI::App& app, Globals& g) {
  auto o = std::make_shared<SynthOptions>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("bf16");
  auto shard = std::make_shared<std::string>("5GB");
  std::string formats, families;
  for (const auto& f : synth_formats()) formats += (formats.empty() ? "" : "|") + f;
  for (const auto& f : synth_families()) families += (families.empty() ? "" : "|") + f;
  app.add_option("out", *out, "Output directory")->required();
  app.add_option("--format", o->format, formats)->required();
  app.add_option("--family", o->family,
                 families + " (default: gpt_oss for gpt-oss-mxfp4, qwen3 for the rest)");
  app.add_option("--layers", o->layers, "Decoder layers")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--experts", o->experts, "Routed experts per MoE layer")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--hidden", o->hidden, "Hidden size H")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--inter", o->inter, "Expert intermediate size I")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--group-size", o->group_size,
                 "Quantisation group size (0: format default, -1: channel)")
      ->capture_default_str();
  app.add_option("--bits", o->bits, "Bits for integer formats (0: format default)")
      ->capture_default_str();
  app.add_option("--top-k", o->top_k, "Experts per token")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--vocab", o->vocab, "Vocabulary size")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--seed", o->seed, "Random seed")->capture_default_str();
  app.add_option("--dtype", *dtype, "Model dtype fp16|bf16")->capture_default_str();
  app.add_option("--max-shard-size", *shard, "Shard size limit (e.g. 5GB, 200MB)")
      ->capture_default_str();
  app.add_option("--threads", o->threads,
                 "Worker threads (0: the CPUs this process may use: affinity and cgroup quota)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_flag("--force", o->force, "Replace an existing output directory");
  return [o, out, dtype, shard, &g] {
    o->dtype = parse_half_dtype("--dtype", *dtype);
    o->max_shard_bytes = parse_size("--max-shard-size", *shard);
    CommandRun run(g.progress, stderr_is_terminal(), g.json, "synth");
    o->progress = run.fn();
    const SynthResult r = synth_checkpoint(*out, *o);
    RunSummary sum = run.finish();
    sum.what = "no source -> " + human_bytes(r.bytes) + " written";
    sum.output_bytes = sum.rate_bytes = r.bytes;
    sum.verdict = "written";
    if (g.json) {
      print_json({{"ok", true},
                  {"dir", r.dir},
                  {"format", o->format},
                  {"family", r.family},
                  {"tensors", r.tensors},
                  {"tensor_bytes", r.bytes},
                  {"shards", r.shards},
                  {"run", summary_json(sum)}});
      return 0;
    }
    std::cout << "wrote " << r.dir << ": " << o->format << " " << r.family << ", " << r.tensors
              << " tensors, " << human_bytes(r.bytes) << " in " << r.shards << " shard(s)\n"
              << summary_line(sum);
    return 0;
  };
}

}  // namespace moepack::cli
