// GPTQ / AWQ / compressed-tensors source codecs: unpack(pack(x)) == x on random legal shapes,
// hand-worked packing examples from the spec, zero-point conventions, validation errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/half.h"
#include "formats/awq.h"
#include "formats/compressed_tensors.h"
#include "formats/gptq.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using Rng = std::mt19937_64;

QuantTensor random_linear(Rng& rng, int64_t n, int64_t k, int bits, int64_t gs, bool symmetric,
                          bool act_order, DType sd, int zero_max) {
  QuantTensor q;
  q.n = n;
  q.k = k;
  q.bits = bits;
  q.group_size = gs;
  q.symmetric = symmetric;
  q.scale_dtype = sd;
  const int64_t G = q.groups();
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1), zero(0, zero_max);
  q.codes.resize(static_cast<size_t>(n * k));
  for (auto& c : q.codes) c = static_cast<uint8_t>(code(rng));
  q.codes[0] = 1;
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  q.scales.resize(static_cast<size_t>(n * G * q.scale_bytes()));
  for (int64_t i = 0; i < n * G; ++i) {
    const float v = u(rng);
    if (sd == DType::kF32) {
      std::memcpy(q.scales.data() + i * 4, &v, 4);
    } else {
      const uint16_t h = sd == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
      std::memcpy(q.scales.data() + i * 2, &h, 2);
    }
  }
  if (!symmetric) {
    q.zeros.resize(static_cast<size_t>(n * G));
    for (auto& z : q.zeros) z = static_cast<uint8_t>(zero(rng));
  }
  if (act_order) {
    q.g_idx.resize(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) q.g_idx[static_cast<size_t>(i)] = static_cast<int32_t>(i / gs);
    std::shuffle(q.g_idx.begin(), q.g_idx.end(), rng);
    // A shuffle that happens to be k / gs (always so with one group) is "no act-order":
    // the codecs keep g_idx empty then.
    bool trivial = true;
    for (int64_t i = 0; i < k; ++i) trivial = trivial && q.g_idx[static_cast<size_t>(i)] == i / gs;
    if (trivial) q.g_idx.clear();
  }
  return q;
}

void expect_same(const QuantTensor& a, const QuantTensor& b, const std::string& what) {
  EXPECT_EQ(a.n, b.n) << what;
  EXPECT_EQ(a.k, b.k) << what;
  EXPECT_EQ(a.bits, b.bits) << what;
  EXPECT_EQ(a.group_size, b.group_size) << what;
  EXPECT_EQ(a.symmetric, b.symmetric) << what;
  EXPECT_EQ(a.kind, b.kind) << what;
  EXPECT_EQ(a.scale_dtype, b.scale_dtype) << what;
  EXPECT_TRUE(a.codes == b.codes) << what << " codes";
  EXPECT_TRUE(a.scales == b.scales) << what << " scales";
  EXPECT_TRUE(a.zeros == b.zeros) << what << " zeros";
  EXPECT_TRUE(a.g_idx == b.g_idx) << what << " g_idx";
}

template <typename F>
void expect_error(F f, ErrorCode code, const std::string& tensor, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << what << ": " << e.what();
    EXPECT_EQ(e.tensor(), tensor) << what << ": " << e.what();
  }
}

// ---- GPTQ --------------------------------------------------------------------------------------

