// `moepack synth --format gpt-oss-mxfp4` (family gpt_oss) and `--family gpt_oss --format bf16`:
// the published gpt-oss layout (tensor names, dtypes and shapes of the committed fixture
// tests/gpt_oss/fixtures/mxfp4, its config fields), inspected, converted to the three gpt-oss
// layouts and verified; the same bytes for every thread count and shard size; the options synth
// refuses. That transformers loads the output: tests/gpt_oss/synth_loads.sh (ctest
// gpt_oss_synth_transformers).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/sha256.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_cli;
using test::moepack_json;
using test::read_json_file;
using test::TempDir;

const std::string kFixture = test::source_dir() + "/tests/gpt_oss/fixtures/mxfp4";

struct Entry {
  std::string dtype;
  Shape shape;
  std::string sha;  // of the tensor's bytes
};

// Every tensor of a checkpoint directory (any sharding): dtype, shape and the bytes' SHA-256.
std::map<std::string, Entry> tensors_of(const std::string& dir) {
  std::map<std::string, Entry> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const SafetensorsFile f = SafetensorsFile::open(e.path().string());
    for (const auto& t : f.entries()) {
      const TensorView v = f.view(t);
      out[t.name] = {dtype_name(t.dtype), t.shape, sha256_hex(v.data, v.nbytes)};
    }
  }
  return out;
}

std::string file_sha256(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  Sha256 h;
  std::vector<char> buf(1 << 16);
  while (f.read(buf.data(), static_cast<std::streamsize>(buf.size())) || f.gcount() > 0)
    h.update(buf.data(), static_cast<size_t>(f.gcount()));
  return h.hex_digest();
}

// The fixture's layer-0 tensor names with the layer index as given.
std::string layer_name(const std::string& name, int64_t layer) {
  const std::string from = "model.layers.0.";
  if (name.rfind(from, 0) != 0) return name;
  return "model.layers." + std::to_string(layer) + "." + name.substr(from.size());
}

// Same names, dtypes and shapes as the published-format fixture (E4 H64 I64, 2 layers, 256
// vocabulary): the layout, not only what moepack reads. The fixture's attention has 2 heads of
// 32 and synth's 4 of 64 (attention is not converted): those shapes are compared by rank only.
TEST(GptOssSynth, WritesThePublishedLayoutAndConfig) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format gpt-oss-mxfp4 --layers 2 --experts 4 --hidden 64 --inter 64 "
                        "--vocab 256 --seed 1"),
            0);
  const auto want = tensors_of(kFixture);
  const auto have = tensors_of(src);
  ASSERT_EQ(have.size(), want.size());
  for (const auto& [name, w] : want) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(have.count(name));
    const Entry& h = have.at(name);
    EXPECT_EQ(h.dtype, w.dtype);
    if (name.find("self_attn") != std::string::npos)
      EXPECT_EQ(h.shape.size(), w.shape.size());
    else
      EXPECT_EQ(h.shape, w.shape);
  }
  const json cfg = read_json_file(src + "/config.json");
  const json ref = read_json_file(kFixture + "/config.json");
  for (const char* key :
       {"architectures", "model_type", "hidden_size", "intermediate_size", "num_local_experts",
        "num_experts_per_tok", "num_hidden_layers", "swiglu_limit", "quantization_config",
        "layer_types", "torch_dtype", "attention_bias", "vocab_size"})
    EXPECT_EQ(cfg[key], ref[key]) << key;
  EXPECT_EQ(cfg["experts_per_token"], cfg["num_experts_per_tok"]);
  EXPECT_EQ(cfg["head_dim"].get<int64_t>() * cfg["num_attention_heads"].get<int64_t>(),
            have.at("model.layers.0.self_attn.q_proj.weight").shape[0]);
  // The bf16 variant: transformers' parameters, [E, H, 2I] and [E, I, H], the same biases.
  const std::string bf = tmp / "bf16";
  ASSERT_EQ(moepack_cli("synth " + bf +
                        " --family gpt_oss --format bf16 --layers 2 --experts 4 --hidden 64 "
                        "--inter 32 --seed 1"),
            0);
  const auto b = tensors_of(bf);
  for (int64_t L = 0; L < 2; ++L) {
    EXPECT_EQ(b.at(layer_name("model.layers.0.mlp.experts.gate_up_proj", L)).shape,
              (Shape{4, 64, 64}));
    EXPECT_EQ(b.at(layer_name("model.layers.0.mlp.experts.down_proj", L)).shape,
              (Shape{4, 32, 64}));
    EXPECT_EQ(b.at(layer_name("model.layers.0.mlp.experts.gate_up_proj_bias", L)).shape,
              (Shape{4, 64}));
    EXPECT_FALSE(b.count(layer_name("model.layers.0.mlp.experts.gate_up_proj_blocks", L)));
  }
  EXPECT_FALSE(read_json_file(bf + "/config.json").contains("quantization_config"));
}

