// Shared test helpers: golden fixture loading, byte comparison that reports where, random data.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "formats/codec.h"

namespace moepack::test {

std::string shared_dir();   // ../shared (MOEPACK_SHARED_DIR at configure time)
std::string source_dir();   // the repository root
std::string moepack_bin();  // build/bin/moepack

// Whether shared/golden/<folder> exists. A clone without ../shared has no fixtures: its golden
// tests skip (MOEPACK_SKIP_WITHOUT_GOLDEN); with the folder present every case runs and a missing
// file fails the test.
bool have_golden(const std::string& folder);
// "golden fixtures not found at <path>: configure with -DMOEPACK_SHARED_DIR=... to run them".
std::string golden_missing_message(const std::string& folder);
// Case names of a golden folder for test discovery: golden_cases(folder), or empty when its
// manifest is absent or unreadable (listing tests never throws; see the .cpp).
std::vector<std::string> golden_cases_if_present(const std::string& folder);

// A golden fixture tensor: raw bytes + manifest dtype string + shape.
struct Golden {
  std::string dtype;  // "int32", "uint8", "float32", "f16bits", "bf16bits", "f8_e4m3", "e8m0"
  Shape shape;
  std::vector<uint8_t> bytes;
  template <typename T>
  std::vector<T> as() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
  }
};
// Loads shared/golden/<folder>/<case>__<tensor>.bin via its manifest.json. Fails the test
// (ADD_FAILURE + throws) if missing.
Golden load_golden(const std::string& folder, const std::string& case_name,
                   const std::string& tensor);
std::vector<std::string> golden_cases(const std::string& folder);
// Manifest's extra fields for a folder (e.g. "gated" of mxfp8), as JSON text.
std::string golden_manifest_json(const std::string& folder);

// Byte-compare that reports the first and the worst differing `block`-byte block and the count,
// not just "not equal". Use: EXPECT_TRUE(bytes_equal(a, b, 4, "w13_qweight")).
::testing::AssertionResult bytes_equal(const void* actual, size_t actual_len, const void* expected,
                                       size_t expected_len, size_t block, const std::string& what);
template <typename A, typename B>
::testing::AssertionResult bytes_equal(const A& actual, const B& expected, size_t block,
                                       const std::string& what) {
  return bytes_equal(actual.data(), actual.size() * sizeof(actual[0]), expected.data(),
                     expected.size() * sizeof(expected[0]), block, what);
}

