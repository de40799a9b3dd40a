// The gpt-oss MXFP4 direct fast paths (formats/fast_path_mxfp4.h) against the canonical path,
// byte for byte: synthetic gpt-oss checkpoints in the published layout (`moepack synth --format
// gpt-oss-mxfp4`) over the shapes each layout takes -- padded and unpadded H and I, K/2 not a
// multiple of the 32-byte swizzle piece, several experts per chunk or one, thread counts --, every
// chunk converted by the row from the views execution hands over (direct_source) and by
// convert_chunk_canonical (load_moe_experts + the layout's pack); then the whole binary, `convert`
// against `convert --no-fast-path` (SHA-256 of every file). Where the canonical path refuses the
// bytes (E8M0 code 255, a non-finite bias, a tensor of another dtype or shape), the row declines.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "formats/fast_path.h"
#include "model/checkpoint.h"
#include "pipeline/execute.h"
#include "pipeline/plan.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using test::moepack_cli;
using test::TempDir;

struct Case {
  const char* layout;  // --backend
  int64_t experts, hidden, inter;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.layout << " E " << c.experts << " H " << c.hidden << " I " << c.inter;
}

std::string synth_gpt_oss(const TempDir& tmp, const Case& c, int seed) {
  const std::string src = tmp / "src";
  std::string err;
  EXPECT_EQ(moepack_cli("synth " + src + " --format gpt-oss-mxfp4 --layers 2 --experts " +
                            std::to_string(c.experts) + " --hidden " + std::to_string(c.hidden) +
                            " --inter " + std::to_string(c.inter) + " --top-k 2 --seed " +
                            std::to_string(seed),
                        nullptr, &err),
            0)
      << err;
  return src;
}

ConvertOptions options_for(const std::string& src, const std::string& layout, int threads,
                           int64_t chunk_bytes) {
  ConvertOptions o;
  o.src = src;
  o.dst = src + ".unused";
  o.target_arch = TargetArch::kSm90;
  o.vllm_target = VllmTarget::kV0_33;
  o.backend = layout;
  o.threads = threads;
  o.chunk_bytes = chunk_bytes;
  return o;
}

// Every chunk of every layer: the row takes it and returns the canonical path's parameters.
void expect_every_chunk_identical(const Checkpoint& ckpt, const Plan& plan,
                                  const std::string& layout) {
  int chunks = 0;
  for (const PlannedLayer& pl : plan.layers) {
    ASSERT_NE(pl.direct, nullptr) << pl.module << ": " << pl.canonical_why;
    EXPECT_EQ(std::string(pl.direct->name), "gpt-oss-mxfp4->" + layout);
    const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
    for (int64_t e0 = 0; e0 < L.num_experts; e0 += pl.experts_per_chunk) {
      const int64_t e1 = std::min(L.num_experts, e0 + pl.experts_per_chunk);
      const auto direct = pl.direct->convert(pl.layout_options, direct_source(ckpt, pl, e0, e1));
      ASSERT_TRUE(direct.has_value()) << pl.module << " experts " << e0 << ".." << e1;
      const std::vector<Tensor> want = convert_chunk_canonical(plan, ckpt, pl, e0, e1);
      ASSERT_EQ(direct->size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ((*direct)[i].name, want[i].name);
        EXPECT_EQ((*direct)[i].dtype, want[i].dtype) << want[i].name;
        EXPECT_EQ((*direct)[i].shape, want[i].shape) << want[i].name;
        EXPECT_TRUE(test::bytes_equal((*direct)[i].data, want[i].data, 4,
                                      pl.module + " experts " + std::to_string(e0) + ".." +
                                          std::to_string(e1) + " " + want[i].name));
      }
      ++chunks;
    }
  }
  EXPECT_GT(chunks, 1);
}

class GptOssFastPath : public ::testing::TestWithParam<Case> {};

