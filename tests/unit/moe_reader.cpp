// The layout readers (formats/layout/moe_reader.h) proven on the CPU, beyond what the registry
// suite proves for every row (tests/unit/registry_suite.cpp: each row's reader equals the
// canonical dequantisation of unpack at act_col bit for bit over the row's sample space, and
// reader_expert_matmul is that reading summed in column order):
//   - the MOEPACK_HD float codecs equal the host ones (every 8- and 16-bit code; float inputs
//     around every rounding boundary);
//   - the inverse index maps invert the layouts' forward maps;
//   - Marlin options the registry does not draw (a8, vLLM 0.33's padded intermediate, act-order,
//     --vllm-w13-scale-size-k: the reader equals unpack under the kernel's scale rule) and Triton
//     WNA16's wrapped GPTQ zero 16 (the reader reads zero 0, as the kernel does);
//   - the canonical reader equals dequantize_expert exactly;
//   - a mutated byte of the packed layout changes exactly the element the layout map says;
//   - the builders refuse what unpack refuses and read corrupt but well-shaped bytes;
//   - reader_expert_matmul refuses an expert outside its chunk;
//   - quantize_activation_row equals an independent statement of each ActQuant rule, on edge rows.
#include "formats/moe_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "core/half.h"
#include "formats/fp8.h"
#include "formats/layout/marlin_layout.h"
#include "formats/layout/trtllm_layout.h"
#include "formats/marlin.h"
#include "formats/mxfp8.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using reader::ActQuant;
using reader::ProjReader;
using test::Rng;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Bit equality, any NaN equal to any NaN (the host decoders return std::nanf).
bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return bits_of(a) == bits_of(b);
}

// Floats around every rounding boundary of the 8- and 16-bit formats: all exponents, the
// mantissa patterns near the halfway points of 3, 7 and 10 kept bits, plus random patterns.
std::vector<float> boundary_floats(Rng& rng) {
  std::vector<float> v;
  const uint32_t tails[] = {0x0u,     0x1u,     0x7ffu,    0x800u,    0x801u,   0xfffu,   0x1000u,
                            0x1001u,  0x7fffu,  0x8000u,   0x8001u,   0xffffu,  0x7ffffu, 0x80000u,
                            0x80001u, 0xfffffu, 0x100000u, 0x180000u, 0x7fffffu};
  for (uint32_t exp = 0; exp < 256; ++exp)
    for (uint32_t hi = 0; hi < 8; ++hi)
      for (uint32_t t : tails)
        for (uint32_t sign : {0u, 0x80000000u}) {
          const uint32_t mant = ((hi << 20) | (t & 0xfffffu)) & 0x7fffffu;
          v.push_back(from_bits(sign | (exp << 23) | mant));
          v.push_back(from_bits(sign | (exp << 23) | (t & 0x7fffffu)));
        }
  for (int i = 0; i < 200000; ++i) v.push_back(from_bits(static_cast<uint32_t>(rng())));
  return v;
}

TEST(FpBits, DecodersEqualHostOnEveryCode) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto c = static_cast<uint16_t>(h);
    ASSERT_TRUE(same_float(hd::f16_value(c), f16_to_float(c))) << "f16 " << h;
    ASSERT_TRUE(same_float(hd::bf16_value(c), bf16_to_float(c))) << "bf16 " << h;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    const auto c = static_cast<uint8_t>(b);
    ASSERT_TRUE(same_float(hd::e4m3_value(c), e4m3_to_float(c))) << "e4m3 " << b;
    ASSERT_TRUE(same_float(hd::e8m0_value(c), e8m0_to_float(c))) << "e8m0 " << b;
    ASSERT_TRUE(same_float(hd::e2m1_value(c), e2m1_to_float(c))) << "e2m1 " << b;
  }
}

TEST(FpBits, EncodersEqualHostAroundEveryBoundary) {
  Rng rng(12);
  for (float f : boundary_floats(rng)) {
    ASSERT_EQ(hd::f16_round(f), float_to_f16(f)) << std::hexfloat << f;
    ASSERT_EQ(hd::bf16_round(f), float_to_bf16(f)) << std::hexfloat << f;
    ASSERT_EQ(hd::e4m3_round_satfinite(f), float_to_e4m3_satfinite(f)) << std::hexfloat << f;
    ASSERT_EQ(hd::e8m0_ceil(f), e8m0_ceil_code(f)) << std::hexfloat << f;
  }
}

// ---- index map inverses ----------------------------------------------------------------------