// synth -> inspect -> convert to each gpt-oss layout where vLLM 0.33 runs it -> verify with the
// source (biases and the clamped SwiGLU; codes, scales and biases round-tripped).
TEST(GptOssSynth, InspectConvertVerifyEveryLayout) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format gpt-oss-mxfp4 --layers 2 --experts 5 --hidden 192 --inter 160 "
                        "--top-k 3 --seed 4"),
            0);
  const json ins = moepack_json("inspect " + src + " --target-arch sm90", 0);
  EXPECT_EQ(ins["format"]["method"], "gpt-oss-mxfp4");
  ASSERT_EQ(ins["moe"]["layers"], 2);
  for (const auto& l : ins["moe"]["layer_list"]) {
    EXPECT_EQ(l["experts"], 5);
    EXPECT_EQ(l["hidden"], 192);
    EXPECT_EQ(l["inter"], 160);
    EXPECT_EQ(l["family"], "gpt-oss");
  }
  std::string out, err;
  struct Target {
    const char* arch;
    const char* extra;
    const char* backend;
  };
  for (const Target& t : {Target{"sm90", "", "triton-mxfp4"}, Target{"sm80", "", "marlin-mxfp4"},
                          Target{"sm90", " --backend marlin-mxfp4", "marlin-mxfp4"},
                          Target{"sm100", "", "trtllm-mxfp4"}}) {
    SCOPED_TRACE(std::string(t.arch) + t.extra);
    const std::string dst = tmp / (std::string("dst-") + t.arch + (*t.extra ? "-m" : ""));
    ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --target-arch " + t.arch + t.extra, &out,
                          &err),
              0)
        << err;
    EXPECT_EQ(read_json_file(dst + "/moepack.json")["backend"], t.backend);
    std::string report;
    ASSERT_EQ(moepack_cli("verify " + dst + " --source " + src + " --json", &report, &err), 0)
        << err << report;
    const json v = json::parse(report);
    EXPECT_EQ(v["passed"], true);
    ASSERT_EQ(v["layers"].size(), 2u);
    for (const auto& l : v["layers"]) EXPECT_LT(l["norm_err"].get<double>(), 1e-4) << l;
    bool bias_checked = false;
    for (const auto& c : v["round_trip"])
      bias_checked = bias_checked || c["name"] == "layer 1 w2 bias";
    EXPECT_TRUE(bias_checked) << report;
  }
}

// Every expert is drawn from its own seed: thread counts and shard sizes give the same tensors,
// and the same files for the same shard size; another seed other bytes.
TEST(GptOssSynth, SameBytesForEveryThreadCount) {
  TempDir tmp;
  const std::string args =
      " --format gpt-oss-mxfp4 --layers 2 --experts 7 --hidden 128 --inter 96 --seed 21";
  std::map<std::string, Entry> first;
  std::string first_files;
  for (const char* threads : {"1", "2", "3", "8"}) {
    SCOPED_TRACE(threads);
    const std::string dir = tmp / (std::string("t") + threads);
    ASSERT_EQ(moepack_cli("synth " + dir + args + " --threads " + threads), 0);
    const std::string sharded = dir + "-sharded";
    ASSERT_EQ(moepack_cli("synth " + sharded + args + " --threads " + threads +
                          " --max-shard-size 150KB"),
              0);
    EXPECT_GT(std::distance(fs::directory_iterator(sharded), fs::directory_iterator{}), 3);
    const auto t = tensors_of(dir);
    std::string files;
    for (const auto& e : fs::directory_iterator(sharded))
      if (e.path().extension() == ".safetensors")
        files += e.path().filename().string() + " " + file_sha256(e.path().string()) + "\n";
    if (first.empty()) {
      first = t;
      first_files = files;
      continue;
    }
    EXPECT_EQ(tensors_of(sharded).size(), t.size());
    for (const auto& [name, e] : t) {
      EXPECT_EQ(e.sha, first.at(name).sha) << name;
      EXPECT_EQ(tensors_of(sharded).at(name).sha, e.sha) << name;
    }
    EXPECT_EQ(files, first_files);
  }
  const std::string other = tmp / "seed22";
  ASSERT_EQ(moepack_cli("synth " + other +
                        " --format gpt-oss-mxfp4 --layers 2 --experts 7 --hidden 128 --inter 96 "
                        "--seed 22"),
            0);
  const std::string blocks = "model.layers.1.mlp.experts.down_proj_blocks";
  EXPECT_NE(tensors_of(other).at(blocks).sha, first.at(blocks).sha);
}

// The bf16 variant is read by inspect (--no-validate: validation decodes the experts for a
// layout, and none takes bf16 gpt-oss) and refused by convert (exit 4), as the fixture's.
TEST(GptOssSynth, Bf16VariantIsInspectedAndRefusedByConvert) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --family gpt_oss --format bf16 --layers 1 --experts 4 --hidden 128 "
                        "--inter 64"),
            0);
  const json ins = moepack_json("inspect " + src + " --no-validate", 0);
  EXPECT_EQ(ins["format"]["method"], "none");
  EXPECT_EQ(ins["moe"]["layer_list"][0]["family"], "gpt-oss") << ins.dump();
  EXPECT_EQ(ins["moe"]["layer_list"][0]["inter"], 64) << ins.dump();
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert " + src + " " + dst + " --quantize mxfp8 --target-arch sm100",
                        &out, &err),
            4)
      << err;
  EXPECT_NE(err.find("gpt-oss"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dst));
}