// Each shape at several thread counts and chunk sizes (one expert per chunk, two, a quarter of
// the layer: the pipeline's cap).
TEST_P(GptOssFastPath, EveryChunkAsCanonical) {
  const Case& c = GetParam();
  TempDir tmp;
  const std::string src = synth_gpt_oss(tmp, c, static_cast<int>(c.hidden + c.inter));
  const auto ckpt = Checkpoint::open(src);
  const int64_t per_expert = 3 * c.inter * c.hidden;  // canonical bytes: [gate; up] and down
  for (int threads : {1, 2, 3})
    for (int64_t chunk : {int64_t{1}, 2 * per_expert, int64_t{1} << 30}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", chunk_bytes " + std::to_string(chunk));
      const Plan plan = make_plan(*ckpt, options_for(src, c.layout, threads, chunk));
      expect_every_chunk_identical(*ckpt, plan, c.layout);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GptOssFastPath,
    ::testing::Values(
        // triton-mxfp4: Ip = I rounded up to 64; value rows to 16, bytes to 32; scale rows to 256.
        Case{"triton-mxfp4", 3, 256, 128}, Case{"triton-mxfp4", 5, 192, 96},
        Case{"triton-mxfp4", 2, 320, 160}, Case{"triton-mxfp4", 4, 384, 224},
        // marlin-mxfp4: Hp = H rounded up to 256, Ip = I rounded up to 128.
        Case{"marlin-mxfp4", 3, 64, 64}, Case{"marlin-mxfp4", 5, 192, 96},
        Case{"marlin-mxfp4", 2, 288, 160}, Case{"marlin-mxfp4", 4, 256, 128}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return std::string(i.param.layout[0] == 't' ? "triton" : "marlin") + "_E" +
             std::to_string(i.param.experts) + "_H" + std::to_string(i.param.hidden) + "_I" +
             std::to_string(i.param.inter);
    });

// Random shapes each layout takes (triton-mxfp4: H % 64 == 0, H > 128, 2Ip > 128, I % 32 == 0;
// marlin-mxfp4: H and I multiples of 32), random expert counts, threads and chunk sizes.
TEST(GptOssFastPath, RandomShapes) {
  test::Rng rng(27);
  const auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  for (int i = 0; i < 10; ++i) {
    const bool triton = i % 2 == 0;
    Case c{triton ? "triton-mxfp4" : "marlin-mxfp4", pick(2, 6), 0, 0};
    c.hidden = triton ? 64 * pick(3, 8) : 32 * pick(1, 18);
    c.inter = 32 * (triton ? pick(3, 12) : pick(1, 12));
    SCOPED_TRACE(testing::PrintToString(c));
    TempDir tmp;
    const std::string src = synth_gpt_oss(tmp, c, 100 + i);
    const auto ckpt = Checkpoint::open(src);
    const int64_t chunk = pick(1, 3 * c.inter * c.hidden * c.experts);
    const Plan plan =
        make_plan(*ckpt, options_for(src, c.layout, static_cast<int>(pick(1, 4)), chunk));
    expect_every_chunk_identical(*ckpt, plan, c.layout);
  }
}

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

// The binary: the dry run names the path, and both paths write the same files.
TEST(GptOssFastPath, ConvertEqualsNoFastPath) {
  for (const char* layout : {"triton-mxfp4", "marlin-mxfp4"}) {
    SCOPED_TRACE(layout);
    TempDir tmp;
    const std::string src = synth_gpt_oss(tmp, Case{layout, 6, 192, 96}, 7);
    const std::string flags =
        std::string(" --target-arch sm90 --vllm-target 0.33 --threads 3 --backend ") + layout;
    std::string out, err;
    ASSERT_EQ(moepack_cli("convert " + src + " " + (tmp / "dry") + flags + " --dry-run --json",
                          &out, &err),
              0)
        << err;
    const nlohmann::json plan = nlohmann::json::parse(out);
    ASSERT_EQ(plan["layers"].size(), 2u);
    for (const auto& l : plan["layers"]) EXPECT_EQ(l["conversion"]["path"], "direct");
    ASSERT_EQ(moepack_cli("convert " + src + " " + (tmp / "fast") + flags, nullptr, &err), 0)
        << err;
    ASSERT_EQ(moepack_cli("convert " + src + " " + (tmp / "canonical") + flags + " --no-fast-path",
                          nullptr, &err),
              0)
        << err;
    const auto a = digests(tmp / "fast"), b = digests(tmp / "canonical");
    EXPECT_GE(a.size(), 4u);
    EXPECT_EQ(a, b);
  }
}

