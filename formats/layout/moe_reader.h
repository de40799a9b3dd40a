// Per-element readers of the converted MoE layouts: the one definition of how each layout's
// serving kernel reads its parameters, for the CPU expert matmul (formats/moe_reader.h
// reader_expert_matmul, what verify's CPU path and the tests compute with) and the GPU runtime
// (kernels/). One source for host and device: g++ compiles it into formats/ and the CPU tests,
// nvcc into kernels/ that add only tiling and summation order. Plain integers and raw pointers:
// no std containers, exceptions or I/O.
//
// A reader is a ProjReader: one projection (w13 or w2) of a chunk of experts, its Kind, its
// ActQuant, its logical sizes and the kind's own parameter struct (named fields, one struct per
// Kind, held in a union so that the reader stays trivially copyable for kernels). Each target
// layout row (formats/registry.cpp) names its kind, its activation quantisation and its builder
// (TargetLayout::make_reader, in the layout's own file next to its *_read_layer validation),
// which validates a chunk's parameters the way the layout's unpack does and fills the struct.
// A new layout adds: its Kind, its struct, its kind_weight overload (kind_act_col where it
// permutes activations; kind_weight_row where decoding a whole row at once is faster, as for the
// CPU matmul: the same floats) and one case in `visit` below -- the only switch over Kind in the
// tree.
//
// weight(r, e, n, kk) is expert e's dequantised weight of LOGICAL output row n (vLLM order: w13
// = [gate; up]) and column kk in the layout's column order; act_col(r, e, kk) is the activation
// column that multiplies it (act-order: the sort index; otherwise kk). For every layout
//   weight(r, e, n, kk) == dequantize_expert(unpack(params).proj, e)[n * K + act_col(r, e, kk)]
// bit for bit -- except where the layout reproduces a vLLM kernel's reading on purpose (Marlin
// with --vllm-w13-scale-size-k, whose kernel reads other scale positions than the loader wrote:
// the reader equals unpack under the kernel's scale rule; Triton WNA16 GPTQ zero 16, which vLLM's
// loader wraps into nibble 0: the reader reads zero 0). tests/unit/registry_suite.cpp proves it
// for every row over the row's sample space.
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
//   humming         kBf16 / kFp16: vLLM 0.33's default HummingInputSchema() keeps 16-bit
//                   activations (no VLLM_HUMMING_INPUT_QUANT_CONFIG: input_quant_mode "none").
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
//   trtllm-mxfp4    kBf16: gpt-oss on FLASHINFER_TRTLLM_MXFP4_BF16 takes the bf16 hidden states as
//                   they are (vLLM 0.33's default for gpt-oss on sm100; the MXFP8-activation
//                   variant runs only when asked for, docs/trtllm_fp4.md).
//   trtllm-fp8-block kFp8PerTokenGroup128: vLLM per_token_group_quant_fp8(x, 128) (csrc
//                   quantization/w8a8/fp8/per_token_group_quant.cu, scale_ue8m0 off for the
//                   FlashInfer TRT-LLM path, whose activation scales are float32 [H/128, T]):
//                   absmax = max(1e-10, max|x|) per 128 columns, s = absmax / 448,
//                   q = e4m3_rn_satfinite(clamp(x / s, +-448)); the GEMM sees e4m3(q) * s.
//   triton-mxfp4    kBf16: matmul_ogs multiplies the bf16 hidden states as they are (gpt-oss'
//                   MXFP4 config takes bf16 only; the OAI kernel widens the weights to bf16).
//   trtllm-nvfp4    kNvfp4Block16: TrtLlmNvFp4Experts quantises the hidden states with
//                   flashinfer fp4_quantize(x, a1_gscale = 1 / w13_input_scale, sf_vec_size 16)
//                   and the kernel re-quantises FC1's output with 1 / w2_input_scale (TRT-LLM
//                   cvt_warp_fp16_to_fp4): per 16 block sf = e4m3_rn_satfinite(gs * (amax / 6)),
//                   q = e2m1_rn_satfinite(x / (sf / gs)), sf = 0: zeros; the GEMM sees
//                   e2m1(q) * sf and multiplies by g1_alphas = w * a, so the activation it
//                   computes with is e2m1(q) * sf * a (a = ProjReader::act_scale, gs = 1 / a).
// The CPU expert matmul (reader_expert_matmul) keeps activations in float: it measures the
// weights; verify's GPU path quantises both sides.
#pragma once

#include <cstdint>
#include <type_traits>

#include "formats/layout/fp_bits.h"
#include "formats/layout/hd.h"
#include "formats/layout/marlin_layout.h"
#include "formats/layout/triton_mxfp4_layout.h"
#include "formats/layout/trtllm_layout.h"

