// Servability through the real binary (pipeline/servability.h): convert and inspect say whether
// moepack-vllm serves the output, in which vLLM, at which TP/EP and why not; an unservable default
// convert warns, --require-servable exits 4 with nothing written; no refusal recommends a target
// without saying it is not served.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_cli;
using test::moepack_json;
using test::TempDir;

const char* kSmall = " --layers 2 --experts 4 --hidden 256 --inter 128";

TEST(ServabilityCli, AServedOutputSaysWhereAndHow) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq" + kSmall), 0);
  // Marlin named (sm90's default is Humming, served by another kernel builder).
  const json ins = moepack_json("inspect " + src + " --vllm-target 0.33 --backend marlin", 0);
  EXPECT_EQ(ins["serving"]["servable"], true) << ins["serving"];
  EXPECT_EQ(ins["oracle"]["kinds"][0]["serving"]["backend"], "marlin");
  const json conv =
      moepack_json("convert " + src + " " + dst + " --backend marlin --require-servable", 0);
  const json& s = conv["serving"];
  EXPECT_EQ(s["servable"], true) << s;
  EXPECT_EQ(s["plugin"], "moepack-vllm");
  EXPECT_EQ(s["vllm_target"], "0.33");
  EXPECT_EQ(s["tensor_parallel_size"], 1);
  EXPECT_EQ(s["expert_parallel"], false);
  EXPECT_EQ(s["how"], "kernel builder wna16-marlin");
  // The converted checkpoint, as its moepack.json records it.
  EXPECT_EQ(moepack_json("inspect " + dst + " --require-servable", 0)["serving"]["servable"], true);
  std::string out, err;
  ASSERT_EQ(moepack_cli("inspect " + dst, &out, &err), 0);
  EXPECT_NE(out.find("serving        servable by moepack-vllm in vLLM 0.33"), std::string::npos)
      << out;
  EXPECT_NE(out.find("TP 1 only, no expert parallelism"), std::string::npos) << out;
}

TEST(ServabilityCli, AnUnservedOutputWarnsAndRequireServableRefusesIt) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src + " --format ct-w8a8" + kSmall), 0);
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert " + src + " " + dst + " --require-servable", &out, &err), 4);
  EXPECT_NE(err.find("--require-servable: NOT servable by moepack-vllm (triton-int8)"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(dst));
  EXPECT_EQ(moepack_json("convert " + src + " " + dst + " --require-servable", 4)["error"]["code"],
            "unsupported");
  EXPECT_FALSE(fs::exists(dst));
  // Without the flag: written, with a warning on stderr and the reason in the result.
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst, &out, &err), 0) << err;
  EXPECT_NE(err.find("warning: the output will be NOT servable"), std::string::npos) << err;
  EXPECT_NE(out.find("serving: NOT servable by moepack-vllm"), std::string::npos) << out;
  const json ins = moepack_json("inspect " + dst, 0);
  EXPECT_EQ(ins["serving"]["servable"], false);
  EXPECT_NE(ins["serving"]["reason"].get<std::string>().find("W8A8 int8"), std::string::npos);
  EXPECT_EQ(moepack_cli("inspect " + dst + " --require-servable", &out, &err), 4);
}

TEST(ServabilityCli, AnotherVllmTargetIsNotServedAndSaysSo) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq-actorder" + kSmall), 0);
  // The act-order refusal for 0.33 names 2026-05 and says that nothing serves it.
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert " + src + " " + dst, &out, &err), 4);
  EXPECT_NE(err.find("--vllm-target 2026-05"), std::string::npos) << err;
  EXPECT_NE(err.find("no moepack-vllm serves that target"), std::string::npos) << err;
  const json conv = moepack_json("convert " + src + " " + dst + " --vllm-target 2026-05", 0);
  EXPECT_EQ(conv["serving"]["servable"], false);
  EXPECT_NE(conv["serving"]["reason"].get<std::string>().find(
                "moepack-vllm serves --vllm-target 0.33 only"),
            std::string::npos)
      << conv["serving"];
  EXPECT_EQ(moepack_cli("inspect " + dst + " --require-servable", &out, &err), 4);
}

}  // namespace
}  // namespace moepack
