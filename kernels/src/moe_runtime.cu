// Launchers of the fused-MoE runtime (kernels/moe_runtime.h): shape checks, streams, staging,
// and every CUDA status turned into moepack::Error (kNoCuda without a usable device, kInternal
// otherwise). Device code lives in kernels/include/moe_{routing,sort,fused}.cuh.
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/threads.h"
#include "formats/moe_reader.h"
#include "kernels/include/moe_fused.cuh"
#include "kernels/include/moe_routing.cuh"
#include "kernels/include/moe_sort.cuh"
#include "kernels/moe_runtime.h"

namespace moepack {
namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const bool no_device = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
                         err == cudaErrorInitializationError;
  cudaGetLastError();  // clear a non-sticky error so later calls are not poisoned
  throw Error(no_device ? ErrorCode::kNoCuda : ErrorCode::kInternal,
              std::string("MoeRuntime: ") + what + ": " + cudaGetErrorString(err));
}

void check_launch(const char* what) {
  check_cuda(cudaGetLastError(), what);
}

// A device array that only grows; callers grow it when no queued work uses it.
template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t count = 0;
  void reserve(size_t n, const char* what) {
    if (n <= count) return;
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    count = 0;
    check_cuda(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)), what);
    count = n;
  }
  ~DeviceArray() {
    if (ptr) cudaFree(ptr);
  }
};

unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// One staging area: pinned host blocks mirrored by device blocks of the same size.
struct StagingBlock {
  uint8_t* host = nullptr;
  uint8_t* device = nullptr;
  size_t capacity = 0, used = 0;
  bool registered =
      false;  // host: anonymous memory pinned by cudaHostRegister (else cudaHostAlloc)
};

// Pinned host memory that is the process's anonymous memory (mmap, then cudaHostRegister): it
// counts as what it is -- RssAnon, and under `ulimit -d` -- where cudaHostAlloc's pages are the
// driver's mapping of a device file (counted as file-backed).
uint8_t* pinned_anonymous(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error(ErrorCode::kInternal, std::string("MoeRuntime: pinned staging of ") +
                                          std::to_string(bytes) +
                                          " bytes: " + std::strerror(errno));
  const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    ::munmap(p, bytes);
    check_cuda(err, "pinned staging");
  }
  return static_cast<uint8_t*>(p);
}
struct StagingArea {
  std::vector<StagingBlock> blocks;
  size_t current = 0;
  cudaEvent_t done = nullptr;  // recorded after the last chunk that read this area
  uint64_t bytes = 0;          // bytes uploaded into it since it was last emptied
  // Empty again (its chunk's kernels finished).
  bool anonymous = false;  // new blocks' host memory: pinned_anonymous (else cudaHostAlloc)
  size_t first_block = 0;  // the size of the next first block (what the last chunk took)
  void clear() {
    for (StagingBlock& b : blocks) b.used = 0;
    current = 0;
    bytes = 0;
  }
  // A chunk stage that took several blocks for its chunk takes one block of that size for the
  // next (chunks are alike): its memory stays what a chunk needs, not the sum of its growth.
  void fit_to_last_chunk() {
    if (blocks.size() < 2) return;
    size_t used = 0;
    for (const StagingBlock& b : blocks) used += b.used;
    constexpr size_t kMiB = size_t{1} << 20;
    first_block = (used + kMiB - 1) / kMiB * kMiB;
    free_blocks();
  }
  void free_blocks() {
    for (StagingBlock& b : blocks) {
      if (b.host && b.registered) {
        cudaHostUnregister(b.host);
        ::munmap(b.host, b.capacity);
      } else if (b.host) {
        cudaFreeHost(b.host);
      }
      if (b.device) cudaFree(b.device);
    }
    blocks.clear();
    current = 0;
  }
  void free_all() {
    free_blocks();
    if (done) cudaEventDestroy(done);
    done = nullptr;
  }
};

// Room for `bytes` in `a`, 256-byte aligned: its pinned host address and its device address. A
// new block (pinned host and device alike) when none left has room: at least `min_block` bytes,
// and with `double_up` at least what the area holds already (a chunk stage grows to its chunk in
// a few blocks and keeps them).
std::pair<uint8_t*, uint8_t*> stage_in(StagingArea& a, size_t bytes, size_t min_block,
                                       bool double_up) {
  constexpr size_t kAlign = 256;
  const size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  while (a.current < a.blocks.size() &&
         a.blocks[a.current].capacity - a.blocks[a.current].used < need)
    ++a.current;
  if (a.current == a.blocks.size()) {
    size_t held = 0;
    for (const StagingBlock& b : a.blocks) held += b.capacity;
    StagingBlock b;
    b.capacity = std::max({need, min_block, double_up ? held : size_t{0},
                           a.blocks.empty() ? a.first_block : size_t{0}});
    if (a.anonymous) {
      b.host = pinned_anonymous(b.capacity);
      b.registered = true;
    } else {
      check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&b.host), b.capacity, cudaHostAllocDefault),
                 "pinned staging");
    }
    if (cudaMalloc(reinterpret_cast<void**>(&b.device), b.capacity) != cudaSuccess) {
      a.blocks.push_back(b);  // freed with the area
      cudaGetLastError();
      throw Error(ErrorCode::kInternal, "MoeRuntime: device staging: out of device memory");
    }
    a.blocks.push_back(b);
  }
  StagingBlock& b = a.blocks[a.current];
  const std::pair<uint8_t*, uint8_t*> at{b.host + b.used, b.device + b.used};
  b.used += need;
  a.bytes += bytes;
  return at;
}

