#include "tests/test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "core/half.h"
#include "formats/fp8.h"
#include "formats/moe_reader.h"

namespace moepack::test {
namespace fs = std::filesystem;

std::string shared_dir() {
  if (const char* env = std::getenv("MOEPACK_SHARED_DIR")) return env;
  return MOEPACK_TEST_SHARED_DIR;
}
std::string source_dir() {
  return MOEPACK_TEST_SOURCE_DIR;
}
std::string moepack_bin() {
  return MOEPACK_TEST_BIN;
}

bool have_golden(const std::string& folder) {
  std::error_code ec;
  return fs::is_directory(shared_dir() + "/golden/" + folder, ec);
}

std::string golden_missing_message(const std::string& folder) {
  return "golden fixtures not found at " + shared_dir() + "/golden/" + folder +
         ": configure with -DMOEPACK_SHARED_DIR=/path/to/shared (or set MOEPACK_SHARED_DIR in "
         "the environment) to run them";
}

std::vector<std::string> golden_cases_if_present(const std::string& folder) {
  // Runs while tests are listed, outside any test: never throw here. A present but unreadable
  // manifest yields no cases, and the suite's manifest test (which reads it inside a test) fails.
  std::error_code ec;
  if (!fs::is_regular_file(shared_dir() + "/golden/" + folder + "/manifest.json", ec)) return {};
  try {
    return golden_cases(folder);
  } catch (const std::exception&) {
    return {};
  }
}

static nlohmann::json read_manifest(const std::string& folder) {
  const std::string path = shared_dir() + "/golden/" + folder + "/manifest.json";
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "golden manifest missing: " << path;
    throw std::runtime_error("golden manifest missing: " + path);
  }
  return nlohmann::json::parse(in);
}

Golden load_golden(const std::string& folder, const std::string& case_name,
                   const std::string& tensor) {
  const auto m = read_manifest(folder);
  if (!m["cases"].contains(case_name) || !m["cases"][case_name].contains(tensor)) {
    ADD_FAILURE() << "golden " << folder << "/" << case_name << "/" << tensor << " not in manifest";
    throw std::runtime_error("golden entry missing");
  }
  const auto& e = m["cases"][case_name][tensor];
  Golden g;
  g.dtype = e["dtype"].get<std::string>();
  for (const auto& d : e["shape"]) g.shape.push_back(d.get<int64_t>());
  const std::string path = shared_dir() + "/golden/" + folder + "/" + e["file"].get<std::string>();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "golden file missing: " << path;
    throw std::runtime_error("golden file missing");
  }
  g.bytes.assign(std::istreambuf_iterator<char>(in), {});
  return g;
}

std::vector<std::string> golden_cases(const std::string& folder) {
  std::vector<std::string> out;
  const nlohmann::json manifest = read_manifest(folder);  // keep alive while iterating
  for (auto& [k, v] : manifest["cases"].items()) out.push_back(k);
  return out;
}

std::string golden_manifest_json(const std::string& folder) {
  return read_manifest(folder).dump();
}

::testing::AssertionResult bytes_equal(const void* actual, size_t actual_len, const void* expected,
                                       size_t expected_len, size_t block, const std::string& what) {
  if (actual_len != expected_len)
    return ::testing::AssertionFailure()
           << what << ": size " << actual_len << " bytes, expected " << expected_len;
  const auto* a = static_cast<const uint8_t*>(actual);
  const auto* b = static_cast<const uint8_t*>(expected);
  if (block == 0) block = 1;
  size_t diff_blocks = 0, first = SIZE_MAX, worst = SIZE_MAX, worst_bytes = 0;
  for (size_t off = 0; off < actual_len; off += block) {
    size_t nd = 0;
    for (size_t i = off; i < std::min(actual_len, off + block); ++i) nd += a[i] != b[i];
    if (nd) {
      ++diff_blocks;
      if (first == SIZE_MAX) first = off / block;
      if (nd > worst_bytes) worst_bytes = nd, worst = off / block;
    }
  }
  if (!diff_blocks) return ::testing::AssertionSuccess();
  auto hex = [&](const uint8_t* p, size_t idx) {
    std::ostringstream s;
    s << std::hex;
    for (size_t i = idx * block; i < std::min(actual_len, (idx + 1) * block); ++i)
      s << (i == idx * block ? "" : " ") << static_cast<int>(p[i]);
    return s.str();
  };
  return ::testing::AssertionFailure()
         << what << ": " << diff_blocks << " of " << (actual_len + block - 1) / block << " "
         << block << "-byte blocks differ; first at block " << first << " (got " << hex(a, first)
         << ", want " << hex(b, first) << "); worst at block " << worst << " (got " << hex(a, worst)
         << ", want " << hex(b, worst) << ")";
}

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "moepack-test-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  path = buf.data();
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