TEST(ReaderMaps, MarlinWordFieldOfInvertsWordFieldCoords) {
  for (int bits : {4, 8})
    for (bool a8 : {false, true}) {
      const int T = marlin::words_per_tile(bits), pf = marlin::pack_factor(bits);
      // Tile (kt, nt) = (1, 2): the map must also carry the tile offsets.
      std::vector<int> seen(static_cast<size_t>(T * pf), 0);
      for (int r = 0; r < T; ++r)
        for (int f = 0; f < pf; ++f) {
          int64_t k, n;
          marlin::word_field_coords(bits, a8, 1, 2, r, f, &k, &n);
          ASSERT_EQ(k / marlin::tile_k(a8), 1);
          ASSERT_EQ(n / marlin::tile_n(a8), 2);
          int rr = -1, ff = -1;
          marlin::word_field_of(bits, a8, k, n, &rr, &ff);
          ASSERT_EQ(rr, r) << "bits=" << bits << " a8=" << a8 << " f=" << f;
          ASSERT_EQ(ff, f) << "bits=" << bits << " a8=" << a8 << " r=" << r;
          ++seen[static_cast<size_t>(r * pf + f)];
        }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    }
}

TEST(ReaderMaps, MarlinChunkPermutationInverses) {
  for (bool grouped : {false, true}) {
    const int c = marlin::scale_chunk(grouped);
    for (int i = 0; i < c; ++i)
      EXPECT_EQ(marlin::scale_perm_src(grouped, marlin::scale_perm_dst(grouped, i)), i)
          << "grouped=" << grouped;
  }
  for (int bits : {4, 8})
    for (bool a8 : {false, true})
      for (int i = 0; i < 64; ++i)
        EXPECT_EQ(marlin::zero_point_src(bits, a8, marlin::zero_point_dst(bits, a8, i)), i)
            << "bits=" << bits << " a8=" << a8;
}

TEST(ReaderMaps, ShuffleRowInverse) {
  for (int64_t block : {16, 32})
    for (int64_t r = 0; r < 4 * block; ++r)
      EXPECT_EQ(trtllm::shuffle_a_src_row(trtllm::shuffle_a_dst_row(r, block), block), r);
}

// ---- canonical reader --------------------------------------------------------------------------

// The reader, and for codes of <= 4 bits the reader over codes packed two per byte (what
// verify --device cuda uploads), equal dequantize_expert bit for bit.
void expect_canonical_equals_dequantize(const QuantTensor& q, const std::string& what) {
  std::vector<uint8_t> packed;
  const NibbleLocator pack = [&](const uint8_t* codes, size_t count) {
    packed.assign((count + 1) / 2, 0xee);
    pack_code_nibbles(codes, count, q.kind == CodeKind::kInt, packed.data());
    return static_cast<const void*>(packed.data());
  };
  for (bool nibbles : {false, true}) {
    if (nibbles && q.bits > 4) continue;
    const ProjReader r =
        make_canonical_reader(q, ActQuant::kNone, host_buffer, nibbles ? pack : NibbleLocator{});
    ASSERT_EQ(r.n, q.n);
    ASSERT_EQ(r.k, q.k);
    ASSERT_EQ(r.canonical.packed_codes, nibbles ? 1 : 0);
    for (int64_t e = 0; e < q.experts; ++e) {
      const std::vector<float> d = dequantize_expert(q, e);
      for (int64_t n = 0; n < q.n; ++n)
        for (int64_t k = 0; k < q.k; ++k) {
          const float got = reader::weight(r, e, n, k), want = d[static_cast<size_t>(n * q.k + k)];
          ASSERT_TRUE(same_float(got, want))
              << what << (nibbles ? " packed" : "") << " e=" << e << " n=" << n << " k=" << k
              << ": " << got << " vs " << want;
        }
      // The strided decoder (the GPU runtime's) gives the same floats, from every column.
      for (int64_t n = 0; n < q.n; ++n)
        for (int64_t k0 = 0; k0 < q.k; ++k0) {
          float got[8];
          const int count = static_cast<int>(
              std::min<int64_t>(8, (q.k - k0 + reader::kStrideCols - 1) / reader::kStrideCols));
          reader::weight_strided(r, e, n, k0, count, got);
          for (int j = 0; j < count; ++j) {
            const int64_t kk = k0 + reader::kStrideCols * j;
            ASSERT_TRUE(same_float(got[j], d[static_cast<size_t>(n * q.k + kk)]))
                << what << (nibbles ? " packed" : "") << " weight_strided e=" << e << " n=" << n
                << " k=" << kk << " from " << k0;
          }
        }
    }
  }
}

// Packing two codes a byte: every 4-bit code and signed code round-trips (odd counts too), and a
// code that does not fit is refused rather than truncated.
TEST(CanonicalReader, PackedCodesRoundTripAndRefuseWideCodes) {
  for (bool signed_codes : {false, true}) {
    std::vector<uint8_t> codes;
    for (int v = 0; v < 16; ++v)
      codes.push_back(static_cast<uint8_t>(signed_codes ? static_cast<int8_t>(v - 8) : v));
    codes.push_back(codes[3]);  // odd count
    std::vector<uint8_t> out((codes.size() + 1) / 2);
    pack_code_nibbles(codes.data(), codes.size(), signed_codes, out.data());
    reader::CanonicalParams p{};
    p.codes = out.data();
    p.code_type = signed_codes ? reader::kCodeInt : reader::kCodeUint;
    for (size_t i = 0; i < codes.size(); ++i)
      EXPECT_EQ(reader::code_nibble(p, static_cast<int64_t>(i)), codes[i]) << i;
    std::vector<uint8_t> wide = codes;
    wide[5] = signed_codes ? 8 : 16;  // +8 signed, 16 unsigned: five bits
    test::expect_error(
        [&] { pack_code_nibbles(wide.data(), wide.size(), signed_codes, out.data()); },
        ErrorCode::kInternal);
  }
}

