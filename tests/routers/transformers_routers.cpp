// Every family's router and expert activation against transformers' own modeling code: the
// fixtures (tests/routers/generate.py, transformers version in fixtures/versions.json) hold
// random hidden states, the router's tensors and the top-k ids and weights transformers'
// router class computed from them; moepack reads the family's config.json with its row
// (model/routing.h) and routes the same inputs (verify/router.h, verify/moe_reference.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "formats/layout/activation.h"
#include "io/safetensors.h"
#include "model/routing.h"
#include "verify/moe_reference.h"
#include "verify/router.h"

namespace moepack {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kFixtures = std::string(MOEPACK_TEST_SOURCE_DIR) + "/tests/routers/fixtures";

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// The activation each family's modeling code applies in its experts.
const std::map<std::string, Activation> kActivation = {
    {"mixtral", Activation::kSilu},       {"qwen3_moe", Activation::kSilu},
    {"deepseek_v3", Activation::kSilu},   {"glm4_moe", Activation::kSilu},
    {"gpt_oss", Activation::kSwigluOai},  {"olmoe", Activation::kSilu},
    {"phimoe", Activation::kSilu},        {"ernie4_5_moe", Activation::kSilu},
    {"llama4_text", Activation::kSilu},   {"minimax_m2", Activation::kSilu},
    {"granitemoe", Activation::kSilu},    {"granitemoeshared", Activation::kSilu},
    {"glm4_moe_lite", Activation::kSilu}, {"mistral4", Activation::kSilu},
    {"deepseek_v32", Activation::kSilu},  {"gemma4_text", Activation::kGeluTanh},
};

struct Fixture {
  std::string name;
  json config;
  RouterConfig router;
  ref::RouterTensors tensors;
  std::vector<float> x;
  int64_t tokens = 0, hidden = 0;
  std::vector<int32_t> ids;    // [T, k] transformers' selection
  std::vector<float> weights;  // [T, k] its weights
};

Fixture load(const std::string& name) {
  Fixture f;
  f.name = name;
  const std::string dir = kFixtures + "/" + name;
  f.config = read_json(dir + "/config.json");
  f.router = router_config_from_hf(f.config, dir + "/config.json");
  const json names = read_json(dir + "/names.json");
  const SafetensorsFile st = SafetensorsFile::open(dir + "/router.safetensors");
  const TensorView x = st.view("x");
  f.tokens = x.shape[0];
  f.hidden = x.shape[1];
  f.x = to_floats(x);
  const TensorView ids = st.view("ids");
  f.ids.resize(static_cast<size_t>(ids.nbytes / 4));
  std::memcpy(f.ids.data(), ids.data, ids.nbytes);
  f.weights = to_floats(st.view("weights"));
  std::map<std::string, std::vector<float>*> role = {
      {"weight", &f.tensors.weight},
      {"bias", &f.tensors.bias},
      {"correction_bias", &f.tensors.correction_bias},
      {"per_expert_scale", &f.tensors.per_expert_scale},
      {"input_scale", &f.tensors.input_scale}};
  for (const auto& [r, tensor] : names.items()) *role.at(r) = to_floats(st.view(tensor));
  return f;
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(kFixtures))
    if (e.is_directory()) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class TransformersRouter : public ::testing::TestWithParam<std::string> {};

// The same experts with the same weights, per token (transformers' topk is not always sorted).
TEST_P(TransformersRouter, SameTopKIdsAndWeights) {
  const Fixture f = load(GetParam());
  const int k = f.router.top_k;
  ASSERT_EQ(f.ids.size(), static_cast<size_t>(f.tokens * k)) << f.name;
  const std::vector<float> in =
      ref::router_input(f.router, f.x.data(), f.tokens, f.hidden, f.tensors.input_scale);
  const std::vector<float> logits = ref::router_logits(
      in.data(), f.tokens, f.hidden, f.tensors.weight.data(), f.router.num_experts,
      f.tensors.bias.empty() ? nullptr : f.tensors.bias.data());
  const ref::Routing r =
      ref::route(logits, f.tensors.correction_bias, f.router, f.tensors.per_expert_scale);
  double worst = 0.0;
  for (int64_t t = 0; t < f.tokens; ++t) {
    std::vector<std::pair<int32_t, double>> want, got;
    for (int j = 0; j < k; ++j) {
      want.emplace_back(f.ids[static_cast<size_t>(t * k + j)],
                        f.weights[static_cast<size_t>(t * k + j)]);
      got.emplace_back(r.expert(t, j), r.weight(t, j));
    }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(got[static_cast<size_t>(j)].first, want[static_cast<size_t>(j)].first)
          << f.name << " token " << t << " slot " << j;
      worst = std::max(worst, std::fabs(got[static_cast<size_t>(j)].second -
                                        want[static_cast<size_t>(j)].second));
    }
  }
  // transformers computes in float32, moepack in double.
  EXPECT_LT(worst, 2e-6) << f.name;
  // Not a degenerate case: the weights differ between slots. (PhiMoE's default jitter 0.01 keeps
  // only the selected logit in each softmax, so every weight is 1 there: phimoe_wide, jitter
  // 0.5, is the fixture where the softmaxes take several logits.)
  const auto [lo, hi] = std::minmax_element(f.weights.begin(), f.weights.end());
  if (f.name != "phimoe") {
    EXPECT_LT(*lo, *hi) << f.name;
  }
}

