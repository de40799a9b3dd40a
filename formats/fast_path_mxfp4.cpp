// gpt-oss MXFP4 -> triton-mxfp4 / marlin-mxfp4 without the canonical form
// (formats/fast_path_mxfp4.h), byte-identical to load_moe_experts (model/checkpoint.cpp:
// load_gpt_oss_mxfp4, the biases) + the layout's pack (formats/triton_mxfp4.cpp,
// formats/marlin_float.cpp).
//
// What the rows replicate of the canonical path:
//   - the codec's and the loader's checks (fp4.cpp unpack_gpt_oss_mxfp4, load_gpt_oss_bias_bytes):
//     U8 blocks [E, n, k/32, 16], U8 / F8_E8M0 scales [E, n, k/32] without code 255, BF16 biases
//     [E, n] all finite -- as "decline";
//   - the loader's interleave (w13 row 2j gate j, 2j + 1 up j into [gate; up]) and the layouts'
//     (physical row 2j of gate j, 2j + 1 up j) cancel: physical row r is source row r;
//   - the layouts' padding (their param_specs give every extent, so no size rule is restated),
//     the triton value swizzle and _pack_bits, the scale swizzle, the Marlin int4 tile map, the
//     Marlin scale permutation with the pair swap, the bias permutation, bf16 -> f32 biases.
#include "formats/fast_path_mxfp4.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "core/half.h"
#include "core/threads.h"
#include "formats/layout/marlin_layout.h"
#include "formats/layout/triton_mxfp4_layout.h"
#include "formats/wna16_util.h"

namespace moepack {
namespace {

constexpr int64_t kMxBlock = 32;
constexpr int64_t kTritonWarps = 8;  // the scale swizzle's num_warps (formats/triton_mxfp4.cpp)

// One projection of the chunk as the checkpoint holds it: expert e's row r is `k / 2` bytes at
// blocks + ((first + e) * n + r) * k / 2, its scales k / 32 bytes, its bias one BF16.
struct FusedProj {
  const uint8_t* blocks = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* bias = nullptr;
  int64_t n = 0, k = 0;  // rows (2I interleaved for w13, H for w2) and K
  int64_t row_bytes() const { return k / 2; }
  int64_t groups() const { return k / kMxBlock; }
  const uint8_t* expert_blocks(int64_t e) const { return blocks + e * n * row_bytes(); }
  const uint8_t* expert_scales(int64_t e) const { return scales + e * n * groups(); }
  const uint8_t* expert_bias(int64_t e) const { return bias + e * n * 2; }
};

const TensorView* find_view(const std::map<std::string, TensorView>& m, const char* suffix) {
  auto it = m.find(suffix);
  return it == m.end() ? nullptr : &it->second;
}

// Whether any BF16 value of `count` at p is inf or NaN (exponent bits all ones).
bool any_nonfinite_bf16(const uint8_t* p, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t h = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
    if ((h & 0x7f80u) == 0x7f80u) return true;
  }
  return false;
}

// Projection p (0 gate_up, 1 down) of the chunk, or false where the canonical path would refuse
// its bytes (or a tensor it finds is not the one discovery checked).
bool read_fused_proj(const DirectSource& src, int p, FusedProj* out) {
  const auto& m = src.fused[static_cast<size_t>(p)];
  const int64_t H = src.hidden, I = src.inter, E = src.experts(), e0 = src.first_expert;
  const int64_t n = p == 0 ? 2 * I : H, k = p == 0 ? H : I;
  if (m.size() != 3 || n <= 0 || k <= 0 || k % kMxBlock != 0 || E < 1 || e0 < 0) return false;
  const TensorView* b = find_view(m, "blocks");
  const TensorView* s = find_view(m, "scales");
  const TensorView* bias = find_view(m, "bias");
  if (!b || !s || !bias || b->shape.empty()) return false;
  const int64_t el = b->shape[0], g = k / kMxBlock;
  if (e0 + E > el || b->dtype != DType::kU8 || b->shape != Shape{el, n, g, kMxBlock / 2} ||
      !is_scale_byte_dtype(s->dtype) || s->shape != Shape{el, n, g} ||
      bias->dtype != DType::kBF16 || bias->shape != Shape{el, n})
    return false;
  out->n = n;
  out->k = k;
  out->blocks = b->data + e0 * n * (k / 2);
  out->scales = s->data + e0 * n * g;
  out->bias = bias->data + e0 * n * 2;
  if (std::memchr(out->scales, 255, static_cast<size_t>(E * n * g))) return false;  // E8M0 NaN
  return !any_nonfinite_bf16(out->bias, E * n);
}

// The layout's parameters for the chunk, zero-filled, from its own param_specs (vLLM's order:
// w13 and w2 weights, scales, biases).
std::vector<Tensor> chunk_params(const char* layout, const LayoutOptions& opts,
                                 const DirectSource& src) {
  const TargetLayout* row = find_target_layout(layout);
  if (!row) return {};
  const QuantSpec spec = find_source_codec(QuantMethod::kGptOssMxfp4)->spec_for(src.quant);
  MoeShape shape;
  shape.experts = src.experts();
  shape.w13 = {spec, 2 * src.inter, src.hidden, false};
  shape.w2 = {spec, src.hidden, src.inter, false};
  std::vector<Tensor> out;
  for (const ParamSpec& p : row->param_specs(opts, shape))
    out.emplace_back(p.name, p.dtype, p.shape);
  return out;
}

// Runs fn(e, w13, w2) for every expert of the chunk on opts.threads, after reading both
// projections; nullopt where either declines.
template <typename Fn>
std::optional<std::vector<Tensor>> convert_experts(const char* layout, const LayoutOptions& opts,
                                                   const DirectSource& src, Fn fn) {
  if (!src.gated || src.g_idx_w13 || src.g_idx_w2) return std::nullopt;
  std::array<FusedProj, 2> proj;
  for (int p = 0; p < 2; ++p)
    if (!read_fused_proj(src, p, &proj[static_cast<size_t>(p)])) return std::nullopt;
  std::vector<Tensor> params = chunk_params(layout, opts, src);
  if (params.size() != 6) return std::nullopt;
  parallel_for(src.experts(), opts.threads, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) fn(e, proj, params);
  });
  return params;
}