// The eight-codes-a-step pack equals the scalar definition on random lengths (odd ones, tails
// of every length), signed and unsigned, and refuses a wide code wherever it sits: in a whole
// word at every byte position, or in the tail.
TEST(CanonicalReader, PackedCodesFastEqualsScalar) {
  std::mt19937_64 rng(2706);
  for (int trial = 0; trial < 400; ++trial) {
    const bool signed_codes = trial % 2;
    const size_t count = trial < 40 ? static_cast<size_t>(trial) : 1 + rng() % 300;
    std::vector<uint8_t> codes(count);
    for (auto& c : codes) {
      const int v = static_cast<int>(rng() % 16);
      c = static_cast<uint8_t>(signed_codes ? static_cast<int8_t>(v - 8) : v);
    }
    std::vector<uint8_t> want((count + 1) / 2 + 1, 0xee), got(want.size(), 0xee);
    pack_code_nibbles_scalar(codes.data(), count, signed_codes, want.data());
    pack_code_nibbles(codes.data(), count, signed_codes, got.data());
    ASSERT_TRUE(got == want) << "count " << count << " signed " << signed_codes;
    if (count == 0) continue;
    // One wide code at each position of the first word and of the tail, and one at random.
    std::vector<size_t> spots;
    for (size_t i = 0; i < std::min<size_t>(count, 8); ++i) spots.push_back(i);
    for (size_t i = count - count % 8; i < count; ++i) spots.push_back(i);
    spots.push_back(rng() % count);
    for (size_t at : spots) {
      std::vector<uint8_t> wide = codes;
      // Signed: +8, -9, 112, 16 (high nibble not the low one's sign); unsigned: 16..255.
      const uint8_t bad[] = {8, 0xf7, 0x70, 0x10};
      wide[at] = signed_codes ? bad[rng() % 4] : static_cast<uint8_t>(16 + rng() % 240);
      test::expect_error(
          [&] { pack_code_nibbles_scalar(wide.data(), count, signed_codes, want.data()); },
          ErrorCode::kInternal);
      test::expect_error([&] { pack_code_nibbles(wide.data(), count, signed_codes, got.data()); },
                         ErrorCode::kInternal);
      ASSERT_TRUE(got == want) << "count " << count << " wide code at " << at;
    }
  }
}

TEST(CanonicalReader, EqualsDequantizeExpertForEveryCodecSpec) {
  Rng rng(1212);
  int cases = 0;
  for (const SourceCodec& codec : source_codecs())
    for (const QuantParams& params : codec.param_space()) {
      const QuantSpec spec = codec.spec_for(params);
      test::RandomTensorOptions ro;
      ro.scales = test::ScaleValues::kAnyPositiveFinite;
      std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(params);
      ro.act_order = params.act_order;
      const int64_t gs = spec.group_size > 0 ? spec.group_size : 32;
      for (const auto& [n, k] : {std::make_pair<int64_t, int64_t>(64, 4 * gs), {40, 2 * gs}}) {
        const int64_t nn = spec.scale_block_n > 1 ? n * 3 + 7 : n;  // a partial scale block
        const QuantTensor q = test::random_quant_tensor(rng, spec, 2, nn, k, ro);
        expect_canonical_equals_dequantize(
            q, std::string(codec.name) + " {" + test::describe_params(params) + "}");
        ++cases;
      }
    }
  EXPECT_GE(cases, 10);
}

// FP4 codes with E4M3 (NVFP4) or E8M0 (MXFP4) block scales, with and without a global scale
// in either convention, one or two global shards (a gated w13 keeps gate's and up's).
TEST(CanonicalReader, EqualsDequantizeExpertForFp4AndGlobalScales) {
  Rng rng(2424);
  int cases = 0;
  for (const auto& [scale_dtype, group] :
       {std::make_pair(DType::kF8_E4M3, int64_t{16}), std::make_pair(DType::kU8, int64_t{32})})
    for (GlobalScale gs :
         {GlobalScale::kNone, GlobalScale::kDecodeMultiplier, GlobalScale::kEncodeDivisor})
      for (int64_t shards : {1, 2})
        for (test::ScaleValues sv :
             {test::ScaleValues::kAnyPositiveFinite, test::ScaleValues::kModerate}) {
          QuantSpec spec;
          spec.kind = CodeKind::kFp4E2M1;
          spec.bits = 4;
          spec.group_size = group;
          spec.scale_dtype = scale_dtype;
          spec.global_scale = gs;
          test::RandomTensorOptions ro;
          ro.scales = sv;
          ro.global_shards = shards;
          const QuantTensor q = test::random_quant_tensor(rng, spec, 3, 48, 4 * group, ro);
          expect_canonical_equals_dequantize(
              q, "fp4 scale " + std::string(dtype_name(scale_dtype)) + " global " +
                     std::to_string(static_cast<int>(gs)) + " shards " + std::to_string(shards));
          ++cases;
        }
  EXPECT_EQ(cases, 24);
}

