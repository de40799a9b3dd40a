#include "formats/marlin.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "core/threads.h"
#include "formats/fast_unpack.h"
#include "formats/layout/marlin_layout.h"
#include "formats/moe_reader.h"
#include "formats/wna16_util.h"

namespace moepack {
namespace {

using marlin::pack_factor;

std::string num(int64_t v) {
  return std::to_string(v);
}

const char* proj_name(MoeProj p) {
  return p == MoeProj::kW13 ? "w13" : "w2";
}

void check_bits(int bits, const std::string& what) {
  if (bits != 4 && bits != 8)
    throw Error(ErrorCode::kUnsupported, "", what,
                "Marlin takes 4- or 8-bit codes, got bits=" + num(bits));
}

void check_tile_shape(int64_t n, int64_t k, bool a8, const std::string& what) {
  const int tk = marlin::tile_k(a8), tn = marlin::tile_n(a8);
  if (n <= 0 || k <= 0 || k % tk != 0 || n % tn != 0)
    throw Error(ErrorCode::kBadShape, "", what,
                "K=" + num(k) + " N=" + num(n) + ": Marlin" + (a8 ? " a8" : "") +
                    " tiles need K % " + num(tk) + " == 0 and N % " + num(tn) + " == 0");
}

// Source index inside a chunk for the scale permutations, as data (STYLE.md §3).
std::vector<int32_t> scale_perm(bool grouped) {
  const int c = marlin::scale_chunk(grouped);
  std::vector<int32_t> p(static_cast<size_t>(c));
  for (int i = 0; i < c; ++i) p[static_cast<size_t>(i)] = marlin::scale_perm_src(grouped, i);
  return p;
}

std::vector<int32_t> zero_point_perm(int bits, bool a8) {
  std::vector<int32_t> p(64);
  for (int i = 0; i < 64; ++i) p[static_cast<size_t>(i)] = marlin::zero_point_src(bits, a8, i);
  return p;
}

// One scale element in the activation dtype (16-bit): convert_scale's rounding and overflow
// rule (spec §2).
uint16_t scale_to_act(const uint8_t* p, DType from, DType act, const std::string& what) {
  uint16_t h = 0;
  convert_scale(p, from, act, reinterpret_cast<uint8_t*>(&h), what);
  return h;
}

void check_act_dtype(DType act) {
  if (act != DType::kF16 && act != DType::kBF16)
    throw Error(ErrorCode::kUnsupported, "", "scales",
                std::string("Marlin activations are F16 or BF16, got ") + dtype_name(act));
}

// The size_k vLLM passes to marlin_permute_scales for this method and projection (§4.3).
int64_t vllm_scale_size_k(QuantMethod m, MoeProj proj, int64_t group_size, int64_t groups,
                          int64_t intermediate, int64_t w13_n, int bits) {
  const int pf = pack_factor(bits);
  if (proj == MoeProj::kW13) {
    if (m == QuantMethod::kCtPackQuantized) return w13_n * 16 / pf;  // w13_weight_packed.shape[2]
    return intermediate;  // GPTQ and AWQ pass intermediate_size_per_partition
  }
  if (m == QuantMethod::kAwq) return intermediate;
  return groups * (group_size > 0 ? group_size : pf);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

// ---- building blocks ----------------------------------------------------------------------------

namespace {

// The 16-bit-activation tiles written row by row: the word_field_coords map unrolled for a
// whole word, reading the two canonical rows (n = c0 and c0 + 8) it draws from. Same bytes as
// the generic per-field loop (tests compare both with the golden fixtures), several times fewer
// instructions per code; the conversion spends most of its time here.
//   int4 word: fields (k, n) = (b,c0) (b+8,c0) (b,c0+8) (b+8,c0+8) (b+1,c0) (b+9,c0) (b+1,c0+8)
//   (b+9,c0+8) int8 word: fields k = b, b+8, b+1, b+9 of row n = c0 + 8h
void repack_16bit_act(const uint8_t* codes, int64_t n, int64_t k, int bits, const int32_t* perm,
                      uint32_t* out) {
  const int64_t ntiles_n = n / 64;
  const int T = marlin::words_per_tile(bits);
  uint32_t over = 0;  // any code wider than `bits`
  int64_t kx[16];     // source k of each of the tile's 16 rows (act-order gathers them)
  for (int64_t kt = 0; kt < k / 16; ++kt) {
    for (int i = 0; i < 16; ++i) kx[i] = perm ? perm[16 * kt + i] : 16 * kt + i;
    for (int64_t nt = 0; nt < ntiles_n; ++nt) {
      uint32_t* dst = out + (kt * ntiles_n + nt) * T;
      for (int r = 0; r < T; ++r) {
        uint32_t w;
        if (bits == 4) {
          const int t = r >> 2, j = r & 3, b = 2 * (t & 3);
          const uint8_t* A = codes + (64 * nt + 16 * j + (t >> 2)) * k;
          const uint8_t* B = A + 8 * k;
          const uint32_t a0 = A[kx[b]], a8 = A[kx[b + 8]], a1 = A[kx[b + 1]], a9 = A[kx[b + 9]];
          const uint32_t b0 = B[kx[b]], b8 = B[kx[b + 8]], b1 = B[kx[b + 1]], b9 = B[kx[b + 9]];
          over |= a0 | a8 | a1 | a9 | b0 | b8 | b1 | b9;
          w = a0 | a8 << 4 | b0 << 8 | b8 << 12 | a1 << 16 | a9 << 20 | b1 << 24 | b9 << 28;
        } else {
          const int t = r >> 3, j = (r & 7) >> 1, h = r & 1, b = 2 * (t & 3);
          const uint8_t* R = codes + (64 * nt + 16 * j + (t >> 2) + 8 * h) * k;
          w = static_cast<uint32_t>(R[kx[b]]) | static_cast<uint32_t>(R[kx[b + 8]]) << 8 |
              static_cast<uint32_t>(R[kx[b + 1]]) << 16 | static_cast<uint32_t>(R[kx[b + 9]]) << 24;
        }
        dst[r] = w;
      }
    }
  }
  if (bits == 4 && (over & ~0xfu)) {
    for (int64_t i = 0; i < n * k; ++i)
      if (codes[i] > 15)
        throw Error(ErrorCode::kBadValue, "", "qweight",
                    "code " + std::to_string(codes[i]) + " at (n=" + std::to_string(i / k) +
                        ", k=" + std::to_string(i % k) + ") does not fit in 4 bits");
  }
}

}  // namespace

std::vector<uint32_t> marlin_repack(const uint8_t* codes_nk, int64_t n, int64_t k, int bits,
                                    const int32_t* perm, bool a8) {
  check_bits(bits, "qweight");
  check_tile_shape(n, k, a8, "qweight");
  if (a8 && perm)
    throw Error(ErrorCode::kUnsupported, "", "qweight",
                "the 8-bit-activation Marlin tiles have no act-order (perm) variant");
  if (perm)
    for (int64_t i = 0; i < k; ++i)
      if (perm[i] < 0 || perm[i] >= k)
        throw Error(ErrorCode::kBadValue, "", "g_idx_sort_indices",
                    "perm[" + num(i) + "] = " + num(perm[i]) + " outside [0, " + num(k) + ")");
  const int pf = pack_factor(bits), T = marlin::words_per_tile(bits);
  const int64_t ntiles_n = n / marlin::tile_n(a8), ntiles = (k / marlin::tile_k(a8)) * ntiles_n;
  const uint32_t mask = (1u << bits) - 1u;
  std::vector<uint32_t> out(static_cast<size_t>(n * k / pf));
  if (!a8) {
    repack_16bit_act(codes_nk, n, k, bits, perm, out.data());
    return out;
  }
  for (int64_t tau = 0; tau < ntiles; ++tau) {
    const int64_t kt = tau / ntiles_n, nt = tau % ntiles_n;
    for (int r = 0; r < T; ++r) {
      uint32_t w = 0;
      for (int f = 0; f < pf; ++f) {
        int64_t kk, nn;
        marlin::word_field_coords(bits, a8, kt, nt, r, f, &kk, &nn);
        const int64_t src_k = perm ? perm[kk] : kk;
        const uint8_t c = codes_nk[nn * k + src_k];
        if (c > mask)
          throw Error(ErrorCode::kBadValue, "", "qweight",
                      "code " + num(c) + " at (n=" + num(nn) + ", k=" + num(src_k) +
                          ") does not fit in " + num(bits) + " bits");
        w |= static_cast<uint32_t>(c) << (bits * f);
      }
      out[static_cast<size_t>(tau * T + r)] = w;
    }
  }
  return out;
}

std::vector<uint8_t> marlin_unrepack(const uint32_t* words, int64_t n, int64_t k, int bits,
                                     bool a8) {
  check_bits(bits, "qweight");
  check_tile_shape(n, k, a8, "qweight");
  const int T = marlin::words_per_tile(bits), pf = pack_factor(bits);
  const int64_t ntiles_n = n / marlin::tile_n(a8), ntiles = (k / marlin::tile_k(a8)) * ntiles_n;
  const uint32_t mask = (1u << bits) - 1u;
  // Every tile has the same shape: the offset of field f of word r from the tile's first code
  // (tile (0, 0)'s coordinates, n * k + k) is computed once, then each tile is that table shifted
  // by its origin. The same map as word_field_coords, without the per-code arithmetic (verify
  // decodes every code of a model through here).
  std::vector<int64_t> offset(static_cast<size_t>(T * pf));
  for (int r = 0; r < T; ++r)
    for (int f = 0; f < pf; ++f) {
      int64_t kk, nn;
      marlin::word_field_coords(bits, a8, 0, 0, r, f, &kk, &nn);
      offset[static_cast<size_t>(r * pf + f)] = nn * k + kk;
    }
  std::vector<uint8_t> out(static_cast<size_t>(n * k));
  const int64_t tk = marlin::tile_k(a8), tn = marlin::tile_n(a8);
  for (int64_t tau = 0; tau < ntiles; ++tau) {
    const int64_t kt = tau / ntiles_n, nt = tau % ntiles_n;
    uint8_t* origin = out.data() + nt * tn * k + kt * tk;
    const uint32_t* tile = words + tau * T;
    const int64_t* off = offset.data();
    for (int r = 0; r < T; ++r) {
      const uint32_t w = tile[r];
      for (int f = 0; f < pf; ++f, ++off)
        origin[*off] = static_cast<uint8_t>((w >> (bits * f)) & mask);
    }
  }
  return out;
}

MarlinCodeMap marlin_code_map(int bits, bool a8) {
  check_bits(bits, "qweight");
  MarlinCodeMap m;
  m.bits = bits;
  m.a8 = a8;
  m.tile_n = marlin::tile_n(a8);
  m.tile_k = marlin::tile_k(a8);
  m.pack_factor = pack_factor(bits);
  m.words_per_tile = marlin::words_per_tile(bits);
  m.word_field.assign(static_cast<size_t>(m.tile_n * m.tile_k), -1);
  for (int r = 0; r < m.words_per_tile; ++r)
    for (int f = 0; f < m.pack_factor; ++f) {
      int64_t kk, nn;
      marlin::word_field_coords(bits, a8, 0, 0, r, f, &kk, &nn);
      m.word_field[static_cast<size_t>(nn * m.tile_k + kk)] = r * m.pack_factor + f;
    }
  return m;
}

static void permute_chunks(uint8_t* data, int64_t total, int elem_bytes,
                           const std::vector<int32_t>& src, const char* what) {
  const int64_t c = static_cast<int64_t>(src.size());
  if (total % c != 0)
    throw Error(ErrorCode::kBadShape, "", what,
                num(total) + " elements are not a whole number of " + num(c) + "-entry chunks");
  std::vector<uint8_t> tmp(static_cast<size_t>(c * elem_bytes));
  for (int64_t base = 0; base < total; base += c) {
    uint8_t* chunk = data + base * elem_bytes;
    for (int64_t i = 0; i < c; ++i)
      std::memcpy(tmp.data() + i * elem_bytes, chunk + src[static_cast<size_t>(i)] * elem_bytes,
                  static_cast<size_t>(elem_bytes));
    std::memcpy(chunk, tmp.data(), tmp.size());
  }
}

void marlin_permute_scales(uint8_t* data, int64_t rows, int64_t n, int elem_bytes, bool grouped) {
  permute_chunks(data, rows * n, elem_bytes, scale_perm(grouped), "scales");
}

void marlin_unpermute_scales(uint8_t* data, int64_t rows, int64_t n, int elem_bytes, bool grouped) {
  permute_chunks(data, rows * n, elem_bytes, invert_permutation(scale_perm(grouped)), "scales");
}

std::vector<uint32_t> marlin_pack_zero_points(const uint8_t* zp_gn, int64_t g, int64_t n, int bits,
                                              bool a8) {
  check_bits(bits, "qzeros");
  const int pf = pack_factor(bits);
  if ((g * n) % 64 != 0 || n % pf != 0)
    throw Error(ErrorCode::kBadShape, "", "qzeros",
                "G=" + num(g) + " N=" + num(n) + ": zero points need G*N % 64 == 0 and N % " +
                    num(pf) + " == 0");
  const std::vector<int32_t> src = zero_point_perm(bits, a8);
  const uint32_t mask = (1u << bits) - 1u;
  std::vector<uint32_t> out(static_cast<size_t>(g * n / pf), 0u);
  for (int64_t x = 0; x < g * n; ++x) {
    const int64_t from = (x / 64) * 64 + src[static_cast<size_t>(x % 64)];
    const uint8_t z = zp_gn[from];
    if (z > mask)
      throw Error(ErrorCode::kBadValue, "", "qzeros",
                  "zero point " + num(z) + " (group " + num(from / n) + ", column " +
                      num(from % n) + ") does not fit in " + num(bits) + " bits");
    out[static_cast<size_t>(x / pf)] |= static_cast<uint32_t>(z) << (bits * (x % pf));
  }
  return out;
}

std::vector<uint8_t> marlin_unpack_zero_points(const uint32_t* words, int64_t g, int64_t n,
                                               int bits, bool a8) {
  check_bits(bits, "qzeros");
  const int pf = pack_factor(bits);
  if ((g * n) % 64 != 0 || n % pf != 0)
    throw Error(ErrorCode::kBadShape, "", "qzeros",
                "G=" + num(g) + " N=" + num(n) + ": zero points need G*N % 64 == 0 and N % " +
                    num(pf) + " == 0");
  const std::vector<int32_t> src = zero_point_perm(bits, a8);
  const uint32_t mask = (1u << bits) - 1u;
  std::vector<uint8_t> out(static_cast<size_t>(g * n));
  for (int64_t x = 0; x < g * n; ++x)
    out[static_cast<size_t>((x / 64) * 64 + src[static_cast<size_t>(x % 64)])] =
        static_cast<uint8_t>((words[x / pf] >> (bits * (x % pf))) & mask);
  return out;
}

// ---- names and rules
// -----------------------------------------------------------------------------

MarlinParamNames marlin_param_names(QuantMethod m, MoeProj proj) {
  const std::string p = proj_name(proj);
  MarlinParamNames n;
  n.sort_indices = p + "_g_idx_sort_indices";
  if (m == QuantMethod::kCtPackQuantized) {
    n.qweight = p + "_weight_packed";
    n.scales = p + "_weight_scale";
    n.g_idx = p + "_weight_g_idx";
  } else if (m == QuantMethod::kAwq) {
    n.qweight = p + "_qweight";
    n.scales = p + "_scales";
    n.qzeros = p + "_qzeros";
  } else {
    n.qweight = p + "_qweight";
    n.scales = p + "_scales";
    n.g_idx = p + "_g_idx";
  }
  return n;
}

bool marlin_scales_grouped(const LayoutOptions& opts, MoeProj proj, int64_t group_size,
                           int64_t groups, int64_t intermediate, int bits, bool vllm_rule) {
  if (opts.a8) return false;
  if (!vllm_rule) return groups > 1;
  const int64_t w13_n = opts.gated ? 2 * intermediate : intermediate;
  const int64_t size_k =
      vllm_scale_size_k(opts.source_method, proj, group_size, groups, intermediate, w13_n, bits);
  return group_size != -1 && group_size < size_k;
}

std::vector<std::string> marlin_unsupported_reasons(const LayoutOptions& opts, const MoeShape& x) {
  std::vector<std::string> why;
  const QuantMethod m = opts.source_method;
  const bool awq = m == QuantMethod::kAwq;
  if (m != QuantMethod::kGptq && m != QuantMethod::kAwq && m != QuantMethod::kCtPackQuantized)
    why.push_back(std::string("source method ") + quant_method_name(m) +
                  " has no Marlin MoE path (GPTQ, AWQ and compressed-tensors pack-quantized do)");
  if (opts.act_dtype != DType::kF16 && opts.act_dtype != DType::kBF16)
    why.push_back(std::string("activation dtype ") + dtype_name(opts.act_dtype) +
                  " (Marlin takes F16 or BF16)");
  const ProjShape* qs[2] = {&x.w13, &x.w2};
  for (int i = 0; i < 2; ++i) {
    const ProjShape& s = *qs[i];
    const QuantSpec& q = s.quant;
    const std::string p = i == 0 ? "w13" : "w2";
    if (q.kind != CodeKind::kUint) why.push_back(p + ": codes are not unsigned integer codes");
    if (q.bits != 4 && q.bits != 8) why.push_back(p + ": bits=" + num(q.bits) + " (Marlin: 4, 8)");
    if (awq && q.bits != 4) why.push_back(p + ": AWQ on Marlin is 4-bit only, bits=" + num(q.bits));
    if (awq && q.symmetric) why.push_back(p + ": AWQ layout needs explicit zero points");
    if (awq && s.act_order) why.push_back(p + ": AWQ on Marlin has no act-order (g_idx)");
    if (!awq && !q.symmetric)
      why.push_back(p + ": asymmetric " + quant_method_name(m) +
                    " codes (only AWQ may carry zero points on Marlin MoE)");
    if (awq && q.group_size <= 0)
      why.push_back(p + ": AWQ MoE needs a real group size, group_size=" + num(q.group_size));
    if (q.group_size != -1 && q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
      why.push_back(p + ": group_size=" + num(q.group_size) + " (Marlin MoE: -1, 32, 64, 128)");
    if (q.scale_block_n != 1)
      why.push_back(p + ": scales shared by " + num(q.scale_block_n) + " rows");
    if (!wna16::is_float_scale_dtype(q.scale_dtype))
      why.push_back(p + std::string(": scale dtype ") + dtype_name(q.scale_dtype));
    if (opts.a8 && s.act_order)
      why.push_back(p + ": act-order with 8-bit activations (no a8 act-order Marlin variant)");
    if (opts.a8 && s.k % 32 != 0)
      why.push_back(p + ": K=" + num(s.k) + " is not a multiple of 32 (a8 tiles)");
  }
  if (x.w13.quant.bits != x.w2.quant.bits || x.w13.quant.group_size != x.w2.quant.group_size ||
      x.w13.quant.symmetric != x.w2.quant.symmetric)
    why.push_back("w13 and w2 differ in bits/group_size/symmetry (" + num(x.w13.quant.bits) + "/" +
                  num(x.w13.quant.group_size) + " vs " + num(x.w2.quant.bits) + "/" +
                  num(x.w2.quant.group_size) + ")");
  if (x.experts < 1) why.push_back("expert count " + num(x.experts));
  const int64_t H = x.w13.k, I = x.w2.k;
  const int64_t want_n13 = opts.gated ? 2 * I : I;
  if (x.w13.n != want_n13 || x.w2.n != H)
    why.push_back("shapes: w13 [" + num(x.w13.n) + ", " + num(x.w13.k) + "], w2 [" + num(x.w2.n) +
                  ", " + num(x.w2.k) + "] are not " +
                  (opts.gated ? "[2I, H], [H, I]" : "[I, H], [H, I]"));
  if (H % 128 != 0) why.push_back("hidden size H=" + num(H) + " is not a multiple of 128");
  const VllmTargetRow& target = vllm_target_row(opts.vllm_target);
  const int64_t gs = x.w13.quant.group_size;
  if (target.marlin_pads_intermediate) {
    // vLLM pads I up to a Marlin tile; only a group straddling the padded boundary stays out.
    if (I <= 0 || (gs > 0 && I % gs != 0))
      why.push_back("intermediate size I=" + num(I) +
                    " is not a multiple of group_size=" + num(gs) + " (vLLM " + target.name +
                    " pads I to a Marlin tile, but not a group across the boundary)");
  } else {
    const int64_t ig = std::max<int64_t>(64, gs);
    if (I <= 0 || I % ig != 0)
      why.push_back("intermediate size I=" + num(I) + " is not a multiple of max(64, group_size)=" +
                    num(ig) + " (--vllm-target 0.33 pads it as vLLM 0.33 does)");
  }
  if (!target.moe_act_order && (x.w13.act_order || x.w2.act_order))
    why.push_back(std::string("act-order (GPTQ desc_act / compressed-tensors actorder group): ") +
                  target.follows +
                  " no longer takes act-order MoE checkpoints (quantization/utils/gptq_utils.py); "
                  "--vllm-target 2026-05 (vLLM@9aaf83ef) takes them, but no moepack-vllm serves "
                  "that target (the output converts and verifies; nothing here serves it)");
  return why;
}

// Data, not shape: with act-order the kernel (is_k_full) takes row k of the sorted order to be
// in group k / group_size, so each group of every expert's g_idx must hold exactly group_size
// rows.
std::vector<std::string> marlin_g_idx_reasons(const MoeExperts& x) {
  std::vector<std::string> why;
  const QuantTensor* qs[2] = {&x.w13, &x.w2};
  for (int i = 0; i < 2; ++i) {
    const QuantTensor& q = *qs[i];
    if (q.g_idx.empty() || q.group_size <= 0 || q.k % q.group_size != 0) continue;
    if (static_cast<int64_t>(q.g_idx.size()) != q.experts * q.k) continue;
    const int64_t G = q.groups();
    for (int64_t e = 0; e < q.experts; ++e) {
      std::vector<int64_t> count(static_cast<size_t>(G), 0);
      bool in_range = true;
      for (int64_t k = 0; k < q.k; ++k) {
        const int32_t g = q.g_idx[static_cast<size_t>(e * q.k + k)];
        if (g < 0 || g >= G) {
          in_range = false;
          break;
        }
        ++count[static_cast<size_t>(g)];
      }
      if (!in_range) continue;  // reported as kBadValue by pack
      const auto bad =
          std::find_if(count.begin(), count.end(), [&](int64_t c) { return c != q.group_size; });
      if (bad != count.end()) {
        why.push_back(std::string(i == 0 ? "w13" : "w2") + ": g_idx of expert " + num(e) +
                      " puts " + num(*bad) + " rows in group " + num(bad - count.begin()) +
                      " (Marlin act-order needs exactly group_size=" + num(q.group_size) + ")");
        break;
      }
    }
  }
  return why;
}

// ---- pack
// ----------------------------------------------------------------------------------------

namespace {

void pack_projection(const LayoutOptions& opts, const QuantTensor& q, MoeProj proj,
                     int64_t intermediate, std::vector<Tensor>& out) {
  const MarlinParamNames names = marlin_param_names(opts.source_method, proj);
  const std::string& pre = opts.prefix;
  const int64_t E = q.experts, N = q.n, K = q.k, G = q.groups();
  const int bits = q.bits, pf = pack_factor(bits);
  const bool act_order = !q.g_idx.empty();
  const bool grouped = marlin_scales_grouped(opts, proj, q.group_size, G, intermediate, bits,
                                             opts.vllm_w13_scale_size_k);
  const int src_eb = q.scale_bytes();

  Tensor qweight(pre + names.qweight, DType::kI32, {E, K / 16, N * 16 / pf});
  Tensor scales(pre + names.scales, opts.act_dtype, {E, G, N});
  Tensor qzeros;
  if (!names.qzeros.empty()) qzeros = Tensor(pre + names.qzeros, DType::kI32, {E, G, N / pf});
  const int64_t gk = act_order ? K : 0;
  // A target without MoE act-order has no g_idx or sort-index parameters at all.
  const bool index_params = vllm_target_row(opts.vllm_target).moe_act_order;
  Tensor g_idx;
  if (!names.g_idx.empty() && index_params) g_idx = Tensor(pre + names.g_idx, DType::kI32, {E, gk});
  Tensor sort(pre + names.sort_indices, DType::kI32, {E, index_params ? gk : 0});

  const int64_t words_per_expert = K * N / pf;
  parallel_for(E, opts.threads, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      std::vector<int32_t> perm;
      if (act_order) {
        const int32_t* gi = q.g_idx.data() + e * K;
        for (int64_t k = 0; k < K; ++k)
          if (gi[k] < 0 || gi[k] >= G)
            throw Error(ErrorCode::kBadValue, "",
                        pre + (names.g_idx.empty() ? names.sort_indices : names.g_idx),
                        "expert " + num(e) + ": g_idx[" + num(k) + "] = " + num(gi[k]) +
                            " outside [0, " + num(G) + ")");
        // Stable: matches torch.argsort on CUDA, which vLLM's GPU loading uses (spec §6).
        perm = stable_argsort(gi, K);
        int32_t* sorted_out = g_idx.data.empty() ? nullptr : g_idx.as<int32_t>() + e * K;
        for (int64_t k = 0; k < K; ++k) {
          sort.as<int32_t>()[e * K + k] = perm[static_cast<size_t>(k)];
          if (sorted_out) sorted_out[k] = gi[perm[static_cast<size_t>(k)]];
        }
      }
      const std::vector<uint32_t> words = marlin_repack(q.codes.data() + e * N * K, N, K, bits,
                                                        act_order ? perm.data() : nullptr, opts.a8);
      std::memcpy(qweight.data.data() + e * words_per_expert * 4, words.data(), words.size() * 4);

      // Scales: canonical [N, G] -> [G, N] in the activation dtype, then permuted.
      uint16_t* s = scales.as<uint16_t>() + e * G * N;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < G; ++g)
          s[g * N + n] = scale_to_act(q.scales.data() + ((e * N + n) * G + g) * src_eb,
                                      q.scale_dtype, opts.act_dtype, pre + names.scales);
      marlin_permute_scales(reinterpret_cast<uint8_t*>(s), G, N, 2, grouped);

      if (!names.qzeros.empty()) {
        std::vector<uint8_t> zp(static_cast<size_t>(G * N));
        for (int64_t n = 0; n < N; ++n)
          for (int64_t g = 0; g < G; ++g)
            zp[static_cast<size_t>(g * N + n)] = q.zeros[static_cast<size_t>((e * N + n) * G + g)];
        const std::vector<uint32_t> zw = marlin_pack_zero_points(zp.data(), G, N, bits, opts.a8);
        std::memcpy(qzeros.data.data() + e * G * (N / pf) * 4, zw.data(), zw.size() * 4);
      }
    }
  });
  out.push_back(std::move(qweight));
  out.push_back(std::move(scales));
  if (!names.qzeros.empty()) out.push_back(std::move(qzeros));
  if (!names.g_idx.empty() && index_params) out.push_back(std::move(g_idx));
  if (index_params) out.push_back(std::move(sort));
}

// The layer with its intermediate size zero-padded to `ip` as vLLM 0.33 pads it before the
// repack (_pad_w13_shard_cols / _pad_rows): each gate/up shard of w13 gets ip - I zero rows,
// w2 gets ip - I zero K columns and zero scale / zero-point groups. No act-order (the padding
// target takes none).
MoeExperts pad_intermediate(const MoeExperts& x, int64_t ip, bool gated) {
  const int64_t E = x.w13.experts, H = x.w13.k, I = x.w2.k, shards = gated ? 2 : 1;
  if (!x.w13.g_idx.empty() || !x.w2.g_idx.empty())
    throw Error(ErrorCode::kInternal, "", "w13", "padding an act-order layer");
  MoeExperts p;
  p.w13 = QuantTensor(x.w13.spec(), E, shards * ip, H);
  p.w2 = QuantTensor(x.w2.spec(), E, H, ip);
  const int64_t G13 = x.w13.groups(), sb13 = x.w13.scale_bytes();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t s = 0; s < shards; ++s)
      for (int64_t r = 0; r < I; ++r) {
        const int64_t from = e * shards * I + s * I + r, to = e * shards * ip + s * ip + r;
        std::memcpy(&p.w13.codes[to * H], &x.w13.codes[from * H], static_cast<size_t>(H));
        std::memcpy(&p.w13.scales[to * G13 * sb13], &x.w13.scales[from * G13 * sb13],
                    static_cast<size_t>(G13 * sb13));
        if (!x.w13.symmetric)
          std::memcpy(&p.w13.zeros[to * G13], &x.w13.zeros[from * G13], static_cast<size_t>(G13));
      }
  const int64_t G2 = x.w2.groups(), G2p = p.w2.groups(), sb2 = x.w2.scale_bytes();
  for (int64_t row = 0; row < E * H; ++row) {
    std::memcpy(&p.w2.codes[row * ip], &x.w2.codes[row * I], static_cast<size_t>(I));
    std::memcpy(&p.w2.scales[row * G2p * sb2], &x.w2.scales[row * G2 * sb2],
                static_cast<size_t>(G2 * sb2));
    if (!x.w2.symmetric)
      std::memcpy(&p.w2.zeros[row * G2p], &x.w2.zeros[row * G2], static_cast<size_t>(G2));
  }
  return p;
}

// Inverse of pad_intermediate: the real I back, after checking that every padded code, scale and
// zero point is zero (anything else would reach the MoE output through w13's padded channels).
MoeExperts crop_intermediate(const LayoutOptions& opts, MoeExperts p, int64_t inter) {
  const int64_t E = p.w13.experts, H = p.w13.k, ip = p.w2.k, I = inter;
  const int64_t shards = opts.gated ? 2 : 1;
  const int64_t G13 = p.w13.groups(), sb13 = p.w13.scale_bytes();
  QuantSpec s2 = p.w2.spec();
  MoeExperts x;
  x.w13 = QuantTensor(p.w13.spec(), E, shards * I, H);
  x.w2 = QuantTensor(s2, E, H, I);
  const int64_t G2 = x.w2.groups(), G2p = p.w2.groups(), sb2 = p.w2.scale_bytes();
  const auto nonzero = [](const uint8_t* b, int64_t n) {
    return std::any_of(b, b + n, [](uint8_t v) { return v != 0; });
  };
  const auto padding_error = [&](const std::string& what, int64_t e) {
    throw Error(ErrorCode::kBadValue, "", opts.prefix + what,
                "expert " + num(e) + ": the intermediate padding " + num(I) + ".." + num(ip) +
                    " is not zero (vLLM pads with zero codes, scales and zero points)");
  };
  for (int64_t e = 0; e < E; ++e)
    for (int64_t s = 0; s < shards; ++s)
      for (int64_t r = 0; r < ip; ++r) {
        const int64_t from = e * shards * ip + s * ip + r;
        if (r >= I) {
          if (nonzero(&p.w13.codes[from * H], H) ||
              nonzero(&p.w13.scales[from * G13 * sb13], G13 * sb13) ||
              (!p.w13.symmetric && nonzero(&p.w13.zeros[from * G13], G13)))
            padding_error("w13", e);
          continue;
        }
        const int64_t to = e * shards * I + s * I + r;
        std::memcpy(&x.w13.codes[to * H], &p.w13.codes[from * H], static_cast<size_t>(H));
        std::memcpy(&x.w13.scales[to * G13 * sb13], &p.w13.scales[from * G13 * sb13],
                    static_cast<size_t>(G13 * sb13));
        if (!p.w13.symmetric)
          std::memcpy(&x.w13.zeros[to * G13], &p.w13.zeros[from * G13], static_cast<size_t>(G13));
      }
  for (int64_t row = 0; row < E * H; ++row) {
    const uint8_t* codes = &p.w2.codes[row * ip];
    // Channelwise w2 keeps its one group: the padded K rows share it and hold code 0.
    if (nonzero(codes + I, ip - I) ||
        nonzero(&p.w2.scales[(row * G2p + G2) * sb2], (G2p - G2) * sb2) ||
        (!p.w2.symmetric && nonzero(&p.w2.zeros[row * G2p + G2], G2p - G2)))
      padding_error("w2", row / H);
    std::memcpy(&x.w2.codes[row * I], codes, static_cast<size_t>(I));
    std::memcpy(&x.w2.scales[row * G2 * sb2], &p.w2.scales[row * G2p * sb2],
                static_cast<size_t>(G2 * sb2));
    if (!p.w2.symmetric)
      std::memcpy(&x.w2.zeros[row * G2], &p.w2.zeros[row * G2p], static_cast<size_t>(G2));
  }
  return x;
}

}  // namespace

