// moepack merge DST --source SRC [--force] [--remove-parts] [--threads N] [--json]
#include <iostream>

#include "core/error.h"
#include "pipeline/parts.h"
#include "tools/cli.h"

namespace moepack::cli {

Runner add_merge(CLI::App& app, Globals& g) {
  auto o = std::make_shared<MergeOptions>();
  app.add_option("dst", o->dst,
                 "Output directory of the sharded conversion (the parts are in DST.parts/)")
      ->required();
  app.add_option("--source", o->source,
                 "Source checkpoint the parts were converted from (its tensors must hash to what "
                 "the parts recorded reading)")
      ->required();
  app.add_flag("--force", o->force, "Replace an existing output directory");
  app.add_flag("--remove-parts", o->remove_parts, "Delete DST.parts/ once the output is in place");
  app.add_option("--threads", o->threads,
                 "Worker threads (0: the CPUs this process may use: affinity and cgroup quota)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  return [o, &g] {
    o->source = resolve_checkpoint_arg(o->source, g);
    CommandRun run(g.progress, stderr_is_terminal(), g.json, "merge");
    o->progress = run.fn();
    const MergeResult r = merge_parts(*o);
    RunSummary sum = run.finish();
    sum.what = human_bytes(r.bytes_written) + " in " + std::to_string(r.parts) + " part(s) -> " +
               human_bytes(r.bytes_written) + " written";
    sum.source_bytes = sum.output_bytes = sum.rate_bytes = r.bytes_written;
    sum.verdict = "merged, every tensor equal to its part's SHA-256";
    if (g.json) {
      print_json({{"ok", true},
                  {"dst", r.dst},
                  {"source", r.source},
                  {"parts", r.parts},
                  {"tensors", r.tensors},
                  {"tensor_bytes", r.bytes_written},
                  {"shards", r.shards},
                  {"seconds", r.seconds},
                  {"run", summary_json(sum)}});
      return 0;
    }
    std::cout << "merged " << r.parts << " part(s) into " << r.dst << ": " << r.tensors
              << " tensors, " << human_bytes(r.bytes_written) << " in " << r.shards << " shard(s), "
              << r.seconds << " s\n"
              << summary_line(sum);
    return 0;
  };
}

}  // namespace moepack::cli
