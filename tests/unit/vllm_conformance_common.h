// What the vLLM-conformance property suites (tests/unit/vllm_conformance*.cpp) share: the suite
// seed and the matmul spot check of one random expert through a layout's reader.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "formats/codec.h"
#include "tests/test_util.h"

namespace moepack {
namespace conformance {

// FNV-1a of the suite's name, mixed with $MOEPACK_SUITE_SEED (to explore other draws).
inline uint64_t suite_seed(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  if (const char* env = std::getenv("MOEPACK_SUITE_SEED")) h ^= std::strtoull(env, nullptr, 10);
  return h;
}

// Two random activation rows through the layout's reader for one random expert of `want` (the
// canonical projection the layout holds): the relative error against the canonical matmul must
// stay at float rounding.
inline void expect_reader_matmul_matches(test::Rng& rng, const TargetLayout& row,
                                         const LayoutOptions& o, const TensorMap& params,
                                         MoeProj proj, const QuantTensor& want, int64_t experts) {
  const int64_t m = 2, e = std::uniform_int_distribution<int64_t>(0, experts - 1)(rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> xa(static_cast<size_t>(m * want.k)), y(static_cast<size_t>(m * want.n));
  for (auto& v : xa) v = u(rng);
  test::layout_matmul(row.make_reader, o, params, proj, e, xa.data(), m, y.data());
  EXPECT_LE(test::matmul_error(want, e, xa, m, y), 1e-5) << "expert " << e;
}

// Checks `draws` random cases (draw(rng) returns a case with str(); check(c) runs it): false at
// the first draw that fails or throws, which says enough.
template <class Draw, class Check>
bool run_draws(test::Rng& rng, int draws, Draw draw, Check check) {
  for (int i = 0; i < draws; ++i) {
    const auto c = draw(rng);
    SCOPED_TRACE(c.str());
    try {
      check(c);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw " << e.what();
    }
    if (::testing::Test::HasFailure()) return false;
  }
  return true;
}

}  // namespace conformance
}  // namespace moepack
