// End to end for trtllm-nvfp4 through the real binary: NVFP4 W4A4 checkpoints (ModelOpt NVFP4,
// compressed-tensors NVFP4 with 4-bit float activations) synthesised, inspected and converted for
// sm100, where vLLM 0.33 runs FLASHINFER_TRTLLM, and verified against the source (the round trip
// of codes, scales, and what vLLM keeps of the global and activation scales; the MoE through the
// layout's reader; with a GPU also through the CUDA runtime, whose activations are NVFP4-quantised
// as the kernel's); weight-only NVFP4 never takes the layout.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kernels/moepack_cuda.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_cli;
using test::moepack_json;
using test::TempDir;

const char* kShape = " --layers 2 --experts 4 --hidden 192 --inter 96 --seed 11";

TEST(TrtllmNvfp4E2e, W4a4ConvertsForSm100AndVerifies) {
  for (const std::string format : {"modelopt-nvfp4", "ct-nvfp4-w4a4"}) {
    SCOPED_TRACE(format);
    TempDir tmp;
    const std::string src = tmp / "src", dst = tmp / "dst";
    ASSERT_EQ(moepack_cli("synth " + src + " --format " + format + " --family qwen3" + kShape), 0);
    const json ins = moepack_json("inspect " + src + " --target-arch sm100", 0);
    ASSERT_FALSE(ins.is_discarded());
    EXPECT_NE(ins.dump().find("trtllm-nvfp4"), std::string::npos) << ins.dump();
    const json conv = moepack_json("convert " + src + " " + dst + " --target-arch sm100", 0);
    EXPECT_EQ(conv["backend"], "trtllm-nvfp4") << conv.dump();
    const json man = test::read_json_file(dst + "/moepack.json");
    EXPECT_NE(man.dump().find("w13_input_scale"), std::string::npos)
        << "the layer's activation scales are recorded decisions";
    const json ver = moepack_json("verify " + dst + " --source " + src, 0);
    EXPECT_NE(ver.dump().find("input_scales"), std::string::npos) << "checked bit for bit";
    // The GPU runtime quantises both sides' activations as TRT-LLM does (kNvfp4Block16).
    if (cuda_device_info().available) {
      EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src + " --device cuda"), 0);
    }
  }
}

TEST(TrtllmNvfp4E2e, WeightOnlyNvfp4NeverTakesIt) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack_cli("synth " + src + " --format ct-nvfp4 --family qwen3" + kShape), 0);
  std::string out, err;
  const int rc = moepack_cli(
      "convert " + src + " " + (tmp / "dst") + " --target-arch sm100 --backend trtllm-nvfp4", &out,
      &err);
  EXPECT_EQ(rc, 4) << err;
  EXPECT_NE(err.find("weight-only NVFP4"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(tmp / "dst"));
  std::string out2, err2;
  const int rc2 = moepack_cli(
      "convert " + src + " " + (tmp / "auto") + " --target-arch sm100 --json", &out2, &err2);
  EXPECT_EQ((out2 + err2).find("\"backend\": \"trtllm-nvfp4\""), std::string::npos) << out2;
  (void)rc2;  // Marlin where vLLM runs it, or exit 4 naming the backend vLLM 0.33 would run
}

}  // namespace
}  // namespace moepack
