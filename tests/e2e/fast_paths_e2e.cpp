// Direct fast paths end to end through the real binary: for each pair, `convert` and
// `convert --no-fast-path` write byte-identical outputs (SHA-256 of every file), and the dry-run
// plan names the path each takes. Synthetic checkpoints of every direct pair, and the real
// producer fixtures (tests/producers/fixtures) whose pairs have a direct path.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/sha256.h"
#include "formats/fast_path.h"
#include "model/checkpoint.h"
#include "pipeline/execute.h"
#include "pipeline/plan.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_bin;
using test::run_command;
using test::TempDir;

int moepack(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
  return run_command(moepack_bin() + " " + args, out, err);
}

// Relative path -> SHA-256 of every file under dir.
std::map<std::string, std::string> digests(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& f : fs::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file()) continue;
    std::ifstream in(f.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    out[fs::relative(f.path(), dir).string()] = sha256_hex(bytes.data(), bytes.size());
  }
  return out;
}

// The conversion path of every layer in the dry-run plan ("direct" / "canonical").
std::vector<std::string> planned_paths(const std::string& src, const std::string& flags) {
  std::string out, err;
  EXPECT_EQ(
      moepack("convert " + src + " /nonexistent-dst " + flags + " --dry-run --json", &out, &err), 0)
      << err;
  std::vector<std::string> paths;
  const json j = json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("layers")) return paths;
  for (const auto& l : j["layers"]) paths.push_back(l["conversion"]["path"].get<std::string>());
  return paths;
}

// Converts src both ways; the outputs must be the same files with the same bytes.
void expect_identical_outputs(const std::string& src, const std::string& flags,
                              const std::string& expect_path, const TempDir& tmp) {
  const std::vector<std::string> paths = planned_paths(src, flags);
  ASSERT_FALSE(paths.empty());
  for (const auto& p : paths) EXPECT_EQ(p, expect_path);
  for (const auto& p : planned_paths(src, flags + " --no-fast-path")) EXPECT_EQ(p, "canonical");
  const std::string fast = tmp / "fast", canonical = tmp / "canonical";
  std::string err;
  ASSERT_EQ(moepack("convert " + src + " " + fast + " " + flags, nullptr, &err), 0) << err;
  ASSERT_EQ(
      moepack("convert " + src + " " + canonical + " " + flags + " --no-fast-path", nullptr, &err),
      0)
      << err;
  const auto a = digests(fast), b = digests(canonical);
  EXPECT_GE(a.size(), 3u);
  EXPECT_EQ(a, b);
}

// Every chunk of every layer goes the direct way (a decline would fall back to the canonical path
// silently, and the outputs above would agree anyway), and equals convert_chunk_canonical.
void expect_direct_takes_every_chunk(const std::string& src, const std::string& flags) {
  const auto ckpt = Checkpoint::open(src);
  ConvertOptions o;
  o.src = src;
  o.dst = src + ".unused";
  o.threads = 2;
  if (flags.find("--target-arch sm100") != std::string::npos) o.target_arch = TargetArch::kSm100;
  if (flags.find("--vllm-target 2026-05") != std::string::npos)
    o.vllm_target = VllmTarget::kV2026_05;
  if (flags.find("--act-dtype fp16") != std::string::npos) o.act_dtype = DType::kF16;
  if (flags.find("--backend marlin") != std::string::npos) o.backend = "marlin";
  o.chunk_bytes = 300000;  // several chunks per layer
  const Plan plan = make_plan(*ckpt, o);
  int chunks = 0;
  for (const PlannedLayer& pl : plan.layers) {
    ASSERT_NE(pl.direct, nullptr) << pl.module << ": " << pl.canonical_why;
    const MoeLayer& L = ckpt->moe_layers()[static_cast<size_t>(pl.index)];
    for (int64_t e0 = 0; e0 < L.num_experts; e0 += pl.experts_per_chunk) {
      const int64_t e1 = std::min(L.num_experts, e0 + pl.experts_per_chunk);
      // The chunk as execution hands it over: views, the plan's refined params and act-order.
      const DirectSource d = direct_source(*ckpt, pl, e0, e1);
      const auto direct = pl.direct->convert(pl.layout_options, d);
      ASSERT_TRUE(direct.has_value()) << pl.module << " experts " << e0 << ".." << e1;
      const std::vector<Tensor> want = convert_chunk_canonical(plan, *ckpt, pl, e0, e1);
      ASSERT_EQ(direct->size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ((*direct)[i].name, want[i].name);
        EXPECT_TRUE(
            test::bytes_equal((*direct)[i].data, want[i].data, 4, pl.module + " " + want[i].name));
      }
      ++chunks;
    }
  }
  EXPECT_GT(chunks, 0);
}