TEST(Gptq, RoundTripRandom) {
  Rng rng(1);
  for (int trial = 0; trial < 60; ++trial) {
    const int bits = std::vector<int>{2, 4, 8}[rng() % 3];
    const int pf = 32 / bits;
    const int64_t gs = std::vector<int64_t>{-1, 16, 32, 128}[rng() % 4];
    const int64_t k = gs > 0 ? gs * (1 + static_cast<int64_t>(rng() % 4)) : pf * (1 + rng() % 20);
    const int64_t n = pf * (1 + static_cast<int64_t>(rng() % 12));
    QuantParams p;
    p.method = QuantMethod::kGptq;
    p.bits = bits;
    p.group_size = gs;
    p.symmetric = rng() % 2;
    p.act_order = gs > 0 && rng() % 2;
    p.gptq_format = rng() % 2 ? GptqFormat::kV1 : GptqFormat::kV2;
    const DType sd = std::vector<DType>{DType::kF16, DType::kBF16, DType::kF32}[rng() % 3];
    // Both conventions hold every zero 0..2^bits-1 (v1 borrows across the word for a zero of 0).
    QuantTensor q =
        random_linear(rng, n, k, bits, gs, p.symmetric, p.act_order, sd, (1 << bits) - 1);
    const TensorMap t = pack_gptq(p, q);
    EXPECT_EQ(t.at("qweight").shape, (Shape{k / pf, n}));
    EXPECT_EQ(t.at("qzeros").shape, (Shape{q.groups(), n / pf}));
    EXPECT_EQ(t.at("g_idx").shape, (Shape{k}));
    expect_same(unpack_gptq(p, t, n, k), q, "trial " + std::to_string(trial));
  }
}

TEST(Gptq, PackingExampleAndConventionalZeros) {
  // codes 0..7 down K in one column pack to 0x76543210 (low bits first along K, spec §1.2).
  QuantTensor q;
  q.n = 8;
  q.k = 8;
  q.bits = 4;
  q.group_size = -1;
  q.codes.resize(64);
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 8; ++k) q.codes[static_cast<size_t>(n * 8 + k)] = static_cast<uint8_t>(k);
  q.scales.assign(16, 0);
  QuantParams p;
  p.bits = 4;
  TensorMap t = pack_gptq(p, q);
  EXPECT_EQ(t.at("qweight").as<uint32_t>()[0], 0x76543210u);
  EXPECT_EQ(t.at("qzeros").as<uint32_t>()[0], 0x77777777u);  // v1 symmetric: 2^(b-1) - 1
  p.gptq_format = GptqFormat::kV2;
  EXPECT_EQ(pack_gptq(p, q).at("qzeros").as<uint32_t>()[0], 0x88888888u);
  p.bits = 8;
  q.bits = 8;
  t = pack_gptq(p, q);
  EXPECT_EQ(t.at("qzeros").as<uint32_t>()[0], 0x80808080u);
}

TEST(Gptq, V1ZerosAreWordsLessOnePerField) {
  // GPTQModel writes v1 qzeros as the v2 word minus 0x11111111 in int32: a zero of 0 borrows
  // from the next field (issue 11). Zeros (from field 0) 0, 5, 0, 15, 1, 0, 7, 0.
  const std::vector<int> real = {0, 5, 0, 15, 1, 0, 7, 0};
  uint32_t v2 = 0;
  for (int f = 0; f < 8; ++f) v2 |= static_cast<uint32_t>(real[static_cast<size_t>(f)]) << (4 * f);
  const uint32_t v1 = v2 - 0x11111111u;
  QuantParams p;
  p.bits = 4;
  p.symmetric = false;
  p.group_size = -1;
  TensorMap t;
  t["qweight"] = make_tensor("qweight", DType::kI32, {1, 8}, std::vector<uint32_t>(8, 0));
  t["scales"] = make_tensor("scales", DType::kF16, {1, 8}, std::vector<uint16_t>(8, 0x3C00));
  t["qzeros"] = make_tensor("qzeros", DType::kI32, {1, 1}, std::vector<uint32_t>{v1});
  const QuantTensor a = unpack_gptq(p, t, 8, 8);
  for (int f = 0; f < 8; ++f)
    EXPECT_EQ(a.zeros[static_cast<size_t>(f)], real[static_cast<size_t>(f)]);
  EXPECT_EQ(pack_gptq(p, a).at("qzeros").as<uint32_t>()[0], v1);
  // A word whose stored fields are all 0..14 (no zero of 0, every AutoGPTQ file) reads the same
  // as adding 1 field by field.
  t["qzeros"] = make_tensor("qzeros", DType::kI32, {1, 1}, std::vector<uint32_t>{0x7E01234Du});
  const QuantTensor b = unpack_gptq(p, t, 8, 8);
  const std::vector<int> per_field = {0xD + 1, 4 + 1, 3 + 1, 2 + 1, 1 + 1, 0 + 1, 0xE + 1, 7 + 1};
  for (int f = 0; f < 8; ++f)
    EXPECT_EQ(b.zeros[static_cast<size_t>(f)], per_field[static_cast<size_t>(f)]);
  p.gptq_format = GptqFormat::kV2;
  const QuantTensor c = unpack_gptq(p, t, 8, 8);
  EXPECT_EQ(c.zeros[0], 0xD);
  // 8 bits: 0x01010101 per word; a zero of 0 stored as 255 with a borrow, read back as 0.
  p.gptq_format = GptqFormat::kV1;
  p.bits = 8;
  const uint32_t v1_8 = 0x80400100u - 0x01010101u;  // zeros 0, 1, 64, 128 from field 0
  t["qweight"] = make_tensor("qweight", DType::kI32, {2, 4}, std::vector<uint32_t>(8, 0));
  t["scales"] = make_tensor("scales", DType::kF16, {1, 4}, std::vector<uint16_t>(4, 0x3C00));
  t["qzeros"] = make_tensor("qzeros", DType::kI32, {1, 1}, std::vector<uint32_t>{v1_8});
  const QuantTensor d = unpack_gptq(p, t, 4, 8);
  EXPECT_EQ(d.zeros[0], 0);
  EXPECT_EQ(d.zeros[1], 1);
  EXPECT_EQ(d.zeros[2], 64);
  EXPECT_EQ(d.zeros[3], 128);
  EXPECT_EQ(pack_gptq(p, d).at("qzeros").as<uint32_t>()[0], v1_8);
}

