#include "formats/compressed_tensors.h"

#include <cstring>

#include "formats/wna16_util.h"

namespace moepack {
namespace {

using wna16::expect_dtype;
using wna16::expect_shape;

int ct_pack_factor(int bits, const char* what) {
  if (bits != 4 && bits != 8)
    throw Error(ErrorCode::kUnsupported, "", what,
                "pack-quantized bits=" + std::to_string(bits) + " (supported: 4, 8)");
  return 32 / bits;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);  // never forms a + b - 1 (weight_shape is untrusted)
}

void check_weight_shape(const Tensor& t, int64_t n, int64_t k) {
  expect_dtype(t, "weight_shape", {DType::kI64, DType::kI32});
  expect_shape(t, "weight_shape", {2}, "(N, K)");
  int64_t v[2];
  for (int i = 0; i < 2; ++i) {
    if (t.dtype == DType::kI64) {
      std::memcpy(&v[i], t.data.data() + 8 * i, 8);
    } else {
      int32_t x;
      std::memcpy(&x, t.data.data() + 4 * i, 4);
      v[i] = x;
    }
  }
  if (v[0] != n || v[1] != k)
    throw Error(ErrorCode::kBadShape, "", "weight_shape",
                "says (" + std::to_string(v[0]) + ", " + std::to_string(v[1]) +
                    "), the Linear is (N=" + std::to_string(n) + ", K=" + std::to_string(k) + ")");
}

}  // namespace

// ---- pack-quantized ---------------------------------------------------------------------------

std::vector<std::string> ct_pack_required_suffixes(const QuantParams& p) {
  std::vector<std::string> s = {"weight_packed", "weight_scale"};
  if (!p.symmetric) s.push_back("weight_zero_point");
  if (p.act_order) s.push_back("weight_g_idx");
  return s;
}

std::vector<std::string> ct_pack_optional_suffixes(const QuantParams& p) {
  std::vector<std::string> s = {"weight_shape"};
  if (p.symmetric) s.push_back("weight_zero_point");
  if (!p.act_order) s.push_back("weight_g_idx");
  return s;
}

