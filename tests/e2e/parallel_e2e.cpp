// Tensor- and expert-parallel outputs (convert --tensor-parallel-size / --expert-parallel,
// formats/parallel.h), end to end over random synthesised checkpoints of every layout that takes
// them: each rank's parameters in its own shard file holding nothing else; verify --source passes
// (every rank's bytes against its share of the source, the MoE through every rank); the output is
// the same for any chunk size and thread count; parts + merge equal one convert; a changed byte in
// one rank's file fails verify; what vLLM 0.33 refuses exits 4 naming why.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "formats/parallel.h"
#include "io/safetensors.h"
#include "pipeline/execute.h"
#include "pipeline/parts.h"
#include "synth/synth.h"
#include "tests/test_util.h"
#include "verify/verify.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_cli;
using test::read_json_file;
using test::TempDir;

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void expect_same_tree(const fs::path& got, const fs::path& want) {
  std::set<std::string> got_files, want_files;
  for (const auto& e : fs::directory_iterator(got)) got_files.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(want))
    want_files.insert(e.path().filename().string());
  EXPECT_EQ(got_files, want_files);
  for (const auto& f : want_files) {
    if (!got_files.count(f)) continue;
    EXPECT_TRUE(test::bytes_equal(read_bytes(got / f), read_bytes(want / f), 64, f));
  }
}

struct Case {
  std::string format, arch, backend;
  SynthOptions synth;
  Parallelism par;
};

Case random_case(std::mt19937_64& rng) {
  const std::vector<std::string> formats = {
      "gptq", "gptq-asym", "awq", "ct-w4a16", "fp8-block", "modelopt-mxfp8", "modelopt-nvfp4"};
  Case c;
  c.format = formats[rng() % formats.size()];
  c.arch = c.format == "fp8-block" || c.format == "modelopt-mxfp8" ? "sm100" : "sm90";
  // On sm90 vLLM 0.33 (and auto) picks Humming for WNA16 (asymmetric GPTQ: Marlin refuses it,
  // auto picks triton-wna16); Marlin half the time. NVFP4: marlin-nvfp4 on sm80 (both decide
  // per rank: Humming's recode, NVFP4's rescale factor).
  c.backend = "auto";
  if (c.arch == "sm90" && c.format != "gptq-asym") c.backend = rng() % 2 ? "marlin" : "humming";
  if (c.format == "modelopt-nvfp4") {
    c.arch = "sm80";
    c.backend = "marlin-nvfp4";
  }
  c.synth.format = c.format;
  c.synth.family = rng() % 2 ? "qwen3" : "deepseek";
  c.synth.layers = 2;
  c.synth.experts = 2 + static_cast<int64_t>(rng() % 5);
  c.synth.hidden = 128 * (1 + static_cast<int64_t>(rng() % 2));
  c.synth.inter = 128 * (1 + static_cast<int64_t>(rng() % 4));
  c.synth.vocab = 128;
  c.synth.seed = rng();
  c.synth.threads = 1;
  if (rng() % 2) {
    c.par.tensor = rng() % 2 ? 2 : 4;
  } else {
    c.par.expert = 2 + static_cast<int>(rng() % 2);
    c.synth.experts = std::max<int64_t>(c.synth.experts, c.par.expert);
    c.par.placement = rng() % 2 ? ExpertPlacement::kRoundRobin : ExpertPlacement::kLinear;
  }
  return c;
}

ConvertOptions options_for(const Case& c, const std::string& src, const std::string& dst) {
  ConvertOptions o;
  o.src = src;
  o.dst = dst;
  o.target_arch = parse_target_arch(c.arch);
  o.backend = c.backend;
  o.vllm_target = VllmTarget::kV0_33;
  o.parallel = c.par;
  o.threads = 1;
  return o;
}