TEST(Gptq, GidxTrivialIsDroppedAndValidated) {
  QuantParams p;
  p.bits = 4;
  p.group_size = 8;
  TensorMap t;
  t["qweight"] = make_tensor("qweight", DType::kI32, {2, 8}, std::vector<uint32_t>(16, 0x12345678));
  t["scales"] = make_tensor("scales", DType::kF16, {2, 8}, std::vector<uint16_t>(16, 0x3C00));
  std::vector<int32_t> g(16);
  for (int i = 0; i < 16; ++i) g[static_cast<size_t>(i)] = i / 8;
  t["g_idx"] = make_tensor("g_idx", DType::kI32, {16}, g);
  EXPECT_TRUE(unpack_gptq(p, t, 8, 16).g_idx.empty());
  std::swap(g[0], g[15]);
  t["g_idx"] = make_tensor("g_idx", DType::kI32, {16}, g);
  // A permutation the config does not declare (desc_act false) is a contradiction, not ignored.
  expect_error([&] { unpack_gptq(p, t, 8, 16); }, ErrorCode::kBadValue, "g_idx", "desc_act");
  p.act_order = true;
  EXPECT_EQ(unpack_gptq(p, t, 8, 16).g_idx, g);
  g[3] = 2;
  t["g_idx"] = make_tensor("g_idx", DType::kI32, {16}, g);
  expect_error([&] { unpack_gptq(p, t, 8, 16); }, ErrorCode::kBadValue, "g_idx", "g_idx range");
  t.erase("g_idx");
  expect_error([&] { unpack_gptq(p, t, 8, 16); }, ErrorCode::kMissingTensor, "g_idx", "g_idx");
}

