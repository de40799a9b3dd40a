// Launcher of the fused Marlin MoE (kernels/include/marlin_moe.cuh): picks the block shape from
// the rows per expert, carves the workspace, enqueues align -> GEMM1+act -> GEMM2 -> combine on
// one stream. Returns cudaError_t; no host synchronisation and no library types, so the
// standalone benchmark library can link it.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/include/marlin_moe.cuh"
#include "kernels/include/marlin_moe_launch.h"

namespace moepack::kernels {
namespace {

namespace mm = marlin_moe;

size_t align_up(size_t v) {
  return (v + 255) / 256 * 256;
}

// Rows per m-block: 16 while the average expert sees at most 16 rows (decode: one m16 tile,
// warps split K), else 64 (prefill: four m16 tiles per block, warps split M).
int block_rows_for(int64_t rows, int64_t experts) {
  return rows <= 16 * experts ? 16 : 64;
}

int64_t max_blocks(int64_t rows, int64_t experts, int bm) {
  return (rows + bm - 1) / bm + (rows < experts ? rows : experts);
}

struct Workspace {
  int32_t *sorted_rows, *blocks, *block_rows, *num_blocks;
  uint16_t* h;
  float* y;
  size_t bytes;
};

Workspace carve(void* base, const MarlinMoeLayer& layer, int64_t rows) {
  const int bm = 16;  // the larger block count of the two shapes
  const int64_t nb = max_blocks(rows, layer.experts, bm);
  char* p = static_cast<char*>(base);
  size_t off = 0;
  Workspace w{};
  auto take = [&](size_t bytes) {
    char* q = p ? p + off : nullptr;
    off += align_up(bytes);
    return q;
  };
  w.sorted_rows = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * rows));
  w.blocks = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * 2 * nb));
  w.block_rows = reinterpret_cast<int32_t*>(take(sizeof(int32_t) * nb));
  w.num_blocks = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  w.h = reinterpret_cast<uint16_t*>(take(sizeof(uint16_t) * rows * layer.inter));
  w.y = reinterpret_cast<float*>(take(sizeof(float) * rows * layer.hidden));
  w.bytes = off;
  return w;
}

int32_t chunk_tiles(int64_t k_tiles, int64_t group_k_tiles) {
  // Split-K unit: at most 8 k-tiles, inside one group, dividing K. (Smaller units that balance
  // the k-slice warps when 8 leaves some idle, e.g. I = 768, were measured slower: v5 in
  // bench/RESULTS.md.)
  for (int32_t c : {8, 4, 2, 1})
    if (group_k_tiles % c == 0 && k_tiles % c == 0) return c;
  return 1;
}

mm::GemmArgs gemm_args(const uint32_t* w, const uint16_t* s, int64_t groups, int64_t n, int64_t k) {
  mm::GemmArgs a{};
  a.weights = w;
  a.scales = s;
  a.n = n;
  a.k = k;
  a.groups = static_cast<int32_t>(groups);
  a.group_k_tiles = static_cast<int32_t>(k / 16 / groups);
  a.chunk_k_tiles = chunk_tiles(k / 16, a.group_k_tiles);
  a.scales_grouped = groups > 1;
  return a;
}

// Launch with programmatic stream serialisation when `overlap` (the kernels' griddepcontrol
// instructions exist only in the sm_90 build, so the launcher asks for it on compute capability 9
// only).
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 threads, size_t smem,
                   cudaStream_t stream, bool overlap, Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = threads;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = overlap ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

bool programmatic_launch_supported() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return false;
  return major == 9;
}

template <class T, int BM, int MT, int WT, int WK, bool kFirst>
cudaError_t launch_gemm(dim3 grid, const mm::GemmArgs& args, cudaStream_t stream, bool overlap) {
  return launch(mm::marlin_moe_gemm<T, BM, MT, WT, WK, kFirst>, grid, dim3(mm::kThreads),
                mm::kSharedBytes, stream, overlap, args);
}

// Decode (BM 16): one m16 tile, warps split K (gated: 4 k-slices x gate/up). Prefill (BM 64):
// two m16 tiles per warp sharing each decoded weight fragment, 2 row slices.
template <class T, int BM>
cudaError_t launch_gemms(const MarlinMoeLayer& layer, mm::GemmArgs g1, mm::GemmArgs g2, int64_t nb,
                         cudaStream_t stream, bool overlap) {
  constexpr int MT = BM == 16 ? 1 : 2;
  constexpr int WM = BM / (16 * MT);
  const dim3 grid1(static_cast<unsigned>(nb), static_cast<unsigned>(layer.inter / mm::kTileN));
  cudaError_t e = layer.gated
                      ? launch_gemm<T, BM, MT, 2, 8 / (WM * 2), true>(grid1, g1, stream, overlap)
                      : launch_gemm<T, BM, MT, 1, 8 / WM, true>(grid1, g1, stream, overlap);
  if (e != cudaSuccess) return e;
  const dim3 grid2(static_cast<unsigned>(nb), static_cast<unsigned>(layer.hidden / mm::kTileN));
  return launch_gemm<T, BM, MT, 1, 8 / WM, false>(grid2, g2, stream, overlap);
}

}  // namespace

