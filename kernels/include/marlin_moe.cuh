// Fused MoE over the Marlin WNA16 layout (int4 uint4b8, grouped or channelwise scales, bf16 or
// fp16 activations): device code only, raw pointers, no library types (STYLE.md §6).
//
// One layer is four kernels on one stream, no host round-trip, capturable in a CUDA graph:
//   1. marlin_moe_align: token->expert sort (rows grouped by expert) and the list of m-blocks;
//   2. marlin_moe_gemm<kGated=true>:  h = act(x[token] . w13)  per sorted row, act = silu(gate)*up
//      (or relu2 when not gated), rounded to the activation dtype like the serving kernel;
//   3. marlin_moe_gemm<kGated=false>: y[token, slot] = topk_weight * (h . w2), fp32;
//   4. marlin_moe_combine: out[token] = sum over slots in slot order (deterministic).
//
// The GEMMs use mma.sync m16n8k16 on B fragments decoded in registers straight from the Marlin
// words: word 4t+j of a 16x64 tile is lane t's B fragment of 16x16 sub-tile j
// (formats/layout/marlin_layout.h, spec/wna16_marlin.md §3.2), so each lane reads its whole
// fragment set with one 16-byte load. Codes are decoded exactly (q - 8 is exact in bf16/fp16) and
// the scale is applied in fp32 to each group's partial sum, so the result differs from the CPU
// reference (reader_expert_matmul over the Marlin reader) only by fp32 summation order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "formats/layout/marlin_fragment.h"