// Each rank's shard files hold exactly its parameters; the shared files no converted tensor.
void expect_rank_files(const std::string& dst, const Parallelism& par) {
  const json m = read_json_file(dst + "/moepack.json");
  ASSERT_TRUE(m.contains("parallel"));
  const int ranks = par.ranks();
  ASSERT_EQ(m["parallel"]["ranks"].size(), static_cast<size_t>(ranks));
  std::set<std::string> rank_files;
  for (int r = 0; r < ranks; ++r) {
    const json& jr = m["parallel"]["ranks"][static_cast<size_t>(r)];
    for (const auto& f : jr["shards"]) {
      rank_files.insert(f.get<std::string>());
      const auto st = SafetensorsFile::open(dst + "/" + f.get<std::string>());
      for (const auto& e : st.entries())
        EXPECT_EQ(rank_of_tensor_key(e.name, ranks), r) << e.name << " in " << f;
    }
  }
  for (const auto& s : m["shards"]) {
    const std::string f = s["name"];
    if (rank_files.count(f)) continue;
    const auto st = SafetensorsFile::open(dst + "/" + f);
    for (const auto& e : st.entries()) EXPECT_EQ(rank_of_tensor_key(e.name, ranks), -1) << e.name;
  }
}

TEST(Parallel, RanksVerifyChunkFreeAndMergeLikeConvert) {
  const char* seed_env = std::getenv("MOEPACK_SUITE_SEED");
  std::mt19937_64 rng(seed_env ? std::stoull(seed_env) : 25);
  int converted = 0;
  for (int trial = 0; trial < 10; ++trial) {
    const Case c = random_case(rng);
    SCOPED_TRACE(c.format + " -> " + c.backend + " E=" + std::to_string(c.synth.experts) +
                 " H=" + std::to_string(c.synth.hidden) + " I=" + std::to_string(c.synth.inter) +
                 " " + c.par.describe());
    TempDir tmp;
    const std::string src = tmp / "src", ref = tmp / "ref";
    synth_checkpoint(src, c.synth);
    const auto ckpt = Checkpoint::open(src);
    Plan plan;
    try {
      plan = make_plan(*ckpt, options_for(c, src, ref));
    } catch (const Error& e) {
      // What vLLM 0.33 would refuse (or the layout on the rank's shape): kUnsupported, naming it.
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.par.describe()), std::string::npos) << e.what();
      continue;
    }
    ++converted;
    execute_plan(plan, *ckpt);
    expect_rank_files(ref, c.par);
    VerifyOptions v;
    v.dst = ref;
    v.source = src;
    v.threads = 2;
    const VerifyReport r = run_verify(v);
    EXPECT_TRUE(r.passed) << render_text(r);
    // One expert at a time and three threads: the same bytes.
    ConvertOptions o = options_for(c, src, tmp / "chunked");
    o.chunk_bytes = 1;
    o.threads = 3;
    execute_plan(make_plan(*ckpt, o), *ckpt);
    expect_same_tree(tmp / "chunked", ref);
    // Three parts (fanned out per rank) + merge: the same bytes.
    const std::string dst = tmp / "merged";
    for (int64_t i = 0; i < 3; ++i)
      execute_part(make_plan(*ckpt, options_for(c, src, dst)), *ckpt, {i, 3});
    MergeOptions m;
    m.dst = dst;
    m.source = src;
    m.remove_parts = true;
    merge_parts(m);
    expect_same_tree(dst, ref);
  }
  EXPECT_GE(converted, 4);
}

