// The overlapped convert pipeline (pipeline/execute.h: read-ahead, convert, write on three
// threads with a bounded number of chunks in flight) writes exactly the bytes of the plain loop
// it replaced -- one thread, whole layers, one chunk after the other, no overlap -- for every
// thread count, chunk size and writer count (--writers), on the hot paths (GPTQ/CT/AWQ -> Marlin,
// MXFP8 -> TRT-LLM) and the fused and Mixtral families; the progress line's format; nothing on a
// stderr that is not a terminal; the peak resident memory in `convert --json`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "io/shard_writer.h"
#include "model/checkpoint.h"
#include "pipeline/execute.h"
#include "pipeline/progress.h"
#include "synth/synth.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_bin;
using test::run_command;
using test::TempDir;

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// The reference: the loop before the pipeline, on the calling thread only. Copy-through tensors,
// then every MoE layer as one chunk (whatever the plan's chunking), written as it is converted.
void write_sequential(const Plan& plan_in, const Checkpoint& ckpt, const std::string& dir) {
  Plan plan = plan_in;
  plan.threads = 1;
  for (PlannedLayer& pl : plan.layers)
    pl.experts_per_chunk = ckpt.moe_layers()[static_cast<size_t>(pl.index)].num_experts;
  fs::create_directories(dir);
  ShardedWriter writer(dir, plan.shards);
  for (const PlannedTensor& t : plan.tensors)
    if (!t.converted) {
      const TensorView v = ckpt.view(t.name);
      writer.write(v.name, v.data, v.nbytes);
    }
  for (const PlannedLayer& pl : plan.layers) {
    const int64_t E = ckpt.moe_layers()[static_cast<size_t>(pl.index)].num_experts;
    for (const Tensor& t : convert_chunk(plan, ckpt, pl, 0, E))
      writer.write_part(t.name, t.data.data(), t.data.size(), 0);
  }
  writer.finish();
}

struct Case {
  const char* format;
  const char* family;
  const char* backend;
  const char* arch = "sm90";
  const char* quantize = "";  // --quantize (unquantized sources)
};

class ConvertPipeline : public ::testing::TestWithParam<Case> {};

