// gpt-oss through the CLI on the tiny checkpoint in the published format (tests/gpt_oss): inspect
// reads and validates it (every expert decoded), convert refuses it with exit 4 naming what vLLM
// 0.33 runs for it on the target arch, and a config that disagrees with the tensors exits 3
// naming config.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_util.h"

namespace moepack {
namespace {

namespace fs = std::filesystem;

const std::string kMxfp4 = test::source_dir() + "/tests/gpt_oss/fixtures/mxfp4";
const std::string kBf16 = test::source_dir() + "/tests/gpt_oss/fixtures/bf16";

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

TEST(GptOssE2e, ConvertNamesWhatVllmRunsPerArch) {
  struct Case {
    const char* arch;
    const char* backend;
    const char* layout;
  };
  for (const Case& k :
       {Case{"sm90", "TRITON", "triton-mxfp4"},
        Case{"sm100", "FLASHINFER_TRTLLM_MXFP4_BF16", "trtllm-mxfp4"},
        Case{"sm80", "MARLIN", "marlin-mxfp4"}, Case{"sm120", "MARLIN", "marlin-mxfp4"}}) {
    SCOPED_TRACE(k.arch);
    test::TempDir tmp;
    std::string out, err;
    EXPECT_EQ(
        test::moepack_cli("convert " + kMxfp4 + " " + (tmp / "out") + " --target-arch " + k.arch,
                          &out, &err),
        4)
        << err;
    EXPECT_TRUE(contains(err, std::string("runs ") + k.backend + " for this layer")) << err;
    EXPECT_TRUE(contains(err, std::string("no ") + k.layout + " layout yet")) << err;
    EXPECT_FALSE(fs::exists(tmp / "out"));
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
