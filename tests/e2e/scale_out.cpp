// Shard-parallel conversion (pipeline/parts.h): for random synthesised checkpoints and
// n in {1, 2, 3, 7}, the parts of `convert --shard i/n` plus `merge` are byte-identical to a
// single convert; the split is a pure function of the plan; re-running a part is idempotent; and
// every fault (a part missing, corrupted, from another plan or split, duplicated, or left
// half-written by a killed task) fails merge with exit 3 naming it, leaving no output.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "io/safetensors.h"
#include "pipeline/execute.h"
#include "pipeline/parts.h"
#include "synth/synth.h"
#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_bin;
using test::moepack_cli;
using test::read_json_file;
using test::run_command;
using test::TempDir;

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Every file of `want` exists in `got` with the same bytes, and `got` has no other file.
void expect_same_tree(const fs::path& got, const fs::path& want) {
  std::set<std::string> got_files, want_files;
  for (const auto& e : fs::recursive_directory_iterator(got))
    if (e.is_regular_file()) got_files.insert(fs::relative(e.path(), got).string());
  for (const auto& e : fs::recursive_directory_iterator(want))
    if (e.is_regular_file()) want_files.insert(fs::relative(e.path(), want).string());
  EXPECT_EQ(got_files, want_files);
  for (const auto& f : want_files) {
    if (!got_files.count(f)) continue;
    const auto a = read_bytes(got / f), b = read_bytes(want / f);
    EXPECT_TRUE(test::bytes_equal(a, b, 64, f));
  }
}

// Nothing named after DST besides DST.parts: no output, no temporary, no moved-aside one.
void expect_nothing_published(const std::string& dst) {
  EXPECT_FALSE(fs::exists(dst)) << dst;
  const fs::path parent = fs::path(dst).parent_path();
  const std::string base = fs::path(dst).filename().string();
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(base, 0) == 0 && name != base + ".parts")
      ADD_FAILURE() << "left behind: " << e.path();
  }
}

struct Case {
  std::string format, family, arch, quantize, vllm_target;
  SynthOptions synth;
  uint64_t max_shard_bytes;
};

Case random_case(std::mt19937_64& rng) {
  // gpt-oss: vLLM's loader splits its interleaved experts its own way, and moepack refuses its
  // parallel outputs (docs/gpt-oss.md); tests/e2e/gpt_oss_synth.cpp covers its synth.
  std::vector<std::string> formats;
  for (const std::string& f : synth_formats())
    if (f != "gpt-oss-mxfp4") formats.push_back(f);
  Case c;
  c.format = formats[rng() % formats.size()];
  const std::vector<std::string> families = {"qwen3", "mixtral", "deepseek"};
  c.family = families[rng() % families.size()];
  if (c.format == "bf16" && rng() % 2) c.family = "fused3d";
  // The TRT-LLM layouts (MXFP8, FP8 block: DeepSeek's and compressed-tensors') run on sm100 only;
  // vLLM 0.33 runs the FP4 sources and FP8 channel / per-tensor through Marlin on sm80 (`auto`
  // writes nothing for them on sm90, where vLLM runs Humming, CUTLASS or FlashInfer).
  const bool marlin_float_sm80 = c.format == "modelopt-nvfp4" || c.format == "ct-nvfp4" ||
                                 c.format == "ct-mxfp4" || c.format == "ct-fp8-channel" ||
                                 c.format == "ct-fp8-tensor" || c.format == "modelopt-fp8";
  c.arch = c.format == "modelopt-mxfp8" || c.format.find("fp8-block") != std::string::npos ||
                   c.format == "bf16"
               ? "sm100"
           : marlin_float_sm80 ? "sm80"
                               : "sm90";
  if (c.format == "bf16") c.quantize = "mxfp8";
  c.synth.format = c.format;
  c.synth.family = c.family;
  c.synth.layers = 1 + static_cast<int64_t>(rng() % 4);
  c.synth.experts = 2 + static_cast<int64_t>(rng() % 4);  // >= top_k (2)
  c.synth.hidden = 128 * (1 + static_cast<int64_t>(rng() % 2));
  c.synth.inter = 128 * (1 + static_cast<int64_t>(rng() % 2));
  c.synth.vocab = 64 + 64 * static_cast<int64_t>(rng() % 4);
  c.synth.seed = rng();
  c.synth.threads = 1;
  const uint64_t shard_sizes[] = {0, 100000, 300000, 5000000000ull};
  c.max_shard_bytes = shard_sizes[rng() % 4];
  // Act-order converts only for the target that takes it; the others draw either target, which
  // the parts record and merge must honour.
  const bool second_target = rng() % 2;
  c.vllm_target =
      c.format == "gptq-actorder" || second_target ? std::string("2026-05") : std::string("0.33");
  if (c.arch == "sm80") c.vllm_target = "0.33";  // the float Marlin rows write vLLM 0.33's bytes
  return c;
}