QuantTensor unpack_ct_pack(const QuantParams& p, const TensorMap& m, int64_t n, int64_t k) {
  const int pf = ct_pack_factor(p.bits, "weight_packed");
  if (n <= 0 || k <= 0)
    throw Error(ErrorCode::kBadShape, "", "weight_packed",
                "N=" + std::to_string(n) + " K=" + std::to_string(k) + " must be positive");
  if (p.group_size == 0 || p.group_size < -1)
    throw Error(ErrorCode::kBadValue, "", "weight_scale",
                "group_size=" + std::to_string(p.group_size) + " (expected -1 or > 0)");
  QuantTensor q(ct_pack_spec_for(p), 1, n, k);
  const int64_t G = q.groups(), kw = ceil_div(k, pf);
  const uint32_t mask = (1u << p.bits) - 1u;

  if (const Tensor* ws = find_tensor(m, "weight_shape")) check_weight_shape(*ws, n, k);

  const Tensor& wp = require_tensor(m, "weight_packed");
  expect_dtype(wp, "weight_packed", {DType::kI32, DType::kU32});
  expect_shape(wp, "weight_packed", {n, kw}, "pack-quantized weight is [N, ceil(K/pf)]");
  q.codes.resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < kw; ++c) {
      const uint32_t w = wna16::load_u32(wp.data.data() + (r * kw + c) * 4);
      for (int f = 0; f < pf && c * pf + f < k; ++f)
        q.codes[static_cast<size_t>(r * k + c * pf + f)] =
            static_cast<uint8_t>((w >> (p.bits * f)) & mask);
    }

  const Tensor& sc = require_tensor(m, "weight_scale");
  expect_dtype(sc, "weight_scale", {DType::kF16, DType::kBF16, DType::kF32});
  expect_shape(sc, "weight_scale", {n, G}, "weight_scale is [N, G], G = " + std::to_string(G));
  wna16::check_finite_scales(sc.data.data(), n * G, sc.dtype, "weight_scale");
  q.scale_dtype = sc.dtype;
  q.scales = sc.data;

  if (const Tensor* gi = find_tensor(m, "weight_g_idx")) {
    q.g_idx = wna16::normalise_g_idx(*gi, "weight_g_idx", k, p.group_size, G);
    if (!p.act_order && !q.g_idx.empty())  // as in GPTQ: a permutation the config does not declare
      throw Error(ErrorCode::kBadValue, "", "weight_g_idx",
                  "a permuted (act-order) weight_g_idx, but the weights' actorder is not group");
  } else if (p.act_order) {
    throw Error(ErrorCode::kMissingTensor, "", "weight_g_idx", "actorder=group needs weight_g_idx");
  }

  if (p.symmetric) {
    // compressed-tensors writes no zero point for a symmetric scheme. One that holds anything
    // but the symmetric zero means the config's scheme is not the one these tensors were
    // written with (e.g. a config group resolved to the wrong module): never read it as
    // symmetric and drop it.
    if (const Tensor* zp = find_tensor(m, "weight_zero_point")) {
      const uint32_t packed_zero = 1u << (p.bits - 1);  // signed 0 after the pack offset
      bool trivial = true;
      if (zp->dtype == DType::kI32 || zp->dtype == DType::kU32) {
        for (size_t i = 0; i + 4 <= zp->data.size() && trivial; i += 4) {
          const uint32_t w = wna16::load_u32(zp->data.data() + i);
          if (w == 0) continue;
          for (int f = 0; f < pf; ++f) trivial &= ((w >> (p.bits * f)) & mask) == packed_zero;
        }
      } else {
        for (uint8_t b : zp->data) trivial &= b == 0;
      }
      if (!trivial)
        throw Error(ErrorCode::kBadValue, "", "weight_zero_point",
                    "non-zero zero points next to a symmetric scheme: the quantization_config "
                    "scheme (symmetric: true) contradicts the tensors");
    }
  } else {
    const Tensor& zp = require_tensor(m, "weight_zero_point");
    const int64_t nw = ceil_div(n, pf);
    expect_dtype(zp, "weight_zero_point", {DType::kI32, DType::kU32});
    expect_shape(zp, "weight_zero_point", {nw, G}, "zero points are [ceil(N/pf), G], packed on N");
    q.zeros.resize(static_cast<size_t>(n * G));
    for (int64_t r = 0; r < nw; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const uint32_t w = wna16::load_u32(zp.data.data() + (r * G + g) * 4);
        for (int f = 0; f < pf && r * pf + f < n; ++f)
          q.zeros[static_cast<size_t>((r * pf + f) * G + g)] =
              static_cast<uint8_t>((w >> (p.bits * f)) & mask);
      }
  }
  q.check_consistent("compressed-tensors");
  return q;
}

TensorMap pack_ct_pack(const QuantParams& p, const QuantTensor& q) {
  q.check_consistent("compressed-tensors");
  if (q.experts != 1)
    throw Error(ErrorCode::kInternal, "", "weight_packed",
                "pack-quantized packs one Linear, got experts=" + std::to_string(q.experts));
  if (q.kind != CodeKind::kUint || q.scale_block_n != 1 ||
      !wna16::is_float_scale_dtype(q.scale_dtype))
    throw Error(ErrorCode::kUnsupported, "", "weight_packed",
                "pack-quantized holds unsigned codes with per-row float scales");
  const int pf = ct_pack_factor(q.bits, "weight_packed");
  const int64_t n = q.n, k = q.k, G = q.groups(), kw = ceil_div(k, pf), nw = ceil_div(n, pf);
  const uint32_t mask = (1u << q.bits) - 1u;
  TensorMap out;

  Tensor wp("weight_packed", DType::kI32, {n, kw});
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < kw; ++c) {
      uint32_t w = 0;
      for (int f = 0; f < pf && c * pf + f < k; ++f) {
        const uint8_t code = q.codes[static_cast<size_t>(r * k + c * pf + f)];
        if (code > mask)
          throw Error(ErrorCode::kBadValue, "", "weight_packed",
                      "code " + std::to_string(code) + " does not fit in " +
                          std::to_string(q.bits) + " bits");
        w |= static_cast<uint32_t>(code) << (q.bits * f);
      }
      wna16::store_u32(wp.data.data() + (r * kw + c) * 4, w);
    }
  out["weight_packed"] = std::move(wp);

  Tensor sc("weight_scale", q.scale_dtype, {n, G});
  sc.data = q.scales;
  out["weight_scale"] = std::move(sc);

  if (!q.symmetric) {
    Tensor zp("weight_zero_point", DType::kI32, {nw, G});
    for (int64_t r = 0; r < nw; ++r)
      for (int64_t g = 0; g < G; ++g) {
        uint32_t w = 0;
        for (int f = 0; f < pf && r * pf + f < n; ++f) {
          const uint8_t z = q.zeros[static_cast<size_t>((r * pf + f) * G + g)];
          if (z > mask)
            throw Error(ErrorCode::kBadValue, "", "weight_zero_point",
                        "zero point " + std::to_string(z) + " does not fit in " +
                            std::to_string(q.bits) + " bits");
          w |= static_cast<uint32_t>(z) << (q.bits * f);
        }
        wna16::store_u32(zp.data.data() + (r * G + g) * 4, w);
      }
    out["weight_zero_point"] = std::move(zp);
  }
  if (!q.g_idx.empty() || p.act_order) {
    std::vector<int32_t> g(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i)
      g[static_cast<size_t>(i)] =
          q.g_idx.empty() ? wna16::trivial_group(i, q.group_size) : q.g_idx[static_cast<size_t>(i)];
    out["weight_g_idx"] = make_tensor("weight_g_idx", DType::kI32, {k}, g);
  }
  out["weight_shape"] = make_tensor("weight_shape", DType::kI64, {2}, std::vector<int64_t>{n, k});
  return out;
}

