#include "formats/gptq.h"

#include <algorithm>
#include <cstring>

#include "formats/wna16_util.h"

namespace moepack {
namespace {

using wna16::expect_dtype;
using wna16::expect_shape;

int gptq_pack_factor(int bits) {
  // 3-bit GPTQ packs across word boundaries; nothing we target takes it.
  if (bits != 2 && bits != 4 && bits != 8)
    throw Error(ErrorCode::kUnsupported, "", "qweight",
                "GPTQ bits=" + std::to_string(bits) + " (supported: 2, 4, 8)");
  return 32 / bits;
}

int64_t group_count(int64_t k, int64_t group_size) {
  return group_size > 0 ? k / group_size + (k % group_size != 0 ? 1 : 0) : 1;
}

}  // namespace

uint32_t gptq_v1_word_offset(int bits) {
  uint32_t one_per_field = 0;
  for (int f = 0; f < 32 / bits; ++f) one_per_field |= 1u << (bits * f);
  return one_per_field;  // 0x11111111 for 4 bits, 0x01010101 for 8, 0x55555555 for 2
}

std::vector<std::string> gptq_required_suffixes(const QuantParams& p) {
  std::vector<std::string> s = {"qweight", "scales"};
  if (!p.symmetric) s.push_back("qzeros");
  if (p.act_order) s.push_back("g_idx");
  return s;
}

std::vector<std::string> gptq_optional_suffixes(const QuantParams& p) {
  std::vector<std::string> s;
  if (p.symmetric) s.push_back("qzeros");
  if (!p.act_order) s.push_back("g_idx");
  return s;
}

QuantTensor unpack_gptq(const QuantParams& p, const TensorMap& m, int64_t n, int64_t k) {
  const int pf = gptq_pack_factor(p.bits);
  if (n <= 0 || k <= 0)
    throw Error(ErrorCode::kBadShape, "", "qweight",
                "N=" + std::to_string(n) + " K=" + std::to_string(k) + " must be positive");
  if (k % pf != 0)
    throw Error(ErrorCode::kBadShape, "", "qweight",
                "K=" + std::to_string(k) + " is not a multiple of the pack factor " +
                    std::to_string(pf) + " (bits=" + std::to_string(p.bits) + ")");
  if (p.group_size == 0 || p.group_size < -1)
    throw Error(ErrorCode::kBadValue, "", "scales",
                "group_size=" + std::to_string(p.group_size) + " (expected -1 or > 0)");
  const int64_t G = group_count(k, p.group_size);

  QuantTensor q(gptq_spec_for(p), 1, n, k);

  const Tensor& qw = require_tensor(m, "qweight");
  expect_dtype(qw, "qweight", {DType::kI32, DType::kU32});
  expect_shape(qw, "qweight", {k / pf, n}, "GPTQ qweight is [K/pf, N]");
  q.codes.resize(static_cast<size_t>(n * k));
  const uint32_t mask = (1u << p.bits) - 1u;
  // Blocked over columns: the [K/pf, N] -> [N, K] transpose then touches a few dozen cache
  // lines at a time instead of one per column per packed row.
  constexpr int64_t kColBlock = 64;
  for (int64_t c0 = 0; c0 < n; c0 += kColBlock) {
    const int64_t c1 = std::min(n, c0 + kColBlock);
    for (int64_t r = 0; r < k / pf; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const uint32_t w = wna16::load_u32(qw.data.data() + (r * n + c) * 4);
        uint8_t* dst = q.codes.data() + c * k + r * pf;
        for (int f = 0; f < pf; ++f) dst[f] = static_cast<uint8_t>((w >> (p.bits * f)) & mask);
      }
  }

  const Tensor& sc = require_tensor(m, "scales");
  expect_dtype(sc, "scales", {DType::kF16, DType::kBF16, DType::kF32});
  expect_shape(sc, "scales", {G, n},
               "GPTQ scales are [G, N], G = " + std::to_string(G) + " for K = " +
                   std::to_string(k) + " and group_size " + std::to_string(p.group_size));
  wna16::check_finite_scales(sc.data.data(), G * n, sc.dtype, "scales");
  q.scale_dtype = sc.dtype;
  q.scales.resize(sc.data.size());
  wna16::transpose_bytes(sc.data.data(), G, n, q.scale_bytes(), q.scales.data());

  if (const Tensor* gi = find_tensor(m, "g_idx")) {
    q.g_idx = wna16::normalise_g_idx(*gi, "g_idx", k, p.group_size, G);
    // Config and tensors must agree: vLLM ignores g_idx under desc_act=false, so a permuted one
    // would be served as if it were trivial (wrong weights).
    if (!p.act_order && !q.g_idx.empty())
      throw Error(ErrorCode::kBadValue, "", "g_idx",
                  "a permuted (act-order) g_idx, but quantization_config.desc_act is false");
  } else if (p.act_order) {
    throw Error(ErrorCode::kMissingTensor, "", "g_idx", "desc_act=true needs g_idx");
  }

  if (!p.symmetric) {
    const Tensor& qz = require_tensor(m, "qzeros");
    if (n % pf != 0)
      throw Error(
          ErrorCode::kBadShape, "", "qzeros",
          "N=" + std::to_string(n) + " is not a multiple of the pack factor " + std::to_string(pf));
    expect_dtype(qz, "qzeros", {DType::kI32, DType::kU32});
    expect_shape(qz, "qzeros", {G, n / pf}, "GPTQ qzeros are [G, N/pf]");
    q.zeros.resize(static_cast<size_t>(n * G));
    const bool v1 = p.gptq_format == GptqFormat::kV1;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < n / pf; ++c) {
        uint32_t w = wna16::load_u32(qz.data.data() + (g * (n / pf) + c) * 4);
        // v1 words are v2 words minus one per field, subtracted as one int32 (GPTQModel), so
        // a zero of 0 borrows from the next field: add the word back, never field by field.
        if (v1) w += gptq_v1_word_offset(p.bits);
        for (int f = 0; f < pf; ++f)
          q.zeros[static_cast<size_t>((c * pf + f) * G + g)] =
              static_cast<uint8_t>((w >> (p.bits * f)) & mask);
      }
  }
  q.check_consistent("gptq");
  return q;
}

