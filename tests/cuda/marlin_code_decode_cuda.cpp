// The device decode of the Marlin reference codes (kernels/moe_runtime.h MarlinCodeDecode,
// MoeChunkStage::decode_marlin_codes) against the scalar unpack (formats/marlin.cpp
// unpack_marlin_moe: marlin_unrepack and the act-order column scatter), byte for byte, in the form
// the canonical reader reads (pack_code_nibbles of unpack's codes for 4-bit, the codes for 8-bit):
// GPTQ int4 / int8, AWQ int4, CT W4A16, act-order, group sizes -1 / 32 / 128, a8 tiles, 1..5
// experts, the smallest legal tile multiples and larger (tests/marlin_artifacts.h); a flipped
// qweight byte changes the device codes exactly where it changes the scalar unpack's; a shape that
// is not whole tiles is kInternal. And verify --device cuda: the report identical with the device
// decode on and off (MOEPACK_VERIFY_HOST_DECODE=1), the decode seen to run (the profile's
// "decode codes (reference)" line) only when on. Skips without a device.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "formats/marlin.h"
#include "formats/moe_reader.h"
#include "kernels/moe_runtime.h"
#include "kernels/moepack_cuda.h"
#include "tests/marlin_artifacts.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device (or built without CUDA)"

// What the canonical reader reads of unpack's codes: two per byte for <= 4 bits.
std::vector<uint8_t> reader_form(const QuantTensor& q) {
  if (q.bits > 4) return q.codes;
  std::vector<uint8_t> out((q.codes.size() + 1) / 2);
  pack_code_nibbles(q.codes.data(), q.codes.size(), false, out.data());
  return out;
}

// Projection i's codes decoded on the device from the artifact's qweight and sort indices (the
// inverse sort computed here, independently of verify's).
std::vector<uint8_t> device_codes(MoeRuntime& rt, const test::MarlinArtifact& a, int i,
                                  const QuantTensor& q) {
  const MarlinParamNames names =
      marlin_param_names(a.lo.source_method, i == 0 ? MoeProj::kW13 : MoeProj::kW2);
  const Tensor& qw = a.params.at(a.lo.prefix + names.qweight);
  std::vector<int32_t> inverse;
  if (!q.g_idx.empty()) {
    const int32_t* s = a.params.at(a.lo.prefix + names.sort_indices).as<int32_t>();
    inverse.resize(static_cast<size_t>(q.experts * q.k));
    for (int64_t e = 0; e < q.experts; ++e)
      for (int64_t k = 0; k < q.k; ++k)
        inverse[static_cast<size_t>(e * q.k + s[e * q.k + k])] = static_cast<int32_t>(k);
  }
  const MarlinCodeMap map = marlin_code_map(q.bits, a.lo.a8);
  MoeChunkStage stage = rt.acquire_stage();
  MarlinCodeDecode d;
  d.qweight = stage.upload(qw.data.data(), qw.data.size());
  d.experts = q.experts;
  d.n = q.n;
  d.k = q.k;
  d.map = &map;
  d.inverse_sort = inverse.empty() ? nullptr : inverse.data();
  const uint8_t* out = stage.decode_marlin_codes(d);
  const size_t count = q.codes.size();
  return rt.staged_bytes(stage, out, q.bits == 4 ? (count + 1) / 2 : count);
}

TEST(MarlinCodeDecodeCuda, EqualsTheScalarUnpackByteForByte) {
  SKIP_WITHOUT_CUDA();
  MoeRuntime rt;
  rt.make_stages(2);
  test::Rng rng(2710);
  const TargetLayout* row = find_target_layout("marlin");
  for (const test::MarlinCase& c : test::marlin_cases()) {
    const test::MarlinArtifact a = test::random_marlin_artifact(rng, c);
    const MoeExperts want = row->unpack(a.lo, a.params);
    for (int i = 0; i < 2; ++i) {
      const QuantTensor& q = i == 0 ? want.w13 : want.w2;
      const std::vector<uint8_t> got = device_codes(rt, a, i, q);
      const std::vector<uint8_t> exp = reader_form(q);
      ASSERT_EQ(got.size(), exp.size()) << test::marlin_case_name(c);
      size_t first_bad = got.size();
      for (size_t b = 0; b < got.size() && first_bad == got.size(); ++b)
        if (got[b] != exp[b]) first_bad = b;
      EXPECT_EQ(first_bad, got.size())
          << test::marlin_case_name(c) << " proj " << i << ": first differing byte";
    }
  }
}

