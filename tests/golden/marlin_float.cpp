// Golden: moepack's float Marlin layouts (formats/marlin_float.h) against vLLM 0.33.0 itself.
// tests/golden/marlin_float/ holds cases made by vLLM 0.33.0's own prepare_*_for_marlin functions
// with the wheel's shipped gptq_marlin_repack on an H100 (its README: versions, command, what was
// trimmed). Each CASE.safetensors has the source checkpoint tensors under the producer's names and
// every parameter vLLM left on the layer under `routed_experts.`; CASE.json describes them.
//
// Per case: the source tensors go through the source codec's unpack (as `convert` reads them),
// gate and up are stacked, and the layout row packs them for vLLM 0.33; every parameter must
// equal vLLM's byte for byte. Cases vLLM prepares but its shipped kernel cannot run must be
// refused by the row instead (the kernel check on the H100 raised for exactly these).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/codec.h"
#include "formats/marlin.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixture_dir() {
  return test::source_dir() + "/tests/golden/marlin_float";
}

std::vector<std::string> cases() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fixture_dir()))
    if (e.path().extension() == ".json") out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

// What moepack reads each fixture family as, and the row that writes it.
struct FamilyRow {
  const char* family;
  QuantMethod method;
  const char* layout;
  // The codec that reads the fixture's inputs, where it is not `method`'s (mxfp4_oracle: vLLM's
  // gpt-oss path fed compressed-tensors-named tensors).
  QuantMethod read_as = QuantMethod::kNone;
};
const FamilyRow* family_row(const std::string& family) {
  static const FamilyRow rows[] = {
      {"fp8_block_deepseek", QuantMethod::kFp8Block, "marlin-fp8"},
      {"fp8_block_ct", QuantMethod::kCtFp8Block, "marlin-fp8"},
      {"fp8_channel_ct", QuantMethod::kCtFp8Channel, "marlin-fp8"},
      {"fp8_tensor_ct", QuantMethod::kCtFp8Tensor, "marlin-fp8"},
      {"fp8_tensor_modelopt", QuantMethod::kModeloptFp8, "marlin-fp8"},
      {"mxfp8_modelopt", QuantMethod::kModeloptMxfp8, "marlin-mxfp8"},
      {"mxfp8_ct", QuantMethod::kCtMxfp8, "marlin-mxfp8"},
      {"nvfp4_modelopt", QuantMethod::kModeloptNvfp4, "marlin-nvfp4"},
      {"nvfp4_ct", QuantMethod::kCtNvfp4, "marlin-nvfp4"},
      {"mxfp4_ct", QuantMethod::kCtMxfp4, "marlin-mxfp4"},
      // convert_gpt_oss_weight_to_mxfp4_moe_kernel_format -> prepare_moe_mxfp4_layer_for_marlin
      // with biases: moepack's gpt-oss source through marlin-mxfp4.
      {"mxfp4_oracle", QuantMethod::kGptOssMxfp4, "marlin-mxfp4", QuantMethod::kCtMxfp4},
  };
  for (const auto& r : rows)
    if (family == r.family) return &r;
  return nullptr;
}

// Shapes vLLM 0.33 prepares but its shipped Marlin MoE kernel refused on the H100 (kernel.log of
// the device run: "Invalid thread config", or no fp16 x E8M0 instance).
bool kernel_refused(const std::string& c) {
  for (const char* r : {"fp8_channel_ct_E1_H192_I64_bf16", "mxfp8_ct_E1_H192_I64_bf16",
                        "mxfp4_oracle_E1_H256_I64_fp16_rnd", "mxfp4_ct_E2_H256_I96_bf16"})
    if (c == r) return true;
  return false;
}

DType dtype_of(const std::string& torch_name) {
  static const std::map<std::string, DType> m = {{"int32", DType::kI32},
                                                 {"bfloat16", DType::kBF16},
                                                 {"float16", DType::kF16},
                                                 {"float32", DType::kF32},
                                                 {"uint8", DType::kU8},
                                                 {"float8_e4m3fn", DType::kF8_E4M3},
                                                 {"float8_e8m0fnu", DType::kF8_E8M0}};
  return m.at(torch_name);
}