// MOEPACK_VERIFY_PROFILE set (not "0"): every launch and upload of the runtime timed by its own
// CUDA events (kernel_profile), host-side staging times beside them. Off, nothing is recorded.
bool profile_requested() {
  const char* v = std::getenv("MOEPACK_VERIFY_PROFILE");
  return v && *v && std::string(v) != "0";
}

double host_seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr size_t kMinStagingBlock = size_t{64} << 20;
constexpr size_t kMinStageSlotBlock = size_t{1} << 20;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct MoeRuntime::Impl {
  cudaStream_t compute = nullptr, copy = nullptr;
  cudaEvent_t copied = nullptr;
  StagingArea areas[2];
  int area = -1;
  StagingArea* active = nullptr;  // what forward_chunk's kernels read: its `done` follows them

  // Chunk stages (make_stages): the pool, its free slots (oldest first), and the staging times
  // of the threads that fill them (MOEPACK_VERIFY_PROFILE).
  std::vector<std::unique_ptr<StagingArea>> stage_slots;
  std::deque<int> free_slots;
  std::mutex stage_m;
  std::condition_variable stage_cv;
  std::atomic<int64_t> fill_ns{0}, fills{0}, slot_wait_ns{0}, slot_waits{0};

  MoeLayerSpec layer;
  int xq_act[2] = {-1, -1};  // the ActQuant xq_got / xq_ref hold this layer's tokens in, or -1
  int64_t tokens = 0;
  int top_k = 0;
  std::vector<int32_t> host_offsets;
  std::vector<double> host_weights;

  DeviceArray<float> x, router_w, router_b, corr, logits, xq_got, xq_ref, scratch_in, scratch_out;
  DeviceArray<double> score, choice, group_value, weights, ref_inter, ref_slots, got_out, ref_out;
  DeviceArray<uint8_t> taken, group_taken;
  DeviceArray<int32_t> expert_ids, counts, offsets, sorted, row_token;
  DeviceArray<float> got_inter, got_slots;
  DeviceArray<unsigned long long> bad_logit;
  // Timing events around each forward_chunk's kernels (start, stop), read at finish_layer; a
  // pool reused across layers.
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> timing_events;
  size_t timing_used = 0;
  double kernel_seconds = 0;
  // The profile (profile_requested): events per launch with its name, summed at finish_layer.
  bool profile = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> profile_events;
  std::vector<const char*> profile_names;
  std::map<std::string, std::pair<double, int64_t>> profile_totals;  // seconds, count
  uint64_t uploaded_bytes = 0;

  // An event pair from `pool` (grown as needed), not yet recorded.
  static std::pair<cudaEvent_t, cudaEvent_t> event_pair(
      std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& pool, size_t index) {
    if (index == pool.size()) {
      std::pair<cudaEvent_t, cudaEvent_t> e{nullptr, nullptr};
      check_cuda(cudaEventCreate(&e.first), "event");
      if (cudaEventCreate(&e.second) != cudaSuccess) {
        cudaEventDestroy(e.first);
        check_cuda(cudaGetLastError(), "event");
      }
      pool.push_back(e);
    }
    return pool[index];
  }
  // work() enqueued on `stream`, timed under `name` when profiling.
  template <class F>
  void timed(const char* name, cudaStream_t stream, F&& work) {
    if (!profile) {
      work();
      return;
    }
    const auto e = event_pair(profile_events, profile_names.size());
    check_cuda(cudaEventRecord(e.first, stream), "event");
    work();
    check_cuda(cudaEventRecord(e.second, stream), "event");
    profile_names.push_back(name);
  }
  void add_host_time(const char* name, double seconds) {
    if (!profile) return;
    auto& t = profile_totals[name];
    t.first += seconds;
    ++t.second;
  }
  // The recorded launches' times added to the totals (their streams have finished).
  void collect_profile() {
    for (size_t i = 0; i < profile_names.size(); ++i) {
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, profile_events[i].first, profile_events[i].second),
                 "profile timing");
      auto& t = profile_totals[profile_names[i]];
      t.first += static_cast<double>(ms) * 1e-3;
      ++t.second;
    }
    profile_names.clear();
  }

  ~Impl() {
    if (compute) cudaStreamSynchronize(compute);
    if (copy) cudaStreamSynchronize(copy);
    for (auto* pool : {&timing_events, &profile_events})
      for (auto& [a, b] : *pool) {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
      }
    for (StagingArea& a : areas) a.free_all();
    for (auto& a : stage_slots) a->free_all();
    if (copied) cudaEventDestroy(copied);
    if (compute) cudaStreamDestroy(compute);
    if (copy) cudaStreamDestroy(copy);
  }

  void prepare_layer(const MoeLayerSpec& spec, int64_t T, int k, const float* x);
  template <class F>
  void fill_and_copy(uint8_t* dst, uint8_t* dev, size_t bytes, const F& fill);
  MoeDeviceRouting sort_layer();

  // Routing of `tokens` rows of logits already in this->logits into expert_ids / weights.
  void run_route(int64_t rows, const MoeRouterSpec& s, const float* correction_bias_device) {
    const int64_t E = s.experts;
    score.reserve(static_cast<size_t>(rows * E), "router scores");
    choice.reserve(static_cast<size_t>(rows * E), "router choices");
    taken.reserve(static_cast<size_t>(rows * E), "router selection");
    group_value.reserve(static_cast<size_t>(rows * s.n_group), "router groups");
    group_taken.reserve(static_cast<size_t>(rows * s.n_group), "router groups");
    expert_ids.reserve(static_cast<size_t>(rows * s.top_k), "expert ids");
    weights.reserve(static_cast<size_t>(rows * s.top_k), "routing weights");
    bad_logit.reserve(1, "flag");
    const unsigned long long none = ~0ull;
    check_cuda(cudaMemcpyAsync(bad_logit.ptr, &none, sizeof(none), cudaMemcpyHostToDevice, compute),
               "flag");
    kernels::RouterArgs a;
    a.experts = E;
    a.top_k = s.top_k;
    a.sigmoid = s.sigmoid;
    a.renormalize = s.renormalize;
    a.n_group = s.n_group;
    a.topk_group = s.topk_group;
    a.group_score = s.group_score;
    a.routed_scaling_factor = s.routed_scaling_factor;
    a.use_correction_bias = s.correction_bias;
    kernels::route_kernel<<<blocks_for(rows, 64), 64, 0, compute>>>(
        logits.ptr, rows, a, correction_bias_device, score.ptr, choice.ptr, taken.ptr,
        group_value.ptr, group_taken.ptr, expert_ids.ptr, weights.ptr, bad_logit.ptr);
    check_launch("route_kernel");
    unsigned long long bad = 0;
    check_cuda(cudaMemcpyAsync(&bad, bad_logit.ptr, sizeof(bad), cudaMemcpyDeviceToHost, compute),
               "flag");
    check_cuda(cudaStreamSynchronize(compute), "route_kernel");
    if (bad != none) {
      const int64_t i = static_cast<int64_t>(bad - 1);
      throw Error(ErrorCode::kBadValue, "", "router_logits",
                  "non-finite router logit at token " + std::to_string(i / E) + ", expert " +
                      std::to_string(i % E));
    }
  }

  MoeDeviceRouting download_routing(int64_t rows, int k) {
    MoeDeviceRouting r;
    r.tokens = rows;
    r.top_k = k;
    r.expert_ids.resize(static_cast<size_t>(rows * k));
    r.weights.resize(static_cast<size_t>(rows * k));
    check_cuda(cudaMemcpyAsync(r.expert_ids.data(), expert_ids.ptr, r.expert_ids.size() * 4,
                               cudaMemcpyDeviceToHost, compute),
               "routing");
    check_cuda(cudaMemcpyAsync(r.weights.data(), weights.ptr, r.weights.size() * 8,
                               cudaMemcpyDeviceToHost, compute),
               "routing");
    return r;
  }

  // rows [rows, k] quantised in place as w's reader takes them: a thread per quantisation unit
  // (reader::activation_unit), units of 16-bit roundings taken 8 values a thread.
  template <typename In>
  void quantize_rows(const kernels::ReaderWeights& w, In* rows_buf, int64_t rows, int64_t k) {
    int64_t unit = w.quantize_unit();
    if (unit == 1) unit = 8;  // value by value: any length is whole units
    const int64_t threads = rows * ((k + unit - 1) / unit);
    kernels::quantize_rows_kernel<kernels::ReaderWeights, In>
        <<<blocks_for(threads, 128), 128, 0, compute>>>(w, rows_buf, rows, k, unit, scratch_in.ptr,
                                                        scratch_out.ptr);
  }

  // GEMM1 + activation of experts [first, last) through w (a kernels:: W), a warp per output row.
  template <class W, typename Acc>
  void gemm1(const W& w, int64_t first, int64_t last, const float* xq, const float* bias,
             Acc* inter_buf) {
    const dim3 grid(blocks_for(layer.inter, kernels::kWarps), static_cast<unsigned>(last - first));
    kernels::gemm1_act_kernel<W, Acc><<<grid, kernels::kThreads, 0, compute>>>(
        w, first, offsets.ptr, row_token.ptr, xq, layer.hidden, layer.inter, layer.gated,
        layer.relu2 ? kActRelu2 : layer.activation, bias, inter_buf);
  }
  // GEMM2 of experts [first, last) through w into the slot outputs, a warp per output.
  template <class W, typename Acc>
  void gemm2(const W& w, int64_t first, int64_t last, const Acc* inter_buf, const float* bias,
             Acc* slots) {
    const dim3 grid(blocks_for(layer.hidden, kernels::kWarps), static_cast<unsigned>(last - first));
    kernels::gemm2_kernel<W, Acc, Acc><<<grid, kernels::kThreads, 0, compute>>>(
        w, first, offsets.ptr, sorted.ptr, inter_buf, layer.inter, layer.hidden, bias, slots);
  }

  template <typename Acc>
  void side(int64_t first, int64_t last, const reader::ProjReader& w13,
            const reader::ProjReader& w2, const MoeChunkBiases& biases, const float* xq_src,
            float* xq_buf, Acc* inter_buf, Acc* slots) {
    const int64_t H = layer.hidden, I = layer.inter;
    const kernels::ReaderWeights W13{w13}, W2{w2};  // quantisation; GEMMs of the other kinds
    const bool ref = sizeof(Acc) == sizeof(double);
    const float* xq = xq_src;
    if (w13.act != reader::ActQuant::kNone) {
      // The tokens as w13's reader takes them: quantize_activation_row depends on the reader's
      // ActQuant and K only, so a side quantises them once a layer (again if the act changed).
      int& held = xq_act[ref ? 1 : 0];
      if (held != static_cast<int>(w13.act)) {
        check_cuda(cudaMemcpyAsync(xq_buf, xq_src, static_cast<size_t>(tokens * H) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, compute),
                   "activations");
        timed(ref ? "quantize tokens (reference)" : "quantize tokens (layout)", compute, [&] {
          quantize_rows(W13, xq_buf, tokens, H);
          check_launch("quantize_rows_kernel (tokens)");
        });
        held = static_cast<int>(w13.act);
      }
      xq = xq_buf;
    }
    timed(ref ? "gemm1 + activation (reference)" : "gemm1 + activation (layout)", compute, [&] {
      if (kernels::SpanWeights::takes(w13))
        gemm1(kernels::SpanWeights{W13}, first, last, xq, biases.w13, inter_buf);
      else
        gemm1(W13, first, last, xq, biases.w13, inter_buf);
      check_launch("gemm1_act_kernel");
    });
    const int64_t p0 = host_offsets[static_cast<size_t>(first)];
    const int64_t p1 = host_offsets[static_cast<size_t>(last)];
    if (w2.act != reader::ActQuant::kNone && p1 > p0) {
      timed(ref ? "quantize intermediate (reference)" : "quantize intermediate (layout)", compute,
            [&] {
              quantize_rows(W2, inter_buf + p0 * I, p1 - p0, I);
              check_launch("quantize_rows_kernel (intermediate)");
            });
    }
    timed(ref ? "gemm2 (reference)" : "gemm2 (layout)", compute, [&] {
      if (kernels::SpanWeights::takes(w2))
        gemm2(kernels::SpanWeights{W2}, first, last, inter_buf, biases.w2, slots);
      else
        gemm2(W2, first, last, inter_buf, biases.w2, slots);
      check_launch("gemm2_kernel");
    });
  }

  void check_readers(int64_t first, int64_t last, const reader::ProjReader& w13,
                     const reader::ProjReader& w2, const char* which) const {
    const int64_t n13 = layer.gated ? 2 * layer.inter : layer.inter;
    if (w13.experts != last - first || w2.experts != last - first || w13.n != n13 ||
        w13.k != layer.hidden || w2.n != layer.hidden || w2.k != layer.inter)
      throw Error(ErrorCode::kInternal, "", which,
                  "readers of [" + std::to_string(w13.experts) + ", " + std::to_string(w13.n) +
                      ", " + std::to_string(w13.k) + "] / [" + std::to_string(w2.experts) + ", " +
                      std::to_string(w2.n) + ", " + std::to_string(w2.k) + "] for experts [" +
                      std::to_string(first) + ", " + std::to_string(last) + ") of a layer with H=" +
                      std::to_string(layer.hidden) + " I=" + std::to_string(layer.inter));
  }
};