// Families and formats that do not go together, and gpt-oss in fp16, are usage errors (exit 2)
// naming the flags, with nothing written.
TEST(GptOssSynth, RefusesOtherFamiliesFormatsAndDtypes) {
  TempDir tmp;
  const std::string dst = tmp / "dst";
  for (const std::string& args : {std::string(" --format gpt-oss-mxfp4 --family qwen3"),
                                  std::string(" --format gptq --family gpt_oss"),
                                  std::string(" --format ct-mxfp4 --family gpt_oss"),
                                  std::string(" --format gpt-oss-mxfp4 --dtype fp16"),
                                  std::string(" --format gpt-oss-mxfp4 --hidden 80")}) {
    SCOPED_TRACE(args);
    std::string out, err;
    EXPECT_EQ(moepack_cli("synth " + dst + args + " --layers 1 --experts 2 --inter 64", &out, &err),
              2);
    EXPECT_NE(err.find(args.find("hidden") != std::string::npos ? "--hidden" : "--"),
              std::string::npos)
        << err;
    EXPECT_FALSE(fs::exists(dst));
    for (const auto& e : fs::directory_iterator(tmp.path)) ADD_FAILURE() << "left: " << e.path();
  }
}

// Shapes vLLM 0.33's OAI Triton kernel does not run on Hopper (a GEMM output N <= 128: no
// compile; H % 64 != 0: a wrong product), which its oracle still picks TRITON for (no shape
// check in OAITritonExperts.is_supported_config): inspect says vLLM picks TRITON and its kernel
// fails, and `auto` on sm90 writes the next layout of vLLM's order that takes the layer (Marlin,
// what that vLLM runs with --moe-backend marlin; FLASHINFER_CUTLASS_MXFP4_BF16 before it has no
// moepack layout), which verifies; --backend triton-mxfp4 still refuses naming the reason. A shape
// the kernel runs keeps triton-mxfp4 and no kernel_fails entry.
TEST(GptOssSynth, Sm90ShapesTritonFailsOn) {
  TempDir tmp;
  struct Case {
    const char* shape;
    const char* reason;
    const char* backend;
  };
  for (const Case& c : {Case{"--hidden 160 --inter 256", "is not a multiple of 64", "marlin-mxfp4"},
                        Case{"--hidden 256 --inter 32", "2Ip = 128 <= 128", "marlin-mxfp4"},
                        Case{"--hidden 128 --inter 256", "N = H = 128 <= 128", "marlin-mxfp4"},
                        Case{"--hidden 192 --inter 96", "", "triton-mxfp4"}}) {
    SCOPED_TRACE(c.shape);
    const std::string src = tmp / "src", dst = tmp / "dst";
    fs::remove_all(src);
    fs::remove_all(dst);
    ASSERT_EQ(
        moepack_cli("synth " + src + " --format gpt-oss-mxfp4 --layers 1 --experts 3 " + c.shape),
        0);
    const json ins = moepack_json("inspect " + src + " --target-arch sm90", 0);
    const json& d = ins["oracle"]["kinds"][0];
    ASSERT_TRUE(d.is_object()) << ins.dump();
    EXPECT_EQ(d["chosen"], c.backend) << d.dump(1);
    EXPECT_EQ(d["vllm_would_pick"], "triton-mxfp4") << d.dump(1);
    bool triton_seen = false;
    for (const auto& v : d["vllm_order"])
      if (v["backend"] == "TRITON") {
        triton_seen = true;
        EXPECT_EQ(v["vllm_runs"], true);
        EXPECT_EQ(v.contains("kernel_fails"), *c.reason != 0) << v.dump();
        if (*c.reason) {
          EXPECT_NE(v["kernel_fails"].dump().find(c.reason), std::string::npos);
        }
      }
    EXPECT_TRUE(triton_seen) << d.dump(1);
    std::string out, err;
    if (*c.reason) {
      const std::string note = d["vllm_note"].get<std::string>();
      EXPECT_NE(note.find("whose kernel fails on this layer"), std::string::npos) << note;
      EXPECT_NE(note.find("--moe-backend marlin"), std::string::npos) << note;
      std::string text;
      ASSERT_EQ(moepack_cli("inspect " + src + " --target-arch sm90", &text, &err), 0);
      EXPECT_NE(text.find("TRITON [triton-mxfp4] (picked; its kernel fails here)"),
                std::string::npos)
          << text;
      EXPECT_EQ(moepack_cli("convert " + src + " " + dst +
                                " --target-arch sm90 --backend "
                                "triton-mxfp4",
                            &out, &err),
                4);
      EXPECT_NE(err.find(c.reason), std::string::npos) << err;
      EXPECT_FALSE(fs::exists(dst));
    }
    ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --target-arch sm90", &out, &err), 0)
        << err;
    EXPECT_EQ(read_json_file(dst + "/moepack.json")["backend"], c.backend);
    EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src, &out, &err), 0) << err << out;
  }
}

}  // namespace
}  // namespace moepack
