// verify proves coverage: a manifest that does not describe a complete conversion of the source
// (a layer, a copied tensor or a file left out, sizes that disagree, layers and tensors that do
// not describe each other) is exit 3 naming the manifest field; a tampered converted tensor --
// every single-bit flip tried, in every converted tensor including the act-order g_idx and its
// sort indices, with the manifest's sha256 rewritten to match -- is exit 1 with a failed check
// naming its layer, never exit 3 or 70 and never a pass -- on the CPU and, when there is one, on
// the GPU (`--device cuda`).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/sha256.h"
#include "io/safetensors.h"
#include "kernels/moepack_cuda.h"
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

void write_json(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump(2) << "\n";
}

// Writes a forged manifest of DIR and re-binds config.json to it (its manifest_sha256), as a
// forger who knows the format would: only the tensors' own checks are left to notice.
void write_manifest_bound(const std::string& dir, const json& m) {
  const std::string text = m.dump(2) + "\n";
  std::ofstream(dir + "/moepack.json") << text;
  json cfg = read_json_file(dir + "/config.json");
  cfg["quantization_config"]["manifest_sha256"] = sha256_hex(text.data(), text.size());
  write_json(dir + "/config.json", cfg);
}

// An act-order GPTQ checkpoint with two MoE layers (1 and 2), converted to Marlin.
struct Converted {
  TempDir tmp;
  std::string src = tmp / "src", dst = tmp / "dst", manifest = dst + "/moepack.json";
  Converted() {
    EXPECT_EQ(
        moepack_cli("synth " + src +
                    " --format gptq-actorder --layers 3 --experts 4 --hidden 256 --inter 128"),
        0);
    // Act-order MoE: vLLM@9aaf83ef's parameters (0.33, the default, refuses it).
    EXPECT_EQ(moepack_cli("convert " + src + " " + dst + " --vllm-target 2026-05"), 0);
    EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src), 0);
  }
};

TEST(VerifyCoverage, ManifestNotDescribingTheSourceIsExit3NamingTheField) {
  Converted c;
  const json good = read_json_file(c.manifest);
  const std::string l2 = "model.layers.2.mlp";
  struct Case {
    std::function<void(json&)> mutate;
    std::string message;  // the start of the message after "<manifest>: "
    bool needs_source;
  };
  auto drop_layer = [&](json& m) {
    for (const auto& p : m["layers"][1]["params"]) m["tensors"].erase(p.get<std::string>());
    m["layers"].erase(1);
  };
  const std::vector<Case> cases = {
      {drop_layer, "layers: the source's MoE layer " + l2 + " (4 experts) is not listed", true},
      {[](json& m) { m["layers"][0]["hidden"] = 512; }, "layers[0].hidden: 512, but the source's",
       true},
      {[](json& m) { m["layers"][0]["inter"] = 64; }, "layers[0].inter: 64, but the source's",
       true},
      {[](json& m) { m["layers"][0]["gated"] = false; }, "layers[0].gated: false", true},
      {[](json& m) { m["layers"][0]["family"] = "mixtral"; }, "layers[0].family: \"mixtral\"",
       true},
      {[](json& m) { m["layers"][1]["module"] = "model.layers.7.mlp"; },
       "layers: the source's MoE layer " + l2, true},
      {[](json& m) { m["tensors"].erase("model.embed_tokens.weight"); },
       "tensors: the source tensor model.embed_tokens.weight is neither converted nor copied",
       true},
      {[](json& m) { m["files"] = json::array(); },
       "files: the source's generation_config.json is not listed", true},
      {[](json& m) { m["files"].push_back("tokenizer.json"); },
       "files[1]: \"tokenizer.json\" is not a file of the source", true},
      {[](json& m) { m["source"]["tensor_bytes"] = 1; }, "source.tensor_bytes: 1, but", true},
      // Checked without a source too: the manifest must describe itself consistently.
      {[](json& m) { m["layers"] = json::array(); }, "layers: empty", false},
      {[](json& m) { m["layers"][1]["module"] = m["layers"][0]["module"]; },
       "layers[1].module: \"model.layers.1.mlp\" is also layers[0]", false},
      {[](json& m) { m["layers"][0]["experts"] = 3; },
       "tensors[\"model.layers.1.mlp.experts.w13_qweight\"].shape: [4, 16, 512] does not lead "
       "with the 3 experts of layers[0]",
       false},
      {[](json& m) { m["layers"][0]["params"].erase(0); },
       "tensors[\"model.layers.1.mlp.experts.w13_qweight\"].action: \"convert\", but no layer "
       "lists",
       false},
      {[](json& m) { m["layers"][0]["params"].push_back("model.embed_tokens.weight"); },
       "layers[0].params[8]: \"model.embed_tokens.weight\" is a copied tensor", false},
      {[](json& m) { m["layers"][1]["params"].push_back(m["layers"][0]["params"][0]); },
       "layers[1].params[8]: \"model.layers.1.mlp.experts.w13_qweight\" is also a parameter of "
       "layers[0]",
       false},
      {[](json& m) { m["backend"] = "marlin2"; }, "backend: unknown backend \"marlin2\"", false},
      {[](json& m) { m["layout"]["name"] = "triton-wna16"; }, "layout.name: \"triton-wna16\"",
       false},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.message);
    json m = good;
    k.mutate(m);
    write_json(c.manifest, m);
    std::string out, err;
    EXPECT_EQ(moepack_cli("verify " + c.dst + " --source " + c.src, &out, &err), 3) << out << err;
    EXPECT_NE(err.find(c.manifest + ": " + k.message), std::string::npos) << err;
    if (!k.needs_source) {
      err.clear();
      EXPECT_EQ(moepack_cli("verify " + c.dst, &out, &err), 3) << out << err;
      EXPECT_NE(err.find(c.manifest + ": " + k.message), std::string::npos) << err;
    }
  }
  write_json(c.manifest, good);
  EXPECT_EQ(moepack_cli("verify " + c.dst + " --source " + c.src), 0);
}