MoeRuntime::MoeRuntime() : impl_(std::make_unique<Impl>()) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Error(ErrorCode::kNoCuda, "no CUDA device");
  }
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  check_cuda(cudaStreamCreateWithFlags(&impl_->compute, cudaStreamNonBlocking), "stream");
  check_cuda(cudaStreamCreateWithFlags(&impl_->copy, cudaStreamNonBlocking), "stream");
  check_cuda(cudaEventCreateWithFlags(&impl_->copied, cudaEventDisableTiming), "event");
  for (StagingArea& a : impl_->areas)
    check_cuda(cudaEventCreateWithFlags(&a.done, cudaEventDisableTiming), "event");
  impl_->profile = profile_requested();
}

MoeRuntime::~MoeRuntime() = default;

// The layer's buffers (the previous layer is finished, so they may grow) and x [T, H] uploaded.
void MoeRuntime::Impl::prepare_layer(const MoeLayerSpec& spec, int64_t T, int k, const float* x) {
  check_cuda(cudaStreamSynchronize(compute), "previous layer");
  check_cuda(cudaStreamSynchronize(copy), "previous layer");
  layer = spec;
  tokens = T;
  top_k = k;
  xq_act[0] = xq_act[1] = -1;
  const int64_t E = spec.experts, H = spec.hidden, I = spec.inter;
  const int64_t P = T * k;
  this->x.reserve(static_cast<size_t>(T * H), "hidden states");
  router_w.reserve(static_cast<size_t>(E * H), "router weight");
  router_b.reserve(static_cast<size_t>(E), "router bias");
  corr.reserve(static_cast<size_t>(E), "correction bias");
  logits.reserve(static_cast<size_t>(T * E), "router logits");
  xq_got.reserve(static_cast<size_t>(T * H), "activations");
  xq_ref.reserve(static_cast<size_t>(T * H), "activations");
  const size_t scratch = static_cast<size_t>(std::max(T * H, P * I));
  scratch_in.reserve(scratch, "scratch");
  scratch_out.reserve(scratch, "scratch");
  got_inter.reserve(static_cast<size_t>(P * I), "intermediate");
  ref_inter.reserve(static_cast<size_t>(P * I), "intermediate");
  got_slots.reserve(static_cast<size_t>(P * H), "slot outputs");
  ref_slots.reserve(static_cast<size_t>(P * H), "slot outputs");
  got_out.reserve(static_cast<size_t>(T * H), "outputs");
  ref_out.reserve(static_cast<size_t>(T * H), "outputs");
  counts.reserve(static_cast<size_t>(E), "counts");
  offsets.reserve(static_cast<size_t>(E + 1), "offsets");
  sorted.reserve(static_cast<size_t>(P), "sorted slots");
  row_token.reserve(static_cast<size_t>(P), "row tokens");
  check_cuda(cudaMemcpyAsync(this->x.ptr, x, static_cast<size_t>(T * H) * sizeof(float),
                             cudaMemcpyHostToDevice, compute),
             "hidden states");
}

