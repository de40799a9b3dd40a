// Built when CUDA is off: every device entry point says so explicitly (STYLE.md §7).
#include "core/error.h"
#include "kernels/marlin_moe.h"
#include "kernels/moe_runtime.h"
#include "kernels/moepack_cuda.h"

namespace moepack {
namespace {
[[noreturn]] void no_cuda() {
  throw Error(ErrorCode::kNoCuda, "built without CUDA");
}
}  // namespace

CudaDeviceInfo cuda_device_info() {
  return {};
}

struct MoeRuntime::Impl {};

MoeRuntime::MoeRuntime() {
  no_cuda();
}
MoeRuntime::~MoeRuntime() = default;
MoeDeviceRouting MoeRuntime::begin_layer(const MoeLayerSpec&, const MoeRouterSpec&, const float*,
                                         int64_t, const float*, const float*, const float*) {
  no_cuda();
}
MoeDeviceRouting MoeRuntime::begin_layer_routed(const MoeLayerSpec&, int64_t,
                                                const MoeDeviceRouting&, const float*) {
  no_cuda();
}
void MoeRuntime::begin_chunk() {
  no_cuda();
}
const void* MoeRuntime::upload(const void*, size_t) {
  no_cuda();
}
const void* MoeRuntime::upload_nibbles(const uint8_t*, size_t, bool) {
  no_cuda();
}
void MoeRuntime::run_chunk(int64_t, int64_t, const reader::ProjReader&, const reader::ProjReader&,
                           const reader::ProjReader&, const reader::ProjReader&,
                           const MoeChunkBiases&, const MoeChunkBiases&) {
  no_cuda();
}
void MoeRuntime::forward_chunk(int64_t, int64_t, const reader::ProjReader&,
                               const reader::ProjReader&, bool, const MoeChunkBiases&) {
  no_cuda();
}
void MoeRuntime::make_stages(int) {
  no_cuda();
}
MoeChunkStage MoeRuntime::acquire_stage() {
  no_cuda();
}
void MoeRuntime::run_staged_chunk(MoeChunkStage&, int64_t, int64_t, const reader::ProjReader&,
                                  const reader::ProjReader&, const reader::ProjReader&,
                                  const reader::ProjReader&, const MoeChunkBiases&,
                                  const MoeChunkBiases&) {
  no_cuda();
}
// No runtime is ever made without CUDA, so no stage is ever filled.
MoeChunkStage::~MoeChunkStage() = default;
MoeChunkStage::MoeChunkStage(MoeChunkStage&& other) noexcept
    : runtime_(other.runtime_), slot_(other.slot_) {}
MoeChunkStage& MoeChunkStage::operator=(MoeChunkStage&& other) noexcept {
  runtime_ = other.runtime_;
  slot_ = other.slot_;
  return *this;
}
void MoeChunkStage::release() noexcept {}
const void* MoeChunkStage::upload(const void*, size_t) {
  no_cuda();
}
const void* MoeChunkStage::upload_nibbles(const uint8_t*, size_t, bool) {
  no_cuda();
}
const uint8_t* MoeChunkStage::decode_marlin_codes(const MarlinCodeDecode&) {
  no_cuda();
}
std::vector<uint8_t> MoeRuntime::staged_bytes(MoeChunkStage&, const void*, size_t) {
  no_cuda();
}
MoeLayerOutputs MoeRuntime::finish_layer() {
  no_cuda();
}
double MoeRuntime::kernel_seconds() const {
  no_cuda();
}
uint64_t MoeRuntime::uploaded_bytes() const {
  no_cuda();
}
std::vector<MoeProfileEntry> MoeRuntime::kernel_profile() const {
  no_cuda();
}
std::vector<float> MoeRuntime::router_logits(const float*, int64_t, int64_t, const float*, int64_t,
                                             const float*) {
  no_cuda();
}
MoeDeviceRouting MoeRuntime::route(const std::vector<float>&, const float*, const MoeRouterSpec&) {
  no_cuda();
}
void MoeRuntime::sorted_slots(std::vector<int32_t>*, std::vector<int32_t>*) {
  no_cuda();
}

std::vector<float> cuda_marlin_moe_forward(const MarlinMoeHostLayer&, const std::vector<uint16_t>&,
                                           const std::vector<int32_t>&, const std::vector<float>&,
                                           int64_t, int32_t) {
  throw Error(ErrorCode::kNoCuda, "built without CUDA");
}

}  // namespace moepack