TEST(Gptq, Validation) {
  QuantParams p;
  p.bits = 4;
  p.group_size = 8;
  TensorMap t;
  t["qweight"] = make_tensor("qweight", DType::kI32, {2, 8}, std::vector<uint32_t>(16, 1));
  t["scales"] = make_tensor("scales", DType::kF16, {2, 8}, std::vector<uint16_t>(16, 0x3C00));
  EXPECT_NO_THROW(unpack_gptq(p, t, 8, 16));
  expect_error([&] { unpack_gptq(p, t, 8, 12); }, ErrorCode::kBadShape, "qweight", "K % pf");
  expect_error([&] { unpack_gptq(p, t, 16, 16); }, ErrorCode::kBadShape, "qweight", "N");
  TensorMap bad = t;
  bad["scales"] = make_tensor("scales", DType::kF16, {1, 8}, std::vector<uint16_t>(8, 0x3C00));
  expect_error([&] { unpack_gptq(p, bad, 8, 16); }, ErrorCode::kBadShape, "scales", "G");
  bad = t;
  bad["scales"] = make_tensor("scales", DType::kI32, {2, 8}, std::vector<int32_t>(16, 1));
  expect_error([&] { unpack_gptq(p, bad, 8, 16); }, ErrorCode::kBadDtype, "scales", "dtype");
  bad = t;
  std::vector<uint16_t> s(16, 0x3C00);
  s[5] = 0x7C00;  // +inf
  bad["scales"] = make_tensor("scales", DType::kF16, {2, 8}, s);
  expect_error([&] { unpack_gptq(p, bad, 8, 16); }, ErrorCode::kBadValue, "scales", "inf");
  s[5] = 0x7E00;  // NaN
  bad["scales"] = make_tensor("scales", DType::kF16, {2, 8}, s);
  expect_error([&] { unpack_gptq(p, bad, 8, 16); }, ErrorCode::kBadValue, "scales", "nan");
  bad = t;
  bad.erase("qweight");
  expect_error([&] { unpack_gptq(p, bad, 8, 16); }, ErrorCode::kMissingTensor, "qweight", "miss");
  p.symmetric = false;
  expect_error([&] { unpack_gptq(p, t, 8, 16); }, ErrorCode::kMissingTensor, "qzeros", "asym");
  p.bits = 3;
  expect_error([&] { unpack_gptq(p, t, 8, 16); }, ErrorCode::kUnsupported, "qweight", "3-bit");
}

TEST(Gptq, DetectZeroFormat) {
  const auto view = [](const std::vector<uint32_t>& w) {
    static Tensor t;
    t = make_tensor("qzeros", DType::kI32, {static_cast<int64_t>(w.size())}, w);
    return t.view();
  };
  EXPECT_EQ(detect_gptq_zero_format(view({0x77777777u, 0x77777777u}), 4, true, GptqFormat::kV2),
            GptqFormat::kV1);
  EXPECT_EQ(detect_gptq_zero_format(view({0x88888888u}), 4, true, GptqFormat::kV1),
            GptqFormat::kV2);
  EXPECT_EQ(detect_gptq_zero_format(view({0x88888888u, 0x77777777u}), 4, true, GptqFormat::kV1),
            GptqFormat::kV1);
  EXPECT_EQ(detect_gptq_zero_format(view({0x88888888u, 0x77777777u}), 4, true, GptqFormat::kV2),
            GptqFormat::kV2);
  EXPECT_EQ(detect_gptq_zero_format(view({0x7f7f7f7fu}), 8, true, GptqFormat::kV2),
            GptqFormat::kV1);
  EXPECT_EQ(detect_gptq_zero_format(view({0x80808080u}), 8, true, GptqFormat::kV1),
            GptqFormat::kV2);
  EXPECT_EQ(detect_gptq_zero_format(view({0x88888888u}), 4, false, GptqFormat::kV1),
            GptqFormat::kV1);
}

// ---- AWQ ---------------------------------------------------------------------------------------