// After expert_ids / weights hold the routing: the token -> expert sort, zeroed slot outputs,
// the routing back on the host.
MoeDeviceRouting MoeRuntime::Impl::sort_layer() {
  const int64_t E = layer.experts, H = layer.hidden, T = tokens, P = T * top_k;
  kernels::count_slots_kernel<<<blocks_for(E, 128), 128, 0, compute>>>(expert_ids.ptr, P, E,
                                                                       counts.ptr);
  check_launch("count_slots_kernel");
  kernels::exclusive_scan_kernel<<<1, 1, 0, compute>>>(counts.ptr, E, offsets.ptr);
  check_launch("exclusive_scan_kernel");
  kernels::fill_sorted_kernel<<<blocks_for(E, 128), 128, 0, compute>>>(
      expert_ids.ptr, P, E, top_k, offsets.ptr, sorted.ptr, row_token.ptr);
  check_launch("fill_sorted_kernel");
  check_cuda(cudaMemsetAsync(got_slots.ptr, 0, static_cast<size_t>(P * H) * sizeof(float), compute),
             "slot outputs");
  check_cuda(
      cudaMemsetAsync(ref_slots.ptr, 0, static_cast<size_t>(P * H) * sizeof(double), compute),
      "slot outputs");
  check_cuda(cudaStreamSynchronize(compute), "sort");
  host_offsets.resize(static_cast<size_t>(E + 1));
  check_cuda(cudaMemcpyAsync(host_offsets.data(), offsets.ptr, host_offsets.size() * 4,
                             cudaMemcpyDeviceToHost, compute),
             "offsets");
  MoeDeviceRouting r = download_routing(T, top_k);
  host_weights = r.weights;
  return r;
}

