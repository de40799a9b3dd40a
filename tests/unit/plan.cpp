// make_plan / execute_plan on synthesised checkpoints: the planned tensors (vLLM names, output
// order, copy-through set), that the plan is exactly what gets written (bytes, shards, index),
// determinism across thread counts, and the atomic-output rules (existing output, output inside
// the input, a conversion failing half-way leaves nothing behind).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/sha256.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/hf_config.h"
#include "pipeline/execute.h"
#include "synth/synth.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::expect_error;

namespace fs = std::filesystem;
using nlohmann::json;
using test::TempDir;

constexpr int64_t kH = 256, kI = 128, kE = 4;

SynthOptions synth_options(const std::string& format) {
  SynthOptions o;
  o.format = format;
  o.family = "qwen3";
  o.layers = 3;  // layer 0 dense (mlp_only_layers), layers 1 and 2 MoE
  o.experts = kE;
  o.hidden = kH;
  o.inter = kI;
  o.vocab = 64;
  o.seed = 11;
  o.threads = 1;
  return o;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every regular file under `dir`, relative path -> contents.
std::map<std::string, std::string> read_tree(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = slurp(e.path().string());
  return out;
}

// Names in `parent` that look like a temp or backup sibling left by AtomicOutputDir.
std::vector<std::string> leftovers(const std::string& parent) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string n = e.path().filename().string();
    if (n.find("moepack-tmp") != std::string::npos || n.find("moepack-old") != std::string::npos)
      out.push_back(n);
  }
  return out;
}

struct Output {
  std::map<std::string, SafetensorsEntry> entries;  // tensor -> entry (offsets within its shard)
  std::map<std::string, std::string> shard_of;      // tensor -> shard file name
  std::vector<std::string> order;                   // shard order, then offset
  uint64_t tensor_bytes = 0;
};

Output read_output(const std::string& dir, const std::vector<std::string>& shard_names) {
  Output o;
  for (const auto& s : shard_names) {
    const SafetensorsFile f = SafetensorsFile::open(dir + "/" + s);
    EXPECT_EQ(f.metadata().count("format") ? f.metadata().at("format") : "", "pt") << s;
    for (const auto& e : f.entries()) {
      EXPECT_TRUE(o.entries.emplace(e.name, e).second) << "duplicate " << e.name;
      o.shard_of[e.name] = s;
      o.order.push_back(e.name);
      o.tensor_bytes += e.end - e.begin;
    }
  }
  return o;
}

ConvertOptions convert_options(const std::string& src, const std::string& dst) {
  ConvertOptions c;
  c.src = src;
  c.dst = dst;
  c.backend = "auto";
  c.target_arch = TargetArch::kSm90;
  c.threads = 1;
  return c;
}

class PlanGptq : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = tmp_ / "src";
    synth_checkpoint(src_, synth_options("gptq"));
    ckpt_ = Checkpoint::open(src_);
  }
  TempDir tmp_;
  std::string src_;
  std::unique_ptr<Checkpoint> ckpt_;
};

