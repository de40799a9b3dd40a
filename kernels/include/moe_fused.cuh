// Device code of the generic fused MoE: GEMM1 on w13 with the activation, GEMM2 on w2, and the
// weighted combine, for any weight reader W (a functor with
//   float   weight(int64_t e, int64_t n, int64_t kk)   dequantised W[e][n][column kk]
//   int64_t act_col(int64_t e, int64_t kk)             activation column of column kk
// where e is the expert index within the uploaded chunk). Acc is float for the layout side (as
// the serving kernel accumulates) and double for the reference side (as verify/moe_reference).
//
//   rows of expert e     sorted positions p in [offsets[e], offsets[e + 1]) (moe_sort.cuh);
//                        the token of p is sorted[p] / top_k
//   gemm1_act_kernel     a[p, i] = act(sum_kk W13[e][i][kk] * xq[t][act_col(kk)])       (relu2)
//                               | silu(gate) * up with gate row i, up row I + i         (gated)
//   gemm2_kernel         slot_out[sorted[p], n] = sum_kk W2[e][n][kk] * aq[p][act_col(kk)]
//   combine_kernel       out[t, h] = sum_k w[t, k] * double(slot_out[t * top_k + k, h]), k in order
//
// Tiling: one block per (expert, tile of kThreads outputs), one output per thread; the block
// walks its expert's rows kRowTile at a time and stages the rows' activations kKTile columns at
// a time in shared memory (gathered through act_col), so each weight is decoded once per row
// tile and multiplies kRowTile rows from registers. Raw pointers only.
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

constexpr int kThreads = 128;
constexpr int kRowTile = 8;
constexpr int kKTile = 128;

// Stages rows [r0, r0 + rows) x columns [k0, k0 + kn) of the gathered activations; zero beyond.
// Row r of the tile reads act row row_of[r0 + r] (null: r0 + r).
template <class W, class In, class Acc>
__device__ inline void stage_rows(const W& w, int64_t le, const In* act, int64_t ld,
                                  const int32_t* row_of, int64_t r0, int rows, int64_t k0, int kn,
                                  Acc (*xs)[kKTile]) {
  for (int idx = threadIdx.x; idx < kRowTile * kKTile; idx += blockDim.x) {
    const int r = idx / kKTile, c = idx % kKTile;
    Acc v = Acc(0);
    if (r < rows && c < kn) {
      const int64_t row = row_of ? row_of[r0 + r] : r0 + r;
      v = static_cast<Acc>(act[row * ld + w.act_col(le, k0 + c)]);
    }
    xs[r][c] = v;
  }
}

// grid (ceil(I / kThreads), experts of the chunk). xq [T, H] (per token), a_out [P, I] (per
// sorted position). row_token[p] = the token of sorted position p.
template <class W, class Acc>
__global__ void __launch_bounds__(kThreads)
    gemm1_act_kernel(W w, int64_t first_expert, const int32_t* offsets, const int32_t* row_token,
                     const float* xq, int64_t hidden, int64_t inter, int gated, int act,
                     Acc* a_out) {
  __shared__ Acc xs[kRowTile][kKTile];
  const int64_t le = blockIdx.y;
  const int64_t begin = offsets[first_expert + le], end = offsets[first_expert + le + 1];
  if (begin == end) return;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool active = i < inter;
  for (int64_t r0 = begin; r0 < end; r0 += kRowTile) {
    const int rows = static_cast<int>(end - r0 < kRowTile ? end - r0 : kRowTile);
    Acc g[kRowTile], u[kRowTile];
    for (int r = 0; r < kRowTile; ++r) g[r] = u[r] = Acc(0);
    for (int64_t k0 = 0; k0 < hidden; k0 += kKTile) {
      const int kn = static_cast<int>(hidden - k0 < kKTile ? hidden - k0 : kKTile);
      __syncthreads();
      stage_rows<W, float, Acc>(w, le, xq, hidden, row_token, r0, rows, k0, kn, xs);
      __syncthreads();
      if (!active) continue;
      for (int c = 0; c < kn; ++c) {
        const Acc wg = static_cast<Acc>(w.weight(le, i, k0 + c));
#pragma unroll
        for (int r = 0; r < kRowTile; ++r) g[r] += wg * xs[r][c];
        if (gated) {
          const Acc wu = static_cast<Acc>(w.weight(le, inter + i, k0 + c));
#pragma unroll
          for (int r = 0; r < kRowTile; ++r) u[r] += wu * xs[r][c];
        }
      }
    }
    if (active)
      for (int r = 0; r < rows; ++r)
        a_out[(r0 + r) * inter + i] =
            gated ? expert_glu<Acc>(act, g[r], u[r]) : expert_activation<Acc>(act, g[r]);
  }
}

// grid (ceil(H / kThreads), experts of the chunk). aq [P, I] per sorted position; slot_out
// [T * top_k, H] per slot (sorted[p] is the slot of position p).
template <class W, class In, class Acc>
__global__ void __launch_bounds__(kThreads)
    gemm2_kernel(W w, int64_t first_expert, const int32_t* offsets, const int32_t* sorted,
                 const In* aq, int64_t inter, int64_t hidden, Acc* slot_out) {
  __shared__ Acc xs[kRowTile][kKTile];
  const int64_t le = blockIdx.y;
  const int64_t begin = offsets[first_expert + le], end = offsets[first_expert + le + 1];
  if (begin == end) return;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool active = n < hidden;
  for (int64_t r0 = begin; r0 < end; r0 += kRowTile) {
    const int rows = static_cast<int>(end - r0 < kRowTile ? end - r0 : kRowTile);
    Acc y[kRowTile];
    for (int r = 0; r < kRowTile; ++r) y[r] = Acc(0);
    for (int64_t k0 = 0; k0 < inter; k0 += kKTile) {
      const int kn = static_cast<int>(inter - k0 < kKTile ? inter - k0 : kKTile);
      __syncthreads();
      stage_rows<W, In, Acc>(w, le, aq, inter, nullptr, r0, rows, k0, kn, xs);
      __syncthreads();
      if (!active) continue;
      for (int c = 0; c < kn; ++c) {
        const Acc wv = static_cast<Acc>(w.weight(le, n, k0 + c));
#pragma unroll
        for (int r = 0; r < kRowTile; ++r) y[r] += wv * xs[r][c];
      }
    }
    if (active)
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
