// gpt-oss through the CLI on the tiny checkpoint in the published format (tests/gpt_oss): inspect
// reads and validates it (every expert decoded), convert writes marlin-mxfp4 where vLLM 0.33 runs
// Marlin for it (sm80/86/89/120; sm90 with --backend marlin-mxfp4) and triton-mxfp4 where it runs
// the OAI Triton kernels (sm90), verify checks both with the biases, and convert refuses it with
// exit 4 naming what vLLM 0.33 runs elsewhere; a config that disagrees with the tensors exits 3
// naming config.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/moepack_cuda.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

namespace fs = std::filesystem;

const std::string kMxfp4 = test::source_dir() + "/tests/gpt_oss/fixtures/mxfp4";
const std::string kBf16 = test::source_dir() + "/tests/gpt_oss/fixtures/bf16";
// E2 H192 I96, one layer, the published format (bench/gpt_oss_checkpoint.py --experts 2 --hidden
// 192 --inter 96 --layers 1 --vocab 16 --seed 192): a shape the OAI Triton kernels run on Hopper.
const std::string kMxfp4H192 = test::source_dir() + "/tests/gpt_oss/fixtures/mxfp4_e2_h192_i96";

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST(GptOssE2e, InspectValidatesEveryExpert) {
  std::string out, err;
  ASSERT_EQ(test::moepack_cli("inspect " + kMxfp4 + " --target-arch sm90 --json", &out, &err), 0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["format"]["method"], "gpt-oss-mxfp4") << out;
  EXPECT_TRUE(contains(out, "\"gpt-oss-mxfp4\"")) << out;
  EXPECT_TRUE(contains(out, "TRITON")) << out;
  std::string text;
  ASSERT_EQ(test::moepack_cli("inspect " + kMxfp4, &text, &err), 0) << err;
  EXPECT_TRUE(contains(text, "gpt-oss  E=4 H=64 I=64")) << text;
  EXPECT_TRUE(contains(text, "validated")) << text;
}

// Where vLLM 0.33 runs MARLIN for gpt-oss, auto writes marlin-mxfp4 with the biases, named and
// shaped as GptOssMxfp4MoEMethod leaves the layer (H = I = 64 padded to 256 / 128), and verify
// checks it exactly against the source (round trip of codes, scales and biases; the MoE with the
// biases and the clamped SwiGLU).
TEST(GptOssE2e, ConvertsToMarlinWhereVllmRunsMarlinAndVerifies) {
  for (const char* arch : {"sm80", "sm86", "sm89", "sm120"}) {
    SCOPED_TRACE(arch);
    test::TempDir tmp;
    const std::string dst = tmp / "out";
    std::string out, err;
    ASSERT_EQ(
        test::moepack_cli("convert " + kMxfp4 + " " + dst + " --target-arch " + arch, &out, &err),
        0)
        << err;
    const nlohmann::json m = test::read_json_file(dst + "/moepack.json");
    EXPECT_EQ(m["backend"], "marlin-mxfp4");
    const std::string p = "model.layers.1.mlp.experts.routed_experts.";
    struct Want {
      const char* name;
      const char* dtype;
      std::vector<int64_t> shape;
      const char* role;
    };
    for (const Want& w : {Want{"w13_weight", "I32", {4, 16, 512}, "w13_weight"},
                          Want{"w2_weight", "I32", {4, 8, 512}, "w2_weight"},
                          Want{"w13_weight_scale", "F8_E8M0", {4, 8, 256}, "w13_scale"},
                          Want{"w2_weight_scale", "F8_E8M0", {4, 4, 256}, "w2_scale"},
                          Want{"w13_bias", "BF16", {4, 256}, "w13_bias"},
                          Want{"w2_bias", "BF16", {4, 256}, "w2_bias"}}) {
      const nlohmann::json& t = m["tensors"][p + w.name];
      EXPECT_EQ(t["dtype"], w.dtype) << w.name;
      EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), w.shape) << w.name;
    }
    std::string report;
    EXPECT_EQ(test::moepack_cli("verify " + dst + " --source " + kMxfp4 + " --json", &report, &err),
              0)
        << err << report;
    const nlohmann::json v = nlohmann::json::parse(report);
    bool bias_checked = false;
    for (const auto& c : v["round_trip"])
      bias_checked = bias_checked || c["name"] == "layer 1 w13 bias";
    EXPECT_TRUE(bias_checked) << report;
    // The CUDA runtime adds no biases: the device path refuses the layers (or there is none).
    EXPECT_EQ(test::moepack_cli("verify " + dst + " --device cuda", &out, &err), 4) << err;
    EXPECT_TRUE(contains(err, cuda_device_info().available ? "carry biases" : "no CUDA")) << err;
  }
}