namespace moepack::reader {

enum class Kind : int32_t {
  kCanonical,
  kMarlin,
  kTritonWna16,
  kTritonInt8,
  kTrtllmMxfp8,
  kTrtllmFp8Block,
  kHumming,
  kMarlinFloat,
  kTritonMxfp4,
  kTrtllmFp4
};
enum class ActQuant : int32_t {
  kNone,
  kBf16,
  kFp16,
  kInt8PerToken,
  kFp8PerTokenGroup128,
  kMxfp8Block32,
  kNvfp4Block16  // NVFP4 with the static activation global scale ProjReader::act_scale
};

// Scale element types (scale_type fields below).
enum ScaleType : int32_t {
  kScaleF16 = 0,
  kScaleBf16 = 1,
  kScaleF32 = 2,
  kScaleE8m0 = 3,
  // Marlin NVFP4's "S0E5M3" byte: the high byte of (fp16 value << 1); its value is the fp16
  // whose bits are byte << 7 (nvfp4_marlin_process_scales, formats/marlin_float.h).
  kScaleS0e5m3 = 4,
  kScaleE4m3 = 5  // float8_e4m3fn (canonical NVFP4 block scales)
};
// Canonical code kinds (formats/codec.h CodeKind, same order).
enum CodeType : int32_t { kCodeUint = 0, kCodeInt = 1, kCodeFp8 = 2, kCodeFp4 = 3 };
// Canonical global scale conventions (formats/codec.h GlobalScale, same order).
enum GlobalType : int32_t { kGlobalNone = 0, kGlobalDecode = 1, kGlobalEncode = 2 };

// ---- each kind's parameters (shapes per chunk of E experts; all pointers where the bytes live:
// host memory on the CPU, device memory in kernels/) ---------------------------------------------

// kCanonical: a QuantTensor (formats/codec.h).
struct CanonicalParams {
  const uint8_t* codes;  // [E, N, K]; packed_codes: two per byte (code_nibble)
  const void* scales;    // [E, scale_rows, groups] of scale_type
  const uint8_t* zeros;  // [E, N, groups], or null (symmetric: zero point 2^(bits-1))
  const int32_t* g_idx;  // [E, K], or null (group of column k = k / group_size)
  int32_t code_type;     // CodeType
  int32_t bits;
  int32_t scale_type;          // ScaleType
  int64_t group_size;          // <= 0: one group
  int64_t groups;              // G
  int64_t scale_block_n;       // rows sharing one scale row
  int64_t scale_rows;          // ceil(N / scale_block_n)
  const float* global_scales;  // [E, global_shards], or null (global_type kGlobalNone)
  int32_t global_type;         // GlobalType: s * g (decode) or s / g (encode)
  int64_t global_shard_rows;   // rows sharing one global scale (N / global_shards)
  int64_t global_shards;
  int32_t packed_codes;  // codes of <= 4 bits two per byte (formats/moe_reader.h pack_code_nibbles)
};

// kMarlin (formats/marlin.h). Physical sizes kp x np include vLLM 0.33's intermediate padding.
struct MarlinParams {
  const uint32_t* qweight;      // [E, kp/16, np*16/pf] tiles
  const uint16_t* scales;       // [E, groups, np] in the activation dtype, permuted
  const uint32_t* qzeros;       // [E, groups, np/pf], or null (uint4b8 / uint8b128)
  const int32_t* g_idx;         // sorted g_idx [E, kp], null without act-order
  const int32_t* sort_indices;  // [E, kp], null without act-order
  int32_t bits;                 // 4 or 8
  int32_t a8;                   // 8-bit-activation tiles (32 x 32)
  int32_t scale_type;           // kScaleF16 / kScaleBf16
  int32_t grouped_scales;       // the kernel's rule: groups > 1 and not a8 (64-permutation)
  int32_t padded_w13;           // logical row n of shard n / inter sits at physical row
                                // (n / inter) * padded_inter + n % inter
  int64_t kp, np;               // physical K and N
  int64_t groups;               // G
  int64_t group_size;           // 0 when groups == 1
  int64_t inter, padded_inter;  // I and the I the parameters carry
  int64_t tiles_n;              // tiles along N
  int64_t words_per_expert;     // kp * np / pf
};

// kTritonWna16 (formats/triton_wna16.h).
struct TritonWna16Params {
  const uint8_t* qweight;  // [E, N, row_bytes] (int4: two codes a byte, low nibble first)
  const uint16_t* scales;  // [E, N, scale_cols] in the activation dtype
  const uint8_t* qzeros;   // [E, N/2, scale_cols] nibbles, or null (zero point 8 / 128)
  int32_t bits;
  int32_t scale_type;  // kScaleF16 / kScaleBf16
  int64_t row_bytes;
  int64_t scale_cols;
  int64_t group_size;  // the kernel's (halved) group size
};

// kTritonInt8 (formats/triton_int8.h).
struct TritonInt8Params {
  const int8_t* weight;       // [E, N, K]
  const float* weight_scale;  // [E, N]
};

// kTrtllmMxfp8 (formats/trtllm_mxfp8.h).
struct TrtllmMxfp8Params {
  const uint8_t* weight;        // e4m3 [E, N, K] in physical row order
  const uint8_t* weight_scale;  // E8M0, 128x4-swizzled [N, scale_cols] per expert
  int32_t w31_gated;            // W31 swap + gated reorder on top of the shuffle (gated w13)
  int64_t scale_cols;           // K / 32
};

// kTrtllmFp8Block (formats/trtllm_fp8_block.h).
struct TrtllmFp8BlockParams {
  const uint8_t* weight;          // e4m3 [E, K/128, N, 128] (BlockMajorK), shuffled rows
  const float* weight_scale_inv;  // [E, N/128, k_blocks] (W31-swapped rows for gated w13)
  int32_t w31;                    // W31 swap (gated w13)
  int64_t k_blocks;               // K / 128
};

// kTrtllmFp4 (formats/trtllm_fp4.h): FlashInfer TRT-LLM-Gen's FP4 MoE layout. Physical sizes
// np x kp include vLLM 0.33's padding (H to 256, I to 128 / 64); logical row n sits at physical
// row shuffle_a_dst_row(gated w13 ? trtllm::gated_w13_prerow(n, inter) : n, 32).
struct TrtllmFp4Params {
  const uint8_t* weight;        // [E, np, kp/2] e2m1 pairs, the even column in the low nibble
  const uint8_t* weight_scale;  // [E, np, scale_cols] 128x4-swizzled per expert (E8M0 / E4M3)
  // NVFP4: [E, global_shards] second-level scales (logical row n reads shard n /
  // global_shard_rows), or null (MXFP4). ModelOpt: vLLM's w13_weight_scale_2 = g * a (g1_alphas,
  // the input scale a = global_fold folded in: the reader takes trtllm::unfold_global of it);
  // compressed-tensors: the checkpoint's weight_global_scale, an encode divisor.
  const float* global_scale;
  int32_t global_type;  // kGlobalDecode / kGlobalEncode
  int64_t global_shards, global_shard_rows;
  float global_fold;   // a (> 0) where global_scale holds g * a, else 0
  int32_t scale_type;  // kScaleE8m0 (MXFP4) / kScaleE4m3 (NVFP4)
  int32_t block;       // 32 (MXFP4) / 16 (NVFP4) columns per scale
  int32_t gated_w13;   // up/gate interleave (gated w13), else the shuffle alone
  int64_t np, kp;      // physical rows and columns
  int64_t scale_cols;  // kp / block
  int64_t inter;       // I (gated w13: its gate rows are n < inter)
};

// How kHumming's stored codes map back to offset-binary codes (formats/humming.h).
enum HummingCodeMap : int32_t {
  kHummingOffsetBinary = 0,   // as stored: W = (c - z) * s
  kHummingSignMagnitude = 1,  // float{b}e0m{b-1}: W = (-1)^sign * magnitude * s
  kHummingInt2fp = 2,         // weight_repack_nk's int2fp: c' = c >= z ? c - z : 2^b - 1 - c
};

// kHumming (formats/humming.h). Physical sizes kp x np: K padded to 128, N to 256 at the end.
struct HummingParams {
  const uint32_t* weight;    // [E, kp/16, np*16*bits/32] Marlin 16x64 tiles
  const uint16_t* scales;    // [E, groups_p, np] in the activation dtype, 64-permuted
  const uint32_t* zeros;     // [E, groups_p, np*bits/32] 64-permuted, in order; null: 2^(bits-1)
  int32_t bits;              // 4 or 8
  int32_t code_map;          // HummingCodeMap
  int32_t scale_type;        // kScaleF16 / kScaleBf16
  int64_t kp, np;            // physical K and N
  int64_t groups_p;          // Kp / group_size
  int64_t group_size;        // > 0
  int64_t tiles_n;           // np / 64
  int64_t words_per_expert;  // kp * np * bits / 32
};

// kMarlinFloat (formats/marlin_float.h): vLLM 0.33's Marlin tiles of raw float codes (e4m3 bytes,
// e2m1 nibbles) with their scales in the kernel's formats. Physical sizes kp x np include the
// intermediate padding. weight = code * ((scale * scale_mult) [* (global * global_mult)]), which is
// the canonical dequantisation of what unpack decodes, bit for bit: scale_mult undoes the FP8
// exponent bias fused into the stored scales (2^-120 bf16, 2^-8 fp16) and the NVFP4 2^7 of the
// S0E5M3 bytes, global_mult the NVFP4 processed global scale's 2^119 (bf16) / 2^7 (fp16).
struct MarlinFloatParams {
  const uint32_t* qweight;    // [E, kp/16, np*16/pf] tiles
  const void* scales;         // [E, groups, np] of scale_type, permuted (and pair-swapped)
  const float* global_scale;  // [E] (NVFP4), or null
  int32_t bits;               // 8: e4m3 codes; 4: e2m1 codes
  int32_t scale_type;         // kScaleBf16 / kScaleF16 (FP8), kScaleE8m0 (MX), kScaleS0e5m3
  int32_t grouped_scales;     // 64-permutation (more than one group), else the 32 one
  int32_t pair_swap;          // every 4 permuted scales stored as (0, 2, 1, 3)
  int32_t padded_w13;         // as MarlinParams::padded_w13
  // gpt-oss: logical w13 row n (gate j = n < inter, up j = n - inter) sits at physical row 2j
  // (gate) or 2j + 1 (up), the checkpoint's interleave vLLM keeps
  int32_t interleaved_w13;
  float scale_mult, global_mult;
  int64_t kp, np;               // physical K and N
  int64_t groups;               // G
  int64_t group_size;           // 0 when groups == 1
  int64_t inter, padded_inter;  // I and the I the parameters carry
  int64_t tiles_n;              // tiles along N
  int64_t words_per_expert;     // kp * np / pf
};

// kTritonMxfp4 (formats/triton_mxfp4.h): gpt-oss' MXFP4 experts in the OAI Triton kernels'
// Hopper value and scale swizzles (formats/layout/triton_mxfp4_layout.h), on vLLM's padded,
// interleaved rows. weight = e2m1(code) * 2^(scale - 127), the canonical dequantisation.
struct TritonMxfp4Params {
  const uint8_t* weight;    // [E, mp/4, kbp*4] swizzled e2m1 codes
  const uint8_t* scales;    // [E, msp/32, gp*32] swizzled E8M0 codes
  int32_t interleaved_w13;  // logical w13 row n sits at physical row 2n (gate) / 2(n-I)+1 (up)
  int64_t inter;            // I (w13's interleave)
  int64_t kbp;              // value bytes per physical row (the word rows hold kbp words)
  int64_t gp;               // scale groups per physical row, padded
  int64_t num_warps;        // of the scale swizzle
  int64_t value_bytes, scale_bytes;  // per expert
};

// One projection (w13 or w2) of a chunk of experts. Trivially copyable: kernels take it by value.
struct ProjReader {
  Kind kind;
  ActQuant act;
  int64_t experts, n, k;  // LOGICAL sizes (padding hidden inside)
  float act_scale;        // kNvfp4Block16: the activations' global scale a (decode); else 0
  union {                 // the member `kind` names
    CanonicalParams canonical;
    MarlinParams marlin;
    TritonWna16Params triton_wna16;
    TritonInt8Params triton_int8;
    TrtllmMxfp8Params trtllm_mxfp8;
    TrtllmFp8BlockParams trtllm_fp8_block;
    HummingParams humming;
    MarlinFloatParams marlin_float;
    TritonMxfp4Params triton_mxfp4;
    TrtllmFp4Params trtllm_fp4;
  };
};
static_assert(std::is_trivially_copyable_v<ProjReader>, "kernels take readers by value");

// The one dispatch over Kind: f applied to the parameters of r's kind.
template <class F>
MOEPACK_HD auto visit(const ProjReader& r, F&& f) -> decltype(f(r.canonical)) {
  switch (r.kind) {
    case Kind::kMarlin:
      return f(r.marlin);
    case Kind::kTritonWna16:
      return f(r.triton_wna16);
    case Kind::kTritonInt8:
      return f(r.triton_int8);
    case Kind::kTrtllmMxfp8:
      return f(r.trtllm_mxfp8);
    case Kind::kTrtllmFp8Block:
      return f(r.trtllm_fp8_block);
    case Kind::kHumming:
      return f(r.humming);
    case Kind::kMarlinFloat:
      return f(r.marlin_float);
    case Kind::kTritonMxfp4:
      return f(r.triton_mxfp4);
    case Kind::kTrtllmFp4:
      return f(r.trtllm_fp4);
    default:
      return f(r.canonical);
  }
}

// The distance between the columns weight_strided decodes at once: a warp's 32 lanes, each taking
// every 32nd column (a multiple of Marlin's tile heights, 16 and 32).
constexpr int64_t kStrideCols = 32;

// ---- scalar helpers ----------------------------------------------------------------------------

MOEPACK_HD float scale_at(const void* base, int64_t index, int32_t type) {
  switch (type) {
    case kScaleF16:
      return hd::f16_value(static_cast<const uint16_t*>(base)[index]);
    case kScaleBf16:
      return hd::bf16_value(static_cast<const uint16_t*>(base)[index]);
    case kScaleF32:
      return static_cast<const float*>(base)[index];
    case kScaleS0e5m3:
      return hd::f16_value(static_cast<uint16_t>(static_cast<const uint8_t*>(base)[index] << 7));
    case kScaleE4m3:
      return hd::e4m3_value(static_cast<const uint8_t*>(base)[index]);
    default:
      return hd::e8m0_value(static_cast<const uint8_t*>(base)[index]);
  }
}

// ---- kCanonical --------------------------------------------------------------------------------

// Code i of codes packed two per byte: the low nibble of byte i / 2 for even i, the high one for
// odd i; a signed (kCodeInt) code sign-extended to the byte the unpacked array holds.
MOEPACK_HD uint8_t code_nibble(const CanonicalParams& p, int64_t i) {
  const uint32_t nib = (static_cast<uint32_t>(p.codes[i >> 1]) >> ((i & 1) * 4)) & 0xfu;
  return static_cast<uint8_t>(p.code_type == kCodeInt && (nib & 8u) ? nib | 0xf0u : nib);
}

// = formats/codec.cpp dequantize_expert, element (n, kk).
MOEPACK_HD float kind_weight(const CanonicalParams& p, const ProjReader& r, int64_t e, int64_t n,
                             int64_t kk) {
  const int64_t K = r.k, G = p.groups;
  const int64_t g = p.g_idx ? p.g_idx[e * K + kk] : (p.group_size > 0 ? kk / p.group_size : 0);
  float s = scale_at(p.scales, (e * p.scale_rows + n / p.scale_block_n) * G + g, p.scale_type);
  if (p.global_type != kGlobalNone) {
    const float gs = p.global_scales[e * p.global_shards + n / p.global_shard_rows];
    s = p.global_type == kGlobalDecode ? s * gs : s / gs;
  }
  const int64_t ci = (e * r.n + n) * K + kk;
  const uint8_t c = p.packed_codes ? code_nibble(p, ci) : p.codes[ci];
  switch (p.code_type) {
    case kCodeUint: {
      const float zf = p.zeros ? static_cast<float>(p.zeros[(e * r.n + n) * G + g])
                               : static_cast<float>(1 << (p.bits - 1));
      return (static_cast<float>(c) - zf) * s;
    }
    case kCodeInt:
      return static_cast<float>(static_cast<int8_t>(c)) * s;
    case kCodeFp4:
      return hd::e2m1_value(c) * s;
    default:
      return hd::e4m3_value(c) * s;
  }
}

// The dequantised value of canonical code c with zero point zf (kCodeUint) and scale s: the
// switch of kind_weight below.
// The group of each column of a row as the strided decoders walk its columns in increasing
// order: g_idx[kk] (act-order), else group g covers [g * group_size, (g + 1) * group_size), found
// by a division only where a column passes the group's end (group_size <= 0: one group, 0).
struct GroupWalk {
  MOEPACK_HD GroupWalk(const int32_t* g_idx, int64_t group_size)
      : g_idx_(g_idx), size_(group_size > 0 ? static_cast<uint32_t>(group_size) : 0u) {}
  MOEPACK_HD int64_t of(int64_t kk) {
    if (g_idx_) return g_idx_[kk];
    if (size_ && kk >= next_) {
      group_ = static_cast<uint32_t>(kk) / size_;
      next_ = (group_ + 1) * size_;
    }
    return group_;
  }

