// Device code of the generic fused MoE: GEMM1 on w13 with the activation, GEMM2 on w2, and the
// weighted combine, for any weight reader W (a functor with
//   float   weight(int64_t e, int64_t n, int64_t kk)   dequantised W[e][n][column kk]
//   void    weight_strided(e, n, k0, count, float* w)  w[j] = weight(e, n, k0 + 32 j), j < count
//   int64_t act_col(int64_t e, int64_t kk)             activation column of column kk
//   void    quantize_span(const float* x, len, out)    the activation quantisation of a unit
// where e is the expert index within the uploaded chunk). Acc is float for the layout side (as
// the serving kernel accumulates) and double for the reference side (as verify/moe_reference).
//
//   rows of expert e     sorted positions p in [offsets[e], offsets[e + 1]) (moe_sort.cuh);
//                        the token of p is sorted[p] / top_k
//   gemm1_act_kernel     a[p, i] = act(sum_kk W13[e][i][kk] * xq[t][act_col(kk)] + b13[e][i])
//                                                                                        (relu2)
//                               | glu(gate, up) with gate row i, up row I + i           (gated:
//                               silu, gelu_tanh, gpt-oss' clamped swigluoai; activation.h)
//   gemm2_kernel         slot_out[sorted[p], n] = sum_kk W2[e][n][kk] * aq[p][act_col(kk)]
//                                                 + b2[e][n]
//                        (b13 / b2: the expert biases of gpt-oss, or null; each added once to
//                        the warp's sum in Acc, as verify/moe_reference adds them)
//   combine_kernel       out[t, h] = sum_k w[t, k] * double(slot_out[t * top_k + k, h]), k in order
//
// Tiling: one warp per (expert, output), kWarps outputs a block; the warp walks its expert's rows
// kRowTile at a time, its lanes the columns (lane l columns l, l + 32, ...: neighbouring weights
// and activations, gathered through act_col), kStrided of a lane's columns decoded at once by the
// reader's strided decoder (reader::weight_strided: for Marlin the physical row, and with it the
// word and field in every tile, found once, the group's scale and zero point once a group; for
// the canonical reader the scale row and group; no 64-bit division), each weight decoded once per
// row tile and multiplied into every row of the tile from registers. A chunk of a few experts fills
// the device (thousands of warps). Each lane sums its columns in order, the lanes' sums are added
// in a fixed order at the end: the result does not depend on timing. Raw pointers only.
#pragma once

#include <cstdint>

#include "formats/layout/activation.h"
#include "formats/layout/moe_reader.h"