TensorMap pack_gptq(const QuantParams& p, const QuantTensor& q) {
  q.check_consistent("gptq");
  if (q.experts != 1)
    throw Error(ErrorCode::kInternal, "", "qweight",
                "GPTQ packs one Linear, got experts=" + std::to_string(q.experts));
  if (q.kind != CodeKind::kUint || q.scale_block_n != 1 ||
      !wna16::is_float_scale_dtype(q.scale_dtype))
    throw Error(ErrorCode::kUnsupported, "", "qweight",
                "GPTQ holds unsigned integer codes with per-row float scales");
  const int pf = gptq_pack_factor(q.bits);
  const int64_t n = q.n, k = q.k, G = q.groups();
  if (k % pf != 0 || n % pf != 0)
    throw Error(ErrorCode::kBadShape, "", "qweight",
                "N=" + std::to_string(n) + " and K=" + std::to_string(k) +
                    " must be multiples of the pack factor " + std::to_string(pf));
  const uint32_t mask = (1u << q.bits) - 1u;
  TensorMap out;

  Tensor qw("qweight", DType::kI32, {k / pf, n});
  for (int64_t r = 0; r < k / pf; ++r)
    for (int64_t c = 0; c < n; ++c) {
      uint32_t w = 0;
      for (int f = 0; f < pf; ++f) {
        const uint8_t code = q.codes[static_cast<size_t>(c * k + r * pf + f)];
        if (code > mask)
          throw Error(ErrorCode::kBadValue, "", "qweight",
                      "code " + std::to_string(code) + " does not fit in " +
                          std::to_string(q.bits) + " bits");
        w |= static_cast<uint32_t>(code) << (q.bits * f);
      }
      wna16::store_u32(qw.data.data() + (r * n + c) * 4, w);
    }
  out["qweight"] = std::move(qw);

  Tensor sc("scales", q.scale_dtype, {G, n});
  wna16::transpose_bytes(q.scales.data(), n, G, q.scale_bytes(), sc.data.data());
  out["scales"] = std::move(sc);

  // qzeros: the real zeros when asymmetric, else the conventional constant of the format.
  // v1 subtracts one per field as one int32 word, like GPTQModel's v2 -> v1 conversion, so a
  // zero of 0 borrows from the next field and unpack's word addition gives it back.
  Tensor qz("qzeros", DType::kI32, {G, n / pf});
  const bool v1 = p.gptq_format == GptqFormat::kV1;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < n / pf; ++c) {
      uint32_t w = 0;
      for (int f = 0; f < pf; ++f) {
        const int64_t z =
            q.symmetric ? (1 << (q.bits - 1)) : q.zeros[static_cast<size_t>((c * pf + f) * G + g)];
        if (z < 0 || z > mask)
          throw Error(ErrorCode::kBadValue, "", "qzeros",
                      "zero point " + std::to_string(z) + " of column " +
                          std::to_string(c * pf + f) + " does not fit in " +
                          std::to_string(q.bits) + " bits");
        w |= static_cast<uint32_t>(z) << (q.bits * f);
      }
      if (v1) w -= gptq_v1_word_offset(q.bits);
      wna16::store_u32(qz.data.data() + (g * (n / pf) + c) * 4, w);
    }
  out["qzeros"] = std::move(qz);

  // GPTQ checkpoints always carry g_idx; without act-order it is k / group_size.
  std::vector<int32_t> g(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i)
    g[static_cast<size_t>(i)] =
        q.g_idx.empty() ? wna16::trivial_group(i, q.group_size) : q.g_idx[static_cast<size_t>(i)];
  out["g_idx"] = make_tensor("g_idx", DType::kI32, {k}, g);
  return out;
}

