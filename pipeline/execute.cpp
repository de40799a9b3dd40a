// execute_plan(): writes exactly what make_plan() decided (STYLE.md §11).
#include "pipeline/execute.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "core/error.h"
#include "core/sha256.h"
#include "core/threads.h"
#include "io/atomic_dir.h"
#include "pipeline/manifest.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The layer's planned output parameters.
std::vector<const PlannedTensor*> planned_params(const Plan& plan, const PlannedLayer& pl) {
  std::vector<const PlannedTensor*> planned;
  for (const auto& t : plan.tensors)
    if (t.layer == pl.index) planned.push_back(&t);
  return planned;
}

}  // namespace

std::vector<Tensor> convert_chunk(const Plan& plan, const Checkpoint& ckpt, const PlannedLayer& pl,
                                  int64_t e0, int64_t e1,
                                  const std::function<void(const char*)>& lap) {
  const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
  const std::vector<const PlannedTensor*> planned = planned_params(plan, pl);
  ExpertRange range;
  range.begin = e0;
  range.end = e1;
  range.g_idx_w13 = pl.act_order_w13 ? 1 : 0;
  range.g_idx_w2 = pl.act_order_w2 ? 1 : 0;
  MoeExperts experts;
  if (plan.quantize_recipe) {
    const DenseExperts d = load_dense_experts(ckpt, L, range);
    experts.w13 = plan.quantize_recipe->quantize(d.w13.data(), d.experts, pl.shape.w13.n, d.hidden);
    experts.w2 = plan.quantize_recipe->quantize(d.w2.data(), d.experts, d.hidden, d.inter);
  } else {
    experts = load_moe_experts(ckpt, L, plan.threads, range);
  }
  if (lap) lap("load");
  std::vector<Tensor> params = plan.layout->pack(pl.layout_options, experts);
  experts = MoeExperts();  // release the canonical form before writing
  if (lap) lap("pack");
  if (params.size() != planned.size())
    throw Error(ErrorCode::kInternal, "", L.param_prefix,
                "layout produced a different parameter set than planned");
  for (const Tensor& t : params) {
    const PlannedTensor* want = nullptr;
    for (const PlannedTensor* p : planned)
      if (p->name == t.name) want = p;
    Shape chunk_shape = want ? want->shape : Shape{};
    if (!chunk_shape.empty()) chunk_shape[0] = e1 - e0;
    if (!want || want->dtype != t.dtype || chunk_shape != t.shape)
      throw Error(ErrorCode::kInternal, "", t.name,
                  "layout output differs from the plan (" + shape_str(t.shape) + ")");
  }
  return params;
}

void validate_plan(const Plan& plan, const Checkpoint& ckpt) {
  for (const PlannedLayer& pl : plan.layers) {
    const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
    for (int64_t e0 = 0; e0 < L.num_experts; e0 += pl.experts_per_chunk)
      convert_chunk(plan, ckpt, pl, e0, std::min(L.num_experts, e0 + pl.experts_per_chunk), {});
  }
}

void validate_source(const Checkpoint& ckpt, int threads, uint64_t chunk_bytes) {
  const bool dense = ckpt.quant().method == QuantMethod::kNone;
  for (const MoeLayer& L : ckpt.moe_layers()) {
    // The plan's chunk rule: canonical bytes per expert (a float each when dense).
    const uint64_t per_expert =
        static_cast<uint64_t>((L.gated ? 3 : 2) * L.inter * L.hidden) * (dense ? 4 : 1);
    const int64_t chunk = std::max<int64_t>(
        1, std::min<int64_t>(L.num_experts, static_cast<int64_t>(
                                                chunk_bytes / std::max<uint64_t>(1, per_expert))));
    for (int64_t e0 = 0; e0 < L.num_experts; e0 += chunk) {
      ExpertRange range;
      range.begin = e0;
      range.end = std::min(L.num_experts, e0 + chunk);
      if (dense)
        load_dense_experts(ckpt, L, range);
      else
        load_moe_experts(ckpt, L, threads, range);
    }
  }
}