MoeDeviceRouting MoeRuntime::begin_layer(const MoeLayerSpec& layer, const MoeRouterSpec& router,
                                         const float* x, int64_t tokens, const float* router_weight,
                                         const float* router_bias, const float* correction_bias) {
  Impl& m = *impl_;
  if (layer.experts != router.experts || layer.experts <= 0 || layer.hidden <= 0 ||
      layer.inter <= 0 || tokens <= 0 || router.top_k <= 0 || router.top_k > router.experts)
    throw Error(ErrorCode::kInternal, "", "MoeRuntime",
                "begin_layer: E=" + std::to_string(layer.experts) + " (router " +
                    std::to_string(router.experts) + ") H=" + std::to_string(layer.hidden) +
                    " I=" + std::to_string(layer.inter) + " T=" + std::to_string(tokens) +
                    " top_k=" + std::to_string(router.top_k));
  m.prepare_layer(layer, tokens, router.top_k, x);
  const int64_t E = layer.experts, H = layer.hidden, T = tokens;
  auto up = [&m](float* dst, const float* src, int64_t n, const char* what) {
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float),
                               cudaMemcpyHostToDevice, m.compute),
               what);
  };
  up(m.router_w.ptr, router_weight, E * H, "router weight");
  if (router_bias) up(m.router_b.ptr, router_bias, E, "router bias");
  if (correction_bias) up(m.corr.ptr, correction_bias, E, "correction bias");
  if (router.correction_bias && !correction_bias)
    throw Error(ErrorCode::kMissingTensor, "", "e_score_correction_bias",
                "router needs a correction bias");
  kernels::router_logits_kernel<<<blocks_for(T * E, 128), 128, 0, m.compute>>>(
      m.x.ptr, T, H, m.router_w.ptr, E, router_bias ? m.router_b.ptr : nullptr, m.logits.ptr);
  check_launch("router_logits_kernel");
  m.run_route(T, router, correction_bias ? m.corr.ptr : nullptr);
  return m.sort_layer();
}

MoeDeviceRouting MoeRuntime::begin_layer_routed(const MoeLayerSpec& layer, int64_t experts,
                                                const MoeDeviceRouting& routing, const float* x) {
  Impl& m = *impl_;
  const int64_t T = routing.tokens, k = routing.top_k;
  const size_t P = static_cast<size_t>(T * k);
  if (layer.experts != experts || layer.experts <= 0 || layer.hidden <= 0 || layer.inter <= 0 ||
      T <= 0 || k <= 0 || routing.expert_ids.size() != P || routing.weights.size() != P)
    throw Error(ErrorCode::kInternal, "", "MoeRuntime",
                "begin_layer_routed: E=" + std::to_string(layer.experts) +
                    " T=" + std::to_string(T) + " top_k=" + std::to_string(k) + " with " +
                    std::to_string(routing.expert_ids.size()) + " ids");
  for (int32_t e : routing.expert_ids)
    if (e < 0 || e >= experts)
      throw Error(ErrorCode::kInternal, "", "MoeRuntime",
                  "begin_layer_routed: expert id " + std::to_string(e) + " outside [0, " +
                      std::to_string(experts) + ")");
  m.prepare_layer(layer, T, static_cast<int>(k), x);
  m.expert_ids.reserve(P, "expert ids");
  m.weights.reserve(P, "routing weights");
  check_cuda(cudaMemcpyAsync(m.expert_ids.ptr, routing.expert_ids.data(), P * sizeof(int32_t),
                             cudaMemcpyHostToDevice, m.compute),
             "routing");
  check_cuda(cudaMemcpyAsync(m.weights.ptr, routing.weights.data(), P * sizeof(double),
                             cudaMemcpyHostToDevice, m.compute),
             "routing");
  return m.sort_layer();
}

void MoeRuntime::begin_chunk() {
  Impl& m = *impl_;
  m.area = (m.area + 1) % 2;
  StagingArea& a = m.areas[m.area];
  // The chunk before the previous one read this area: wait until it has finished.
  const auto t0 = std::chrono::steady_clock::now();
  check_cuda(cudaEventSynchronize(a.done), "staging area");
  m.add_host_time("host: waiting for a staging area", host_seconds_since(t0));
  a.clear();
  m.active = &a;
}

