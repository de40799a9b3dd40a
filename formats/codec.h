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
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "formats/layout/moe_reader.h"

namespace moepack {

// What kind of numbers QuantTensor::codes holds.
enum class CodeKind : uint8_t {
  kUint,     // unsigned integer codes 0..2^bits-1; symmetric ones carry the bias 2^(bits-1)
  kInt,      // signed two's complement int8 codes as stored (W8A8 int8), one byte each
  kFp8E4M3,  // float8_e4m3fn bytes (MXFP8, FP8 block)
  kFp4E2M1,  // float4_e2m1 codes, one per byte in the low 4 bits: S EE M (NVFP4, MXFP4); the
             // high nibble is 0. Values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; 8 is -0.
};

// How a projection's second-level (per-tensor) scale enters its values. The canonical form keeps
// the float the checkpoint stores, bit for bit, with its convention (never its reciprocal in
// place of it), so that pack(unpack(x)) writes x again; what a kernel wants (vLLM's Marlin: the
// decode multiplier, 1/g for compressed-tensors) is the target layout's business.
enum class GlobalScale : uint8_t {
  kNone,
  kDecodeMultiplier,  // ModelOpt NVFP4 weight_scale_2: x = code * (s * g)
  kEncodeDivisor,     // compressed-tensors NVFP4 weight_global_scale: x = code * (s / g)
};

// Normalised quantization method of a checkpoint (model/hf_config parses config.json into it).
// Names, schemes and codecs per method are rows in formats/registry.cpp.
enum class QuantMethod : uint8_t {
  kNone,             // bf16 / fp16 / fp32 weights
  kGptq,             // AutoGPTQ / GPTQModel, qweight [K/pf, N]
  kAwq,              // AutoAWQ GEMM, qweight [K, N/8]
  kCtPackQuantized,  // compressed-tensors pack-quantized W4A16/W8A16, weight_packed [N, K/pf]
  kCtIntQuantized,   // compressed-tensors int-quantized W8A8 int8, weight I8 [N, K]
  kCtMxfp8,          // compressed-tensors mxfp8-quantized
  kModeloptMxfp8,    // ModelOpt MXFP8, weight F8_E4M3 [N, K], weight_scale U8 [N, K/32]
  kModeloptFp8,      // ModelOpt FP8 per-tensor, weight F8_E4M3 [N, K], weight_scale F32 [],
                     // input_scale F32 []
  kFp8Block,         // DeepSeek-style FP8 block, weight_scale_inv F32 [N/128, K/128]
  kCtFp8Block,       // compressed-tensors FP8_BLOCK, weight_scale BF16/F16 [N/128, K/128]
  kModeloptNvfp4,    // ModelOpt NVFP4, weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
                     // weight_scale_2 F32 (decode multiplier)
  kCtNvfp4,          // compressed-tensors nvfp4-pack-quantized, weight_packed U8 [N, K/2],
                     // weight_scale F8_E4M3 [N, K/16], weight_global_scale F32 (encode divisor)
  kCtMxfp4,          // compressed-tensors mxfp4-pack-quantized, weight_packed U8 [N, K/2],
                     // weight_scale U8 E8M0 [N, K/32]
  kGptOssMxfp4,      // gpt-oss quant_method mxfp4, fused <proj>_blocks U8 [E, N, K/32, 16],
                     // <proj>_scales U8 E8M0 [E, N, K/32], gate/up rows interleaved
  kCtFp8Channel,     // compressed-tensors float-quantized channel, weight_scale [N, 1]
  kCtFp8Tensor,      // compressed-tensors float-quantized tensor, weight_scale [1], input_scale
};
// The method's name in manifests and messages ("gptq", "compressed-tensors-pack-quantized").
const char* quant_method_name(QuantMethod m);
// Inverse of quant_method_name; nullopt for an unknown name.
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
  // W8A8 / FP8: activations quantised at run time. NVFP4: false for W4A4 checkpoints (ModelOpt
  // quant_algo NVFP4, compressed-tensors input_activations of 4-bit floats), whose static
  // activation global scale (input_scale / input_global_scale) every Linear carries; true for
  // the weight-only NVFP4A16 / W4A16_NVFP4.
  bool dynamic_input = true;
};

// How a projection's numbers are encoded, apart from its extents and bytes.
struct QuantSpec {
  CodeKind kind = CodeKind::kUint;
  int bits = 4;
  int64_t group_size = -1;    // along K; -1 = one group over all of K
  int64_t scale_block_n = 1;  // rows of N sharing one scale row (128 for FP8 block)
  bool symmetric = true;      // true: zero point is 2^(bits-1), no zeros stored
  // F16, BF16, F32, U8 / F8_E8M0 holding E8M0 codes (MX formats), or F8_E4M3 (NVFP4 blocks).
  DType scale_dtype = DType::kF16;
  // A second-level per-tensor scale on top of the group scales (NVFP4), and how it applies.
  GlobalScale global_scale = GlobalScale::kNone;
  // NVFP4 W4A4: the checkpoint's static activation global scale and its convention (ModelOpt
  // input_scale: kDecodeMultiplier, the activation's amax / (6 * 448); compressed-tensors
  // input_global_scale: kEncodeDivisor, its reciprocal); kNone for weight-only checkpoints.
  GlobalScale input_global_scale = GlobalScale::kNone;

