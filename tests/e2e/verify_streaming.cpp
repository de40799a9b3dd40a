// verify's streaming reader (issue 27; verify/verify.cpp ChunkPipeline and StreamedDigests): the
// converted parameters are hashed while their chunks are read, several layers at a time, and the
// mapped pages they were read from are dropped after use. What it must not change: the report.
// Every device, thread count (the number of layers read at once follows it) and --chunk-size
// gives the same integrity, round trip and layers; a parameter whose bytes differ from its
// recorded SHA-256 is named whatever the chunking; a layer that stops at a chunk that does not
// decode still gets its tensors' checksums (hashed from the mapping); and the resident
// file-backed memory stays a fraction of the checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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
using nlohmann::json;
using test::moepack_cli;
using test::TempDir;

json verify_json(const std::string& args, int expect_rc) {
  return test::moepack_json("verify " + args, expect_rc);
}

std::vector<std::string> devices() {
  std::vector<std::string> d = {"cpu"};
  if (cuda_device_info().available) d.push_back("cuda");
  return d;
}

// Six MoE layers of 16 experts (a small vocabulary: the experts are most of the bytes), or with
// `big` four layers of 32 experts at H = 1024, I = 768 (~150 MB: far above what the process maps
// of its own code).
struct Model {
  TempDir tmp;
  std::string src = tmp / "src", dst = tmp / "dst";
  explicit Model(bool big = false) {
    EXPECT_EQ(moepack_cli("synth " + src + " --format gptq --family qwen3 --vocab 1024 --seed 5" +
                          (big ? " --layers 4 --experts 32 --hidden 1024 --inter 768"
                               : " --layers 6 --experts 16 --hidden 512 --inter 256")),
              0);
    EXPECT_EQ(moepack_cli("convert " + src + " " + dst + " --target-arch sm90 --backend marlin"),
              0);
  }
};

// Writes a forged manifest of DIR and re-binds config.json to it (its manifest_sha256), as
// tests/e2e/verify_coverage.cpp does: only the tensors' own checks are left to notice.
void write_manifest_bound(const std::string& dir, const json& m) {
  const std::string text = m.dump(2) + "\n";
  std::ofstream(dir + "/moepack.json") << text;
  json cfg = test::read_json_file(dir + "/config.json");
  cfg["quantization_config"]["manifest_sha256"] = sha256_hex(text.data(), text.size());
  std::ofstream(dir + "/config.json") << cfg.dump(2) << "\n";
}

uint64_t tensor_bytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") total += fs::file_size(e.path());
  return total;
}

TEST(VerifyStreaming, SameReportAtEveryThreadCountAndChunkSize) {
  Model m;
  for (const std::string& device : devices())
    for (const std::string& with : {std::string(), " --source " + m.src}) {
      SCOPED_TRACE("--device " + device + with);
      const std::string base = m.dst + with + " --device " + device + " --tokens 16";
      const json ref = verify_json(base + " --threads 1", 0);
      EXPECT_EQ(ref["passed"], true);
      for (const char* variant :
           {" --threads 2", " --threads 16", " --threads 16 --chunk-size 1MiB",
            " --threads 9 --chunk-size 3MiB", " --threads 5 --chunk-size 1MiB",
            " --threads 64 --chunk-size 2MiB"}) {
        SCOPED_TRACE(variant);
        const json got = verify_json(base + variant, 0);
        EXPECT_EQ(got["integrity"], ref["integrity"]);
        EXPECT_EQ(got["round_trip"], ref["round_trip"]);
        EXPECT_EQ(got["notes"], ref["notes"]);
        // Each expert is computed alike whatever chunk holds it, on either device.
        EXPECT_EQ(got["layers"], ref["layers"]);
        EXPECT_GE(got["run"]["stages"]["lanes"].get<int>(), 1);
      }
      // --skip-numerical reads through the same pipeline, several layers at once.
      const json skip1 = verify_json(m.dst + with + " --skip-numerical --threads 1", 0);
      const json skip16 = verify_json(m.dst + with + " --skip-numerical --threads 16", 0);
      EXPECT_EQ(skip16["integrity"], ref["integrity"]);
      EXPECT_EQ(skip16["round_trip"], ref["round_trip"]);
      EXPECT_EQ(skip1["round_trip"], ref["round_trip"]);
      EXPECT_GT(skip16["run"]["stages"]["lanes"].get<int>(), 1);
    }
}