std::vector<Tensor> pack_marlin_moe(const LayoutOptions& opts, const MoeExperts& x) {
  x.w13.check_consistent("w13");
  x.w2.check_consistent("w2");
  std::vector<std::string> why = marlin_unsupported_reasons(opts, moe_shape_of(x));
  for (auto& r : marlin_g_idx_reasons(x)) why.push_back(std::move(r));
  if (!why.empty()) {
    std::string msg;
    for (const auto& w : why) msg += (msg.empty() ? "" : "; ") + w;
    throw Error(ErrorCode::kUnsupported, "", opts.prefix + "w13", "Marlin MoE: " + msg);
  }
  std::vector<Tensor> out;
  const int64_t I = x.w2.k, ip = marlin_padded_inter(opts, moe_shape_of(x));
  // The scale rule's size_k is the real I (vLLM passes intermediate_size_per_partition).
  if (ip != I) {
    const MoeExperts padded = pad_intermediate(x, ip, opts.gated);
    pack_projection(opts, padded.w13, MoeProj::kW13, I, out);
    pack_projection(opts, padded.w2, MoeProj::kW2, I, out);
    return out;
  }
  pack_projection(opts, x.w13, MoeProj::kW13, I, out);
  pack_projection(opts, x.w2, MoeProj::kW2, I, out);
  return out;
}