namespace moepack::kernels {

// The generic reader as a W: every layout through formats/layout/moe_reader.h, element by
// element (one dispatch over the kind per weight).
struct ReaderWeights {
  reader::ProjReader r;
  __device__ float weight(int64_t e, int64_t n, int64_t kk) const {
    return reader::weight(r, e, n, kk);
  }
  // w[j] = weight(e, n, k0 + 32 j), j < count.
  __device__ void weight_strided(int64_t e, int64_t n, int64_t k0, int count, float* w) const {
    for (int j = 0; j < count; ++j) w[j] = reader::weight(r, e, n, k0 + reader::kStrideCols * j);
  }
  __device__ int64_t act_col(int64_t e, int64_t kk) const { return reader::act_col(r, e, kk); }
  // The activation quantisation of columns [k0, k0 + len) of a row (x, out at column k0).
  __device__ void quantize_span(const float* x, int64_t len, float* out) const {
    reader::quantize_activation_span(r, x, len, out);
  }
  int64_t quantize_unit() const { return reader::activation_unit(r.act, r.k); }
};

// The hot reader kinds (takes()): Marlin's (int4 / int8, every variant of the kind) and the
// canonical reader (the reference side), through their strided decoders
// (reader::kind_weight_strided, the readers' formulas with the index work done once per row or
// group; equal to weight() bit for bit), unrolled over a constant count so that the columns stay
// in registers.
struct StridedWeights : ReaderWeights {
  static bool takes(const reader::ProjReader& r) {
    return r.kind == reader::Kind::kMarlin || r.kind == reader::Kind::kCanonical;
  }
  __device__ void weight_strided(int64_t e, int64_t n, int64_t k0, int count, float* w) const {
    if (r.kind == reader::Kind::kMarlin)
      reader::kind_weight_strided(r.marlin, r, e, n, k0, count, w);
    else
      reader::kind_weight_strided(r.canonical, r, e, n, k0, count, w);
  }
  __device__ int64_t act_col(int64_t e, int64_t kk) const {
    return r.kind == reader::Kind::kMarlin ? reader::kind_act_col(r.marlin, r, e, kk) : kk;
  }
};

constexpr int kWarps = 4;  // warps per block: one output row each
constexpr int kThreads = kWarps * 32;
constexpr int kRowTile = 8;
constexpr int kStrided = 8;  // columns a lane decodes at once (32 apart)

// The sum of v over the warp's lanes, in a fixed order (the result does not depend on timing).
template <class Acc>
__device__ inline Acc warp_sum(Acc v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// acc[r] += sum over j < count of wv[j] * x_r[act_col(k0 + 32 j)], in column order, for the rows
// r < rows of the tile (x_r = xr[r], a row of the layer's activations or of the intermediate).
// count is kStrided (unrolled, the weights in registers) or fewer at the row's end.
template <class W, class In, class Acc>
__device__ inline void strided_fma(const W& w, int64_t e, int64_t k0, int count, const float* wv,
                                   const In* const* xr, int rows, Acc* acc) {
#pragma unroll
  for (int j = 0; j < kStrided; ++j) {
    if (j >= count) break;
    const int64_t col = w.act_col(e, k0 + reader::kStrideCols * j);
    const Acc wt = static_cast<Acc>(wv[j]);
#pragma unroll
    for (int r = 0; r < kRowTile; ++r)
      if (r < rows) acc[r] += wt * static_cast<Acc>(xr[r][col]);
  }
}

// How many of the columns k0, k0 + 32, ... below k a lane takes at once: kStrided, or fewer at
// the row's end.
__device__ inline int strided_count(int64_t k0, int64_t k) {
  const int64_t left = (k - k0 + reader::kStrideCols - 1) / reader::kStrideCols;
  return left < kStrided ? static_cast<int>(left) : kStrided;
}

// grid (ceil(I / kWarps), experts of the chunk), kThreads threads. xq [T, H] (per token), a_out
// [P, I] (per sorted position), bias [experts of the chunk, gated ? 2 I : I] or null. row_token[p]
// = the token of sorted position p. One warp per output row i (gate row i and, gated, up row I +
// i): its lanes walk the columns kStrided at a time, each weight decoded once per tile of kRowTile
// rows and multiplied into every row of the tile; the lanes' sums are added at the end.
template <class W, class Acc>
__global__ void __launch_bounds__(kThreads)
    gemm1_act_kernel(W w, int64_t first_expert, const int32_t* offsets, const int32_t* row_token,
                     const float* xq, int64_t hidden, int64_t inter, int gated, int act,
                     const float* bias, Acc* a_out) {
  const int64_t le = blockIdx.y;
  const int64_t begin = offsets[first_expert + le], end = offsets[first_expert + le + 1];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (begin == end || i >= inter) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r0 = begin; r0 < end; r0 += kRowTile) {
    const int rows = static_cast<int>(end - r0 < kRowTile ? end - r0 : kRowTile);
    const float* xr[kRowTile];
    Acc g[kRowTile], u[kRowTile];
#pragma unroll
    for (int r = 0; r < kRowTile; ++r) {
      xr[r] = xq + static_cast<int64_t>(row_token[r0 + (r < rows ? r : 0)]) * hidden;
      g[r] = u[r] = Acc(0);
    }
    for (int64_t k0 = lane; k0 < hidden; k0 += reader::kStrideCols * kStrided) {
      // A whole step has a constant count (its weights stay in registers); the row's end fewer.
      const int count = strided_count(k0, hidden);
      if (count == kStrided) {
        float wv[kStrided];
        w.weight_strided(le, i, k0, kStrided, wv);
        strided_fma(w, le, k0, kStrided, wv, xr, rows, g);
        if (gated) {
          w.weight_strided(le, inter + i, k0, kStrided, wv);
          strided_fma(w, le, k0, kStrided, wv, xr, rows, u);
        }
      } else {
        float tail[kStrided];
        w.weight_strided(le, i, k0, count, tail);
        strided_fma(w, le, k0, count, tail, xr, rows, g);
        if (gated) {
          w.weight_strided(le, inter + i, k0, count, tail);
          strided_fma(w, le, k0, count, tail, xr, rows, u);
        }
      }
    }
    const float* b = bias ? bias + le * (gated ? 2 * inter : inter) : nullptr;
    const Acc bg = b ? static_cast<Acc>(b[i]) : Acc(0);
    const Acc bu = b && gated ? static_cast<Acc>(b[inter + i]) : Acc(0);
#pragma unroll
    for (int r = 0; r < kRowTile; ++r) {
      g[r] = warp_sum(g[r]);
      if (gated) u[r] = warp_sum(u[r]);
      if (b) {  // no add without biases: the sums stay exactly the reader's
        g[r] += bg;
        u[r] += bu;
      }
    }
    // Constant indices only (an unrolled loop with a guard): the accumulators stay in registers.
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRowTile; ++r)
        if (r < rows)
          a_out[(r0 + r) * inter + i] =
              gated ? expert_glu<Acc>(act, g[r], u[r]) : expert_activation<Acc>(act, g[r]);
    }
  }
}