// Fills pinned [dst, dst + bytes) by fill(offset, length) over pieces on several threads (one
// core's memcpy is slower than the host-to-device link), then copies it up on the copy stream.
template <class F>
void MoeRuntime::Impl::fill_and_copy(uint8_t* dst, uint8_t* dev, size_t bytes, const F& fill) {
  if (bytes == 0) return;
  constexpr size_t kPiece = size_t{1} << 20;  // even: a piece holds whole pairs of nibbles
  const int64_t pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
  const auto t0 = std::chrono::steady_clock::now();
  parallel_for(pieces, static_cast<int>(std::min<int64_t>(pieces, 8)), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const size_t off = static_cast<size_t>(p) * kPiece;
      fill(off, std::min(kPiece, bytes - off));
    }
  });
  add_host_time("host: copying into pinned staging", host_seconds_since(t0));
  timed("upload (host to device)", copy, [&] {
    check_cuda(cudaMemcpyAsync(dev, dst, bytes, cudaMemcpyHostToDevice, copy), "upload");
  });
  uploaded_bytes += bytes;
}

const void* MoeRuntime::upload(const void* host, size_t bytes) {
  Impl& m = *impl_;
  if (m.area < 0) throw Error(ErrorCode::kInternal, "", "MoeRuntime", "upload before begin_chunk");
  const std::pair<uint8_t*, uint8_t*> at =
      stage_in(m.areas[m.area], bytes, kMinStagingBlock, false);
  uint8_t* dst = at.first;
  uint8_t* dev = at.second;
  const uint8_t* src = static_cast<const uint8_t*>(host);
  m.fill_and_copy(dst, dev, bytes,
                  [&](size_t off, size_t n) { std::memcpy(dst + off, src + off, n); });
  return dev;
}

const void* MoeRuntime::upload_nibbles(const uint8_t* codes, size_t count, bool signed_codes) {
  Impl& m = *impl_;
  const size_t bytes = (count + 1) / 2;
  if (m.area < 0) throw Error(ErrorCode::kInternal, "", "MoeRuntime", "upload before begin_chunk");
  const std::pair<uint8_t*, uint8_t*> at =
      stage_in(m.areas[m.area], bytes, kMinStagingBlock, false);
  uint8_t* dst = at.first;
  uint8_t* dev = at.second;
  m.fill_and_copy(dst, dev, bytes, [&](size_t off, size_t n) {
    pack_code_nibbles(codes + 2 * off, std::min(2 * n, count - 2 * off), signed_codes, dst + off);
  });
  return dev;
}

void MoeRuntime::forward_chunk(int64_t first, int64_t last, const reader::ProjReader& w13,
                               const reader::ProjReader& w2, bool reference,
                               const MoeChunkBiases& biases) {
  Impl& m = *impl_;
  if (first < 0 || last > m.layer.experts || first >= last)
    throw Error(ErrorCode::kInternal, "", "MoeRuntime",
                "expert range [" + std::to_string(first) + ", " + std::to_string(last) +
                    ") outside the layer's " + std::to_string(m.layer.experts));
  m.check_readers(first, last, w13, w2, reference ? "reference readers" : "layout readers");
  // The chunk's uploads come first (copy stream), then its kernels (compute stream).
  check_cuda(cudaEventRecord(m.copied, m.copy), "event");
  check_cuda(cudaStreamWaitEvent(m.compute, m.copied, 0), "event");
  const auto timed = Impl::event_pair(m.timing_events, m.timing_used++);
  check_cuda(cudaEventRecord(timed.first, m.compute), "event");
  if (reference)
    m.side<double>(first, last, w13, w2, biases, m.x.ptr, m.xq_ref.ptr, m.ref_inter.ptr,
                   m.ref_slots.ptr);
  else
    m.side<float>(first, last, w13, w2, biases, m.x.ptr, m.xq_got.ptr, m.got_inter.ptr,
                  m.got_slots.ptr);
  check_cuda(cudaEventRecord(timed.second, m.compute), "event");
  if (m.active) check_cuda(cudaEventRecord(m.active->done, m.compute), "event");
}

void MoeRuntime::run_chunk(int64_t first, int64_t last, const reader::ProjReader& w13,
                           const reader::ProjReader& w2, const reader::ProjReader& ref_w13,
                           const reader::ProjReader& ref_w2, const MoeChunkBiases& biases,
                           const MoeChunkBiases& ref_biases) {
  forward_chunk(first, last, w13, w2, false, biases);
  forward_chunk(first, last, ref_w13, ref_w2, true, ref_biases);
}

void MoeRuntime::make_stages(int slots) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.stage_m);
  if (!m.stage_slots.empty() || slots < 1)
    throw Error(ErrorCode::kInternal, "", "MoeRuntime",
                "make_stages(" + std::to_string(slots) + "): once, with at least one slot");
  for (int i = 0; i < slots; ++i) {
    m.stage_slots.push_back(std::make_unique<StagingArea>());
    m.stage_slots.back()->anonymous = true;
    check_cuda(cudaEventCreateWithFlags(&m.stage_slots.back()->done, cudaEventDisableTiming),
               "event");
    m.free_slots.push_back(i);
  }
}

MoeChunkStage MoeRuntime::acquire_stage() {
  Impl& m = *impl_;
  const int64_t t0 = steady_ns();
  MoeChunkStage stage;
  {
    std::unique_lock<std::mutex> lock(m.stage_m);
    if (m.stage_slots.empty())
      throw Error(ErrorCode::kInternal, "", "MoeRuntime", "acquire_stage before make_stages");
    m.stage_cv.wait(lock, [&] { return !m.free_slots.empty(); });
    stage.slot_ = m.free_slots.front();
    m.free_slots.pop_front();
    stage.runtime_ = &m;  // from here on the stage gives the slot back
  }
  StagingArea& a = *m.stage_slots[static_cast<size_t>(stage.slot_)];
  // The chunk that used this slot last: its copies and kernels have finished.
  check_cuda(cudaEventSynchronize(a.done), "chunk stage");
  a.fit_to_last_chunk();
  a.clear();
  if (m.profile) {
    m.slot_wait_ns += steady_ns() - t0;
    ++m.slot_waits;
  }
  return stage;
}