// ---- unpack / matmul shared reading ----------------------------------------------------------

namespace {

// The parameters of one projection as the kernel sees them, validated.
struct ProjView {
  MarlinParamNames names;
  const Tensor* qweight = nullptr;
  const Tensor* scales = nullptr;
  const Tensor* qzeros = nullptr;  // AWQ only
  const Tensor* g_idx = nullptr;   // sorted; null for AWQ
  const Tensor* sort = nullptr;
  int64_t E = 0, K = 0, N = 0, G = 0;
  int bits = 4;
  bool act_order = false;
};

// Reads both projections' parameters and the geometry they imply (H, I, bits, group size).
struct LayerView {
  ProjView p[2];
  int64_t H = 0, I = 0, group_size = -1;
  int bits = 4;
};

LayerView read_layer(const LayoutOptions& opts, const TensorMap& params) {
  check_act_dtype(opts.act_dtype);
  LayerView L;
  const QuantMethod m = opts.source_method;
  if (m != QuantMethod::kGptq && m != QuantMethod::kAwq && m != QuantMethod::kCtPackQuantized)
    throw Error(ErrorCode::kUnsupported, "", opts.prefix + "w13",
                std::string("no Marlin MoE parameters for source method ") + quant_method_name(m));
  const bool index_params = vllm_target_row(opts.vllm_target).moe_act_order;
  for (int i = 0; i < 2; ++i) {
    ProjView& v = L.p[i];
    v.names = marlin_param_names(m, i == 0 ? MoeProj::kW13 : MoeProj::kW2);
    v.qweight = &require_tensor(params, opts.prefix + v.names.qweight);
    v.scales = &require_tensor(params, opts.prefix + v.names.scales);
    if (index_params) v.sort = &require_tensor(params, opts.prefix + v.names.sort_indices);
    if (!v.names.qzeros.empty()) v.qzeros = &require_tensor(params, opts.prefix + v.names.qzeros);
    if (!v.names.g_idx.empty() && index_params)
      v.g_idx = &require_tensor(params, opts.prefix + v.names.g_idx);
    const std::string qn = opts.prefix + v.names.qweight;
    wna16::expect_dtype(*v.qweight, qn, {DType::kI32});
    if (v.qweight->shape.size() != 3)
      throw Error(ErrorCode::kBadShape, "", qn,
                  "shape " + shape_str(v.qweight->shape) + ", expected [E, K/16, N*16/pf]");
    const std::string sn = opts.prefix + v.names.scales;
    if (v.scales->dtype != opts.act_dtype)
      throw Error(ErrorCode::kBadDtype, "", sn,
                  std::string("dtype ") + dtype_name(v.scales->dtype) +
                      ", the kernel reads scales as the activation dtype " +
                      dtype_name(opts.act_dtype));
    if (v.scales->shape.size() != 3)
      throw Error(ErrorCode::kBadShape, "", sn,
                  "shape " + shape_str(v.scales->shape) + ", expected [E, G, N]");
    v.E = v.qweight->shape[0];
    v.K = v.qweight->shape[1] * 16;
    v.G = v.scales->shape[1];
    v.N = v.scales->shape[2];
  }
  ProjView &w13 = L.p[0], &w2 = L.p[1];
  L.H = w13.K;
  L.I = w2.K;
  const int64_t x2 = w2.qweight->shape[2];
  if (x2 <= 0 || (16 * w2.N) % x2 != 0 || (16 * w2.N / x2 != 8 && 16 * w2.N / x2 != 4))
    throw Error(ErrorCode::kBadShape, "", opts.prefix + w2.names.qweight,
                "shape " + shape_str(w2.qweight->shape) + " with N=" + num(w2.N) +
                    " implies no 4- or 8-bit packing");
  L.bits = 32 / static_cast<int>(16 * w2.N / x2);
  const int pf = pack_factor(L.bits);
  w13.bits = w2.bits = L.bits;
  if (w2.N != L.H || w13.N != (opts.gated ? 2 * L.I : L.I))
    throw Error(ErrorCode::kBadShape, "", opts.prefix + w13.names.scales,
                "w13 N=" + num(w13.N) + ", w2 N=" + num(w2.N) + " do not match H=" + num(L.H) +
                    ", I=" + num(L.I) + (opts.gated ? " (gated: w13 N = 2I)" : ""));
  // Group size from the scale counts; a layer where every projection has one group reads back
  // as channelwise (-1), which dequantises identically.
  if (w13.G > 1)
    L.group_size = L.H / w13.G;
  else if (w2.G > 1)
    L.group_size = L.I / w2.G;
  for (int i = 0; i < 2; ++i) {
    ProjView& v = L.p[i];
    const std::string qn = opts.prefix + v.names.qweight;
    const int64_t want_g = L.group_size > 0 ? ceil_div(v.K, L.group_size) : 1;
    if (v.G != want_g || v.G < 1)
      throw Error(ErrorCode::kBadShape, "", opts.prefix + v.names.scales,
                  "G=" + num(v.G) + " groups over K=" + num(v.K) + ", expected " + num(want_g) +
                      " (group_size " + num(L.group_size) + ")");
    wna16::expect_shape(*v.qweight, qn, {L.p[0].E, v.K / 16, v.N * 16 / pf});
    wna16::expect_shape(*v.scales, opts.prefix + v.names.scales, {v.E, v.G, v.N});
    if (v.qzeros) {
      wna16::expect_dtype(*v.qzeros, opts.prefix + v.names.qzeros, {DType::kI32});
      wna16::expect_shape(*v.qzeros, opts.prefix + v.names.qzeros, {v.E, v.G, v.N / pf});
    }
    check_tile_shape(v.N, v.K, opts.a8, qn);
    if (!v.sort) continue;  // the target has no act-order parameters
    const std::string on = opts.prefix + v.names.sort_indices;
    wna16::expect_dtype(*v.sort, on, {DType::kI32});
    if (v.sort->shape.size() != 2 || v.sort->shape[0] != v.E ||
        (v.sort->shape[1] != 0 && v.sort->shape[1] != v.K))
      throw Error(ErrorCode::kBadShape, "", on,
                  "shape " + shape_str(v.sort->shape) + ", expected [E, K] or [E, 0]");
    v.act_order = v.sort->shape[1] == v.K;
    if (v.g_idx) {
      const std::string gn = opts.prefix + v.names.g_idx;
      wna16::expect_dtype(*v.g_idx, gn, {DType::kI32});
      wna16::expect_shape(*v.g_idx, gn, {v.E, v.act_order ? v.K : 0},
                          "g_idx and sort indices come together");
    } else if (v.act_order) {
      throw Error(ErrorCode::kBadShape, "", on, "AWQ Marlin parameters have no act-order");
    }
  }
  if (opts.inter > 0 && opts.inter != L.I &&
      (opts.inter > L.I || marlin_padded_intermediate(opts.inter, L.group_size) != L.I ||
       !vllm_target_row(opts.vllm_target).marlin_pads_intermediate))
    throw Error(ErrorCode::kBadShape, "", opts.prefix + w2.names.qweight,
                "parameters carry I=" + num(L.I) + ", which is not how --vllm-target " +
                    vllm_target_name(opts.vllm_target) + " pads the layer's I=" + num(opts.inter));
  return L;
}

// The act-order sort indices of one expert, checked to be a permutation.
std::vector<int32_t> read_sort(const ProjView& v, int64_t e, const std::string& name) {
  std::vector<int32_t> s(v.sort->as<int32_t>() + e * v.K, v.sort->as<int32_t>() + (e + 1) * v.K);
  try {
    invert_permutation(s);
  } catch (const Error& err) {
    throw Error(ErrorCode::kBadValue, "", name, "expert " + num(e) + ": " + err.message());
  }
  return s;
}

}  // namespace