// What the family's experts compute, by its model type.
TEST_P(TransformersRouter, ActivationByModelType) {
  const Fixture f = load(GetParam());
  std::string family = f.name == "phimoe_wide" ? "phimoe" : f.name;
  ASSERT_TRUE(kActivation.count(family)) << family;
  EXPECT_EQ(expert_activation_from_hf(f.config), kActivation.at(family)) << f.name;
}

// route_layer, as verify runs it: Llama-4's weight scales the expert input (combine weight 1);
// every other family routes x itself with the weights above.
TEST_P(TransformersRouter, LayerRoutingAsVerifyRunsIt) {
  const Fixture f = load(GetParam());
  const ref::LayerRouting lr =
      ref::route_layer(f.router, f.x.data(), f.tokens, f.hidden, f.tensors);
  ASSERT_EQ(lr.expert_input.size(), f.x.size());
  for (int64_t t = 0; t < f.tokens; ++t) {
    const double w = f.router.weights_on_input ? f.weights[static_cast<size_t>(t)] : 1.0;
    for (int64_t h = 0; h < f.hidden; ++h) {
      const size_t i = static_cast<size_t>(t * f.hidden + h);
      EXPECT_NEAR(lr.expert_input[i], f.x[i] * w, 1e-5) << f.name << " token " << t;
    }
    if (f.router.weights_on_input) {
      EXPECT_EQ(lr.routing.weight(t, 0), 1.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TransformersRouter, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// Every family of issue 30 has a fixture (and so a row proven against transformers).
TEST(TransformersRouters, EveryFamilyHasAFixture) {
  const std::vector<std::string> have = fixture_names();
  for (const char* t :
       {"olmoe", "phimoe", "ernie4_5_moe", "llama4_text", "minimax_m2", "granitemoe",
        "granitemoeshared", "glm4_moe_lite", "mistral4", "gemma4_text", "deepseek_v32", "gpt_oss",
        "mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe"})
    EXPECT_NE(std::find(have.begin(), have.end(), t), have.end()) << t;
}

// gpt-oss' clamped SwiGLU and Gemma-4's GELU-tanh GLU (formats/layout/activation.h, the CPU and
// CUDA paths' one formula) against transformers' GptOssExperts._apply_gate and ACT2FN.
TEST(TransformersActivations, SameValues) {
  const SafetensorsFile st = SafetensorsFile::open(kFixtures + "/activations.safetensors");
  const std::vector<float> gate = to_floats(st.view("gate")), up = to_floats(st.view("up"));
  int clamped = 0;
  for (const auto& [name, act] : std::vector<std::pair<std::string, int>>{
           {"swigluoai", kActSwigluOai}, {"gelu_tanh", kActGeluTanh}, {"silu", kActSilu}}) {
    const std::vector<float> want = to_floats(st.view(name));
    ASSERT_EQ(want.size(), gate.size());
    for (size_t i = 0; i < gate.size(); ++i) {
      const double got_d = expert_glu<double>(act, gate[i], up[i]);
      const float got_f = expert_glu<float>(act, gate[i], up[i]);
      const double tol = 1e-5 * (1.0 + std::fabs(want[i]));
      ASSERT_NEAR(got_d, want[i], tol) << name << " gate " << gate[i] << " up " << up[i];
      ASSERT_NEAR(got_f, want[i], tol) << name << " gate " << gate[i] << " up " << up[i];
      if (act == kActSwigluOai && (gate[i] > 7.f || std::fabs(up[i]) > 7.f)) ++clamped;
    }
  }
  EXPECT_GT(clamped, 100);  // the clamps were exercised
  const json v = read_json(kFixtures + "/versions.json");
  EXPECT_EQ(v["swiglu"]["alpha"].get<double>(), kSwigluOaiAlpha);
  EXPECT_EQ(v["swiglu"]["limit"].get<double>(), kSwigluOaiLimit);
}

}  // namespace
}  // namespace moepack
