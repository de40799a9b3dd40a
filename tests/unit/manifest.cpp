// moepack.json's quantisation parameters round-trip (verify reads back the parameters the
// conversion used), and malformed manifests are kBadConfig naming the file.
#include "pipeline/manifest.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using nlohmann::json;

TEST(Manifest, QuantParamsRoundTripEveryMethod) {
  for (int m = 0; m <= static_cast<int>(QuantMethod::kFp8Block); ++m) {
    QuantParams q;
    q.method = static_cast<QuantMethod>(m);
    q.bits = 4 + m % 5;
    q.group_size = m % 2 ? -1 : 32 << (m % 3);
    q.symmetric = m % 3 != 0;
    q.act_order = m % 2 == 0;
    q.gptq_format = m % 2 ? GptqFormat::kV2 : GptqFormat::kV1;
    q.actorder = m % 2 ? "weight" : "group";
    q.block_n = 64 + m;
    q.block_k = 128 + m;
    q.dtype = m % 2 ? DType::kF16 : DType::kBF16;
    q.dynamic_input = m % 4 != 1;
    SCOPED_TRACE(quant_method_name(q.method));
    // Through text, as it goes through moepack.json.
    const QuantParams r =
        quant_params_from_json(json::parse(quant_params_json(q).dump()), "moepack.json");
    EXPECT_EQ(r.method, q.method);
    EXPECT_EQ(r.bits, q.bits);
    EXPECT_EQ(r.group_size, q.group_size);
    EXPECT_EQ(r.symmetric, q.symmetric);
    EXPECT_EQ(r.act_order, q.act_order);
    EXPECT_EQ(r.gptq_format, q.gptq_format);
    EXPECT_EQ(r.actorder, q.actorder);
    EXPECT_EQ(r.block_n, q.block_n);
    EXPECT_EQ(r.block_k, q.block_k);
    EXPECT_EQ(r.dtype, q.dtype);
    EXPECT_EQ(r.dynamic_input, q.dynamic_input);
  }
}

TEST(Manifest, MalformedQuantParamsAreBadConfig) {
  json j = quant_params_json(QuantParams{});
  j["method"] = "bitsandbytes";
  try {
    quant_params_from_json(j, "x/moepack.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), "x/moepack.json");
  }
  for (const char* key : {"bits", "group_size", "dtype", "block"}) {
    SCOPED_TRACE(key);
    json k = quant_params_json(QuantParams{});
    k.erase(key);
    try {
      quant_params_from_json(k, "moepack.json");
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadConfig) << e.what();
    }
  }
  json d = quant_params_json(QuantParams{});
  d["dtype"] = "F12";
  try {
    quant_params_from_json(d, "moepack.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadConfig) << e.what();
  } catch (const std::exception& e) {
    FAIL() << "not a moepack::Error: " << e.what();
  }
}

TEST(Manifest, ReadManifestErrors) {
  test::TempDir dir;
  try {
    read_manifest(dir.path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), dir / "moepack.json");
  }
  std::ofstream(dir / "moepack.json") << "{\"manifest_version\": 99}";
  try {
    read_manifest(dir.path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadConfig);
  }
  std::ofstream(dir / "moepack.json") << "{\"manifest_version\": " << kManifestVersion << "}";
  EXPECT_EQ(read_manifest(dir.path)["manifest_version"], kManifestVersion);
}

}  // namespace
}  // namespace moepack