MarlinLayerView marlin_read_layer(const LayoutOptions& opts, const TensorMap& params) {
  const LayerView L = read_layer(opts, params);
  MarlinLayerView out;
  out.experts = L.p[0].E;
  out.hidden = L.H;
  out.inter = L.I;
  out.group_size = L.group_size;
  out.bits = L.bits;
  for (int i = 0; i < 2; ++i) {
    const ProjView& v = L.p[i];
    MarlinLayerView::Proj& p = out.proj[i];
    p.names = v.names;
    p.n = v.N;
    p.k = v.K;
    p.groups = v.G;
    p.act_order = v.act_order;
    p.zero_points = v.qzeros != nullptr;
    if (!v.act_order) continue;
    for (int64_t e = 0; e < v.E; ++e) {
      read_sort(v, e, opts.prefix + v.names.sort_indices);
      const int32_t* gs = v.g_idx->as<int32_t>() + e * v.K;
      for (int64_t k = 0; k < v.K; ++k)
        if (gs[k] < 0 || gs[k] >= v.G)
          throw Error(ErrorCode::kBadValue, "", opts.prefix + v.names.g_idx,
                      "g_idx[" + num(k) + "] = " + num(gs[k]) + " outside [0, " + num(v.G) + ")");
    }
  }
  return out;
}