// The files against the manifest: a shard of another size, a stray safetensors file, a missing
// or changed carried-over file fail verification (exit 1) naming what is wrong.
TEST(VerifyCoverage, FilesDisagreeingWithTheManifestFailVerification) {
  Converted c;
  auto expect_fails = [&](const std::string& what) {
    std::string out;
    EXPECT_EQ(moepack_cli("verify " + c.dst + " --source " + c.src, &out), 1) << out;
    EXPECT_NE(out.find(what), std::string::npos) << out;
  };
  std::ofstream(c.dst + "/extra.safetensors") << "x";
  expect_fails("extra.safetensors is not a shard of the manifest");
  std::remove((c.dst + "/extra.safetensors").c_str());
  std::ofstream(c.dst + "/generation_config.json", std::ios::app) << " ";
  expect_fails("generation_config.json: differs from the source");
  std::remove((c.dst + "/generation_config.json").c_str());
  expect_fails("generation_config.json: missing");
}

// The index of a sharded output is read as every untrusted JSON file is (io/json_file.h): a FIFO
// in its place, a directory, a symlink loop or nesting beyond the cap fail the "index matches
// shards" check (exit 1) naming why, never a hang or a crash.
TEST(VerifyCoverage, HostileIndexOfAShardedOutputFailsTheIndexCheck) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  const std::string index = dst + "/model.safetensors.index.json";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format gptq --layers 3 --experts 4 --hidden 256 "
                        "--inter 128"),
            0);
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --max-shard-size 150KB"), 0);
  ASSERT_TRUE(fs::exists(index));
  const std::string good = [&] {
    std::ifstream in(index);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto expect_fails = [&](const std::string& what) {
    std::string out, err;
    EXPECT_EQ(
        run_command("timeout 120 " + moepack_bin() + " verify " + dst + " --json", &out, &err), 1)
        << err;
    const json v = json::parse(out, nullptr, false);
    ASSERT_TRUE(v.is_object()) << out;
    bool named = false;
    for (const auto& c : v["integrity"])
      if (c["name"] == "index matches shards") {
        EXPECT_EQ(c["passed"], false) << c.dump();
        named = c["detail"].get<std::string>().find(what) != std::string::npos;
        EXPECT_TRUE(named) << c.dump();
      }
    EXPECT_TRUE(named) << out;
  };
  fs::remove(index);
  ASSERT_EQ(::mkfifo(index.c_str(), 0644), 0);
  expect_fails("model.safetensors.index.json: is a FIFO, not a regular file");
  fs::remove(index);
  fs::create_directory(index);
  expect_fails("model.safetensors.index.json: is a directory");
  fs::remove(index);
  std::ofstream(index) << std::string(100000, '[') << std::string(100000, ']');
  expect_fails("model.safetensors.index.json: invalid JSON: nested more than 64 levels deep");
  std::ofstream(index) << good << "x";
  expect_fails("model.safetensors.index.json: invalid JSON");
  fs::remove(index);
  fs::create_symlink(index + ".loop", index);
  fs::create_symlink(index, index + ".loop");
  expect_fails("model.safetensors.index.json: symlink loop");
  fs::remove(index);
  fs::remove(index + ".loop");
  // A symlink to a regular file is followed (a converted checkpoint downloaded into a Hugging
  // Face cache is a snapshot of links into blobs/; issue 29), so it verifies as the file would.
  std::ofstream(tmp / "index.json") << good;
  fs::create_symlink(tmp / "index.json", index);
  EXPECT_EQ(moepack_cli("verify " + dst), 0);
  fs::remove(index);
  std::ofstream(index) << good;
  EXPECT_EQ(moepack_cli("verify " + dst), 0);
}