  int64_t groups(int64_t k) const {
    return group_size <= 0 ? 1 : (k + group_size - 1) / group_size;
  }
  int64_t scale_rows(int64_t n) const { return (n + scale_block_n - 1) / scale_block_n; }
  int scale_bytes() const { return dtype_bits(scale_dtype) / 8; }
  bool operator==(const QuantSpec& o) const {
    return kind == o.kind && bits == o.bits && group_size == o.group_size &&
           scale_block_n == o.scale_block_n && symmetric == o.symmetric &&
           scale_dtype == o.scale_dtype && global_scale == o.global_scale &&
           input_global_scale == o.input_global_scale;
  }
  bool operator!=(const QuantSpec& o) const { return !(*this == o); }
};

// The canonical form: one projection of E experts, logical orientation [N, K]
// (N = output features, K = input features, like torch.nn.Linear): a QuantSpec plus the bytes.
struct QuantTensor : QuantSpec {
  int64_t experts = 1;
  int64_t n = 0, k = 0;
  std::vector<uint8_t> codes;   // [E, N, K] one code per byte
  std::vector<uint8_t> scales;  // [E, ceil(N/scale_block_n), G] raw little-endian scale_dtype
  std::vector<uint8_t> zeros;   // [E, N, G] real zero points 0..2^bits-1 (asymmetric only)
  std::vector<int32_t> g_idx;   // [E, K] group of each input row, or empty
  // With global_scale != kNone: [E, global_shards] float32 as stored. Shard j of expert e scales
  // rows [j * N / global_shards, (j + 1) * N / global_shards): one Linear has one (1), a gated w13
  // stacked [gate; up] keeps the gate's and the up's (2), whether or not they agree. Empty
  // otherwise.
  std::vector<float> global_scales;
  int64_t global_shards = 1;
  // With input_global_scale != kNone: the activation global scales [E, global_shards] float32 as
  // stored, sharded like global_scales (a gated w13 keeps the gate's and the up's: vLLM's
  // w13_input_scale [E, 2]). They do not enter the weights' values (dequantize_expert); a layout
  // whose kernel quantises activations with them (trtllm-nvfp4) writes them. Empty otherwise.
  std::vector<float> input_scales;

  QuantTensor() = default;
  // Zero-filled codes, scales, (asymmetric) zeros, (global_scale) one zero global scale and
  // (input_global_scale) one zero input scale per expert of the right sizes; g_idx empty.
  QuantTensor(const QuantSpec& spec, int64_t experts, int64_t n, int64_t k);

  const QuantSpec& spec() const { return *this; }
  int64_t groups() const { return QuantSpec::groups(k); }
  int64_t scale_rows() const { return QuantSpec::scale_rows(n); }
  // Checks vector sizes against the shape; throws kInternal naming `what` on mismatch.
  void check_consistent(const std::string& what) const;
};

// Reference dequantisation of one expert into float [N, K] (row-major). The scalar definition
// every backend's numerical check is compared against: x = value(code) * s, with s the group
// scale as float32 (zero point first for kUint), and with a global scale g the float32 factor
// s * g (kDecodeMultiplier) or s / g (kEncodeDivisor) in place of s -- the order of operations
// ModelOpt's and compressed-tensors' own dequantisers use (docs/nvfp4.md).
std::vector<float> dequantize_expert(const QuantTensor& q, int64_t expert);

enum class MoeProj : uint8_t { kW13, kW2 };

// One MoE layer's experts in canonical form: w13 stacked [gate; up] along N (vLLM order).
struct MoeExperts {
  QuantTensor w13;  // [E, 2I, H] (gated) or [E, I, H]
  QuantTensor w2;   // [E, H, I]
  // Expert biases (gpt-oss' gate_up_proj_bias / down_proj_bias, vLLM's w13_bias / w2_bias), added
  // to each projection's output: raw little-endian values of bias_dtype, w13_bias [E, N] in w13's
  // row order ([gate; up]), w2_bias [E, H]. Both empty for experts without biases; a layout that
  // carries none refuses experts that have them (layout_refuses_biases).
  DType bias_dtype = DType::kBF16;
  std::vector<uint8_t> w13_bias, w2_bias;
  bool has_biases() const { return !w13_bias.empty() || !w2_bias.empty(); }
};

// One projection's biases for a layout that adds them (gpt-oss'): BF16, E * n values, where n is
// the projection's logical rows. Anything else is refused (kUnsupported) naming `name`: vLLM
// 0.33's gpt-oss layer holds its biases in bf16 and always adds them.
const std::vector<uint8_t>& required_bf16_biases(const MoeExperts& x, MoeProj p, int64_t n,
                                                 const std::string& name);

// What a target layout decides on without reading bytes: one projection's encoding and extents,
// and whether it carries a non-trivial act-order g_idx.
struct ProjShape {
  QuantSpec quant;
  int64_t n = 0, k = 0;
  bool act_order = false;
};
struct MoeShape {
  int64_t experts = 0;
  ProjShape w13, w2;
  int64_t hidden() const { return w13.k; }
  int64_t inter() const { return w2.k; }
};
MoeShape moe_shape_of(const MoeExperts& x);

