// The CUDA fused-MoE runtime of `verify --device cuda` (issue 12): routing, token sorting and the
// MoE computed from weight readers (formats/layout/moe_reader.h) with device pointers, once with
// the layout's readers (fp32 accumulate, like the serving kernel) and once with canonical readers
// of the reference experts (fp64 accumulate, like verify/moe_reference).
//
//   begin_layer   x [T, H] up; router logits, routing, token -> expert sort on the device;
//                 the routing comes back (verify compares outputs per routed slot)
//   begin_chunk   a staging area: upload() copies host bytes into pinned memory and on to the
//                 device on the copy stream; two areas alternate, so chunk i + 1 uploads while
//                 chunk i computes, and an area is reused only once its chunk has finished
//   run_chunk     experts [first, last): both MoEs into the layer's slot outputs (compute stream,
//                 after the chunk's copies)
//   finish_layer  weighted combine on the device; outputs and slot outputs come back
//
// Chunk stages (verify's pipeline): instead of begin_chunk + upload on the driving thread, any
// thread may fill a chunk's pinned staging ahead of its turn. make_stages(n) makes a pool of n
// slots (pinned host memory mirrored by device memory, grown to what a chunk needs and then
// reused; the host side is anonymous memory registered with CUDA, counted as the process's
// anonymous memory); acquire_stage() (thread-safe) takes a free slot once the kernels of the chunk
// that used it last have finished; MoeChunkStage::upload / upload_nibbles copy into it on the
// calling thread and return the device addresses; run_staged_chunk (the driving thread) only issues
// the slot's host-to-device copies and the chunk's kernels, and gives the slot back to the pool.
//
// Device buffers and pinned areas grow as needed and are reused across layers. Declared always;
// without CUDA every entry point throws Error{kNoCuda} (kernels/src/stub.cpp). Not thread-safe
// apart from acquire_stage and the stages it returns: one thread drives one runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/layout/moe_reader.h"

namespace moepack {

class MoeChunkStage;

// ref::RouterConfig without verify/ types (verify converts).
struct MoeRouterSpec {
  int64_t experts = 0;
  int top_k = 1;
  bool sigmoid = false;  // softmax otherwise
  bool renormalize = false;
  int n_group = 1;
  int topk_group = 1;
  int group_score = 0;  // 0 none, 1 max (DeepSeek-V2), 2 sum of the top 2 (DeepSeek-V3)
  double routed_scaling_factor = 1.0;
  bool correction_bias = false;  // e_score_correction_bias [E] used for selection
};

struct MoeLayerSpec {
  int64_t experts = 0, hidden = 0, inter = 0;
  bool gated = true;   // w13 rows [gate; up]: glu(gate, up); else act(w13 . x)
  bool relu2 = false;  // the non-gated activation is relu2 (same as activation = kActRelu2)
  int activation = 0;  // formats/layout/activation.h code (kActSilu, kActGeluTanh, ...)
};

// Routing of T tokens as ref::Routing holds it: [T, top_k] best first.
struct MoeDeviceRouting {
  int64_t tokens = 0;
  int top_k = 0;
  std::vector<int32_t> expert_ids;
  std::vector<double> weights;
};

// One line of MoeRuntime::kernel_profile: what ran (a kernel of one side, the uploads, or host
// time of the staging), its summed seconds and how many times it ran.
struct MoeProfileEntry {
  std::string name;
  double seconds = 0;
  int64_t count = 0;
};

// One chunk's expert biases (gpt-oss' gate_up_proj_bias / down_proj_bias, vLLM's w13_bias /
// w2_bias) as float device pointers (upload()), indexed from the chunk's first expert, or null
// for none: w13 [experts of the chunk, w13 rows] in the readers' logical row order ([gate; up]),
// w2 [experts of the chunk, H]. Added as verify/moe_reference adds them: the w13 bias to GEMM1's
// sums before the activation, the w2 bias to GEMM2's before the top-k weighting, in the side's
// accumulator type (float for the layout side, double for the reference side).
struct MoeChunkBiases {
  const float* w13 = nullptr;
  const float* w2 = nullptr;
};

// The layer's results: [T, H] combined outputs and [T * top_k, H] unweighted per-slot outputs of
// the layout side (float, widened) and of the reference side (double).
struct MoeLayerOutputs {
  std::vector<double> got_out, got_slots, ref_out, ref_slots;
};

class MoeRuntime {
 public:
  MoeRuntime();  // device 0; kNoCuda without one
  ~MoeRuntime();
  MoeRuntime(const MoeRuntime&) = delete;
  MoeRuntime& operator=(const MoeRuntime&) = delete;