// Flips one byte in the middle of a converted parameter of layer 3 (its recorded SHA-256 left as
// it was): integrity 1 names that tensor, whatever the thread count and chunking.
TEST(VerifyStreaming, ChecksumOfAStreamedParameterCatchesOneByte) {
  Model m;
  const json manifest = test::read_json_file(m.dst + "/moepack.json");
  std::string victim, shard;
  for (const auto& [name, t] : manifest["tensors"].items())
    if (t["action"] == "convert" && name.find("layers.3.") != std::string::npos &&
        name.find("w13_qweight") != std::string::npos) {
      victim = name;
      shard = t["shard"].get<std::string>();
    }
  ASSERT_FALSE(victim.empty()) << manifest["tensors"].dump();
  const std::string path = m.dst + "/" + shard;
  uint64_t at = 0;
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    const SafetensorsEntry* e = f.find(victim);
    ASSERT_NE(e, nullptr);
    at = 8 + f.header_length() + (e->begin + e->end) / 2;
  }
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    io.seekp(static_cast<std::streamoff>(at));
    io.write(&c, 1);
  }
  for (const std::string& device : devices())
    for (const std::string& variant :
         {std::string(" --threads 1"), std::string(" --threads 16 --chunk-size 1MiB"),
          std::string(" --skip-numerical --threads 16")}) {
      SCOPED_TRACE("--device " + device + variant);
      const json v =
          verify_json(m.dst + " --source " + m.src + " --tokens 8 --device " + device + variant, 1);
      bool named = false;
      for (const auto& c : v["integrity"])
        if (c["name"] == "manifest tensors present with dtype, shape and sha256") {
          EXPECT_EQ(c["passed"], false);
          named = c["detail"] == victim + ": sha256 differs";
        }
      EXPECT_TRUE(named) << v["integrity"].dump(1);
    }
}

// A layer whose act-order sort indices are no permutation stops at its first chunk: the rest of
// its tensors are never read by the layer loop, and integrity 1 still checks them (hashed from
// the mapping): with the manifest's SHA-256 rewritten to match, it passes, and only that layer
// fails.
TEST(VerifyStreaming, LayerStoppedAtADecodeFailureStillHasItsChecksums) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format gptq-actorder --family qwen3 --layers 4 --experts 16 "
                        "--hidden 256 --inter 128 --seed 9"),
            0);
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst +
                        " --target-arch sm90 --backend marlin --vllm-target 2026-05"),
            0);
  const json before = verify_json(dst + " --source " + src + " --tokens 8", 0);
  ASSERT_EQ(before["passed"], true);
  json manifest = test::read_json_file(dst + "/moepack.json");
  std::string victim;
  for (const auto& [name, t] : manifest["tensors"].items())
    if (name.find("layers.2.") != std::string::npos &&
        name.find("w13_g_idx_sort_indices") != std::string::npos)
      victim = name;
  ASSERT_FALSE(victim.empty());
  const std::string shard = manifest["tensors"][victim]["shard"].get<std::string>();
  const std::string path = dst + "/" + shard;
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    const SafetensorsEntry* e = f.find(victim);
    ASSERT_NE(e, nullptr);
    // Expert 0's first two sort indices made equal: not a permutation.
    const uint64_t at = 8 + f.header_length() + e->begin;
    std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(at + 4), 4,
                bytes.begin() + static_cast<std::ptrdiff_t>(at));
    const std::string sha = sha256_hex(bytes.data() + at, e->end - e->begin);
    manifest["tensors"][victim]["sha256"] = sha;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  write_manifest_bound(dst, manifest);
  for (const std::string& device : devices())
    for (const char* threads : {" --threads 1", " --threads 16 --chunk-size 1MiB"}) {
      SCOPED_TRACE("--device " + device + threads);
      const json v =
          verify_json(dst + " --source " + src + " --tokens 8 --device " + device + threads, 1);
      for (const auto& c : v["integrity"]) EXPECT_EQ(c["passed"], true) << c.dump();
      for (const auto& l : v["layers"]) EXPECT_EQ(l["passed"], l["layer"] != 2) << l.dump();
    }
}