// Target GPU architectures a layout's kernel runs on (a flag, never the GPU present).
enum class TargetArch : uint8_t { kSm80, kSm86, kSm89, kSm90, kSm100, kSm120 };
// The --target-arch flag: a name or its alias ("sm90a"); throws kUsage listing the names.
TargetArch parse_target_arch(const std::string& s);
const char* target_arch_name(TargetArch a);
// The one reader of a serialised arch (moepack.json, part.json): exactly a target_arch_name,
// nullopt otherwise.
std::optional<TargetArch> target_arch_from_name(const std::string& name);
const std::vector<TargetArch>& all_target_archs();
std::string target_arch_names(const std::string& separator = ", ");

// A checkpoint format: one Linear (one expert projection) <-> QuantTensor with experts == 1.
struct SourceCodec {
  const char* name;  // "gptq", "awq", "ct-pack", ...
  QuantMethod method;
  // The kernel scheme its experts are ("wna16", "w8a8-int8", "mxfp8", "fp8-block", "nvfp4",
  // "mxfp4"): target
  // layouts declare which schemes they take.
  const char* scheme;
  // For lists of supported formats in errors and help.
  const char* description;
  // The canonical encoding of the experts a checkpoint with these params holds.
  QuantSpec (*spec_for)(const QuantParams&);
  // Logical (N, K) of one Linear from its tensors by suffix: their shapes, and the values of
  // small shape-metadata tensors where a format stores them (compressed-tensors weight_shape).
  // Throws kMissingTensor / kBadShape naming the suffix.
  std::pair<int64_t, int64_t> (*logical_shape)(const QuantParams&,
                                               const std::map<std::string, TensorView>& by_suffix);
  // Optional (nullptr): params corrected from the first Linear's tensors (e.g. GPTQ v1/v2 zero
  // convention detected from stored qzeros).
  QuantParams (*refine)(const QuantParams&,
                        const std::map<std::string, TensorView>& by_suffix) = nullptr;
  // Optional (nullptr: never): whether one Linear's tensors carry a non-trivial act-order g_idx
  // (not k / group_size). Codecs drop trivial ones, so the layout's output shapes depend on it.
  bool (*has_act_order)(const QuantParams&,
                        const std::map<std::string, TensorView>& by_suffix) = nullptr;
  // Optional (nullptr): why no target can serve checkpoints with these params at all.
  std::vector<std::string> (*refusals)(const QuantParams&) = nullptr;
  // Tensor suffixes one Linear has on disk, e.g. {"qweight","qzeros","scales","g_idx"}; the
  // optional ones are listed by `optional_suffixes`.
  std::vector<std::string> (*required_suffixes)(const QuantParams&);
  std::vector<std::string> (*optional_suffixes)(const QuantParams&);
  // n, k: the logical shape of the Linear. Throws kBadShape / kBadDtype naming the suffix.
  QuantTensor (*unpack)(const QuantParams&, const TensorMap& by_suffix, int64_t n, int64_t k);
  // Exact inverse of unpack for the tensors unpack reads.
  TensorMap (*pack)(const QuantParams&, const QuantTensor&);
  // Parameter combinations the codec reads and writes: the registry suite's sample space.
  std::vector<QuantParams> (*param_space)();
  // The QuantParams fields that mean something for the format, by their key in moepack.json's
  // quant params (pipeline/manifest.cpp): `inspect` shows these beside method, bits and dtype (an
  // empty string value is left out); moepack.json keeps every field.
  std::vector<const char*> params_shown = {};
  // The suffix of the per-Linear global scale (QuantSpec::global_scale != kNone), or nullptr.
  // load_moe_experts names it when gate's and up's disagree (model/checkpoint.cpp).
  const char* global_scale_suffix = nullptr;
};

// The vLLM a conversion is for: each target fixes parameter names, shapes and which inputs
// vLLM's MoE methods take (docs/vllm_targets.md names the commit or release each one follows).
enum class VllmTarget : uint8_t {
  kV0_33,     // vLLM 0.33.0, the newest release: no MoE act-order, routed_experts names, padding
  kV2026_05,  // vLLM@9aaf83ef (2026-05), the commit ../shared/spec describes
};
struct VllmTargetRow;

// One kernel backend in a vLLM's MoE backend order, as that vLLM names it, and the moepack
// layout that writes what it reads. The order is data (VllmTargetRow::moe_backend_orders): the
// oracle (pipeline/oracle.cpp) takes the first backend with a moepack layout row that accepts
// the layer, and says what vLLM would run, from these rows alone.
struct VllmBackend {
  const char* name;         // as vLLM's oracle enum spells it: "MARLIN", "HUMMING", "DEEPGEMM", ...
  const char* moe_backend;  // the vLLM --moe-backend value that selects it; nullptr: none
  // Where vLLM runs it (its experts' _supports_current_device and the arch gates of
  // _supports_quant_scheme for this scheme).
  std::vector<TargetArch> archs;
  // The target_layouts() row that writes what it reads, by name (`marlin` for MARLIN). A name
  // with no row yet (or a row that does not take the scheme) is a layout moepack does not write
  // yet; `auto` takes it, in this order, as soon as such a row exists. nullptr: vLLM reads the
  // checkpoint as loaded (no load-time conversion), so there is nothing to write.
  const char* layout;
  // What it reads, as a clause for messages ("Humming's own layout (...)").
  const char* reads;
  // Optional (nullptr: none beyond archs): why that vLLM would not run it for these params and
  // this layer, for a backend without a moepack layout row (a backend with one is judged by
  // the row's own reasons, which mirror vLLM's checks).
  std::vector<std::string> (*vllm_refusals)(const VllmTargetRow&, const QuantParams&,
                                            const MoeShape&) = nullptr;
};

