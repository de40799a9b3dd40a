// The fused Marlin MoE kernel's fragment maps (formats/layout/marlin_fragment.h) against the
// layout's own closed form (marlin_layout.h): every field the kernel feeds to an mma B register
// holds the (k, n) the m16n8k16 fragment wants, and every scale it reads is the column's scale.
#include "formats/layout/marlin_fragment.h"

#include <gtest/gtest.h>

#include "formats/layout/marlin_layout.h"

using namespace moepack;

TEST(MarlinFragment, WordFieldsAreMmaBFragments) {
  int checked = 0;
  for (int64_t kt = 0; kt < 3; ++kt)
    for (int64_t nt = 0; nt < 3; ++nt)
      for (int t = 0; t < 32; ++t)
        for (int j = 0; j < 4; ++j)
          for (int half = 0; half < 2; ++half)
            for (int reg = 0; reg < 2; ++reg)
              for (int elem = 0; elem < 2; ++elem) {
                const int f = marlin::b_fragment_field(half, reg, elem);
                ASSERT_EQ(marlin::b_fragment_shift(half, reg) + 16 * elem, 4 * f);
                int64_t k = -1, n = -1;
                marlin::word_field_coords(4, false, kt, nt, 4 * t + j, f, &k, &n);
                const int g = t / 4, c = t % 4;
                EXPECT_EQ(k, 16 * kt + 2 * c + 8 * reg + elem)
                    << "kt " << kt << " t " << t << " j " << j << " half " << half;
                EXPECT_EQ(n, 64 * nt + 16 * j + 8 * half + g)
                    << "nt " << nt << " t " << t << " j " << j << " half " << half;
                ++checked;
              }
  EXPECT_EQ(checked, 9 * 32 * 4 * 8);
}

TEST(MarlinFragment, ScaleOffsetsInvertThePermutations) {
  for (bool grouped : {true, false}) {
    const int chunk = marlin::scale_chunk(grouped);
    for (int64_t nt = 0; nt < 4; ++nt)
      for (int s = 0; s < 8; ++s)
        for (int c = 0; c < 4; ++c)
          for (int plus : {0, 1}) {
            const int64_t col = 64 * nt + 8 * s + 2 * c + plus;
            const int64_t pos = 64 * nt + marlin::fragment_scale_offset(grouped, s, c) +
                                plus * marlin::fragment_scale_next(grouped);
            // out[pos] = in[chunk base + src(pos % chunk)] must be the column's scale.
            const int64_t src = (pos / chunk) * chunk +
                                marlin::scale_perm_src(grouped, static_cast<int>(pos % chunk));
            EXPECT_EQ(src, col) << (grouped ? "grouped" : "single") << " nt " << nt << " s " << s
                                << " c " << c << " +" << plus;
          }
  }
}
