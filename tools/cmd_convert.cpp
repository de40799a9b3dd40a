// moepack convert SRC DST [--backend auto|...] [--target-arch sm90] [--act-dtype bf16|fp16]
//                 [--quantize mxfp8 [--mx-recipe flashinfer|modelopt]] [--threads N] [--writers N]
//                 [--max-shard-size 5GB] [--force] [--dry-run] [--json] [--shard I/N]
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "core/error.h"
#include "model/checkpoint.h"
#include "pipeline/execute.h"
#include "pipeline/parts.h"
#include "pipeline/progress.h"
#include "pipeline/servability.h"
#include "tools/cli.h"
#include "tools/flags.h"

namespace moepack::cli {

namespace {
struct ConvertArgs {
  ConvertOptions o;
  std::string target_arch = target_arch_name(ConvertOptions().target_arch);
  std::string vllm_target = vllm_target_name(ConvertOptions().vllm_target);
  std::string act_dtype = "bf16";
  std::string max_shard = "5GB";
  std::string chunk = "1GiB";
  bool dry_run = false;
  bool require_servable = false;
  std::string placement = "linear";  // --expert-placement
  std::string shard;  // "I/N": convert only unit I of N into DST.parts/I-of-N (pipeline/parts.h)
};

// The options, into `a`: convert's flags and their help text.
void add_convert_options(CLI::App& app, ConvertArgs& a) {
  app.add_option("src", a.o.src,
                 "Source checkpoint directory, a Hugging Face cache snapshot or repo root, or a "
                 "hub id org/name in the local cache")
      ->required();
  app.add_option("dst", a.o.dst, "Output directory (written atomically)")->required();
  app.add_option("--backend", a.o.backend, "auto|" + target_layout_names("|"))
      ->capture_default_str();
  app.add_option("--target-arch", a.target_arch, "Target GPU: " + target_arch_names("|"))
      ->capture_default_str();
  app.add_option("--act-dtype", a.act_dtype,
                 "Serving activation dtype bf16|fp16 (Marlin scales are stored in it)")
      ->capture_default_str();
  std::string formats, recipes;
  for (const auto& r : quantize_recipes()) {
    if (formats.find(r.format) == std::string::npos)
      formats += std::string(formats.empty() ? "" : "|") + r.format;
    recipes += std::string(recipes.empty() ? "" : "|") + r.recipe;
  }
  app.add_option("--quantize", a.o.quantize, "Quantise unquantised experts first: " + formats);
  app.add_option("--mx-recipe", a.o.mx_recipe, "Scale rule of --quantize: " + recipes)
      ->capture_default_str();
  app.add_flag(
      "--vllm-w13-scale-size-k", a.o.vllm_w13_scale_size_k,
      "Marlin: permute w13 scales exactly as vLLM's loader does (size_k = I) even where its kernel "
      "expects otherwise");
  app.add_option("--vllm-target", a.vllm_target,
                 "The vLLM the output is for: " + vllm_target_names("|") +
                     " (parameter names, shapes, act-order, padding; docs/vllm_targets.md)")
      ->capture_default_str();
  app.add_option(
         "--threads", a.o.threads,
         "Worker threads (0: the CPUs this process may use: affinity and cgroup quota); output "
         "bytes do not depend on it")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_option("--writers", a.o.writers,
                 "Threads that checksum and write the output at once (0: as many as --threads); "
                 "output bytes do not depend on it")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_option("--max-shard-size", a.max_shard, "Shard size limit (e.g. 5GB, 500MB)")
      ->capture_default_str();
  app.add_option("--chunk-size", a.chunk,
                 "Experts of a layer converted at once, as canonical bytes (bounds memory for very "
                 "large layers; output bytes do not depend on it)")
      ->capture_default_str();
  app.add_flag("--no-fast-path", a.o.no_fast_path,
               "Convert every layer through the canonical one-byte-per-code form instead of a "
               "direct fast path (same output bytes; for debugging and tests)");
  app.add_option("--include", a.o.files.include,
                 "Carry the source's files matching this glob that are left out by default "
                 "(other weight formats: *.bin, *.pth, original/*, ...); repeatable")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--exclude", a.o.files.exclude,
                 "Leave out the source's non-weight files matching this glob (wins over "
                 "--include); repeatable")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--tensor-parallel-size", a.o.parallel.tensor,
                 "Write each MoE layer as the N ranks of vLLM 0.33's tensor parallelism hold it "
                 "(I split per rank, then each rank's post-processing), each rank in its own "
                 "shard files (docs/vllm.md)")
      ->capture_default_str();
  app.add_option("--expert-parallel", a.o.parallel.expert,
                 "Write each MoE layer as the N ranks of vLLM 0.33's expert parallelism hold it "
                 "(whole experts per rank, placed by --expert-placement)")
      ->capture_default_str();
  app.add_option("--expert-placement", a.placement,
                 "vLLM 0.33's expert placement for --expert-parallel: linear|round_robin")
      ->capture_default_str();
  app.add_flag("--force", a.o.force, "Replace an existing output directory");
  app.add_flag("--dry-run", a.dry_run, "Print the plan and write nothing");
  app.add_flag(
      "--require-servable", a.require_servable,
      "Refuse (exit 4, nothing written) an output the moepack-vllm plugin would not serve");
  app.add_option("--shard", a.shard,
                 "Convert only work unit I of N (0-based) into DST.parts/I-of-N, skipped when "
                 "already complete; `moepack merge DST` assembles the parts. With --dry-run: the "
                 "units and their bytes");
}