// The float Marlin rows under tensor parallelism (vLLM 0.33's
// prepare_{fp8,mxfp8}_moe_layer_for_marlin post-process each rank's slice with
// intermediate_size_per_partition): each rank pads its own I / tp (MXFP8: 192 / 2 = 96 -> 128,
// where the whole layer's 192 needs no padding), verify
// --source passes every rank, and what vLLM refuses per rank (FP8 block_n = 128 straddling two
// ranks) exits 4.
TEST(Parallel, FloatMarlinPadsPerRank) {
  TempDir tmp;
  std::string out, err;
  const std::string mx = tmp / "mx", fp8 = tmp / "fp8";
  ASSERT_EQ(
      moepack_cli("synth " + mx + " --format modelopt-mxfp8 --experts 3 --hidden 256 --inter 192"),
      0);
  ASSERT_EQ(moepack_cli("convert " + mx + " " + tmp / "mx-tp2" +
                            " --vllm-target 0.33 --target-arch sm80 --backend marlin-mxfp8"
                            " --tensor-parallel-size 2",
                        &out, &err),
            0)
      << err;
  const json m = read_json_file(tmp / "mx-tp2/moepack.json");
  int padded = 0;
  for (const auto& [name, t] : m["tensors"].items())
    if (name.rfind("rank", 0) == 0 && name.size() > 9 &&
        name.compare(name.size() - 9, 9, "w2_weight") == 0) {
      EXPECT_EQ(t["shape"][1], 128 / 16) << name << ": I / tp = 96 padded to 128 per rank";
      ++padded;
    }
  EXPECT_EQ(padded, 2 * static_cast<int>(m["layers"].size()));  // every MoE layer, both ranks
  EXPECT_EQ(moepack_cli("verify " + tmp / "mx-tp2" + " --source " + mx, &out), 0) << out;

  ASSERT_EQ(
      moepack_cli("synth " + fp8 + " --format fp8-block --experts 3 --hidden 256 --inter 512"), 0);
  ASSERT_EQ(moepack_cli("convert " + fp8 + " " + tmp / "fp8-tp2" +
                            " --vllm-target 0.33 --target-arch sm80 --backend marlin-fp8"
                            " --tensor-parallel-size 2",
                        &out, &err),
            0)
      << err;
  EXPECT_EQ(moepack_cli("verify " + tmp / "fp8-tp2" + " --source " + fp8, &out), 0) << out;
  EXPECT_EQ(moepack_cli("convert " + fp8 + " " + tmp / "fp8-tp8" +
                            " --vllm-target 0.33 --target-arch sm80 --backend marlin-fp8"
                            " --tensor-parallel-size 8",
                        &out, &err),
            4);
  EXPECT_NE(err.find("w13: a block of 128 rows sharing a scale would straddle two ranks"),
            std::string::npos)
      << err;
}

// The layouts with per-layer decisions (Humming's recode, NVFP4 Marlin's block-scale rescale)
// decide per rank, on the rank's share, as each rank of vLLM 0.33 post-processes its slice alone:
// every layer records one entry per rank (layers[i].ranks[r]: its decisions, and Humming's
// LayerConfig for the rank's shape: E local experts, N = 2 I / tp padded to 256), none at layer
// level; verify --source passes every rank and refuses a rank's record that disagrees, naming it.
// (bench/humming/check_parallel_shapes.py checks the Humming ranks against humming's own
// transform of each rank's slice; tests/vllm/test_serving_parallel.py serves them.)
TEST(Parallel, HummingAndNvfp4DecidePerRank) {
  TempDir tmp;
  std::string out, err;
  const std::string gptq = tmp / "gptq", fp4 = tmp / "fp4";
  ASSERT_EQ(moepack_cli("synth " + gptq + " --format gptq --experts 4 --inter 256"), 0);
  struct Run {
    std::string flags;
    int ranks;
    int64_t local_experts, shape_n13;
  };
  for (const Run& run : {Run{"--tensor-parallel-size 2", 2, 4, 256},
                         Run{"--expert-parallel 3 --expert-placement round_robin", 3, 0, 512}}) {
    SCOPED_TRACE(run.flags);
    const std::string dst = tmp / ("h" + std::to_string(run.ranks));
    ASSERT_EQ(
        moepack_cli("convert " + gptq + " " + dst +
                        " --vllm-target 0.33 --target-arch sm90 --backend humming " + run.flags,
                    &out, &err),
        0)
        << err;
    const json m = read_json_file(dst + "/moepack.json");
    for (const auto& L : m["layers"]) {
      EXPECT_FALSE(L.contains("layout_decisions") || L.contains("layout_config"));
      ASSERT_EQ(L["ranks"].size(), static_cast<size_t>(run.ranks));
      for (int r = 0; r < run.ranks; ++r) {
        const json& rec = L["ranks"][static_cast<size_t>(r)];
        EXPECT_EQ(rec["rank"], r);
        EXPECT_TRUE(rec["layout_decisions"].contains("w13_b_dtype"));
        const json lc = json::parse(rec["layout_config"]["w13_layer_config"].get<std::string>());
        // round_robin over 3 ranks of 4 experts: ranks hold 2, 1, 1.
        EXPECT_EQ(lc["num_experts"], run.local_experts ? run.local_experts : (r == 0 ? 2 : 1));
        EXPECT_EQ(lc["shape_n"], run.shape_n13);
      }
    }
    EXPECT_EQ(moepack_cli("verify " + dst + " --source " + gptq, &out), 0) << out;
  }
  // A rank's record edited: verify names the rank's field.
  const std::string manifest = tmp / "h2/moepack.json";
  json m = read_json_file(manifest);
  json lc = json::parse(
      m["layers"][0]["ranks"][1]["layout_config"]["w2_layer_config"].get<std::string>());
  lc["num_experts"] = 7;
  m["layers"][0]["ranks"][1]["layout_config"]["w2_layer_config"] = lc.dump();
  std::ofstream(manifest) << m.dump(2);
  EXPECT_NE(moepack_cli("verify " + tmp / "h2" + " --source " + gptq, &out, &err), 0);
  EXPECT_NE((out + err).find("layers[0].ranks[1].layout_config.w2_layer_config.num_experts"),
            std::string::npos)
      << out << err;

  ASSERT_EQ(
      moepack_cli("synth " + fp4 + " --format modelopt-nvfp4 --experts 4 --hidden 256 --inter 256"),
      0);
  for (const char* flags : {"--tensor-parallel-size 2", "--expert-parallel 2"}) {
    SCOPED_TRACE(flags);
    const std::string dst = tmp / "n";
    fs::remove_all(dst);
    ASSERT_EQ(
        moepack_cli("convert " + fp4 + " " + dst +
                        " --vllm-target 0.33 --target-arch sm80 --backend marlin-nvfp4 " + flags,
                    &out, &err),
        0)
        << err;
    const json mn = read_json_file(dst + "/moepack.json");
    for (const auto& L : mn["layers"]) {
      ASSERT_EQ(L["ranks"].size(), 2u);
      for (const auto& rec : L["ranks"])
        EXPECT_TRUE(rec["layout_decisions"].contains("w13_nvfp4_scale_factor_log2"));
    }
    EXPECT_EQ(moepack_cli("verify " + dst + " --source " + fp4, &out), 0) << out;
  }
}