// Experts [gate; up] and down of layer 0 through the codec's unpack.
MoeExperts read_source(const SafetensorsFile& f, const SourceCodec& codec, const QuantParams& q,
                       int64_t E) {
  MoeExperts x;
  const auto linear = [&](int64_t e, const std::string& proj) {
    const std::string pre = "model.layers.0.mlp.experts." + std::to_string(e) + "." + proj + ".";
    TensorMap by_suffix;
    std::map<std::string, TensorView> views;
    for (const auto& entry : f.entries())
      if (entry.name.rfind(pre, 0) == 0) {
        const std::string suffix = entry.name.substr(pre.size());
        by_suffix[suffix] = Tensor::from_view(f.view(entry));
        views[suffix] = f.view(entry);
      }
    const auto nk = codec.logical_shape(q, views);
    return codec.unpack(q, by_suffix, nk.first, nk.second);
  };
  // Stacked as load_moe_experts stacks them: w13 = [gate; up] keeps both global scales (NVFP4).
  const auto append = [](QuantTensor* to, const QuantTensor& t, int64_t rows, int64_t shards) {
    if (to->codes.empty()) {
      *to = t;
      to->experts = 0;
      to->n = rows;
      to->codes.clear();
      to->scales.clear();
      to->global_scales.clear();
      to->global_shards = shards;
    }
    to->codes.insert(to->codes.end(), t.codes.begin(), t.codes.end());
    to->scales.insert(to->scales.end(), t.scales.begin(), t.scales.end());
    to->global_scales.insert(to->global_scales.end(), t.global_scales.begin(),
                             t.global_scales.end());
  };
  for (int64_t e = 0; e < E; ++e) {
    const QuantTensor gate = linear(e, "gate_proj"), up = linear(e, "up_proj"),
                      down = linear(e, "down_proj");
    append(&x.w13, gate, gate.n + up.n, 2);
    append(&x.w13, up, gate.n + up.n, 2);
    append(&x.w2, down, down.n, 1);
    ++x.w13.experts;
    ++x.w2.experts;
  }
  x.w13.check_consistent("w13");
  x.w2.check_consistent("w2");
  return x;
}

// The mxfp4_oracle fixtures hand prepare_moe_mxfp4_layer_for_marlin w13 = the stacked
// [gate_proj; up_proj] rows (and their biases) as they are; in gpt-oss, w13's rows are the
// checkpoint's interleave, which marlin-mxfp4 writes from the canonical [gate; up]. The canonical
// experts whose interleave is those rows: gate j = stacked row 2j, up j = stacked row 2j + 1.
// The biases: each expert's gate_proj.bias, up_proj.bias (stacked, then taken the same way) and
// down_proj.bias, BF16.
void as_gpt_oss_rows(const SafetensorsFile& f, MoeExperts* x) {
  QuantTensor& w = x->w13;
  const int64_t E = w.experts, N = w.n, K = w.k, G = w.groups(), I = N / 2;
  const QuantTensor stacked = w;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < N; ++r) {
      const int64_t from = r < I ? 2 * r : 2 * (r - I) + 1;
      std::memcpy(&w.codes[static_cast<size_t>((e * N + r) * K)],
                  &stacked.codes[static_cast<size_t>((e * N + from) * K)], static_cast<size_t>(K));
      std::memcpy(&w.scales[static_cast<size_t>((e * N + r) * G)],
                  &stacked.scales[static_cast<size_t>((e * N + from) * G)], static_cast<size_t>(G));
    }
  if (!f.contains("model.layers.0.mlp.experts.0.gate_proj.bias")) return;  // a case without
  x->bias_dtype = DType::kBF16;
  for (int64_t e = 0; e < E; ++e) {
    const std::string pre = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    std::vector<uint8_t> b13;
    for (const char* proj : {"gate_proj", "up_proj"}) {
      const TensorView v = f.view(pre + proj + ".bias");
      b13.insert(b13.end(), v.data, v.data + v.nbytes);
    }
    for (int64_t r = 0; r < N; ++r) {
      const int64_t from = r < I ? 2 * r : 2 * (r - I) + 1;
      x->w13_bias.insert(x->w13_bias.end(), b13.begin() + from * 2, b13.begin() + from * 2 + 2);
    }
    const TensorView d = f.view(pre + "down_proj.bias");
    x->w2_bias.insert(x->w2_bias.end(), d.data, d.data + d.nbytes);
  }
}

class MarlinFloatGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MarlinFloatGolden, PackEqualsVllmByteForByte) {
  const std::string c = GetParam();
  const json j = test::read_json_file(fixture_dir() + "/" + c + ".json");
  const json& cs = j["case"];
  ASSERT_EQ(j["versions"]["vllm"], "0.33.0");
  ASSERT_TRUE(j["error"].is_null()) << "vLLM itself refused: " << j["error"];
  const FamilyRow* fr = family_row(cs["family"]);
  if (!fr) GTEST_SKIP() << cs["family"] << ": no moepack row reads this family yet";
  const SourceCodec* codec =
      find_source_codec(fr->read_as != QuantMethod::kNone ? fr->read_as : fr->method);
  const TargetLayout* row = find_target_layout(fr->layout);
  ASSERT_NE(codec, nullptr);
  ASSERT_NE(row, nullptr);

