// --vllm-target end to end through the real binary (docs/vllm_targets.md): both targets convert
// and verify with the names, shapes, act-order handling and padding that vLLM creates, the target
// is recorded in moepack.json, config.json and inspect, an act-order source for 0.33 is exit 4
// naming 2026-05, and compressed-tensors W8A8 scales of mixed dtypes convert and verify.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/half.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_bin;
using test::moepack_cli;
using test::read_json_file;
using test::run_command;
using test::TempDir;

// Shapes of the converted tensors of one layer by their name after `prefix`.
std::map<std::string, std::vector<int64_t>> params_under(const json& manifest,
                                                         const std::string& prefix) {
  std::map<std::string, std::vector<int64_t>> out;
  for (auto it = manifest["tensors"].begin(); it != manifest["tensors"].end(); ++it)
    if (it.key().rfind(prefix, 0) == 0 && it.value()["action"] == "convert")
      out[it.key().substr(prefix.size())] = it.value()["shape"].get<std::vector<int64_t>>();
  return out;
}

const char* kLayer = "model.layers.1.mlp.experts.";

TEST(VllmTargetsE2e, GptqBothTargetsNamesRecordedAndVerified) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format gptq --layers 2 --experts 3 --hidden 256 --inter 128"),
            0);
  for (const std::string target : {"0.33", "2026-05", ""}) {
    SCOPED_TRACE("--vllm-target " + target);
    const std::string dst = tmp / ("dst" + target);
    std::string out, err;
    ASSERT_EQ(moepack_cli(
                  "convert " + src + " " + dst + (target.empty() ? "" : " --vllm-target " + target),
                  &out, &err),
              0)
        << err;
    const std::string want = target.empty() ? "0.33" : target;
    const json m = read_json_file(dst + "/moepack.json");
    EXPECT_EQ(m["vllm_target"], want);
    EXPECT_EQ(read_json_file(dst + "/config.json")["moepack"]["vllm_target"], want);
    const std::string prefix = std::string(kLayer) + (want == "0.33" ? "routed_experts." : "");
    const auto p = params_under(m, prefix);
    // 0.33 on SM90 (the default arch): Humming's parameters, as vLLM 0.33's Humming
    // post-processing leaves them; 2026-05: Marlin's, with empty [E, 0] act-order parameters.
    if (want == "0.33") {
      EXPECT_EQ(m["backend"], "humming");
      EXPECT_EQ(p.size(), 4u) << m["tensors"].dump();
      EXPECT_EQ(p.at("w13_weight"), (std::vector<int64_t>{3, 256 / 16, 256 * 16 * 4 / 32}));
      EXPECT_EQ(p.at("w2_weight_scale"), (std::vector<int64_t>{3, 1, 256}));
    } else {
      EXPECT_EQ(m["backend"], "marlin");
      EXPECT_TRUE(p.count("w13_qweight") && p.count("w2_scales")) << m["tensors"].dump();
      EXPECT_EQ(p.count("w13_g_idx"), 1u);
      EXPECT_EQ(p.count("w2_g_idx_sort_indices"), 1u);
      EXPECT_EQ(p.at("w2_g_idx"), (std::vector<int64_t>{3, 0}));
    }
    EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src, &out, &err), 0) << out << err;
    const json ins = json::parse([&] {
      std::string o;
      moepack_cli("inspect " + dst + " --json", &o);
      return o;
    }());
    EXPECT_EQ(ins["moepack"]["vllm_target"], want);
  }
}

// inspect --json gives the oracle's decision per target and arch: moepack's choice, what that
// vLLM's own oracle would run, the note where they differ, and vLLM's order judged for the layer.
TEST(VllmTargetsE2e, InspectJsonShowsVllmOrderAndPick) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format gptq --layers 2 --experts 3 --hidden 256 --inter 128"),
            0);
  struct Want {
    std::string target, arch, pick, first_runs, chosen, backend = "auto";
  };
  for (const Want& w : {Want{"0.33", "sm90", "humming", "HUMMING", "humming"},
                        Want{"0.33", "sm90", "humming", "HUMMING", "marlin", "marlin"},
                        Want{"0.33", "sm100", "marlin", "MARLIN", "marlin"},
                        Want{"2026-05", "sm90", "marlin", "MARLIN", "marlin"}}) {
    SCOPED_TRACE(w.target + " " + w.arch);
    const json ins =
        test::moepack_json("inspect " + src + " --no-validate --vllm-target " + w.target +
                               " --target-arch " + w.arch + " --backend " + w.backend,
                           0);
    const json& kind = ins["oracle"]["kinds"].at(0);
    EXPECT_EQ(kind["scheme"], "wna16");
    EXPECT_EQ(kind["chosen"], w.chosen);
    EXPECT_EQ(kind["vllm_would_pick"], w.pick);
    EXPECT_EQ(kind.contains("vllm_note"), w.pick != w.chosen) << kind.dump(1);
    if (w.pick != w.chosen) {
      EXPECT_NE(kind["vllm_note"].get<std::string>().find("--moe-backend marlin"),
                std::string::npos);
    }
    ASSERT_TRUE(kind["candidates"].is_array());
    EXPECT_EQ(kind["candidates"].at(0)["backend"], w.chosen);
    std::string first_runs;
    for (const auto& b : kind["vllm_order"]) {
      EXPECT_EQ(b["vllm_runs"], b["reasons"].empty()) << b.dump();
      if (first_runs.empty() && b["vllm_runs"] == true) first_runs = b["backend"];
    }
    EXPECT_EQ(first_runs, w.first_runs);
    EXPECT_FALSE(kind["vllm_order_source"].get<std::string>().empty());
  }
}