TEST(MarlinCodeDecodeCuda, AFlippedQweightByteChangesWhatUnpackChanges) {
  SKIP_WITHOUT_CUDA();
  MoeRuntime rt;
  rt.make_stages(1);
  test::Rng rng(2711);
  const TargetLayout* row = find_target_layout("marlin");
  for (const test::MarlinCase& c :
       {test::MarlinCase{QuantMethod::kGptq, 4, 32, true, false, 3, 128, 64},
        test::MarlinCase{QuantMethod::kGptq, 8, 128, false, false, 2, 256, 128},
        test::MarlinCase{QuantMethod::kAwq, 4, 32, false, false, 2, 128, 64}}) {
    const test::MarlinArtifact a = test::random_marlin_artifact(rng, c);
    test::MarlinArtifact flipped = a;
    const MarlinParamNames names = marlin_param_names(c.method, MoeProj::kW2);
    Tensor& qw = flipped.params.at(a.lo.prefix + names.qweight);
    for (int trial = 0; trial < 4; ++trial) {
      const size_t at = static_cast<size_t>(rng() % qw.data.size());
      qw.data[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    const MoeExperts base = row->unpack(a.lo, a.params);
    const MoeExperts bent = row->unpack(flipped.lo, flipped.params);
    const std::vector<uint8_t> d0 = device_codes(rt, a, 1, base.w2);
    const std::vector<uint8_t> d1 = device_codes(rt, flipped, 1, bent.w2);
    const std::vector<uint8_t> h0 = reader_form(base.w2), h1 = reader_form(bent.w2);
    ASSERT_EQ(d0.size(), h0.size());
    ASSERT_EQ(d1.size(), h1.size());
    std::set<size_t> device_diff, host_diff;
    for (size_t b = 0; b < d0.size(); ++b) {
      if (d0[b] != d1[b]) device_diff.insert(b);
      if (h0[b] != h1[b]) host_diff.insert(b);
    }
    EXPECT_FALSE(host_diff.empty()) << test::marlin_case_name(c);
    EXPECT_EQ(device_diff, host_diff) << test::marlin_case_name(c);
    EXPECT_TRUE(d1 == h1) << test::marlin_case_name(c);
  }
}

TEST(MarlinCodeDecodeCuda, ShapesThatAreNotWholeTilesAreRefused) {
  SKIP_WITHOUT_CUDA();
  MoeRuntime rt;
  rt.make_stages(1);
  const MarlinCodeMap map = marlin_code_map(4, false);
  std::vector<uint32_t> words(64 * 16 / 8, 0);
  MoeChunkStage stage = rt.acquire_stage();
  MarlinCodeDecode d;
  d.qweight = stage.upload(words.data(), words.size() * 4);
  d.experts = 1;
  d.n = 64;
  d.k = 8;  // half a tile
  d.map = &map;
  test::expect_error([&] { stage.decode_marlin_codes(d); }, ErrorCode::kInternal);
  d.k = 16;
  d.map = nullptr;
  test::expect_error([&] { stage.decode_marlin_codes(d); }, ErrorCode::kInternal);
  MoeChunkStage empty;
  d.map = &map;
  test::expect_error([&] { empty.decode_marlin_codes(d); }, ErrorCode::kInternal);
}

// verify --device cuda without --source: the same report with the reference's codes decoded on
// the device and on the host; the profile shows the device decode ran only in the first. The
// qweight is then staged from the mapped shard (stand-ins on the host: LayerJob::staged_direct),
// except where vLLM 0.33 padded I ("gptq-padded": I = 96 carried as 128), whose codes the host
// decodes (marlin_without_codes_reads_codes): no device decode there, the same report.
TEST(MarlinCodeDecodeCuda, VerifyReportIsTheSameWithTheHostDecode) {
  SKIP_WITHOUT_CUDA();
  test::TempDir tmp;
  for (const char* case_name :
       {"gptq", "gptq-actorder", "awq", "ct-w4a16", "ct-w8a16", "gptq-padded"}) {
    const std::string name = case_name;
    const bool padded = name == "gptq-padded";
    const std::string format = padded ? "gptq" : name;
    SCOPED_TRACE(name);
    const std::string src = tmp / (name + "-src"), dst = tmp / (name + "-dst");
    ASSERT_EQ(test::moepack_cli("synth " + src + " --format " + format +
                                " --layers 2 --experts 5 --hidden 256 --seed 11" +
                                (padded ? " --inter 96 --group-size 32" : " --inter 128")),
              0);
    const std::string target = name == "gptq-actorder" ? " --vllm-target 2026-05" : "";
    ASSERT_EQ(test::moepack_cli("convert " + src + " " + dst +
                                " --backend marlin --target-arch "
                                "sm90 --chunk-size 64KiB" +
                                target),
              0);
    nlohmann::json report[2];
    for (int host = 0; host < 2; ++host) {
      std::string out, err;
      const std::string env =
          std::string("MOEPACK_VERIFY_PROFILE=1 ") + (host ? "MOEPACK_VERIFY_HOST_DECODE=1 " : "");
      ASSERT_EQ(test::run_command(env + test::moepack_bin() + " verify " + dst +
                                      " --tokens 16 --device cuda --chunk-size 64KiB --json",
                                  &out, &err),
                0)
          << err;
      EXPECT_EQ(err.find("decode codes (reference)") != std::string::npos, host == 0 && !padded)
          << err;
      report[host] = nlohmann::json::parse(out, nullptr, false);
      ASSERT_FALSE(report[host].is_discarded()) << out;
      report[host].erase("run");  // timings
      report[host].erase("timing");
    }
    EXPECT_EQ(report[0]["passed"], true);
    EXPECT_EQ(report[0], report[1]);
  }
}

}  // namespace
}  // namespace moepack