// Expert e's slice of parameter t (its leading dimension is the chunk's experts).
uint8_t* expert_slice(Tensor& t, int64_t e) {
  return t.data.data() + e * static_cast<int64_t>(t.data.size()) / t.shape[0];
}

// ---- triton-mxfp4 -------------------------------------------------------------------------------

// kValueBits[slot][byte]: both codes of a source byte as _pack_bits spreads them in word slot
// `slot` (triton_mx::value_bits: the low nibble in bits 0..15, the high one in 16..31).
struct ValueBits {
  uint32_t v[4][256];
  ValueBits() {
    for (int slot = 0; slot < 4; ++slot)
      for (uint32_t b = 0; b < 256; ++b)
        v[slot][b] =
            triton_mx::value_bits(b & 15u, slot, 0) | triton_mx::value_bits(b >> 4, slot, 1);
  }
};

// One expert's Hopper value swizzle: `rows` x `row_bytes` source bytes into the zero-filled
// [mp/4, kbp] words of `out`. triton_mx::value_word / value_slot read backwards: word row
// R = 4 r0 + t0 holds the bytes of the four rows m = 16 r0 + 8 w0 + 2 t0 + s0, and its word
// 32 r1 + 16 s0 + 4 t1 + kt1 packs byte b = 32 r1 + 8 kt1 + 4 w1 + t1 of row m(s0, w0) in slot
// 2 w1 + w0. So each run of 32 words is built from one 32-byte piece of each of the four rows.
void triton_values(const uint8_t* rows, int64_t n, int64_t row_bytes, int64_t mp, int64_t kbp,
                   uint8_t* out) {
  static const ValueBits lut;
  uint8_t piece[2][2][32];  // [s0][w0][byte of the 32]
  for (int64_t R = 0; R < mp / 4; ++R) {
    const int64_t r0 = R / 4, t0 = R % 4;
    for (int64_t r1 = 0; r1 < kbp / 32; ++r1) {
      const int64_t b0 = 32 * r1, len = std::min<int64_t>(32, row_bytes - b0);
      bool any = false;
      for (int s0 = 0; s0 < 2; ++s0)
        for (int w0 = 0; w0 < 2; ++w0) {
          const int64_t m = 16 * r0 + 8 * w0 + 2 * t0 + s0;
          uint8_t* dst = piece[s0][w0];
          std::memset(dst, 0, 32);
          if (m < n && len > 0) {
            std::memcpy(dst, rows + m * row_bytes + b0, static_cast<size_t>(len));
            any = true;
          }
        }
      if (!any) continue;  // padding: the words stay zero
      uint8_t* words = out + 4 * (R * kbp + 32 * r1);
      for (int s0 = 0; s0 < 2; ++s0)
        for (int t1 = 0; t1 < 4; ++t1)
          for (int kt1 = 0; kt1 < 4; ++kt1) {
            const int b = 8 * kt1 + t1;
            const uint32_t w = lut.v[0][piece[s0][0][b]] | lut.v[1][piece[s0][1][b]] |
                               lut.v[2][piece[s0][0][b + 4]] | lut.v[3][piece[s0][1][b + 4]];
            wna16::store_u32(words + 4 * (16 * s0 + 4 * t1 + kt1), w);
          }
    }
  }
}