TEST(CanonicalReader, LocatorAndNullBuffers) {
  Rng rng(3);
  QuantSpec s;
  s.bits = 4;
  s.group_size = 32;
  s.symmetric = false;
  const QuantTensor q = test::random_quant_tensor(rng, s, 1, 8, 64, {});
  int calls = 0;
  const ProjReader r = make_canonical_reader(q, ActQuant::kBf16, [&](const void* p, size_t) {
    ++calls;
    return p;
  });
  EXPECT_EQ(calls, 3);  // codes, scales, zeros (no g_idx)
  EXPECT_EQ(r.canonical.g_idx, nullptr);
  EXPECT_EQ(r.act, ActQuant::kBf16);
  QuantTensor bad = q;
  bad.codes.pop_back();
  test::expect_error([&] { make_canonical_reader(bad, ActQuant::kNone, host_buffer); },
                     ErrorCode::kInternal);
}

// ---- layout readers ----------------------------------------------------------------------------

TensorMap by_name(const std::vector<Tensor>& ts) {
  TensorMap m;
  for (const auto& t : ts) m[t.name] = t;
  return m;
}

// ---- Marlin options beyond the registry's draws ----------------------------------------------

const TargetLayout& layout_named(const char* name) {
  const TargetLayout* t = find_target_layout(name);
  if (!t) throw Error(ErrorCode::kInternal, std::string("no layout ") + name);
  return *t;
}

QuantParams gptq_params(int bits, int64_t gs, bool act_order) {
  QuantParams p;
  p.method = QuantMethod::kGptq;
  p.bits = bits;
  p.group_size = gs;
  p.act_order = act_order;
  p.dtype = DType::kF16;
  return p;
}

TEST(MarlinReader, A8PaddedIntermediateAndLoaderScaleRule) {
  const TargetLayout& marlin = layout_named("marlin");
  Rng rng(88);
  struct Case {
    int bits;
    int64_t gs, H, I;
    bool a8, act_order, size_k_rule;
    VllmTarget target;
    bool exact;
  };
  const Case cases[] = {
      {4, 128, 256, 256, true, false, false, VllmTarget::kV2026_05, true},  // a8, grouped
      {8, -1, 128, 128, true, false, false, VllmTarget::kV2026_05, true},   // a8, channelwise
      {4, 32, 256, 96, false, false, false, VllmTarget::kV0_33, true},      // I 96 -> 128
      {8, -1, 128, 160, false, false, false, VllmTarget::kV0_33, true},     // I 160 -> 192
      {4, 64, 128, 128, false, true, false, VllmTarget::kV2026_05, true},   // act-order
      // group_size >= I: vLLM's loader permutes w13 scales single, its kernel reads grouped.
      {4, 128, 256, 128, false, false, true, VllmTarget::kV2026_05, false},
  };
  for (const Case& c : cases) {
    for (bool gated : {true, false}) {
      std::ostringstream trace;
      trace << "bits=" << c.bits << " gs=" << c.gs << " H=" << c.H << " I=" << c.I << " a8=" << c.a8
            << " act_order=" << c.act_order << " size_k=" << c.size_k_rule
            << " target=" << vllm_target_name(c.target) << " gated=" << gated;
      SCOPED_TRACE(trace.str());
      const QuantParams params = gptq_params(c.bits, c.gs, c.act_order);
      const MoeShape s = moe_shape_for(params, 2, c.H, c.I, gated);
      LayoutOptions o = LayoutOptions::for_layer(QuantMethod::kGptq, DType::kBF16, gated,
                                                 c.size_k_rule, c.target, "m.", c.I, 1);
      o.a8 = c.a8;
      ASSERT_TRUE(marlin.unsupported_reasons(o, s).empty());
      test::RandomTensorOptions ro;
      ro.zero_lo = 1;
      const MoeExperts x = test::random_moe_experts(rng, s, ro);
      const TensorMap params_by_name = by_name(marlin.pack(o, x));
      // What the kernel reads: unpack under the kernel's scale rule (the loader's rule differs
      // where --vllm-w13-scale-size-k matters).
      LayoutOptions kernel_rule = o;
      kernel_rule.vllm_w13_scale_size_k = false;
      test::expect_reader_matches(rng, marlin, o, params_by_name,
                                  marlin.unpack(kernel_rule, params_by_name));
      if (!c.exact) {
        // The case must matter: the reader's weights differ from the loader's decoding.
        const MoeExperts back = marlin.unpack(o, params_by_name);
        const ProjReader r = marlin.make_reader(o, params_by_name, MoeProj::kW13, host_param);
        const std::vector<float> d = dequantize_expert(back.w13, 0);
        int64_t differ = 0;
        for (int64_t n = 0; n < r.n; ++n)
          for (int64_t k = 0; k < r.k; ++k)
            differ += !same_float(reader::weight(r, 0, n, k), d[static_cast<size_t>(n * r.k + k)]);
        EXPECT_GT(differ, 0);
      }
    }
  }
}