// Resident file-backed memory: the pages verify read its chunks from are dropped after use, so
// the peak mapped memory is a fraction of the checkpoint (it was all of it), on each device, with
// and without the source. What the process maps of its own code and libraries (the CUDA driver's
// among them) is measured apart, as a small model's whole peak, and allowed on top.
TEST(VerifyStreaming, MappedPagesAreReleasedAfterUse) {
  Model big(/*big=*/true), small;
  const uint64_t dst_bytes = tensor_bytes(big.dst), src_bytes = tensor_bytes(big.src);
  for (const std::string& device : devices()) {
    SCOPED_TRACE("--device " + device);
    const std::string flags = " --tokens 8 --threads 2 --device " + device;
    const uint64_t own =
        verify_json(small.dst + " --source " + small.src + flags, 0)["run"]["peak_rss_file_bytes"]
            .get<uint64_t>();
    const json plain = verify_json(big.dst + flags, 0);
    EXPECT_LT(plain["run"]["peak_rss_file_bytes"].get<uint64_t>(), own + dst_bytes / 2)
        << plain["run"].dump() << " own " << own;
    const json with = verify_json(big.dst + " --source " + big.src + flags, 0);
    EXPECT_LT(with["run"]["peak_rss_file_bytes"].get<uint64_t>(), own + (dst_bytes + src_bytes) / 2)
        << with["run"].dump() << " own " << own;
  }
}

// The same with --source for a family whose experts are fused 3-D tensors (gpt-oss MXFP4: one
// gate_up_proj_blocks of every expert a layer): the source's pages are dropped as they are hashed
// for its fingerprint, a piece at a time, and as each chunk's experts are loaded, not only when a
// layer is done. Before, every thread of the fingerprint held a whole fused tensor (31 GiB of a
// 61 GB gpt-oss on 64 threads): at 16 threads here half the source was resident at once, and
// now the peak is a few chunks. Both the numerical path and the pipeline's workers (the
// round trip alone, as the CUDA path prepares its chunks).
TEST(VerifyStreaming, FusedSourceExpertsAreReleasedAsTheyAreRead) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst", small_src = tmp / "s", small = tmp / "d";
  const std::string synth = " --format gpt-oss-mxfp4 --family gpt_oss --vocab 1024 --seed 5";
  ASSERT_EQ(moepack_cli("synth " + src + synth + " --layers 6 --experts 32 --hidden 1024" +
                        " --inter 512"),
            0);
  ASSERT_EQ(moepack_cli("synth " + small_src + synth), 0);
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --target-arch sm90"), 0);
  ASSERT_EQ(moepack_cli("convert " + small_src + " " + small + " --target-arch sm90"), 0);
  const uint64_t bytes = tensor_bytes(dst) + tensor_bytes(src);
  std::vector<std::string> runs;
  for (const std::string& device : devices()) runs.push_back(" --device " + device);
  runs.push_back(" --device cpu --skip-numerical");
  for (const std::string& run : runs) {
    SCOPED_TRACE(run);
    const std::string flags = run + " --tokens 8 --threads 16";
    const uint64_t own =
        verify_json(small + " --source " + small_src + flags, 0)["run"]["peak_rss_file_bytes"]
            .get<uint64_t>();
    const json with = verify_json(dst + " --source " + src + flags, 0);
    EXPECT_LT(with["run"]["peak_rss_file_bytes"].get<uint64_t>(), own + bytes / 8)
        << with["run"].dump() << " own " << own << " checkpoint and source " << bytes;
  }
}

}  // namespace
}  // namespace moepack