// A vLLM's MoE backend order for one scheme on some archs.
struct VllmBackendOrder {
  const char* scheme;                 // SourceCodec::scheme
  std::vector<TargetArch> archs;      // the target archs it is the order for
  std::vector<VllmBackend> backends;  // first tried first
  const char* source;  // the vLLM file and function it mirrors, or where it is assumed
  // `auto` writes only what this vLLM would run: the first backend of the order that runs for the
  // layer, if moepack writes it, else nothing (exit 4 naming that backend and the layouts
  // `--backend` can still write). false: `auto` takes the first layout moepack writes in the
  // order, past a backend vLLM would run but moepack does not write.
  bool auto_writes_only_vllm_pick = false;
};

struct VllmTargetRow {
  VllmTarget target;
  const char* name;     // the --vllm-target value
  const char* follows;  // the vLLM release or commit it follows
  // Whether vLLM's GPTQ / compressed-tensors MoE methods take act-order (g_idx) checkpoints; with
  // it, every projection of an act-order layer has g_idx and sort-index parameters [E, K].
  bool moe_act_order;
  // The child module the experts' parameters live under, with its dot ("routed_experts."): the
  // parameter names are `...mlp.experts.<child>w13_qweight`.
  const char* param_child;
  // Marlin: an intermediate size that is not a multiple of lcm(64, group_size) is zero-padded up
  // to one (marlin_moe_padded_intermediate) instead of refused.
  bool marlin_pads_intermediate;
  // vLLM's MoE backend order per scheme and arch (one entry per (scheme, arch) pair for every
  // SourceCodec::scheme: the registry suite checks it).
  std::vector<VllmBackendOrder> moe_backend_orders;
};
const std::vector<VllmTargetRow>& vllm_target_rows();
const VllmTargetRow& vllm_target_row(VllmTarget t);
// The target's backend order for experts of `scheme` on `arch`; nullptr when it has none (a
// scheme no codec reads).
const VllmBackendOrder* vllm_backend_order(const VllmTargetRow& target, const std::string& scheme,
                                           TargetArch arch);
// The --vllm-target flag (tools/): throws kUsage listing the names.
VllmTarget parse_vllm_target(const std::string& s);
const char* vllm_target_name(VllmTarget t);
// The one reader of a serialised target (moepack.json, part.json; parse_vllm_target for the
// flag): exactly a vllm_target_name, nullopt otherwise.
std::optional<VllmTarget> vllm_target_from_name(const std::string& name);
std::string vllm_target_names(const std::string& separator = ", ");
// The default of --vllm-target: the newest release.
VllmTarget newest_vllm_target();
// The prefix of the parameters of the experts module `module_prefix` ("model.layers.3.mlp.
// experts.") for the target: with its param_child ("...experts.routed_experts." for 0.33).
std::string vllm_param_prefix(VllmTarget t, const std::string& module_prefix);
// The intermediate size vLLM's Marlin MoE pads I to for this group size: the next multiple of
// lcm(64, group_size) (group_size <= 0: of 64). marlin_moe_padded_intermediate in vLLM 0.33.
int64_t marlin_padded_intermediate(int64_t inter, int64_t group_size);

// Options a target layout takes.
struct LayoutOptions {
  DType act_dtype = DType::kBF16;  // Marlin: scales are stored in the activation dtype
  bool gated = true;               // w13 = [gate; up] (2I rows) vs a single projection (I)
  bool a8 = false;                 // Marlin 8-bit-activation tile variant
  // Marlin: reproduce vLLM's loader bug (w13 scale size_k = I) instead of the kernel layout.
  bool vllm_w13_scale_size_k = false;
  // The vLLM the parameters are for. Tests that build options field by field get the spec's
  // commit (the golden fixtures describe it); the CLI defaults to newest_vllm_target().
  VllmTarget vllm_target = VllmTarget::kV2026_05;
  // The layer's real intermediate size when the layout pads it (0: as the parameters say):
  // unpack drops the padding back to it, the layout's reader reads and writes this many channels.
  int64_t inter = 0;
  std::string prefix;  // "model.layers.3.mlp.experts." (+ the target's param_child) prepended
  // Which checkpoint format the experts came from: picks vLLM's parameter names
  // (GPTQ: w13_qweight/w13_scales/w13_g_idx, AWQ: + w13_qzeros, CT: w13_weight_packed/...).
  QuantMethod source_method = QuantMethod::kGptq;
  int threads = 1;  // worker threads; output bytes never depend on it
  // The GPU architecture the parameters are for (--target-arch; the pipeline sets it after
  // for_layer): a layout whose runtime configuration names the exact SM (Humming's LayerConfig
  // sm_version) writes it, and refuses the archs it has no layout for.
  TargetArch target_arch = TargetArch::kSm90;
  // The layer's real hidden size where the layout pads it (Humming pads H to 128 / 256; 0: as
  // the parameters say): unpack drops the padding back to it, the reader reads this many.
  int64_t hidden = 0;
  // Decisions the layout made from the codes of the WHOLE layer (TargetLayout::decide_layer),
  // by name: made once per layer at plan time over all its experts, never per chunk, so that
  // every chunk of a layer is packed alike; recorded per layer in moepack.json
  // ("layout_decisions") and given back to unpack and the reader by verify. Empty for layouts
  // without decide_layer. In a tensor- or expert-parallel output the decisions are each rank's,
  // made over that rank's share of the layer (vLLM 0.33 post-processes each rank's slice alone),
  // and recorded per rank (moepack.json layers[i].ranks[r]).
  std::map<std::string, std::string> layer_decisions;