ConvertOptions options_for(const Case& c, const std::string& src, const std::string& dst) {
  ConvertOptions o;
  o.src = src;
  o.dst = dst;
  o.target_arch = parse_target_arch(c.arch);
  o.quantize = c.quantize;
  o.max_shard_bytes = c.max_shard_bytes;
  o.vllm_target = parse_vllm_target(c.vllm_target);
  o.threads = 1;
  return o;
}

// The property: parts + merge == convert, for n in {1, 2, 3, 7}, over random checkpoints of
// every synth format and family; each part run with its own thread count and chunk size (which
// must not matter). MOEPACK_SUITE_SEED samples other checkpoints.
TEST(ScaleOut, PartsPlusMergeEqualConvert) {
  const char* seed_env = std::getenv("MOEPACK_SUITE_SEED");
  std::mt19937_64 rng(seed_env ? std::stoull(seed_env) : 15);
  for (int trial = 0; trial < 8; ++trial) {
    const Case c = random_case(rng);
    SCOPED_TRACE(c.format + " " + c.family + " layers=" + std::to_string(c.synth.layers) +
                 " experts=" + std::to_string(c.synth.experts) +
                 " max_shard=" + std::to_string(c.max_shard_bytes));
    TempDir tmp;
    const std::string src = tmp / "src", ref = tmp / "ref";
    synth_checkpoint(src, c.synth);
    const auto ckpt = Checkpoint::open(src);
    execute_plan(make_plan(*ckpt, options_for(c, src, ref)), *ckpt);
    for (int64_t n : {1, 2, 3, 7}) {
      SCOPED_TRACE("n=" + std::to_string(n));
      const std::string dst = tmp / ("out" + std::to_string(n));
      const Plan whole = make_plan(*ckpt, options_for(c, src, dst));
      const auto units = split_plan(whole, n);
      // Every planned tensor in exactly one unit; the byte balance of greedy largest-first.
      std::vector<int> owner(whole.tensors.size(), 0);
      uint64_t total = 0, largest_item = 0, largest_unit = 0;
      for (const auto& u : units) {
        for (size_t i : u.tensors) ++owner[i];
        total += u.bytes;
        largest_unit = std::max(largest_unit, u.bytes);
      }
      for (const auto& t : whole.tensors)
        if (!t.converted) largest_item = std::max(largest_item, t.bytes);
      for (const auto& l : whole.layers) {
        uint64_t b = 0;
        for (const auto& t : whole.tensors) b += t.layer == l.index ? t.bytes : 0;
        largest_item = std::max(largest_item, b);
      }
      EXPECT_EQ(total, whole.total_bytes());
      for (size_t i = 0; i < owner.size(); ++i) EXPECT_EQ(owner[i], 1) << whole.tensors[i].name;
      EXPECT_LE(largest_unit, total / static_cast<uint64_t>(n) + largest_item);

      for (int64_t i = n - 1; i >= 0; --i) {  // any order
        ConvertOptions o = options_for(c, src, dst);
        o.threads = 1 + static_cast<int>(i % 3);
        o.chunk_bytes = i % 2 ? 1 : o.chunk_bytes;  // one expert at a time in odd units
        const PartResult p = execute_part(make_plan(*ckpt, o), *ckpt, {i, n});
        EXPECT_FALSE(p.skipped);
      }
      MergeOptions m;
      m.dst = dst;
      m.source = src;
      m.threads = 2;
      m.remove_parts = true;
      const MergeResult r = merge_parts(m);
      EXPECT_EQ(r.parts, n);
      expect_same_tree(dst, ref);
      EXPECT_FALSE(fs::exists(parts_dir(dst)));
    }
  }
}