TEST_F(PlanGptq, MarlinTensorsNamesOrderAndCopySet) {
  ASSERT_EQ(ckpt_->moe_layers().size(), 2u);
  ConvertOptions c = convert_options(src_, tmp_ / "out");
  c.backend = "marlin";  // on sm90 for vLLM 0.33 `auto` writes Humming (tests/unit/humming_*)
  const Plan plan = make_plan(*ckpt_, c);
  EXPECT_EQ(plan.backend, "marlin");
  EXPECT_EQ(plan.layout_name, "marlin");
  EXPECT_EQ(plan.source_format, quant_method_name(QuantMethod::kGptq));
  ASSERT_EQ(plan.layers.size(), 2u);

  // Converted parameters carry vLLM's FusedMoE names and shapes (spec/wna16_marlin.md §7:
  // w13_qweight [E, H/16, 2I*16/pf], w2_qweight [E, I/16, H*16/pf], w13_scales [E, H/g, 2I],
  // w2_scales [E, I/g, H], scales in the activation dtype).
  std::map<std::string, const PlannedTensor*> by_name;
  for (const auto& t : plan.tensors) by_name[t.name] = &t;
  for (const auto& L : ckpt_->moe_layers()) {
    const std::string P = "model.layers." + std::to_string(L.layer) + ".mlp.experts.";
    EXPECT_EQ(L.param_prefix, P);
    // vLLM 0.33 (the default target) keeps them under the runner's routed_experts child.
    const auto need = [&](const std::string& n) -> const PlannedTensor& {
      auto it = by_name.find(P + "routed_experts." + n);
      if (it == by_name.end())
        throw std::runtime_error("missing planned tensor " + P + "routed_experts." + n);
      return *it->second;
    };
    const PlannedTensor& w13 = need("w13_qweight");
    EXPECT_EQ(w13.dtype, DType::kI32);
    EXPECT_EQ(w13.shape, (Shape{kE, kH / 16, 2 * kI * 16 / 8}));
    const PlannedTensor& w2 = need("w2_qweight");
    EXPECT_EQ(w2.dtype, DType::kI32);
    EXPECT_EQ(w2.shape, (Shape{kE, kI / 16, kH * 16 / 8}));
    const PlannedTensor& s13 = need("w13_scales");
    EXPECT_EQ(s13.dtype, DType::kBF16);
    EXPECT_EQ(s13.shape, (Shape{kE, kH / 128, 2 * kI}));
    const PlannedTensor& s2 = need("w2_scales");
    EXPECT_EQ(s2.dtype, DType::kBF16);
    EXPECT_EQ(s2.shape, (Shape{kE, kI / 128, kH}));
    for (const PlannedTensor* t : {&w13, &w2, &s13, &s2}) {
      EXPECT_TRUE(t->converted);
      EXPECT_EQ(t->codec, "gptq->marlin");
      EXPECT_EQ(t->bytes, *dtype_bytes(t->dtype, static_cast<uint64_t>(numel(t->shape))));
      ASSERT_FALSE(t->sources.empty());
      EXPECT_EQ(t->sources[0].rfind(P, 0), 0u) << t->sources[0];
    }
  }
  for (const auto& t : plan.tensors) {
    if (!t.converted) continue;
    const std::string local = t.name.substr(t.name.rfind('.') + 1);
    EXPECT_TRUE(local.rfind("w13_", 0) == 0 || local.rfind("w2_", 0) == 0) << t.name;
    EXPECT_NE(t.name.find(".mlp.experts.routed_experts.w"), std::string::npos) << t.name;
  }

  // Copy-through set = every non-expert tensor, in checkpoint order, unchanged in dtype/shape.
  std::vector<std::string> copies;
  for (const auto& t : plan.tensors)
    if (!t.converted) {
      copies.push_back(t.name);
      const TensorView v = ckpt_->view(t.name);
      EXPECT_EQ(t.dtype, v.dtype) << t.name;
      EXPECT_EQ(t.shape, v.shape) << t.name;
      EXPECT_EQ(t.bytes, v.nbytes) << t.name;
      EXPECT_EQ(t.codec, "copy");
    }
  EXPECT_EQ(copies, ckpt_->other_tensors());
  for (const auto& n : ckpt_->tensor_names())
    if (n.find(".mlp.experts.") != std::string::npos) {
      EXPECT_EQ(by_name.count(n), 0u) << n;
    }

  // Output order: the checkpoint's order, each layer's parameters as one block where its first
  // expert tensor was.
  std::map<std::string, int64_t> layer_of_source;
  for (size_t li = 0; li < ckpt_->moe_layers().size(); ++li)
    for (const auto& n : ckpt_->moe_layers()[li].source_tensors)
      layer_of_source[n] = static_cast<int64_t>(li);
  std::vector<std::string> expected;
  std::set<int64_t> emitted;
  for (const auto& n : ckpt_->tensor_names()) {
    auto it = layer_of_source.find(n);
    if (it == layer_of_source.end()) {
      expected.push_back(n);
    } else if (emitted.insert(it->second).second) {
      for (const auto& t : plan.tensors)
        if (t.converted && t.layer == it->second) expected.push_back(t.name);
    }
  }
  std::vector<std::string> got;
  for (const auto& t : plan.tensors) got.push_back(t.name);
  EXPECT_EQ(got, expected);

  // Dry-run renderings agree with the plan.
  const json j = plan.to_json();
  EXPECT_EQ(j["backend"], "marlin");
  EXPECT_EQ(j["tensors"].size(), plan.tensors.size());
  EXPECT_EQ(j["totals"]["tensor_bytes"].get<uint64_t>(), plan.total_bytes());
  EXPECT_NE(plan.to_text().find("marlin"), std::string::npos);
}