  // The one way the pipeline makes them for a layer (plan, oracle, verify); tests may also set
  // fields one by one.
  // `param_prefix` is what the parameter names start with (vllm_param_prefix of the experts
  // module for the target). `inter` is the layer's real intermediate size.
  static LayoutOptions for_layer(QuantMethod source_method, DType act_dtype, bool gated,
                                 bool vllm_w13_scale_size_k, VllmTarget vllm_target,
                                 std::string param_prefix, int64_t inter, int threads);
};

// What one output parameter is to the kernel that reads it: which projection, and whether it
// holds the packed weight, its scales, zero points, act-order g_idx or the sort indices of that
// g_idx. Exported per parameter into moepack.json ("param_roles") so that a serving plugin finds
// its parameters by role, never by a copy of the layout's names. Each kind is its w13 role
// followed by its w2 role (param_role_of relies on the order).
enum class ParamRole : uint8_t {
  kW13Weight,
  kW2Weight,
  kW13Scale,
  kW2Scale,
  kW13Zero,
  kW2Zero,
  kW13GIdx,
  kW2GIdx,
  kW13SortIndices,
  kW2SortIndices,
  kW13GlobalScale,  // a second-level per-expert scale (vLLM's NVFP4 Marlin w13_weight_scale_2)
  kW2GlobalScale,
  kW13Bias,  // expert biases added to the projection's output (gpt-oss; vLLM's w13_bias)
  kW2Bias,
  // NVFP4 W4A4 (trtllm-nvfp4): the activations' static global scale (vLLM's w13_input_scale;
  // compressed-tensors' w13_input_global_scale, its reciprocal, as the checkpoint stores it).
  kW13InputScale,
  kW2InputScale,
  // The scale the projection's output is quantised with for the next GEMM (g1_scale_c: w13's
  // alphas over w2's input scale).
  kW13OutputScale,
  kW2OutputScale,
  // The checkpoint's own second-level scales where vLLM keeps them beside the ones its kernel
  // reads (compressed-tensors' w13_weight_global_scale [E, 2] beside w13_weight_scale_2).
  kW13SourceGlobalScale,
  kW2SourceGlobalScale,
};
// "w13_weight", "w2_scale", "w13_sort_indices", ...: the role's name in moepack.json.
const char* param_role_name(ParamRole r);
std::optional<ParamRole> parse_param_role(const std::string& name);
// The role of projection `proj`'s parameter of kind `w13_role` (a kW13* value).
ParamRole param_role_of(MoeProj proj, ParamRole w13_role);

// How vLLM 0.33 spreads one MoE layer over the GPUs that serve it (FusedMoEParallelConfig.make,
// layers/fused_moe/config.py): tensor parallel, each of `tensor` ranks holding I / tensor
// intermediate channels of every expert (RoutedExperts._load_w13 / _load_w2 narrow the checkpoint
// by tp_rank, then the rank post-processes its slice), or expert parallel, each of `expert` ranks
// holding whole experts, a subset placed by `placement` (determine_expert_map,
// layers/fused_moe/expert_map_manager.py). Never both: with expert parallelism vLLM's MoE tp_size
// is 1. The default (1, 1) is whole experts on one rank.
enum class ExpertPlacement : uint8_t {
  kLinear,      // rank r holds a contiguous run; the first E % ep ranks one expert more
  kRoundRobin,  // rank r holds experts r, r + ep, r + 2 ep, ...
};
const char* expert_placement_name(ExpertPlacement p);  // "linear", "round_robin" (vLLM's names)
std::optional<ExpertPlacement> expert_placement_from_name(const std::string& name);

struct Parallelism {
  int tensor = 1;  // MoE tensor-parallel size (vLLM's moe tp_size)
  int expert = 1;  // expert-parallel size (vLLM's moe ep_size)
  ExpertPlacement placement = ExpertPlacement::kLinear;  // expert parallel only