TEST(ScaleOut, ShardSpecParsing) {
  EXPECT_EQ(parse_shard_spec("0/1").count, 1);
  EXPECT_EQ(parse_shard_spec("6/7").index, 6);
  for (const char* bad :
       {"", "1", "1/1", "3/2", "-1/2", "a/b", "0/0", "0/", "/2", "0/2/3", "0/100001", " 0/2"})
    test::expect_error([&] { parse_shard_spec(bad); }, ErrorCode::kUsage);
}

// ---- through the CLI: dry-run units, idempotency, fault cases and their exit codes ----

class ScaleOutCli : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = tmp_ / "src";
    dst_ = tmp_ / "out";
    ref_ = tmp_ / "ref";
    ASSERT_EQ(
        moepack_cli("synth " + src_ +
                    " --format gptq --family qwen3 --layers 4 --experts 4 --hidden 256 --inter "
                    "128 --seed 3"),
        0);
    ASSERT_EQ(moepack_cli("convert " + src_ + " " + ref_ + kFlags), 0);
  }
  int part(int64_t i, const std::string& extra = "", std::string* err = nullptr) {
    return moepack_cli(
        "convert " + src_ + " " + dst_ + kFlags + " --shard " + std::to_string(i) + "/3" + extra,
        nullptr, err);
  }
  void all_parts() {
    for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(part(i), 0);
  }
  // merge must fail with exit 3, say each of `words`, and publish nothing. Under timeout: a
  // hang (a FIFO opened for reading) fails as exit 124.
  void expect_merge_fails(const std::vector<std::string>& words) {
    std::string out, err;
    EXPECT_EQ(run_command("timeout 120 " + moepack_bin() + " merge " + dst_ + " --source " + src_ +
                              " --json",
                          &out, &err),
              3)
        << err;
    for (const auto& w : words) EXPECT_NE(err.find(w), std::string::npos) << w << " in: " << err;
    const json j = json::parse(out, nullptr, false);
    EXPECT_EQ(j.value("exit_code", 0), 3) << out;
    expect_nothing_published(dst_);
  }
  const std::string kFlags = " --max-shard-size 200KB --threads 1";
  TempDir tmp_;
  std::string src_, dst_, ref_;
};

TEST_F(ScaleOutCli, DryRunShowsUnitsDeterministically) {
  std::string a, b;
  ASSERT_EQ(
      moepack_cli("convert " + src_ + " " + dst_ + kFlags + " --shard 1/3 --dry-run --json", &a),
      0);
  ASSERT_EQ(moepack_cli("convert " + src_ + " " + (tmp_ / "elsewhere") +
                            " --max-shard-size 200KB --threads 2 --chunk-size 1 --shard 2/3 "
                            "--dry-run --json",
                        &b),
            0);
  const json ja = json::parse(a), jb = json::parse(b);
  ASSERT_EQ(ja["units"].size(), 3u);
  EXPECT_EQ(ja["units"], jb["units"]);  // same split whatever the machine-side flags
  EXPECT_EQ(ja["shard"]["plan_digest"], jb["shard"]["plan_digest"]);
  uint64_t sum = 0;
  for (const auto& u : ja["units"]) sum += u["tensor_bytes"].get<uint64_t>();
  EXPECT_EQ(sum, ja["totals"]["tensor_bytes"].get<uint64_t>());
  EXPECT_EQ(ja["shard"]["index"], 1);
  EXPECT_FALSE(fs::exists(parts_dir(dst_)));  // a dry run writes nothing
  std::string text;
  ASSERT_EQ(moepack_cli("convert " + src_ + " " + dst_ + kFlags + " --shard 0/3 --dry-run", &text),
            0);
  EXPECT_NE(text.find("0-of-3"), std::string::npos) << text;
  EXPECT_NE(text.find("2-of-3"), std::string::npos) << text;
}

