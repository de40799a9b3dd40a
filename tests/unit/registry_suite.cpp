// The registry-driven suite: every row of source_codecs() and target_layouts() (formats/
// registry.cpp) on random legal inputs drawn from the rows' own declarations -- param_space,
// spec_for, moe_shape_for, unsupported_reasons -- with no hand list of formats. A new row is
// tested by adding it to the table.
//
//   SourceCodecRows/*:  pack then unpack is the identity; logical_shape recovers (N, K); the
//                       packed suffixes are the declared ones; refine leaves our own output alone.
//   TargetLayoutRows/*: param_specs describe pack's output; unpack inverts pack (scales in the
//                       layout's dtype); the row has a reader (kind, activation quantisation,
//                       builder) and weight(r, e, n, kk) equals the canonical dequantisation of
//                       unpack at act_col bit for bit; the matmul through the reader
//                       (reader_expert_matmul, what verify computes) matches the canonical
//                       dequantisation; output bytes do not depend on the thread count or on
//                       packing a slice of the experts alone (what chunked conversion relies on).
//
// Fixed seeds per row (FNV-1a of its name): a failure reproduces, and SCOPED_TRACE prints the
// combination (codec, params, E, H, I, gated, act dtype).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>
#include <sstream>

#include "core/half.h"
#include "formats/codec.h"
#include "formats/moe_reader.h"
#include "formats/parallel.h"
#include "tests/test_util.h"