GptqFormat detect_gptq_zero_format(const TensorView& qzeros, int bits, bool symmetric,
                                   GptqFormat label) {
  if (!symmetric || qzeros.nbytes < 4 || (bits != 2 && bits != 4 && bits != 8)) return label;
  const int pf = 32 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  const uint32_t v1 = (1u << (bits - 1)) - 1u, v2 = 1u << (bits - 1);
  bool all_v1 = true, all_v2 = true;
  for (uint64_t i = 0; i + 4 <= qzeros.nbytes && (all_v1 || all_v2); i += 4) {
    const uint32_t w = wna16::load_u32(qzeros.data + i);
    for (int f = 0; f < pf; ++f) {
      const uint32_t z = (w >> (bits * f)) & mask;
      all_v1 = all_v1 && z == v1;
      all_v2 = all_v2 && z == v2;
    }
  }
  if (all_v1) return GptqFormat::kV1;
  if (all_v2) return GptqFormat::kV2;
  return label;
}

QuantSpec gptq_spec_for(const QuantParams& p) {
  QuantSpec s;
  s.kind = CodeKind::kUint;
  s.bits = p.bits;
  s.group_size = p.group_size;
  s.symmetric = p.symmetric;
  s.scale_dtype = DType::kF16;  // AutoGPTQ and GPTQModel write fp16 scales
  return s;
}

std::pair<int64_t, int64_t> gptq_logical_shape(const QuantParams& p,
                                               const std::map<std::string, TensorView>& by_suffix) {
  const Shape& s = linear_tensor_shape(by_suffix, "qweight");  // [K/pf, N]
  return {s[1], s[0] * gptq_pack_factor(p.bits)};
}

QuantParams gptq_refine(const QuantParams& p, const std::map<std::string, TensorView>& by_suffix) {
  QuantParams q = p;
  auto it = by_suffix.find("qzeros");
  if (q.symmetric && it != by_suffix.end())
    q.gptq_format = detect_gptq_zero_format(it->second, q.bits, q.symmetric, q.gptq_format);
  return q;
}

std::vector<QuantParams> gptq_param_space() {
  std::vector<QuantParams> out;
  for (int bits : {4, 8})
    for (int64_t g : {int64_t{-1}, int64_t{32}, int64_t{128}})
      for (bool sym : {true, false})
        for (bool act : {false, true})
          for (GptqFormat f : {GptqFormat::kV1, GptqFormat::kV2}) {
            if (act && g < 0) continue;  // one group: act-order permutes nothing
            QuantParams p;
            p.method = QuantMethod::kGptq;
            p.bits = bits;
            p.group_size = g;
            p.symmetric = sym;
            p.act_order = act;
            p.gptq_format = f;
            p.dtype = DType::kF16;
            out.push_back(p);
          }
  return out;
}

bool gptq_has_act_order(const QuantParams& p, const std::map<std::string, TensorView>& by_suffix) {
  return wna16::has_nontrivial_g_idx(p, by_suffix, "g_idx");
}

}  // namespace moepack