namespace moepack::kernels::marlin_moe {

constexpr int kThreads = 256;  // 8 warps per block
constexpr int kTileN = 64;     // output columns per block (one Marlin tile column)

// Programmatic dependent launch (sm_90): the launcher starts the GEMMs and the combine while the
// kernel before them drains (cudaLaunchAttributeProgrammaticStreamSerialization, Hopper only).
// Each kernel waits for its predecessor's memory before reading what that kernel wrote, and lets
// its own dependants launch once its blocks have passed that wait. Without sm_90 both are no-ops
// and the launcher does not ask for the overlap.
__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependants() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

// ---- token -> expert sort ------------------------------------------------------------------
// One block of kAlignThreads. rows = tokens * top_k flat (token, slot) indices. Outputs:
//   sorted_rows[pos]   flat index of the pos-th row, rows of expert e at [offset[e], offset[e+1])
//   blocks[2*b], [2*b+1]  (expert, first sorted position) of m-block b (at most bm rows each)
//   block_rows[b]      rows in m-block b; num_blocks[0] = number of m-blocks
// Ids outside [0, experts) are dropped (their (token, slot) contributes nothing).
// Counting is by shared-memory atomics; the offsets of rows and m-blocks over the experts are one
// block-wide exclusive scan (each thread owns a run of consecutive experts, warp shuffles, then
// the warp totals), so no thread walks all experts. The order of rows inside an expert depends
// on atomics; results do not (rows are independent).
constexpr int kAlignThreads = 1024;

// Inclusive prefix sums over the block of (a, b); every thread of the block must call it.
__device__ __forceinline__ void block_inclusive_scan2(int32_t& a, int32_t& b,
                                                      int32_t (*warp_totals)[32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t ua = __shfl_up_sync(0xffffffffu, a, d);
    const int32_t ub = __shfl_up_sync(0xffffffffu, b, d);
    if (lane >= d) {
      a += ua;
      b += ub;
    }
  }
  if (lane == 31) {
    warp_totals[0][warp] = a;
    warp_totals[1][warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = kAlignThreads / 32;
    int32_t ta = lane < warps ? warp_totals[0][lane] : 0;
    int32_t tb = lane < warps ? warp_totals[1][lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t ua = __shfl_up_sync(0xffffffffu, ta, d);
      const int32_t ub = __shfl_up_sync(0xffffffffu, tb, d);
      if (lane >= d) {
        ta += ua;
        tb += ub;
      }
    }
    warp_totals[0][lane] = ta;  // inclusive over warps
    warp_totals[1][lane] = tb;
  }
  __syncthreads();
  if (warp > 0) {
    a += warp_totals[0][warp - 1];
    b += warp_totals[1][warp - 1];
  }
}

__global__ void __launch_bounds__(kAlignThreads)
    marlin_moe_align(const int32_t* __restrict__ topk_ids, int32_t rows, int32_t experts,
                     int32_t bm, int32_t* __restrict__ sorted_rows, int32_t* __restrict__ blocks,
                     int32_t* __restrict__ block_rows, int32_t* __restrict__ num_blocks) {
  extern __shared__ int32_t smem_align[];
  __shared__ int32_t warp_totals[2][32];
  int32_t* count = smem_align;             // [experts]
  int32_t* cursor = smem_align + experts;  // [experts]
  allow_dependants();                      // GEMM1's blocks start and wait for this block's results
  for (int e = threadIdx.x; e < experts; e += kAlignThreads) count[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < rows; i += kAlignThreads) {
    const int32_t e = topk_ids[i];
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  // This thread's experts [e0, e1): their rows and m-blocks, then the scan gives the offsets.
  const int per = (experts + kAlignThreads - 1) / kAlignThreads;
  const int e0 = threadIdx.x * per < experts ? threadIdx.x * per : experts;
  const int e1 = e0 + per < experts ? e0 + per : experts;
  int32_t my_rows = 0, my_blocks = 0;
  for (int e = e0; e < e1; ++e) {
    my_rows += count[e];
    my_blocks += (count[e] + bm - 1) / bm;
  }
  int32_t row_end = my_rows, block_end = my_blocks;
  block_inclusive_scan2(row_end, block_end, warp_totals);
  int32_t offset = row_end - my_rows, nb = block_end - my_blocks;
  for (int e = e0; e < e1; ++e) {
    cursor[e] = offset;
    for (int32_t r = 0; r < count[e]; r += bm) {
      blocks[2 * nb] = e;
      blocks[2 * nb + 1] = offset + r;
      block_rows[nb] = count[e] - r < bm ? count[e] - r : bm;
      ++nb;
    }
    offset += count[e];
  }
  if (threadIdx.x == kAlignThreads - 1) num_blocks[0] = block_end;
  __syncthreads();
  for (int i = threadIdx.x; i < rows; i += kAlignThreads) {
    const int32_t e = topk_ids[i];
    if (e >= 0 && e < experts) sorted_rows[atomicAdd(&cursor[e], 1)] = i;
  }
}

// ---- fragments -----------------------------------------------------------------------------
template <class T>
struct Act;
template <>
struct Act<__nv_bfloat16> {
  // (q & 0x000f000f) | bf16x2(128, 128) = (128 + q0, 128 + q1); minus 136 = q - 8, exact.
  static constexpr uint32_t kExponent = 0x43004300u;
  static __device__ __forceinline__ uint32_t minus_bias(uint32_t v) {
    const __nv_bfloat162 bias = __floats2bfloat162_rn(136.f, 136.f);
    __nv_bfloat162 r = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&v), bias);
    return *reinterpret_cast<uint32_t*>(&r);
  }
  static __device__ __forceinline__ float to_float(uint16_t bits) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  }
  static __device__ __forceinline__ uint16_t from_float(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
  static __device__ __forceinline__ void mma(float* d, const uint32_t* a, uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Act<__half> {
  // (q & 0x000f000f) | half2(1024, 1024) = (1024 + q0, 1024 + q1); minus 1032 = q - 8, exact.
  static constexpr uint32_t kExponent = 0x64006400u;
  static __device__ __forceinline__ uint32_t minus_bias(uint32_t v) {
    const __half2 bias = __floats2half2_rn(1032.f, 1032.f);
    __half2 r = __hsub2(*reinterpret_cast<__half2*>(&v), bias);
    return *reinterpret_cast<uint32_t*>(&r);
  }
  static __device__ __forceinline__ float to_float(uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
  }
  static __device__ __forceinline__ uint16_t from_float(float f) {
    return __half_as_ushort(__float2half_rn(f));
  }
  static __device__ __forceinline__ void mma(float* d, const uint32_t* a, uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Fields (f0, f4) >> shift of a Marlin int4 word as a 16-bit pair holding code - 8.
template <class T>
__device__ __forceinline__ uint32_t decode_pair(uint32_t word, int shift) {
  return Act<T>::minus_bias(((word >> shift) & 0x000f000fu) | Act<T>::kExponent);
}

// ---- the GEMM ------------------------------------------------------------------------------
struct GemmArgs {
  const uint32_t* weights;  // [E, K/16, N*2] Marlin int4 words
  const uint16_t* scales;   // [E, G, N] activation dtype, permuted (grouped iff scales_grouped)
  const uint16_t* a;        // gated: x [tokens, K]; else h [rows, K] in sorted order
  const int32_t* sorted_rows;
  const int32_t* blocks;
  const int32_t* block_rows;
  const int32_t* num_blocks;
  const float* topk_weights;  // [tokens * top_k] (second GEMM)
  uint16_t* h;                // gated output [rows, I] in sorted order (first GEMM)
  float* y;                   // [tokens * top_k, N] (second GEMM)
  int64_t n, k;               // the projection's N (w13: 2I gated or I; w2: H) and K
  int32_t top_k;
  int32_t groups;         // G
  int32_t group_k_tiles;  // k-tiles (16 rows) per group; K/16 when G == 1
  int32_t chunk_k_tiles;  // k-tiles per unit of split-K work (divides group_k_tiles or == it)
  bool scales_grouped;    // 64-entry (grouped) or 32-entry (single) scale permutation
  bool gated;             // first GEMM: silu(gate)*up; else relu(x)^2
};

// Asynchronous global -> shared copies (sm_80+). Each lane later reads only what it copied
// itself, so a lane's own wait_group is the only synchronisation the pipeline needs.
__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void copy_async_4(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Shared memory per block: the per-warp cp.async rings, later reused for the split-K reduction.
// The default limit, no opt-in attribute needed. Rings in 96 KiB (decode) / 192 KiB (prefill) of
// opted-in shared memory were measured 3-11 % slower at every token count on the H100 (v4 in
// bench/RESULTS.md: the larger carve-out leaves less L1 for the A rows).
constexpr int kSharedBytes = 48 * 1024;
// Stages per warp: per lane and stage one 16-byte weight vector and 16 bytes of A words per m16
// tile (MT tiles), so 6 stages for one m-tile, 4 for two.
template <int MT>
constexpr int ring_stages() {
  return kSharedBytes / ((kThreads / 32) * 32 * 16 * (1 + MT));
}

// Block tile: BM = 16*WM*MT rows of one expert x 64 output columns (gated: 64 of gate and the 64
// matching up columns, so the activation is applied in the epilogue). Warps split the block as
// WM (row slices of MT m16 tiles) x WT (weight tiles: 2 gated, 1 otherwise) x WK (split-K),
// WM*WT*WK = 8. A warp decodes each weight fragment once and feeds it to its MT m-tiles. Each
// warp streams its k-tiles through a cp.async ring (weights and A fragments), so the memory
// system always has stages-1 tiles per warp in flight; addresses advance by increments only.
template <class T, int BM, int MT, int WT, int WK, bool kFirst>
__global__ void __launch_bounds__(kThreads) marlin_moe_gemm(GemmArgs args) {
  constexpr int WM = BM / (16 * MT);
  static_assert(WM * WT * WK == kThreads / 32, "8 warps");
  constexpr int kStages = ring_stages<MT>();
  constexpr int kStageVec = 32 * (1 + MT);  // uint4 per warp-stage
  constexpr int kRowPad = WT * kTileN + 4;  // floats per reduction row (+4: fewer bank conflicts)
  static_assert(BM * kRowPad * 4 <= kSharedBytes, "reduction fits");
  extern __shared__ uint4 smem_gemm[];

  if (kFirst) wait_for_predecessor();  // align's routing
  const int block = blockIdx.x;
  if (block >= args.num_blocks[0]) return;
  const int expert = args.blocks[2 * block];
  const int first = args.blocks[2 * block + 1];
  const int rows = args.block_rows[block];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp % WM, wt = (warp / WM) % WT, wk = warp / (WM * WT);
  const int g = lane >> 2, c = lane & 3;

  // Weight tile column of this warp: gated first GEMM, up tiles follow the gate tiles by N/2.
  const int64_t n_tiles = args.n / kTileN;
  const int64_t nt = blockIdx.y + (WT == 2 ? wt * (n_tiles / 2) : 0);
  const int64_t k_tiles = args.k / 16;
  const int ckt = args.chunk_k_tiles;
  const int chunks = static_cast<int>(k_tiles / ckt);
  const int row0 = wm * MT * 16;
  const bool any_rows = row0 < rows;
  const int my_chunks = any_rows && wk < chunks ? (chunks - wk + WK - 1) / WK : 0;
  const int my_tiles = my_chunks * ckt;

  // Issue cursor over this warp's tiles: chunks wk, wk + WK, ... (one group or less each).
  const int64_t w_step = n_tiles * 32;  // uint4 per k-tile row of tiles
  const uint4* issue_w = reinterpret_cast<const uint4*>(args.weights) +
                         static_cast<int64_t>(expert) * k_tiles * w_step + nt * 32 + lane +
                         static_cast<int64_t>(wk) * ckt * w_step;
  const int64_t w_skip = static_cast<int64_t>(WK - 1) * ckt * w_step;
  // The second GEMM reads only the routing (align's output) before this point: the first GEMM's
  // blocks all passed their wait on align before this grid could launch. Prefetching this warp's
  // weights into L2 before the wait was measured slower (v5 in bench/RESULTS.md).
  if (!kFirst) wait_for_predecessor();
  allow_dependants();
  const int64_t a_skip = static_cast<int64_t>(WK - 1) * ckt * 16;
  const uint16_t* issue_a[2 * MT];  // rows g and g+8 of each m-tile
#pragma unroll
  for (int q = 0; q < 2 * MT; ++q) {
    const int r = row0 + (q >> 1) * 16 + g + 8 * (q & 1);
    const int rr = r < rows ? r : 0;  // rows past the expert's end read row 0, never stored
    const int32_t pos = first + rr;
    const int64_t src = kFirst ? args.sorted_rows[pos] / args.top_k : pos;
    issue_a[q] = args.a + src * args.k + static_cast<int64_t>(wk) * ckt * 16 + 2 * c;
  }
  uint4* ring = smem_gemm + warp * kStages * kStageVec;
  int issue_t = 0, issue_slot = 0;
  auto issue = [&]() {
    uint4* stage = ring + issue_slot * kStageVec;
    copy_async_16(stage + lane, issue_w);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      uint32_t* a = reinterpret_cast<uint32_t*>(stage + 32 * (1 + m) + lane);
      copy_async_4(a + 0, issue_a[2 * m]);
      copy_async_4(a + 1, issue_a[2 * m + 1]);
      copy_async_4(a + 2, issue_a[2 * m] + 8);
      copy_async_4(a + 3, issue_a[2 * m + 1] + 8);
    }
    issue_w += w_step;
#pragma unroll
    for (int q = 0; q < 2 * MT; ++q) issue_a[q] += 16;
    if (++issue_t == ckt) {
      issue_t = 0;
      issue_w += w_skip;
#pragma unroll
      for (int q = 0; q < 2 * MT; ++q) issue_a[q] += a_skip;
    }
    issue_slot = issue_slot + 1 == kStages ? 0 : issue_slot + 1;
  };
  int issued = 0;
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (issued < my_tiles) {
      issue();
      ++issued;
    }
    copy_async_commit();
  }

  float acc[MT][8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][s][i] = 0.f;

  // Scales of this lane's accumulator columns: marlin::fragment_scale_offset (closed-form inverse
  // of the grouped / single scale permutations).
  const uint16_t* scales =
      args.scales + static_cast<int64_t>(expert) * args.groups * args.n + nt * kTileN;
  const int scale_next = marlin::fragment_scale_next(args.scales_grouped);
  int slot = 0;
  for (int ch = 0; ch < my_chunks; ++ch) {
    const int64_t kt0 = static_cast<int64_t>(wk + ch * WK) * ckt;
    const int group = args.groups == 1 ? 0 : static_cast<int>(kt0 / args.group_k_tiles);
    const uint16_t* srow = scales + static_cast<int64_t>(group) * args.n;
    uint16_t sc[16];  // loaded now, used after the chunk's last tile
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const int off = marlin::fragment_scale_offset(args.scales_grouped, s, c);
      sc[2 * s] = __ldg(srow + off);
      sc[2 * s + 1] = __ldg(srow + off + scale_next);
    }
    float part[MT][8][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int q = 0; q < 4; ++q) part[m][s][q] = 0.f;
    for (int t = 0; t < ckt; ++t) {
      copy_async_wait<kStages - 2>();  // the oldest tile has landed (this lane's copies)
      if (issued < my_tiles) {         // into the slot the previous tile used
        issue();
        ++issued;
      }
      copy_async_commit();
      const uint4* stage = ring + slot * kStageVec;
      slot = slot + 1 == kStages ? 0 : slot + 1;
      const uint4 wv = stage[lane];
      uint32_t av[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const uint4 v = stage[32 * (1 + m) + lane];
        av[m][0] = v.x;
        av[m][1] = v.y;
        av[m][2] = v.z;
        av[m][3] = v.w;
      }
      const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // Left n8 half of sub-tile j: fields (0,4) and (1,5); right half (2,6) and (3,7).
        const uint32_t l0 = decode_pair<T>(words[j], marlin::b_fragment_shift(0, 0));
        const uint32_t l1 = decode_pair<T>(words[j], marlin::b_fragment_shift(0, 1));
        const uint32_t r0 = decode_pair<T>(words[j], marlin::b_fragment_shift(1, 0));
        const uint32_t r1 = decode_pair<T>(words[j], marlin::b_fragment_shift(1, 1));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          Act<T>::mma(part[m][2 * j], av[m], l0, l1);
          Act<T>::mma(part[m][2 * j + 1], av[m], r0, r1);
        }
      }
    }
    // Apply the group's scales in fp32 (chunk_k_tiles divides the group).
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      const float s0 = Act<T>::to_float(sc[2 * s]), s1 = Act<T>::to_float(sc[2 * s + 1]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        acc[m][s][0] += part[m][s][0] * s0;
        acc[m][s][1] += part[m][s][1] * s1;
        acc[m][s][2] += part[m][s][2] * s0;
        acc[m][s][3] += part[m][s][3] * s1;
      }
    }
  }
  copy_async_wait<0>();
  __syncthreads();  // every warp is done with its ring: the reduction reuses the memory