 private:
  const int32_t* g_idx_;
  uint32_t size_;
  int64_t group_ = 0, next_ = 0;
};

MOEPACK_HD float canonical_value(const CanonicalParams& p, uint8_t c, float zf, float s) {
  switch (p.code_type) {
    case kCodeUint:
      return (static_cast<float>(c) - zf) * s;
    case kCodeInt:
      return static_cast<float>(static_cast<int8_t>(c)) * s;
    case kCodeFp4:
      return hd::e2m1_value(c) * s;
    default:
      return hd::e4m3_value(c) * s;
  }
}

// Columns k0, k0 + kStrideCols, ... (count of them) of row n at once (weight_strided below):
// kind_weight's formula with the row's scale row, zero row and global scale found once, the scale
// and zero point reloaded only where the group changes, and no 64-bit division (one expert's sizes
// are below 2^31). Same floats.
MOEPACK_HD void kind_weight_strided(const CanonicalParams& p, const ProjReader& r, int64_t e,
                                    int64_t n, int64_t k0, int count, float* w) {
  const int64_t K = r.k, G = p.groups, row = e * r.n + n;
  const uint32_t un = static_cast<uint32_t>(n);
  const int64_t srow = (e * p.scale_rows + un / static_cast<uint32_t>(p.scale_block_n)) * G;
  const float global =
      p.global_type != kGlobalNone
          ? p.global_scales[e * p.global_shards + un / static_cast<uint32_t>(p.global_shard_rows)]
          : 0.0f;
  const uint8_t* zrow = p.zeros ? p.zeros + row * G : nullptr;
  GroupWalk groups(p.g_idx ? p.g_idx + e * K : nullptr, p.group_size);
  int64_t g = -1;
  float s = 0.0f, zf = static_cast<float>(1 << (p.bits - 1));
  MOEPACK_UNROLL
  for (int j = 0; j < count; ++j) {
    const int64_t kk = k0 + kStrideCols * j;
    const int64_t gk = groups.of(kk);
    if (gk != g) {
      g = gk;
      s = scale_at(p.scales, srow + g, p.scale_type);
      if (p.global_type != kGlobalNone)
        s = p.global_type == kGlobalDecode ? s * global : s / global;
      if (zrow) zf = static_cast<float>(zrow[g]);
    }
    const int64_t ci = row * K + kk;
    w[j] = canonical_value(p, p.packed_codes ? code_nibble(p, ci) : p.codes[ci], zf, s);
  }
}

// ---- kMarlin -----------------------------------------------------------------------------------

// The Marlin MoE kernel's reading of (n, kk): tiles through marlin::word_field_of, scales and
// zero points through the inverse chunk permutations, the group of sorted row kk from the stored
// (sorted) g_idx under act-order.
MOEPACK_HD float kind_weight(const MarlinParams& p, const ProjReader&, int64_t e, int64_t n,
                             int64_t kk) {
  const int bits = p.bits;
  const bool a8 = p.a8 != 0;
  const int64_t Np = p.np;
  if (p.padded_w13) n += (n / p.inter) * (p.padded_inter - p.inter);
  const int64_t g = p.g_idx ? p.g_idx[e * p.kp + kk] : (p.group_size > 0 ? kk / p.group_size : 0);
  int word = 0, field = 0;
  marlin::word_field_of(bits, a8, kk, n, &word, &field);
  const int64_t tau = (kk / marlin::tile_k(a8)) * p.tiles_n + n / marlin::tile_n(a8);
  const uint32_t mask = (1u << bits) - 1u;
  const uint32_t w = p.qweight[e * p.words_per_expert + tau * marlin::words_per_tile(bits) + word];
  const float code = static_cast<float>((w >> (bits * field)) & mask);
  // Scale (g, n) and zero point (g, n) of the row-major [G, Np] matrices, as stored permuted.
  const int64_t j = g * Np + n;
  const bool grouped = p.grouped_scales != 0;
  const int64_t sc = marlin::scale_chunk(grouped);
  const int64_t spos = (j / sc) * sc + marlin::scale_perm_dst(grouped, static_cast<int>(j % sc));
  const float s = scale_at(p.scales + e * p.groups * Np, spos, p.scale_type);
  float z = static_cast<float>(1 << (bits - 1));
  if (p.qzeros) {
    const int pf = marlin::pack_factor(bits);
    const int64_t zpos = (j / 64) * 64 + marlin::zero_point_dst(bits, a8, static_cast<int>(j % 64));
    const uint32_t zword = p.qzeros[e * p.groups * (Np / pf) + zpos / pf];
    z = static_cast<float>((zword >> (bits * (zpos % pf))) & mask);
  }
  return (code - z) * s;
}

// w[kk] = kind_weight(p, r, e, n, kk) for kk in [0, r.k), with what is fixed along a row hoisted:
// the physical row, the (word, field) of each row of a tile (word_field_of depends on kk only
// modulo the tile height), the tile walk, and the scale and zero point per group (no division
// per element). Same formula, same floats.
MOEPACK_HD void kind_weight_row(const MarlinParams& p, const ProjReader& r, int64_t e, int64_t n,
                                float* w) {
  const int bits = p.bits;
  const bool a8 = p.a8 != 0;
  const int64_t Np = p.np;
  if (p.padded_w13) n += (n / p.inter) * (p.padded_inter - p.inter);
  const int tk = marlin::tile_k(a8);
  int word[32], field[32];
  for (int k = 0; k < tk; ++k) marlin::word_field_of(bits, a8, k, n, &word[k], &field[k]);
  const uint32_t mask = (1u << bits) - 1u;
  const int64_t tile_words = marlin::words_per_tile(bits);
  const bool grouped = p.grouped_scales != 0;
  const int64_t sc = marlin::scale_chunk(grouped);
  const uint16_t* scales = p.scales + e * p.groups * Np;
  const int pf = marlin::pack_factor(bits);
  float s = 0.0f, z = static_cast<float>(1 << (bits - 1));
  const auto load_group = [&](int64_t g) {
    const int64_t j = g * Np + n;
    s = scale_at(scales, (j / sc) * sc + marlin::scale_perm_dst(grouped, static_cast<int>(j % sc)),
                 p.scale_type);
    if (p.qzeros) {
      const int64_t zpos =
          (j / 64) * 64 + marlin::zero_point_dst(bits, a8, static_cast<int>(j % 64));
      const uint32_t zword = p.qzeros[e * p.groups * (Np / pf) + zpos / pf];
      z = static_cast<float>((zword >> (bits * (zpos % pf))) & mask);
    }
  };
  const int32_t* gs = p.g_idx ? p.g_idx + e * p.kp : nullptr;
  // Without g_idx, group g covers columns [g * group_size, (g + 1) * group_size).
  int64_t g = gs ? gs[0] : 0, next_group = p.group_size > 0 ? p.group_size : r.k;
  load_group(g);
  const uint32_t* tile = p.qweight + e * p.words_per_expert + (n / marlin::tile_n(a8)) * tile_words;
  const int64_t tile_row_words = p.tiles_n * tile_words;  // one row of tiles along N
  for (int64_t k0 = 0; k0 < r.k; k0 += tk, tile += tile_row_words) {
    const int rows = r.k - k0 < tk ? static_cast<int>(r.k - k0) : tk;
    for (int t = 0; t < rows; ++t) {
      const int64_t kk = k0 + t;
      if (gs) {
        if (gs[kk] != g) load_group(g = gs[kk]);
      } else if (kk == next_group) {
        load_group(++g);
        next_group += p.group_size;
      }
      const uint32_t wd = tile[word[t]];
      w[kk] = (static_cast<float>((wd >> (bits * field[t])) & mask) - z) * s;
    }
  }
}

// Act-order: the kernel permutes the activation columns (permute_cols_kernel over the sort
// indices).
MOEPACK_HD int64_t kind_act_col(const MarlinParams& p, const ProjReader&, int64_t e, int64_t kk) {
  return p.sort_indices ? p.sort_indices[e * p.kp + kk] : kk;
}

// Columns k0, k0 + kStrideCols, ... (count of them) of row n at once: kind_weight's formula with
// the physical row found once, and with it the word and field of every tile (a column 32 further
// on keeps its place in the 16- or 32-high tile: one tile row further), the scale and zero point
// reloaded only where the group changes, and no 64-bit division (one expert's sizes are below 2^31;
// tile, chunk and pack sizes are powers of two). The GPU runtime's hot loop; same floats.
MOEPACK_HD void kind_weight_strided(const MarlinParams& p, const ProjReader&, int64_t e, int64_t n,
                                    int64_t k0, int count, float* w) {
  const int bits = p.bits;
  const bool a8 = p.a8 != 0;
  const int64_t Np = p.np;
  if (p.padded_w13)
    n += static_cast<int64_t>(static_cast<uint32_t>(n) / static_cast<uint32_t>(p.inter)) *
         (p.padded_inter - p.inter);
  int word = 0, field = 0;
  marlin::word_field_of(bits, a8, k0, n, &word, &field);
  const int shift = bits * field, tk_shift = a8 ? 5 : 4;
  const int64_t tile_words = marlin::words_per_tile(bits);
  const int64_t row_words = p.tiles_n * tile_words;  // one row of tiles along N
  const uint32_t* at =
      p.qweight + e * p.words_per_expert + (a8 ? n >> 5 : n >> 6) * tile_words + word;
  const uint32_t mask = (1u << bits) - 1u;
  const bool grouped = p.grouped_scales != 0;
  const int64_t sc = marlin::scale_chunk(grouped);  // 64 or 32
  const uint16_t* scales = p.scales + e * p.groups * Np;
  const int pf_shift = bits == 4 ? 3 : 2;  // log2 of pack_factor: 8 or 4 fields a word
  const uint32_t* zeros = p.qzeros ? p.qzeros + e * p.groups * (Np >> pf_shift) : nullptr;
  GroupWalk groups(p.g_idx ? p.g_idx + e * p.kp : nullptr, p.group_size);
  int64_t g = -1;
  float s = 0.0f, z = static_cast<float>(1 << (bits - 1));
  MOEPACK_UNROLL
  for (int j = 0; j < count; ++j) {
    const int64_t kk = k0 + kStrideCols * j;
    const int64_t gk = groups.of(kk);
    if (gk != g) {
      g = gk;
      const int64_t jj = g * Np + n;
      s = scale_at(
          scales,
          (jj & ~(sc - 1)) + marlin::scale_perm_dst(grouped, static_cast<int>(jj & (sc - 1))),
          p.scale_type);
      if (zeros) {
        const int64_t zpos =
            (jj & ~int64_t{63}) + marlin::zero_point_dst(bits, a8, static_cast<int>(jj & 63));
        z = static_cast<float>(
            (zeros[zpos >> pf_shift] >> (bits * (zpos & ((1 << pf_shift) - 1)))) & mask);
      }
    }
    w[j] = (static_cast<float>((at[(kk >> tk_shift) * row_words] >> shift) & mask) - z) * s;
  }
}

// ---- kTritonWna16 ------------------------------------------------------------------------------

// fused_moe_kernel_gptq_awq's dequantisation.
MOEPACK_HD float kind_weight(const TritonWna16Params& p, const ProjReader& r, int64_t e, int64_t n,
                             int64_t kk) {
  const int64_t row = e * r.n + n, Gp = p.scale_cols;
  const int64_t grp = kk / p.group_size;
  const uint8_t* b = p.qweight + row * p.row_bytes;
  const bool int4 = p.bits == 4;
  const float code =
      int4 ? static_cast<float>((b[kk >> 1] >> (4 * (kk & 1))) & 15) : static_cast<float>(b[kk]);
  const float zp =
      p.qzeros
          ? static_cast<float>((p.qzeros[(e * (r.n / 2) + n / 2) * Gp + grp] >> (4 * (n & 1))) & 15)
          : (int4 ? 8.0f : 128.0f);
  return (code - zp) * scale_at(p.scales, row * Gp + grp, p.scale_type);
}

// The row without a division per element: the group advances every group_size columns.
MOEPACK_HD void kind_weight_row(const TritonWna16Params& p, const ProjReader& r, int64_t e,
                                int64_t n, float* w) {
  const int64_t row = e * r.n + n, Gp = p.scale_cols;
  const uint8_t* b = p.qweight + row * p.row_bytes;
  const bool int4 = p.bits == 4;
  const uint8_t* zrow = p.qzeros ? p.qzeros + (e * (r.n / 2) + n / 2) * Gp : nullptr;
  const int zshift = 4 * static_cast<int>(n & 1);
  const int64_t gsz = p.group_size > 0 ? p.group_size : r.k;  // builders give > 0
  for (int64_t k0 = 0, grp = 0; k0 < r.k; k0 += gsz, ++grp) {
    const float zp = zrow ? static_cast<float>((zrow[grp] >> zshift) & 15) : (int4 ? 8.0f : 128.0f);
    const float s = scale_at(p.scales, row * Gp + grp, p.scale_type);
    const int64_t k1 = r.k - k0 < gsz ? r.k : k0 + gsz;
    for (int64_t kk = k0; kk < k1; ++kk) {
      const float code = int4 ? static_cast<float>((b[kk >> 1] >> (4 * (kk & 1))) & 15)
                              : static_cast<float>(b[kk]);
      w[kk] = (code - zp) * s;
    }
  }
}

// ---- kTritonInt8 -------------------------------------------------------------------------------

MOEPACK_HD float kind_weight(const TritonInt8Params& p, const ProjReader& r, int64_t e, int64_t n,
                             int64_t kk) {
  const int64_t row = e * r.n + n;
  return static_cast<float>(p.weight[row * r.k + kk]) * p.weight_scale[row];
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

MOEPACK_HD float kind_weight(const TrtllmMxfp8Params& p, const ProjReader& r, int64_t e, int64_t n,
                             int64_t kk) {
  const int64_t rows = r.n, K = r.k, cols = p.scale_cols;
  const int64_t pr = mxfp8_physical_row(n, rows, p.w31_gated != 0);
  const uint8_t* sq = p.weight_scale + e * rows * cols;
  const float s = hd::e8m0_value(sq[trtllm::scale_128x4_offset(pr, kk >> 5, cols)]);
  return hd::e4m3_value(p.weight[(e * rows + pr) * K + kk]) * s;
}

// The row with its physical row found once and one scale per block of 32.
MOEPACK_HD void kind_weight_row(const TrtllmMxfp8Params& p, const ProjReader& r, int64_t e,
                                int64_t n, float* w) {
  const int64_t rows = r.n, K = r.k, cols = p.scale_cols;
  const int64_t pr = mxfp8_physical_row(n, rows, p.w31_gated != 0);
  const uint8_t* sq = p.weight_scale + e * rows * cols;
  const uint8_t* wrow = p.weight + (e * rows + pr) * K;
  for (int64_t b = 0; b * 32 < K; ++b) {
    const float s = hd::e8m0_value(sq[trtllm::scale_128x4_offset(pr, b, cols)]);
    const int64_t k1 = K - b * 32 < 32 ? K : b * 32 + 32;
    for (int64_t kk = b * 32; kk < k1; ++kk) w[kk] = hd::e4m3_value(wrow[kk]) * s;
  }
}

// ---- kTrtllmFp8Block ---------------------------------------------------------------------------

MOEPACK_HD float kind_weight(const TrtllmFp8BlockParams& p, const ProjReader& r, int64_t e,
                             int64_t n, int64_t kk) {
  const int64_t rows = r.n, kblocks = p.k_blocks;
  int64_t w31 = n;  // row of the W31-ordered matrix (and of the stored scales' 128-row blocks)
  if (p.w31) {
    const int64_t half = rows / 2;
    w31 = n >= half ? n - half : n + half;
  }
  const int64_t pr = trtllm::shuffle_a_dst_row(w31, 16);  // shuffle_matrix_a, epilogue tile 64
  const int64_t kb = kk >> 7;
  const uint8_t* wq = p.weight + e * rows * r.k;
  const float* sq = p.weight_scale_inv + e * (rows / 128) * kblocks;
  return hd::e4m3_value(wq[(kb * rows + pr) * 128 + (kk & 127)]) * sq[(w31 >> 7) * kblocks + kb];
}

// The row with its W31 and physical rows found once and one scale per 128-block.
MOEPACK_HD void kind_weight_row(const TrtllmFp8BlockParams& p, const ProjReader& r, int64_t e,
                                int64_t n, float* w) {
  const int64_t rows = r.n, kblocks = p.k_blocks;
  int64_t w31 = n;
  if (p.w31) {
    const int64_t half = rows / 2;
    w31 = n >= half ? n - half : n + half;
  }
  const int64_t pr = trtllm::shuffle_a_dst_row(w31, 16);
  const uint8_t* wq = p.weight + e * rows * r.k;
  const float* sq = p.weight_scale_inv + e * (rows / 128) * kblocks + (w31 >> 7) * kblocks;
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const float s = sq[kb];
    const uint8_t* blk = wq + (kb * rows + pr) * 128;  // BlockMajorK [kb][row][j]
    const int64_t len = r.k - kb * 128 < 128 ? r.k - kb * 128 : 128;
    for (int64_t j = 0; j < len; ++j) w[kb * 128 + j] = hd::e4m3_value(blk[j]) * s;
  }
}

// ---- kHumming ----------------------------------------------------------------------------------

// The dequantised weight of stored code `c` with zero code z (offset binary) and scale s.
MOEPACK_HD float humming_value(const HummingParams& p, uint32_t c, uint32_t z, float s) {
  const uint32_t half = 1u << (p.bits - 1), max = (1u << p.bits) - 1u;
  switch (p.code_map) {
    case kHummingSignMagnitude: {
      const float mag = static_cast<float>(c & (half - 1u));
      return ((c & half) ? -mag : mag) * s;
    }
    case kHummingInt2fp:
      c = c <= max - z ? c + z : max - c;
      return (static_cast<float>(c) - static_cast<float>(z)) * s;
    default:
      return (static_cast<float>(c) - static_cast<float>(z)) * s;
  }
}

// The scale of (group g, physical column n) and its zero code: position (j / 64) * 64 +
// 8x8-transpose(j % 64) of the row-major [groups_p, np] matrix (transform_humming_weight_scale),
// zero codes packed in order after the same permutation (transform_humming_zero_point).
MOEPACK_HD void humming_scale_zero(const HummingParams& p, int64_t e, int64_t g, int64_t n,
                                   float* s, uint32_t* z) {
  const int64_t j = g * p.np + n;
  const int64_t pos = (j / 64) * 64 + marlin::scale_perm_grouped_dst(static_cast<int>(j % 64));
  *s = scale_at(p.scales + e * p.groups_p * p.np, pos, p.scale_type);
  *z = 1u << (p.bits - 1);
  if (p.zeros) {
    const int pf = 32 / p.bits;
    const uint32_t w = p.zeros[e * p.groups_p * (p.np / pf) + pos / pf];
    *z = (w >> (p.bits * (pos % pf))) & ((1u << p.bits) - 1u);
  }
}

// Humming's reading of (n, kk): Marlin's 16x64 tile map over the padded [np, kp] (logical row n
// is physical row n: the padding sits at the end), then the code map.
MOEPACK_HD float kind_weight(const HummingParams& p, const ProjReader&, int64_t e, int64_t n,
                             int64_t kk) {
  int word = 0, field = 0;
  marlin::word_field_of(p.bits, false, kk, n, &word, &field);
  const int64_t tau = (kk / 16) * p.tiles_n + n / 64;
  const uint32_t w = p.weight[e * p.words_per_expert + tau * marlin::words_per_tile(p.bits) + word];
  const uint32_t c = (w >> (p.bits * field)) & ((1u << p.bits) - 1u);
  float s = 0.0f;
  uint32_t z = 0;
  humming_scale_zero(p, e, kk / p.group_size, n, &s, &z);
  return humming_value(p, c, z, s);
}

// The row at once: (word, field) of the 16 rows of a tile, scale and zero per group hoisted.
MOEPACK_HD void kind_weight_row(const HummingParams& p, const ProjReader& r, int64_t e, int64_t n,
                                float* w) {
  int word[16], field[16];
  for (int k = 0; k < 16; ++k) marlin::word_field_of(p.bits, false, k, n, &word[k], &field[k]);
  const uint32_t* q = p.weight + e * p.words_per_expert;
  const int64_t tile_words = marlin::words_per_tile(p.bits), nt = n / 64;
  const uint32_t mask = (1u << p.bits) - 1u;
  float s = 0.0f;
  uint32_t z = 0;
  for (int64_t kk = 0; kk < r.k; ++kk) {
    if (kk % p.group_size == 0) humming_scale_zero(p, e, kk / p.group_size, n, &s, &z);
    const int t = static_cast<int>(kk % 16);
    const uint32_t wd = q[((kk / 16) * p.tiles_n + nt) * tile_words + word[t]];
    w[kk] = humming_value(p, (wd >> (p.bits * field[t])) & mask, z, s);
  }
}

// ---- kMarlinFloat ------------------------------------------------------------------------------

// The value of one raw code: e4m3 byte or e2m1 nibble.
MOEPACK_HD float marlin_float_code(const MarlinFloatParams& p, uint32_t code) {
  return p.bits == 8 ? hd::e4m3_value(static_cast<uint8_t>(code))
                     : hd::e2m1_value(static_cast<uint8_t>(code));
}

// Scale (g, n) of the row-major [G, Np] matrix: 64/32-chunk permutation, then the pair swap.
MOEPACK_HD float marlin_float_scale(const MarlinFloatParams& p, int64_t e, int64_t g, int64_t n) {
  const int64_t j = g * p.np + n;
  const bool grouped = p.grouped_scales != 0;
  const int64_t sc = marlin::scale_chunk(grouped);
  int64_t pos = (j / sc) * sc + marlin::scale_perm_dst(grouped, static_cast<int>(j % sc));
  if (p.pair_swap) pos = marlin::pair_swap_pos(pos);
  const int64_t per_expert = p.groups * p.np;
  const int32_t t = p.scale_type;
  const void* base =
      t == kScaleBf16 || t == kScaleF16
          ? static_cast<const void*>(static_cast<const uint16_t*>(p.scales) + e * per_expert)
          : static_cast<const void*>(static_cast<const uint8_t*>(p.scales) + e * per_expert);
  return scale_at(base, pos, t) * p.scale_mult;
}

// The physical row of logical row n (w13's padding or gpt-oss' interleave).
MOEPACK_HD int64_t marlin_float_row(const MarlinFloatParams& p, int64_t n) {
  if (p.interleaved_w13) return n < p.inter ? 2 * n : 2 * (n - p.inter) + 1;
  if (p.padded_w13) return n + (n / p.inter) * (p.padded_inter - p.inter);
  return n;
}

MOEPACK_HD float kind_weight(const MarlinFloatParams& p, const ProjReader&, int64_t e, int64_t n,
                             int64_t kk) {
  n = marlin_float_row(p, n);
  const int64_t g = p.group_size > 0 ? kk / p.group_size : 0;
  int word = 0, field = 0;
  marlin::word_field_of(p.bits, false, kk, n, &word, &field);
  const int64_t tau = (kk / 16) * p.tiles_n + n / 64;
  const uint32_t w =
      p.qweight[e * p.words_per_expert + tau * marlin::words_per_tile(p.bits) + word];
  float s = marlin_float_scale(p, e, g, n);
  // dequantize_expert's order: code * (scale * global).
  if (p.global_scale) s *= p.global_scale[e] * p.global_mult;
  return marlin_float_code(p, (w >> (p.bits * field)) & ((1u << p.bits) - 1u)) * s;
}

// The row with the (word, field) of each tile row and one scale per group hoisted.
MOEPACK_HD void kind_weight_row(const MarlinFloatParams& p, const ProjReader& r, int64_t e,
                                int64_t n, float* w) {
  n = marlin_float_row(p, n);
  int word[16], field[16];
  for (int k = 0; k < 16; ++k) marlin::word_field_of(p.bits, false, k, n, &word[k], &field[k]);
  const uint32_t mask = (1u << p.bits) - 1u;
  const int64_t tile_words = marlin::words_per_tile(p.bits);
  const uint32_t* tile = p.qweight + e * p.words_per_expert + (n / 64) * tile_words;
  const int64_t tile_row_words = p.tiles_n * tile_words;
  const bool global = p.global_scale != nullptr;
  const float gs = global ? p.global_scale[e] * p.global_mult : 1.0f;
  const int64_t group = p.group_size > 0 ? p.group_size : r.k;
  // dequantize_expert's order: code * (scale * global).
  float s = marlin_float_scale(p, e, 0, n);
  if (global) s *= gs;
  for (int64_t k0 = 0; k0 < r.k; k0 += 16, tile += tile_row_words) {
    const int rows = r.k - k0 < 16 ? static_cast<int>(r.k - k0) : 16;
    for (int t = 0; t < rows; ++t) {
      const int64_t kk = k0 + t;
      if (kk > 0 && kk % group == 0) {
        s = marlin_float_scale(p, e, kk / group, n);
        if (global) s *= gs;
      }
      w[kk] = marlin_float_code(p, (tile[word[t]] >> (p.bits * field[t])) & mask) * s;
    }
  }
}

// ---- kTritonMxfp4 ------------------------------------------------------------------------------

MOEPACK_HD float kind_weight(const TritonMxfp4Params& p, const ProjReader&, int64_t e, int64_t n,
                             int64_t kk) {
  const int64_t m = p.interleaved_w13 ? (n < p.inter ? 2 * n : 2 * (n - p.inter) + 1) : n;
  const int64_t b = kk >> 1;
  const uint32_t w =
      triton_mx::load_word(p.weight + e * p.value_bytes, triton_mx::value_word(m, b, p.kbp));
  const uint32_t c =
      triton_mx::value_code(w, triton_mx::value_slot(m, b), static_cast<int>(kk & 1));
  const uint8_t s =
      p.scales[e * p.scale_bytes + triton_mx::scale_offset(m, kk >> 5, p.gp, p.num_warps)];
  return hd::e2m1_value(static_cast<uint8_t>(c)) * hd::e8m0_value(s);
}

// ---- kTrtllmFp4 --------------------------------------------------------------------------------

MOEPACK_HD int64_t trtllm_fp4_row(const TrtllmFp4Params& p, int64_t n) {
  return trtllm::shuffle_a_dst_row(p.gated_w13 ? trtllm::gated_w13_prerow(n, p.inter) : n, 32);
}

// The second-level scale of logical row n of expert e (1 without one).
MOEPACK_HD float trtllm_fp4_global(const TrtllmFp4Params& p, int64_t e, int64_t n) {
  if (!p.global_scale) return 1.0f;
  const float g = p.global_scale[e * p.global_shards + n / p.global_shard_rows];
  return p.global_fold > 0.0f ? trtllm::unfold_global(g, p.global_fold) : g;
}

// dequantize_expert's order: code * (scale * global) or code * (scale / global).
MOEPACK_HD float trtllm_fp4_scale(const TrtllmFp4Params& p, int64_t e, int64_t pr, int64_t b,
                                  float global) {
  const uint8_t* sq = p.weight_scale + e * p.np * p.scale_cols;
  float s = scale_at(sq, trtllm::scale_128x4_offset(pr, b, p.scale_cols), p.scale_type);
  if (p.global_scale) s = p.global_type == kGlobalEncode ? s / global : s * global;
  return s;
}

MOEPACK_HD float kind_weight(const TrtllmFp4Params& p, const ProjReader&, int64_t e, int64_t n,
                             int64_t kk) {
  const int64_t pr = trtllm_fp4_row(p, n);
  const uint8_t byte = p.weight[(e * p.np + pr) * (p.kp / 2) + kk / 2];
  return hd::e2m1_value(static_cast<uint8_t>((byte >> (4 * (kk & 1))) & 15)) *
         trtllm_fp4_scale(p, e, pr, kk / p.block, trtllm_fp4_global(p, e, n));
}

// The row with its physical row found once and one scale per block.
MOEPACK_HD void kind_weight_row(const TrtllmFp4Params& p, const ProjReader& r, int64_t e, int64_t n,
                                float* w) {
  const int64_t pr = trtllm_fp4_row(p, n);
  const uint8_t* wrow = p.weight + (e * p.np + pr) * (p.kp / 2);
  const float global = trtllm_fp4_global(p, e, n);
  for (int64_t b = 0; b * p.block < r.k; ++b) {
    const float s = trtllm_fp4_scale(p, e, pr, b, global);
    const int64_t k1 = r.k - b * p.block < p.block ? r.k : b * p.block + p.block;
    for (int64_t kk = b * p.block; kk < k1; ++kk)
      w[kk] = hd::e2m1_value(static_cast<uint8_t>((wrow[kk / 2] >> (4 * (kk & 1))) & 15)) * s;
  }
}

// ---- the contract ------------------------------------------------------------------------------

// Every kind but Marlin act-order multiplies column kk by activation column kk.
template <class P>
MOEPACK_HD int64_t kind_act_col(const P&, const ProjReader&, int64_t, int64_t kk) {
  return kk;
}

MOEPACK_HD float weight(const ProjReader& r, int64_t e, int64_t n, int64_t kk) {
  return visit(r, [&](const auto& p) { return kind_weight(p, r, e, n, kk); });
}

MOEPACK_HD int64_t act_col(const ProjReader& r, int64_t e, int64_t kk) {
  return visit(r, [&](const auto& p) { return kind_act_col(p, r, e, kk); });
}

// A kind without a row decoder of its own reads its row element by element.
template <class P>
MOEPACK_HD void kind_weight_row(const P& p, const ProjReader& r, int64_t e, int64_t n, float* w) {
  for (int64_t kk = 0; kk < r.k; ++kk) w[kk] = kind_weight(p, r, e, n, kk);
}

// w[kk] = weight(r, e, n, kk) for kk in [0, r.k): a whole row with one dispatch (bit for bit the
// same values: tests/test_util.cpp expect_reader_matches).
MOEPACK_HD void weight_row(const ProjReader& r, int64_t e, int64_t n, float* w) {
  visit(r, [&](const auto& p) { kind_weight_row(p, r, e, n, w); });
}

// A kind without a strided decoder of its own reads its columns element by element.
template <class P>
MOEPACK_HD void kind_weight_strided(const P& p, const ProjReader& r, int64_t e, int64_t n,
                                    int64_t k0, int count, float* w) {
  for (int j = 0; j < count; ++j) w[j] = kind_weight(p, r, e, n, k0 + kStrideCols * j);
}

// w[j] = weight(r, e, n, k0 + kStrideCols * j) for j in [0, count), k0 + kStrideCols * (count - 1)
// < r.k: the columns one lane of the GPU runtime's warps takes (lane l: l, l + 32, ...), with one
// dispatch (bit for bit the same values: tests/test_util.cpp expect_reader_matches).
MOEPACK_HD void weight_strided(const ProjReader& r, int64_t e, int64_t n, int64_t k0, int count,
                               float* w) {
  visit(r, [&](const auto& p) { kind_weight_strided(p, r, e, n, k0, count, w); });
}

// col[kk] = act_col(r, e, kk) for kk in [0, r.k).
MOEPACK_HD void act_cols(const ProjReader& r, int64_t e, int64_t* col) {
  visit(r, [&](const auto& p) {
    for (int64_t kk = 0; kk < r.k; ++kk) col[kk] = kind_act_col(p, r, e, kk);
  });
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

// TRT-LLM's NVFP4 activation quantiser (cvt_warp_fp16_to_fp4 with SFScaleVal = gs = 1 / a), in
// the activations' own units: per block of 16 the e4m3 block scale sf of gs * amax / 6, codes
// e2m1(x / (sf / gs)) (all zero where sf is 0), each value e2m1(q) * sf * a.
MOEPACK_HD void quantize_nvfp4_block16(const float* x, int64_t k, float a, float* out) {
  const float gs = 1.0f / a;
  for (int64_t b0 = 0; b0 < k; b0 += 16) {
    const int64_t len = k - b0 < 16 ? k - b0 : 16;
    bool finite = true;
    const float amax = abs_max(x + b0, len, &finite);
    if (!finite || !hd::is_finite_bits(gs)) {
      fill_nan(out + b0, len);
      continue;
    }
    const float sf = hd::e4m3_value(hd::e4m3_round_satfinite(gs * (amax * (1.0f / 6.0f))));
    const float inv = sf != 0.0f ? 1.0f / (sf * (1.0f / gs)) : 0.0f;
    for (int64_t i = 0; i < len; ++i)
      out[b0 + i] = hd::e2m1_value(hd::e2m1_round_satfinite(x[b0 + i] * inv)) * sf * a;
  }
}

// The length of one quantisation unit of `act` over a row of k values: each unit's outputs depend
// on its own inputs only, and the units start at multiples of it (int8 per token: the whole row;
// the 16-bit roundings and kNone: each value alone).
MOEPACK_HD int64_t activation_unit(ActQuant act, int64_t k) {
  switch (act) {
    case ActQuant::kInt8PerToken:
      return k;
    case ActQuant::kFp8PerTokenGroup128:
      return 128;
    case ActQuant::kMxfp8Block32:
      return 32;
    case ActQuant::kNvfp4Block16:
      return 16;
    default:
      return 1;
  }
}

// The values [k0, k0 + len) of a row of r.k, quantised and dequantised, with x and out pointing at
// column k0: k0 a multiple of activation_unit(r.act, r.k) and len whole units (or up to the row's
// end). Equals quantize_activation_row over the same columns (the GPU runtime quantises the units
// of a row in parallel). Sequential.
MOEPACK_HD void quantize_activation_span(const ProjReader& r, const float* x, int64_t len,
                                         float* out) {
  switch (r.act) {
    case ActQuant::kNone:
      for (int64_t i = 0; i < len; ++i) out[i] = x[i];
      return;
    case ActQuant::kBf16:
      for (int64_t i = 0; i < len; ++i) out[i] = hd::bf16_value(hd::bf16_round(x[i]));
      return;
    case ActQuant::kFp16:
      for (int64_t i = 0; i < len; ++i) out[i] = hd::f16_value(hd::f16_round(x[i]));
      return;
    case ActQuant::kInt8PerToken:
      return quantize_int8_per_token(x, len, out);
    case ActQuant::kFp8PerTokenGroup128:
      return quantize_fp8_group128(x, len, out);
    case ActQuant::kNvfp4Block16:
      return quantize_nvfp4_block16(x, len, r.act_scale, out);
    default:
      return quantize_mxfp8_block32(x, len, out);
  }
}

// k = r.k values in, k out: the kernel's input row, quantised and dequantised. Sequential.
MOEPACK_HD void quantize_activation_row(const ProjReader& r, const float* x, float* out) {
  quantize_activation_span(r, x, r.k, out);
}

}  // namespace moepack::reader