// On sm90 vLLM 0.33 runs the OAI Triton kernels: auto writes triton-mxfp4 (the Hopper swizzle,
// float32 biases; E2 H192 I96: I padded to 128, 6 scale groups to 8, 192 w2 rows to 256 scale
// rows), served by the plugin's gpt-oss-triton builder (--require-servable takes it), verified
// exactly against the source; on shapes the kernel does not run (H = I = 64: N <= 128) and on
// other archs it refuses.
TEST(GptOssE2e, ConvertsToTritonOnSm90AndVerifies) {
  test::TempDir tmp;
  const std::string dst = tmp / "out";
  std::string out, err;
  ASSERT_EQ(
      test::moepack_cli("convert " + kMxfp4H192 + " " + dst + " --target-arch sm90", &out, &err), 0)
      << err;
  EXPECT_FALSE(contains(err, "NOT servable")) << err;
  const nlohmann::json m = test::read_json_file(dst + "/moepack.json");
  EXPECT_EQ(m["backend"], "triton-mxfp4");
  EXPECT_EQ(m["serving"]["path"], "kernel-builder") << m["serving"];
  EXPECT_EQ(m["serving"]["kernel_builder"], "gpt-oss-triton") << m["serving"];
  const std::string p = "model.layers.0.mlp.experts.routed_experts.";
  struct Want {
    const char* name;
    const char* dtype;
    std::vector<int64_t> shape;
  };
  for (const Want& w :
       {Want{"w13_weight", "U8", {2, 64, 384}}, Want{"w2_weight", "U8", {2, 48, 256}},
        Want{"w13_weight_scale", "U8", {2, 8, 256}}, Want{"w2_weight_scale", "U8", {2, 8, 128}},
        Want{"w13_bias", "F32", {2, 256}}, Want{"w2_bias", "F32", {2, 192}}}) {
    const nlohmann::json& t = m["tensors"][p + w.name];
    EXPECT_EQ(t["dtype"], w.dtype) << w.name;
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), w.shape) << w.name;
  }
  std::string report;
  EXPECT_EQ(
      test::moepack_cli("verify " + dst + " --source " + kMxfp4H192 + " --json", &report, &err), 0)
      << err << report;
  const nlohmann::json v = nlohmann::json::parse(report);
  bool bias_checked = false;
  for (const auto& c : v["round_trip"])
    bias_checked = bias_checked || c["name"] == "layer 0 w2 bias";
  EXPECT_TRUE(bias_checked) << report;
  // inspect: moepack and vLLM's own oracle agree on TRITON.
  ASSERT_EQ(test::moepack_cli("inspect " + kMxfp4H192 + " --target-arch sm90 --json", &out, &err),
            0)
      << err;
  EXPECT_TRUE(contains(out, "\"vllm_would_pick\": \"triton-mxfp4\"")) << out;
  EXPECT_EQ(test::moepack_cli("convert " + kMxfp4H192 + " " + (tmp / "served") +
                                  " --target-arch sm90 --require-servable",
                              &out, &err),
            0)
      << err;
  EXPECT_TRUE(fs::exists(tmp / "served/moepack.json"));
  // The Hopper swizzle only: on sm80 (Marlin's arch) and sm100 (Blackwell's swizzle) it refuses.
  for (const char* arch : {"sm80", "sm100"}) {
    EXPECT_EQ(test::moepack_cli("convert " + kMxfp4H192 + " " + (tmp / arch) + " --target-arch " +
                                    arch + " --backend triton-mxfp4",
                                &out, &err),
              4)
        << arch << err;
    EXPECT_TRUE(contains(err, "runs only on SM90")) << err;
  }
  // H = I = 64: both GEMMs' N <= 128, which matmul_ogs on Hopper does not compile.
  EXPECT_EQ(test::moepack_cli("convert " + kMxfp4 + " " + (tmp / "small") + " --target-arch sm90",
                              &out, &err),
            4)
      << err;
  EXPECT_TRUE(contains(err, "BLOCK_N % 256")) << err;
}