// ---- int-quantized W8A8 -----------------------------------------------------------------------

std::vector<std::string> ct_int8_required_suffixes(const QuantParams&) {
  return {"weight", "weight_scale"};
}

std::vector<std::string> ct_int8_optional_suffixes(const QuantParams&) {
  // Listed so that a checkpoint with static activation scales reaches unpack and is refused
  // there with a clear message instead of being silently converted as dynamic.
  return {"input_scale", "input_zero_point"};
}

QuantTensor unpack_ct_int8(const QuantParams& p, const TensorMap& m, int64_t n, int64_t k) {
  if (find_tensor(m, "input_scale") || find_tensor(m, "input_zero_point") || !p.dynamic_input)
    throw Error(ErrorCode::kUnsupported, "", "input_scale",
                "static input scales (W8A8 int8 MoE takes dynamic per-token activations only)");
  if (p.bits != 8)
    throw Error(ErrorCode::kUnsupported, "", "weight",
                "int-quantized bits=" + std::to_string(p.bits) + " (only 8)");
  if (!p.symmetric)
    throw Error(ErrorCode::kUnsupported, "", "weight", "asymmetric int-quantized weights");
  if (p.group_size > 0)
    throw Error(ErrorCode::kUnsupported, "", "weight_scale",
                "group_size=" + std::to_string(p.group_size) +
                    " (W8A8 int8 MoE takes channel-wise weight scales only)");
  if (n <= 0 || k <= 0)
    throw Error(ErrorCode::kBadShape, "", "weight",
                "N=" + std::to_string(n) + " K=" + std::to_string(k) + " must be positive");
  QuantSpec encoding;
  encoding.kind = CodeKind::kInt;
  encoding.bits = 8;
  encoding.group_size = -1;
  encoding.symmetric = true;
  QuantTensor q(encoding, 1, n, k);

  const Tensor& w = require_tensor(m, "weight");
  expect_dtype(w, "weight", {DType::kI8});
  expect_shape(w, "weight", {n, k}, "int8 weight is [N, K]");
  q.codes = w.data;

  const Tensor& sc = require_tensor(m, "weight_scale");
  expect_dtype(sc, "weight_scale", {DType::kF32, DType::kBF16, DType::kF16});
  if (sc.shape == Shape{n})
    expect_shape(sc, "weight_scale", {n});
  else
    expect_shape(sc, "weight_scale", {n, 1}, "channel-wise scales");
  wna16::check_finite_scales(sc.data.data(), n, sc.dtype, "weight_scale");
  q.scale_dtype = sc.dtype;
  q.scales = sc.data;
  q.check_consistent("compressed-tensors int8");
  return q;
}