// grid (ceil(H / kWarps), experts of the chunk), kThreads threads. aq [P, I] per sorted
// position; slot_out [T * top_k, H] per slot (sorted[p] is the slot of position p); bias
// [experts of the chunk, H] or null. One warp per output n, as gemm1_act_kernel.
template <class W, class In, class Acc>
__global__ void __launch_bounds__(kThreads)
    gemm2_kernel(W w, int64_t first_expert, const int32_t* offsets, const int32_t* sorted,
                 const In* aq, int64_t inter, int64_t hidden, const float* bias, Acc* slot_out) {
  const int64_t le = blockIdx.y;
  const int64_t begin = offsets[first_expert + le], end = offsets[first_expert + le + 1];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (begin == end || n >= hidden) return;  // whole warps leave together
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t r0 = begin; r0 < end; r0 += kRowTile) {
    const int rows = static_cast<int>(end - r0 < kRowTile ? end - r0 : kRowTile);
    const In* ar[kRowTile];
    Acc y[kRowTile];
#pragma unroll
    for (int r = 0; r < kRowTile; ++r) {
      ar[r] = aq + (r0 + (r < rows ? r : 0)) * inter;
      y[r] = Acc(0);
    }
    for (int64_t k0 = lane; k0 < inter; k0 += reader::kStrideCols * kStrided) {
      const int count = strided_count(k0, inter);
      if (count == kStrided) {  // as in gemm1_act_kernel
        float wv[kStrided];
        w.weight_strided(le, n, k0, kStrided, wv);
        strided_fma(w, le, k0, kStrided, wv, ar, rows, y);
      } else {
        float tail[kStrided];
        w.weight_strided(le, n, k0, count, tail);
        strided_fma(w, le, k0, count, tail, ar, rows, y);
      }
    }
    const Acc bn = bias ? static_cast<Acc>(bias[le * hidden + n]) : Acc(0);
#pragma unroll
    for (int r = 0; r < kRowTile; ++r) {
      y[r] = warp_sum(y[r]);
      if (bias) y[r] += bn;
    }
    if (lane == 0) {  // as in gemm1_act_kernel
#pragma unroll
      for (int r = 0; r < kRowTile; ++r)
        if (r < rows) slot_out[static_cast<int64_t>(sorted[r0 + r]) * hidden + n] = y[r];
    }
  }
}

// One thread per (row, quantisation unit): the rows as the next GEMM's input (the reader's
// activation quantisation, quantize_span over the unit's columns: the units of a row are
// independent, reader::activation_unit). In may be double (the reference's intermediate): rounded
// to float first, as the kernel's input is; scratch, out_scratch [rows, k] float.
template <class W, class In>
__global__ void quantize_rows_kernel(W w, In* rows_buf, int64_t rows, int64_t k, int64_t unit,
                                     float* scratch, float* out_scratch) {
  const int64_t units = (k + unit - 1) / unit;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * units) return;
  const int64_t k0 = (i % units) * unit, at = (i / units) * k + k0;
  const int64_t len = k - k0 < unit ? k - k0 : unit;
  In* row = rows_buf + at;
  float* in = scratch + at;
  float* out = out_scratch + at;
  for (int64_t j = 0; j < len; ++j) in[j] = static_cast<float>(row[j]);
  w.quantize_span(in, len, out);
  for (int64_t j = 0; j < len; ++j) row[j] = static_cast<In>(out[j]);
}

// One thread per (t, h).
template <class Acc>
__global__ void combine_kernel(const Acc* slot_out, const double* weights, int64_t tokens,
                               int top_k, int64_t hidden, double* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * hidden) return;
  const int64_t t = i / hidden, h = i % hidden;
  double acc = 0.0;
  for (int k = 0; k < top_k; ++k)
    acc += weights[t * top_k + k] * static_cast<double>(slot_out[(t * top_k + k) * hidden + h]);
  out[i] = acc;
}

}  // namespace moepack::kernels