TEST_F(PlanGptq, ExecuteWritesExactlyThePlan) {
  const std::string dst = tmp_ / "out";
  ConvertOptions c = convert_options(src_, dst);
  c.backend = "marlin";
  const Plan plan = make_plan(*ckpt_, c);
  const ConvertResult r = execute_plan(plan, *ckpt_);
  EXPECT_EQ(r.tensors, static_cast<int64_t>(plan.tensors.size()));
  EXPECT_EQ(r.bytes_written, plan.total_bytes());
  EXPECT_TRUE(leftovers(tmp_.path).empty());

  ASSERT_EQ(plan.shards.shard_names, std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(fs::exists(dst + "/model.safetensors.index.json"));
  const Output out = read_output(dst, plan.shards.shard_names);
  EXPECT_EQ(out.tensor_bytes, plan.total_bytes());
  uint64_t sum = 0;
  for (const auto& t : plan.tensors) sum += t.bytes;
  EXPECT_EQ(sum, plan.total_bytes());
  EXPECT_EQ(fs::file_size(dst + "/model.safetensors"), plan.shards.shard_file_bytes[0]);
  std::vector<std::string> planned_order;
  for (const auto& t : plan.tensors) {
    planned_order.push_back(t.name);
    auto it = out.entries.find(t.name);
    ASSERT_NE(it, out.entries.end()) << t.name;
    EXPECT_EQ(it->second.dtype, t.dtype) << t.name;
    EXPECT_EQ(it->second.shape, t.shape) << t.name;
    EXPECT_EQ(it->second.end - it->second.begin, t.bytes) << t.name;
  }
  EXPECT_EQ(out.order, planned_order);

  // Copied tensors are byte-identical to the source; converted ones are not all zero.
  const SafetensorsFile f = SafetensorsFile::open(dst + "/model.safetensors");
  for (const auto& t : plan.tensors) {
    const TensorView o = f.view(t.name);
    if (!t.converted) {
      const TensorView s = ckpt_->view(t.name);
      ASSERT_EQ(o.nbytes, s.nbytes);
      EXPECT_EQ(std::memcmp(o.data, s.data, s.nbytes), 0) << t.name;
    } else if (t.name.find("qweight") != std::string::npos ||
               t.name.find("scales") != std::string::npos) {
      EXPECT_TRUE(std::any_of(o.data, o.data + o.nbytes, [](uint8_t b) { return b != 0; }))
          << t.name;
    }
  }

  // Side files: the other files copied, config.json with the moepack block, the manifest.
  EXPECT_EQ(slurp(dst + "/generation_config.json"), slurp(src_ + "/generation_config.json"));
  const json cfg = json::parse(slurp(dst + "/config.json"));
  EXPECT_EQ(cfg["moepack"]["backend"], "marlin");
  // Refuse by default: a quant_method no stock engine knows, the source's block nested whole,
  // and the digest of the manifest written beside it.
  const json& qc = cfg["quantization_config"];
  EXPECT_EQ(qc["quant_method"], "moepack");
  EXPECT_EQ(qc["source_quantization_config"], ckpt_->config().raw["quantization_config"]);
  EXPECT_EQ(qc["source_format"], "gptq");
  EXPECT_EQ(qc["backend"], "marlin");
  EXPECT_EQ(qc["layout"], "marlin");
  EXPECT_EQ(qc["layout_version"], 2);
  EXPECT_EQ(qc["target_arch"], "sm90");
  EXPECT_EQ(qc["vllm_target"], "0.33");
  EXPECT_EQ(qc["tensor_parallel_size"], 1);
  EXPECT_EQ(qc["manifest"], "moepack.json");
  const std::string manifest_bytes = slurp(dst + "/moepack.json");
  EXPECT_EQ(qc["manifest_sha256"], sha256_hex(manifest_bytes.data(), manifest_bytes.size()));
  // moepack reads its own output's config back through the nested block, and refuses to
  // convert it again.
  const HfConfig back = load_hf_config(dst);
  EXPECT_EQ(back.quant_raw, ckpt_->config().raw["quantization_config"]);
  EXPECT_EQ(back.quant.method, QuantMethod::kGptq);
  EXPECT_FALSE(back.moepack_quant.is_null());
  const Error again =
      expect_error([&] { make_plan(*Checkpoint::open(dst), convert_options(dst, tmp_ / "again")); },
                   ErrorCode::kUnsupported);
  EXPECT_NE(again.message().find("already a moepack output"), std::string::npos) << again.what();
  const json m = json::parse(slurp(dst + "/moepack.json"));
  EXPECT_EQ(m["backend"], "marlin");
  EXPECT_EQ(m["tensors"].size(), plan.tensors.size());
  for (const auto& t : plan.tensors) {
    ASSERT_TRUE(m["tensors"].contains(t.name)) << t.name;
    EXPECT_EQ(m["tensors"][t.name]["dtype"], dtype_name(t.dtype));
    EXPECT_EQ(m["tensors"][t.name]["shape"].get<Shape>(), t.shape);
  }
}

TEST_F(PlanGptq, SmallShardsWithIndex) {
  const std::string dst = tmp_ / "sharded";
  ConvertOptions opts = convert_options(src_, dst);
  opts.max_shard_bytes = 300000;
  const Plan plan = make_plan(*ckpt_, opts);
  ASSERT_GT(plan.shards.shard_names.size(), 2u);
  execute_plan(plan, *ckpt_);

  const size_t n = plan.shards.shard_names.size();
  for (size_t i = 0; i < n; ++i) {
    char want[64];
    std::snprintf(want, sizeof(want), "model-%05zu-of-%05zu.safetensors", i + 1, n);
    EXPECT_EQ(plan.shards.shard_names[i], want);
    EXPECT_EQ(fs::file_size(dst + "/" + want), plan.shards.shard_file_bytes[i]);
  }
  EXPECT_FALSE(fs::exists(dst + "/model.safetensors"));
  const Output out = read_output(dst, plan.shards.shard_names);
  EXPECT_EQ(out.tensor_bytes, plan.total_bytes());
  EXPECT_EQ(out.entries.size(), plan.tensors.size());

  // Every shard stays under the limit unless it holds a single larger tensor.
  std::map<std::string, std::pair<uint64_t, int>> per_shard;
  for (const auto& [name, e] : out.entries) {
    per_shard[out.shard_of.at(name)].first += e.end - e.begin;
    per_shard[out.shard_of.at(name)].second += 1;
  }
  for (const auto& [s, v] : per_shard)
    if (v.second > 1) {
      EXPECT_LE(v.first, opts.max_shard_bytes) << s;
    }

  const json idx = json::parse(slurp(dst + "/model.safetensors.index.json"));
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), out.tensor_bytes);
  ASSERT_EQ(idx["weight_map"].size(), plan.tensors.size());
  for (const auto& t : plan.tensors) {
    ASSERT_TRUE(idx["weight_map"].contains(t.name)) << t.name;
    EXPECT_EQ(idx["weight_map"][t.name], out.shard_of.at(t.name)) << t.name;
  }
  // Shards concatenated hold the tensors in the planned order.
  std::vector<std::string> planned;
  for (const auto& t : plan.tensors) planned.push_back(t.name);
  EXPECT_EQ(out.order, planned);
}