const char* marlin_moe_unsupported(const MarlinMoeLayer& layer) {
  if (layer.experts <= 0 || layer.experts > 4096) return "experts outside 1..4096";
  if (layer.hidden <= 0 || layer.hidden % 64 != 0) return "hidden size is not a multiple of 64";
  if (layer.inter <= 0 || layer.inter % 64 != 0) return "intermediate size is not a multiple of 64";
  if (layer.groups13 <= 0 || layer.hidden % (16 * layer.groups13) != 0)
    return "w13 groups do not split H into multiples of 16 rows";
  if (layer.groups2 <= 0 || layer.inter % (16 * layer.groups2) != 0)
    return "w2 groups do not split I into multiples of 16 rows";
  if (!layer.w13 || !layer.s13 || !layer.w2 || !layer.s2) return "a parameter pointer is null";
  return nullptr;
}

size_t marlin_moe_workspace_bytes(const MarlinMoeLayer& layer, int64_t tokens, int32_t top_k) {
  return carve(nullptr, layer, tokens * top_k).bytes;
}

int marlin_moe_forward(const MarlinMoeLayer& layer, const void* x, const int32_t* topk_ids,
                       const float* topk_weights, int64_t tokens, int32_t top_k, float* out,
                       void* workspace, size_t workspace_bytes, void* stream_ptr,
                       int32_t block_rows) {
  if (marlin_moe_unsupported(layer) || tokens < 0 || top_k <= 0) return cudaErrorInvalidValue;
  if (block_rows != 0 && block_rows != 16 && block_rows != 64) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  const int64_t rows = tokens * top_k;
  if (rows > INT32_MAX / 2) return cudaErrorInvalidValue;  // row indices and block lists are int32
  const Workspace ws = carve(workspace, layer, rows);
  if (ws.bytes > workspace_bytes || workspace == nullptr) return cudaErrorInvalidValue;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const int bm = block_rows ? block_rows : block_rows_for(rows, layer.experts);
  const int64_t nb = max_blocks(rows, layer.experts, bm);

  mm::marlin_moe_align<<<1, mm::kAlignThreads, 2 * sizeof(int32_t) * layer.experts, stream>>>(
      topk_ids, static_cast<int32_t>(rows), static_cast<int32_t>(layer.experts), bm, ws.sorted_rows,
      ws.blocks, ws.block_rows, ws.num_blocks);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  const int64_t n13 = layer.gated ? 2 * layer.inter : layer.inter;
  mm::GemmArgs g1 = gemm_args(layer.w13, layer.s13, layer.groups13, n13, layer.hidden);
  mm::GemmArgs g2 = gemm_args(layer.w2, layer.s2, layer.groups2, layer.hidden, layer.inter);
  for (mm::GemmArgs* g : {&g1, &g2}) {
    g->sorted_rows = ws.sorted_rows;
    g->blocks = ws.blocks;
    g->block_rows = ws.block_rows;
    g->num_blocks = ws.num_blocks;
    g->topk_weights = topk_weights;
    g->top_k = top_k;
    g->gated = layer.gated;
  }
  g1.a = static_cast<const uint16_t*>(x);
  g1.h = ws.h;
  g2.a = ws.h;
  g2.y = ws.y;

  const bool overlap = programmatic_launch_supported();
  cudaError_t e;
  if (layer.bf16)
    e = bm == 16 ? launch_gemms<__nv_bfloat16, 16>(layer, g1, g2, nb, stream, overlap)
                 : launch_gemms<__nv_bfloat16, 64>(layer, g1, g2, nb, stream, overlap);
  else
    e = bm == 16 ? launch_gemms<__half, 16>(layer, g1, g2, nb, stream, overlap)
                 : launch_gemms<__half, 64>(layer, g1, g2, nb, stream, overlap);
  if (e != cudaSuccess) return e;

  const int64_t total = tokens * layer.hidden / 4;
  const int64_t blocks = (total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096;
  return launch(mm::marlin_moe_combine, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream,
                overlap, static_cast<const float*>(ws.y), topk_ids,
                static_cast<int32_t>(layer.experts), tokens, top_k, layer.hidden, out);
}

}  // namespace moepack::kernels
