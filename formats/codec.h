// The codec interface and the canonical quantized form every format converts through.
//
//   checkpoint tensors --SourceCodec.unpack--> QuantTensor --TargetLayout.pack--> kernel params
//   kernel params --TargetLayout.unpack--> QuantTensor --SourceCodec.pack--> checkpoint tensors
//
// N source codecs + M target layouts instead of N x M converters (STYLE.md §2). Integer codes
// never pass through float. Codecs are plain C++: no I/O, no CLI, no CUDA.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace moepack {

// What kind of numbers QuantTensor::codes holds.
enum class CodeKind : uint8_t {
  kUint,     // unsigned integer codes 0..2^bits-1; symmetric ones carry the bias 2^(bits-1)
  kInt,      // signed two's complement int8 codes as stored (W8A8 int8), one byte each
  kFp8E4M3,  // float8_e4m3fn bytes (MXFP8, FP8 block)
};

// Normalised quantization method of a checkpoint (lib/hf_config parses config.json into it).
enum class QuantMethod : uint8_t {
  kNone,             // bf16 / fp16 / fp32 weights
  kGptq,             // AutoGPTQ / GPTQModel, qweight [K/pf, N]
  kAwq,              // AutoAWQ GEMM, qweight [K, N/8]
  kCtPackQuantized,  // compressed-tensors pack-quantized W4A16/W8A16, weight_packed [N, K/pf]
  kCtIntQuantized,   // compressed-tensors int-quantized W8A8 int8, weight I8 [N, K]
  kCtMxfp8,          // compressed-tensors mxfp8-quantized
  kModeloptMxfp8,    // ModelOpt MXFP8, weight F8_E4M3 [N, K], weight_scale U8 [N, K/32]
  kModeloptFp8,      // ModelOpt FP8 per-tensor (recognised, not converted)
  kFp8Block,         // DeepSeek-style FP8 block, weight_scale_inv F32 [N/128, K/128]
};
const char* quant_method_name(QuantMethod m);
// Inverse of quant_method_name; nullopt for a name no method has.
std::optional<QuantMethod> parse_quant_method(const std::string& name);

enum class GptqFormat : uint8_t { kV1, kV2 };  // v1 stores zero-1, v2 stores zero

// Normalised quantization parameters (the codec's view of quantization_config).
struct QuantParams {
  QuantMethod method = QuantMethod::kNone;
  int bits = 16;            // 4 or 8 for integer methods, 8 for fp8
  int64_t group_size = -1;  // along K; -1 = channelwise (one group)
  bool symmetric = true;
  bool act_order = false;  // GPTQ desc_act / CT actorder == "group" (g_idx present)
  GptqFormat gptq_format = GptqFormat::kV1;
  std::string actorder;                  // CT: "group", "weight", "static", "dynamic" or ""
  int64_t block_n = 128, block_k = 128;  // FP8 block (weight_block_size)
  DType dtype = DType::kBF16;  // model dtype (torch_dtype): dtype of scales in the checkpoint
  bool dynamic_input = true;   // W8A8 / FP8: activations quantised at run time
};

// The canonical form: one projection of E experts, logical orientation [N, K]
// (N = output features, K = input features, like torch.nn.Linear).
struct QuantTensor {
  int64_t experts = 1;
  int64_t n = 0, k = 0;
  CodeKind kind = CodeKind::kUint;
  int bits = 4;
  int64_t group_size = -1;          // along K; -1 = one group over all of K
  int64_t scale_block_n = 1;        // rows of N sharing one scale row (128 for FP8 block)
  bool symmetric = true;            // true: zero point is 2^(bits-1), `zeros` empty
  DType scale_dtype = DType::kF16;  // F16, BF16, F32, or U8 holding E8M0 codes
  std::vector<uint8_t> codes;       // [E, N, K] one code per byte
  std::vector<uint8_t> scales;      // [E, ceil(N/scale_block_n), G] raw little-endian scale_dtype
  std::vector<uint8_t> zeros;       // [E, N, G] real zero points (asymmetric only), may exceed
                                    // 2^bits-1 by one for GPTQ v1 (stored 2^bits-1 means 2^bits)
  std::vector<int32_t> g_idx;       // [E, K] group of each input row, or empty

  int64_t groups() const { return group_size <= 0 ? 1 : (k + group_size - 1) / group_size; }
  int64_t scale_rows() const { return (n + scale_block_n - 1) / scale_block_n; }
  int scale_bytes() const { return dtype_bits(scale_dtype) / 8; }
  // Checks vector sizes against the shape; throws kInternal naming `what` on mismatch.
  void check_consistent(const std::string& what) const;
};

// Reference dequantisation of one expert into float [N, K] (row-major). The scalar definition
// every backend's numerical check is compared against.
std::vector<float> dequantize_expert(const QuantTensor& q, int64_t expert);

