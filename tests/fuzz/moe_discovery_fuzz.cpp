// libFuzzer target: MoE discovery (and what convert does next) on synthetic checkpoints.
//
// The input is decoded into a config and a list of tensors instead of raw header bytes, so that
// mutations move between meaningful names ("model.layers.0.mlp.experts.01.w1.qweight"):
//   [0] quantization config row   [1] num_experts (0: absent)   [2] num_experts_per_tok (0: absent)
//   [3] hidden_size / 8 (0: absent)   [4] moe_intermediate_size / 8 (0: absent)
//   then records: name tokens (bytes, 0xFF ends the name), dtype, rank, dims, fill, shard.
// Each tensor holds at most 64 KiB. The checkpoint is opened from memory (Checkpoint::from_shards);
// discovery must throw moepack::Error or partition the tensors (every tensor copied through or
// the source of exactly one MoE layer: none silently dropped). Then every expert is read through
// the source codec and, where a backend takes the layer on sm100, planned and packed as convert
// would: again moepack::Error or success, never another exception, a crash or UB.
//
// Cost per execution (bench/fuzz.sh runs it to 10 M): the quantization configs are built once;
// each shard's bytes are made in place in its image (no zero-filled Tensor filled, then copied);
// the byte generator is not coverage-instrumented. The same checkpoint as before comes out of the
// same input, so a saved corpus means what it meant, and every check is unchanged. What remains
// is the code under test: the safetensors header written and validated on open, discovery,
// hf_config_from_json, the codecs' reads and the plan (and libFuzzer's own bookkeeping).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "pipeline/execute.h"
#include "pipeline/plan.h"

namespace {
using nlohmann::json;
using namespace moepack;

const char* const kTokens[] = {
    "model.",
    "layers.",
    "0",
    "1",
    "2",
    "3",
    "01",
    "1a",
    "99999999999999999999",
    ".",
    "mlp",
    "block_sparse_moe",
    ".experts.",
    "experts",
    "gate_proj",
    "up_proj",
    "down_proj",
    "w1",
    "w2",
    "w3",
    "gate_up_proj",
    "_blocks",
    "_scales",
    "_bias",
    "weight",
    "qweight",
    "qzeros",
    "scales",
    "g_idx",
    "weight_packed",
    "weight_scale",
    "weight_zero_point",
    "weight_shape",
    "weight_g_idx",
    "weight_scale_inv",
    "gate",
    "router",
    "bias",
    "e_score_correction_bias",
    "shared_experts",
    "input_scale",
    "w13_qweight",
    "-1",
    "+1",
    " ",
    "model.layers.0.mlp.experts.",
    "model.layers.1.mlp.experts.",
    ".weight",
    ".qweight",
    ".scales",
};
constexpr size_t kNumTokens = sizeof(kTokens) / sizeof(kTokens[0]);

const DType kDtypes[] = {DType::kI32, DType::kF16,     DType::kBF16, DType::kF32,
                         DType::kI64, DType::kU8,      DType::kI8,   DType::kF8_E4M3,
                         DType::kU32, DType::kF8_E8M0, DType::kI16,  DType::kBOOL};

json quant_config(uint8_t row) {
  switch (row % 9) {
    case 1:
      return {{"quant_method", "gptq"},
              {"bits", 4},
              {"group_size", 32},
              {"desc_act", false},
              {"sym", true}};
    case 2:
      return {{"quant_method", "gptq"},
              {"bits", 4},
              {"group_size", 32},
              {"desc_act", true},
              {"sym", false}};
    case 3:
      return {{"quant_method", "gptq"}, {"bits", 8}, {"group_size", -1}, {"sym", true}};
    case 4:
      return {{"quant_method", "awq"},
              {"bits", 4},
              {"group_size", 32},
              {"zero_point", true},
              {"version", "gemm"}};
    case 5:
      return {{"quant_method", "compressed-tensors"},
              {"format", "pack-quantized"},
              {"config_groups",
               {{"group_0",
                 {{"targets", {"Linear"}},
                  {"weights",
                   {{"num_bits", 4},
                    {"type", "int"},
                    {"strategy", "group"},
                    {"group_size", 32},
                    {"symmetric", true}}}}}}}};
    case 6:
      return {{"quant_method", "compressed-tensors"},
              {"format", "int-quantized"},
              {"config_groups",
               {{"group_0",
                 {{"targets", {"Linear"}},
                  {"weights", {{"num_bits", 8}, {"type", "int"}, {"strategy", "channel"}}},
                  {"input_activations", {{"num_bits", 8}, {"dynamic", true}}}}}}}};
    case 7:
      return {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {32, 32}}};
    case 8:
      return {{"quant_method", "modelopt"}, {"quant_algo", "MXFP8"}};
    default:
      return nullptr;
  }
}

struct Reader {
  const uint8_t* p;
  size_t n, i = 0;
  bool more() const { return i < n; }
  uint8_t next() { return i < n ? p[i++] : 0; }
};

// The harness's own byte generator is left out of coverage instrumentation (clang's
// no_sanitize("coverage")): a per-byte loop whose edges and compares say nothing about the code
// under test cost more than the code under test. The bytes are the same as before.
#if defined(__clang__)
#define MOEPACK_FUZZ_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define MOEPACK_FUZZ_NO_COVERAGE
#endif