  const DType act = cs["dtype"] == "bfloat16" ? DType::kBF16 : DType::kF16;
  QuantParams q = codec->param_space().front();
  q.dtype = act;  // the model dtype
  const int64_t E = cs["E"], H = cs["H"], I = cs["I"];
  const SafetensorsFile f = SafetensorsFile::open(fixture_dir() + "/" + c + ".safetensors");
  MoeExperts x = read_source(f, *codec, q, E);
  if (fr->method == QuantMethod::kGptOssMxfp4) as_gpt_oss_rows(f, &x);
  const std::string prefix = "model.layers.0.mlp.experts.routed_experts.";
  LayoutOptions o =
      LayoutOptions::for_layer(fr->method, act, true, false, VllmTarget::kV0_33, prefix, I, 1);
  const MoeShape s = moe_shape_of(x);
  ASSERT_EQ(s.hidden(), H);
  ASSERT_EQ(s.inter(), I);
  // NVFP4's rescale factor is the layer's, decided over all its experts as make_plan does.
  if (row->decide_layer) o.layer_decisions = row->decide_layer(o, s, test::whole_layer(x, 1));

  const std::vector<std::string> why = row->unsupported_reasons(o, s);
  if (kernel_refused(c)) {
    EXPECT_FALSE(why.empty()) << c << ": the shipped kernel refused it, the row must too";
    EXPECT_THROW(row->pack(o, x), Error);
    return;
  }
  ASSERT_TRUE(why.empty()) << why.front();
  // (a row without padded_inter never pads: MXFP4)
  ASSERT_EQ(row->padded_inter ? row->padded_inter(o, s) : s.inter(), j["I_padded"].get<int64_t>());

  const std::vector<Tensor> got = row->pack(o, x);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& t : got) by_name[t.name] = &t;
  size_t compared = 0;
  for (const json& out : j["outputs"]) {
    const std::string name = out["name"];
    SCOPED_TRACE(name);
    // compressed-tensors NVFP4 leaves its loaded global scales on the layer (w13/w2 weight and
    // input global scales) beside the processed w13/w2_weight_scale_2 the kernel reads; for
    // NVFP4A16 the input ones are never loaded (torch.empty). moepack writes what the kernel reads.
    if (!out["kernel_reads"].get<bool>() && fr->method == QuantMethod::kCtNvfp4 &&
        name.find("global_scale") != std::string::npos)
      continue;
    // Per-tensor FP8 methods keep the static activation scale, one F32 (the max over experts),
    // which the Marlin W8A16 kernel never reads; moepack does not write it (docs/marlin_float.md).
    const bool per_tensor =
        fr->method == QuantMethod::kCtFp8Tensor || fr->method == QuantMethod::kModeloptFp8;
    if (!out["kernel_reads"].get<bool>() && per_tensor &&
        name.find("input_scale") != std::string::npos)
      continue;
    auto it = by_name.find(name);
    ASSERT_NE(it, by_name.end()) << "moepack does not write " << name;
    const Tensor& t = *it->second;
    EXPECT_EQ(t.dtype, dtype_of(out["dtype"]));
    EXPECT_EQ(t.shape, out["shape"].get<Shape>());
    const TensorView want = f.view(name);
    EXPECT_TRUE(test::bytes_equal(t.data, std::vector<uint8_t>(want.data, want.data + want.nbytes),
                                  16, c + " " + name));
    ++compared;
  }
  EXPECT_EQ(compared, got.size()) << "moepack writes parameters vLLM does not leave on the layer";
  // And back: the layout reads as the experts it was packed from (scales in its dtype).
  TensorMap params;
  for (const auto& t : got) params[t.name] = t;
  const MoeExperts back = row->unpack(o, params);
  // (per-tensor FP8: vLLM requantises w13 to one scale per expert; its bytes are compared above)
  const bool requantised =
      fr->method == QuantMethod::kCtFp8Tensor || fr->method == QuantMethod::kModeloptFp8;
  if (!requantised) {
    EXPECT_EQ(back.w13.codes, x.w13.codes);
  }
  EXPECT_EQ(back.w2.codes, x.w2.codes);
  EXPECT_EQ(back.w13_bias, x.w13_bias);
  EXPECT_EQ(back.w2_bias, x.w2_bias);
}

// The gpt-oss fixture with biases is among the cases (prepare_moe_mxfp4_layer_for_marlin's
// marlin_permute_bias on the H100), so the test above compares moepack's biases with vLLM's.
TEST(MarlinFloatGolden, GptOssBiasFixtureIsPresent) {
  const std::vector<std::string> all = cases();
  EXPECT_NE(std::find(all.begin(), all.end(), "mxfp4_oracle_E2_H256_I128_bf16_bias"), all.end());
}