TEST_F(PlanGptq, ThreadCountDoesNotChangeTheBytes) {
  ConvertOptions a = convert_options(src_, tmp_ / "t1");
  a.max_shard_bytes = 400000;
  ConvertOptions b = a;
  b.dst = tmp_ / "t2";
  b.threads = 2;
  execute_plan(make_plan(*ckpt_, a), *ckpt_);
  execute_plan(make_plan(*ckpt_, b), *ckpt_);
  const auto ta = read_tree(a.dst), tb = read_tree(b.dst);
  ASSERT_GT(ta.size(), 4u);
  std::vector<std::string> names_a, names_b;
  for (const auto& [k, v] : ta) names_a.push_back(k);
  for (const auto& [k, v] : tb) names_b.push_back(k);
  ASSERT_EQ(names_a, names_b);
  for (const auto& [k, v] : ta)
    EXPECT_TRUE(v == tb.at(k)) << k << " differs between 1 and 2 threads";
}

TEST_F(PlanGptq, ExistingOutputRefusedWithoutForce) {
  const std::string dst = tmp_ / "exists";
  fs::create_directories(dst);
  std::ofstream(dst + "/marker") << "keep me";
  const Plan plan = make_plan(*ckpt_, convert_options(src_, dst));
  const Error e = expect_error([&] { execute_plan(plan, *ckpt_); }, ErrorCode::kOutputExists);
  EXPECT_EQ(e.exit_code(), ExitCode::kUsage);
  const auto tree = read_tree(dst);
  ASSERT_EQ(tree.size(), 1u);
  EXPECT_EQ(tree.at("marker"), "keep me");
  EXPECT_TRUE(leftovers(tmp_.path).empty());

  // With force the old output is replaced (and nothing of it is left).
  ConvertOptions forced = convert_options(src_, dst);
  forced.force = true;
  execute_plan(make_plan(*ckpt_, forced), *ckpt_);
  EXPECT_FALSE(fs::exists(dst + "/marker"));
  EXPECT_TRUE(fs::exists(dst + "/model.safetensors"));
  EXPECT_TRUE(leftovers(tmp_.path).empty());
}