// --dry-run: the plan (and with --shard, the work units), nothing written.
void print_dry_run(const Plan& plan, const Checkpoint& ckpt, const std::optional<ShardSpec>& spec,
                   const Servability& serving, const Globals& g) {
  std::vector<WorkUnit> units;
  if (spec) units = split_plan(plan, spec->count);
  if (g.json) {
    auto j = plan.to_json();
    j["ok"] = true;
    j["dry_run"] = true;
    j["serving"] = serving.to_json();
    if (spec) {
      j["shard"] = {{"index", spec->index},
                    {"count", spec->count},
                    {"parts_dir", parts_dir(plan.options.dst)},
                    {"plan_digest", plan_digest(plan, ckpt)}};
      j["units"] = units_json(plan, units);
    }
    print_json(j);
    return;
  }
  std::cout << plan.to_text();
  std::cout << "  serving         " << serving.to_text() << "\n";
  if (spec) {
    std::cout << "  work units      " << spec->count << " (into " << parts_dir(plan.options.dst)
              << "/)\n";
    for (const auto& u : units)
      std::cout << "    " << part_dir_name(u.index, spec->count) << "  " << u.tensors.size()
                << " tensors, " << u.modules.size() << " MoE layers, " << u.bytes << " bytes"
                << (u.index == spec->index ? "  <- --shard" : "") << "\n";
  }
  std::cout << "dry run: nothing written\n";
}

// `sum`: the run's time and peak memory.
void print_part_result(const PartResult& p, const ShardSpec& spec, RunSummary sum,
                       const Globals& g) {
  sum.what = "unit " + std::to_string(spec.index) + " of " + std::to_string(spec.count) + " -> " +
             human_bytes(p.skipped ? 0 : p.unit.bytes) + " written";
  sum.output_bytes = sum.rate_bytes = p.skipped ? 0 : p.unit.bytes;
  sum.verdict = p.skipped ? "skipped" : "written";
  if (g.json)
    print_json({{"ok", true},
                {"part", p.dir},
                {"unit", spec.index},
                {"units", spec.count},
                {"skipped", p.skipped},
                {"tensors", p.unit.tensors.size()},
                {"tensor_bytes", p.unit.bytes},
                {"layers", p.unit.modules},
                {"seconds", p.convert.seconds},
                {"stage_seconds", p.convert.stage_seconds},
                {"run", summary_json(sum)}});
  else if (p.skipped)
    std::cout << "part " << p.dir << " is already complete for this plan: skipped\n"
              << summary_line(sum);
  else
    std::cout << "wrote part " << p.dir << ": " << p.unit.modules.size() << " MoE layers, "
              << p.unit.tensors.size() << " tensors, " << human_bytes(p.unit.bytes) << ", "
              << p.convert.seconds << " s\n"
              << summary_line(sum);
}

nlohmann::json left_out_json(const Plan& plan) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& f : plan.left_out_files) j.push_back({{"path", f.path}, {"why", f.why}});
  return j;
}

