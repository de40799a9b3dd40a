// `convert --quantize mxfp8` on a bf16 synth checkpoint against an independent MXFP8
// quantisation of the same weights, written here from spec/mxfp8_trtllm.md §6 alone: E8M0 code
// by searching powers of two, e4m3 by nearest-of-256 with ties to the even code.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/half.h"
#include "formats/trtllm_mxfp8.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

float decode_e4m3(uint8_t b) {  // independent of formats/fp8.h
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return static_cast<float>((b & 0x80) ? -mag : mag);
}

uint8_t encode_e4m3_search(float x) {
  if (x >= 448.0f) return 0x7e;
  if (x <= -448.0f) return 0xfe;
  uint8_t best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const float v = decode_e4m3(static_cast<uint8_t>(c));
    if (std::isnan(v) || (std::signbit(v) != std::signbit(x))) continue;
    const double err = std::fabs(static_cast<double>(v) - x);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best_err = err;
      best = static_cast<uint8_t>(c);
    }
  }
  return best;
}

void quantize_block(const float* x, uint8_t* codes, uint8_t* scale) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax / 448.0f;
  int c = 0;
  while (c < 254 && std::ldexp(1.0, c - 127) < static_cast<double>(s)) ++c;
  *scale = static_cast<uint8_t>(c);
  for (int i = 0; i < 32; ++i)
    codes[i] = c == 0 ? (std::signbit(x[i]) ? 0x80 : 0x00)
                      : encode_e4m3_search(
                            static_cast<float>(std::ldexp(static_cast<double>(x[i]), 127 - c)));
}

TEST(QuantizeMxfp8, ConvertMatchesAnIndependentQuantisation) {
  test::TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(
      test::run_command(
          test::moepack_bin() + " synth " + src +
          " --format bf16 --family qwen3 --layers 2 --experts 2 --hidden 256 --inter 128 --seed 3"),
      0);
  ASSERT_EQ(test::run_command(test::moepack_bin() + " convert " + src + " " + dst +
                              " --quantize mxfp8 --target-arch sm100"),
            0);
  const SafetensorsFile in = SafetensorsFile::open(src + "/model.safetensors");
  const SafetensorsFile out = SafetensorsFile::open(dst + "/model.safetensors");
  const std::string S = "model.layers.1.mlp.experts.";  // source experts module
  const std::string P = S + "routed_experts.";          // parameters for --vllm-target 0.33
  LayoutOptions opts;
  opts.prefix = P;
  opts.source_method = QuantMethod::kModeloptMxfp8;
  TensorMap params;
  for (const char* n : {"w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"})
    params.emplace(P + n, Tensor::from_view(out.view(P + n)));
  const MoeExperts got = unpack_trtllm_mxfp8_moe(opts, params);
  const int64_t H = 256, I = 128;
  int64_t blocks = 0, nonzero_codes = 0;
  for (int64_t e = 0; e < 2; ++e)
    for (int p = 0; p < 3; ++p) {
      const char* proj = p == 0 ? "gate_proj" : p == 1 ? "up_proj" : "down_proj";
      const TensorView v = in.view(S + std::to_string(e) + "." + proj + ".weight");
      const int64_t n = v.shape[0], k = v.shape[1];
      const QuantTensor& q = p == 2 ? got.w2 : got.w13;
      const int64_t row0 = p == 1 ? I : 0, rows = p == 2 ? H : 2 * I;
      std::vector<float> x(static_cast<size_t>(k));
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < k; ++i) {
          uint16_t h;
          std::memcpy(&h, v.data + 2 * (r * k + i), 2);
          x[static_cast<size_t>(i)] = bf16_to_float(h);
        }
        for (int64_t b = 0; b < k / 32; ++b) {
          uint8_t codes[32], scale;
          quantize_block(x.data() + 32 * b, codes, &scale);
          const int64_t row = e * rows + row0 + r;
          ASSERT_EQ(q.scales[static_cast<size_t>(row * (k / 32) + b)], scale)
              << proj << " e" << e << " r" << r;
          for (int i = 0; i < 32; ++i) {
            ASSERT_EQ(q.codes[static_cast<size_t>(row * k + 32 * b + i)], codes[i])
                << proj << " e" << e << " r" << r << " k" << 32 * b + i;
            nonzero_codes += codes[i] != 0;
          }
          ++blocks;
        }
      }
    }
  EXPECT_EQ(blocks, 2 * (2 * I * H + H * I) / 32);
  EXPECT_GT(nonzero_codes, blocks * 16);  // real data, not zeros
}

}  // namespace
}  // namespace moepack