void write_planned_tensors(const Plan& plan, const Checkpoint& ckpt, ShardedWriter& writer,
                           const std::vector<size_t>& tensors, const ProgressFn& progress,
                           std::map<std::string, double>& stage_seconds) {
  auto lap = [&stage_seconds, last = std::chrono::steady_clock::now()](const char* stage) mutable {
    const auto now = std::chrono::steady_clock::now();
    stage_seconds[stage] += std::chrono::duration<double>(now - last).count();
    last = now;
  };
  const int threads = plan.threads;
  std::set<int64_t> layers_wanted;
  std::vector<const PlannedTensor*> copies;
  for (size_t i : tensors) {
    const PlannedTensor& t = plan.tensors.at(i);
    if (t.converted)
      layers_wanted.insert(t.layer);
    else
      copies.push_back(&t);
  }

  // Copy-through tensors, straight from the mapped source.
  parallel_for(static_cast<int64_t>(copies.size()), threads, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const TensorView v = ckpt.view(copies[static_cast<size_t>(i)]->name);
      writer.write(v.name, v.data, v.nbytes);
    }
  });
  lap("copy");
  if (progress)
    progress("copy", static_cast<int64_t>(copies.size()), static_cast<int64_t>(copies.size()));

  // MoE layers one at a time, each in the plan's chunks of experts: memory is bounded by one
  // chunk, not the model.
  int64_t layers_done = 0;
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    const PlannedLayer& pl = plan.layers[i];
    if (!layers_wanted.count(pl.index)) continue;
    const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
    const std::vector<const PlannedTensor*> planned = planned_params(plan, pl);
    const int64_t chunk = pl.experts_per_chunk;
    for (int64_t e0 = 0; e0 < L.num_experts; e0 += chunk) {
      const int64_t e1 = std::min(L.num_experts, e0 + chunk);
      const std::vector<Tensor> params = convert_chunk(plan, ckpt, pl, e0, e1, std::ref(lap));
      std::vector<std::pair<const Tensor*, uint64_t>> parts;  // tensor, byte offset in the output
      for (const Tensor& t : params) {
        const PlannedTensor* want = nullptr;
        for (const PlannedTensor* p : planned)
          if (p->name == t.name) want = p;
        parts.emplace_back(
            &t, want->bytes / static_cast<uint64_t>(L.num_experts) * static_cast<uint64_t>(e0));
      }
      parallel_for(static_cast<int64_t>(parts.size()), threads, [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) {
          const auto& [t, offset] = parts[static_cast<size_t>(k)];
          writer.write_part(t->name, t->data.data(), t->data.size(), offset);
        }
      });
      lap("write");
    }
    if (progress) progress("layers", ++layers_done, static_cast<int64_t>(layers_wanted.size()));
  }
}

void write_config_and_files(const Plan& plan, const Checkpoint& ckpt, const std::string& dir,
                            const std::map<std::string, std::string>& checksums) {
  // Other files, then config.json with a moepack block, then the manifest.
  for (const auto& rel : plan.copied_files) {
    const fs::path dst = fs::path(dir) / rel;
    fs::create_directories(dst.parent_path());
    std::error_code ec;
    fs::copy_file(fs::path(ckpt.dir()) / rel, dst, fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw Error(ErrorCode::kIo, (fs::path(ckpt.dir()) / rel).string(), "",
                  "copy failed: " + ec.message());
  }
  // The manifest's bytes first: config.json's quantization_config carries their digest, so a
  // server can tell that the config and the manifest belong together.
  const std::string manifest = manifest_text(build_manifest(plan, ckpt, checksums));
  json cfg = ckpt.config().raw;
  for (const auto& [key, value] : plan.config_patch.items()) cfg[key] = value;
  cfg["quantization_config"]["manifest_sha256"] = sha256_hex(manifest.data(), manifest.size());
  // A multimodal config's text_config may carry the source's block too; it now lives nested in
  // ours, and no reader may find the stale one.
  if (cfg.contains("text_config") && cfg["text_config"].is_object())
    cfg["text_config"].erase("quantization_config");
  for (const auto& [name, text] :
       {std::pair<const char*, std::string>{"config.json", cfg.dump(2) + "\n"},
        {"moepack.json", manifest}}) {
    const std::string p = dir + "/" + name;
    std::ofstream f(p);
    f << text;
    if (!f) throw Error(ErrorCode::kIo, p, "", "write failed");
  }
}

ConvertResult execute_plan(const Plan& plan, const Checkpoint& ckpt, const ProgressFn& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  ConvertResult r;
  AtomicOutputDir out(plan.options.dst, plan.options.force, {plan.options.src});
  ShardedWriter writer(out.path(), plan.shards);
  std::vector<size_t> all(plan.tensors.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  write_planned_tensors(plan, ckpt, writer, all, progress, r.stage_seconds);
  const auto t_finish = std::chrono::steady_clock::now();
  writer.finish();
  write_config_and_files(plan, ckpt, out.path(), writer.checksums());
  out.commit();

  const auto t1 = std::chrono::steady_clock::now();
  r.stage_seconds["finish"] += std::chrono::duration<double>(t1 - t_finish).count();
  r.dst = plan.options.dst;
  r.bytes_written = plan.total_bytes();
  r.tensors = static_cast<int64_t>(plan.tensors.size());
  r.seconds = std::chrono::duration<double>(t1 - t0).count();
  return r;
}

}  // namespace moepack