TEST_F(PlanGptq, OutputInsideInputRefused) {
  const auto before = read_tree(src_);
  for (const std::string& dst : {src_ + "/converted", src_}) {
    SCOPED_TRACE(dst);
    ConvertOptions opts = convert_options(src_, dst);
    opts.force = true;  // even with force
    const Plan plan = make_plan(*ckpt_, opts);
    expect_error([&] { execute_plan(plan, *ckpt_); }, ErrorCode::kOutputAliasesInput);
  }
  EXPECT_FALSE(fs::exists(src_ + "/converted"));
  EXPECT_TRUE(read_tree(src_) == before);
  EXPECT_TRUE(leftovers(src_).empty());
  EXPECT_TRUE(leftovers(tmp_.path).empty());
}

TEST_F(PlanGptq, OutputThroughSymlinkIntoInputRefused) {
  // dst looks like it is elsewhere but a symlink leads into the source directory.
  const std::string link = tmp_ / "link-to-src";
  fs::create_directory_symlink(src_, link);
  const auto before = read_tree(src_);
  const Plan plan = make_plan(*ckpt_, convert_options(src_, link + "/converted"));
  expect_error([&] { execute_plan(plan, *ckpt_); }, ErrorCode::kOutputAliasesInput);
  EXPECT_FALSE(fs::exists(src_ + "/converted"));
  EXPECT_TRUE(read_tree(src_) == before);
  EXPECT_TRUE(leftovers(src_).empty());
}