  bool whole() const { return tensor == 1 && expert == 1; }
  int ranks() const { return tensor > expert ? tensor : expert; }
  // The intermediate size each rank holds (vLLM's intermediate_size_per_partition).
  int64_t rank_inter(int64_t inter) const { return inter / tensor; }
  // The experts rank r holds, as global ids in local order (what vLLM's expert_map maps to
  // 0, 1, ...): all of them without expert parallelism.
  std::vector<int64_t> rank_experts(int64_t experts, int rank) const;
  int64_t local_experts(int64_t experts, int rank) const;
  // The rank holding global expert g and g's local index there (rank 0, g without EP).
  std::pair<int, int64_t> expert_owner(int64_t experts, int64_t g) const;
  // How many of rank r's experts have a global id below g (where experts [g, ...) start in the
  // rank's tensors when the layer is converted in chunks of global ids).
  int64_t local_before(int64_t experts, int rank, int64_t g) const;
  // "tensor parallel 8", "expert parallel 8 (linear)", "whole experts": for messages.
  std::string describe() const;
  bool operator==(const Parallelism& o) const {
    return tensor == o.tensor && expert == o.expert && (expert == 1 || placement == o.placement);
  }
  bool operator!=(const Parallelism& o) const { return !(*this == o); }
};

// How a layout's experts split over tensor-parallel ranks: what one rank's RoutedExperts holds
// after vLLM 0.33's loader narrowed the checkpoint by tp_rank and before it post-processes that
// slice (then the layout's own pack, with the rank's options and shape, is that post-processing).
// A row states it (TargetLayout::tensor_parallel); a row without one cannot be written for a
// tensor-parallel size above 1, and the registry suite fails for it. Every layout so far takes
// the canonical split (formats/parallel.h): gate and up rows [r I/tp, (r+1) I/tp) each, w2's K
// columns and scale groups the same (a single w2 group, channelwise, stays whole on every rank).
struct TensorParallelSplit {
  // Why experts of this whole-layer shape cannot be split over `tp` ranks for this layout (what
  // vLLM 0.33 refuses, or would load wrong without an error), one sentence with the numbers each;
  // the layout's unsupported_reasons on one rank's shape are added by the caller
  // (parallel_reasons).
  std::vector<std::string> (*reasons)(const LayoutOptions& whole, const MoeShape& whole_shape,
                                      int tp) = nullptr;
  // Rank `rank`'s experts, canonical, of the whole layer's (any chunk of its experts).
  MoeExperts (*split)(const MoeExperts& whole, bool gated, int tp, int rank) = nullptr;
  // A row not written for tensor or expert parallelism at all says why here (reasons and split
  // then stay null): parallel_reasons refuses with it.
  const char* unsupported = nullptr;
};

// One output parameter as a layout writes it.
struct ParamSpec {
  std::string name;  // with LayoutOptions::prefix
  DType dtype = DType::kU8;
  Shape shape;
  ParamRole role = ParamRole::kW13Weight;
  // What pack must emit: name, dtype and shape (a tensor carries no role).
  bool operator==(const ParamSpec& o) const {
    return name == o.name && dtype == o.dtype && shape == o.shape;
  }
};

// Where the bytes of a named parameter live for a reader (host or device pointer); host_tensor is
// the tensor under that name in the parameters the reader is built from.
using ParamLocator =
    std::function<const void*(const std::string& param_name, const Tensor& host_tensor)>;

// How the moepack-vllm plugin (integrations/vllm) serves a layout in one vLLM target; exported
// into moepack.json's "serving" for the plugin to follow (docs/vllm.md "Serving paths").
enum class ServingPath : uint8_t {
  kNone,  // not served: `reason` says why
  // (a) vLLM's own MoE method for the source format (built from the source's quantization config)
  // runs its process_weights_after_loading under weights_already_processed(): it transforms no
  // tensor and only builds its kernel. Its oracle must pick `vllm_backend`.
  kVllmMethod,
  // (b) vLLM's method has no such path: the plugin builds vLLM's own modular kernel for the
  // layout with its builder `kernel_builder`, finding the parameters by role.
  kKernelBuilder,
};
const char* serving_path_name(ServingPath p);  // "none", "vllm-method", "kernel-builder"
std::optional<ServingPath> parse_serving_path(const std::string& name);

struct VllmServing {
  VllmTarget target;
  // The source methods (the experts' QuantParams::method) this entry covers; empty: every one.
  std::vector<QuantMethod> sources = {};
  ServingPath path = ServingPath::kNone;
  // (a) the class of vLLM's MoE method the source's quantization config gives ("Fp8MoEMethod"),
  // and the backend its oracle must pick, as "EnumClass.MEMBER" of vLLM's backend enum
  // ("Fp8MoeBackend.FLASHINFER_TRTLLM").
  const char* vllm_method = nullptr;
  const char* vllm_backend = nullptr;
  // (b) the plugin's kernel builder ("wna16-marlin").
  const char* kernel_builder = nullptr;
  // kNone: why not, one sentence.
  const char* reason = nullptr;
};

// A whole layer's experts for TargetLayout::decide_layer: `load(first, end)` returns experts
// [first, end) of the `experts` in canonical form (as pack receives them), at most `max_per_load`
// at once (the plan's chunk rule bounds the memory).
struct LayerExperts {
  int64_t experts = 0;
  int64_t max_per_load = 1;
  std::function<MoeExperts(int64_t first, int64_t end)> load;
};