TEST_P(ConvertPipeline, BytesEqualTheSequentialLoopAtEveryThreadCountChunkSizeAndWriterCount) {
  const Case c = GetParam();
  TempDir tmp;
  SynthOptions so;
  so.format = c.format;
  so.family = c.family;
  so.layers = 3;
  so.experts = 8;
  so.hidden = 256;
  so.inter = 256;
  so.seed = 13;
  so.threads = 2;
  so.max_shard_bytes = 400000;  // several shards, with MoE layers across their boundaries
  const std::string src = tmp / "src";
  synth_checkpoint(src, so);

  const std::string ref = tmp / "ref";
  ConvertOptions o;
  o.src = src;
  o.backend = c.backend;
  o.target_arch = parse_target_arch(c.arch);
  o.quantize = c.quantize;
  o.max_shard_bytes = 300000;
  const auto ckpt = Checkpoint::open(src);
  const Plan plan = make_plan(*ckpt, o);
  ASSERT_GT(plan.shards.shard_names.size(), 1u);
  write_sequential(plan, *ckpt, ref);

  std::map<std::string, std::vector<uint8_t>> first_run;  // config.json, moepack.json
  const int threads_of[] = {1, 2, 4};
  const char* chunk_of[] = {"1GiB", "40KiB", "1"};
  const int writers_of[] = {0, 1, 3};  // 0: as many as --threads
  for (int ti = 0; ti < 3; ++ti) {
    for (int ci = 0; ci < 3; ++ci) {
      // A Latin square: every writer count meets every thread count and every chunk size.
      const int threads = threads_of[ti];
      const char* chunk = chunk_of[ci];
      const int writers = writers_of[(ti + ci) % 3];
      SCOPED_TRACE(std::string(c.format) + "/" + c.family + " threads " + std::to_string(threads) +
                   " chunk " + chunk + " writers " + std::to_string(writers));
      const std::string dst =
          tmp / ("out-" + std::to_string(threads) + "-" + chunk + "-" + std::to_string(writers));
      std::string err;
      ASSERT_EQ(run_command(moepack_bin() + " convert " + src + " " + dst + " --backend " +
                                c.backend + " --target-arch " + c.arch +
                                (*c.quantize ? std::string(" --quantize ") + c.quantize : "") +
                                " --vllm-target " + vllm_target_name(o.vllm_target) +
                                " --max-shard-size 300000 --threads " + std::to_string(threads) +
                                " --chunk-size " + chunk + " --writers " + std::to_string(writers),
                            nullptr, &err),
                0)
          << err;
      for (const std::string& shard : plan.shards.shard_names)
        EXPECT_TRUE(test::bytes_equal(read_bytes(fs::path(dst) / shard),
                                      read_bytes(fs::path(ref) / shard), 64, shard));
      for (const char* f : {"config.json", "moepack.json", "model.safetensors.index.json"}) {
        const auto bytes = read_bytes(fs::path(dst) / f);
        EXPECT_FALSE(bytes.empty()) << f;
        if (!first_run.count(f))
          first_run[f] = bytes;
        else
          EXPECT_TRUE(test::bytes_equal(bytes, first_run[f], 64, f));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    HotPaths, ConvertPipeline,
    ::testing::Values(Case{"gptq", "qwen3", "marlin"}, Case{"ct-w4a16", "qwen3", "marlin"},
                      Case{"awq", "mixtral", "marlin"},
                      Case{"bf16", "fused3d", "trtllm-mxfp8", "sm100", "mxfp8"},
                      Case{"modelopt-mxfp8", "qwen3", "trtllm-mxfp8", "sm100"},
                      Case{"ct-w8a8", "deepseek", "triton-int8"}),
    [](const auto& param_info) {
      std::string n = std::string(param_info.param.format) + "_" + param_info.param.family + "_" +
                      param_info.param.backend;
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

TEST(ConvertPipeline, PlanSplitsEveryLayerIntoAtLeastFourChunks) {
  TempDir tmp;
  SynthOptions so;
  so.experts = 10;
  synth_checkpoint(tmp / "src", so);
  const auto ckpt = Checkpoint::open(tmp / "src");
  ConvertOptions o;
  o.src = tmp / "src";
  for (const PlannedLayer& pl : make_plan(*ckpt, o).layers) {
    EXPECT_EQ(pl.experts_per_chunk, 3);  // ceil(10 / kMinChunksPerLayer)
    EXPECT_EQ(pl.chunks, 4);
  }
}

// A direct-path layer goes through the pipeline in chunks of about kPipelineChunkBytes of
// output (what the bytes test above cannot reach: its layers are smaller than that): cut to the
// bytes, never fewer experts than the workers, never more than the plan's chunk; a layer on the
// canonical path keeps the plan's chunk.
TEST(ConvertPipeline, DirectLayersGoThroughInChunksOfAboutTheirBytes) {
  TempDir tmp;
  SynthOptions so;
  so.format = "gptq";
  so.family = "qwen3";
  so.layers = 2;
  so.experts = 16;
  so.hidden = 256;
  so.inter = 256;
  synth_checkpoint(tmp / "src", so);
  const auto ckpt = Checkpoint::open(tmp / "src");
  ConvertOptions o;
  o.src = tmp / "src";
  o.backend = "marlin";
  o.threads = 1;
  Plan plan = make_plan(*ckpt, o);
  const PlannedLayer& pl = plan.layers.at(0);
  ASSERT_NE(pl.direct, nullptr);
  ASSERT_EQ(pl.experts_per_chunk, 4);  // ceil(16 / kMinChunksPerLayer)
  uint64_t layer_bytes = 0;            // Marlin int4 of 16 experts, H = I = 256, g 128
  for (const PlannedTensor& t : plan.tensors)
    if (t.converted && t.layer == pl.index) layer_bytes += t.bytes;
  ASSERT_GT(layer_bytes, 16u * 90000);  // about 96 KiB of codes per expert, plus scales
  const uint64_t per_expert = layer_bytes / 16;
  EXPECT_EQ(pipeline_experts_per_chunk(plan, pl, 16, 2 * per_expert + per_expert / 2), 3);
  EXPECT_EQ(pipeline_experts_per_chunk(plan, pl, 16, 2 * per_expert), 2);
  EXPECT_EQ(pipeline_experts_per_chunk(plan, pl, 16, 1), 1);
  EXPECT_EQ(pipeline_experts_per_chunk(plan, pl, 16, kPipelineChunkBytes), 4);  // the plan's
  plan.threads = 3;
  EXPECT_EQ(pipeline_experts_per_chunk(plan, pl, 16, 1), 3);
  plan.threads = 16;
  EXPECT_EQ(pipeline_experts_per_chunk(plan, pl, 16, 1), 4);
  o.no_fast_path = true;
  const Plan canonical = make_plan(*ckpt, o);
  ASSERT_EQ(canonical.layers.at(0).direct, nullptr);
  EXPECT_EQ(pipeline_experts_per_chunk(canonical, canonical.layers.at(0), 16, 1), 4);
}

TEST(ProgressLine, LayersBytesRateAndEta) {
  ConvertProgress p;
  p.layers_done = 3;
  p.layers_total = 8;
  p.bytes_done = 600ull << 20;
  p.bytes_total = 1800ull << 20;
  p.seconds = 2;
  // 629 MB in 2 s; 1200 MiB left at 300 MiB/s = 4 s.
  EXPECT_EQ(progress_line(p), "layers 3/8  600.0 MiB/1.8 GiB  315 MB/s  ETA 4s");
  p.seconds = 0;
  p.bytes_done = 0;
  p.layers_done = 0;
  EXPECT_EQ(progress_line(p), "layers 0/8  0 B/1.8 GiB  0 MB/s  ETA ?");
  p.bytes_done = 1;
  p.seconds = 10;  // 0.1 B/s: the rest takes years, printed in hours
  p.bytes_total = 1000;
  EXPECT_EQ(progress_line(p), "layers 0/8  1 B/1000 B  0 MB/s  ETA 2h46m");
  p.bytes_done = 1000;
  p.layers_done = 8;
  EXPECT_EQ(progress_line(p), "layers 8/8  1000 B/1000 B  0 MB/s  ETA 0s");
  p.bytes_done = 100;
  p.seconds = 1;  // 900 B at 100 B/s
  EXPECT_EQ(progress_line(p), "layers 8/8  100 B/1000 B  0 MB/s  ETA 9s");
  p.seconds = 10;  // 90 s
  EXPECT_EQ(progress_line(p), "layers 8/8  100 B/1000 B  0 MB/s  ETA 1m30s");
}

TEST(ConvertPipeline, NoProgressWhenStderrIsNotATerminalAndMemoryInJson) {
  TempDir tmp;
  SynthOptions so;
  so.experts = 8;
  synth_checkpoint(tmp / "src", so);
  std::string out, err;
  ASSERT_EQ(
      run_command(moepack_bin() + " convert " + (tmp / "src") + " " + (tmp / "dst"), &out, &err), 0)
      << err;
  EXPECT_EQ(err, "");  // stderr is a pipe here
  EXPECT_NE(out.find("wrote "), std::string::npos) << out;
  out.clear();
  err.clear();
  ASSERT_EQ(
      run_command(moepack_bin() + " convert " + (tmp / "src") + " " + (tmp / "dst2") + " --json",
                  &out, &err),
      0)
      << err;
  EXPECT_EQ(err, "");
  const json j = json::parse(out);
  // Anonymous memory: at least the program itself; file-backed: at least its mapped binary.
  EXPECT_GT(j.at("peak_rss_anon_bytes").get<uint64_t>(), 0u);
  EXPECT_GT(j.at("peak_rss_file_bytes").get<uint64_t>(), 0u);
  for (const char* stage : {"load", "pack", "copy", "write", "write_wait", "writer_idle"})
    EXPECT_TRUE(j.at("stage_seconds").contains(stage)) << stage;
}

}  // namespace
}  // namespace moepack