// One flipped code bit in one Marlin word changes exactly the element word_field_coords names.
TEST(MarlinReader, OneMutatedWordChangesExactlyTheMappedElement) {
  const TargetLayout& marlin = layout_named("marlin");
  Rng rng(5);
  for (int bits : {4, 8})
    for (bool a8 : {false, true}) {
      SCOPED_TRACE("bits=" + std::to_string(bits) + " a8=" + std::to_string(a8));
      const QuantParams params = gptq_params(bits, 128, false);
      const MoeShape s = moe_shape_for(params, 2, 256, 128, true);
      LayoutOptions o;
      o.a8 = a8;
      o.source_method = QuantMethod::kGptq;
      const MoeExperts x = test::random_moe_experts(rng, s, {});
      TensorMap params_by_name = by_name(marlin.pack(o, x));
      const ProjReader before = marlin.make_reader(o, params_by_name, MoeProj::kW13, host_param);
      std::vector<float> w0(static_cast<size_t>(before.n * before.k));
      for (int64_t n = 0; n < before.n; ++n)
        for (int64_t k = 0; k < before.k; ++k)
          w0[static_cast<size_t>(n * before.k + k)] = reader::weight(before, 1, n, k);
      // Word r of tile (kt, nt) = (3, 1) of expert 1, field f: flip its top bit.
      const int T = marlin::words_per_tile(bits), r = 37 % T, f = 1;
      const int64_t ntn = before.n / marlin::tile_n(a8), kt = 3, nt = 1;
      Tensor& qw = params_by_name.at("w13_qweight");
      uint32_t* words =
          qw.as<uint32_t>() + before.marlin.words_per_expert + (kt * ntn + nt) * T + r;
      *words ^= 1u << (bits * f + bits - 1);
      int64_t want_k, want_n;
      marlin::word_field_coords(bits, a8, kt, nt, r, f, &want_k, &want_n);
      const ProjReader after = marlin.make_reader(o, params_by_name, MoeProj::kW13, host_param);
      int64_t changed = 0;
      for (int64_t n = 0; n < after.n; ++n)
        for (int64_t k = 0; k < after.k; ++k) {
          const bool same =
              same_float(reader::weight(after, 1, n, k), w0[static_cast<size_t>(n * after.k + k)]);
          if (!same) {
            ++changed;
            EXPECT_EQ(n, want_n);
            EXPECT_EQ(k, want_k);
          }
          if (n == 0 && k < 4) {  // expert 0 untouched
            EXPECT_TRUE(
                same_float(reader::weight(after, 0, n, k), reader::weight(before, 0, n, k)));
          }
        }
      EXPECT_EQ(changed, 1);
    }
}

TEST(MarlinReader, BuilderRefusesWhatUnpackRefuses) {
  const TargetLayout& marlin = layout_named("marlin");
  Rng rng(9);
  const QuantParams params = gptq_params(4, 64, true);
  const MoeShape s = moe_shape_for(params, 2, 128, 128, true);
  LayoutOptions o;
  o.source_method = QuantMethod::kGptq;
  const MoeExperts x = test::random_moe_experts(rng, s, {});
  const TensorMap good = by_name(marlin.pack(o, x));
  // Sort indices that are no permutation: unpack and the builder both refuse (kBadValue).
  TensorMap bad = good;
  bad.at("w2_g_idx_sort_indices").as<int32_t>()[128 + 5] = 0;
  test::expect_error([&] { marlin.unpack(o, bad); }, ErrorCode::kBadValue);
  const Error e = test::expect_error([&] { marlin.make_reader(o, bad, MoeProj::kW2, host_param); },
                                     ErrorCode::kBadValue);
  EXPECT_EQ(e.tensor(), "w2_g_idx_sort_indices");
  // A wrong scale dtype: kBadDtype naming the parameter.
  TensorMap wrong = good;
  wrong.at("w13_scales").dtype = DType::kF16;
  const Error d = test::expect_error(
      [&] { marlin.make_reader(o, wrong, MoeProj::kW13, host_param); }, ErrorCode::kBadDtype);
  EXPECT_EQ(d.tensor(), "w13_scales");
  // A missing parameter.
  TensorMap missing = good;
  missing.erase("w13_qweight");
  test::expect_error([&] { marlin.make_reader(o, missing, MoeProj::kW2, host_param); },
                     ErrorCode::kMissingTensor);
  // Corrupted but well-shaped bytes are read, not refused.
  TensorMap corrupt = good;
  corrupt.at("w13_qweight").data[100] ^= 0xff;
  EXPECT_NO_THROW(marlin.make_reader(o, corrupt, MoeProj::kW13, host_param));
}