struct Located {
  uint64_t offset = 0, bytes = 0;  // in the shard file
};
Located locate(const std::string& shard, const std::string& tensor) {
  const SafetensorsFile f = SafetensorsFile::open(shard);
  const SafetensorsEntry* e = f.find(tensor);
  if (!e) return {};
  return {8 + f.header_length() + e->begin, e->end - e->begin};
}

void flip_bit(const std::string& path, uint64_t offset, int bit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char b = 0;
  f.read(&b, 1);
  b = static_cast<char>(b ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&b, 1);
}

std::string sha_of(const std::string& path, const Located& at) {
  std::ifstream f(path, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at.offset));
  std::vector<char> b(at.bytes);
  f.read(b.data(), static_cast<std::streamsize>(b.size()));
  return sha256_hex(reinterpret_cast<const uint8_t*>(b.data()), b.size());
}

// Single-bit flips in every converted tensor of layer 1, at its first, middle and last byte and
// at the low and high bit; the manifest's sha256 is rewritten so that only the decode, the exact
// round trip or the numerical check can notice.
TEST(VerifyCoverage, EveryBitFlipInAConvertedTensorFailsNamingTheLayer) {
  Converted c;
  const std::string shard = c.dst + "/model.safetensors";
  const json good = read_json_file(c.manifest);
  // The CPU, and the GPU when there is one: every flip fails on both.
  std::vector<std::string> devices = {"cpu"};
  if (cuda_device_info().available) devices.push_back("cuda");
  int flips = 0;
  for (const auto& p : good["layers"][0]["params"]) {
    const std::string tensor = p.get<std::string>();
    const Located at = locate(shard, tensor);
    if (at.bytes == 0) continue;
    for (uint64_t pos : {uint64_t{0}, at.bytes / 2, at.bytes - 1})
      for (int bit : {0, 7}) {
        SCOPED_TRACE(tensor + " byte " + std::to_string(pos) + " bit " + std::to_string(bit));
        flip_bit(shard, at.offset + pos, bit);
        json m = good;
        m["tensors"][tensor]["sha256"] = sha_of(shard, at);
        write_manifest_bound(c.dst, m);
        for (const std::string& device : devices) {
          SCOPED_TRACE("--device " + device);
          std::string out, err;
          EXPECT_EQ(moepack_cli("verify " + c.dst + " --source " + c.src + " --device " + device +
                                    " --json",
                                &out, &err),
                    1)
              << err;
          const json v = json::parse(out, nullptr, false);
          ASSERT_FALSE(v.is_discarded()) << out << err;
          bool layer1 = false, other = false;
          ASSERT_TRUE(v.contains("round_trip") && v.contains("layers")) << v.dump();
          for (const auto& r : v["round_trip"])
            if (r["passed"] == false && r["first_mismatch"].is_object())
              (r["first_mismatch"]["layer"] == 1 ? layer1 : other) = true;
          for (const auto& l : v["layers"])
            if (l["passed"] == false) (l["layer"] == 1 ? layer1 : other) = true;
          EXPECT_TRUE(layer1) << v.dump();
          EXPECT_FALSE(other) << v.dump();
        }
        flip_bit(shard, at.offset + pos, bit);  // undo
        ++flips;
      }
  }
  EXPECT_GE(flips, 36);
  write_manifest_bound(c.dst, good);
  // Without the sha256 rewritten, a flip fails the integrity check naming the tensor.
  const Located at = locate(shard, "model.layers.1.mlp.experts.w13_g_idx");
  flip_bit(shard, at.offset + 5, 3);
  std::string out;
  EXPECT_EQ(moepack_cli("verify " + c.dst + " --source " + c.src, &out), 1);
  EXPECT_NE(out.find("model.layers.1.mlp.experts.w13_g_idx: sha256 differs"), std::string::npos)
      << out;
}

}  // namespace
}  // namespace moepack