// A copy of one of the chunk's fused views (suffix of projection p), for the test to spoil.
struct SpoiledView {
  std::vector<uint8_t> bytes;
  void install(DirectSource& d, int p, const char* suffix) {
    TensorView& v = d.fused[static_cast<size_t>(p)].at(suffix);
    bytes.assign(v.data, v.data + v.nbytes);
    v.data = bytes.data();
  }
};

// What the canonical path refuses in the chunk's bytes, the row declines; the same bytes in
// another chunk's experts do not concern it.
TEST(GptOssFastPath, DeclinesWhatTheCanonicalPathRefuses) {
  for (const char* layout : {"triton-mxfp4", "marlin-mxfp4"}) {
    SCOPED_TRACE(layout);
    TempDir tmp;
    const std::string src = synth_gpt_oss(tmp, Case{layout, 4, 256, 128}, 11);
    const auto ckpt = Checkpoint::open(src);
    const Plan plan = make_plan(*ckpt, options_for(src, layout, 2, 1));  // one expert per chunk
    const PlannedLayer& pl = plan.layers.at(0);
    ASSERT_NE(pl.direct, nullptr) << pl.canonical_why;
    const auto convert = [&](const DirectSource& d) {
      return pl.direct->convert(pl.layout_options, d);
    };
    const DirectSource clean = direct_source(*ckpt, pl, 1, 2);  // expert 1
    ASSERT_TRUE(convert(clean).has_value());
    const int64_t H = 256, I = 128;
    for (int p = 0; p < 2; ++p) {
      const int64_t n = p == 0 ? 2 * I : H, groups = (p == 0 ? H : I) / 32;
      {  // E8M0 NaN in expert 1's last scale: declined; in expert 2's first: not this chunk's
        DirectSource d = clean;
        SpoiledView s;
        s.install(d, p, "scales");
        s.bytes[static_cast<size_t>(2 * n * groups - 1)] = 255;
        EXPECT_FALSE(convert(d).has_value()) << "proj " << p;
        s.bytes[static_cast<size_t>(2 * n * groups - 1)] = 127;
        s.bytes[static_cast<size_t>(2 * n * groups)] = 255;
        EXPECT_TRUE(convert(d).has_value()) << "proj " << p;
      }
      for (uint16_t bad : {uint16_t{0x7f80}, uint16_t{0xff80}, uint16_t{0x7fc1}}) {  // inf, NaN
        DirectSource d = clean;
        SpoiledView s;
        s.install(d, p, "bias");
        const size_t at = static_cast<size_t>((n + n / 2) * 2);  // expert 1, a middle row
        s.bytes[at] = static_cast<uint8_t>(bad & 0xff);
        s.bytes[at + 1] = static_cast<uint8_t>(bad >> 8);
        EXPECT_FALSE(convert(d).has_value()) << "proj " << p << " bias " << bad;
      }
      {  // blocks of another dtype or shape, a missing bias
        DirectSource d = clean;
        d.fused[static_cast<size_t>(p)].at("blocks").dtype = DType::kI8;
        EXPECT_FALSE(convert(d).has_value());
        d = clean;
        d.fused[static_cast<size_t>(p)].at("scales").shape.back() += 1;
        EXPECT_FALSE(convert(d).has_value());
        d = clean;
        d.fused[static_cast<size_t>(p)].erase("bias");
        EXPECT_FALSE(convert(d).has_value());
      }
    }
  }
}

}  // namespace
}  // namespace moepack