reader::ActQuant marlin_act_quant(const LayoutOptions& lo) {
  return act_quant_16bit(lo);
}

reader::ProjReader marlin_make_reader(const LayoutOptions& lo, const TensorMap& params,
                                      MoeProj proj, const ParamLocator& locate) {
  const MarlinLayerView L = marlin_read_layer(lo, params);
  const MarlinLayerView::Proj& v = L.proj[proj == MoeProj::kW13 ? 0 : 1];
  const int64_t shards = lo.gated ? 2 : 1;
  // The real I when the target padded it (read_layer accepted lo.inter as its padding).
  const int64_t I = lo.inter > 0 && lo.inter < L.inter ? lo.inter : L.inter;
  const std::string& pre = lo.prefix;
  reader::ProjReader r = blank_reader(reader::Kind::kMarlin, marlin_act_quant(lo));
  r.experts = L.experts;
  r.n = proj == MoeProj::kW13 ? shards * I : L.hidden;
  r.k = proj == MoeProj::kW13 ? L.hidden : I;
  reader::MarlinParams& m = r.marlin;
  m.qweight = static_cast<const uint32_t*>(locate_param(locate, params, pre + v.names.qweight));
  m.scales = static_cast<const uint16_t*>(locate_param(locate, params, pre + v.names.scales));
  if (v.zero_points)
    m.qzeros = static_cast<const uint32_t*>(locate_param(locate, params, pre + v.names.qzeros));
  if (v.act_order) {
    m.g_idx = static_cast<const int32_t*>(locate_param(locate, params, pre + v.names.g_idx));
    m.sort_indices =
        static_cast<const int32_t*>(locate_param(locate, params, pre + v.names.sort_indices));
  }
  m.bits = L.bits;
  m.a8 = lo.a8 ? 1 : 0;
  m.scale_type = lo.act_dtype == DType::kBF16 ? reader::kScaleBf16 : reader::kScaleF16;
  // The kernel's rule (ops.cu: grouped iff more than one group and 16-bit activations), whatever
  // rule the loader used -- so a loader that permuted differently reads wrong here, as it would
  // in the kernel.
  m.grouped_scales = !lo.a8 && v.groups > 1 ? 1 : 0;
  m.padded_w13 = proj == MoeProj::kW13 && I != L.inter ? 1 : 0;
  m.kp = v.k;
  m.np = v.n;
  m.groups = v.groups;
  m.group_size = L.group_size > 0 && v.groups > 1 ? L.group_size : 0;
  m.inter = I;
  m.padded_inter = L.inter;
  m.tiles_n = v.n / marlin::tile_n(lo.a8);
  m.words_per_expert = v.k * v.n / pack_factor(L.bits);
  return r;
}