TEST(Awq, RoundTripRandomAndOrderExample) {
  Rng rng(2);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t gs = std::vector<int64_t>{32, 64, 128}[rng() % 3];
    const int64_t k = gs * (1 + static_cast<int64_t>(rng() % 3)), n = 8 * (1 + rng() % 16);
    QuantParams p;
    p.method = QuantMethod::kAwq;
    p.bits = 4;
    p.group_size = gs;
    p.symmetric = false;
    const DType sd = rng() % 2 ? DType::kF16 : DType::kBF16;
    const QuantTensor q = random_linear(rng, n, k, 4, gs, false, false, sd, 15);
    const TensorMap t = pack_awq(p, q);
    EXPECT_EQ(t.at("qweight").shape, (Shape{k, n / 8}));
    expect_same(unpack_awq(p, t, n, k), q, "awq trial " + std::to_string(trial));
  }
  // spec §1.2: logical 0..7 along N pack to 0x75316420.
  QuantTensor q;
  q.n = 8;
  q.k = 32;
  q.bits = 4;
  q.group_size = 32;
  q.symmetric = false;
  q.codes.resize(256);
  for (int n = 0; n < 8; ++n)
    for (int k = 0; k < 32; ++k) q.codes[static_cast<size_t>(n * 32 + k)] = static_cast<uint8_t>(n);
  q.zeros = {0, 1, 2, 3, 4, 5, 6, 7};
  q.scales.assign(16, 0);
  QuantParams p;
  p.bits = 4;
  p.group_size = 32;
  const TensorMap t = pack_awq(p, q);
  EXPECT_EQ(t.at("qweight").as<uint32_t>()[0], 0x75316420u);
  EXPECT_EQ(t.at("qzeros").as<uint32_t>()[0], 0x75316420u);
}

TEST(Awq, Refusals) {
  QuantParams p;
  p.bits = 8;
  p.group_size = 128;
  TensorMap t;
  expect_error([&] { unpack_awq(p, t, 8, 128); }, ErrorCode::kUnsupported, "qweight", "8-bit");
  p.bits = 4;
  p.group_size = -1;
  expect_error([&] { unpack_awq(p, t, 8, 128); }, ErrorCode::kUnsupported, "qweight", "no group");
}

// ---- compressed-tensors ------------------------------------------------------------------------

TEST(CtPack, RoundTripRandom) {
  Rng rng(3);
  for (int trial = 0; trial < 60; ++trial) {
    const int bits = rng() % 2 ? 8 : 4;
    const int64_t gs = std::vector<int64_t>{-1, 32, 128}[rng() % 3];
    // K and N need not be multiples of the pack factor (the last word is padded).
    const int64_t k = gs > 0 ? gs * (1 + static_cast<int64_t>(rng() % 3)) : 1 + rng() % 70;
    const int64_t n = 1 + static_cast<int64_t>(rng() % 40);
    QuantParams p;
    p.method = QuantMethod::kCtPackQuantized;
    p.bits = bits;
    p.group_size = gs;
    p.symmetric = rng() % 2;
    p.act_order = gs > 0 && rng() % 2;
    const DType sd = std::vector<DType>{DType::kF16, DType::kBF16, DType::kF32}[rng() % 3];
    const QuantTensor q =
        random_linear(rng, n, k, bits, gs, p.symmetric, p.act_order, sd, (1 << bits) - 1);
    const TensorMap t = pack_ct_pack(p, q);
    const int pf = 32 / bits;
    EXPECT_EQ(t.at("weight_packed").shape, (Shape{n, (k + pf - 1) / pf}));
    EXPECT_EQ(t.at("weight_scale").shape, (Shape{n, q.groups()}));
    EXPECT_EQ(t.count("weight_zero_point"), p.symmetric ? 0u : 1u);
    if (!p.symmetric) {
      EXPECT_EQ(t.at("weight_zero_point").shape, (Shape{(n + pf - 1) / pf, q.groups()}));
    }
    expect_same(unpack_ct_pack(p, t, n, k), q, "ct trial " + std::to_string(trial));
  }
}

