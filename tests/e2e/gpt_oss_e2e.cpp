// gpt-oss through the CLI on the tiny checkpoint in the published format (tests/gpt_oss): inspect
// reads and validates it (every expert decoded), convert writes marlin-mxfp4 where vLLM 0.33 runs
// Marlin for it (sm80/86/89/120; sm90 with --backend marlin-mxfp4) and triton-mxfp4 where it runs
// the OAI Triton kernels (sm90), verify checks both with the biases, and convert refuses it with
// exit 4 naming what vLLM 0.33 runs elsewhere; a config that disagrees with the tensors exits 3
// naming config.json.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "io/safetensors.h"
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
    // The CUDA runtime adds the biases too (GptOssE2e.VerifiesOnTheDeviceAsOnTheCpu): the same
    // verdict on a device, exit 4 saying so without one.
    const bool gpu = cuda_device_info().available;
    EXPECT_EQ(
        test::moepack_cli("verify " + dst + " --source " + kMxfp4 + " --device cuda", &out, &err),
        gpu ? 0 : 4)
        << err << out;
    if (!gpu) {
      EXPECT_TRUE(contains(err, "no CUDA")) << err;
    }
  }
}

// On sm90 vLLM 0.33 runs the OAI Triton kernels: auto writes triton-mxfp4 (the Hopper swizzle,
// float32 biases; E2 H192 I96: I padded to 128, 6 scale groups to 8, 192 w2 rows to 256 scale
// rows), served by the plugin's gpt-oss-triton builder (--require-servable takes it), verified
// exactly against the source; on shapes the kernel does not run (H = I = 64: N <= 128) and on
// other archs the layout refuses (auto then writes marlin-mxfp4 for the former).
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
  // H = I = 64: both GEMMs' N <= 128, which matmul_ogs on Hopper does not compile: the layout
  // refuses it, and `auto` writes the next layout of vLLM's order that takes it (vLLM 0.33 itself
  // picks TRITON there and fails: tests/e2e/gpt_oss_synth.cpp, Sm90ShapesTritonFailsOn).
  EXPECT_EQ(test::moepack_cli("convert " + kMxfp4 + " " + (tmp / "small") +
                                  " --target-arch sm90 --backend triton-mxfp4",
                              &out, &err),
            4)
      << err;
  EXPECT_TRUE(contains(err, "BLOCK_N % 256")) << err;
  EXPECT_FALSE(fs::exists(tmp / "small"));
  ASSERT_EQ(test::moepack_cli("convert " + kMxfp4 + " " + (tmp / "small") + " --target-arch sm90",
                              &out, &err),
            0)
      << err;
  EXPECT_EQ(test::read_json_file(tmp / "small/moepack.json")["backend"], "marlin-mxfp4");
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

// The three gpt-oss layouts (what vLLM 0.33 runs on sm80, sm90 and sm100) converted from the
// committed fixtures: the arch, the fixture and the layer whose w2 bias the corruption below flips.
struct GptOssLayout {
  const char* arch;
  const char* backend;
  const std::string* fixture;
  int layer;
};
const GptOssLayout kGptOssLayouts[] = {{"sm80", "marlin-mxfp4", &kMxfp4, 1},
                                       {"sm90", "triton-mxfp4", &kMxfp4H192, 0},
                                       {"sm100", "trtllm-mxfp4", &kMxfp4, 1}};

std::string convert_for(const GptOssLayout& l, const std::string& dst) {
  std::string out, err;
  EXPECT_EQ(test::moepack_cli("convert " + *l.fixture + " " + dst + " --target-arch " + l.arch +
                                  " --backend " + l.backend,
                              &out, &err),
            0)
      << err;
  return dst;
}

// verify --device cuda computes gpt-oss' MoE as the CPU path does (the router bias, top-k then
// softmax over the chosen, the expert biases and the clamped SwiGLU: kernels/moe_runtime.h) and
// passes every layer on the device with the report's verdict of the CPU. Skips without a device.
TEST(GptOssE2e, VerifiesOnTheDeviceAsOnTheCpu) {
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  for (const GptOssLayout& l : kGptOssLayouts) {
    SCOPED_TRACE(l.backend);
    test::TempDir tmp;
    const std::string dst = convert_for(l, tmp / "out");
    std::map<std::string, nlohmann::json> reports;
    for (const char* device : {"cpu", "cuda"}) {
      std::string out, err;
      EXPECT_EQ(test::moepack_cli(
                    "verify " + dst + " --source " + *l.fixture + " --device " + device + " --json",
                    &out, &err),
                0)
          << device << err << out;
      reports[device] = nlohmann::json::parse(out, nullptr, false);
      ASSERT_FALSE(reports[device].is_discarded()) << out;
      EXPECT_EQ(reports[device]["activation"], "swigluoai");
    }
    const nlohmann::json& gpu = reports["cuda"];
    EXPECT_GT(gpu["run"]["stages"]["device_seconds"].get<double>(), 0.0) << gpu["run"];
    ASSERT_EQ(gpu["layers"].size(), reports["cpu"]["layers"].size());
    for (size_t i = 0; i < gpu["layers"].size(); ++i) {
      const nlohmann::json& g = gpu["layers"][i];
      EXPECT_EQ(g["passed"], true) << g.dump();
      // The same routing of the same hidden states: the same tokens per expert.
      EXPECT_EQ(g["expert_tokens"], reports["cpu"]["layers"][i]["expert_tokens"]) << g.dump();
    }
  }
}