int run_command(const std::string& cmd, std::string* out, std::string* err) {
  TempDir tmp;
  const std::string o = tmp / "out", e = tmp / "err";
  const int rc = std::system((cmd + " >" + o + " 2>" + e).c_str());
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  if (out) *out = slurp(o);
  if (err) *err = slurp(e);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

int moepack_cli(const std::string& args, std::string* out, std::string* err) {
  return run_command(moepack_bin() + " " + args, out, err);
}

nlohmann::json moepack_json(const std::string& args, int expect_rc, std::string* err) {
  std::string out, e;
  EXPECT_EQ(moepack_cli(args + " --json", &out, &e), expect_rc) << args << "\n" << e;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << args << ": stdout is not JSON:\n" << out;
  if (err) *err = e;
  return j;
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

// ---- Random canonical tensors and layers --------------------------------------------------------

std::pair<int, int> codec_zero_range(const QuantParams& p) {
  return {0, (1 << p.bits) - 1};
}

std::vector<int32_t> random_act_order_g_idx(Rng& rng, int64_t k, int64_t group_size) {
  if (group_size <= 0 || k <= group_size) return {};
  std::vector<int32_t> g(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) g[static_cast<size_t>(i)] = static_cast<int32_t>(i / group_size);
  const std::vector<int32_t> trivial = g;
  while (g == trivial) std::shuffle(g.begin(), g.end(), rng);
  return g;
}

namespace {

// One random positive finite scale of dtype d, written at p.
void random_scale(Rng& rng, DType d, ScaleValues which, uint8_t* p) {
  if (which == ScaleValues::kAnyPositiveFinite) {
    // Sign bit clear, exponent below all-ones, never +0: the largest finite pattern is the bound.
    switch (d) {
      case DType::kF16:
      case DType::kBF16: {
        const uint16_t top = d == DType::kF16 ? 0x7BFF : 0x7F7F;
        const uint16_t h = static_cast<uint16_t>(std::uniform_int_distribution<int>(1, top)(rng));
        std::memcpy(p, &h, 2);
        return;
      }
      case DType::kF32: {
        const uint32_t u = std::uniform_int_distribution<uint32_t>(1, 0x7F7FFFFFu)(rng);
        std::memcpy(p, &u, 4);
        return;
      }
      case DType::kU8:
      case DType::kF8_E8M0:
        *p = static_cast<uint8_t>(std::uniform_int_distribution<int>(0, 254)(rng));
        return;
      case DType::kF8_E4M3:  // 0x01 (2^-9) .. 0x7e (448): sign clear, never +0 or NaN
        *p = static_cast<uint8_t>(std::uniform_int_distribution<int>(1, 0x7e)(rng));
        return;
      default:
        break;
    }
  } else {
    const float v = std::exp2(std::uniform_real_distribution<float>(-8.0f, 1.0f)(rng));
    switch (d) {
      case DType::kF16:
      case DType::kBF16: {
        const uint16_t h = d == DType::kF16 ? float_to_f16(v) : float_to_bf16(v);
        std::memcpy(p, &h, 2);
        return;
      }
      case DType::kF32:
        std::memcpy(p, &v, 4);
        return;
      case DType::kU8:
      case DType::kF8_E8M0:
        *p = static_cast<uint8_t>(std::uniform_int_distribution<int>(119, 128)(rng));
        return;
      case DType::kF8_E4M3:
        *p = float_to_e4m3_satfinite(v);
        return;
      default:
        break;
    }
  }
  throw std::runtime_error(std::string("random_scale: scale dtype ") + dtype_name(d));
}

}  // namespace

QuantTensor random_quant_tensor(Rng& rng, const QuantSpec& spec, int64_t experts, int64_t n,
                                int64_t k, const RandomTensorOptions& opts) {
  QuantTensor q(spec, experts, n, k);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& c : q.codes) {
    switch (q.kind) {
      case CodeKind::kUint:
        c = static_cast<uint8_t>(byte(rng) & ((1 << q.bits) - 1));
        break;
      case CodeKind::kInt:
        c = static_cast<uint8_t>(byte(rng));
        break;
      case CodeKind::kFp8E4M3:
        do c = static_cast<uint8_t>(byte(rng));
        while ((c & 0x7f) == 0x7f);  // 0x7f / 0xff are e4m3fn NaN
        break;
      case CodeKind::kFp4E2M1:
        c = static_cast<uint8_t>(byte(rng) & 15);
        break;
    }
  }
  if (std::all_of(q.codes.begin(), q.codes.end(), [](uint8_t c) { return c == 0; }))
    q.codes[0] = 1;  // 1 is legal for every kind
  const int eb = q.scale_bytes();
  for (size_t i = 0; i < q.scales.size(); i += static_cast<size_t>(eb))
    random_scale(rng, q.scale_dtype, opts.scales, q.scales.data() + i);
  if (q.global_scale != GlobalScale::kNone) {
    q.global_shards = opts.global_shards;
    q.global_scales.assign(static_cast<size_t>(experts * q.global_shards), 0.0f);
    for (float& g : q.global_scales) {
      uint8_t b[4];
      random_scale(rng, DType::kF32, opts.scales, b);
      std::memcpy(&g, b, 4);
    }
  }
  if (q.input_global_scale != GlobalScale::kNone) {  // W4A4's activation scales, like the globals
    q.input_scales.assign(static_cast<size_t>(experts * q.global_shards), 0.0f);
    for (float& a : q.input_scales) {
      uint8_t b[4];
      random_scale(rng, DType::kF32, opts.scales, b);
      std::memcpy(&a, b, 4);
    }
  }
  if (!q.symmetric) {
    const int hi = opts.zero_hi < 0 ? (1 << q.bits) - 1 : opts.zero_hi;
    std::uniform_int_distribution<int> zero(opts.zero_lo, hi);
    for (auto& z : q.zeros) z = static_cast<uint8_t>(zero(rng));
  }
  if (opts.act_order && q.kind == CodeKind::kUint) {
    for (int64_t e = 0; e < experts; ++e) {
      const std::vector<int32_t> g = random_act_order_g_idx(rng, k, q.group_size);
      if (g.empty()) break;
      q.g_idx.insert(q.g_idx.end(), g.begin(), g.end());
    }
  }
  q.check_consistent("random_quant_tensor");
  return q;
}

QuantTensor slice_experts(const QuantTensor& q, int64_t first, int64_t end) {
  QuantTensor s = q;
  s.experts = end - first;
  const auto cut = [&](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    if (v.empty()) return V{};
    const size_t per = v.size() / static_cast<size_t>(q.experts);
    return V(v.begin() + static_cast<std::ptrdiff_t>(first * per),
             v.begin() + static_cast<std::ptrdiff_t>(end * per));
  };
  s.codes = cut(q.codes);
  s.scales = cut(q.scales);
  s.zeros = cut(q.zeros);
  s.g_idx = cut(q.g_idx);
  s.global_scales = cut(q.global_scales);
  s.input_scales = cut(q.input_scales);
  s.check_consistent("slice");
  return s;
}

LayerExperts whole_layer(const MoeExperts& x, int64_t max_per_load, int* loads) {
  LayerExperts l;
  l.experts = x.w13.experts;
  l.max_per_load = max_per_load;
  l.load = [&x, max_per_load, loads](int64_t a, int64_t b) {
    EXPECT_TRUE(0 <= a && a < b && b <= x.w13.experts && b - a <= max_per_load)
        << "load(" << a << ", " << b << ")";
    if (loads) ++*loads;
    return slice_moe_experts(x, a, b);
  };
  return l;
}

QuantTensor marlin_nvfp4_view(const QuantTensor& q, DType act) {
  QuantTensor v = q;
  double largest = 0.0;
  for (uint8_t b : q.scales) largest = std::max(largest, static_cast<double>(e4m3_to_float(b)));
  const double sf = act == DType::kBF16 && largest > 0.0 && largest < 448.0
                        ? std::exp2(std::floor(std::log2(448.0 / largest)))
                        : 1.0;
  for (uint8_t& b : v.scales) {
    const double s = e4m3_to_float(b);
    if (!(s > 0.0) || s * sf < std::ldexp(1.0, -6)) b = 0;
  }
  v.global_scale = GlobalScale::kDecodeMultiplier;
  v.global_shards = 1;
  v.global_scales.assign(static_cast<size_t>(q.experts), 0.0f);
  for (int64_t e = 0; e < q.experts; ++e) {
    const float g = q.global_scales[static_cast<size_t>(e * q.global_shards)];
    v.global_scales[static_cast<size_t>(e)] =
        q.global_scale == GlobalScale::kEncodeDivisor ? 1.0f / g : g;
  }
  return v;
}

MoeExperts as_layout_reads(const TargetLayout& row, const LayoutOptions& o,
                           const MoeExperts& given) {
  // What vLLM's method makes of the experts first (per-tensor FP8: w13 requantised).
  MoeExperts x = row.vllm_loaded ? row.vllm_loaded(o, given) : given;
  // A layout without parameters for the activation scales (16-bit activations) keeps none.
  bool keeps_input_scales = false;
  for (const ParamSpec& p : row.param_specs(o, moe_shape_of(x)))
    keeps_input_scales = keeps_input_scales || p.role == ParamRole::kW13InputScale;
  if (!keeps_input_scales)
    for (QuantTensor* q : {&x.w13, &x.w2}) {
      q->input_global_scale = GlobalScale::kNone;
      q->input_scales.clear();
    }
  if (row.reader_kind != reader::Kind::kMarlinFloat || x.w13.global_scale == GlobalScale::kNone)
    return x;
  return {marlin_nvfp4_view(x.w13, o.act_dtype), marlin_nvfp4_view(x.w2, o.act_dtype)};
}

MoeExperts slice_moe_experts(const MoeExperts& x, int64_t first, int64_t end) {
  MoeExperts s;
  s.w13 = slice_experts(x.w13, first, end);
  s.w2 = slice_experts(x.w2, first, end);
  s.bias_dtype = x.bias_dtype;
  const auto cut = [&](const std::vector<uint8_t>& v) {
    if (v.empty()) return std::vector<uint8_t>{};
    const size_t per = v.size() / static_cast<size_t>(x.w13.experts);
    return std::vector<uint8_t>(v.begin() + static_cast<std::ptrdiff_t>(first * per),
                                v.begin() + static_cast<std::ptrdiff_t>(end * per));
  };
  s.w13_bias = cut(x.w13_bias);
  s.w2_bias = cut(x.w2_bias);
  return s;
}

void add_declared_biases(Rng& rng, const std::vector<ParamSpec>& declared, MoeExperts* x) {
  bool biased = false;
  for (const ParamSpec& p : declared)
    biased = biased || p.role == ParamRole::kW13Bias || p.role == ParamRole::kW2Bias;
  if (!biased) return;
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  x->bias_dtype = DType::kBF16;
  for (auto [v, count] : {std::make_pair(&x->w13_bias, x->w13.experts * x->w13.n),
                          std::make_pair(&x->w2_bias, x->w2.experts * x->w2.n)}) {
    v->resize(static_cast<size_t>(count * 2));
    for (int64_t i = 0; i < count; ++i) {
      float b = u(rng);
      if (b == 0.0f) b = 1.0f;
      const uint16_t h = float_to_bf16(b);
      std::memcpy(v->data() + i * 2, &h, 2);
    }
  }
}

void make_per_tensor_legal(QuantMethod m, MoeExperts* x) {
  if (m != QuantMethod::kCtFp8Tensor && m != QuantMethod::kModeloptFp8) return;
  const int64_t shards13 = x->w13.n == 2 * x->w2.k ? 2 : 1;
  for (auto [q, rows] : {std::make_pair(&x->w13, x->w13.n / shards13), {&x->w2, x->w2.n}}) {
    const int eb = q->scale_bytes();
    for (int64_t e = 0; e < q->experts; ++e)
      for (int64_t r = 0; r < q->n; ++r)
        std::copy_n(q->scales.begin() + (e * q->n + r / rows * rows) * eb, eb,
                    q->scales.begin() + (e * q->n + r) * eb);
  }
}

MoeExperts random_moe_experts(Rng& rng, const MoeShape& s, RandomTensorOptions opts) {
  MoeExperts x;
  opts.act_order = s.w13.act_order;
  // A gated w13 keeps the gate's and the up's global scales (load_moe_experts stacks them).
  opts.global_shards = s.w13.n == 2 * s.w2.k ? 2 : 1;
  x.w13 = random_quant_tensor(rng, s.w13.quant, s.experts, s.w13.n, s.w13.k, opts);
  opts.act_order = s.w2.act_order;
  opts.global_shards = 1;
  x.w2 = random_quant_tensor(rng, s.w2.quant, s.experts, s.w2.n, s.w2.k, opts);
  // Act-order is the layer's: a projection whose K holds one group still carries g_idx (the
  // trivial one, made explicit as the loader makes it).
  for (auto [q, p] : {std::make_pair(&x.w13, &s.w13), std::make_pair(&x.w2, &s.w2)})
    if (p->act_order && q->g_idx.empty() && q->group_size > 0) {
      q->g_idx.resize(static_cast<size_t>(q->experts * q->k));
      for (int64_t e = 0; e < q->experts; ++e)
        for (int64_t k = 0; k < q->k; ++k)
          q->g_idx[static_cast<size_t>(e * q->k + k)] = static_cast<int32_t>(k / q->group_size);
    }
  return x;
}

std::vector<LayerDims> random_layer_dims(Rng& rng, int count) {
  std::vector<LayerDims> out;
  std::uniform_int_distribution<int64_t> experts(1, 3), blocks(1, 4), odd(0, 2);
  std::bernoulli_distribution odd_inter(0.25);
  for (int i = 0; i < count; ++i) {
    LayerDims d;
    d.experts = experts(rng);
    d.hidden = 128 * blocks(rng);
    d.inter = odd_inter(rng) ? 64 * (2 * odd(rng) + 1) : 128 * blocks(rng);
    out.push_back(d);
  }
  return out;
}

std::string describe_params(const QuantParams& p) {
  std::ostringstream s;
  s << quant_method_name(p.method) << " bits=" << p.bits << " group=" << p.group_size
    << (p.symmetric ? " sym" : " asym") << (p.act_order ? " act_order" : "");
  if (p.method == QuantMethod::kGptq) s << (p.gptq_format == GptqFormat::kV1 ? " v1" : " v2");
  s << " dtype=" << dtype_name(p.dtype);
  return s.str();
}

Error expect_error(const std::function<void()>& fn, ErrorCode code) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << error_code_name(e.code()) << ": " << e.what();
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected moepack::Error " << error_code_name(code) << ", got " << e.what();
    return Error(ErrorCode::kInternal, "wrong exception type");
  }
  ADD_FAILURE() << "expected moepack::Error " << error_code_name(code) << ", nothing was thrown";
  return Error(ErrorCode::kInternal, "no exception");
}

