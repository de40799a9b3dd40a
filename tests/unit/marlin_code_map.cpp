// The host side of verify --device cuda's device decode of the Marlin reference codes
// (kernels/moe_runtime.h MarlinCodeDecode): formats/marlin.h marlin_code_map is a bijection
// between a tile's codes and its words' fields for every (bits, a8), the inverse of
// word_field_of; a gather through it by the device decoder's rule (here on the host) gives
// unpack's codes byte for byte, act-order columns through the inverse sort included;
// unpack_marlin_moe_without_codes is unpack without the codes (everything else byte for byte, the
// same refusals), except where unpack crops a padded I (codes held); a canonical reader over
// codes located elsewhere (codes_at) reads what the reader over the held codes reads.
#include <gtest/gtest.h>

#include <cstring>

#include "formats/layout/marlin_layout.h"
#include "formats/marlin.h"
#include "formats/moe_reader.h"
#include "tests/marlin_artifacts.h"

namespace moepack {
namespace {

TEST(MarlinCodeMap, BijectionOntoTheFieldsForEveryTileVariant) {
  for (int bits : {4, 8})
    for (bool a8 : {false, true}) {
      const MarlinCodeMap m = marlin_code_map(bits, a8);
      EXPECT_EQ(m.bits, bits);
      EXPECT_EQ(m.a8, a8);
      EXPECT_EQ(m.tile_n, a8 ? 32 : 64);
      EXPECT_EQ(m.tile_k, a8 ? 32 : 16);
      EXPECT_EQ(m.pack_factor, 32 / bits);
      EXPECT_EQ(m.words_per_tile * m.pack_factor, m.tile_n * m.tile_k);
      ASSERT_EQ(m.word_field.size(), static_cast<size_t>(m.tile_n * m.tile_k));
      std::vector<int> seen(m.word_field.size(), 0);
      for (int nn = 0; nn < m.tile_n; ++nn)
        for (int kk = 0; kk < m.tile_k; ++kk) {
          const int32_t v = m.word_field[static_cast<size_t>(nn * m.tile_k + kk)];
          ASSERT_GE(v, 0);
          ASSERT_LT(v, static_cast<int32_t>(seen.size()));
          ++seen[static_cast<size_t>(v)];
          int r = -1, f = -1;
          marlin::word_field_of(bits, a8, kk, nn, &r, &f);
          EXPECT_EQ(v, r * m.pack_factor + f)
              << bits << " a8 " << a8 << " nn " << nn << " kk " << kk;
        }
      for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "field " << i;
    }
  test::expect_error([] { marlin_code_map(3, false); }, ErrorCode::kUnsupported);
}

// The device decoder's rule (kernels/include/marlin_code_decode.cuh) on the host: canonical
// code (e, n, j) is field f of word r of tile (kk / tile_k, n / tile_n), kk = inverse_sort[e, j].
std::vector<uint8_t> gather_codes(const MarlinCodeMap& m, const uint32_t* words,
                                  const int32_t* sort, int64_t E, int64_t N, int64_t K) {
  std::vector<int32_t> inverse(static_cast<size_t>(E * K));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t k = 0; k < K; ++k)
      inverse[static_cast<size_t>(e * K + (sort ? sort[e * K + k] : k))] = static_cast<int32_t>(k);
  std::vector<uint8_t> out(static_cast<size_t>(E * N * K));
  const int64_t tiles_n = N / m.tile_n, per_expert = K * N / m.pack_factor;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j) {
        const int64_t kk = inverse[static_cast<size_t>(e * K + j)];
        const int64_t kt = kk / m.tile_k, nt = n / m.tile_n;
        const int rf = m.word_field[static_cast<size_t>((n % m.tile_n) * m.tile_k + kk % m.tile_k)];
        const uint32_t w =
            words[e * per_expert + (kt * tiles_n + nt) * m.words_per_tile + rf / m.pack_factor];
        out[static_cast<size_t>((e * N + n) * K + j)] =
            static_cast<uint8_t>((w >> (m.bits * (rf % m.pack_factor))) & ((1u << m.bits) - 1u));
      }
  return out;
}

const QuantTensor& proj_of(const MoeExperts& x, int i) {
  return i == 0 ? x.w13 : x.w2;
}

TEST(MarlinCodeMap, GatherThroughTheMapIsUnpacksCodes) {
  test::Rng rng(2701);
  const TargetLayout* row = find_target_layout("marlin");
  for (const test::MarlinCase& c : test::marlin_cases()) {
    const test::MarlinArtifact a = test::random_marlin_artifact(rng, c);
    const MoeExperts want = row->unpack(a.lo, a.params);
    for (int i = 0; i < 2; ++i) {
      const QuantTensor& q = proj_of(want, i);
      const MarlinParamNames names =
          marlin_param_names(c.method, i == 0 ? MoeProj::kW13 : MoeProj::kW2);
      const Tensor& qw = a.params.at(a.lo.prefix + names.qweight);
      const int32_t* sort =
          q.g_idx.empty() ? nullptr : a.params.at(a.lo.prefix + names.sort_indices).as<int32_t>();
      EXPECT_EQ(c.act_order, sort != nullptr) << test::marlin_case_name(c);
      const std::vector<uint8_t> got =
          gather_codes(marlin_code_map(q.bits, c.a8), qw.as<uint32_t>(), sort, q.experts, q.n, q.k);
      EXPECT_TRUE(got == q.codes) << test::marlin_case_name(c) << " proj " << i;
    }
  }
}