TEST(PlanFailure, FailingConversionLeavesNothing) {
  TempDir tmp;
  const std::string src = tmp / "src";
  synth_checkpoint(src, synth_options("gptq"));
  // Poison the scales of one expert in the LAST MoE layer with NaN (f16 0x7E00), in place, so
  // the copy-through and the first layer are already written when the conversion fails.
  const std::string victim = "model.layers.2.mlp.experts.1.up_proj.scales";
  uint64_t offset = 0, len = 0;
  {
    const SafetensorsFile f = SafetensorsFile::open(src + "/model.safetensors");
    const SafetensorsEntry* e = f.find(victim);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(e->dtype, DType::kF16);
    offset = 8 + f.header_length() + e->begin;
    len = e->end - e->begin;
  }
  {
    std::fstream io(src + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(offset));
    const uint16_t nan = 0x7E00;
    for (uint64_t i = 0; i < len / 2; ++i) io.write(reinterpret_cast<const char*>(&nan), 2);
    ASSERT_TRUE(static_cast<bool>(io));
  }
  const auto ckpt = Checkpoint::open(src);  // NaN is not a header problem
  const std::string dst = tmp / "out";
  const Plan plan = make_plan(*ckpt, convert_options(src, dst));
  const Error e = expect_error([&] { execute_plan(plan, *ckpt); }, ErrorCode::kBadValue);
  EXPECT_NE(e.what(), std::string()) << e.what();
  EXPECT_NE(std::string(e.what()).find("model.layers.2.mlp.experts.1.up_proj"), std::string::npos)
      << e.what();
  EXPECT_FALSE(fs::exists(dst));
  EXPECT_TRUE(leftovers(tmp.path).empty());
  std::vector<std::string> names;
  for (const auto& x : fs::directory_iterator(tmp.path))
    names.push_back(x.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"src"});
}