TEST(VllmTargetsE2e, ActOrderIsExit4For033NamingTheTargetAndEKForEveryProjectionIn2026_05) {
  TempDir tmp;
  const std::string src = tmp / "src";
  // I == group size: w2 holds one group, and vLLM@9aaf83ef still creates its g_idx as [E, K].
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format gptq-actorder --layers 2 --experts 2 --hidden 256 --inter 128 "
                        "--group-size 128"),
            0);
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert " + src + " " + (tmp / "d033"), &out, &err), 4);
  EXPECT_NE(err.find("act-order"), std::string::npos) << err;
  EXPECT_NE(err.find("--vllm-target 2026-05"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(tmp / "d033"));
  // inspect judges for 0.33 the same way.
  std::string ins;
  moepack_cli("inspect " + src, &ins);
  EXPECT_NE(ins.find("--vllm-target 2026-05"), std::string::npos) << ins;

  const std::string dst = tmp / "d05";
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --vllm-target 2026-05", &out, &err), 0)
      << err;
  const auto p = params_under(read_json_file(dst + "/moepack.json"), kLayer);
  EXPECT_EQ(p.at("w13_g_idx"), (std::vector<int64_t>{2, 256}));
  EXPECT_EQ(p.at("w13_g_idx_sort_indices"), (std::vector<int64_t>{2, 256}));
  EXPECT_EQ(p.at("w2_g_idx"), (std::vector<int64_t>{2, 128}));
  EXPECT_EQ(p.at("w2_g_idx_sort_indices"), (std::vector<int64_t>{2, 128}));
  EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src, &out, &err), 0) << out << err;
}

TEST(VllmTargetsE2e, MarlinPadsIntermediateFor033RecordsBothSizesAndVerifies) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(
      moepack_cli("synth " + src +
                  " --format gptq --layers 2 --experts 2 --hidden 256 --inter 96 --group-size 32"),
      0);
  std::string out, err;
  const std::string dst = tmp / "d033";
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --backend marlin", &out, &err), 0) << err;
  const json m = read_json_file(dst + "/moepack.json");
  EXPECT_EQ(m["layers"][0]["inter"], 96);
  EXPECT_EQ(m["layers"][0]["inter_padded"], 128);
  const auto p = params_under(m, std::string(kLayer) + "routed_experts.");
  EXPECT_EQ(p.at("w13_qweight"), (std::vector<int64_t>{2, 256 / 16, 2 * 128 * 2}));
  EXPECT_EQ(p.at("w2_qweight"), (std::vector<int64_t>{2, 128 / 16, 256 * 2}));
  EXPECT_EQ(p.at("w2_scales"), (std::vector<int64_t>{2, 128 / 32, 256}));
  EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src, &out, &err), 0) << out << err;
  std::string ins;
  moepack_cli("inspect " + dst, &ins);
  EXPECT_NE(ins.find("I=96 (padded to 128)"), std::string::npos) << ins;
  // 2026-05 does not pad: Marlin refuses I = 96 (exit 4), auto falls back to Triton WNA16.
  EXPECT_EQ(
      moepack_cli("convert " + src + " " + (tmp / "x") + " --backend marlin --vllm-target 2026-05",
                  &out, &err),
      4);
  ASSERT_EQ(
      moepack_cli("convert " + src + " " + (tmp / "d05") + " --vllm-target 2026-05", &out, &err),
      0);
  EXPECT_EQ(read_json_file(tmp / "d05/moepack.json")["backend"], "triton-wna16");
}

// Triton WNA16's narrowed w2 scales (I not a multiple of the group size) have no synth
// checkpoint (synth makes K a multiple of the group size); tests/unit/vllm_conformance.cpp covers
// them on random layers and in TritonHalvedGroupNarrowsW2ScalesToIOverHalvedGroup.

// Issue 10, class 3: compressed-tensors W8A8 int8 scales in F32 for one expert and BF16 for the
// rest; vLLM copies each into its float32 parameter, and so does moepack.
TEST(VllmTargetsE2e, CtW8a8MixedScaleDtypesConvertAndVerify) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format ct-w8a8 --layers 2 --experts 3 --hidden 128 --inter 128"),
            0);
  const std::string file = src + "/model.safetensors";
  std::vector<Tensor> tensors;
  {
    const SafetensorsFile st = SafetensorsFile::open(file);
    for (const SafetensorsEntry& e : st.entries()) {
      const std::string& name = e.name;
      Tensor t = Tensor::from_view(st.view(e));
      const bool widen = name.find("experts.1.") != std::string::npos &&
                         name.find("weight_scale") != std::string::npos;
      const bool f16 = name.find("experts.2.down_proj.weight_scale") != std::string::npos;
      if ((widen || f16) && t.dtype == DType::kBF16) {
        Tensor w(name, widen ? DType::kF32 : DType::kF16, t.shape);
        for (int64_t i = 0; i < numel(t.shape); ++i) {
          const float v = bf16_to_float(t.as<uint16_t>()[i]);
          if (widen)
            w.as<float>()[i] = v;
          else
            w.as<uint16_t>()[i] = float_to_f16(v);
        }
        t = std::move(w);
      }
      tensors.push_back(std::move(t));
    }
  }
  write_safetensors(file, tensors);
  std::string out, err;
  const std::string dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst, &out, &err), 0) << err;
  EXPECT_EQ(read_json_file(dst + "/moepack.json")["backend"], "triton-int8");
  EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src, &out, &err), 0) << out << err;
}

}  // namespace
}  // namespace moepack