void expect_same_but_codes(const QuantTensor& got, const QuantTensor& want, const std::string& w) {
  EXPECT_TRUE(got.codes.empty()) << w;
  EXPECT_THROW(got.check_consistent(w), Error) << w;
  EXPECT_EQ(got.experts, want.experts) << w;
  EXPECT_EQ(got.n, want.n) << w;
  EXPECT_EQ(got.k, want.k) << w;
  EXPECT_EQ(got.kind, want.kind) << w;
  EXPECT_EQ(got.bits, want.bits) << w;
  EXPECT_EQ(got.group_size, want.group_size) << w;
  EXPECT_EQ(got.scale_block_n, want.scale_block_n) << w;
  EXPECT_EQ(got.symmetric, want.symmetric) << w;
  EXPECT_EQ(got.scale_dtype, want.scale_dtype) << w;
  EXPECT_TRUE(got.scales == want.scales) << w;
  EXPECT_TRUE(got.zeros == want.zeros) << w;
  EXPECT_TRUE(got.g_idx == want.g_idx) << w;
}

TEST(MarlinCodeMap, WithoutCodesIsUnpackLessTheCodes) {
  test::Rng rng(2702);
  const TargetLayout* row = find_target_layout("marlin");
  for (const test::MarlinCase& c : test::marlin_cases()) {
    const test::MarlinArtifact a = test::random_marlin_artifact(rng, c);
    const MoeExperts want = row->unpack(a.lo, a.params);
    const MoeExperts got = unpack_marlin_moe_without_codes(a.lo, a.params);
    expect_same_but_codes(got.w13, want.w13, test::marlin_case_name(c) + " w13");
    expect_same_but_codes(got.w2, want.w2, test::marlin_case_name(c) + " w2");
  }
  // vLLM 0.33 padded this layer's I: unpack crops it, which reads the codes: held.
  const test::MarlinArtifact a = test::random_marlin_artifact(rng, test::marlin_padded_case());
  ASSERT_LT(a.lo.inter, a.params.at(a.lo.prefix + "w2_qweight").shape[1] * 16);  // padded
  const MoeExperts got = unpack_marlin_moe_without_codes(a.lo, a.params);
  const MoeExperts want = row->unpack(a.lo, a.params);
  EXPECT_FALSE(got.w13.codes.empty());
  EXPECT_TRUE(got.w13.codes == want.w13.codes);
  EXPECT_TRUE(got.w2.codes == want.w2.codes);
  EXPECT_TRUE(got.w2.scales == want.w2.scales);
}

// verify --device cuda stages the qweight straight from the mapped shard and hands the host
// stand-ins of its size (LayerJob::staged_direct): where marlin_without_codes_reads_codes says
// no, the codes-less unpack and the reader's layout must not depend on the qweight's bytes; where
// it says yes (the padded I cropped), they must.
TEST(MarlinCodeMap, WithoutCodesReadsNoQweightByteUnlessItSaysSo) {
  test::Rng rng(2705);
  const TargetLayout* row = find_target_layout("marlin");
  std::vector<test::MarlinCase> cases = test::marlin_cases();
  cases.push_back(test::marlin_padded_case());
  for (const test::MarlinCase& c : cases) {
    const test::MarlinArtifact a = test::random_marlin_artifact(rng, c);
    const std::string name = test::marlin_case_name(c);
    const auto qweight = [&a](MoeProj proj) {
      return a.lo.prefix + marlin_param_names(a.lo.source_method, proj).qweight;
    };
    const int64_t param_inter = a.params.at(qweight(MoeProj::kW2)).shape[1] * 16;
    const bool reads =
        marlin_without_codes_reads_codes(a.lo, a.params.at(qweight(MoeProj::kW2)).shape);
    EXPECT_EQ(reads, a.lo.inter > 0 && a.lo.inter < param_inter) << name;
    TensorMap stand_ins = a.params;
    for (const MoeProj proj : {MoeProj::kW13, MoeProj::kW2})
      for (uint8_t& b : stand_ins.at(qweight(proj)).data) b = static_cast<uint8_t>(rng());
    const MoeExperts want = unpack_marlin_moe_without_codes(a.lo, a.params);
    if (reads) {
      // The codes decoded: the stand-ins' bytes are refused (padding not zero) or read.
      bool refused = false;
      MoeExperts got;
      try {
        got = unpack_marlin_moe_without_codes(a.lo, stand_ins);
      } catch (const Error& e) {
        refused = e.code() == ErrorCode::kBadValue;
      }
      EXPECT_TRUE(refused || got.w13.codes != want.w13.codes) << name;
      continue;
    }
    const MoeExperts got = unpack_marlin_moe_without_codes(a.lo, stand_ins);
    EXPECT_TRUE(got.w13.codes.empty() && got.w2.codes.empty()) << name;
    EXPECT_TRUE(got.w13.scales == want.w13.scales && got.w2.scales == want.w2.scales) << name;
    EXPECT_TRUE(got.w13.zeros == want.w13.zeros && got.w2.g_idx == want.w2.g_idx) << name;
    for (const MoeProj proj : {MoeProj::kW13, MoeProj::kW2}) {
      const reader::ProjReader x = row->make_reader(a.lo, a.params, proj, host_param);
      const reader::ProjReader y = row->make_reader(a.lo, stand_ins, proj, host_param);
      EXPECT_NE(x.marlin.qweight, y.marlin.qweight) << name;  // each over its own bytes
      const auto fields = [](const reader::ProjReader& r) {
        const reader::MarlinParams& m = r.marlin;
        return std::vector<int64_t>{r.experts,
                                    r.n,
                                    r.k,
                                    m.bits,
                                    m.a8,
                                    m.scale_type,
                                    m.grouped_scales,
                                    m.padded_w13,
                                    m.kp,
                                    m.np,
                                    m.groups,
                                    m.group_size,
                                    m.inter,
                                    m.padded_inter,
                                    m.tiles_n,
                                    m.words_per_expert};
      };
      EXPECT_EQ(fields(x), fields(y)) << name;
    }
  }
}