// ---- Triton WNA16 and TRT-LLM specifics ------------------------------------------------------

// GPTQ zero 16 (stored 15): vLLM's loader adds 1 in uint8 and wraps it into nibble 0, which the
// kernel reads as 0. The reader reads what the kernel reads, not unpack's 16.
TEST(TritonWna16Reader, WrappedGptqZeroIsReadAsTheKernelReadsIt) {
  const TargetLayout& triton = layout_named("triton-wna16");
  Rng rng(16);
  QuantParams params = gptq_params(4, 128, false);
  params.symmetric = false;
  const MoeShape s = moe_shape_for(params, 2, 256, 256, true);
  LayoutOptions o;
  o.source_method = QuantMethod::kGptq;
  test::RandomTensorOptions ro;
  ro.zero_lo = 1;
  ro.zero_hi = 16;
  MoeExperts x = test::random_moe_experts(rng, s, ro);
  x.w13.zeros[0] = 16;
  const TensorMap m = by_name(triton.pack(o, x));
  // What the kernel reads (docs/triton_wna16.md "Zero points"): rows n, n + 1 share the byte
  // (z_n + 16 z_{n+1}) mod 256, so a zero of 16 reads as nibble 0 and carries into its odd
  // neighbour. Stated here from unpack's real zeros.
  MoeExperts kernel_view = triton.unpack(o, m);
  int64_t wrapped = 0;
  for (QuantTensor* q : {&kernel_view.w13, &kernel_view.w2}) {
    const int64_t G = q->groups();
    for (int64_t e = 0; e < q->experts; ++e)
      for (int64_t n = 0; n + 1 < q->n; n += 2)
        for (int64_t g = 0; g < G; ++g) {
          uint8_t& lo = q->zeros[static_cast<size_t>((e * q->n + n) * G + g)];
          uint8_t& hi = q->zeros[static_cast<size_t>((e * q->n + n + 1) * G + g)];
          wrapped += lo == 16 || hi == 16;
          const auto byte = static_cast<uint8_t>((lo + 16 * hi) & 0xff);
          lo = byte & 15;
          hi = byte >> 4;
        }
  }
  ASSERT_GT(wrapped, 0);
  test::expect_reader_matches(rng, triton, o, m, kernel_view);
  const ProjReader r = triton.make_reader(o, m, MoeProj::kW13, host_param);
  const std::vector<float> d = dequantize_expert(triton.unpack(o, m).w13, 0);
  // Row 0, group 0: unpack says zero 16, the kernel reads nibble 0.
  const float code = static_cast<float>(x.w13.codes[0]);
  const float scale = reader::scale_at(r.triton_wna16.scales, 0, r.triton_wna16.scale_type);
  EXPECT_TRUE(same_float(reader::weight(r, 0, 0, 0), code * scale));
  EXPECT_TRUE(same_float(d[0], (code - 16.0f) * scale));
}

TEST(LayoutReaders, BuildersRefuseWhatUnpackRefusesAndReadCorruptBytes) {
  Rng rng(21);
  struct Row {
    const char* layout;
    QuantMethod method;
    int bits;
    int64_t gs;
    const char* bad_param;  // given a wrong dtype
  };
  QuantParams int8p;
  int8p.method = QuantMethod::kCtIntQuantized;
  int8p.bits = 8;
  int8p.group_size = -1;
  QuantParams mx;
  mx.method = QuantMethod::kModeloptMxfp8;
  mx.bits = 8;
  mx.group_size = 32;
  QuantParams blk;
  blk.method = QuantMethod::kFp8Block;
  blk.bits = 8;
  blk.group_size = 128;
  const std::pair<const char*, QuantParams> rows[] = {{"triton-wna16", gptq_params(4, 128, false)},
                                                      {"triton-int8", int8p},
                                                      {"trtllm-mxfp8", mx},
                                                      {"trtllm-fp8-block", blk}};
  for (const auto& [name, params] : rows) {
    SCOPED_TRACE(name);
    const TargetLayout& row = layout_named(name);
    const MoeShape s = moe_shape_for(params, 2, 256, 256, true);
    LayoutOptions o;
    o.source_method = params.method;
    ASSERT_TRUE(row.unsupported_reasons(o, s).empty());
    const MoeExperts x = test::random_moe_experts(rng, s, {});
    const TensorMap good = by_name(row.pack(o, x));
    for (const auto& [pname, t] : good) {
      // Every parameter: missing -> kMissingTensor; wrong dtype -> what unpack says.
      TensorMap missing = good;
      missing.erase(pname);
      test::expect_error([&] { row.make_reader(o, missing, MoeProj::kW13, host_param); },
                         ErrorCode::kMissingTensor);
      TensorMap wrong = good;
      wrong.at(pname).dtype = t.dtype == DType::kI32 ? DType::kF32 : DType::kI32;
      ErrorCode unpack_code = ErrorCode::kInternal;
      try {
        row.unpack(o, wrong);
      } catch (const Error& e) {
        unpack_code = e.code();
      }
      ASSERT_NE(unpack_code, ErrorCode::kInternal) << pname << ": unpack took a wrong dtype";
      test::expect_error([&] { row.make_reader(o, wrong, MoeProj::kW2, host_param); }, unpack_code);
    }
    TensorMap corrupt = good;
    for (auto& [pname, t] : corrupt) t.data[t.data.size() / 2] ^= 0x01;
    EXPECT_NO_THROW(row.make_reader(o, corrupt, MoeProj::kW13, host_param));
  }
  // FP8 block: unpack refuses a NaN scale, so does the builder.
  const TargetLayout& fp8 = layout_named("trtllm-fp8-block");
  const MoeShape s = moe_shape_for(blk, 1, 128, 128, true);
  LayoutOptions o;
  o.source_method = blk.method;
  TensorMap m = by_name(fp8.pack(o, test::random_moe_experts(rng, s, {})));
  m.at("w2_weight_scale_inv").as<float>()[0] = NAN;
  test::expect_error([&] { fp8.unpack(o, m); }, ErrorCode::kBadValue);
  test::expect_error([&] { fp8.make_reader(o, m, MoeProj::kW13, host_param); },
                     ErrorCode::kBadValue);
}

