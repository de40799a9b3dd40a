// GPU Marlin repack (kernels/src/marlin_repack.cu) against a scalar reference written here from
// the closed-form map (formats/layout/marlin_layout.h) and against the upstream-derived golden
// fixtures gptq_repack_int{4,8}[_actorder]. Exact equality. GPU tests skip without a device; the
// reference-vs-golden test runs wherever the fixtures are (so the reference itself is checked),
// and the golden tests skip without ../shared.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>

#include "core/error.h"
#include "formats/layout/marlin_layout.h"
#include "kernels/moepack_cuda.h"
#include "tests/test_util.h"

using namespace moepack;
using moepack::test::bytes_equal;
using moepack::test::load_golden;

namespace {

// Word w = tau*T + r of tile tau = kt*(N/64) + nt; field f holds Q'[k, n] = codes[n, perm[k]].
std::vector<uint32_t> reference_repack(const std::vector<uint8_t>& codes, int64_t n, int64_t k,
                                       int bits, const std::vector<int32_t>& perm) {
  const int pf = marlin::pack_factor(bits), T = marlin::words_per_tile(bits);
  const int64_t n_tiles = n / 64;
  std::vector<uint32_t> out(static_cast<size_t>((k / 16) * (n * 16 / pf)));
  for (size_t w = 0; w < out.size(); ++w) {
    const int64_t tau = static_cast<int64_t>(w) / T;
    const int r = static_cast<int>(static_cast<int64_t>(w) % T);
    uint32_t word = 0;
    for (int f = 0; f < pf; ++f) {
      int64_t kk = 0, nn = 0;
      marlin::word_field_coords(bits, false, tau / n_tiles, tau % n_tiles, r, f, &kk, &nn);
      const int64_t src = perm.empty() ? kk : perm[static_cast<size_t>(kk)];
      word |= static_cast<uint32_t>(codes[static_cast<size_t>(nn * k + src)]) << (bits * f);
    }
    out[w] = word;
  }
  return out;
}

// GPTQ qweight int32 [K/pf, N] -> canonical codes [N, K] (spec §1.1).
std::vector<uint8_t> gptq_to_codes(const std::vector<uint32_t>& qw, int64_t n, int64_t k,
                                   int bits) {
  const int pf = 32 / bits;
  std::vector<uint8_t> c(static_cast<size_t>(n * k));
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t nn = 0; nn < n; ++nn)
      c[static_cast<size_t>(nn * k + kk)] =
          static_cast<uint8_t>((qw[static_cast<size_t>((kk / pf) * n + nn)] >> (bits * (kk % pf))) &
                               ((1u << bits) - 1u));
  return c;
}

struct GoldenCase {
  std::vector<uint8_t> codes;
  std::vector<int32_t> perm;
  std::vector<uint32_t> expected;
  int64_t n, k;
  int bits;
};

GoldenCase load_case(const std::string& name, int bits) {
  GoldenCase g;
  g.bits = bits;
  const auto qw = load_golden("wna16", name, "qweight");
  g.k = qw.shape[0] * (32 / bits);
  g.n = qw.shape[1];
  g.codes = gptq_to_codes(qw.as<uint32_t>(), g.n, g.k, bits);
  g.perm = load_golden("wna16", name, "sort_indices").as<int32_t>();
  g.expected = load_golden("wna16", name, "marlin_qweight").as<uint32_t>();
  return g;
}

const char* kGoldenCases[] = {"gptq_repack_int4", "gptq_repack_int4_actorder", "gptq_repack_int8",
                              "gptq_repack_int8_actorder"};

int bits_of(const std::string& name) {
  return name.find("int8") != std::string::npos ? 8 : 4;
}

TEST(MarlinRepackReference, MatchesGolden) {
  MOEPACK_SKIP_WITHOUT_GOLDEN("wna16");
  for (const char* name : kGoldenCases) {
    SCOPED_TRACE(name);
    const GoldenCase g = load_case(name, bits_of(name));
    EXPECT_TRUE(bytes_equal(reference_repack(g.codes, g.n, g.k, g.bits, g.perm), g.expected, 16,
                            "reference marlin_qweight"));
  }
}

TEST(MarlinRepackCuda, MatchesGolden) {
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  MOEPACK_SKIP_WITHOUT_GOLDEN("wna16");
  for (const char* name : kGoldenCases) {
    SCOPED_TRACE(name);
    const GoldenCase g = load_case(name, bits_of(name));
    const auto got = cuda_marlin_repack(g.codes.data(), g.n, g.k, g.bits,
                                        g.perm.empty() ? nullptr : g.perm.data());
    EXPECT_TRUE(bytes_equal(got, g.expected, 16, "cuda marlin_qweight"));
  }
}

TEST(MarlinRepackCuda, MatchesReferenceOnRandomCodes) {
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  std::mt19937 rng(2024);
  const int64_t shapes[][2] = {{64, 16},    {64, 128},  {128, 48},  {192, 256},
                               {512, 1024}, {4096, 64}, {320, 4096}};
  int cases = 0;
  for (int bits : {4, 8})
    for (const auto& s : shapes)
      for (bool with_perm : {false, true}) {
        const int64_t n = s[0], k = s[1];
        std::ostringstream what;
        what << "bits=" << bits << " N=" << n << " K=" << k << (with_perm ? " perm" : "");
        SCOPED_TRACE(what.str());
        std::vector<uint8_t> codes(static_cast<size_t>(n * k));
        for (auto& c : codes) c = static_cast<uint8_t>(rng() & ((1u << bits) - 1u));
        codes[0] = 1;  // never all zero
        std::vector<int32_t> perm;
        if (with_perm) {
          perm.resize(static_cast<size_t>(k));
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), rng);
        }
        const auto expect = reference_repack(codes, n, k, bits, perm);
        const auto got =
            cuda_marlin_repack(codes.data(), n, k, bits, with_perm ? perm.data() : nullptr);
        EXPECT_TRUE(bytes_equal(got, expect, 16, what.str()));
        ++cases;
      }
  EXPECT_EQ(cases, 28);
}

TEST(MarlinRepackCuda, RejectsBadInputs) {
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  std::vector<uint8_t> codes(64 * 32, 1);
  const auto code_of = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::kInternal;
  };
  EXPECT_EQ(code_of([&] { cuda_marlin_repack(codes.data(), 64, 24, 4, nullptr); }),
            ErrorCode::kBadShape);
  EXPECT_EQ(code_of([&] { cuda_marlin_repack(codes.data(), 32, 32, 4, nullptr); }),
            ErrorCode::kBadShape);
  EXPECT_EQ(code_of([&] { cuda_marlin_repack(codes.data(), 64, 32, 3, nullptr); }),
            ErrorCode::kUnsupported);
  codes[5] = 16;
  EXPECT_EQ(code_of([&] { cuda_marlin_repack(codes.data(), 64, 32, 4, nullptr); }),
            ErrorCode::kBadValue);
  codes[5] = 1;
  std::vector<int32_t> perm(32, 0);  // not a permutation
  EXPECT_EQ(code_of([&] { cuda_marlin_repack(codes.data(), 64, 32, 4, perm.data()); }),
            ErrorCode::kBadValue);
}

}  // namespace