TensorMap pack_ct_int8(const QuantParams&, const QuantTensor& q) {
  q.check_consistent("compressed-tensors int8");
  if (q.experts != 1)
    throw Error(ErrorCode::kInternal, "", "weight",
                "int-quantized packs one Linear, got experts=" + std::to_string(q.experts));
  if (q.kind != CodeKind::kInt || q.bits != 8 || q.groups() != 1 || q.scale_block_n != 1 ||
      !q.g_idx.empty() || !wna16::is_float_scale_dtype(q.scale_dtype))
    throw Error(ErrorCode::kUnsupported, "", "weight",
                "int-quantized holds int8 codes with one float scale per output row");
  TensorMap out;
  Tensor w("weight", DType::kI8, {q.n, q.k});
  w.data = q.codes;
  out["weight"] = std::move(w);
  Tensor sc("weight_scale", q.scale_dtype, {q.n, 1});
  sc.data = q.scales;
  out["weight_scale"] = std::move(sc);
  return out;
}

QuantSpec ct_pack_spec_for(const QuantParams& p) {
  QuantSpec s;
  s.kind = CodeKind::kUint;
  s.bits = p.bits;
  s.group_size = p.group_size;
  s.symmetric = p.symmetric;
  s.scale_dtype = p.dtype;  // compressed-tensors writes scales in the model dtype
  return s;
}

std::pair<int64_t, int64_t> ct_pack_logical_shape(
    const QuantParams& p, const std::map<std::string, TensorView>& by_suffix) {
  const Shape& s = linear_tensor_shape(by_suffix, "weight_packed");  // [N, ceil(K/pf)]
  const int64_t pf = 32 / p.bits;
  auto ws = by_suffix.find("weight_shape");
  if (ws == by_suffix.end()) return {s[0], s[1] * pf};
  // weight_shape holds the true (N, K): K need not be a multiple of the pack factor.
  const TensorView& v = ws->second;
  if ((v.dtype != DType::kI64 && v.dtype != DType::kI32) || v.shape != Shape{2} ||
      v.nbytes != static_cast<uint64_t>(2 * dtype_bits(v.dtype) / 8))
    throw Error(ErrorCode::kBadShape, "", "weight_shape",
                std::string("expected I64/I32 [2] (N, K), got ") + dtype_name(v.dtype) + " " +
                    shape_str(v.shape));
  int64_t nk[2];
  for (int i = 0; i < 2; ++i) {
    if (v.dtype == DType::kI64) {
      std::memcpy(&nk[i], v.data + 8 * i, 8);
    } else {
      int32_t x;
      std::memcpy(&x, v.data + 4 * i, 4);
      nk[i] = x;
    }
  }
  if (nk[0] != s[0] || nk[1] <= 0 || ceil_div(nk[1], pf) != s[1])
    throw Error(ErrorCode::kBadShape, "", "weight_shape",
                "says (" + std::to_string(nk[0]) + ", " + std::to_string(nk[1]) +
                    "), weight_packed is " + shape_str(s));
  return {nk[0], nk[1]};
}

std::vector<QuantParams> ct_pack_param_space() {
  std::vector<QuantParams> out;
  for (int bits : {4, 8})
    for (int64_t g : {int64_t{-1}, int64_t{32}, int64_t{128}})
      for (bool act : {false, true})
        for (DType d : {DType::kBF16, DType::kF16}) {
          if (act && g < 0) continue;
          QuantParams p;
          p.method = QuantMethod::kCtPackQuantized;
          p.bits = bits;
          p.group_size = g;
          p.act_order = act;
          p.actorder = act ? "group" : "";
          p.dtype = d;
          out.push_back(p);
        }
  return out;
}

QuantSpec ct_int8_spec_for(const QuantParams&) {
  QuantSpec s;
  s.kind = CodeKind::kInt;
  s.bits = 8;
  s.group_size = -1;
  s.scale_dtype = DType::kF32;  // a stand-in: unpack keeps each checkpoint tensor's own dtype
  return s;
}

std::vector<std::string> ct_int8_refusals(const QuantParams& p) {
  if (p.dynamic_input) return {};
  return {
      "static input scales are not supported (vLLM's W8A8 int8 MoE needs dynamic per-token "
      "activations)"};
}

std::vector<QuantParams> ct_int8_param_space() {
  QuantParams p;
  p.method = QuantMethod::kCtIntQuantized;
  p.bits = 8;
  p.group_size = -1;
  p.dtype = DType::kBF16;
  return {p};
}

bool ct_pack_has_act_order(const QuantParams& p,
                           const std::map<std::string, TensorView>& by_suffix) {
  return wna16::has_nontrivial_g_idx(p, by_suffix, "weight_g_idx");
}

}  // namespace moepack