// A fresh temporary directory under the build's temp space, removed by the destructor.
struct TempDir {
  TempDir();
  ~TempDir();
  std::string path;
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// Runs a shell command; returns the exit code and fills stdout/stderr.
int run_command(const std::string& cmd, std::string* out = nullptr, std::string* err = nullptr);
// Runs build/bin/moepack with `args` (shell syntax); returns its exit code, fills stdout/stderr.
int moepack_cli(const std::string& args, std::string* out = nullptr, std::string* err = nullptr);
// `moepack ARGS --json`: expects exit code `expect_rc` (the failure names the args and shows
// stderr) and a JSON document on stdout (every result and error is one); returns it, discarded
// (is_discarded()) when stdout is not JSON. `err` receives stderr.
nlohmann::json moepack_json(const std::string& args, int expect_rc, std::string* err = nullptr);
// A JSON file's contents; a missing file or a parse error throws (the test fails naming it).
nlohmann::json read_json_file(const std::string& path);

// ---- Random canonical tensors and layers (the registry suite and its CUDA instantiation) ----

using Rng = std::mt19937_64;

// Which scale values random_quant_tensor draws.
enum class ScaleValues : uint8_t {
  kAnyPositiveFinite,  // every positive finite bit pattern of the dtype (codecs move bytes)
  kModerate,           // magnitudes in [2^-8, 2] (E8M0 codes 119..128): products stay finite
};

struct RandomTensorOptions {
  ScaleValues scales = ScaleValues::kModerate;
  int zero_lo = 0, zero_hi = -1;  // asymmetric zero points drawn from [lo, hi]; -1: 2^bits - 1
  bool act_order = false;         // a non-trivial g_idx per expert when there is > 1 group
  int64_t global_shards = 1;      // global scales per expert (spec.global_scale != kNone)
};

// The zero points a source codec holds for these params: 0..2^bits-1 for every codec (GPTQ v1
// stores the v2 word minus one per field, so a zero of 0 borrows from the next field).
std::pair<int, int> codec_zero_range(const QuantParams& p);

// An act-order g_idx over k rows: the trivial k / group_size shuffled (so every group holds
// exactly group_size rows, a last partial group its remainder), never the trivial order itself.
// Empty when there is one group (nothing to permute).
std::vector<int32_t> random_act_order_g_idx(Rng& rng, int64_t k, int64_t group_size);

// Random legal contents for `spec` [experts, n, k]: uint codes 0..2^bits-1, int8 any byte, e4m3
// bytes without the NaN encodings 0x7f / 0xff, e2m1 codes 0..15; positive finite scales of
// spec.scale_dtype (E8M0 codes never 0xff, e4m3 never 0 or NaN); positive finite float32 global
// scales (opts.global_shards per expert) when the spec has them; zeros per opts. Codes are never
// all zero.
QuantTensor random_quant_tensor(Rng& rng, const QuantSpec& spec, int64_t experts, int64_t n,
                                int64_t k, const RandomTensorOptions& opts);

// One MoE layer's experts matching `s`: each projection's act_order flag decides its g_idx (w13's
// one g_idx per expert is shared by the gate and up rows, which read the same K = H inputs); an
// act-order projection with one group gets the trivial g_idx, explicit.
MoeExperts random_moe_experts(Rng& rng, const MoeShape& s, RandomTensorOptions opts);

// Experts [first, end) of q alone (codes, scales, zeros and g_idx sliced along the experts).
QuantTensor slice_experts(const QuantTensor& q, int64_t first, int64_t end);
// Experts [first, end) of x: both projections and the expert biases.
MoeExperts slice_moe_experts(const MoeExperts& x, int64_t first, int64_t end);
// Random finite nonzero BF16 expert biases (|b| < 4) in x where `declared` has bias parameters
// (ParamRole::kW13Bias / kW2Bias: gpt-oss through marlin-mxfp4), none otherwise.
void add_declared_biases(Rng& rng, const std::vector<ParamSpec>& declared, MoeExperts* x);
// x as the whole layer a TargetLayout::decide_layer reads (LayerExperts): load(a, b) returns the
// slice [a, b) of x; `loads`, when given, counts the calls.
LayerExperts whole_layer(const MoeExperts& x, int64_t max_per_load, int* loads = nullptr);

// vLLM 0.33's NVFP4 Marlin reading of canonical NVFP4 experts (prepare_nvfp4_moe_layer_for_marlin,
// restated here apart from formats/marlin_float.cpp): each projection keeps one decode global scale
// per expert -- shard 0's (the gate's, for both halves of w13), 1.0f / G for an encode divisor --
// and every block scale that is not positive or falls below 2^-6 after the projection's rescale
// (2^floor(log2(448 / largest scale)) over all experts, bf16 only) reads as 0. What marlin-nvfp4's
// unpack must give back.
QuantTensor marlin_nvfp4_view(const QuantTensor& q, DType act);
// What a layout row's unpack gives back for x: x itself, except where vLLM changes values first
// (the row's vllm_loaded: per-tensor FP8's requantised w13) and for the float Marlin rows on a
// source with a global scale (marlin_nvfp4_view of each projection).
MoeExperts as_layout_reads(const TargetLayout& row, const LayoutOptions& o, const MoeExperts& x);
// Random experts made legal for a per-tensor FP8 source (compressed-tensors tensor, ModelOpt FP8):
// one scale per Linear, i.e. every row of each gate / up / down shard holds its first row's
// scale, as load_moe_experts gives them. Other methods: unchanged.
void make_per_tensor_legal(QuantMethod m, MoeExperts* x);

// Layer extents: E in {1, 2, 3}, H a multiple of 128 in [128, 512], I a multiple of 128 in
// [128, 512] or (one draw in four) an odd multiple of 64 (64, 192, 320), which layouts with
// halving or 128-row tiles must refuse or handle.
struct LayerDims {
  int64_t experts = 1, hidden = 128, inter = 128;
};
std::vector<LayerDims> random_layer_dims(Rng& rng, int count);

// ---- The reader contract (formats/layout/moe_reader.h) for one layout row -------------------

struct ReaderCheck {
  bool whole_expert = true;  // every element of one random expert, besides the samples
  int64_t samples = 3000;    // random elements over all experts
};

// For w13 and w2: the row's reader over the host `params` (row.make_reader) is of row.reader_kind
// with row.act_quant(o) and the sizes of `decoded`; act_col is a permutation of each expert's
// columns; weight(r, e, n, kk) == dequantize_expert(decoded.proj, e)[n * K + act_col(r, e, kk)]
// bit for bit; and reader_expert_matmul on a random expert equals sum_kk weight * x[act_col]
// summed in column order in float, bit for bit. `decoded` is what the kernel reads in canonical
// form: row.unpack(o, params), except where a layout reads like a vLLM kernel on purpose (the
// caller states that reading independently).
void expect_reader_matches(Rng& rng, const TargetLayout& row, const LayoutOptions& o,
                           const TensorMap& params, const MoeExperts& decoded,
                           const ReaderCheck& how = {});

// "gptq bits=4 group=128 sym act_order v1 dtype=F16": for SCOPED_TRACE.
std::string describe_params(const QuantParams& p);

// Runs fn, which must throw moepack::Error with `code` (a test failure otherwise); returns it.
Error expect_error(const std::function<void()>& fn, ErrorCode code);

// max |y - ref| / max |ref| over y[m, q.n] against ref = x[m, q.k] . W^T, W the canonical
// dequantisation of expert e, accumulated in double.
double matmul_error(const QuantTensor& q, int64_t e, const std::vector<float>& x, int64_t m,
                    const std::vector<float>& y);

// A layout's reader builder (TargetLayout::make_reader, e.g. marlin_make_reader).
using MakeReaderFn = reader::ProjReader (*)(const LayoutOptions&, const TensorMap&, MoeProj,
                                            const ParamLocator&);
// y[m, N] = x[m, K] . W_e^T as verify's CPU path computes it: the layout's reader over the host
// `params` (built by make_reader, which validates them), then reader_expert_matmul.
void layout_matmul(MakeReaderFn make_reader, const LayoutOptions& o, const TensorMap& params,
                   MoeProj proj, int64_t expert, const float* x, int64_t m, float* y);

}  // namespace moepack::test

// First statement of every test that reads shared/golden/<folder>.
#define MOEPACK_SKIP_WITHOUT_GOLDEN(folder)                            \
  do {                                                                 \
    if (!::moepack::test::have_golden(folder))                         \
      GTEST_SKIP() << ::moepack::test::golden_missing_message(folder); \
  } while (0)