namespace {

// One expert of one projection, the scalar definition: the tiles through the per-code map
// (marlin_unrepack), the act-order rows put back code by code, scales and zero points through
// the generic chunk permutations. `q` is allocated; `grouped`: the scale permutation.
void unpack_expert_scalar(const LayoutOptions& opts, const ProjView& v, int bits, bool grouped,
                          int64_t e, QuantTensor& q) {
  const int64_t N = v.N, K = v.K, G = v.G;
  const int pf = pack_factor(bits);
  // Empty codes: everything but the codes (unpack_marlin_moe_without_codes).
  const bool with_codes = !q.codes.empty();
  const std::vector<uint8_t> qp =
      with_codes
          ? marlin_unrepack(v.qweight->as<uint32_t>() + e * (K * N / pf), N, K, bits, opts.a8)
          : std::vector<uint8_t>{};
  uint8_t* codes = with_codes ? q.codes.data() + e * N * K : nullptr;
  if (v.act_order) {
    const std::vector<int32_t> s = read_sort(v, e, opts.prefix + v.names.sort_indices);
    const int32_t* gs = v.g_idx->as<int32_t>() + e * K;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t src = s[static_cast<size_t>(k)];
      q.g_idx[static_cast<size_t>(e * K + src)] = gs[k];
      if (!with_codes) continue;
      for (int64_t n = 0; n < N; ++n) codes[n * K + src] = qp[static_cast<size_t>(n * K + k)];
    }
  } else if (with_codes) {
    std::memcpy(codes, qp.data(), qp.size());
  }
  std::vector<uint8_t> s(v.scales->data.begin() + e * G * N * 2,
                         v.scales->data.begin() + (e + 1) * G * N * 2);
  marlin_unpermute_scales(s.data(), G, N, 2, grouped);
  wna16::transpose_bytes(s.data(), G, N, 2, q.scales.data() + e * N * G * 2);
  if (v.qzeros) {
    const std::vector<uint8_t> zp =
        marlin_unpack_zero_points(v.qzeros->as<uint32_t>() + e * G * (N / pf), G, N, bits, opts.a8);
    wna16::transpose_bytes(zp.data(), G, N, 1, q.zeros.data() + e * N * G);
  }
}