INSTANTIATE_TEST_SUITE_P(Vllm033H100, MarlinFloatGolden, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// The float repack is moepack's int Marlin tile map (docs/marlin.md) on the raw codes, for every
// family and both widths, straight from the source bytes (no codec involved): e4m3 bytes through
// the int8 map, e2m1 nibbles (low nibble = even k) through the int4 map, gate/up shards and w2's
// K zero-padded to the fixture's I_padded. FP8 per-tensor w13 is left out: vLLM requantises it.
TEST(MarlinFloatGolden, RepackIsTheIntTileMapOnRawCodes) {
  int checked = 0;
  for (const std::string& c : cases()) {
    SCOPED_TRACE(c);
    const json j = test::read_json_file(fixture_dir() + "/" + c + ".json");
    const json& cs = j["case"];
    const std::string fam = cs["family"];
    const bool fp4 = fam.rfind("mxfp4", 0) == 0 || fam.rfind("nvfp4", 0) == 0;
    const int bits = fp4 ? 4 : 8;
    const int64_t E = cs["E"], H = cs["H"], I = cs["I"], ip = j["I_padded"];
    const SafetensorsFile f = SafetensorsFile::open(fixture_dir() + "/" + c + ".safetensors");
    // compressed-tensors and the gpt-oss path: weight_packed; ModelOpt and FP8: weight.
    const std::string wname = f.contains("model.layers.0.mlp.experts.0.gate_proj.weight_packed")
                                  ? "weight_packed"
                                  : "weight";
    const auto codes_of = [&](int64_t e, const std::string& proj, int64_t n, int64_t k) {
      const TensorView v =
          f.view("model.layers.0.mlp.experts." + std::to_string(e) + "." + proj + "." + wname);
      std::vector<uint8_t> out(static_cast<size_t>(n * k));
      for (int64_t i = 0; i < n * k; ++i)
        out[static_cast<size_t>(i)] = fp4 ? (v.data[i / 2] >> (4 * (i % 2))) & 15 : v.data[i];
      return out;
    };
    for (const std::string proj : {"w13", "w2"}) {
      if (proj == "w13" && fam.rfind("fp8_tensor", 0) == 0) continue;
      const int64_t np = proj == "w13" ? 2 * ip : H, kp = proj == "w13" ? H : ip;
      const TensorView want =
          f.view("model.layers.0.mlp.experts.routed_experts." + proj + "_weight");
      ASSERT_EQ(want.nbytes, static_cast<uint64_t>(E * np * kp * bits / 8));
      for (int64_t e = 0; e < E; ++e) {
        std::vector<uint8_t> padded(static_cast<size_t>(np * kp), 0);
        if (proj == "w13") {
          for (int shard = 0; shard < 2; ++shard) {
            const auto src = codes_of(e, shard == 0 ? "gate_proj" : "up_proj", I, H);
            std::copy(src.begin(), src.end(), padded.begin() + shard * ip * H);
          }
        } else {
          const auto src = codes_of(e, "down_proj", H, I);
          for (int64_t r = 0; r < H; ++r)
            std::copy(src.begin() + r * I, src.begin() + (r + 1) * I, padded.begin() + r * kp);
        }
        const std::vector<uint32_t> words =
            marlin_repack(padded.data(), np, kp, bits, nullptr, false);
        const size_t per = words.size() * 4;
        const std::vector<uint8_t> got(reinterpret_cast<const uint8_t*>(words.data()),
                                       reinterpret_cast<const uint8_t*>(words.data()) + per);
        EXPECT_TRUE(test::bytes_equal(
            got, std::vector<uint8_t>(want.data + e * per, want.data + (e + 1) * per), 16,
            c + " " + proj + " expert " + std::to_string(e)));
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 60);
}

// The fixtures are what the README says: made by vLLM 0.33.0 on the H100 with torch 2.11.
TEST(MarlinFloatGolden, FixturesRecordTheirProvenance) {
  const std::vector<std::string> all = cases();
  ASSERT_GE(all.size(), 20u);
  for (const auto& c : all) {
    const json j = test::read_json_file(fixture_dir() + "/" + c + ".json");
    EXPECT_EQ(j["versions"]["vllm"], "0.33.0") << c;
    EXPECT_EQ(j["versions"]["torch"], "2.11.0+cu130") << c;
    EXPECT_EQ(j["versions"]["device"], "NVIDIA H100 80GB HBM3") << c;
  }
}

}  // namespace
}  // namespace moepack