// One expert's scales [n, G] to their triton_mx::scale_offset positions in the zero-filled
// [msp/32, gp*32] bytes.
void triton_scales(const uint8_t* scales, int64_t n, int64_t groups, int64_t gp, uint8_t* out) {
  for (int64_t m = 0; m < n; ++m) {
    const int64_t base = triton_mx::scale_offset(m, 0, gp, kTritonWarps);
    const uint8_t* s = scales + m * groups;
    for (int64_t g = 0; g < groups; ++g) out[base + 64 * (g >> 1) + 2 * (g & 1)] = s[g];
  }
}

// One expert's BF16 biases [n] as float32 into the zero-filled [rows] floats.
void f32_biases(const uint8_t* bias, int64_t n, uint8_t* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float f = bf16_to_float(static_cast<uint16_t>(bias[2 * r] | (bias[2 * r + 1] << 8)));
    std::memcpy(out + 4 * r, &f, 4);
  }
}

// ---- marlin-mxfp4 -------------------------------------------------------------------------------

// Rows c and c + 8 of a Marlin int4 tile (16 k x 64 n, marlin::word_field_coords), each as its 16
// codes of the tile: one little-endian 64-bit word, byte q = codes 2q | 2q + 1 << 4. Word
// 16 m + 4 q + j of the tile (c = 16 j + m, m < 8) holds, nibble by nibble, the low nibbles of
// bytes q, q + 4 of row c, then of row c + 8, then the four high nibbles alike: pa / pb pair the
// low nibbles of bytes q and q + 4 per row, qa / qb the high ones, and a 4x4 byte transpose of
// (pa, pb, qa, qb) gives the words q = 0..3.
inline void marlin_row_pair(uint64_t a, uint64_t b, uint32_t* tile, int m, int j) {
  constexpr uint64_t kLow = 0x0f0f0f0f0f0f0f0fULL;
  const uint64_t la = a & kLow, ha = (a >> 4) & kLow, lb = b & kLow, hb = (b >> 4) & kLow;
  const uint32_t pa = static_cast<uint32_t>(la | (la >> 28));  // byte q: lo(q) | lo(q+4) << 4
  const uint32_t pb = static_cast<uint32_t>(lb | (lb >> 28));
  const uint32_t qa = static_cast<uint32_t>(ha | (ha >> 28));
  const uint32_t qb = static_cast<uint32_t>(hb | (hb >> 28));
  const uint32_t x0 = (pa & 0x00ff00ffu) | ((pb & 0x00ff00ffu) << 8);  // pa0 pb0 pa2 pb2
  const uint32_t x1 = ((pa >> 8) & 0x00ff00ffu) | (pb & 0xff00ff00u);  // pa1 pb1 pa3 pb3
  const uint32_t y0 = (qa & 0x00ff00ffu) | ((qb & 0x00ff00ffu) << 8);
  const uint32_t y1 = ((qa >> 8) & 0x00ff00ffu) | (qb & 0xff00ff00u);
  uint32_t* w = tile + 16 * m + j;
  w[0] = (x0 & 0xffffu) | (y0 << 16);
  w[4] = (x1 & 0xffffu) | (y1 << 16);
  w[8] = (x0 >> 16) | (y0 & 0xffff0000u);
  w[12] = (x1 >> 16) | (y1 & 0xffff0000u);
}

// One expert's Marlin int4 tiles of the [np, kp] codes (rows n x k of them real, the rest zero)
// into the zero-filled [kp/16, np*2] words of `out`, tile (kt, nt) at (kt * np/64 + nt) * 128.
void marlin_values(const uint8_t* rows, int64_t n, int64_t k, int64_t np, int64_t kp,
                   uint8_t* out) {
  const int64_t row_bytes = k / 2, ntiles_n = np / 64;
  uint32_t tile[128];
  uint64_t x[64];
  for (int64_t nt = 0; nt < ntiles_n && 64 * nt < n; ++nt)
    for (int64_t kt = 0; kt < kp / 16 && 16 * kt < k; ++kt) {  // k % 32 == 0: whole tiles
      for (int c = 0; c < 64; ++c) {
        const int64_t r = 64 * nt + c;
        x[c] = 0;
        if (r < n) std::memcpy(&x[c], rows + r * row_bytes + 8 * kt, 8);
      }
      for (int j = 0; j < 4; ++j)
        for (int m = 0; m < 8; ++m) marlin_row_pair(x[16 * j + m], x[16 * j + m + 8], tile, m, j);
      std::memcpy(out + 4 * (kt * ntiles_n + nt) * 128, tile, sizeof tile);
    }
}