double matmul_error(const QuantTensor& q, int64_t e, const std::vector<float>& x, int64_t m,
                    const std::vector<float>& y) {
  const std::vector<float> w = dequantize_expert(q, e);
  double num = 0, den = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t n = 0; n < q.n; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < q.k; ++k)
        acc += static_cast<double>(x[static_cast<size_t>(r * q.k + k)]) *
               w[static_cast<size_t>(n * q.k + k)];
      num = std::max(num, std::abs(acc - y[static_cast<size_t>(r * q.n + n)]));
      den = std::max(den, std::abs(acc));
    }
  return den == 0 ? num : num / den;
}

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Bit equality, any NaN equal to any NaN.
bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return float_bits(a) == float_bits(b);
}

void expect_proj_reader_matches(Rng& rng, const reader::ProjReader& r, const QuantTensor& q,
                                const ReaderCheck& how) {
  ASSERT_EQ(r.experts, q.experts);
  ASSERT_EQ(r.n, q.n);
  ASSERT_EQ(r.k, q.k);
  const int64_t E = q.experts, N = q.n, K = q.k;
  // act_col is a permutation of the columns (identity but under act-order).
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int> hit(static_cast<size_t>(K), 0);
    for (int64_t kk = 0; kk < K; ++kk) {
      const int64_t c = reader::act_col(r, e, kk);
      ASSERT_TRUE(c >= 0 && c < K) << "act_col " << c;
      ++hit[static_cast<size_t>(c)];
    }
    ASSERT_TRUE(std::all_of(hit.begin(), hit.end(), [](int h) { return h == 1; }));
  }
  std::vector<std::vector<float>> d;
  for (int64_t e = 0; e < E; ++e) d.push_back(dequantize_expert(q, e));
  const auto check = [&](int64_t e, int64_t n, int64_t kk) {
    const float got = reader::weight(r, e, n, kk);
    const float want =
        d[static_cast<size_t>(e)][static_cast<size_t>(n * K + reader::act_col(r, e, kk))];
    return same_float(got, want);
  };
  const int64_t whole = std::uniform_int_distribution<int64_t>(0, E - 1)(rng);
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = 0; how.whole_expert && n < N; ++n) {
    reader::weight_row(r, whole, n, row.data());  // a kind's row decoder is its weight()
    for (int64_t kk = 0; kk < K; ++kk) {
      ASSERT_TRUE(check(whole, n, kk)) << "e=" << whole << " n=" << n << " kk=" << kk;
      ASSERT_TRUE(same_float(row[static_cast<size_t>(kk)], reader::weight(r, whole, n, kk)))
          << "weight_row e=" << whole << " n=" << n << " kk=" << kk;
    }
    // And its strided decoder (the GPU runtime's: columns kStrideCols apart, up to 8 at once),
    // from every column, the last runs short at the row's end.
    for (int64_t k0 = 0; k0 < K; ++k0) {
      float got[8];
      const int count = static_cast<int>(
          std::min<int64_t>(8, (K - k0 + reader::kStrideCols - 1) / reader::kStrideCols));
      reader::weight_strided(r, whole, n, k0, count, got);
      for (int j = 0; j < count; ++j) {
        const int64_t kk = k0 + reader::kStrideCols * j;
        ASSERT_TRUE(same_float(got[j], row[static_cast<size_t>(kk)]))
            << "weight_strided e=" << whole << " n=" << n << " kk=" << kk << " from " << k0;
      }
    }
  }
  std::uniform_int_distribution<int64_t> pe(0, E - 1), pn(0, N - 1), pk(0, K - 1);
  for (int64_t i = 0; i < how.samples; ++i) {
    const int64_t e = pe(rng), n = pn(rng), kk = pk(rng);
    ASSERT_TRUE(check(e, n, kk)) << "e=" << e << " n=" << n << " kk=" << kk;
  }
  // The generic matmul is the per-element contract summed in column order.
  const int64_t m = 3, e = std::uniform_int_distribution<int64_t>(0, E - 1)(rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * K)), y(static_cast<size_t>(m * N), NAN);
  for (auto& v : x) v = u(rng);
  reader_expert_matmul(r, e, x.data(), m, y.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < K; ++kk)
        acc +=
            x[static_cast<size_t>(i * K + reader::act_col(r, e, kk))] * reader::weight(r, e, n, kk);
      ASSERT_TRUE(same_float(y[static_cast<size_t>(i * N + n)], acc))
          << "reader_expert_matmul e=" << e << " row " << i << " n=" << n << ": "
          << y[static_cast<size_t>(i * N + n)] << " vs " << acc;
    }
}

}  // namespace

void expect_reader_matches(Rng& rng, const TargetLayout& row, const LayoutOptions& o,
                           const TensorMap& params, const MoeExperts& decoded,
                           const ReaderCheck& how) {
  ASSERT_NE(row.make_reader, nullptr) << row.name << " has no reader";
  ASSERT_NE(row.act_quant, nullptr) << row.name << " has no activation quantisation";
  for (MoeProj proj : {MoeProj::kW13, MoeProj::kW2}) {
    SCOPED_TRACE(proj == MoeProj::kW13 ? "reader w13" : "reader w2");
    const reader::ProjReader r = row.make_reader(o, params, proj, host_param);
    EXPECT_EQ(r.kind, row.reader_kind);
    EXPECT_EQ(r.act, row.act_quant(o));
    expect_proj_reader_matches(rng, r, proj == MoeProj::kW13 ? decoded.w13 : decoded.w2, how);
  }
}

void layout_matmul(MakeReaderFn make_reader, const LayoutOptions& o, const TensorMap& params,
                   MoeProj proj, int64_t expert, const float* x, int64_t m, float* y) {
  reader_expert_matmul(make_reader(o, params, proj, host_param), expert, x, m, y);
}

}  // namespace moepack::test