TEST_F(ScaleOutCli, RerunIsIdempotentAndMergeMatchesConvert) {
  all_parts();
  const fs::path p1 = fs::path(parts_dir(dst_)) / "1-of-3" / "part.safetensors";
  const auto before = fs::last_write_time(p1);
  std::string out;
  ASSERT_EQ(moepack_cli("convert " + src_ + " " + dst_ + kFlags + " --shard 1/3 --json", &out), 0);
  EXPECT_TRUE(json::parse(out)["skipped"].get<bool>()) << out;
  EXPECT_EQ(fs::last_write_time(p1), before);
  ASSERT_EQ(moepack_cli("merge " + dst_ + " --source " + src_), 0);
  expect_same_tree(dst_, ref_);
  EXPECT_TRUE(fs::exists(parts_dir(dst_)));                          // kept without --remove-parts
  EXPECT_EQ(moepack_cli("merge " + dst_ + " --source " + src_), 2);  // output exists
  EXPECT_EQ(moepack_cli("merge " + dst_ + " --source " + src_ + " --force"),
            0);  // replaced, same bytes
  expect_same_tree(dst_, ref_);
  EXPECT_EQ(moepack_cli("verify " + dst_ + " --source " + src_ + " --tokens 4"), 0);
}

TEST_F(ScaleOutCli, MissingPart) {
  ASSERT_EQ(part(0), 0);
  ASSERT_EQ(part(2), 0);
  expect_merge_fails({"missing part", "1-of-3", "--shard I/3"});
}

TEST_F(ScaleOutCli, NoPartsAtAll) {
  expect_merge_fails({"no parts directory"});
}

// A task killed mid-write leaves only its temporary (the atomic rename never happened): merge
// names the part and says so; running the task again completes it.
TEST_F(ScaleOutCli, HalfWrittenByKilledTask) {
  all_parts();
  const fs::path root = parts_dir(dst_);
  fs::rename(root / "2-of-3", root / "2-of-3.moepack-tmp-4242-00000000beef");
  fs::resize_file(root / "2-of-3.moepack-tmp-4242-00000000beef" / "part.safetensors", 100);
  fs::remove(root / "2-of-3.moepack-tmp-4242-00000000beef" / "part.json");
  expect_merge_fails({"2-of-3", "unfinished"});
  ASSERT_EQ(part(2), 0);
  fs::remove_all(root / "2-of-3.moepack-tmp-4242-00000000beef");
  ASSERT_EQ(moepack_cli("merge " + dst_ + " --source " + src_), 0);
  expect_same_tree(dst_, ref_);
}

// A part whose directory is there but whose part.json is missing (not written by moepack's
// atomic path: copied by hand, or damaged) is incomplete.
TEST_F(ScaleOutCli, PartWithoutPartJson) {
  all_parts();
  fs::remove(fs::path(parts_dir(dst_)) / "0-of-3" / "part.json");
  expect_merge_fails({"0-of-3", "part.json", "incomplete"});
  // Re-running the task refuses the damaged part without --force, replaces it with it.
  EXPECT_EQ(part(0), 2);
  ASSERT_EQ(part(0, " --force"), 0);
  ASSERT_EQ(moepack_cli("merge " + dst_ + " --source " + src_), 0);
  expect_same_tree(dst_, ref_);
}

TEST_F(ScaleOutCli, CorruptedPartBytes) {
  all_parts();
  const fs::path f = fs::path(parts_dir(dst_)) / "1-of-3" / "part.safetensors";
  std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
  s.seekg(-1, std::ios::end);
  char c = 0;
  s.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  s.seekp(-1, std::ios::end);
  s.write(&c, 1);
  s.close();
  expect_merge_fails({"1-of-3", "SHA-256", "corrupted"});
}