// The same bytes and errors through formats/fast_unpack.h (16-bit-activation tiles): the codes
// decoded straight into q, the sort indices checked first as the scalar path checks them.
// `scratch`: the calling thread's buffer for act-order rows.
void unpack_expert_fast(const LayoutOptions& opts, const ProjView& v, int bits, bool grouped,
                        int64_t e, QuantTensor& q, std::vector<uint8_t>& scratch) {
  const int64_t N = v.N, K = v.K, G = v.G;
  const int pf = pack_factor(bits);
  const uint32_t* words = v.qweight->as<uint32_t>() + e * (K * N / pf);
  uint8_t* codes = q.codes.data() + e * N * K;
  if (v.act_order) {
    const std::vector<int32_t> s = read_sort(v, e, opts.prefix + v.names.sort_indices);
    const int32_t* gs = v.g_idx->as<int32_t>() + e * K;
    for (int64_t k = 0; k < K; ++k)
      q.g_idx[static_cast<size_t>(e * K + s[static_cast<size_t>(k)])] = gs[k];
    scratch.resize(static_cast<size_t>(N * K));
    marlin_unrepack_sorted_fast(words, N, K, bits, s.data(), scratch.data(), codes);
  } else {
    marlin_unrepack_fast(words, N, K, bits, codes);
  }
  marlin_unpermute_transpose_scales(v.scales->as<uint16_t>() + e * G * N, G, N, grouped,
                                    reinterpret_cast<uint16_t*>(q.scales.data()) + e * N * G);
  if (v.qzeros)
    marlin_unpack_zero_points_transposed(v.qzeros->as<uint32_t>() + e * G * (N / pf), G, N, bits,
                                         opts.a8, q.zeros.data() + e * N * G);
}

// Every parameter decoded, padding included; `rule_inter` is the I the scale rule was given.
// fast: the word-at-a-time decode where it applies (unpack_expert_fast), else the scalar one.
// One parallel loop over (projection, expert), w13's experts first: a failing expert stops its
// thread's range and the lowest failing item is reported, as projection by projection.
// codes = false: QuantTensor::codes left empty (unpack_marlin_moe_without_codes), through the
// scalar per-expert decode, which skips them.
MoeExperts unpack_padded(const LayoutOptions& opts, const LayerView& L, int64_t rule_inter,
                         bool fast, bool codes = true) {
  MoeExperts out;
  QuantTensor* qs[2] = {&out.w13, &out.w2};
  bool grouped[2];
  for (int i = 0; i < 2; ++i) {
    const ProjView& v = L.p[i];
    const MoeProj proj = i == 0 ? MoeProj::kW13 : MoeProj::kW2;
    QuantTensor& q = *qs[i];
    q.experts = v.E;
    q.n = v.N;
    q.k = v.K;
    q.kind = CodeKind::kUint;
    q.bits = L.bits;
    q.group_size = L.group_size;
    q.scale_block_n = 1;
    q.symmetric = v.qzeros == nullptr;
    q.scale_dtype = opts.act_dtype;
    const int64_t E = v.E, N = v.N, K = v.K, G = v.G;
    if (codes) q.codes.resize(static_cast<size_t>(E * N * K));
    q.scales.resize(static_cast<size_t>(E * N * G * 2));
    if (!q.symmetric) q.zeros.resize(static_cast<size_t>(E * N * G));
    if (v.act_order) q.g_idx.resize(static_cast<size_t>(E * K));
    grouped[i] = marlin_scales_grouped(opts, proj, L.group_size, G, rule_inter, L.bits,
                                       opts.vllm_w13_scale_size_k);
  }
  const bool take_fast = codes && fast && marlin_unrepack_fast_applies(L.bits, opts.a8);
  const int64_t E = L.p[0].E;
  parallel_for(2 * E, opts.threads, [&](int64_t i0, int64_t i1) {
    std::vector<uint8_t> scratch;
    for (int64_t i = i0; i < i1; ++i) {
      const int p = i < E ? 0 : 1;
      const int64_t e = i - p * E;
      if (take_fast)
        unpack_expert_fast(opts, L.p[p], L.bits, grouped[p], e, *qs[p], scratch);
      else
        unpack_expert_scalar(opts, L.p[p], L.bits, grouped[p], e, *qs[p]);
    }
  });
  return out;
}

