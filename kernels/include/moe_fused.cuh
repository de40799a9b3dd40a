// Device code of the generic fused MoE: GEMM1 on w13 with the activation, GEMM2 on w2, and the
// weighted combine, for any weight reader W (a functor with
//   float   weight(int64_t e, int64_t n, int64_t kk)   dequantised W[e][n][column kk]
//   int64_t act_col(int64_t e, int64_t kk)             activation column of column kk
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
// kRowTile at a time, its lanes the columns (neighbouring weights and activations, gathered
// through act_col), so each weight is decoded once per row tile and multiplies kRowTile rows from
// registers, and a chunk of a few experts fills the device (thousands of warps, not tens of
// blocks). Raw pointers only.
#pragma once

#include <cstdint>

#include "formats/layout/activation.h"
#include "formats/layout/moe_reader.h"

namespace moepack::kernels {

// The generic reader as a W: every layout through formats/layout/moe_reader.h.
struct ReaderWeights {
  reader::ProjReader r;
  __device__ float weight(int64_t e, int64_t n, int64_t kk) const {
    return reader::weight(r, e, n, kk);
  }
  __device__ int64_t act_col(int64_t e, int64_t kk) const { return reader::act_col(r, e, kk); }
  __device__ void quantize_row(const float* x, float* out) const {
    reader::quantize_activation_row(r, x, out);
  }
};

constexpr int kWarps = 4;  // warps per block: one output row each
constexpr int kThreads = kWarps * 32;
constexpr int kRowTile = 8;

// The sum of v over the warp's lanes, in a fixed order (the result does not depend on timing).
template <class Acc>
__device__ inline Acc warp_sum(Acc v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// grid (ceil(I / kWarps), experts of the chunk), kThreads threads. xq [T, H] (per token), a_out
// [P, I] (per sorted position), bias [experts of the chunk, gated ? 2 I : I] or null. row_token[p]
// = the token of sorted position p. One warp per output row i (gate row i and, gated, up row I +
// i): its lanes walk the columns kk = lane, lane + 32, ... (neighbouring weights and activations),
// each weight decoded once per tile of kRowTile rows and multiplied into every row of the tile; the
// lanes' sums are added at the end.
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
    for (int64_t kk = lane; kk < hidden; kk += 32) {
      const int64_t col = w.act_col(le, kk);
      Acc xv[kRowTile];
#pragma unroll
      for (int r = 0; r < kRowTile; ++r) xv[r] = r < rows ? static_cast<Acc>(xr[r][col]) : Acc(0);
      const Acc wg = static_cast<Acc>(w.weight(le, i, kk));
#pragma unroll
      for (int r = 0; r < kRowTile; ++r) g[r] += wg * xv[r];
      if (gated) {
        const Acc wu = static_cast<Acc>(w.weight(le, inter + i, kk));
#pragma unroll
        for (int r = 0; r < kRowTile; ++r) u[r] += wu * xv[r];
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
    if (lane == 0)
      for (int r = 0; r < rows; ++r)
        a_out[(r0 + r) * inter + i] =
            gated ? expert_glu<Acc>(act, g[r], u[r]) : expert_activation<Acc>(act, g[r]);
  }
}

// grid (ceil(H / kWarps), experts of the chunk), kThreads threads. aq [P, I] per sorted
// position; slot_out [T * top_k, H] per slot (sorted[p] is the slot of position p); bias
// [experts of the chunk, H] or null. One warp per
// output n, as gemm1_act_kernel.
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
    Acc y[kRowTile];
#pragma unroll
    for (int r = 0; r < kRowTile; ++r) y[r] = Acc(0);
    for (int64_t kk = lane; kk < inter; kk += 32) {
      const int64_t col = w.act_col(le, kk);
      const Acc wv = static_cast<Acc>(w.weight(le, n, kk));
#pragma unroll
      for (int r = 0; r < kRowTile; ++r)
        if (r < rows) y[r] += wv * static_cast<Acc>(aq[(r0 + r) * inter + col]);
    }
    const Acc bn = bias ? static_cast<Acc>(bias[le * hidden + n]) : Acc(0);
#pragma unroll
    for (int r = 0; r < kRowTile; ++r) {
      y[r] = warp_sum(y[r]);
      if (bias) y[r] += bn;
    }
    if (lane == 0)
      for (int r = 0; r < rows; ++r)
        slot_out[static_cast<int64_t>(sorted[r0 + r]) * hidden + n] = y[r];
  }
}

// One thread per row: the row as the next GEMM's input (the reader's activation quantisation).
// In may be double (the reference's intermediate): rounded to float first, as the kernel's
// input is; scratch [rows, k] float.
template <class W, class In>
__global__ void quantize_rows_kernel(W w, In* rows_buf, int64_t rows, int64_t k, float* scratch,
                                     float* out_scratch) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  In* row = rows_buf + r * k;
  float* in = scratch + r * k;
  float* out = out_scratch + r * k;
  for (int64_t i = 0; i < k; ++i) in[i] = static_cast<float>(row[i]);
  w.quantize_row(in, out);
  for (int64_t i = 0; i < k; ++i) row[i] = static_cast<In>(out[i]);
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