TEST_F(ScaleOutCli, TruncatedPartFile) {
  all_parts();
  const fs::path f = fs::path(parts_dir(dst_)) / "0-of-3" / "part.safetensors";
  fs::resize_file(f, fs::file_size(f) - 3);
  expect_merge_fails({"0-of-3"});
}

// A FIFO or a directory where a part's tensors should be is a broken part (exit 3 naming it),
// never an I/O error (5) a job engine retries, and never a hang.
TEST_F(ScaleOutCli, PartTensorsNotARegularFile) {
  all_parts();
  const std::string f = (fs::path(parts_dir(dst_)) / "1-of-3" / "part.safetensors").string();
  fs::remove(f);
  ASSERT_EQ(::mkfifo(f.c_str(), 0644), 0);
  expect_merge_fails({"1-of-3/part.safetensors", "is a FIFO"});
  fs::remove(f);
  fs::create_directory(f);
  expect_merge_fails({"1-of-3/part.safetensors", "is a directory"});
}

TEST_F(ScaleOutCli, GarbagePartJson) {
  all_parts();
  std::ofstream(fs::path(parts_dir(dst_)) / "2-of-3" / "part.json") << "{\"moepack_part\": 1, ";
  expect_merge_fails({"2-of-3/part.json: invalid JSON"});
}

// part.json is read as every untrusted JSON file is (io/json_file.h): anything but a regular file
// in its place is exit 3 naming it, never a hang, and a field of the wrong type names its path.
TEST_F(ScaleOutCli, PartJsonNotARegularFileOrMistyped) {
  all_parts();
  auto part_json = [&](int64_t i) {
    return (fs::path(parts_dir(dst_)) / part_dir_name(i, 3) / "part.json").string();
  };
  std::vector<json> good;
  for (int64_t i = 0; i < 3; ++i) good.push_back(read_json_file(part_json(i)));
  const std::string p = part_json(1);
  fs::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0);
  expect_merge_fails({"1-of-3/part.json: is a FIFO, not a regular file"});
  // convert --shard does not block on it either: not a complete part, so not skipped (exit 2
  // without --force).
  std::string err;
  EXPECT_EQ(run_command("timeout 120 " + moepack_bin() + " convert " + src_ + " " + dst_ + kFlags +
                            " --shard 1/3",
                        nullptr, &err),
            2)
      << err;
  fs::remove(p);
  fs::create_directory(p);
  expect_merge_fails({"1-of-3/part.json: is a directory"});
  fs::remove(p);
  fs::create_symlink(p + ".loop", p);
  fs::create_symlink(p, p + ".loop");
  expect_merge_fails({"1-of-3/part.json: symlink loop"});
  fs::remove(p);
  fs::remove(p + ".loop");
  const std::vector<std::pair<std::function<void(json&)>, std::string>> mistyped = {
      {[](json& j) { j["unit"] = "1"; }, "part.json: unit: expected an integer, got \"1\""},
      {[](json& j) { j["unit"] = -1; }, "part.json: unit: must be between 0 and"},
      {[](json& j) { j["moepack_part"] = 1; }, "part.json: moepack_part: unknown part format"},
      {[](json& j) { j["source_tensors"] = json::array(); },
       "part.json: source_tensors: expected an object"},
      {[](json& j) { j["source_tensors"].begin().value() = "ABC"; },
       "expected 64 lowercase hex digits, got \"ABC\""},
      {[](json& j) { j["source_tensors"].begin().value() = std::string(64, 'a'); },
       "bytes differ from the source that was converted"},
      {[](json& j) { j["source_tensors"].erase(j["source_tensors"].begin().key()); },
       "no SHA-256 recorded for this source tensor"},
      {[](json& j) { j.erase("plan_digest"); }, "part.json: plan_digest: missing"},
      {[](json& j) { j["tensors"] = json::object(); },
       "part.json: tensors: expected an array, got an object"},
      {[](json& j) { j["tensors"][0]["name"] = 7; },
       "part.json: tensors[0].name: expected a string, got 7"},
      {[](json& j) { j["tensors"][1]["sha256"] = "ABC"; },
       "': tensors[1].sha256: expected 64 lowercase hex digits, got \"ABC\""},
      {[](json& j) { j["options"]["act_dtype"] = "fp16"; },
       "part.json: options.act_dtype: unknown dtype \"fp16\""},
      {[](json& j) { j["options"]["act_dtype"] = "F32"; },
       "part.json: options.act_dtype: expected \"BF16\" or \"F16\", got \"F32\""},
      {[](json& j) { j["options"]["max_shard_bytes"] = -5; },
       "part.json: options.max_shard_bytes: must be non-negative, got -5"},
      {[](json& j) { j["options"]["vllm_target"] = "0.1"; },
       "part.json: options.vllm_target: expected one of"},
  };
  for (const auto& [mutate, what] : mistyped) {
    SCOPED_TRACE(what);
    // Part 1 mutated; where the mutation is in the options, every part alike (merge compares the
    // parts' options first, then reads the first part's).
    for (int64_t i = 0; i < 3; ++i) {
      json j = good[static_cast<size_t>(i)];
      mutate(j);
      const bool options = j["options"] != good[static_cast<size_t>(i)]["options"];
      std::ofstream(part_json(i)) << (i == 1 || options ? j : good[static_cast<size_t>(i)]).dump();
    }
    expect_merge_fails({what});
  }
  for (int64_t i = 0; i < 3; ++i)
    std::ofstream(part_json(i)) << good[static_cast<size_t>(i)].dump();
  // A source tensor two parts say they read with different bytes.
  json twice = good[1];
  const std::string claimed = good[0]["source_tensors"].begin().key();
  twice["source_tensors"][claimed] = std::string(64, 'b');
  std::ofstream(part_json(1)) << twice.dump();
  expect_merge_fails({claimed, "also read by", "another SHA-256", "different copies"});
  std::ofstream(part_json(1)) << good[1].dump();
  ASSERT_EQ(moepack_cli("merge " + dst_ + " --source " + src_), 0);
  expect_same_tree(dst_, ref_);
}