MoeExperts unpack_marlin(const LayoutOptions& opts, const TensorMap& params, bool fast) {
  const LayerView L = read_layer(opts, params);
  if (opts.inter > 0 && opts.inter < L.I)
    return crop_intermediate(opts, unpack_padded(opts, L, opts.inter, fast), opts.inter);
  return unpack_padded(opts, L, L.I, fast);
}

}  // namespace

MoeExperts unpack_marlin_moe(const LayoutOptions& opts, const TensorMap& params) {
  return unpack_marlin(opts, params, true);
}

MoeExperts unpack_marlin_moe_scalar(const LayoutOptions& opts, const TensorMap& params) {
  return unpack_marlin(opts, params, false);
}

bool marlin_without_codes_reads_codes(const LayoutOptions& opts, const Shape& w2_qweight_shape) {
  const int64_t param_inter = w2_qweight_shape.size() == 3 ? w2_qweight_shape[1] * 16 : 0;
  return opts.inter > 0 && opts.inter < param_inter;
}

MoeExperts unpack_marlin_moe_without_codes(const LayoutOptions& opts, const TensorMap& params) {
  const LayerView L = read_layer(opts, params);
  // Cropping vLLM 0.33's padded I reads the codes: decoded as unpack_marlin_moe decodes them.
  if (marlin_without_codes_reads_codes(opts, L.p[1].qweight->shape))
    return crop_intermediate(opts, unpack_padded(opts, L, opts.inter, true), opts.inter);
  return unpack_padded(opts, L, L.I, false, false);
}

// ---- deviations
// ----------------------------------------------------------------------------------

std::vector<std::string> marlin_deviations_from_vllm(const LayoutOptions& opts, const MoeShape& x) {
  std::vector<std::string> dev;
  const QuantMethod m = opts.source_method;
  const ProjShape* qs[2] = {&x.w13, &x.w2};
  const int64_t I = x.inter();
  for (int i = 0; i < 2; ++i) {
    const ProjShape& s = *qs[i];
    const QuantSpec& q = s.quant;
    const MoeProj proj = i == 0 ? MoeProj::kW13 : MoeProj::kW2;
    const std::string p = proj_name(proj);
    if (m == QuantMethod::kGptq && s.act_order)
      dev.push_back(p +
                    "_g_idx: moepack stores the sorted g_idx (what the kernel reads when "
                    "is_k_full is false); vLLM@9aaf83ef _process_weights_marlin returns the "
                    "unsorted checkpoint g_idx (int_wna16.py L290 vs L372, since PR #37990)");
    const int64_t G = q.groups(s.k);
    const bool kernel = marlin_scales_grouped(opts, proj, q.group_size, G, I, q.bits, false);
    const bool vllm = marlin_scales_grouped(opts, proj, q.group_size, G, I, q.bits, true);
    if (kernel != vllm && !opts.vllm_w13_scale_size_k) {
      const int64_t w13_n = opts.gated ? 2 * I : I;
      dev.push_back(
          p + "_scales: moepack uses the " + (kernel ? "grouped (64)" : "single (32)") +
          " scale permutation the kernel expects for G=" + num(G) + " groups over K=" + num(s.k) +
          " (group_size " + num(q.group_size) + "); vLLM's loader passes size_k=" +
          num(vllm_scale_size_k(m, proj, q.group_size, G, I, w13_n, q.bits)) + " and picks the " +
          (vllm ? "grouped (64)" : "single (32)") + " one (spec §4.3, upstream PR #50196)");
    }
  }
  if (m == QuantMethod::kGptq && x.w13.quant.bits == 8)
    dev.push_back(
        "GPTQ int8 on Marlin MoE appears broken in vLLM@9aaf83ef "
        "(gptq_marlin_moe_quant_config(weight_bits=8) gives use_int8_w8a16, which "
        "MarlinExpertsBase rejects); moepack writes the uint8b128 layout the kernel "
        "takes, as vLLM's compressed-tensors int8 path does");
  if (opts.a8 && (x.w13.quant.groups(x.w13.k) > 1 || x.w2.quant.groups(x.w2.k) > 1))
    dev.push_back(
        "a8: scales are written permuted (single) in the activation dtype; vLLM's "
        "int8-activation path additionally rewrites grouped scales as int16 "
        "(marlin_act_int8_process_scales) and the fp8 path scales them by 512 -- "
        "moepack does neither");
  return dev;
}

}  // namespace moepack

namespace moepack {

std::vector<std::string> marlin_option_deviations(const LayoutOptions& opts) {
  if (!opts.vllm_w13_scale_size_k) return {};
  return {
      "--vllm-w13-scale-size-k: w13 scales are permuted exactly as vLLM's loader does "
      "(size_k = I); where group_size >= I its kernel expects the grouped permutation "
      "instead, and verify reports the layer (spec §4.3)"};
}

int64_t marlin_padded_inter(const LayoutOptions& opts, const MoeShape& x) {
  const int64_t I = x.inter();
  if (!vllm_target_row(opts.vllm_target).marlin_pads_intermediate || I <= 0) return I;
  return marlin_padded_intermediate(I, x.w2.quant.group_size);
}

std::vector<ParamSpec> marlin_param_specs(const LayoutOptions& opts, const MoeShape& real) {
  std::vector<ParamSpec> out;
  const bool index_params = vllm_target_row(opts.vllm_target).moe_act_order;
  // The shapes the parameters carry: I padded where the target pads it.
  MoeShape x = real;
  const int64_t ip = marlin_padded_inter(opts, real);
  x.w13.n = (opts.gated ? 2 : 1) * ip;
  x.w2.k = ip;
  const int64_t E = x.experts;
  for (const ProjShape* s : {&x.w13, &x.w2}) {
    const MarlinParamNames names =
        marlin_param_names(opts.source_method, s == &x.w13 ? MoeProj::kW13 : MoeProj::kW2);
    const std::string& pre = opts.prefix;
    const int64_t N = s->n, K = s->k, G = s->quant.groups(K);
    const int pf = marlin::pack_factor(s->quant.bits);
    const int64_t gk = s->act_order ? K : 0;
    const MoeProj p = s == &x.w13 ? MoeProj::kW13 : MoeProj::kW2;
    const auto role = [p](ParamRole w13_role) { return param_role_of(p, w13_role); };
    out.push_back(
        {pre + names.qweight, DType::kI32, {E, K / 16, N * 16 / pf}, role(ParamRole::kW13Weight)});
    out.push_back({pre + names.scales, opts.act_dtype, {E, G, N}, role(ParamRole::kW13Scale)});
    if (!names.qzeros.empty())
      out.push_back({pre + names.qzeros, DType::kI32, {E, G, N / pf}, role(ParamRole::kW13Zero)});
    if (!index_params) continue;
    if (!names.g_idx.empty())
      out.push_back({pre + names.g_idx, DType::kI32, {E, gk}, role(ParamRole::kW13GIdx)});
    out.push_back(
        {pre + names.sort_indices, DType::kI32, {E, gk}, role(ParamRole::kW13SortIndices)});
  }
  return out;
}

}  // namespace moepack