void print_convert_result(const ConvertResult& r, const Plan& plan, uint64_t source_bytes,
                          const Servability& serving, const Globals& g) {
  RunSummary sum;
  sum.what = human_bytes(source_bytes) + " source -> " + human_bytes(r.bytes_written) + " written";
  sum.source_bytes = source_bytes;
  sum.output_bytes = sum.rate_bytes = r.bytes_written;
  sum.seconds = r.seconds;
  sum.peak = {r.peak_rss_anon_bytes, r.peak_rss_file_bytes};
  sum.verdict = "written";
  if (g.json) {
    print_json({{"ok", true},
                {"dst", r.dst},
                {"backend", plan.backend},
                {"target_arch", target_arch_name(plan.arch)},
                {"tensors", r.tensors},
                {"tensor_bytes", r.bytes_written},
                {"shards", plan.shards.shard_names.size()},
                {"seconds", r.seconds},
                {"stage_seconds", r.stage_seconds},
                {"peak_rss_anon_bytes", r.peak_rss_anon_bytes},
                {"peak_rss_file_bytes", r.peak_rss_file_bytes},
                {"deviations_from_vllm", plan.deviations},
                {"files_carried", plan.copied_files},
                {"files_left_out", left_out_json(plan)},
                {"serving", serving.to_json()},
                {"run", summary_json(sum)}});
    return;
  }
  std::cout << "wrote " << r.dst << ": backend " << plan.backend << " for "
            << target_arch_name(plan.arch) << ", " << plan.layers.size() << " MoE layers, "
            << r.tensors << " tensors, " << human_bytes(r.bytes_written) << " in "
            << plan.shards.shard_names.size() << " shard(s), " << r.seconds << " s\n"
            << summary_line(sum);
  for (const auto& f : plan.left_out_files)
    std::cout << "left out " << f.path << ": " << f.why << "\n";
  std::cout << "serving: " << serving.to_text() << "\n";
}

int run_convert(ConvertArgs& a, const Globals& g) {
  a.o.target_arch = parse_target_arch(a.target_arch);
  a.o.vllm_target = parse_vllm_target(a.vllm_target);
  a.o.act_dtype = parse_act_dtype(a.act_dtype);
  a.o.max_shard_bytes = parse_size("--max-shard-size", a.max_shard);
  a.o.chunk_bytes = parse_size("--chunk-size", a.chunk);
  const std::optional<ExpertPlacement> placement = expert_placement_from_name(a.placement);
  if (!placement)
    throw Error(ErrorCode::kUsage,
                "--expert-placement must be linear or round_robin, got '" + a.placement + "'");
  a.o.parallel.placement = *placement;
  std::optional<ShardSpec> spec;
  if (!a.shard.empty()) spec = parse_shard_spec(a.shard);
  a.o.src = resolve_checkpoint_arg(a.o.src, g);
  const auto ckpt = Checkpoint::open(a.o.src);
  const Plan plan = make_plan(*ckpt, a.o);
  // Whether the plugin serves the output, decided before anything is written.
  Servability serving = servability(*plan.layout, plan.vllm_target, plan.target_quant.method);
  mark_parallel(plan.options.parallel, serving);
  if (a.require_servable && !serving.servable)
    throw Error(ErrorCode::kUnsupported, a.o.src, "", "--require-servable: " + serving.to_text());
  if (a.dry_run) {
    print_dry_run(plan, *ckpt, spec, serving, g);
    return 0;
  }
  if (!serving.servable && !g.json)
    std::cerr << "moepack: warning: the output will be " << serving.to_text()
              << " (--require-servable refuses it)\n";
  if (spec) {
    CommandRun run(g.progress, stderr_is_terminal(), g.json, "");
    const PartResult p = execute_part(plan, *ckpt, *spec, run.fn());
    print_part_result(p, *spec, run.finish(), g);
    return 0;
  }
  ProgressPrinter progress(g.progress, stderr_is_terminal(), g.json, "");
  const ConvertResult r = execute_plan(plan, *ckpt, progress.fn());
  progress.clear();
  print_convert_result(r, plan, ckpt->total_tensor_bytes(), serving, g);
  return 0;
}

}  // namespace

Runner add_convert(CLI::App& app, Globals& g) {
  auto a = std::make_shared<ConvertArgs>();
  add_convert_options(app, *a);
  return [a, &g] { return run_convert(*a, g); };
}

}  // namespace moepack::cli