void MoeRuntime::run_staged_chunk(MoeChunkStage& stage, int64_t first, int64_t last,
                                  const reader::ProjReader& w13, const reader::ProjReader& w2,
                                  const reader::ProjReader& ref_w13,
                                  const reader::ProjReader& ref_w2, const MoeChunkBiases& biases,
                                  const MoeChunkBiases& ref_biases) {
  Impl& m = *impl_;
  if (stage.runtime_ != &m)
    throw Error(ErrorCode::kInternal, "", "MoeRuntime",
                "run_staged_chunk: an empty stage, or one of another runtime");
  StagingArea& a = *m.stage_slots[static_cast<size_t>(stage.slot_)];
  StagingArea* const before = m.active;
  m.active = &a;
  try {
    m.timed("upload (host to device)", m.copy, [&] {
      for (const StagingBlock& b : a.blocks)
        if (b.used > 0)
          check_cuda(cudaMemcpyAsync(b.device, b.host, b.used, cudaMemcpyHostToDevice, m.copy),
                     "upload");
    });
    m.uploaded_bytes += a.bytes;
    run_chunk(first, last, w13, w2, ref_w13, ref_w2, biases, ref_biases);
  } catch (...) {
    // The slot is reused only after whatever was queued on it (best effort: this is a failure).
    cudaEventRecord(m.copied, m.copy);
    cudaStreamWaitEvent(m.compute, m.copied, 0);
    cudaEventRecord(a.done, m.compute);
    m.active = before;
    throw;
  }
  m.active = before;
  stage.release();
}

MoeChunkStage::~MoeChunkStage() {
  release();
}

MoeChunkStage::MoeChunkStage(MoeChunkStage&& other) noexcept
    : runtime_(other.runtime_), slot_(other.slot_) {
  other.runtime_ = nullptr;
  other.slot_ = -1;
}

MoeChunkStage& MoeChunkStage::operator=(MoeChunkStage&& other) noexcept {
  if (this != &other) {
    release();
    runtime_ = other.runtime_;
    slot_ = other.slot_;
    other.runtime_ = nullptr;
    other.slot_ = -1;
  }
  return *this;
}

void MoeChunkStage::release() noexcept {
  if (!runtime_) return;
  MoeRuntime::Impl& m = *runtime_;
  {
    std::lock_guard<std::mutex> lock(m.stage_m);
    m.free_slots.push_back(slot_);
  }
  m.stage_cv.notify_one();
  runtime_ = nullptr;
  slot_ = -1;
}

const void* MoeChunkStage::upload(const void* host, size_t bytes) {
  if (!runtime_) throw Error(ErrorCode::kInternal, "", "MoeChunkStage", "upload to an empty stage");
  MoeRuntime::Impl& m = *runtime_;
  const int64_t t0 = steady_ns();
  const auto at =
      stage_in(*m.stage_slots[static_cast<size_t>(slot_)], bytes, kMinStageSlotBlock, true);
  if (bytes > 0) std::memcpy(at.first, host, bytes);
  if (m.profile) {
    m.fill_ns += steady_ns() - t0;
    ++m.fills;
  }
  return at.second;
}

const void* MoeChunkStage::upload_nibbles(const uint8_t* codes, size_t count, bool signed_codes) {
  if (!runtime_) throw Error(ErrorCode::kInternal, "", "MoeChunkStage", "upload to an empty stage");
  MoeRuntime::Impl& m = *runtime_;
  const int64_t t0 = steady_ns();
  const auto at = stage_in(*m.stage_slots[static_cast<size_t>(slot_)], (count + 1) / 2,
                           kMinStageSlotBlock, true);
  if (count > 0) pack_code_nibbles(codes, count, signed_codes, at.first);
  if (m.profile) {
    m.fill_ns += steady_ns() - t0;
    ++m.fills;
  }
  return at.second;
}

MoeLayerOutputs MoeRuntime::finish_layer() {
  Impl& m = *impl_;
  const int64_t T = m.tokens, H = m.layer.hidden, P = T * m.top_k;
  kernels::combine_kernel<float><<<blocks_for(T * H, 256), 256, 0, m.compute>>>(
      m.got_slots.ptr, m.weights.ptr, T, m.top_k, H, m.got_out.ptr);
  check_launch("combine_kernel");
  kernels::combine_kernel<double><<<blocks_for(T * H, 256), 256, 0, m.compute>>>(
      m.ref_slots.ptr, m.weights.ptr, T, m.top_k, H, m.ref_out.ptr);
  check_launch("combine_kernel");
  check_cuda(cudaStreamSynchronize(m.compute), "layer");
  if (m.profile) {
    check_cuda(cudaStreamSynchronize(m.copy), "layer");
    m.collect_profile();
  }
  for (size_t i = 0; i < m.timing_used; ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, m.timing_events[i].first, m.timing_events[i].second),
               "kernel timing");
    m.kernel_seconds += static_cast<double>(ms) * 1e-3;
  }
  m.timing_used = 0;
  MoeLayerOutputs o;
  o.got_out.resize(static_cast<size_t>(T * H));
  o.ref_out.resize(static_cast<size_t>(T * H));
  o.ref_slots.resize(static_cast<size_t>(P * H));
  std::vector<float> got_slots(static_cast<size_t>(P * H));
  check_cuda(cudaMemcpyAsync(o.got_out.data(), m.got_out.ptr, o.got_out.size() * 8,
                             cudaMemcpyDeviceToHost, m.compute),
             "outputs");
  check_cuda(cudaMemcpyAsync(o.ref_out.data(), m.ref_out.ptr, o.ref_out.size() * 8,
                             cudaMemcpyDeviceToHost, m.compute),
             "outputs");
  check_cuda(cudaMemcpyAsync(o.ref_slots.data(), m.ref_slots.ptr, o.ref_slots.size() * 8,
                             cudaMemcpyDeviceToHost, m.compute),
             "slot outputs");
  check_cuda(cudaMemcpyAsync(got_slots.data(), m.got_slots.ptr, got_slots.size() * 4,
                             cudaMemcpyDeviceToHost, m.compute),
             "slot outputs");
  o.got_slots.assign(got_slots.begin(), got_slots.end());
  return o;
}

