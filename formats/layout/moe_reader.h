// Per-element readers of the converted MoE layouts, for the GPU verification runtime (issue 12).
// One source for host and device: g++ compiles it into the CPU tests that prove each reader
// equals its layout's codec (tests/unit/moe_reader.cpp), nvcc into kernels/ that add only tiling
// and summation order. Plain integers and raw pointers: no std containers, exceptions or I/O.
// formats/moe_reader.{h,cpp} validate parameters (as the layout's unpack does) and fill readers.
//
// weight(r, e, n, kk) is expert e's dequantised weight of LOGICAL output row n (vLLM order: w13
// = [gate; up]) and column kk in the layout's column order; act_col(r, e, kk) is the activation
// column that multiplies it (act-order: the sort index; otherwise kk). For every layout
//   weight(r, e, n, kk) == dequantize_expert(unpack(params).proj, e)[n * K + act_col(r, e, kk)]
// bit for bit -- except where the layout reproduces a vLLM kernel's reading on purpose, and then
// it equals the layout's expert_matmul instead (Marlin with --vllm-w13-scale-size-k, whose
// kernel reads other scale positions than the loader wrote; Triton WNA16 GPTQ zero 16, which
// vLLM's loader wraps into nibble 0).
//
// Activations: ActQuant is what the serving kernel does to the rows entering a GEMM. The runtime
// applies quantize_activation_row to the rows entering both the layout GEMM and the reference
// GEMM (so the comparison measures the weights), to the hidden states for w13 and to the gated
// intermediate for w2. A NaN or Inf anywhere in a quantisation unit (token row, 128-group,
// 32-block) makes every output of that unit NaN: the kernels differ among themselves there
// (fmaxf drops NaN, Triton's max keeps it) and verify must see the row fail, never a plausible
// number. kBf16 / kFp16 round each value (NaN stays NaN, fp16 overflows to Inf).
//   marlin          kBf16 / kFp16 by the activation dtype: fused_marlin_moe takes the hidden
//                   states as they are (vllm fused_moe/fused_marlin_moe.py). The a8 tile variant
//                   records neither of vLLM's 8-bit activation paths (int8 or fp8,
//                   marlin_act_int8_process_scales), so it is read with 16-bit activations too.
//   triton-wna16    kBf16 / kFp16: fused_moe_kernel_gptq_awq multiplies the 16-bit activations
//                   by dequantised weights (vllm fused_moe/fused_moe.py).
//   triton-int8     kInt8PerToken: int8_w8a8_moe_quant_config(per_act_token_quant=True) ->
//                   fused_moe/utils.py _int8_quantize -> quantization/utils/int8_utils.py
//                   per_token_quant_int8 (Triton _per_token_quant_int8): absmax = max(max|x|,
//                   1e-10), scale = absmax / 127, q = libdevice.round(x * (127 / absmax)) (half
//                   away from zero) as int8; the GEMM sees q * scale.
//   trtllm-mxfp8    kMxfp8Block32: vLLM quantises the hidden states with
//                   flashinfer.mxfp8_quantize(x, is_sf_swizzled_layout=False) and the kernel
//                   re-quantises the SwiGLU output the same way inside FC1 (spec/mxfp8_trtllm.md
//                   §4, §6 FlashInfer recipe = formats/mxfp8.cpp quantize_mxfp8 kFlashInfer):
//                   per 32 block c = e8m0_ceil(amax / 448), q = e4m3_rn_satfinite(x * 2^(127-c)),
//                   c = 0 blocks are signed zeros; the GEMM sees e4m3(q) * 2^(c-127).
//                   Hopper emulation: the serving kernel is Blackwell-only (tcgen05 block-scaled
//                   MMA); on Hopper the runtime feeds the same MXFP8 activations, dequantised,
//                   into an fp32 GEMM over the dequantised weights. Every e4m3 x e4m3 product is
//                   exact in fp32 and the E8M0 scales are powers of two, so the only difference
//                   to the tensor-core kernel is summation order -- which is all the runtime
//                   tolerance allows for.
//   trtllm-fp8-block kFp8PerTokenGroup128: vLLM per_token_group_quant_fp8(x, 128) (csrc
//                   quantization/w8a8/fp8/per_token_group_quant.cu, scale_ue8m0 off for the
//                   FlashInfer TRT-LLM path, whose activation scales are float32 [H/128, T]):
//                   absmax = max(1e-10, max|x|) per 128 columns, s = absmax / 448,
//                   q = e4m3_rn_satfinite(clamp(x / s, +-448)); the GEMM sees e4m3(q) * s.
// None of these changes the CPU expert_matmul paths, which keep activations in float.
#pragma once