// Same flags, another source (another seed: same headers and sizes, other weights).
TEST_F(ScaleOutCli, PartFromAnotherSource) {
  const std::string other = tmp_ / "other";
  ASSERT_EQ(moepack_cli("synth " + other +
                        " --format gptq --family qwen3 --layers 4 --experts 4 --hidden 256 --inter "
                        "128 --seed 4"),
            0);
  ASSERT_EQ(part(0), 0);
  ASSERT_EQ(part(2), 0);
  ASSERT_EQ(moepack_cli("convert " + other + " " + dst_ + kFlags + " --shard 1/3"), 0);
  expect_merge_fails({"1-of-3", "another plan"});
  // Nor can --source make the foreign part pass: it names the ones that disagree.
  std::string err;
  EXPECT_EQ(moepack_cli("merge " + dst_ + " --source " + other, nullptr, &err), 3);
  EXPECT_NE(err.find("another plan"), std::string::npos) << err;
  expect_nothing_published(dst_);
}

// Same source, other flags.
TEST_F(ScaleOutCli, PartWithOtherFlags) {
  ASSERT_EQ(part(0), 0);
  ASSERT_EQ(part(1, " --act-dtype fp16"), 0);
  ASSERT_EQ(part(2), 0);
  expect_merge_fails({"1-of-3", "other flags"});
  // A task re-run with other flags than its existing part refuses to overwrite it.
  std::string err;
  EXPECT_EQ(part(1, "", &err), 2);
  EXPECT_NE(err.find("another plan"), std::string::npos) << err;
  ASSERT_EQ(part(1, " --force"), 0);
  ASSERT_EQ(moepack_cli("merge " + dst_ + " --source " + src_), 0);
  expect_same_tree(dst_, ref_);
}

TEST_F(ScaleOutCli, PartsOfAnotherSplit) {
  all_parts();
  ASSERT_EQ(moepack_cli("convert " + src_ + " " + dst_ + kFlags + " --shard 0/2"), 0);
  expect_merge_fails({"different splits", "0-of-2", "0-of-3"});
}