// ---- activation quantisation -----------------------------------------------------------------

ProjReader act_reader(ActQuant act, int64_t k) {
  ProjReader r;
  std::memset(&r, 0, sizeof r);
  r.act = act;
  r.k = k;
  return r;
}

std::vector<float> quantized(ActQuant act, const std::vector<float>& x) {
  std::vector<float> out(x.size());
  const ProjReader r = act_reader(act, static_cast<int64_t>(x.size()));
  reader::quantize_activation_row(r, x.data(), out.data());
  return out;
}

bool has_non_finite(const float* x, size_t n) {
  return std::any_of(x, x + n, [](float v) { return !std::isfinite(v); });
}

// Independent statements of each rule (the upstream formulas, with std:: math).
std::vector<float> int8_per_token_ref(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  if (has_non_finite(x.data(), x.size())) return std::vector<float>(x.size(), NAN);
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  amax = std::max(amax, 1e-10f);
  const float scale = amax / 127.0f, inv = 127.0f / amax;
  for (size_t i = 0; i < x.size(); ++i)  // std::round: half away from zero; int8 has no -0
    out[i] = static_cast<float>(static_cast<int>(std::round(x[i] * inv))) * scale;
  return out;
}

std::vector<float> fp8_group128_ref(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t g = 0; g < x.size(); g += 128) {
    const size_t len = std::min<size_t>(128, x.size() - g);
    if (has_non_finite(x.data() + g, len)) {
      std::fill(out.begin() + g, out.begin() + g + len, NAN);
      continue;
    }
    float amax = 1e-10f;
    for (size_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[g + i]));
    const float s = amax / 448.0f;
    for (size_t i = 0; i < len; ++i)
      out[g + i] =
          e4m3_to_float(float_to_e4m3_satfinite(std::clamp(x[g + i] / s, -448.0f, 448.0f))) * s;
  }
  return out;
}

// MXFP8: formats/mxfp8.cpp quantize_mxfp8 (the FlashInfer recipe), dequantised.
std::vector<float> mxfp8_ref(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t b = 0; b < x.size(); b += 32) {
    if (has_non_finite(x.data() + b, 32)) {
      std::fill(out.begin() + b, out.begin() + b + 32, NAN);
      continue;
    }
    const QuantTensor q = quantize_mxfp8(x.data() + b, 1, 1, 32, MxRecipe::kFlashInfer);
    const float s = e8m0_to_float(q.scales[0]);
    for (size_t i = 0; i < 32; ++i) out[b + i] = e4m3_to_float(q.codes[i]) * s;
  }
  return out;
}

void expect_same_rows(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(same_float(got[i], want[i]))
        << what << " [" << i << "]: " << got[i] << " vs " << want[i];
}

std::vector<std::vector<float>> edge_rows(Rng& rng, size_t k) {
  std::vector<std::vector<float>> rows;
  rows.push_back(std::vector<float>(k, 0.0f));  // zeros
  std::vector<float> r(k);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float scale : {1.0f, 3e38f, 1e-30f, 1e-40f, 448.0f, 127.0f}) {
    for (auto& v : r) v = u(rng) * scale;
    rows.push_back(r);
  }
  for (auto& v : r) v = u(rng);
  r[3] = -0.0f;
  r[7] = 1e-12f;
  rows.push_back(r);
  // Exact halfway points of the int8 grid: x * 127/amax = j + 0.5.
  for (size_t i = 0; i < k; ++i) r[i] = (static_cast<float>(i % 255) - 127.0f + 0.5f);
  r[0] = 127.5f;
  rows.push_back(r);
  std::vector<float> nan_row = rows[1];
  nan_row[5] = NAN;
  rows.push_back(nan_row);
  std::vector<float> inf_row = rows[1];
  inf_row[k - 1] = -INFINITY;
  rows.push_back(inf_row);
  for (int i = 0; i < 20; ++i) {
    for (auto& v : r) v = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
    rows.push_back(r);
  }
  return rows;
}

