// One scale-overflow rule for every layout that stores scales in the serving dtype
// (convert_scale): a finite source scale that would become inf is refused naming the parameter,
// never written as inf.
#include <gtest/gtest.h>

#include <cstring>

#include "formats/codec.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

MoeExperts layer_with_scale(float scale) {
  QuantSpec spec;
  spec.bits = 4;
  spec.group_size = 128;
  spec.scale_dtype = DType::kF32;
  MoeExperts x;
  x.w13 = QuantTensor(spec, 1, 256, 256);
  x.w2 = QuantTensor(spec, 1, 256, 128);
  for (QuantTensor* q : {&x.w13, &x.w2}) {
    for (size_t i = 0; i < q->codes.size(); ++i) q->codes[i] = static_cast<uint8_t>(i % 16);
    for (size_t i = 0; i < q->scales.size() / 4; ++i)
      std::memcpy(q->scales.data() + 4 * i, &scale, 4);
  }
  return x;
}

TEST(ScaleOverflow, EveryHalfPrecisionLayoutRefusesAScaleThatBecomesInf) {
  int layouts = 0;
  for (const TargetLayout& t : target_layouts()) {
    if (std::find(t.schemes.begin(), t.schemes.end(), "wna16") == t.schemes.end()) continue;
    SCOPED_TRACE(t.name);
    LayoutOptions o =
        LayoutOptions::for_layer(QuantMethod::kGptq, DType::kF16, true, false, VllmTarget::kV0_33,
                                 "model.layers.0.mlp.experts.routed_experts.", 0, 1);
    const MoeExperts x = layer_with_scale(0.01f);
    ASSERT_TRUE(t.unsupported_reasons(o, moe_shape_of(x)).empty());
    // A layout that decides from the whole layer's codes (the same codes at every scale).
    if (t.decide_layer)
      o.layer_decisions = t.decide_layer(o, moe_shape_of(x), test::whole_layer(x, 1));
    EXPECT_NO_THROW(t.pack(o, layer_with_scale(60000.0f)));  // the largest fp16 is 65504
    try {
      t.pack(o, layer_with_scale(1.0e6f));
      ADD_FAILURE() << "a scale of 1e6 was written into F16 parameters";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadValue) << e.what();
      EXPECT_NE(e.message().find("overflows F16"), std::string::npos) << e.what();
      EXPECT_NE(e.tensor().find("model.layers.0.mlp.experts.routed_experts.w13_"),
                std::string::npos)
          << e.tensor();
    }
    ++layouts;
  }
  EXPECT_GE(layouts, 3);  // marlin, triton-wna16 and humming at least
}

TEST(ScaleOverflow, ConvertScaleRoundsToNearestEvenAndKeepsE8m0Codes) {
  const float v = 1.0f + 1.0f / 2048.0f;  // halfway between two fp16 values: ties to even (1.0)
  uint8_t f32[4], out[2];
  std::memcpy(f32, &v, 4);
  convert_scale(f32, DType::kF32, DType::kF16, out, "s");
  uint16_t h;
  std::memcpy(&h, out, 2);
  EXPECT_EQ(h, 0x3c00);
  const uint8_t code = 127;
  uint8_t back = 0;
  convert_scale(&code, DType::kU8, DType::kF8_E8M0, &back, "s");
  EXPECT_EQ(back, 127);
}

}  // namespace
}  // namespace moepack