// On sm100 vLLM 0.33 runs FLASHINFER_TRTLLM_MXFP4_BF16 for gpt-oss: auto writes trtllm-mxfp4 with
// the biases, named, typed and shaped as convert_gpt_oss_weight_to_mxfp4_moe_kernel_format leaves
// the layer (H = I = 64 padded to 256 / 128; the E8M0 scales viewed as float8_e4m3fn, the biases
// widened to float32), and verify checks it exactly against the source.
TEST(GptOssE2e, Sm100WritesTrtllmMxfp4AndVerifies) {
  test::TempDir tmp;
  const std::string dst = tmp / "out";
  std::string out, err;
  ASSERT_EQ(test::moepack_cli("convert " + kMxfp4 + " " + dst + " --target-arch sm100", &out, &err),
            0)
      << err;
  const nlohmann::json m = test::read_json_file(dst + "/moepack.json");
  EXPECT_EQ(m["backend"], "trtllm-mxfp4");
  // Served by the plugin's gpt-oss-trtllm builder (vLLM's GptOssMxfp4MoEMethod, no conversion).
  EXPECT_EQ(m["serving"]["path"], "kernel-builder") << m["serving"];
  EXPECT_EQ(m["serving"]["kernel_builder"], "gpt-oss-trtllm") << m["serving"];
  const std::string p = "model.layers.1.mlp.experts.routed_experts.";
  struct Want {
    const char* name;
    const char* dtype;
    std::vector<int64_t> shape;
  };
  for (const Want& w :
       {Want{"w13_weight", "U8", {4, 256, 128}}, Want{"w2_weight", "U8", {4, 256, 64}},
        Want{"w13_weight_scale", "F8_E4M3", {4, 256, 8}},
        Want{"w2_weight_scale", "F8_E4M3", {4, 256, 4}}, Want{"w13_bias", "F32", {4, 256}},
        Want{"w2_bias", "F32", {4, 256}}}) {
    const nlohmann::json& t = m["tensors"][p + w.name];
    EXPECT_EQ(t["dtype"], w.dtype) << w.name;
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), w.shape) << w.name;
  }
  std::string report;
  EXPECT_EQ(test::moepack_cli("verify " + dst + " --source " + kMxfp4 + " --json", &report, &err),
            0)
      << err << report;
  const nlohmann::json v = nlohmann::json::parse(report);
  bool bias_checked = false;
  for (const auto& c : v["round_trip"])
    bias_checked = bias_checked || c["name"] == "layer 1 w13 bias";
  EXPECT_TRUE(bias_checked) << report;
  ASSERT_EQ(test::moepack_cli("inspect " + kMxfp4 + " --target-arch sm100 --json", &out, &err), 0)
      << err;
  EXPECT_TRUE(contains(out, "trtllm-mxfp4")) << out;
  // Not what vLLM 0.33 runs on another arch, and never for another vLLM target.
  EXPECT_EQ(test::moepack_cli("convert " + kMxfp4 + " " + (tmp / "o2") +
                                  " --target-arch sm90 --backend trtllm-mxfp4",
                              &out, &err),
            4)
      << err;
  EXPECT_EQ(test::moepack_cli("convert " + kMxfp4 + " " + (tmp / "o3") +
                                  " --target-arch sm100 --vllm-target 2026-05",
                              &out, &err),
            4)
      << err;
}

// On sm90 vLLM runs the OAI Triton kernels: auto writes triton-mxfp4 (above), --backend
// marlin-mxfp4 writes Marlin's layout (what vLLM runs there with --moe-backend marlin), and inspect
// with that backend says what vLLM's own oracle would pick and why.
TEST(GptOssE2e, Sm90WritesMarlinOnlyWhenAsked) {
  test::TempDir tmp;
  std::string out, err;
  ASSERT_EQ(test::moepack_cli("convert " + kMxfp4H192 + " " + (tmp / "out") +
                                  " --target-arch sm90 --backend marlin-mxfp4",
                              &out, &err),
            0)
      << err;
  EXPECT_EQ(test::moepack_cli("verify " + (tmp / "out") + " --source " + kMxfp4H192, &out, &err), 0)
      << err << out;
  ASSERT_EQ(test::moepack_cli(
                "inspect " + kMxfp4H192 + " --target-arch sm90 --backend marlin-mxfp4", &out, &err),
            0)
      << err;
  EXPECT_TRUE(contains(out, "would pick triton") && contains(out, "TRITON")) << out;
  EXPECT_TRUE(contains(out, "--moe-backend marlin")) << out;
}

TEST(GptOssE2e, Bf16VariantIsReadAndRefusedForConversion) {
  test::TempDir tmp;
  std::string out, err;
  ASSERT_EQ(test::moepack_cli("inspect " + kBf16 + " --no-validate", &out, &err), 0) << err;
  EXPECT_TRUE(contains(out, "gpt-oss  E=4 H=64 I=64")) << out;
  EXPECT_EQ(
      test::moepack_cli("convert " + kBf16 + " " + (tmp / "out") + " --quantize mxfp8", &out, &err),
      4)
      << err;
  EXPECT_TRUE(contains(err, "gpt-oss")) << err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(GptOssE2e, ConfigDisagreeingWithTheTensorsExits3) {
  test::TempDir tmp;
  const std::string dir = tmp / "ckpt";
  fs::copy(kMxfp4, dir);
  nlohmann::json cfg;
  std::ifstream(dir + "/config.json") >> cfg;
  cfg["intermediate_size"] = 96;
  std::ofstream(dir + "/config.json") << cfg.dump();
  std::string out, err;
  EXPECT_EQ(test::moepack_cli("inspect " + dir, &out, &err), 3) << err;
  EXPECT_TRUE(contains(err, "config.json")) << err;
  EXPECT_TRUE(contains(err, "intermediate_size")) << err;
}

}  // namespace
}  // namespace moepack