// A checkpoint format: one Linear (one expert projection) <-> QuantTensor with experts == 1.
struct SourceCodec {
  const char* name;  // "gptq", "awq", "ct-pack", ...
  QuantMethod method;
  // Tensor suffixes one Linear has on disk, e.g. {"qweight","qzeros","scales","g_idx"}; the
  // optional ones are listed by `optional_suffixes`.
  std::vector<std::string> (*required_suffixes)(const QuantParams&);
  std::vector<std::string> (*optional_suffixes)(const QuantParams&);
  // n, k: the logical shape of the Linear. Throws kBadShape / kBadDtype naming the suffix.
  QuantTensor (*unpack)(const QuantParams&, const TensorMap& by_suffix, int64_t n, int64_t k);
  // Exact inverse of unpack for the tensors unpack reads.
  TensorMap (*pack)(const QuantParams&, const QuantTensor&);
};

// Options a target layout takes.
struct LayoutOptions {
  DType act_dtype = DType::kBF16;  // Marlin: scales are stored in the activation dtype
  bool gated = true;               // w13 = [gate; up] (2I rows) vs a single projection (I)
  bool a8 = false;                 // Marlin 8-bit-activation tile variant
  // Marlin: reproduce vLLM's loader bug (w13 scale size_k = I) instead of the kernel layout.
  bool vllm_w13_scale_size_k = false;
  std::string prefix;  // "model.layers.3.mlp.experts." prepended to param names
  // Which checkpoint format the experts came from: picks vLLM's parameter names
  // (GPTQ: w13_qweight/w13_scales/w13_g_idx, AWQ: + w13_qzeros, CT: w13_weight_packed/...).
  QuantMethod source_method = QuantMethod::kGptq;
  int threads = 1;  // worker threads; output bytes never depend on it
};

enum class MoeProj : uint8_t { kW13, kW2 };

// One MoE layer's experts in canonical form: w13 stacked [gate; up] along N (vLLM order).
struct MoeExperts {
  QuantTensor w13;  // [E, 2I, H] (gated) or [E, I, H]
  QuantTensor w2;   // [E, H, I]
};

// A backend layout: one MoE layer's stacked experts <-> the kernel's parameters, named and
// shaped like vLLM's FusedMoE parameters after process_weights_after_loading.
struct TargetLayout {
  const char* name;  // "marlin", "triton-wna16", "trtllm-mxfp8", ...
  int layout_version;
  std::vector<Tensor> (*pack)(const LayoutOptions&, const MoeExperts&);
  // Recovers exactly what pack consumed (scales in the layout's dtype).
  MoeExperts (*unpack)(const LayoutOptions&, const TensorMap& params_by_name);
  // y[M, N] = x[M, K] . W_e^T for one expert's w13 or w2, computed by reading the packed
  // parameters the way the kernel reads them (tiles, shuffled rows, swizzled scales, permuted
  // activations for act-order) -- never by calling unpack first. float accumulate.
  void (*expert_matmul)(const LayoutOptions&, const TensorMap& params_by_name, MoeProj proj,
                        int64_t expert, const float* x, int64_t m, float* y);
  // Human-readable ways this layout deliberately differs from what vLLM's loader would write
  // for these experts (recorded in moepack.json); empty when identical.
  std::vector<std::string> (*deviations_from_vllm)(const LayoutOptions&, const MoeExperts&);
};

// The explicit registry tables (formats/registry.cpp).
const std::vector<SourceCodec>& source_codecs();
const std::vector<TargetLayout>& target_layouts();
const SourceCodec* find_source_codec(QuantMethod method);
const TargetLayout* find_target_layout(const std::string& name);

// Generic helpers shared by codecs.
// y[i, n] = x[i, :] . w_row for i < m (x [m, k] and y [m, ldy] row-major): the output column of
// one decoded weight row, as each layout's expert_matmul produces it (float accumulate).
void dot_weight_row_into_column(const float* x, int64_t m, int64_t k, const float* w_row, float* y,
                                int64_t ldy, int64_t n);
// Whether w13 and w2 form one MoE layer (same experts, w13 K == w2 N, w13 N == (2 if gated) x
// w2 K); empty when they do. A mismatch is a caller bug or a malformed layer (kBadShape), not a
// layout limitation.
std::vector<std::string> moe_shape_problems(const LayoutOptions& opts, const MoeExperts& x);
// Throws kBadShape (naming opts.prefix + "w13_weight") listing moe_shape_problems, then checks
// each QuantTensor's buffer sizes.
void check_moe_structure(const LayoutOptions& opts, const MoeExperts& x);
// Looks up `key` in a codec's tensor map; kMissingTensor naming the key ("<what> lacks 'key'").
const Tensor& require_tensor(const TensorMap& m, const std::string& key, const std::string& what);
// One scale element as float: F16, BF16, F32, or U8 / F8_E8M0 holding an E8M0 code.
float scale_to_float(const uint8_t* p, DType d);
std::vector<int32_t> invert_permutation(const std::vector<int32_t>& perm);
std::vector<int32_t> stable_argsort(const int32_t* values, int64_t count);

}  // namespace moepack