TEST(CtPack, StoredCodeIsSignedPlusOffsetAndShapeChecked) {
  // q_signed = -8..7 stored as u = q + 8; the canonical code is u (keeps the uint4b8 bias).
  QuantParams p;
  p.bits = 4;
  p.group_size = -1;
  TensorMap t;
  t["weight_packed"] =
      make_tensor("weight_packed", DType::kI32, {1, 1}, std::vector<uint32_t>{0xF0876543u});
  t["weight_scale"] =
      make_tensor("weight_scale", DType::kBF16, {1, 1}, std::vector<uint16_t>{0x3F80});
  t["weight_shape"] = make_tensor("weight_shape", DType::kI64, {2}, std::vector<int64_t>{1, 8});
  const QuantTensor q = unpack_ct_pack(p, t, 1, 8);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{3, 4, 5, 6, 7, 8, 0, 15}));
  const std::vector<float> w = dequantize_expert(q, 0);
  EXPECT_EQ(w[0], -5.0f);
  EXPECT_EQ(w[7], 7.0f);
  t["weight_shape"] = make_tensor("weight_shape", DType::kI64, {2}, std::vector<int64_t>{8, 1});
  expect_error([&] { unpack_ct_pack(p, t, 1, 8); }, ErrorCode::kBadShape, "weight_shape", "shape");
}

TEST(CtInt8, RoundTripAndStaticInputRefused) {
  QuantParams p;
  p.method = QuantMethod::kCtIntQuantized;
  p.bits = 8;
  TensorMap t;
  std::vector<int8_t> w = {-128, -1, 0, 1, 127, 5};
  t["weight"] = make_tensor("weight", DType::kI8, {2, 3}, w);
  t["weight_scale"] =
      make_tensor("weight_scale", DType::kF32, {2, 1}, std::vector<float>{0.5f, 2.0f});
  const QuantTensor q = unpack_ct_int8(p, t, 2, 3);
  EXPECT_EQ(q.kind, CodeKind::kInt);
  EXPECT_EQ(q.groups(), 1);
  const std::vector<float> d = dequantize_expert(q, 0);
  EXPECT_EQ(d[0], -64.0f);
  EXPECT_EQ(d[4], 254.0f);
  const TensorMap back = pack_ct_int8(p, q);
  EXPECT_EQ(back.at("weight").data, t.at("weight").data);
  EXPECT_EQ(back.at("weight_scale").data, t.at("weight_scale").data);
  EXPECT_EQ(back.at("weight_scale").shape, (Shape{2, 1}));
  t["input_scale"] = make_tensor("input_scale", DType::kF32, {1}, std::vector<float>{1.0f});
  expect_error([&] { unpack_ct_int8(p, t, 2, 3); }, ErrorCode::kUnsupported, "input_scale",
               "static input scale");
}

TEST(CtPack, LogicalShapeReadsWeightShapeForKNotAMultipleOfThePackFactor) {
  QuantParams p;
  p.method = QuantMethod::kCtPackQuantized;
  p.bits = 4;
  p.group_size = -1;
  p.dtype = DType::kBF16;
  QuantTensor q(ct_pack_spec_for(p), 1, 8, 12);  // K = 12: weight_packed holds ceil(12 / 8) words
  for (size_t i = 0; i < q.codes.size(); ++i) q.codes[i] = static_cast<uint8_t>(1 + i % 15);
  for (int64_t n = 0; n < 8; ++n) {
    const uint16_t h = float_to_bf16(0.01f * static_cast<float>(n + 1));
    std::memcpy(q.scales.data() + 2 * n, &h, 2);
  }
  TensorMap m = pack_ct_pack(p, q);
  std::map<std::string, TensorView> views;
  for (const auto& [suffix, t] : m) views[suffix] = t.view();
  EXPECT_EQ(ct_pack_logical_shape(p, views), std::make_pair(int64_t{8}, int64_t{12}));
  const QuantTensor back = unpack_ct_pack(p, m, 8, 12);
  EXPECT_EQ(back.codes, q.codes);
  // A weight_shape that contradicts weight_packed is a malformed checkpoint, named.
  m["weight_shape"] = make_tensor<int32_t>("weight_shape", DType::kI32, {2}, {8, 20});
  views["weight_shape"] = m["weight_shape"].view();
  try {
    ct_pack_logical_shape(p, views);
    FAIL() << "expected kBadShape";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadShape);
    EXPECT_EQ(e.tensor(), "weight_shape");
  }
}

}  // namespace
}  // namespace moepack