TEST(MarlinCodeMap, WithoutCodesRefusesWhatUnpackRefuses) {
  test::Rng rng(2703);
  const TargetLayout* row = find_target_layout("marlin");
  const test::MarlinArtifact a =
      test::random_marlin_artifact(rng, {QuantMethod::kGptq, 4, 32, true, false, 2, 128, 64});
  // Sort indices that are not a permutation (a repeated index), then a qweight of the wrong shape.
  TensorMap bad_sort = a.params;
  int32_t* s = bad_sort.at(a.lo.prefix + "w2_g_idx_sort_indices").as<int32_t>() + 64;
  s[1] = s[0];
  TensorMap bad_shape = a.params;
  Tensor& qw = bad_shape.at(a.lo.prefix + "w13_qweight");
  qw.shape[1] -= 1;
  qw.data.resize(qw.data.size() - qw.data.size() / 8);
  for (const TensorMap* bad : {&bad_sort, &bad_shape}) {
    const ErrorCode code = bad == &bad_sort ? ErrorCode::kBadValue : ErrorCode::kBadShape;
    const Error want = test::expect_error([&] { row->unpack(a.lo, *bad); }, code);
    const Error got =
        test::expect_error([&] { unpack_marlin_moe_without_codes(a.lo, *bad); }, code);
    EXPECT_EQ(std::string(got.what()), std::string(want.what()));
  }
}

TEST(MarlinCodeMap, CanonicalReaderOverCodesElsewhereReadsTheSame) {
  test::Rng rng(2704);
  const TargetLayout* row = find_target_layout("marlin");
  for (const test::MarlinCase& c :
       {test::MarlinCase{QuantMethod::kAwq, 4, 32, false, false, 2, 128, 64},
        test::MarlinCase{QuantMethod::kGptq, 8, 32, true, false, 2, 128, 64}}) {
    const test::MarlinArtifact a = test::random_marlin_artifact(rng, c);
    const MoeExperts full = row->unpack(a.lo, a.params);
    const MoeExperts bare = unpack_marlin_moe_without_codes(a.lo, a.params);
    const QuantTensor &q = full.w2, &b = bare.w2;
    std::vector<uint8_t> elsewhere = q.codes;  // 8-bit: one per byte
    if (q.bits <= 4) {
      elsewhere.assign((q.codes.size() + 1) / 2, 0);
      pack_code_nibbles(q.codes.data(), q.codes.size(), false, elsewhere.data());
    }
    const reader::ProjReader want = make_canonical_reader(q, reader::ActQuant::kNone, host_buffer);
    const reader::ProjReader got =
        make_canonical_reader(b, reader::ActQuant::kNone, host_buffer, {}, elsewhere.data());
    EXPECT_EQ(got.canonical.codes, elsewhere.data());
    EXPECT_EQ(got.canonical.packed_codes, q.bits <= 4 ? 1 : 0);
    for (int64_t e = 0; e < q.experts; ++e)
      for (int64_t n = 0; n < q.n; ++n)
        for (int64_t k = 0; k < q.k; ++k) {
          const float x = reader::weight(got, e, n, k), y = reader::weight(want, e, n, k);
          ASSERT_EQ(std::memcmp(&x, &y, 4), 0) << test::marlin_case_name(c) << " " << e << " " << n;
        }
    // Codes held AND located elsewhere: a caller's bug.
    test::expect_error(
        [&] {
          make_canonical_reader(q, reader::ActQuant::kNone, host_buffer, {}, elsewhere.data());
        },
        ErrorCode::kInternal);
  }
}

}  // namespace
}  // namespace moepack