struct Pair {
  std::string name, synth, flags;
};

class FastPathE2e : public ::testing::TestWithParam<Pair> {};

TEST_P(FastPathE2e, SameBytesAsCanonical) {
  const Pair& c = GetParam();
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack("synth " + src + " " + c.synth +
                    " --layers 2 --experts 4 --hidden 256 --inter 128 --seed 3"),
            0);
  expect_identical_outputs(src, c.flags, "direct", tmp);
  expect_direct_takes_every_chunk(src, c.flags);
  // inspect validates through the same path and says which.
  std::string out, err;
  const std::string arch = c.flags.find("sm100") != std::string::npos ? " --target-arch sm100" : "";
  const std::string target =
      (c.flags.find("2026-05") != std::string::npos ? " --vllm-target 2026-05" : "") +
      std::string(c.flags.find("--backend marlin") != std::string::npos ? " --backend marlin" : "");
  ASSERT_EQ(moepack("inspect " + src + arch + target + " --json", &out, &err), 0) << err;
  const json j = json::parse(out, nullptr, false);
  ASSERT_TRUE(j.contains("conversion")) << out;
  EXPECT_EQ(j["conversion"]["path"], "direct");
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, FastPathE2e,
    // The WNA16 pairs name Marlin: on SM90 for vLLM 0.33 `auto` writes Humming.
    ::testing::Values(Pair{"gptq_int4", "--format gptq", "--backend marlin"},
                      Pair{"gptq_int8_channel", "--format gptq --bits 8 --group-size -1",
                           "--backend marlin"},
                      Pair{"gptq_actorder", "--format gptq-actorder", "--vllm-target 2026-05"},
                      Pair{"gptq_mixtral_fp16", "--format gptq --family mixtral --dtype fp16",
                           "--act-dtype fp16 --backend marlin"},
                      Pair{"awq", "--format awq", "--backend marlin"},
                      Pair{"ct_w4a16", "--format ct-w4a16", "--threads 3 --backend marlin"},
                      Pair{"ct_w8a16", "--format ct-w8a16 --family deepseek", "--backend marlin"},
                      Pair{"modelopt_mxfp8", "--format modelopt-mxfp8", "--target-arch sm100"}),
    [](const ::testing::TestParamInfo<Pair>& i) { return i.param.name; });

// vLLM 0.33 pads an intermediate size that is not a multiple of lcm(64, group_size).
TEST(FastPathE2e, PaddedIntermediate) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(
      moepack("synth " + src +
              " --format gptq --group-size 32 --layers 2 --experts 3 --hidden 128 --inter 96"),
      0);
  expect_identical_outputs(src, "--vllm-target 0.33 --backend marlin", "direct", tmp);
  expect_direct_takes_every_chunk(src, "--backend marlin");
}

// The real producers' checkpoints whose pairs have a direct path.
TEST(FastPathE2e, ProducerFixtures) {
  const std::string root = test::source_dir() + "/tests/producers/fixtures";
  if (!fs::is_directory(root)) GTEST_SKIP() << "no producer fixtures at " << root;
  int converted = 0;
  for (const auto& [name, flags] : std::map<std::string, std::string>{
           {"ct-w4a16-g32-qwen3", "--backend marlin"},
           {"ct-w8a16-channel-mixtral", "--backend marlin"},
           {"gptqmodel-dynamic-experts-g64-qwen3", "--backend marlin"},
           {"autoround-autoawq-sym-qwen3", "--backend marlin"},
           {"ct-mxfp8-qwen3", "--target-arch sm100"},
           {"modelopt-mxfp8-mixtral", "--target-arch sm100"},
           {"modelopt-mxfp8-qwen3", "--target-arch sm100"}}) {
    SCOPED_TRACE(name);
    const std::string src = root + "/" + name + "/ckpt";
    if (!fs::is_directory(src)) continue;
    TempDir tmp;
    expect_identical_outputs(src, flags, "direct", tmp);
    expect_direct_takes_every_chunk(src, flags);
    ++converted;
  }
  EXPECT_GT(converted, 0);
}

}  // namespace
}  // namespace moepack