TEST_F(ScaleOutCli, DuplicatedPart) {
  all_parts();
  const fs::path root = parts_dir(dst_);
  fs::copy(root / "1-of-3", root / "1-of-3 (copy)");
  expect_merge_fails({"1-of-3 (copy)"});
  fs::remove_all(root / "1-of-3 (copy)");
  // Unit 0's files in unit 2's place.
  fs::remove_all(root / "2-of-3");
  fs::copy(root / "0-of-3", root / "2-of-3");
  expect_merge_fails({"2-of-3", "describes part 0-of-3"});
}

TEST_F(ScaleOutCli, SourceChangedSincePartsWereMade) {
  all_parts();
  std::ofstream(fs::path(src_) / "config.json", std::ios::app) << "\n";  // same JSON, other bytes
  ASSERT_EQ(moepack_cli("merge " + dst_ + " --source " + src_),
            0);  // identity is the parsed config: still the same plan
  expect_same_tree(dst_, ref_);
  fs::remove_all(dst_);
  // Another tokenizer-side file changes the output.
  std::ofstream(fs::path(src_) / "generation_config.json") << "{\"changed\": true}\n";
  expect_merge_fails({"another plan"});
}

// Flips one byte in the middle of the first source tensor (of `wanted`, when given) lying more than
// 64 KiB from both ends of its shard's data, where the plan digest's samples do not look. Returns
// the tensor's name and its shard's file name ("" when there is none).
std::pair<std::string, std::string> flip_middle_byte(const std::string& src,
                                                     const std::set<std::string>& wanted = {}) {
  constexpr uint64_t kMargin = uint64_t{64} << 10;
  for (const auto& entry : fs::directory_iterator(src)) {
    if (entry.path().extension() != ".safetensors") continue;
    uint64_t offset = 0;
    std::string name;
    {
      const SafetensorsFile f = SafetensorsFile::open(entry.path().string());
      uint64_t data_len = 0;
      for (const auto& e : f.entries()) data_len = std::max(data_len, e.end);
      for (const auto& e : f.entries())
        if (e.begin > kMargin && e.end + kMargin < data_len && e.end > e.begin &&
            (wanted.empty() || wanted.count(e.name))) {
          name = e.name;
          offset = f.file_size() - data_len + (e.begin + e.end) / 2;
          break;
        }
    }
    if (name.empty()) continue;
    std::fstream io(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(offset));
    const char c = static_cast<char>(io.get() ^ 0x10);
    io.seekp(static_cast<std::streamoff>(offset));
    io.put(c);
    return {name, entry.path().filename().string()};
  }
  return {"", ""};
}