MOEPACK_FUZZ_NO_COVERAGE void fill(uint8_t* d, size_t n, uint8_t mode, uint32_t seed) {
  switch (mode % 4) {
    case 0:
      std::memset(d, 0, n);  // zeros
      return;
    case 1: {  // xorshift bytes
      uint32_t x = seed | 1u;
      for (size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        d[i] = static_cast<uint8_t>(x);
      }
      return;
    }
    case 2:  // int32 i / 32: a trivial g_idx for group 32
      std::memset(d, 0, n);
      for (size_t i = 0; i + 4 <= n; i += 4) {
        const int32_t v = static_cast<int32_t>(i / 4 / 32);
        std::memcpy(d + i, &v, 4);
      }
      return;
    default:  // small positive halves (1.0 in f16 / bf16 bit patterns alternately)
      std::memset(d, 0, n);
      for (size_t i = 0; i + 2 <= n; i += 2) {
        const uint16_t v = (i / 2) % 2 ? 0x3C00 : 0x3F80;
        std::memcpy(d + i, &v, 2);
      }
      return;
  }
}

// The quantization configs of quant_config(), made once.
const json& quant_config_row(uint8_t row) {
  static const std::vector<json> rows = [] {
    std::vector<json> out;
    for (uint8_t r = 0; r < 9; ++r) out.push_back(quant_config(r));
    return out;
  }();
  return rows[row % 9];
}

// One decoded tensor: its entry in the shard's header and how its bytes are made.
struct Record {
  SafetensorsEntry entry;
  uint64_t bytes;
  uint8_t mode;
  uint32_t seed;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  Reader r{data, size};
  json cfg = {{"model_type", "qwen3_moe"}, {"torch_dtype", "bfloat16"}};
  const json& qc = quant_config_row(r.next());
  if (!qc.is_null()) cfg["quantization_config"] = qc;
  if (const uint8_t e = r.next()) cfg["num_experts"] = e % 16;
  if (const uint8_t k = r.next()) cfg["num_experts_per_tok"] = k == 255 ? int64_t{1} << 31 : k % 8;
  if (const uint8_t h = r.next()) cfg["hidden_size"] = 8 * (h % 32);
  if (const uint8_t in = r.next()) cfg["moe_intermediate_size"] = 8 * (in % 32);

  std::vector<std::vector<Record>> shards(2);
  uint64_t total = 0;
  while (r.more() && shards[0].size() + shards[1].size() < 64) {
    std::string name;
    for (int t = 0; t < 12 && r.more(); ++t) {
      const uint8_t b = r.next();
      if (b == 0xFF) break;
      name += kTokens[b % kNumTokens];
    }
    const DType dt = kDtypes[r.next() % (sizeof(kDtypes) / sizeof(kDtypes[0]))];
    const int rank = r.next() % 4;
    Shape shape;
    for (int d = 0; d < rank; ++d) shape.push_back(r.next());
    const uint8_t mode = r.next(), shard = r.next();
    const auto bytes = dtype_bytes(dt, static_cast<uint64_t>(numel(shape)));
    if (!bytes || *bytes > 65536 || total + *bytes > (1u << 20)) continue;
    total += *bytes;
    shards[shard % 2].push_back({{std::move(name), dt, std::move(shape), 0, 0},
                                 *bytes,
                                 mode,
                                 static_cast<uint32_t>(r.i * 2654435761u)});
  }
  try {
    // Each shard's image: the header, then the tensors back to back in their order, each made
    // in place (no Tensor to fill and copy).
    std::vector<std::pair<std::string, SafetensorsFile>> files;
    for (size_t s = 0; s < shards.size(); ++s) {
      if (shards[s].empty()) continue;
      std::vector<SafetensorsEntry> layout, placed;
      for (const Record& t : shards[s]) layout.push_back(t.entry);
      std::vector<uint8_t> image = build_safetensors_header(layout, {}, &placed);
      size_t at = image.size();
      uint64_t data_bytes = 0;
      for (const Record& t : shards[s]) data_bytes += t.bytes;
      image.resize(at + data_bytes);
      for (const Record& t : shards[s]) {
        fill(image.data() + at, t.bytes, t.mode, t.seed);
        at += t.bytes;
      }
      const std::string name = "model-0000" + std::to_string(s + 1) + ".safetensors";
      files.emplace_back(name, SafetensorsFile::from_bytes(std::move(image), name));
    }
    const HfConfig config = hf_config_from_json(cfg, "config.json", "");
    const auto ckpt = Checkpoint::from_shards("fuzz", config, std::move(files));

    // No tensor silently dropped: copied through, or the source of exactly one layer.
    std::map<std::string, int> seen;
    for (const auto& n : ckpt->other_tensors()) ++seen[n];
    for (const auto& L : ckpt->moe_layers())
      for (const auto& n : L.source_tensors) ++seen[n];
    if (seen.size() != ckpt->tensor_names().size()) __builtin_trap();
    for (const auto& [n, count] : seen)
      if (count != 1 || !ckpt->has_tensor(n)) __builtin_trap();
    for (const auto& L : ckpt->moe_layers())
      if (L.num_experts <= 0 || L.hidden <= 0 || L.inter <= 0) __builtin_trap();

    if (ckpt->moe_layers().empty()) return 0;
    validate_source(*ckpt, 1, 1u << 20);
    if (ckpt->quant().method == QuantMethod::kNone) return 0;
    ConvertOptions opts;
    opts.src = "fuzz";
    opts.target_arch = TargetArch::kSm100;
    opts.threads = 1;
    const Plan plan = make_plan(*ckpt, opts);
    validate_plan(plan, *ckpt);
  } catch (const Error&) {
  }
  return 0;
}