  // router_bias and correction_bias may be null. Non-finite logits: kBadValue naming
  // router_logits with the token and expert (as ref::route).
  MoeDeviceRouting begin_layer(const MoeLayerSpec& layer, const MoeRouterSpec& router,
                               const float* x, int64_t tokens, const float* router_weight,
                               const float* router_bias, const float* correction_bias);
  // begin_layer with a routing computed on the host (verify's route_layer, for routers the
  // device's kernels do not compute): x [T, H] is the experts' input; ids in [0, experts).
  MoeDeviceRouting begin_layer_routed(const MoeLayerSpec& layer, int64_t experts,
                                      const MoeDeviceRouting& routing, const float* x);
  void begin_chunk();
  // A device copy of host[0, bytes), valid until the chunk after the next one begins.
  const void* upload(const void* host, size_t bytes);
  // upload() of codes[0, count) packed two per byte (formats/moe_reader.h pack_code_nibbles: half
  // the bytes to stage and copy), for a canonical reader with packed_codes. kInternal for a code
  // that does not fit in 4 bits.
  const void* upload_nibbles(const uint8_t* codes, size_t count, bool signed_codes);
  // Both MoEs for experts [first, last) of the layer. The readers index experts from 0 = first;
  // `biases` are the layout side's, `ref_biases` the reference side's (each may be none).
  void run_chunk(int64_t first, int64_t last, const reader::ProjReader& w13,
                 const reader::ProjReader& w2, const reader::ProjReader& ref_w13,
                 const reader::ProjReader& ref_w2, const MoeChunkBiases& biases = {},
                 const MoeChunkBiases& ref_biases = {});
  // One side only (fp32 accumulate unless reference): the plain fused MoE forward, for benches
  // and for specialised kernels to compare against.
  void forward_chunk(int64_t first, int64_t last, const reader::ProjReader& w13,
                     const reader::ProjReader& w2, bool reference,
                     const MoeChunkBiases& biases = {});
  // The pool of chunk stages: `slots` slots, each empty until a chunk fills it. Once, before any
  // acquire_stage. A caller that holds at most `slots` stages at once never waits for one
  // that is not coming (a slot in use comes back when its stage is run or destroyed).
  void make_stages(int slots);
  // A free slot of the pool, once the kernels that read it last have finished (waits for both).
  // Thread-safe. kInternal before make_stages.
  MoeChunkStage acquire_stage();
  // run_chunk over a filled stage: its slot copied up on the copy stream, then both MoEs; the
  // slot goes back to the pool (reused once these kernels finished) and `stage` is left empty.
  void run_staged_chunk(MoeChunkStage& stage, int64_t first, int64_t last,
                        const reader::ProjReader& w13, const reader::ProjReader& w2,
                        const reader::ProjReader& ref_w13, const reader::ProjReader& ref_w2,
                        const MoeChunkBiases& biases = {}, const MoeChunkBiases& ref_biases = {});
  MoeLayerOutputs finish_layer();
  // Seconds the MoE kernels of every finished layer took on the device (CUDA events around each
  // forward_chunk's launches on the compute stream), for verify's timing.
  double kernel_seconds() const;
  // Bytes upload() copied to the device so far.
  uint64_t uploaded_bytes() const;
  // With MOEPACK_VERIFY_PROFILE set in the environment (not "0") when the runtime was made: each
  // kernel and upload timed by CUDA events (summed per name over the finished layers), and the
  // host's staging copies and waits; empty otherwise (nothing is recorded).
  std::vector<MoeProfileEntry> kernel_profile() const;

  // Router pieces alone (tests: they equal verify/router.cpp's).
  std::vector<float> router_logits(const float* x, int64_t tokens, int64_t hidden,
                                   const float* router_weight, int64_t experts,
                                   const float* router_bias);
  MoeDeviceRouting route(const std::vector<float>& logits, const float* correction_bias,
                         const MoeRouterSpec& router);
  // The layer's token -> expert sort after begin_layer: offsets [E + 1] and sorted slots.
  void sorted_slots(std::vector<int32_t>* offsets, std::vector<int32_t>* sorted);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// One chunk's slot of pinned staging (MoeRuntime::acquire_stage), filled on the thread that holds
// it: upload() copies host[0, bytes) into the slot and returns the device address the bytes have
// once MoeRuntime::run_staged_chunk copied the slot up; upload_nibbles() packs codes two per byte
// into it as MoeRuntime::upload_nibbles does. Destroyed (or moved from) unrun, its slot goes back
// to the pool as it is. Must not outlive its runtime. Default-constructed: empty.
class MoeChunkStage {
 public:
  MoeChunkStage() = default;
  ~MoeChunkStage();
  MoeChunkStage(MoeChunkStage&& other) noexcept;
  MoeChunkStage& operator=(MoeChunkStage&& other) noexcept;
  MoeChunkStage(const MoeChunkStage&) = delete;
  MoeChunkStage& operator=(const MoeChunkStage&) = delete;

  // kInternal on an empty stage.
  const void* upload(const void* host, size_t bytes);
  const void* upload_nibbles(const uint8_t* codes, size_t count, bool signed_codes);
  bool empty() const { return runtime_ == nullptr; }

 private:
  friend class MoeRuntime;
  void release() noexcept;
  MoeRuntime::Impl* runtime_ = nullptr;
  int slot_ = -1;
};

}  // namespace moepack
