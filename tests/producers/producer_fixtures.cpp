// Checkpoints written by the real producers (llm-compressor / compressed-tensors, auto-round,
// GPTQModel, ...), committed under tests/producers/fixtures/ by tests/producers/generate.py.
// Each fixture is NAME/ckpt (the checkpoint as the producer saved it), NAME/dequant.safetensors
// (the producer's own dequantization of every expert Linear, computed at generation time with the
// producer's code, keyed by module name) and NAME/producer.json (producer and version, scheme,
// and what moepack must do with it).
//
//   DecodedEqualsProducerDequant: moepack's reading (Checkpoint + codec unpack + the scalar
//     dequantize_expert) equals the producer's dequantization bit for bit, after rounding to the
//     dtype the producer dequantized into (torch computes (q - z) * s exactly and rounds once);
//     or, for a producer that left every expert unquantized (refuse.unquantized_experts), its
//     dequantization holds nothing and reading the experts refuses with the listed exit code and
//     words.
//   ConvertAndVerify: inspect, then convert with every backend the fixture lists and verify
//     --source, through the real binary (with the router row and activation verify must name,
//     where the fixture lists them); or the refusal the fixture lists (exit code and words).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/half.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "synth/synth.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_cli;

std::string fixtures_root() {
  return test::source_dir() + "/tests/producers/fixtures";
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> out;
  if (!fs::is_directory(fixtures_root())) return out;
  for (const auto& d : fs::directory_iterator(fixtures_root()))
    if (d.is_directory() && fs::exists(d.path() / "producer.json"))
      out.push_back(d.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

json producer_json(const std::string& name) {
  std::ifstream in(fixtures_root() + "/" + name + "/producer.json");
  return json::parse(in);
}

TEST(ProducerFixtures, FromAtLeastFourProducers) {
  std::set<std::string> producers;
  for (const auto& n : fixture_names()) producers.insert(producer_json(n).at("producer"));
  std::string list;
  for (const auto& p : producers) list += p + " ";
  EXPECT_GE(producers.size(), 4u) << "producers: " << list;
}

class ProducerFixture : public ::testing::TestWithParam<std::string> {};

// Rounds v to `d` the way torch does (nearest even) and returns the bits, widened to 32.
uint32_t rounded_bits(float v, DType d) {
  if (d == DType::kBF16) return float_to_bf16(v);
  if (d == DType::kF16) return float_to_f16(v);
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

uint32_t stored_bits(const uint8_t* p, DType d) {
  if (d == DType::kF32) {
    uint32_t b;
    std::memcpy(&b, p, 4);
    return b;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

TEST_P(ProducerFixture, DecodedEqualsProducerDequant) {
  const std::string dir = fixtures_root() + "/" + GetParam();
  const json pj = producer_json(GetParam());
  ASSERT_TRUE(fs::exists(dir + "/dequant.safetensors")) << dir;
  const SafetensorsFile ref = SafetensorsFile::open(dir + "/dequant.safetensors");
  if (pj.contains("refuse") && pj["refuse"].value("unquantized_experts", false)) {
    // The producer wrote no quantized expert although its config declares them (its own
    // dequantization found none): moepack refuses to read the experts, naming why.
    EXPECT_TRUE(ref.entries().empty()) << dir;
    try {
      const auto ckpt = Checkpoint::open(dir + "/ckpt");
      for (const MoeLayer& L : ckpt->moe_layers()) load_moe_experts(*ckpt, L, 2);
      ADD_FAILURE() << dir << ": experts read, but producer.json says they are unquantized";
    } catch (const Error& e) {
      EXPECT_EQ(static_cast<int>(e.exit_code()), pj["refuse"].at("exit").get<int>()) << e.what();
      EXPECT_NE(std::string(e.what()).find(pj["refuse"].at("contains").get<std::string>()),
                std::string::npos)
          << e.what();
    }
    return;
  }
  const auto ckpt = Checkpoint::open(dir + "/ckpt");
  ASSERT_FALSE(ckpt->moe_layers().empty());
  int64_t compared = 0;
  for (const MoeLayer& L : ckpt->moe_layers()) {
    const MoeExperts x = load_moe_experts(*ckpt, L, 2);
    for (int64_t e = 0; e < L.num_experts; ++e) {
      const std::vector<float> w13 = dequantize_expert(x.w13, e), w2 = dequantize_expert(x.w2, e);
      for (int p = 0; p < 3; ++p) {
        if (p == kGate && !L.gated) continue;
        const std::string first = L.experts[static_cast<size_t>(e)][p].begin()->second;
        const std::string module = first.substr(0, first.rfind('.'));
        const TensorView want = ref.view(module);
        const int64_t n = p == kDown ? L.hidden : L.inter, k = p == kDown ? L.inter : L.hidden;
        ASSERT_EQ(want.shape, (Shape{n, k})) << module;
        const float* got = p == kDown ? w2.data()
                           : p == kUp ? w13.data() + (L.gated ? L.inter * k : 0)
                                      : w13.data();
        const int eb = dtype_bits(want.dtype) / 8;
        int64_t bad = 0, first_bad = -1;
        for (int64_t i = 0; i < n * k; ++i) {
          // Bit for bit, except the sign of a zero: (q - z) * s is +0 or -0 depending on the
          // order of the operations, and the two are the same weight.
          const uint32_t g = rounded_bits(got[i], want.dtype),
                         w = stored_bits(want.data + i * eb, want.dtype);
          const uint32_t sign = want.dtype == DType::kF32 ? 0x80000000u : 0x8000u;
          if (g != w && !((g | sign) == sign && (w | sign) == sign)) {
            if (first_bad < 0) first_bad = i;
            ++bad;
          }
        }
        EXPECT_EQ(bad, 0) << module << ": " << bad << " of " << n * k
                          << " weights differ from the producer's dequantization; first at ["
                          << (first_bad < 0 ? 0 : first_bad / k) << ", "
                          << (first_bad < 0 ? 0 : first_bad % k) << "]: moepack "
                          << (first_bad < 0 ? 0.f : got[first_bad]);
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 0);
}

TEST_P(ProducerFixture, ConvertAndVerify) {
  const std::string src = fixtures_root() + "/" + GetParam() + "/ckpt";
  const json pj = producer_json(GetParam());
  test::TempDir tmp;
  std::string out, err;
  if (pj.contains("refuse")) {
    const json& r = pj["refuse"];
    const int rc = moepack_cli(
        "convert " + src + " " + (tmp / "dst") + " --target-arch " + r.value("target_arch", "sm90"),
        &out, &err);
    EXPECT_EQ(rc, r.at("exit").get<int>()) << err;
    EXPECT_NE(err.find(r.at("contains").get<std::string>()), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(tmp / "dst"));
    // A fixture refused on one arch may convert on another (asymmetric compressed-tensors:
    // refused where only Marlin / Triton would read it, Humming on SM90).
    if (!pj.contains("convert")) return;
  }
  ASSERT_EQ(moepack_cli("inspect " + src + " --json", &out, &err), 0) << err;
  const json ins = json::parse(out, nullptr, false);
  ASSERT_FALSE(ins.is_discarded()) << out;
  EXPECT_EQ(ins["format"]["method"], pj.at("method")) << out;
  ASSERT_FALSE(pj.at("convert").empty());
  for (const json& c : pj.at("convert")) {
    const std::string backend = c.at("backend"), arch = c.value("target_arch", "sm90");
    const std::string dst = tmp / ("out-" + backend);
    SCOPED_TRACE(backend + " " + arch);
    ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --backend " + backend +
                              " --target-arch " + arch + " --threads 2",
                          &out, &err),
              0)
        << err;
    EXPECT_EQ(moepack_cli("verify " + dst + " --source " + src + " --json", &out, &err), 0)
        << out << err;
    // The family's own router and activation (issue 30): verify names them; a fixture lists
    // the router row (the model type it is keyed on) and the activation.
    if (!pj.contains("verify")) continue;
    const json v = json::parse(out, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << out;
    const std::string router = v.value("router", "");
    EXPECT_EQ(router.substr(0, router.find(':')), pj["verify"].at("router")) << out;
    EXPECT_EQ(v.value("activation", ""), pj["verify"].at("activation")) << out;
  }
}

// A router quantized by the producer (mlp.gate.qweight ...) is refused naming the tensor, not
// copied through for verify to fail on later with a misleading message (issue 11, item 6).
TEST(ProducerQuirks, QuantizedRouterRefusedNamingIt) {
  test::TempDir tmp;
  SynthOptions o;
  o.format = "gptq";
  o.layers = 1;
  o.hidden = 128;
  o.inter = 128;
  o.vocab = 64;
  const std::string src = tmp / "src";
  synth_checkpoint(src, o);
  const std::string shard = src + "/model.safetensors";
  ASSERT_TRUE(fs::exists(shard));
  std::vector<Tensor> tensors;
  std::string router;
  {
    const SafetensorsFile f = SafetensorsFile::open(shard);
    for (const auto& e : f.entries()) {
      Tensor t = Tensor::from_view(f.view(e));
      if (e.name.size() > 16 && e.name.compare(e.name.size() - 16, 16, ".mlp.gate.weight") == 0) {
        router = e.name.substr(0, e.name.size() - 6) + "qweight";
        t = Tensor(router, DType::kI32, {t.shape[1] / 8, t.shape[0]});
      }
      tensors.push_back(std::move(t));
    }
  }
  ASSERT_FALSE(router.empty());
  write_safetensors(shard, tensors);
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert " + src + " " + (tmp / "dst"), &out, &err), 4) << err;
  EXPECT_NE(err.find(router), std::string::npos) << err;
  EXPECT_NE(err.find("quantized"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(tmp / "dst"));
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Producers, ProducerFixture, ::testing::ValuesIn(fixture_names()),
                         param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ProducerFixture);

}  // namespace
}  // namespace moepack