// Where entry i of a C-entry chunk of a permuted parameter comes from within the chunk: the
// Marlin scale permutation (marlin_permute_scales), then for the scales vLLM's pair swap.
std::array<int, 64> chunk_sources(bool grouped, bool swap) {
  std::array<int, 64> src{};
  const int c = marlin::scale_chunk(grouped);
  for (int i = 0; i < c; ++i)
    src[static_cast<size_t>(i)] =
        marlin::scale_perm_src(grouped, static_cast<int>(swap ? marlin::pair_swap_pos(i) : i));
  return src;
}

// One expert's E8M0 scales [n, G] as the physical [Gp, np] matrix (zeros beyond), permuted.
// np is a multiple of the chunk (64 or 32 entries: vLLM pads the rows to 256), so a chunk is a
// run of rows of one group; the rows of a chunk are read for every group while in cache.
void marlin_scales(const uint8_t* scales, int64_t n, int64_t groups, int64_t gp, int64_t np,
                   uint8_t* out) {
  const bool grouped = gp > 1;
  const int c = marlin::scale_chunk(grouped);
  const std::array<int, 64> from = chunk_sources(grouped, true);
  for (int64_t r0 = 0; r0 < n; r0 += c)  // chunks of padding rows only stay zero
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* dst = out + g * np + r0;
      for (int i = 0; i < c; ++i) {
        const int64_t r = r0 + from[static_cast<size_t>(i)];
        dst[i] = r < n ? scales[r * groups + g] : 0;
      }
    }
}

// One expert's BF16 biases [n] padded to np and permuted in chunks of 32 (marlin_permute_bias).
void marlin_biases(const uint8_t* bias, int64_t n, int64_t np, uint8_t* out) {
  const std::array<int, 64> from = chunk_sources(false, false);
  const int c = marlin::scale_chunk(false);
  for (int64_t base = 0; base < np; base += c)
    for (int i = 0; i < c; ++i) {
      const int64_t r = base + from[static_cast<size_t>(i)];
      if (r < n) std::memcpy(out + 2 * (base + i), bias + 2 * r, 2);
    }
}

}  // namespace

std::vector<std::string> gpt_oss_mxfp4_direct_refusals(const QuantParams& q, const LayoutOptions&,
                                                       const MoeShape&) {
  std::vector<std::string> why;
  if (q.bits != 4 || q.group_size != kMxBlock)
    why.push_back("bits=" + std::to_string(q.bits) + ", group_size=" +
                  std::to_string(q.group_size) + " (gpt-oss MXFP4: e2m1 codes in blocks of 32)");
  return why;
}

std::optional<std::vector<Tensor>> gpt_oss_mxfp4_to_triton(const LayoutOptions& opts,
                                                           const DirectSource& src) {
  // Parameters: 0/1 weights [E, mp/4, kbp*4], 2/3 scales [E, msp/32, gp*32], 4/5 biases F32.
  return convert_experts(
      "triton-mxfp4", opts, src,
      [](int64_t e, const std::array<FusedProj, 2>& proj, std::vector<Tensor>& t) {
        for (size_t p = 0; p < 2; ++p) {
          const FusedProj& f = proj[p];
          const Tensor &w = t[p], &s = t[2 + p];
          triton_values(f.expert_blocks(e), f.n, f.row_bytes(), w.shape[1] * 4, w.shape[2] / 4,
                        expert_slice(t[p], e));
          triton_scales(f.expert_scales(e), f.n, f.groups(), s.shape[2] / 32,
                        expert_slice(t[2 + p], e));
          f32_biases(f.expert_bias(e), f.n, expert_slice(t[4 + p], e));
        }
      });
}

std::optional<std::vector<Tensor>> gpt_oss_mxfp4_to_marlin(const LayoutOptions& opts,
                                                           const DirectSource& src) {
  // Parameters: 0/1 weights I32 [E, kp/16, np*2], 2/3 scales [E, kp/32, np], 4/5 biases [E, np].
  return convert_experts(
      "marlin-mxfp4", opts, src,
      [](int64_t e, const std::array<FusedProj, 2>& proj, std::vector<Tensor>& t) {
        for (size_t p = 0; p < 2; ++p) {
          const FusedProj& f = proj[p];
          const int64_t kp = t[p].shape[1] * 16, np = t[p].shape[2] / 2;
          marlin_values(f.expert_blocks(e), f.n, f.k, np, kp, expert_slice(t[p], e));
          marlin_scales(f.expert_scales(e), f.n, f.groups(), t[2 + p].shape[1], np,
                        expert_slice(t[2 + p], e));
          marlin_biases(f.expert_bias(e), f.n, np, expert_slice(t[4 + p], e));
        }
      });
}

}  // namespace moepack