namespace moepack {

// gtest prints a failing parameter through PrintTo (found by ADL): the row's name, not its bytes.
void PrintTo(const SourceCodec& c, std::ostream* os) {
  *os << c.name;
}
void PrintTo(const TargetLayout& t, std::ostream* os) {
  *os << t.name;
}

namespace {

using test::matmul_error;
using test::slice_experts;

using test::bytes_equal;
using test::describe_params;
using test::RandomTensorOptions;
using test::Rng;
using test::ScaleValues;

// FNV-1a of the row's name: the same seed on every platform. MOEPACK_SUITE_SEED=<n> mixes in n
// to sample other inputs locally (failures print it with the combination).
uint64_t seed_of(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  if (const char* env = std::getenv("MOEPACK_SUITE_SEED")) h ^= std::strtoull(env, nullptr, 10);
  return h;
}

std::string seed_note() {
  const char* env = std::getenv("MOEPACK_SUITE_SEED");
  return env ? std::string(" MOEPACK_SUITE_SEED=") + env : std::string();
}

// "ct-pack-quantized" -> "ct_pack_quantized": gtest names take letters, digits and '_'.
std::string test_name(const char* name) {
  std::string s = name;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

std::string what_threw(const std::exception& e) {
  std::string s = e.what();
  if (const auto* err = dynamic_cast<const Error*>(&e))
    s = std::string("[") + error_code_name(err->code()) + "] " + s;
  return s;
}

std::string spec_str(const QuantSpec& q) {
  std::ostringstream s;
  s << "kind=" << static_cast<int>(q.kind) << " bits=" << q.bits << " group=" << q.group_size
    << " scale_block_n=" << q.scale_block_n << (q.symmetric ? " sym" : " asym")
    << " scale=" << dtype_name(q.scale_dtype) << " global=" << static_cast<int>(q.global_scale);
  return s.str();
}

// The source scales as a layout stores them: through float32, then round-to-nearest-even into
// `to` (what torch's copy_ into the parameter does); E8M0 bytes stay bytes. Written apart from
// formats' convert_scales on purpose: it is the oracle the layouts' scales are checked against.
std::vector<uint8_t> scales_as(const QuantTensor& q, DType to) {
  if (q.scale_dtype == to || (is_scale_byte_dtype(q.scale_dtype) && is_scale_byte_dtype(to)))
    return q.scales;
  const int64_t count = static_cast<int64_t>(q.scales.size()) / q.scale_bytes();
  const int ob = dtype_bits(to) / 8;
  std::vector<uint8_t> out(static_cast<size_t>(count * ob));
  for (int64_t i = 0; i < count; ++i) {
    const float v = scale_to_float(q.scales.data() + i * q.scale_bytes(), q.scale_dtype);
    if (to == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = to == DType::kBF16 ? float_to_bf16(v) : float_to_f16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// got == want field by field and byte for byte. Scales compare against want's converted to got's
// dtype; a projection with one group may read back as channelwise (-1: same weights).
void expect_same_quant(const QuantTensor& got, const QuantTensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.experts, want.experts);
  EXPECT_EQ(got.n, want.n);
  EXPECT_EQ(got.k, want.k);
  EXPECT_EQ(got.kind, want.kind);
  EXPECT_EQ(got.bits, want.bits);
  if (!(got.groups() == 1 && want.groups() == 1)) {
    EXPECT_EQ(got.group_size, want.group_size);
  }
  EXPECT_EQ(got.scale_block_n, want.scale_block_n);
  EXPECT_EQ(got.symmetric, want.symmetric);
  EXPECT_TRUE(bytes_equal(got.codes, want.codes, 16, what + " codes"));
  EXPECT_TRUE(bytes_equal(got.scales, scales_as(want, got.scale_dtype), 16, what + " scales"));
  EXPECT_TRUE(bytes_equal(got.zeros, want.zeros, 16, what + " zeros"));
  EXPECT_TRUE(bytes_equal(got.g_idx, want.g_idx, 16, what + " g_idx"));
  // Global scales as stored, bit for bit (never a reciprocal in their place).
  EXPECT_EQ(got.global_scale, want.global_scale);
  if (got.global_scale != GlobalScale::kNone) {
    EXPECT_EQ(got.global_shards, want.global_shards);
  }
  EXPECT_TRUE(bytes_equal(got.global_scales, want.global_scales, 16, what + " global scales"));
  // W4A4's activation global scales likewise, where kept.
  EXPECT_EQ(got.input_global_scale, want.input_global_scale);
  EXPECT_TRUE(bytes_equal(got.input_scales, want.input_scales, 16, what + " input scales"));
}

// ---- source codecs ---------------------------------------------------------------------------

class SourceCodecRows : public ::testing::TestWithParam<SourceCodec> {};

int64_t lcm(int64_t a, int64_t b) {
  return a / std::gcd(a, b) * b;
}

struct Extent {
  int64_t n, k;
};

// Three shapes of multiples of 128 (K also of the group size), and two small or odd ones at the
// finest granularity the spec allows every codec of its kind: integer codes packed 32/bits to a
// word on N and on K (GPTQ packs both), K a multiple of the group size, N free where nothing packs
// along it (a partial last 128-row block of FP8 block scales included).
std::vector<Extent> codec_extents(Rng& rng, const QuantSpec& q) {
  const int64_t gs = q.group_size > 0 ? q.group_size : 1;
  const int64_t pf = q.kind == CodeKind::kUint ? 32 / q.bits : 1;
  const int64_t k128 = lcm(128, gs), n_unit = pf, k_unit = lcm(pf, gs);
  std::uniform_int_distribution<int64_t> blocks(1, 4);
  std::vector<Extent> out;
  for (int i = 0; i < 3; ++i) out.push_back({128 * blocks(rng), k128 * blocks(rng)});
  std::uniform_int_distribution<int64_t> small_n(1, std::max<int64_t>(1, 100 / n_unit)),
      small_k(1, std::max<int64_t>(1, 300 / k_unit));
  for (int i = 0; i < 2; ++i) out.push_back({n_unit * small_n(rng), k_unit * small_k(rng)});
  return out;
}

void check_codec_case(const SourceCodec& row, const QuantParams& params, const QuantTensor& q) {
  // Inputs are never all zero (a layout bug that zeroes bytes must not pass as a match).
  ASSERT_TRUE(std::any_of(q.codes.begin(), q.codes.end(), [](uint8_t c) { return c != 0; }));
  ASSERT_TRUE(std::any_of(q.scales.begin(), q.scales.end(), [](uint8_t c) { return c != 0; }));

  const TensorMap packed = row.pack(params, q);
  const std::vector<std::string> req = row.required_suffixes(params);
  const std::vector<std::string> opt = row.optional_suffixes(params);
  std::set<std::string> declared(req.begin(), req.end());
  declared.insert(opt.begin(), opt.end());
  std::map<std::string, Shape> shapes;
  std::map<std::string, TensorView> views;
  for (const auto& [suffix, t] : packed) {
    EXPECT_TRUE(declared.count(suffix)) << "pack wrote '" << suffix << "', not a declared suffix";
    shapes[suffix] = t.shape;
    views[suffix] = t.view();
  }
  for (const auto& r : req) EXPECT_TRUE(packed.count(r)) << "required suffix '" << r << "' missing";

  const std::pair<int64_t, int64_t> nk = row.logical_shape(params, views);
  EXPECT_EQ(nk.first, q.n) << "logical_shape N";
  EXPECT_EQ(nk.second, q.k) << "logical_shape K";
  // has_act_order sees exactly the non-trivial g_idx the planner must size the layout for.
  if (row.has_act_order) {
    EXPECT_EQ(row.has_act_order(params, views), !q.g_idx.empty()) << "has_act_order";
  }

  if (row.refine) {
    // Our own output carries what the params say: refining from it changes nothing.
    const QuantParams r = row.refine(params, views);
    EXPECT_EQ(describe_params(r), describe_params(params)) << "refine changed the params";
    EXPECT_EQ(r.gptq_format, params.gptq_format);
  }
  if (row.refusals) {
    EXPECT_TRUE(row.refusals(params).empty()) << "param_space holds a refusal";
  }

  const QuantTensor back = row.unpack(params, packed, q.n, q.k);
  EXPECT_EQ(back.scale_dtype, q.scale_dtype);
  expect_same_quant(back, q, "unpack(pack(q))");
}

TEST_P(SourceCodecRows, PackUnpackIdentityOnRandomLegalTensors) {
  const SourceCodec& row = GetParam();
  Rng rng(seed_of(row.name));
  const std::vector<QuantParams> space = row.param_space();
  ASSERT_FALSE(space.empty()) << row.name << " declares no param_space";
  int cases = 0;
  for (const QuantParams& params : space) {
    const QuantSpec spec = row.spec_for(params);
    RandomTensorOptions ro;
    ro.scales = ScaleValues::kAnyPositiveFinite;  // codecs move bytes: every legal value
    std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(params);
    ro.act_order = params.act_order;
    for (const Extent& x : codec_extents(rng, spec)) {
      std::ostringstream trace;
      trace << row.name << " {" << describe_params(params) << "} spec {" << spec_str(spec)
            << "} N=" << x.n << " K=" << x.k << seed_note();
      SCOPED_TRACE(trace.str());
      QuantTensor q = test::random_quant_tensor(rng, spec, 1, x.n, x.k, ro);
      // A per-tensor FP8 codec holds one scale per Linear: canonically the same on every row.
      if (params.method == QuantMethod::kCtFp8Tensor || params.method == QuantMethod::kModeloptFp8)
        for (int64_t r = 1; r < q.n; ++r)
          std::copy_n(q.scales.begin(), q.scale_bytes(), q.scales.begin() + r * q.scale_bytes());
      if (params.act_order && spec.groups(x.k) > 1) {
        ASSERT_FALSE(q.g_idx.empty()) << "act-order case without a g_idx";
      }
      try {
        check_codec_case(row, params, q);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "threw " << what_threw(e);
      }
      ++cases;
    }
  }
  EXPECT_GE(cases, 5);
}

std::string codec_test_name(const ::testing::TestParamInfo<SourceCodec>& p) {
  return test_name(p.param.name);
}
// A codec with a global scale names its tensor (load_moe_experts' gate/up refusal names it),
// one of the required suffixes; one without names none.
TEST_P(SourceCodecRows, GlobalScaleSuffixIsRequired) {
  const SourceCodec& row = GetParam();
  for (const QuantParams& params : row.param_space()) {
    const bool global = row.spec_for(params).global_scale != GlobalScale::kNone;
    ASSERT_EQ(global, row.global_scale_suffix != nullptr) << row.name;
    if (!global) continue;
    const auto req = row.required_suffixes(params);
    EXPECT_NE(std::find(req.begin(), req.end(), std::string(row.global_scale_suffix)), req.end())
        << row.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, SourceCodecRows, ::testing::ValuesIn(source_codecs()),
                         codec_test_name);

// ---- target layouts --------------------------------------------------------------------------

class TargetLayoutRows : public ::testing::TestWithParam<TargetLayout> {};

std::vector<ParamSpec> specs_of(const std::vector<Tensor>& ts) {
  std::vector<ParamSpec> out;
  for (const auto& t : ts) out.push_back({t.name, t.dtype, t.shape});
  return out;
}

std::string specs_str(const std::vector<ParamSpec>& v) {
  std::string s;
  for (const auto& p : v)
    s += "\n  " + p.name + " " + dtype_name(p.dtype) + " " + shape_str(p.shape);
  return s;
}

TensorMap by_name(const std::vector<Tensor>& ts) {
  TensorMap m;
  for (const auto& t : ts) m[t.name] = t;
  return m;
}

void expect_same_params(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                        const std::string& what) {
  ASSERT_EQ(specs_of(got), specs_of(want))
      << what << specs_str(specs_of(got)) << "\nvs" << specs_str(specs_of(want));
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(bytes_equal(got[i].data, want[i].data, 16, what + ": " + got[i].name));
}

// The roles a serving plugin finds the parameters by: one parameter per role, the weights and
// scales of both projections always, and each parameter's role of its own projection (vLLM names
// every expert parameter w13_... or w2_..., except the TRT-LLM NVFP4 experts' g1_scale_c, which
// is w13's output scale).
void expect_roles(const LayoutOptions& o, const std::vector<ParamSpec>& declared) {
  std::set<ParamRole> seen;
  for (const ParamSpec& p : declared) {
    EXPECT_TRUE(seen.insert(p.role).second) << "two parameters are " << param_role_name(p.role);
    const std::string local = p.name.substr(o.prefix.size());
    const std::string role = param_role_name(p.role);
    const std::string proj = role.substr(0, role.find('_') + 1);  // "w13_" or "w2_"
    if (!(local == "g1_scale_c" && p.role == ParamRole::kW13OutputScale)) {
      EXPECT_EQ(local.rfind(proj, 0), 0u) << local << " has role " << role;
    }
  }
  for (ParamRole r :
       {ParamRole::kW13Weight, ParamRole::kW2Weight, ParamRole::kW13Scale, ParamRole::kW2Scale})
    EXPECT_TRUE(seen.count(r)) << "no parameter is " << param_role_name(r);
}

// Both sides read identical quantised values (the decoded experts are pack's input, bit for bit),
// so the only difference is float32 accumulation order over K <= 512 products against the double
// reference: measured worst 2.0e-6 over every row of this suite. 1e-5 leaves a 5x margin; flipping
// one byte of the packed weights moves the error to 1e-5 .. 1e-1 (572 of 612 such flips failed in
// a trial run: a flip in a low code bit can stay under it), and a wrong tile, row or scale
// permutation gives errors of order 1.
constexpr double kMatmulTolerance = 1e-5;

void check_layout_case(Rng& rng, const TargetLayout& row, const LayoutOptions& o, const MoeShape& s,
                       const MoeExperts& x, bool whole_expert, double* worst_error) {
  const auto nonzero = [](const std::vector<uint8_t>& v) {
    return std::any_of(v.begin(), v.end(), [](uint8_t c) { return c != 0; });
  };
  ASSERT_TRUE(nonzero(x.w13.codes) && nonzero(x.w2.codes) && nonzero(x.w13.scales) &&
              nonzero(x.w2.scales))
      << "all-zero input";
  // The generator matches the shape the layout decided on.
  const MoeShape got_shape = moe_shape_of(x);
  for (const auto& [a, b] : {std::make_pair(got_shape.w13, s.w13), {got_shape.w2, s.w2}}) {
    ASSERT_EQ(a.quant, b.quant);
    ASSERT_EQ(a.n, b.n);
    ASSERT_EQ(a.k, b.k);
    ASSERT_EQ(a.act_order, b.act_order);
  }

  // param_specs describes pack's output exactly.
  const std::vector<Tensor> packed = row.pack(o, x);
  const std::vector<ParamSpec> declared = row.param_specs(o, s);
  EXPECT_EQ(declared, specs_of(packed))
      << "param_specs:" << specs_str(declared) << "\npack:" << specs_str(specs_of(packed));
  expect_roles(o, declared);

  // unpack inverts pack.
  const TensorMap params = by_name(packed);
  ASSERT_EQ(params.size(), packed.size()) << "pack wrote two parameters of one name";
  const MoeExperts back = row.unpack(o, params);
  for (const QuantTensor* t : {&back.w13, &back.w2}) {
    const QuantTensor& src = t == &back.w13 ? x.w13 : x.w2;
    const bool same_bytes =
        is_scale_byte_dtype(t->scale_dtype) == is_scale_byte_dtype(src.scale_dtype);
    EXPECT_TRUE(same_bytes && (t->scale_dtype == src.scale_dtype || t->scale_dtype == o.act_dtype ||
                               t->scale_dtype == DType::kF32))
        << "unpacked scale dtype " << dtype_name(t->scale_dtype) << " from "
        << dtype_name(src.scale_dtype) << " with activations " << dtype_name(o.act_dtype);
  }
  // (x as the layout reads it: vLLM's NVFP4 Marlin rules change the global scales and flush
  // small block scales, test::as_layout_reads.)
  const MoeExperts reads = test::as_layout_reads(row, o, x);
  expect_same_quant(back.w13, reads.w13, "unpack(pack(x)).w13");
  expect_same_quant(back.w2, reads.w2, "unpack(pack(x)).w2");
  // Expert biases (a layout that declares them) come back bit for bit.
  EXPECT_EQ(back.bias_dtype, x.bias_dtype);
  EXPECT_TRUE(bytes_equal(back.w13_bias, x.w13_bias, 16, "unpack(pack(x)).w13_bias"));
  EXPECT_TRUE(bytes_equal(back.w2_bias, x.w2_bias, 16, "unpack(pack(x)).w2_bias"));

  // The row's reader: the kernel's reading of the packed bytes is unpack's decoding, element by
  // element, bit for bit (and reader_expert_matmul is that reading summed in column order).
  test::ReaderCheck how;
  how.whole_expert = whole_expert;
  test::expect_reader_matches(rng, row, o, params, back, how);

  // The kernel's-eye matmul (through the reader, as verify computes it) against the canonical
  // dequantisation of what unpack decoded.
  const int64_t m = 3;
  std::uniform_int_distribution<int64_t> pick(0, s.experts - 1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (MoeProj proj : {MoeProj::kW13, MoeProj::kW2}) {
    const QuantTensor& q = proj == MoeProj::kW13 ? back.w13 : back.w2;
    const int64_t e = pick(rng);
    std::vector<float> xa(static_cast<size_t>(m * q.k)), y(static_cast<size_t>(m * q.n));
    for (auto& v : xa) v = u(rng);
    reader_expert_matmul(row.make_reader(o, params, proj, host_param), e, xa.data(), m, y.data());
    const double err = matmul_error(q, e, xa, m, y);
    *worst_error = std::max(*worst_error, err);
    EXPECT_LE(err, kMatmulTolerance) << (proj == MoeProj::kW13 ? "w13" : "w2") << " expert " << e;
  }

  // Output bytes never depend on the thread count.
  for (int threads : {2, 3}) {
    LayoutOptions ot = o;
    ot.threads = threads;
    expect_same_params(row.pack(ot, x), packed, "threads=" + std::to_string(threads));
  }

  // Packing experts [a, b) alone gives the [a, b) slice of every parameter.
  std::uniform_int_distribution<int64_t> first(0, s.experts - 1);
  const int64_t a = first(rng);
  const int64_t b = std::uniform_int_distribution<int64_t>(a + 1, s.experts)(rng);
  SCOPED_TRACE("experts [" + std::to_string(a) + ", " + std::to_string(b) + ")");
  const MoeExperts xs = test::slice_moe_experts(x, a, b);
  MoeShape ss = s;
  ss.experts = b - a;
  const std::vector<Tensor> part = row.pack(o, xs);
  EXPECT_EQ(row.param_specs(o, ss), specs_of(part)) << "param_specs of the slice";
  ASSERT_EQ(part.size(), packed.size());
  for (size_t i = 0; i < part.size(); ++i) {
    const Tensor &p = part[i], &f = packed[i];
    ASSERT_EQ(p.name, f.name);
    ASSERT_EQ(p.dtype, f.dtype) << p.name;
    ASSERT_FALSE(f.shape.empty()) << f.name << " has no leading expert dimension";
    ASSERT_EQ(f.shape[0], s.experts) << f.name << " leading dimension is not the experts";
    Shape want_shape = f.shape;
    want_shape[0] = b - a;
    ASSERT_EQ(p.shape, want_shape) << p.name;
    const size_t per = f.data.size() / static_cast<size_t>(s.experts);
    const std::vector<uint8_t> want(f.data.begin() + static_cast<std::ptrdiff_t>(a * per),
                                    f.data.begin() + static_cast<std::ptrdiff_t>(b * per));
    EXPECT_TRUE(bytes_equal(p.data, want, 16, "slice of " + p.name));
  }
}

bool takes_scheme(const TargetLayout& row, const char* scheme) {
  return std::find(row.schemes.begin(), row.schemes.end(), scheme) != row.schemes.end();
}

TEST_P(TargetLayoutRows, PackUnpackMatmulThreadsAndSlicesOnRandomLegalLayers) {
  const TargetLayout& row = GetParam();
  // Every row owns its reader: verify (CPU and GPU) computes through nothing else.
  ASSERT_NE(row.make_reader, nullptr) << row.name << " has no reader (TargetLayout::make_reader)";
  ASSERT_NE(row.act_quant, nullptr) << row.name << " has no TargetLayout::act_quant";
  Rng rng(seed_of(row.name));
  int supported = 0, skipped = 0, codecs = 0, combo = 0;
  double worst = 0.0;
  for (const SourceCodec& codec : source_codecs()) {
    if (!takes_scheme(row, codec.scheme)) continue;
    ++codecs;
    for (const QuantParams& params : codec.param_space()) {
      RandomTensorOptions ro;
      ro.scales = ScaleValues::kModerate;
      std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(params);
      // GPTQ zeros where the layouts' kernels read what the checkpoint means: vLLM's GPTQ loaders
      // add 1 to the stored zero in uint8, so triton-wna16 refuses a (v2) zero of 0 from the
      // bytes -- which shape-only planning cannot see -- and writes vLLM's own wrapped nibbles for
      // a (v1) zero of 16, which its kernel reads as 0 (docs/triton_wna16.md "Zero points";
      // tests/unit/triton_roundtrip.cpp has that case). Codec-level ranges are covered above.
      if (params.method == QuantMethod::kGptq) {
        ro.zero_lo = std::max(ro.zero_lo, 1);
        ro.zero_hi = std::min(ro.zero_hi, (1 << params.bits) - 1);
      }
      // A small param space gets several layers per option set, so every row sees a few.
      const int draws = std::max<int>(1, 6 / static_cast<int>(codec.param_space().size()));
      for (int draw = 0; draw < draws; ++draw)
        for (DType act : {DType::kBF16, DType::kF16})
          for (bool gated : {true, false}) {
            const test::LayerDims d = test::random_layer_dims(rng, 1).front();
            const MoeShape s = moe_shape_for(params, d.experts, d.hidden, d.inter, gated);
            LayoutOptions o;
            o.act_dtype = act;
            o.gated = gated;
            o.source_method = params.method;
            o.prefix = "model.layers.0.mlp.experts.";
            o.hidden = d.hidden;
            o.inter = d.inter;
            // Every vLLM target in turn (a layout only one vLLM runs, such as Humming for 0.33,
            // is judged under each and skipped where it refuses).
            const std::vector<VllmTargetRow>& targets = vllm_target_rows();
            o.vllm_target = targets[static_cast<size_t>(combo++) % targets.size()].target;
            if (!row.unsupported_reasons(o, s).empty()) {
              ++skipped;
              continue;
            }
            std::ostringstream trace;
            trace << row.name << " <- " << codec.name << " {" << describe_params(params)
                  << "} E=" << d.experts << " H=" << d.hidden << " I=" << d.inter
                  << (gated ? " gated" : " non-gated") << " act=" << dtype_name(act)
                  << " vllm-target=" << vllm_target_name(o.vllm_target) << seed_note();
            SCOPED_TRACE(trace.str());
            ++supported;
            MoeExperts x = test::random_moe_experts(rng, s, ro);
            test::add_declared_biases(rng, row.param_specs(o, s), &x);
            test::make_per_tensor_legal(params.method, &x);
            // A layout that decides from the whole layer's codes decides once, over x.
            if (row.decide_layer)
              o.layer_decisions = row.decide_layer(o, s, test::whole_layer(x, 1));
            try {
              // Every element of one expert in one case of four (run time under ASan), samples
              // elsewhere.
              check_layout_case(rng, row, o, s, x, supported % 4 == 1, &worst);
            } catch (const std::exception& e) {
              ADD_FAILURE() << "threw " << what_threw(e);
            }
          }
    }
  }
  EXPECT_GE(codecs, 1) << row.name << " takes no registered codec's scheme";
  EXPECT_GE(supported, 4) << row.name << ": only " << supported << " supported combinations ("
                          << skipped << " skipped)";
  std::cout << "[ " << row.name << " ] " << supported << " supported, " << skipped
            << " skipped; worst matmul error " << worst << "\n";
}

// Every row says how the moepack-vllm plugin serves it in the newest vLLM target, for every
// source method it takes, with the fields its path needs (the plugin reads them from
// moepack.json; docs/vllm.md "Serving paths").
TEST_P(TargetLayoutRows, DeclaresItsServingForTheNewestTarget) {
  const TargetLayout& row = GetParam();
  const VllmTarget target = newest_vllm_target();
  int covered = 0;
  for (const SourceCodec& codec : source_codecs()) {
    if (!takes_scheme(row, codec.scheme)) continue;
    SCOPED_TRACE(std::string(row.name) + " <- " + codec.name);
    bool explicit_entry = false;
    for (const VllmServing& s : row.vllm_serving)
      explicit_entry =
          explicit_entry || (s.target == target &&
                             (s.sources.empty() ||
                              std::count(s.sources.begin(), s.sources.end(), codec.method) == 1));
    EXPECT_TRUE(explicit_entry) << "no vllm_serving entry for " << vllm_target_name(target);
    const VllmServing s = find_vllm_serving(row, target, codec.method);
    ++covered;
    switch (s.path) {
      case ServingPath::kNone:
        EXPECT_TRUE(s.reason && std::string(s.reason).size() > 20) << "no reason";
        break;
      case ServingPath::kVllmMethod: {
        ASSERT_TRUE(s.vllm_method && s.vllm_backend);
        const std::string b = s.vllm_backend;
        EXPECT_EQ(std::count(b.begin(), b.end(), '.'), 1) << b << ": not EnumClass.MEMBER";
        EXPECT_EQ(s.kernel_builder, nullptr);
        break;
      }
      case ServingPath::kKernelBuilder:
        EXPECT_TRUE(s.kernel_builder && *s.kernel_builder);
        EXPECT_EQ(s.vllm_method, nullptr);
        break;
    }
  }
  EXPECT_GE(covered, 1);
  // A target or source no entry covers reads as not served, with a reason.
  const VllmServing none = find_vllm_serving(row, VllmTarget::kV2026_05, QuantMethod::kNone);
  EXPECT_EQ(none.path, ServingPath::kNone);
  EXPECT_NE(none.reason, nullptr);
}

// A vllm-method entry's backend is the one the target's backend order (the oracle's data) names
// for this layout, on every arch the layout runs on: the two tables state one fact.
TEST_P(TargetLayoutRows, ServingBackendIsTheOrdersBackendForThisLayout) {
  const TargetLayout& row = GetParam();
  for (const VllmServing& s : row.vllm_serving) {
    if (s.path != ServingPath::kVllmMethod) continue;
    const std::string member =
        std::string(s.vllm_backend)
            .substr(std::string(s.vllm_backend).find('.') + 1);  // "FLASHINFER_TRTLLM"
    for (const std::string& scheme : row.schemes)
      for (TargetArch arch : row.archs) {
        SCOPED_TRACE(std::string(row.name) + " " + scheme + " " + target_arch_name(arch));
        const VllmBackendOrder* order = vllm_backend_order(vllm_target_row(s.target), scheme, arch);
        ASSERT_NE(order, nullptr);
        std::vector<std::string> reading;
        for (const VllmBackend& b : order->backends)
          if (b.layout && std::string(b.layout) == row.name) reading.push_back(b.name);
        EXPECT_EQ(reading, std::vector<std::string>{member});
      }
  }
}

// ---- tensor and expert parallel ------------------------------------------------------------

// Every row says how its experts split over tensor-parallel ranks (how vLLM 0.33's RoutedExperts
// narrows the checkpoint per rank before this layout's post-processing runs on the slice). A
// layout added without it cannot be written for --tensor-parallel-size above 1: this fails until
// the row fills TargetLayout::tensor_parallel (formats/parallel.h has the canonical split; a row
// whose vLLM method narrows or post-processes otherwise writes its own).
TEST_P(TargetLayoutRows, DeclaresATensorParallelSplit) {
  const TargetLayout& row = GetParam();
  if (row.tensor_parallel.unsupported) {
    EXPECT_EQ(row.tensor_parallel.split, nullptr) << row.name;
    GTEST_SKIP() << row.name << " is not written for tensor or expert parallelism: "
                 << row.tensor_parallel.unsupported;
  }
  EXPECT_NE(row.tensor_parallel.reasons, nullptr)
      << row.name << " has no TargetLayout::tensor_parallel.reasons: say what vLLM 0.33 refuses "
      << "when it splits this layout's experts over tensor-parallel ranks";
  EXPECT_NE(row.tensor_parallel.split, nullptr)
      << row.name << " has no TargetLayout::tensor_parallel.split: say which canonical experts "
      << "one tensor-parallel rank of vLLM 0.33 holds before post-processing";
}

// y = x . W_e^T through the row's reader of `params`.
std::vector<float> reader_out(const TargetLayout& row, const LayoutOptions& o,
                              const TensorMap& params, MoeProj proj, int64_t e,
                              const std::vector<float>& x, int64_t m, int64_t n) {
  std::vector<float> y(static_cast<size_t>(m * n));
  reader_expert_matmul(row.make_reader(o, params, proj, host_param), e, x.data(), m, y.data());
  return y;
}

// `o` with the row's decisions over experts `x` of shape `s` (TargetLayout::decide_layer), as
// make_plan gives them: the whole layer's, or in a parallel output a rank's over its share.
LayoutOptions decided(const TargetLayout& row, LayoutOptions o, const MoeShape& s,
                      const MoeExperts& x) {
  if (row.decide_layer) o.layer_decisions = row.decide_layer(o, s, test::whole_layer(x, 1));
  return o;
}

// One layer at tensor-parallel size tp: each rank's parameters are the row's pack of the rank's
// split (param_specs of the rank's shape describe them, unpack gives the split back), and the
// ranks' outputs assemble the whole layer's: w13 rows [gate_r; up_r] are the whole w13's rows bit
// for bit, and the sum over ranks of w2's partial outputs (what vLLM's all-reduce adds) is the
// whole w2's output up to float summation order.
void check_tensor_parallel_case(Rng& rng, const TargetLayout& row, const LayoutOptions& o_in,
                                const MoeShape& s, const MoeExperts& x, int tp) {
  Parallelism p;
  p.tensor = tp;
  const LayoutOptions o = decided(row, o_in, s, x);
  const std::vector<Tensor> whole = row.pack(o, x);
  const TensorMap whole_params = by_name(whole);
  const int64_t I = s.inter(), ip = I / tp, H = s.hidden(), m = 2;
  const int64_t shards = o.gated ? 2 : 1;
  const int64_t e = std::uniform_int_distribution<int64_t>(0, s.experts - 1)(rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> xh(static_cast<size_t>(m * H)), xi(static_cast<size_t>(m * I));
  for (auto& v : xh) v = u(rng);
  for (auto& v : xi) v = u(rng);
  const std::vector<float> h_whole =
      reader_out(row, o, whole_params, MoeProj::kW13, e, xh, m, shards * I);
  const std::vector<float> y_whole = reader_out(row, o, whole_params, MoeProj::kW2, e, xi, m, H);
  std::vector<double> y_sum(static_cast<size_t>(m * H), 0.0);
  for (int r = 0; r < tp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(tp));
    const MoeExperts xr = row.tensor_parallel.split(x, o.gated, tp, r);
    // The rank's own decisions, over its slice (vLLM 0.33 post-processes it alone).
    const LayoutOptions ro = decided(row, rank_layout_options(o_in, p), rank_shape(s, p, r), xr);
    const std::vector<Tensor> packed = row.pack(ro, xr);
    EXPECT_EQ(row.param_specs(ro, rank_shape(s, p, r)), specs_of(packed))
        << "param_specs of the rank's shape";
    const TensorMap params = by_name(packed);
    const MoeExperts back = row.unpack(ro, params);
    // (the rank's split as the layout reads it: NVFP4 Marlin's global scales, per-tensor FP8's
    // requantised w13, test::as_layout_reads)
    const MoeExperts reads = test::as_layout_reads(row, ro, xr);
    expect_same_quant(back.w13, reads.w13, "unpack(rank).w13");
    expect_same_quant(back.w2, reads.w2, "unpack(rank).w2");
    const std::vector<float> h = reader_out(row, ro, params, MoeProj::kW13, e, xh, m, shards * ip);
    for (int64_t t = 0; t < m; ++t)
      for (int64_t sh = 0; sh < shards; ++sh)
        for (int64_t c = 0; c < ip; ++c) {
          const float got = h[static_cast<size_t>(t * shards * ip + sh * ip + c)];
          const float want = h_whole[static_cast<size_t>(t * shards * I + sh * I + r * ip + c)];
          ASSERT_EQ(std::memcmp(&got, &want, 4), 0)
              << "w13 output row " << sh * I + r * ip + c << " token " << t << ": " << got
              << " vs the whole layer's " << want;
        }
    std::vector<float> xr_in(static_cast<size_t>(m * ip));
    for (int64_t t = 0; t < m; ++t)
      std::copy(xi.begin() + t * I + r * ip, xi.begin() + t * I + (r + 1) * ip,
                xr_in.begin() + t * ip);
    const std::vector<float> y = reader_out(row, ro, params, MoeProj::kW2, e, xr_in, m, H);
    for (size_t i = 0; i < y.size(); ++i) y_sum[i] += y[i];
  }
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < y_sum.size(); ++i) {
    diff += (y_sum[i] - y_whole[i]) * (y_sum[i] - y_whole[i]);
    norm += static_cast<double>(y_whole[i]) * y_whole[i];
  }
  EXPECT_LE(std::sqrt(diff / std::max(norm, 1e-30)), kMatmulTolerance)
      << "sum of the ranks' w2 outputs vs the whole layer's";
}

// Expert parallel: each rank's parameters are the whole layer's rows of its experts, in the order
// of vLLM's expert map, for both placements (ranks pack their experts alone). A row with
// decisions makes them over the rank's experts; the whole layer is then packed with the rank's.
void check_expert_parallel_case(const TargetLayout& row, const LayoutOptions& o, const MoeShape& s,
                                const MoeExperts& x, int ep, ExpertPlacement placement) {
  Parallelism p;
  p.expert = ep;
  p.placement = placement;
  const int64_t E = x.w13.experts;
  for (int r = 0; r < ep; ++r) {
    const std::vector<int64_t> ids = p.rank_experts(E, r);
    MoeExperts xr;
    xr.w13 = select_experts(x.w13, ids);
    xr.w2 = select_experts(x.w2, ids);
    const LayoutOptions ro = decided(row, o, rank_shape(s, p, r), xr);
    const std::vector<Tensor> packed = row.pack(ro, xr);
    const std::vector<Tensor> whole = row.pack(ro, x);
    ASSERT_EQ(packed.size(), whole.size());
    for (size_t i = 0; i < packed.size(); ++i) {
      const size_t per = whole[i].data.size() / static_cast<size_t>(E);
      std::vector<uint8_t> want;
      for (int64_t g : ids)
        want.insert(want.end(), whole[i].data.begin() + static_cast<std::ptrdiff_t>(g * per),
                    whole[i].data.begin() + static_cast<std::ptrdiff_t>((g + 1) * per));
      EXPECT_TRUE(bytes_equal(packed[i].data, want, 16,
                              "rank " + std::to_string(r) + " of " + std::to_string(ep) + " " +
                                  expert_placement_name(placement) + ": " + packed[i].name));
    }
  }
}

TEST_P(TargetLayoutRows, TensorAndExpertParallelRanksAssembleTheWholeLayer) {
  const TargetLayout& row = GetParam();
  if (row.tensor_parallel.unsupported)
    GTEST_SKIP() << row.name << ": " << row.tensor_parallel.unsupported;
  ASSERT_NE(row.tensor_parallel.split, nullptr) << row.name << ": see DeclaresATensorParallelSplit";
  Rng rng(seed_of(std::string(row.name) + "/parallel"));
  int tp_cases = 0, ep_cases = 0, refused = 0;
  for (const SourceCodec& codec : source_codecs()) {
    if (!takes_scheme(row, codec.scheme)) continue;
    for (const QuantParams& params : codec.param_space()) {
      if (params.act_order) continue;  // refused by every split (tp_canonical_reasons)
      RandomTensorOptions ro;
      ro.scales = ScaleValues::kModerate;
      std::tie(ro.zero_lo, ro.zero_hi) = test::codec_zero_range(params);
      if (params.method == QuantMethod::kGptq) {
        ro.zero_lo = std::max(ro.zero_lo, 1);
        ro.zero_hi = std::min(ro.zero_hi, (1 << params.bits) - 1);
      }
      for (bool gated : {true, false}) {
        const int64_t E = 3, H = 128 * std::uniform_int_distribution<int64_t>(1, 2)(rng);
        const int64_t I = 128 * std::uniform_int_distribution<int64_t>(2, 4)(rng);
        const MoeShape s = moe_shape_for(params, E, H, I, gated);
        LayoutOptions o;
        o.gated = gated;
        o.source_method = params.method;
        o.vllm_target = VllmTarget::kV0_33;
        o.inter = I;
        o.prefix = "model.layers.0.mlp.experts.routed_experts.";
        if (!row.unsupported_reasons(o, s).empty()) continue;
        std::ostringstream trace;
        trace << row.name << " <- " << codec.name << " {" << describe_params(params) << "} E=" << E
              << " H=" << H << " I=" << I << (gated ? " gated" : " non-gated") << seed_note();
        SCOPED_TRACE(trace.str());
        MoeExperts x = test::random_moe_experts(rng, s, ro);
        test::make_per_tensor_legal(params.method, &x);
        for (int tp : {2, 4}) {
          Parallelism p;
          p.tensor = tp;
          if (!parallel_reasons(row, o, s, p).empty()) {
            ++refused;
            continue;
          }
          ++tp_cases;
          try {
            check_tensor_parallel_case(rng, row, o, s, x, tp);
          } catch (const std::exception& e) {
            ADD_FAILURE() << "tp " << tp << " threw " << what_threw(e);
          }
        }
        for (ExpertPlacement pl : {ExpertPlacement::kLinear, ExpertPlacement::kRoundRobin}) {
          Parallelism ep;
          ep.expert = 2;
          ep.placement = pl;
          if (!parallel_reasons(row, o, s, ep).empty()) {
            ++refused;
            continue;
          }
          ++ep_cases;
          check_expert_parallel_case(row, o, s, x, 2, pl);
        }
      }
    }
  }
  EXPECT_GE(tp_cases, 2) << row.name << ": only " << tp_cases << " tensor-parallel cases ("
                         << refused << " refused)";
  EXPECT_GE(ep_cases, 2);
}

TEST(ParamRoles, NamesRoundTripAndPairW13WithW2) {
  for (int i = 0; i <= static_cast<int>(ParamRole::kW2SourceGlobalScale); ++i) {
    const auto r = static_cast<ParamRole>(i);
    const std::string name = param_role_name(r);
    EXPECT_EQ(parse_param_role(name), r) << name;
    if (name.rfind("w13_", 0) == 0) {
      EXPECT_EQ("w2_" + name.substr(4), param_role_name(param_role_of(MoeProj::kW2, r)));
    }
  }
  EXPECT_FALSE(parse_param_role("w13_weights").has_value());
  for (ServingPath p : {ServingPath::kNone, ServingPath::kVllmMethod, ServingPath::kKernelBuilder})
    EXPECT_EQ(parse_serving_path(serving_path_name(p)), p);
  EXPECT_FALSE(parse_serving_path("vllm").has_value());
}

std::string layout_test_name(const ::testing::TestParamInfo<TargetLayout>& p) {
  return test_name(p.param.name);
}
INSTANTIATE_TEST_SUITE_P(Registry, TargetLayoutRows, ::testing::ValuesIn(target_layouts()),
                         layout_test_name);

}  // namespace
}  // namespace moepack