// One byte of a layer's w2 bias flipped in the converted artifact, the manifest's SHA-256 (and
// config.json's manifest_sha256) rewritten to match, as a buggy converter would write them: the
// round trip names the bias and the layer's numerical check fails, on the CPU and on the device
// (which adds the layout's own biases, so the wrong one shows in its outputs).
void flip_a_w2_bias_byte(const std::string& dir, int layer) {
  const std::string name =
      "model.layers." + std::to_string(layer) + ".mlp.experts.routed_experts.w2_bias";
  nlohmann::json m = test::read_json_file(dir + "/moepack.json");
  const nlohmann::json& t = m["tensors"][name];
  ASSERT_TRUE(t.is_object()) << name;
  const std::string shard = dir + "/" + t["shard"].get<std::string>();
  uint64_t off = 0;
  std::vector<uint8_t> bytes;
  {
    const SafetensorsFile f = SafetensorsFile::open(shard);
    const auto* e = f.find(name);
    ASSERT_NE(e, nullptr) << name;
    off = 8 + f.header_length() + e->begin;
    const TensorView v = f.view(*e);
    bytes.assign(v.data, v.data + v.nbytes);
  }
  // The first value with 0 < |v| < 1 (padding is zero; expert 0's, as a rule) gets its
  // exponent's high bit flipped in its top byte (little-endian BF16 / F32): v * 2^64, finite.
  const std::string dtype = t["dtype"];
  ASSERT_TRUE(dtype == "F32" || dtype == "BF16") << dtype;
  const size_t eb = dtype == "F32" ? 4 : 2;
  size_t at = bytes.size();
  for (size_t i = 0; i + eb <= bytes.size() && at == bytes.size(); i += eb) {
    uint32_t bits = 0;
    std::memcpy(reinterpret_cast<uint8_t*>(&bits) + (4 - eb), &bytes[i], eb);
    float v = 0;
    std::memcpy(&v, &bits, 4);
    if (v != 0 && std::fabs(v) < 1) at = i + eb - 1;
  }
  ASSERT_LT(at, bytes.size()) << name << " holds no value in (0, 1)";
  bytes[at] ^= 0x40;
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off + at));
    f.write(reinterpret_cast<const char*>(&bytes[at]), 1);
  }
  m["tensors"][name]["sha256"] = sha256_hex(bytes.data(), bytes.size());
  const std::string text = m.dump(2);
  std::ofstream(dir + "/moepack.json") << text;
  nlohmann::json cfg = test::read_json_file(dir + "/config.json");
  cfg["quantization_config"]["manifest_sha256"] = sha256_hex(text.data(), text.size());
  std::ofstream(dir + "/config.json") << cfg.dump(2);
}

TEST(GptOssE2e, AFlippedBiasByteFailsOnEveryDevice) {
  std::vector<std::string> devices = {"cpu"};
  if (cuda_device_info().available) devices.push_back("cuda");
  for (const GptOssLayout& l : kGptOssLayouts) {
    SCOPED_TRACE(l.backend);
    test::TempDir tmp;
    const std::string dst = convert_for(l, tmp / "out");
    flip_a_w2_bias_byte(dst, l.layer);
    for (const std::string& device : devices) {
      SCOPED_TRACE("--device " + device);
      std::string out, err;
      EXPECT_EQ(test::moepack_cli(
                    "verify " + dst + " --source " + *l.fixture + " --device " + device + " --json",
                    &out, &err),
                1)
          << err << out;
      const nlohmann::json v = nlohmann::json::parse(out, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << out;
      for (const auto& c : v["integrity"]) EXPECT_EQ(c["passed"], true) << c.dump();
      bool bias_failed = false, layer_failed = false;
      for (const auto& c : v["round_trip"])
        if (c["name"] == "layer " + std::to_string(l.layer) + " w2 bias")
          bias_failed = c["passed"] == false;
      for (const auto& c : v["layers"])
        if (c["layer"] == l.layer) layer_failed = c["passed"] == false;
      EXPECT_TRUE(bias_failed) << v["round_trip"].dump();
      EXPECT_TRUE(layer_failed) << "the numerical check did not fail: " << v["layers"].dump();
    }
  }
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