TEST(Parallel, ChangedByteInOneRankFailsVerify) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "out";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq --experts 4 --inter 256"), 0);
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst +
                        " --vllm-target 0.33 --backend marlin --tensor-parallel-size 2"),
            0);
  std::string out;
  ASSERT_EQ(moepack_cli("verify " + dst + " --source " + src, &out), 0) << out;
  const std::string file = dst + "/model-rank01-of-02.safetensors";
  std::vector<uint8_t> bytes = read_bytes(file);
  bytes[bytes.size() - 7] ^= 0x10;
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src, &out), 1) << out;
  EXPECT_NE(out.find("rank01-of-02/"), std::string::npos) << out;
}

TEST(Parallel, RefusesWhatVllmRefusesWithExit4) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq --experts 4 --inter 512 --group-size 128"),
            0);
  std::string out, err;
  EXPECT_EQ(
      moepack_cli("convert " + src + " " + tmp / "a" + " --tensor-parallel-size 3 --backend marlin",
                  &out, &err),
      4);
  EXPECT_NE(err.find("I=512 is not a multiple of the tensor-parallel size 3"), std::string::npos)
      << err;
  EXPECT_EQ(
      moepack_cli("convert " + src + " " + tmp / "b" + " --tensor-parallel-size 8 --backend marlin",
                  &out, &err),
      4);
  EXPECT_NE(err.find("would straddle two ranks"), std::string::npos) << err;
  EXPECT_EQ(
      moepack_cli("convert " + src + " " + tmp / "c" + " --expert-parallel 5 --backend marlin",
                  &out, &err),
      4);
  EXPECT_NE(err.find("would hold no expert"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("convert " + src + " " + tmp / "d" +
                            " --tensor-parallel-size 2 --expert-parallel 2",
                        &out, &err),
            4);
  EXPECT_EQ(moepack_cli("convert " + src + " " + tmp / "e" +
                            " --expert-parallel 2 "
                            "--expert-placement striped",
                        &out, &err),
            2);
  EXPECT_FALSE(fs::exists(tmp / "a"));
}

}  // namespace
}  // namespace moepack