TEST(PlanMxfp8, QuantizeBf16ToTrtllmMxfp8) {
  TempDir tmp;
  const std::string src = tmp / "src";
  synth_checkpoint(src, synth_options("bf16"));
  const auto ckpt = Checkpoint::open(src);
  ConvertOptions opts = convert_options(src, tmp / "out");
  opts.quantize = "mxfp8";
  opts.target_arch = TargetArch::kSm100;
  const Plan plan = make_plan(*ckpt, opts);
  EXPECT_EQ(plan.backend, "trtllm-mxfp8");
  EXPECT_EQ(plan.target_quant.method, QuantMethod::kModeloptMxfp8);
  bool any = false;
  for (const auto& t : plan.tensors)
    if (t.converted) {
      any = true;
      EXPECT_EQ(t.name.rfind("model.layers.", 0), 0u);
      EXPECT_NE(t.name.find(".mlp.experts.routed_experts.w"), std::string::npos) << t.name;
      EXPECT_EQ(t.shape[0], kE) << t.name;
    }
  EXPECT_TRUE(any);
  execute_plan(plan, *ckpt);
  const Output out = read_output(opts.dst, plan.shards.shard_names);
  EXPECT_EQ(out.tensor_bytes, plan.total_bytes());
  EXPECT_EQ(out.entries.size(), plan.tensors.size());
  const json cfg = json::parse(slurp(opts.dst + "/config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "moepack");
  EXPECT_EQ(cfg["quantization_config"]["source_quantization_config"]["quant_algo"], "MXFP8");

  // Without --quantize an unquantized checkpoint has no backend, and the message says why.
  ConvertOptions plain = convert_options(src, tmp / "plain");
  const Error e = expect_error([&] { make_plan(*ckpt, plain); }, ErrorCode::kUnsupported);
  EXPECT_NE(e.message().find("--quantize"), std::string::npos) << e.what();
}

TEST(PlanErrors, OptionsValidated) {
  TempDir tmp;
  const std::string src = tmp / "src";
  synth_checkpoint(src, synth_options("gptq"));
  const auto ckpt = Checkpoint::open(src);
  // An unknown --target-arch / --vllm-target is refused where the flag is read (tools/, with
  // these parsers; Cli.ExitCodes runs the binary): the options carry only parsed values.
  expect_error([] { parse_target_arch("sm75"); }, ErrorCode::kUsage);
  expect_error([] { parse_vllm_target("0.1"); }, ErrorCode::kUsage);
  ConvertOptions o = convert_options(src, tmp / "out");
  o.quantize = "mxfp8";  // on an already quantized checkpoint
  expect_error([&] { make_plan(*ckpt, o); }, ErrorCode::kUsage);
  o = convert_options(src, tmp / "out");
  o.backend = "trtllm-mxfp8";  // explicit backend that cannot take GPTQ
  expect_error([&] { make_plan(*ckpt, o); }, ErrorCode::kUnsupported);
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

}  // namespace
}  // namespace moepack

namespace moepack {
namespace {

// Overwrites every 32-bit word of `tensor` in the single-shard checkpoint at `src` with `word`.
void overwrite_words(const std::string& src, const std::string& tensor, uint32_t word) {
  const std::string shard = src + "/model.safetensors";
  uint64_t offset = 0, len = 0;
  {
    const SafetensorsFile f = SafetensorsFile::open(shard);
    const SafetensorsEntry* e = f.find(tensor);
    ASSERT_NE(e, nullptr) << tensor;
    offset = 8 + f.header_length() + e->begin;
    len = e->end - e->begin;
  }
  std::fstream io(shard, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(offset));
  for (uint64_t i = 0; i < len / 4; ++i) io.write(reinterpret_cast<const char*>(&word), 4);
  ASSERT_TRUE(static_cast<bool>(io));
}

// The source codec's refine runs once per layer, at plan time: a symmetric GPTQ checkpoint whose
// config says v1 ("checkpoint_format": "gptq") but whose stored qzeros are GPTQModel v2 (the
// symmetric zero 8 in every field) plans v2 for its layers, and both execution paths take the
// plan's params instead of judging the checkpoint again.
TEST(PlanDecides, RefinedSourceParamsAreThePlansAndExecutionTakesThem) {
  TempDir tmp;
  const std::string src = tmp / "src", plain = tmp / "plain";
  synth_checkpoint(src, synth_options("gptq"));
  synth_checkpoint(plain, synth_options("gptq"));
  for (const char* layer : {"1", "2"})  // expert 0's first Linear of each MoE layer
    overwrite_words(src, std::string("model.layers.") + layer + ".mlp.experts.0.gate_proj.qzeros",
                    0x88888888u);
  const auto ckpt = Checkpoint::open(src);
  ASSERT_EQ(ckpt->quant().gptq_format, GptqFormat::kV1);
  ConvertOptions c = convert_options(src, tmp / "out");
  c.backend = "marlin";  // the direct gptq->marlin path
  const Plan plan = make_plan(*ckpt, c);
  EXPECT_EQ(plan.source_quant.gptq_format, GptqFormat::kV1);  // the config's (moepack.json)
  ASSERT_EQ(plan.layers.size(), 2u);
  for (const PlannedLayer& pl : plan.layers) {
    SCOPED_TRACE(pl.module);
    const MoeLayer& L = ckpt->moe_layers()[static_cast<size_t>(pl.index)];
    EXPECT_EQ(pl.source_quant.gptq_format, GptqFormat::kV2);
    EXPECT_EQ(refined_source_params(*ckpt, L).gptq_format, GptqFormat::kV2);
    ASSERT_NE(pl.direct, nullptr) << pl.canonical_why;
    EXPECT_EQ(direct_source(*ckpt, pl, 0, 1).quant.gptq_format, GptqFormat::kV2);
  }
  // The layers of the unedited checkpoint plan v1, as their zeros say.
  const auto plain_ckpt = Checkpoint::open(plain);
  ConvertOptions plain_options = convert_options(plain, tmp / "plain-out");
  plain_options.backend = "marlin";
  const Plan plain_plan = make_plan(*plain_ckpt, plain_options);
  for (const PlannedLayer& pl : plain_plan.layers)
    EXPECT_EQ(pl.source_quant.gptq_format, GptqFormat::kV1) << pl.module;

  // Execution takes PlannedLayer::source_quant as it is: params the tensors do not hold (8 bits
  // for 4-bit words) make the direct path decline and the canonical load refuse the chunk.
  Plan altered = plan;
  PlannedLayer& pl = altered.layers[0];
  pl.source_quant.bits = 8;
  EXPECT_EQ(direct_source(*ckpt, pl, 0, 1).quant.bits, 8);
  EXPECT_FALSE(pl.direct->convert(pl.layout_options, direct_source(*ckpt, pl, 0, 1)).has_value());
  expect_error([&] { convert_chunk_canonical(altered, *ckpt, pl, 0, 1); }, ErrorCode::kBadShape);

  // Symmetric codes ignore the zero convention: the chunks convert to the bytes of the unedited
  // checkpoint, on the direct path and the canonical one.
  execute_plan(plan, *ckpt);
  execute_plan(plain_plan, *plain_ckpt);
  ConvertOptions canonical = convert_options(src, tmp / "canonical");
  canonical.backend = "marlin";
  canonical.no_fast_path = true;
  execute_plan(make_plan(*ckpt, canonical), *ckpt);
  for (const auto& shard : plan.shards.shard_names) {
    const std::string want = slurp(tmp / "plain-out" + "/" + shard);
    EXPECT_EQ(slurp(tmp / "out" + "/" + shard), want) << shard;
    EXPECT_EQ(slurp(tmp / "canonical" + "/" + shard), want) << shard;
  }
}

// One chunk rule (pipeline/plan.h) for convert, inspect's validate_source and verify: the budget
// in canonical bytes, at least one expert, at most ceil(E / kMinChunksPerLayer).
TEST(PlanDecides, OneChunkRule) {
  EXPECT_EQ(canonical_expert_bytes(2 * 128, 256, 128, false), uint64_t{3 * 128 * 256});
  EXPECT_EQ(canonical_expert_bytes(128, 256, 128, true), uint64_t{2 * 128 * 256 * 4});
  EXPECT_EQ(experts_per_chunk(uint64_t{1} << 30, 128, 1000), 32);  // ceil(128 / 4)
  EXPECT_EQ(experts_per_chunk(uint64_t{1} << 30, 10, 1000), 3);    // ceil(10 / 4)
  EXPECT_EQ(experts_per_chunk(10 * 1000, 128, 1000), 10);          // the budget
  EXPECT_EQ(experts_per_chunk(999, 128, 1000), 1);                 // at least one
  EXPECT_EQ(experts_per_chunk(1, 1, 1000), 1);
  EXPECT_EQ(experts_per_chunk(UINT64_MAX, 3, 0), 1);  // ceil(3 / 4)
  EXPECT_EQ(experts_per_chunk(UINT64_MAX, int64_t{1} << 40, 1), int64_t{1} << 38);

  // make_plan's layers follow it, in codes and in floats (--quantize).
  TempDir tmp;
  for (const char* format : {"gptq", "bf16"}) {
    SCOPED_TRACE(format);
    const std::string src = tmp / format;
    SynthOptions so = synth_options(format);
    so.experts = 10;
    synth_checkpoint(src, so);
    const auto ckpt = Checkpoint::open(src);
    ConvertOptions o = convert_options(src, tmp / "out");
    const bool floats = std::string(format) == "bf16";
    if (floats) {
      o.quantize = "mxfp8";
      o.target_arch = TargetArch::kSm100;
    }
    const uint64_t per_expert = canonical_expert_bytes(2 * kI, kH, kI, floats);
    for (const uint64_t chunk : {per_expert * 2, per_expert * 100, uint64_t{1}}) {
      o.chunk_bytes = chunk;
      const Plan plan = make_plan(*ckpt, o);
      for (const PlannedLayer& pl : plan.layers) {
        EXPECT_EQ(pl.experts_per_chunk, experts_per_chunk(chunk, 10, per_expert));
        EXPECT_EQ(pl.chunks, (10 + pl.experts_per_chunk - 1) / pl.experts_per_chunk);
      }
    }
  }
}

}  // namespace
}  // namespace moepack