  // Split-K reduction through shared memory, one k-slice after the other (the buffer holds one
  // [BM][WT*64] tile): C fragment (g, 2c..2c+1) of n8 sub-tile s, rows g and g+8.
  float(*red)[kRowPad] = reinterpret_cast<float(*)[kRowPad]>(smem_gemm);
#pragma unroll 1
  for (int w = 0; w < WK; ++w) {
    if (wk == w) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int s = 0; s < 8; ++s) {
          const int col = wt * kTileN + 8 * s + 2 * c;
          const int r = row0 + m * 16 + g;
          if (w == 0) {
            red[r][col] = acc[m][s][0];
            red[r][col + 1] = acc[m][s][1];
            red[r + 8][col] = acc[m][s][2];
            red[r + 8][col + 1] = acc[m][s][3];
          } else {
            red[r][col] += acc[m][s][0];
            red[r][col + 1] += acc[m][s][1];
            red[r + 8][col] += acc[m][s][2];
            red[r + 8][col + 1] += acc[m][s][3];
          }
        }
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < BM * kTileN; i += kThreads) {
    const int r = i / kTileN, col = i % kTileN;
    if (r >= rows) continue;
    const float v0 = red[r][col];
    const int32_t pos = first + r;
    if (kFirst) {
      float hv;
      if (args.gated) {
        const float v1 = red[r][kTileN + col];
        hv = v0 / (1.f + expf(-v0)) * v1;  // silu(gate) * up
      } else {
        const float relu = v0 > 0.f ? v0 : 0.f;
        hv = relu * relu;
      }
      const int64_t inter = WT == 2 ? args.n / 2 : args.n;
      args.h[pos * inter + blockIdx.y * kTileN + col] = Act<T>::from_float(hv);
    } else {
      const int32_t flat = args.sorted_rows[pos];
      args.y[static_cast<int64_t>(flat) * args.n + blockIdx.y * kTileN + col] =
          v0 * args.topk_weights[flat];
    }
  }
}

// out[t, n] = sum over slots of y[t*top_k + slot, n], in slot order; slots whose expert id was
// dropped by the align step contribute nothing. Four columns per thread (H % 64 == 0).
__global__ void marlin_moe_combine(const float* __restrict__ y,
                                   const int32_t* __restrict__ topk_ids, int32_t experts,
                                   int64_t tokens, int32_t top_k, int64_t hidden,
                                   float* __restrict__ out) {
  wait_for_predecessor();
  const int64_t quads = hidden / 4, total = tokens * quads;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / quads, q = i % quads;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < top_k; ++s) {
      const int32_t e = topk_ids[t * top_k + s];
      if (e < 0 || e >= experts) continue;
      const float4 v = reinterpret_cast<const float4*>(y + (t * top_k + s) * hidden)[q];
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    reinterpret_cast<float4*>(out + t * hidden)[q] = sum;
  }
}

}  // namespace moepack::kernels::marlin_moe