// Issue 28: the plan digest samples only the first and last 64 KiB of each shard. Each task records
// the SHA-256 of every source tensor it reads (part.json source_tensors) and merge checks them all
// against the source: a task that read another copy of SRC, edited in the middle of a tensor it
// read, or a source edited so after the tasks, is refused naming the source file and the tensor.
TEST_F(ScaleOutCli, SourceDiffersInTheMiddleOfATensor) {
  ASSERT_EQ(part(1), 0);
  std::set<std::string> read_by_1;
  const json part1 = read_json_file(fs::path(parts_dir(dst_)) / "1-of-3" / "part.json");
  for (const auto& [name, sha] : part1["source_tensors"].items()) read_by_1.insert(name);
  ASSERT_FALSE(read_by_1.empty());
  fs::remove_all(fs::path(parts_dir(dst_)) / "1-of-3");
  const std::string copy = tmp_ / "copy";
  fs::copy(src_, copy, fs::copy_options::recursive);
  const auto [tensor, shard] = flip_middle_byte(copy, read_by_1);
  ASSERT_FALSE(tensor.empty()) << "no tensor of part 1 lies in the middle of a shard";
  ASSERT_EQ(part(0), 0);
  ASSERT_EQ(part(2), 0);
  ASSERT_EQ(moepack_cli("convert " + copy + " " + dst_ + kFlags + " --shard 1/3"), 0);
  expect_merge_fails({"bytes differ from the source that was converted", shard, tensor, "1-of-3"});
  // Under --source COPY every part read what the copy holds (parts 0 and 2 read tensors the two
  // copies share): the merge is the copy's conversion, which verify checks against the copy.
  std::string err;
  ASSERT_EQ(moepack_cli("merge " + dst_ + " --source " + copy, nullptr, &err), 0) << err;
  EXPECT_NE(read_bytes(fs::path(dst_) / "moepack.json"),
            read_bytes(fs::path(ref_) / "moepack.json"));
  EXPECT_EQ(moepack_cli("verify " + dst_ + " --source " + copy + " --tokens 4"), 0);
  fs::remove_all(dst_);

  // Every part from SRC, then SRC edited in the middle of a tensor: merge and verify --source of
  // the single convert both refuse it, naming the file and the tensor.
  fs::remove_all(parts_dir(dst_));
  all_parts();
  const auto [edited, edited_shard] = flip_middle_byte(src_);
  ASSERT_FALSE(edited.empty());
  expect_merge_fails({"bytes differ from the source that was converted", edited_shard, edited});
  std::string out;
  EXPECT_EQ(moepack_cli("verify " + ref_ + " --source " + src_ + " --tokens 4", &out, &err), 3)
      << out;
  EXPECT_NE(err.find(edited_shard), std::string::npos) << err;
  EXPECT_NE(err.find(edited), std::string::npos) << err;
  // merge without --source: the parts record no path to fall back on.
  EXPECT_EQ(moepack_cli("merge " + dst_, nullptr, &err), 2);
  EXPECT_NE(err.find("--source"), std::string::npos) << err;
}

TEST_F(ScaleOutCli, BadShardFlag) {
  for (const char* bad : {"3/3", "x", "1/0", "-1/3"}) {
    std::string err;
    EXPECT_EQ(moepack_cli("convert " + src_ + " " + dst_ + " --shard " + bad, nullptr, &err), 2)
        << bad;
  }
  EXPECT_FALSE(fs::exists(parts_dir(dst_)));
}

// A task killed for real (SIGKILL: no handler runs) while it writes its part: merge names the
// part and says its task was killed (the temporary's owner tag names a process that is gone);
// running the task again removes the stale temporary and completes the part.
TEST(ScaleOutKill, TaskKilledWhileWriting) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "out", ref = tmp / "ref";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format gptq --family qwen3 --layers 2 --experts 8 --hidden 1024 "
                        "--inter 512 --seed 9"),
            0);
  ASSERT_EQ(moepack_cli("convert " + src + " " + ref + " --threads 1"), 0);
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --threads 1 --shard 0/2"), 0);
  const fs::path root = parts_dir(dst);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string bin = moepack_bin();
    ::execl(bin.c_str(), bin.c_str(), "convert", src.c_str(), dst.c_str(), "--threads", "1",
            "--chunk-size", "1", "--shard", "1/2", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait (bounded) for the task's temporary to appear, then kill it.
  bool seen = false;
  for (int i = 0; i < 60000 && !seen; ++i) {
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename().string().rfind("1-of-2.moepack-tmp-", 0) == 0) seen = true;
    if (!seen) ::usleep(1000);
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFSIGNALED(status) || fs::exists(root / "1-of-2"))
    GTEST_SKIP() << "the task finished before it could be killed";
  ASSERT_TRUE(seen);
  std::string err;
  EXPECT_EQ(moepack_cli("merge " + dst + " --source " + src, nullptr, &err), 3);
  EXPECT_NE(err.find("1-of-2 (only an unfinished temporary: its task was killed"),
            std::string::npos)
      << err;
  expect_nothing_published(dst);
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --threads 1 --shard 1/2"), 0);
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().find(".moepack-"), std::string::npos) << e.path();
  ASSERT_EQ(moepack_cli("merge " + dst + " --source " + src), 0);
  expect_same_tree(dst, ref);
}

}  // namespace
}  // namespace moepack