#include <cstdint>

#include "formats/layout/fp_bits.h"
#include "formats/layout/hd.h"
#include "formats/layout/marlin_layout.h"
#include "formats/layout/trtllm_layout.h"

namespace moepack::reader {

enum class Kind : int32_t {
  kCanonical,
  kMarlin,
  kTritonWna16,
  kTritonInt8,
  kTrtllmMxfp8,
  kTrtllmFp8Block
};
enum class ActQuant : int32_t {
  kNone,
  kBf16,
  kFp16,
  kInt8PerToken,
  kFp8PerTokenGroup128,
  kMxfp8Block32
};
constexpr int kMaxParams = 8;

// Scale element types (i32 fields below).
enum ScaleType : int32_t { kScaleF16 = 0, kScaleBf16 = 1, kScaleF32 = 2, kScaleE8m0 = 3 };
// Canonical code kinds (formats/codec.h CodeKind, same order).
enum CodeType : int32_t { kCodeUint = 0, kCodeInt = 1, kCodeFp8 = 2 };

// One projection (w13 or w2) of a chunk of experts. Trivially copyable: kernels take it by value.
// Pointers and fields by kind (shapes per expert chunk; E = experts):
//   kCanonical (a QuantTensor):
//     p[0] codes u8 [E, N, K]; p[1] scales [E, ceil(N/sbn), G] of i32[2]; p[2] zeros u8 [E, N, G]
//     or null (symmetric); p[3] g_idx i32 [E, K] or null.
//     i32: [0] CodeType, [1] bits, [2] ScaleType.  i64: [0] group_size (<= 0: one group), [1] G,
//     [2] scale_block_n, [3] ceil(N / scale_block_n).
//   kMarlin (formats/marlin.h; physical sizes Np x Kp include vLLM 0.33's intermediate padding):
//     p[0] qweight u32 [E, Kp/16, Np*16/pf]; p[1] scales u16 [E, G, Np] (act dtype, permuted);
//     p[2] qzeros u32 [E, G, Np/pf] or null (uint4b8 / uint8b128); p[3] sorted g_idx i32
//     [E, Kp] and p[4] sort indices i32 [E, Kp], both null without act-order.
//     i32: [0] bits, [1] a8, [2] ScaleType (F16 / BF16), [3] grouped scale permutation (the
//     kernel's rule: G > 1 and not a8), [4] w13 rows padded (logical row n of shard n / I sits
//     at physical row (n / I) * Ip + n % I).
//     i64: [0] Kp, [1] Np, [2] G, [3] group_size (0 when G == 1), [4] I, [5] Ip,
//     [6] tiles along N, [7] words per expert.
//   kTritonWna16 (formats/triton_wna16.h):
//     p[0] qweight u8 [E, N, K*bits/8]; p[1] scales u16 [E, N, Gp]; p[2] qzeros u8 [E, N/2, Gp]
//     or null (zero point 8 / 128).  i32: [0] bits, [1] ScaleType.  i64: [0] bytes per row,
//     [1] Gp, [2] the kernel's (halved) group size.
//   kTritonInt8 (formats/triton_int8.h): p[0] weight i8 [E, N, K]; p[1] weight_scale f32 [E, N].
//   kTrtllmMxfp8 (formats/trtllm_mxfp8.h): p[0] weight e4m3 [E, N, K] in physical row order;
//     p[1] weight_scale u8, 128x4-swizzled [N, K/32] per expert.  i32: [0] W31 swap + gated
//     reorder on top of the shuffle (gated w13).  i64: [0] K/32.
//   kTrtllmFp8Block (formats/trtllm_fp8_block.h): p[0] weight e4m3 [E, K/128, N, 128]
//     (BlockMajorK); p[1] weight_scale_inv f32 [E, N/128, K/128] (W31-swapped rows for w13).
//     i32: [0] W31 swap (gated w13).  i64: [0] K/128.
struct ProjReader {
  Kind kind;
  ActQuant act;
  int64_t experts, n, k;  // LOGICAL sizes (padding hidden inside)
  const void* p[kMaxParams];
  int64_t i64[8];
  int32_t i32[8];
};

// ---- scalar helpers ----------------------------------------------------------------------------

MOEPACK_HD float scale_at(const void* base, int64_t index, int32_t type) {
  switch (type) {
    case kScaleF16:
      return hd::f16_value(static_cast<const uint16_t*>(base)[index]);
    case kScaleBf16:
      return hd::bf16_value(static_cast<const uint16_t*>(base)[index]);
    case kScaleF32:
      return static_cast<const float*>(base)[index];
    default:
      return hd::e8m0_value(static_cast<const uint8_t*>(base)[index]);
  }
}

// ---- kCanonical --------------------------------------------------------------------------------

// = formats/codec.cpp dequantize_expert, element (n, kk).
MOEPACK_HD float canonical_weight(const ProjReader& r, int64_t e, int64_t n, int64_t kk) {
  const int64_t K = r.k, G = r.i64[1];
  const int32_t* gi = static_cast<const int32_t*>(r.p[3]);
  const int64_t g = gi ? gi[e * K + kk] : (r.i64[0] > 0 ? kk / r.i64[0] : 0);
  const float s = scale_at(r.p[1], (e * r.i64[3] + n / r.i64[2]) * G + g, r.i32[2]);
  const uint8_t c = static_cast<const uint8_t*>(r.p[0])[(e * r.n + n) * K + kk];
  switch (r.i32[0]) {
    case kCodeUint: {
      const uint8_t* z = static_cast<const uint8_t*>(r.p[2]);
      const float zf = z ? static_cast<float>(z[(e * r.n + n) * G + g])
                         : static_cast<float>(1 << (r.i32[1] - 1));
      return (static_cast<float>(c) - zf) * s;
    }
    case kCodeInt:
      return static_cast<float>(static_cast<int8_t>(c)) * s;
    default:
      return hd::e4m3_value(c) * s;
  }
}

// ---- kMarlin -----------------------------------------------------------------------------------

// = formats/marlin.cpp marlin_expert_matmul's reading of (n, kk): tiles through
// marlin::word_field_of, scales and zero points through the inverse chunk permutations, the group
// of sorted row kk from the stored (sorted) g_idx under act-order.
MOEPACK_HD float marlin_weight(const ProjReader& r, int64_t e, int64_t n, int64_t kk) {
  const int bits = r.i32[0];
  const bool a8 = r.i32[1] != 0;
  const int64_t Np = r.i64[1], Kp = r.i64[0];
  if (r.i32[4]) {
    const int64_t I = r.i64[4];
    n += (n / I) * (r.i64[5] - I);
  }
  const int32_t* gs = static_cast<const int32_t*>(r.p[3]);
  const int64_t g = gs ? gs[e * Kp + kk] : (r.i64[3] > 0 ? kk / r.i64[3] : 0);
  int word = 0, field = 0;
  marlin::word_field_of(bits, a8, kk, n, &word, &field);
  const int64_t tk = a8 ? 32 : 16, tn = a8 ? 32 : 64;
  const int64_t tau = (kk / tk) * r.i64[6] + n / tn;
  const uint32_t* q = static_cast<const uint32_t*>(r.p[0]);
  const uint32_t mask = (1u << bits) - 1u;
  const uint32_t w = q[e * r.i64[7] + tau * (1024 / (32 / bits)) + word];
  const float code = static_cast<float>((w >> (bits * field)) & mask);
  // Scale (g, n) and zero point (g, n) of the row-major [G, Np] matrices, as stored permuted.
  const int64_t j = g * Np + n;
  const bool grouped = r.i32[3] != 0;
  const int64_t sc = grouped ? 64 : 32;
  const int64_t spos = (j / sc) * sc + marlin::scale_perm_dst(grouped, static_cast<int>(j % sc));
  const float s =
      scale_at(static_cast<const uint16_t*>(r.p[1]) + e * r.i64[2] * Np, spos, r.i32[2]);
  float z = static_cast<float>(1 << (bits - 1));
  const uint32_t* zw = static_cast<const uint32_t*>(r.p[2]);
  if (zw) {
    const int pf = 32 / bits;
    const int64_t zpos = (j / 64) * 64 + marlin::zero_point_dst(bits, a8, static_cast<int>(j % 64));
    const uint32_t zword = zw[e * r.i64[2] * (Np / pf) + zpos / pf];
    z = static_cast<float>((zword >> (bits * (zpos % pf))) & mask);
  }
  return (code - z) * s;
}

// ---- kTritonWna16 ------------------------------------------------------------------------------

// = formats/triton_wna16.cpp triton_wna16_expert_matmul (fused_moe_kernel_gptq_awq).
MOEPACK_HD float triton_wna16_weight(const ProjReader& r, int64_t e, int64_t n, int64_t kk) {
  const int64_t row = e * r.n + n, kb = r.i64[0], Gp = r.i64[1];
  const int64_t grp = kk / r.i64[2];
  const uint8_t* b = static_cast<const uint8_t*>(r.p[0]) + row * kb;
  const bool int4 = r.i32[0] == 4;
  const float code =
      int4 ? static_cast<float>((b[kk >> 1] >> (4 * (kk & 1))) & 15) : static_cast<float>(b[kk]);
  const uint8_t* z = static_cast<const uint8_t*>(r.p[2]);
  const float zp =
      z ? static_cast<float>((z[(e * (r.n / 2) + n / 2) * Gp + grp] >> (4 * (n & 1))) & 15)
        : (int4 ? 8.0f : 128.0f);
  return (code - zp) * scale_at(r.p[1], row * Gp + grp, r.i32[1]);
}

// ---- kTritonInt8 -------------------------------------------------------------------------------

MOEPACK_HD float triton_int8_weight(const ProjReader& r, int64_t e, int64_t n, int64_t kk) {
  const int64_t row = e * r.n + n;
  const int8_t c = static_cast<const int8_t*>(r.p[0])[row * r.k + kk];
  return static_cast<float>(c) * static_cast<const float*>(r.p[1])[row];
}

// ---- kTrtllmMxfp8 ------------------------------------------------------------------------------

// Physical row of logical row n: the inverse of trtllm_w13_rows / trtllm_w2_rows
// (formats/trtllm_mxfp8.cpp), i.e. of shuffle(reorder(swap)) or of the shuffle alone.
MOEPACK_HD int64_t mxfp8_physical_row(int64_t n, int64_t rows, bool w31_gated) {
  if (w31_gated) {
    const int64_t half = rows / 2;
    const int64_t a = n >= half ? n - half : n + half;  // swap_w13_to_w31 (an involution)
    n = a < half ? 2 * a : 2 * (a - half) + 1;          // reorder_rows_for_gated_act_gemm
  }
  return trtllm::shuffle_a_dst_row(n, 32);  // shuffle_matrix_a, epilogue tile 128
}

MOEPACK_HD float trtllm_mxfp8_weight(const ProjReader& r, int64_t e, int64_t n, int64_t kk) {
  const int64_t rows = r.n, K = r.k, cols = r.i64[0];
  const int64_t pr = mxfp8_physical_row(n, rows, r.i32[0] != 0);
  const uint8_t* sq = static_cast<const uint8_t*>(r.p[1]) + e * rows * cols;
  const float s = hd::e8m0_value(sq[trtllm::scale_128x4_offset(pr, kk >> 5, cols)]);
  return hd::e4m3_value(static_cast<const uint8_t*>(r.p[0])[(e * rows + pr) * K + kk]) * s;
}

// ---- kTrtllmFp8Block ---------------------------------------------------------------------------

MOEPACK_HD float trtllm_fp8_block_weight(const ProjReader& r, int64_t e, int64_t n, int64_t kk) {
  const int64_t rows = r.n, kblocks = r.i64[0];
  int64_t w31 = n;  // row of the W31-ordered matrix (and of the stored scales' 128-row blocks)
  if (r.i32[0]) {
    const int64_t half = rows / 2;
    w31 = n >= half ? n - half : n + half;
  }
  const int64_t pr = trtllm::shuffle_a_dst_row(w31, 16);  // shuffle_matrix_a, epilogue tile 64
  const int64_t kb = kk >> 7;
  const uint8_t* wq = static_cast<const uint8_t*>(r.p[0]) + e * rows * r.k;
  const float* sq = static_cast<const float*>(r.p[1]) + e * (rows / 128) * kblocks;
  return hd::e4m3_value(wq[(kb * rows + pr) * 128 + (kk & 127)]) * sq[(w31 >> 7) * kblocks + kb];
}

// ---- the contract ------------------------------------------------------------------------------

MOEPACK_HD float weight(const ProjReader& r, int64_t e, int64_t n, int64_t kk) {
  switch (r.kind) {
    case Kind::kCanonical:
      return canonical_weight(r, e, n, kk);
    case Kind::kMarlin:
      return marlin_weight(r, e, n, kk);
    case Kind::kTritonWna16:
      return triton_wna16_weight(r, e, n, kk);
    case Kind::kTritonInt8:
      return triton_int8_weight(r, e, n, kk);
    case Kind::kTrtllmMxfp8:
      return trtllm_mxfp8_weight(r, e, n, kk);
    default:
      return trtllm_fp8_block_weight(r, e, n, kk);
  }
}

// Only Marlin act-order permutes activations (permute_cols_kernel over the sort indices).
MOEPACK_HD int64_t act_col(const ProjReader& r, int64_t e, int64_t kk) {
  if (r.kind == Kind::kMarlin && r.p[4])
    return static_cast<const int32_t*>(r.p[4])[e * r.i64[0] + kk];
  return kk;
}

// ---- activation quantisation -------------------------------------------------------------------

// Writes NaN over out[0, count): the policy for a unit holding a NaN or Inf (see the top).
MOEPACK_HD void fill_nan(float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = hd::bits_as_float(hd::kQuietNanBits);
}

// max |x| over x[0, count) and whether all are finite.
MOEPACK_HD float abs_max(const float* x, int64_t count, bool* finite) {
  float m = 0.0f;
  bool ok = true;
  for (int64_t i = 0; i < count; ++i) {
    const float a = hd::bits_as_float(hd::float_as_bits(x[i]) & 0x7fffffffu);
    ok = ok && hd::is_finite_bits(x[i]);
    m = a > m ? a : m;
  }
  *finite = ok;
  return m;
}

// libdevice round() (nearest, half away from zero) stored as int8: |v| <= 127.x here, so the
// integer part and the remainder are exact; the int8 has no -0.
MOEPACK_HD int32_t round_half_away_to_int(float v) {
  const float a = hd::bits_as_float(hd::float_as_bits(v) & 0x7fffffffu);
  int32_t t = static_cast<int32_t>(a);  // truncation
  if (a - static_cast<float>(t) >= 0.5f) ++t;
  return v < 0.0f ? -t : t;
}

MOEPACK_HD void quantize_int8_per_token(const float* x, int64_t k, float* out) {
  bool finite = true;
  float absmax = abs_max(x, k, &finite);
  if (!finite) return fill_nan(out, k);
  absmax = absmax > 1e-10f ? absmax : 1e-10f;
  const float scale = absmax / 127.0f, inv = 127.0f / absmax;
  for (int64_t i = 0; i < k; ++i) {
    int32_t q = round_half_away_to_int(x[i] * inv);
    q = q > 127 ? 127 : (q < -128 ? -128 : q);  // the int8 store
    out[i] = static_cast<float>(q) * scale;
  }
}

MOEPACK_HD void quantize_fp8_group128(const float* x, int64_t k, float* out) {
  for (int64_t g0 = 0; g0 < k; g0 += 128) {
    const int64_t len = k - g0 < 128 ? k - g0 : 128;
    bool finite = true;
    float absmax = abs_max(x + g0, len, &finite);
    if (!finite) {
      fill_nan(out + g0, len);
      continue;
    }
    absmax = absmax > 1e-10f ? absmax : 1e-10f;
    const float s = absmax / 448.0f;
    for (int64_t i = 0; i < len; ++i) {
      float v = x[g0 + i] / s;
      v = v < -448.0f ? -448.0f : (v > 448.0f ? 448.0f : v);
      out[g0 + i] = hd::e4m3_value(hd::e4m3_round_satfinite(v)) * s;
    }
  }
}

MOEPACK_HD void quantize_mxfp8_block32(const float* x, int64_t k, float* out) {
  for (int64_t b0 = 0; b0 < k; b0 += 32) {
    const int64_t len = k - b0 < 32 ? k - b0 : 32;
    bool finite = true;
    const float amax = abs_max(x + b0, len, &finite);
    if (!finite) {
      fill_nan(out + b0, len);
      continue;
    }
    const uint8_t c = hd::e8m0_ceil(amax / 448.0f);
    if (c == 0) {  // FlashInfer multiplies by a zero reciprocal scale: signed zeros
      for (int64_t i = 0; i < len; ++i)
        out[b0 + i] = hd::bits_as_float(hd::float_as_bits(x[b0 + i]) & 0x80000000u);
      continue;
    }
    // 2^(127-c) and 2^(c-127) are exact float32 values for c in [1, 254].
    const float inv =
        hd::bits_as_float(c == 254 ? 0x00400000u : static_cast<uint32_t>(254 - c) << 23);
    const float s = hd::e8m0_value(c);
    for (int64_t i = 0; i < len; ++i)
      out[b0 + i] = hd::e4m3_value(hd::e4m3_round_satfinite(x[b0 + i] * inv)) * s;
  }
}

// k = r.k values in, k out: the kernel's input row, quantised and dequantised. Sequential.
MOEPACK_HD void quantize_activation_row(const ProjReader& r, const float* x, float* out) {
  const int64_t k = r.k;
  switch (r.act) {
    case ActQuant::kNone:
      for (int64_t i = 0; i < k; ++i) out[i] = x[i];
      return;
    case ActQuant::kBf16:
      for (int64_t i = 0; i < k; ++i) out[i] = hd::bf16_value(hd::bf16_round(x[i]));
      return;
    case ActQuant::kFp16:
      for (int64_t i = 0; i < k; ++i) out[i] = hd::f16_value(hd::f16_round(x[i]));
      return;
    case ActQuant::kInt8PerToken:
      return quantize_int8_per_token(x, k, out);
    case ActQuant::kFp8PerTokenGroup128:
      return quantize_fp8_group128(x, k, out);
    default:
      return quantize_mxfp8_block32(x, k, out);
  }
}

}  // namespace moepack::reader