// A backend layout: one MoE layer's stacked experts <-> the kernel's parameters, named and
// shaped like vLLM's FusedMoE parameters after process_weights_after_loading.
struct TargetLayout {
  const char* name;    // the --backend name: `marlin`, `triton-wna16`, `trtllm-mxfp8`, ...
  const char* kernel;  // the serving kernel that reads it, for messages and docs
  int layout_version;
  std::vector<std::string> schemes;  // SourceCodec::scheme values it takes
  std::vector<TargetArch> archs;     // where its serving kernel runs
  // Every reason these options and shapes cannot be written in this layout, one sentence with
  // the numbers each; empty = supported. Decided from shapes alone (no bytes, no packing).
  std::vector<std::string> (*unsupported_reasons)(const LayoutOptions&, const MoeShape&);
  // Exactly the parameters pack emits for experts of this shape: names, dtypes, shapes.
  std::vector<ParamSpec> (*param_specs)(const LayoutOptions&, const MoeShape&);
  std::vector<Tensor> (*pack)(const LayoutOptions&, const MoeExperts&);
  // Recovers exactly what pack consumed (scales in the layout's dtype).
  MoeExperts (*unpack)(const LayoutOptions&, const TensorMap& params_by_name);
  // The kernel's view (formats/layout/moe_reader.h): the reader kind make_reader fills, what the
  // serving kernel does to the activations entering each GEMM, and the builder of one
  // projection's reader over a chunk of experts (every expert params_by_name holds: a whole
  // layer or a slice along the leading expert dimension). make_reader validates the parameters
  // as unpack does (same error codes, naming the parameter) and reads them the way the kernel
  // does (tiles, shuffled rows, swizzled scales, permuted activations for act-order) -- never by
  // calling unpack. reader_expert_matmul (formats/moe_reader.h) multiplies through it on the CPU,
  // kernels/ on the GPU.
  reader::Kind reader_kind;
  reader::ActQuant (*act_quant)(const LayoutOptions&);
  reader::ProjReader (*make_reader)(const LayoutOptions&, const TensorMap& params_by_name,
                                    MoeProj proj, const ParamLocator& locate);
  // Human-readable ways this layout deliberately differs from what vLLM's loader would write
  // for experts of this shape (recorded per layer in moepack.json); empty when identical.
  std::vector<std::string> (*deviations_from_vllm)(const LayoutOptions&, const MoeShape&);
  // Optional (nullptr): deviations an option causes whatever the layer (recorded once).
  std::vector<std::string> (*option_deviations)(const LayoutOptions&) = nullptr;
  // Optional (nullptr: never pads): the intermediate size the parameters carry for a layer of
  // this shape (> shape.inter() where the target pads it, as vLLM 0.33's Marlin does).
  int64_t (*padded_inter)(const LayoutOptions&, const MoeShape&) = nullptr;
  // How the moepack-vllm plugin serves this layout, per vLLM target and source method (the first
  // entry that matches wins; none: not served). find_vllm_serving reads it.
  std::vector<VllmServing> vllm_serving = {};
  // Optional (nullptr: none): decisions that depend on the codes of the whole layer (all its
  // experts), which no chunk can make alone -- Humming recodes a projection none of whose codes
  // is 0. make_plan calls it once per layer (once per rank of a parallel output, on the rank's
  // share: its tensor-parallel split or its experts); the result is LayoutOptions::layer_decisions
  // for every chunk's pack, recorded in moepack.json and given back to unpack and make_reader.
  std::map<std::string, std::string> (*decide_layer)(const LayoutOptions&, const MoeShape&,
                                                     const LayerExperts&) = nullptr;
  // Optional (nullptr: none): what the serving runtime needs beside the parameters (Humming: its
  // version, the SM and each sublayer's LayerConfig), as ordered (key, text) pairs computed from
  // the options (decisions included) and the shape. Recorded per layer in moepack.json
  // ("layout_config"; per rank of a parallel output, from the rank's options, decisions and
  // shape: Humming's num_experts, shape_n and padding are the rank's); verify recomputes it and
  // refuses an artifact whose record differs, naming the key (and the field, where both texts are
  // JSON objects).
  std::vector<std::pair<std::string, std::string>> (*layer_config)(const LayoutOptions&,
                                                                   const MoeShape&) = nullptr;
  // Optional (nullptr: none): the shapes the serving kernel fails on although the target vLLM's
  // own oracle picks its backend for them (it checks no such shape): each reason also in
  // unsupported_reasons. The oracle reads them as vLLM picking the backend and failing there, and
  // `auto` then writes the next layout of vLLM's order that takes the layer (pipeline/oracle.cpp).
  std::vector<std::string> (*kernel_failures)(const LayoutOptions&, const MoeShape&) = nullptr;
  // How vLLM 0.33 splits the layer's experts over tensor-parallel ranks (see
  // TensorParallelSplit): required for --tensor-parallel-size above 1; the registry suite fails
  // for a row without it.
  TensorParallelSplit tensor_parallel = {};
  // Optional (nullptr: vLLM serves the source's values): what vLLM's MoE method makes of the
  // experts before the layout's own transform, where it changes values -- per-tensor FP8's w13
  // requantised to one scale per expert (process_fp8_weight_tensor_strategy_moe). pack applies
  // it; unpack gives it back; verify's reference and exact round trip compare against it.
  MoeExperts (*vllm_loaded)(const LayoutOptions&, const MoeExperts&) = nullptr;
};