double MoeRuntime::kernel_seconds() const {
  return impl_->kernel_seconds;
}

uint64_t MoeRuntime::uploaded_bytes() const {
  return impl_->uploaded_bytes;
}

std::vector<MoeProfileEntry> MoeRuntime::kernel_profile() const {
  const Impl& m = *impl_;
  std::vector<MoeProfileEntry> out;
  for (const auto& [name, t] : m.profile_totals) out.push_back({name, t.first, t.second});
  // The chunk stages' filling, busy seconds summed over the threads that filled them.
  if (m.fills > 0)
    out.push_back({"stages (filling threads): copying into pinned slots",
                   static_cast<double>(m.fill_ns.load()) * 1e-9, m.fills.load()});
  if (m.slot_waits > 0)
    out.push_back({"stages (filling threads): waiting for a free slot",
                   static_cast<double>(m.slot_wait_ns.load()) * 1e-9, m.slot_waits.load()});
  return out;
}

std::vector<float> MoeRuntime::router_logits(const float* x, int64_t tokens, int64_t hidden,
                                             const float* router_weight, int64_t experts,
                                             const float* router_bias) {
  Impl& m = *impl_;
  check_cuda(cudaStreamSynchronize(m.compute), "sync");
  m.xq_act[0] = m.xq_act[1] = -1;  // x is overwritten
  m.x.reserve(static_cast<size_t>(tokens * hidden), "hidden states");
  m.router_w.reserve(static_cast<size_t>(experts * hidden), "router weight");
  m.router_b.reserve(static_cast<size_t>(experts), "router bias");
  m.logits.reserve(static_cast<size_t>(tokens * experts), "router logits");
  check_cuda(cudaMemcpyAsync(m.x.ptr, x, static_cast<size_t>(tokens * hidden) * 4,
                             cudaMemcpyHostToDevice, m.compute),
             "x");
  check_cuda(
      cudaMemcpyAsync(m.router_w.ptr, router_weight, static_cast<size_t>(experts * hidden) * 4,
                      cudaMemcpyHostToDevice, m.compute),
      "router weight");
  if (router_bias)
    check_cuda(cudaMemcpyAsync(m.router_b.ptr, router_bias, static_cast<size_t>(experts) * 4,
                               cudaMemcpyHostToDevice, m.compute),
               "router bias");
  kernels::router_logits_kernel<<<blocks_for(tokens * experts, 128), 128, 0, m.compute>>>(
      m.x.ptr, tokens, hidden, m.router_w.ptr, experts, router_bias ? m.router_b.ptr : nullptr,
      m.logits.ptr);
  check_launch("router_logits_kernel");
  check_cuda(cudaStreamSynchronize(m.compute), "router_logits_kernel");
  std::vector<float> out(static_cast<size_t>(tokens * experts));
  check_cuda(
      cudaMemcpyAsync(out.data(), m.logits.ptr, out.size() * 4, cudaMemcpyDeviceToHost, m.compute),
      "logits");
  return out;
}

MoeDeviceRouting MoeRuntime::route(const std::vector<float>& logits, const float* correction_bias,
                                   const MoeRouterSpec& router) {
  Impl& m = *impl_;
  const int64_t E = router.experts;
  if (E <= 0 || logits.size() % static_cast<size_t>(E) != 0 || router.top_k > E ||
      router.n_group <= 0 || E % router.n_group != 0)
    throw Error(ErrorCode::kInternal, "", "MoeRuntime", "route: bad router shape");
  const int64_t T = static_cast<int64_t>(logits.size()) / E;
  check_cuda(cudaStreamSynchronize(m.compute), "sync");
  m.logits.reserve(logits.size(), "router logits");
  m.corr.reserve(static_cast<size_t>(E), "correction bias");
  check_cuda(cudaMemcpyAsync(m.logits.ptr, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice,
                             m.compute),
             "logits");
  if (correction_bias)
    check_cuda(cudaMemcpyAsync(m.corr.ptr, correction_bias, static_cast<size_t>(E) * 4,
                               cudaMemcpyHostToDevice, m.compute),
               "correction bias");
  m.run_route(T, router, correction_bias ? m.corr.ptr : nullptr);
  return m.download_routing(T, router.top_k);
}

void MoeRuntime::sorted_slots(std::vector<int32_t>* offsets, std::vector<int32_t>* sorted) {
  Impl& m = *impl_;
  check_cuda(cudaStreamSynchronize(m.compute), "sync");
  *offsets = m.host_offsets;
  sorted->resize(static_cast<size_t>(m.tokens * m.top_k));
  check_cuda(cudaMemcpyAsync(sorted->data(), m.sorted.ptr, sorted->size() * 4,
                             cudaMemcpyDeviceToHost, m.compute),
             "sorted slots");
}

}  // namespace moepack