TEST(ActivationQuant, EachRuleEqualsItsIndependentStatement) {
  Rng rng(77);
  for (size_t k : {size_t{256}, size_t{384}}) {
    int row_no = 0;
    for (const auto& x : edge_rows(rng, k)) {
      const std::string what = "k=" + std::to_string(k) + " row " + std::to_string(row_no++);
      expect_same_rows(quantized(ActQuant::kInt8PerToken, x), int8_per_token_ref(x),
                       what + " int8");
      expect_same_rows(quantized(ActQuant::kFp8PerTokenGroup128, x), fp8_group128_ref(x),
                       what + " fp8 group 128");
      expect_same_rows(quantized(ActQuant::kMxfp8Block32, x), mxfp8_ref(x), what + " mxfp8");
      std::vector<float> bf(k), hf(k);
      for (size_t i = 0; i < k; ++i) {
        bf[i] = bf16_to_float(float_to_bf16(x[i]));
        hf[i] = f16_to_float(float_to_f16(x[i]));
      }
      expect_same_rows(quantized(ActQuant::kBf16, x), bf, what + " bf16");
      expect_same_rows(quantized(ActQuant::kFp16, x), hf, what + " fp16");
      expect_same_rows(quantized(ActQuant::kNone, x), x, what + " none");
    }
  }
}

// The GPU runtime quantises a row unit by unit in parallel (quantize_activation_span over
// activation_unit columns from multiples of it): the same values as the whole row for every rule,
// on the edge rows (NaN and Inf units) and on a row whose length no unit divides.
TEST(ActivationQuant, UnitByUnitEqualsTheRow) {
  Rng rng(78);
  for (size_t k : {size_t{256}, size_t{392}}) {
    int row_no = 0;
    for (const auto& x : edge_rows(rng, k)) {
      for (ActQuant act :
           {ActQuant::kNone, ActQuant::kBf16, ActQuant::kFp16, ActQuant::kInt8PerToken,
            ActQuant::kFp8PerTokenGroup128, ActQuant::kMxfp8Block32, ActQuant::kNvfp4Block16}) {
        const std::string what = "k=" + std::to_string(k) + " row " + std::to_string(row_no) +
                                 " act " + std::to_string(static_cast<int>(act));
        ProjReader r = act_reader(act, static_cast<int64_t>(k));
        r.act_scale = 0.75f;  // NVFP4's activation global scale
        std::vector<float> want(k), got(k, -3.0f);
        reader::quantize_activation_row(r, x.data(), want.data());
        const int64_t unit = reader::activation_unit(act, r.k);
        ASSERT_GE(unit, 1) << what;
        for (int64_t k0 = 0; k0 < r.k; k0 += unit)
          reader::quantize_activation_span(r, x.data() + k0, std::min(unit, r.k - k0),
                                           got.data() + k0);
        expect_same_rows(got, want, what);
      }
      ++row_no;
    }
  }
}

TEST(ActivationQuant, PoliciesOnEdgeRows) {
  const std::vector<float> zeros(256, 0.0f);
  for (ActQuant a :
       {ActQuant::kInt8PerToken, ActQuant::kFp8PerTokenGroup128, ActQuant::kMxfp8Block32})
    for (float v : quantized(a, zeros)) EXPECT_EQ(v, 0.0f);
  // A NaN poisons its unit only: the token row (int8), its 128-group, its 32-block.
  std::vector<float> x(256, 0.25f);
  x[40] = NAN;
  const std::vector<float> i8 = quantized(ActQuant::kInt8PerToken, x);
  EXPECT_TRUE(std::all_of(i8.begin(), i8.end(), [](float v) { return std::isnan(v); }));
  const std::vector<float> f8 = quantized(ActQuant::kFp8PerTokenGroup128, x);
  EXPECT_TRUE(std::isnan(f8[0]) && std::isnan(f8[127]) && f8[128] == 0.25f);
  const std::vector<float> mx = quantized(ActQuant::kMxfp8Block32, x);
  EXPECT_TRUE(std::isnan(mx[32]) && std::isnan(mx[63]) && mx[31] == 0.25f && mx[64] == 0.25f);
  // The quantisers are not the identity (tests that could not fail would pass here too).
  std::vector<float> y(256);
  for (size_t i = 0; i < y.size(); ++i) y[i] = 0.001f * static_cast<float>(i) + 0.0003f;
  for (ActQuant a :
       {ActQuant::kInt8PerToken, ActQuant::kFp8PerTokenGroup128, ActQuant::kMxfp8Block32}) {
    const std::vector<float> q = quantized(a, y);
    int64_t moved = 0;
    for (size_t i = 0; i < y.size(); ++i) moved += q[i] != y[i];
    EXPECT_GT(moved, 100);
  }
}

}  // namespace
}  // namespace moepack
