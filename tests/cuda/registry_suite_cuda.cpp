// The registry suite (tests/unit/registry_suite.cpp) instantiated for the CUDA kernels: the same
// random legal layers (test::random_layer_dims, moe_shape_for, the layout row's
// unsupported_reasons, test::random_moe_experts), each expert's projection repacked on the GPU
// and compared byte for byte with the scalar path. Only the GPTQ -> Marlin repack has a kernel
// today (kernels/moepack_cuda.h); it serves every WNA16 codec the Marlin row takes. Skips without
// a device (or when built without CUDA).
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "formats/codec.h"
#include "formats/marlin.h"
#include "kernels/moepack_cuda.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::bytes_equal;
using test::describe_params;

TEST(RegistrySuiteCuda, MarlinRepackMatchesScalarOnRandomLegalLayers) {
  if (!cuda_device_info().available) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const TargetLayout* marlin = find_target_layout("marlin");
  ASSERT_NE(marlin, nullptr);
  test::Rng rng(20240611);
  int layers = 0, matrices = 0;
  for (const SourceCodec& codec : source_codecs()) {
    if (std::find(marlin->schemes.begin(), marlin->schemes.end(), std::string(codec.scheme)) ==
        marlin->schemes.end())
      continue;
    for (const QuantParams& params : codec.param_space()) {
      test::RandomTensorOptions ro;
      std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(params);
      for (const test::LayerDims& d : test::random_layer_dims(rng, 2)) {
        LayoutOptions o;
        o.source_method = params.method;
        o.act_dtype = DType::kF16;
        const MoeShape s = moe_shape_for(params, d.experts, d.hidden, d.inter, o.gated);
        if (!marlin->unsupported_reasons(o, s).empty()) continue;
        ++layers;
        const MoeExperts x = test::random_moe_experts(rng, s, ro);
        for (const QuantTensor* q : {&x.w13, &x.w2})
          for (int64_t e = 0; e < q->experts; ++e) {
            std::ostringstream what;
            what << codec.name << " {" << describe_params(params) << "} E=" << d.experts
                 << " H=" << d.hidden << " I=" << d.inter << (q == &x.w13 ? " w13" : " w2")
                 << " expert " << e << " N=" << q->n << " K=" << q->k;
            SCOPED_TRACE(what.str());
            const uint8_t* codes = q->codes.data() + e * q->n * q->k;
            // Marlin's act-order permutation: the stable argsort of the expert's g_idx.
            const std::vector<int32_t> perm =
                q->g_idx.empty() ? std::vector<int32_t>{}
                                 : stable_argsort(q->g_idx.data() + e * q->k, q->k);
            const int32_t* p = perm.empty() ? nullptr : perm.data();
            const std::vector<uint32_t> want = marlin_repack(codes, q->n, q->k, q->bits, p, false);
            const std::vector<uint32_t> got = cuda_marlin_repack(codes, q->n, q->k, q->bits, p);
            EXPECT_TRUE(bytes_equal(got, want, 16, what.str()));
            ++matrices;
          }
      }
    }
  }
  EXPECT_GE(layers, 8) << "too few layers the Marlin row supports";
  std::cout << "[ cuda marlin repack ] " << layers << " layers, " << matrices << " matrices\n";
}

}  // namespace
}  // namespace moepack