// `convert --quantize FORMAT --mx-recipe RECIPE`: unquantized experts quantised by moepack.
struct QuantizeRecipe {
  const char* format;  // --quantize value: "mxfp8"
  const char* recipe;  // --mx-recipe value: "flashinfer", "modelopt"
  // The params of the quantised experts (a method some target layout takes).
  QuantParams (*target_params)(DType model_dtype);
  // w: float [experts, n, k] -> canonical codes and scales.
  QuantTensor (*quantize)(const float* w, int64_t experts, int64_t n, int64_t k);
};

// The explicit registry tables (formats/registry.cpp).
const std::vector<SourceCodec>& source_codecs();
const std::vector<TargetLayout>& target_layouts();
const std::vector<QuantizeRecipe>& quantize_recipes();
// Throws kUsage listing the rows when (format, recipe) is not one.
const QuantizeRecipe& find_quantize_recipe(const std::string& format, const std::string& recipe);
const SourceCodec* find_source_codec(QuantMethod method);
const TargetLayout* find_target_layout(const std::string& name);
// How the plugin serves `layout` for experts of method `source` in `target`: the row's first
// matching entry, or a kNone entry whose reason says that the row has none.
VllmServing find_vllm_serving(const TargetLayout& layout, VllmTarget target, QuantMethod source);
// The scheme label of a method: its codec's, or a label for methods no codec reads
// ("unquantized", "fp8-per-tensor").
std::string scheme_of(QuantMethod method);
// The shape of a layer's experts as a checkpoint with these params holds them (no bytes): what
// the oracle and the planner decide on. act_order_w13 / act_order_w2: whether that projection
// carries act-order g_idx (-1: take q.act_order); integer codes with a real group size only
// (act-order is a property of the layer: a projection whose K holds one group still has it). Throws
// kUnsupported when no codec reads q.method.
MoeShape moe_shape_for(const QuantParams& q, int64_t experts, int64_t hidden, int64_t inter,
                       bool gated, int act_order_w13 = -1, int act_order_w2 = -1);
// The layout names in registry order (`marlin, triton-wna16, ...`), and the supported source
// formats as prose.
std::string target_layout_names(const std::string& separator = ", ");
std::string supported_formats_text();

// Generic helpers shared by codecs.
// y[i, n] = x[i, :] . w_row for i < m (x [m, k] and y [m, ldy] row-major): the output column of
// one decoded weight row, as reader_expert_matmul produces it (float accumulate in column order).
void dot_weight_row_into_column(const float* x, int64_t m, int64_t k, const float* w_row, float* y,
                                int64_t ldy, int64_t n);
// Whether w13 and w2 form one MoE layer (same experts, w13 K == w2 N, w13 N == (2 if gated) x
// w2 K); empty when they do. A mismatch is a caller bug or a malformed layer (kBadShape), not a
// layout limitation.
std::vector<std::string> moe_shape_problems(const LayoutOptions& opts, const MoeShape& x);
// The same for experts in hand, plus w13 and w2 disagreeing in their expert counts.
std::vector<std::string> moe_shape_problems(const LayoutOptions& opts, const MoeExperts& x);
// Throws kBadShape (naming opts.prefix + "w13_weight") listing moe_shape_problems, then checks
// each QuantTensor's buffer sizes.
void check_moe_structure(const LayoutOptions& opts, const MoeExperts& x);
// Looks up `key` in a codec's tensor map; kMissingTensor naming the key ("<what> lacks 'key'").
const Tensor& require_tensor(const TensorMap& m, const std::string& key,
                             const std::string& what = "");
// The tensor under `key`, or nullptr (optional tensors).
const Tensor* find_tensor(const TensorMap& m, const std::string& key);
// The 2-D shape of one Linear's tensor by suffix, for SourceCodec::logical_shape (kMissingTensor
// / kBadShape naming the suffix otherwise).
const Shape& linear_tensor_shape(const std::map<std::string, TensorView>& by_suffix,
                                 const std::string& suffix);
// One scale element as float: F16, BF16, F32, F8_E4M3, or U8 / F8_E8M0 holding an E8M0 code.
float scale_to_float(const uint8_t* p, DType d);
// One scale element converted to the dtype a layout serves it in (F16, BF16, F32; E8M0 codes
// stay codes): through float32, round to nearest even, as torch's copy_ into the parameter does.
// The one overflow rule for every layout: a finite scale that becomes inf is refused
// (kBadValue naming `what`), never written.
void convert_scale(const uint8_t* p, DType from, DType to, uint8_t* out, const std::string& what);
std::vector<uint8_t> convert_scales(const std::vector<uint8_t>& src, DType from, DType to,
                                    const std::string& what);
std::vector<int32_t> invert_permutation(const std::vector<int32_t>& perm);
std::vector<int32_t> stable_argsort(const int32_t* values, int64_t count);

}  // namespace moepack
