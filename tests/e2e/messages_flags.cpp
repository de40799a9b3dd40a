// Messages and flags through the real binary (issue 29): CLI11 validators for numbers and
// choices, parse errors as JSON under --json, GPU-name hints, --report checked before the work,
// and running out of memory is exit 5 with advice instead of an abort.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::moepack_bin;
using test::moepack_cli;
using test::run_command;
using test::TempDir;

const char* kSmall = " --layers 2 --experts 4 --hidden 256 --inter 128";

TEST(MessagesFlags, NumbersAndChoicesAreValidatedByTheParser) {
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert a b --threads -3", &out, &err), 2);
  EXPECT_NE(err.find("--threads: must be 0 or more, got -3"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("verify a --tokens 0", &out, &err), 2);
  EXPECT_NE(err.find("--tokens: must be 1 or more, got 0"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("verify a --tolerance nan", &out, &err), 2);
  EXPECT_NE(err.find("--tolerance: expected a number"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("verify a --device gpu", &out, &err), 2);
  EXPECT_NE(err.find("--device: gpu not in {cpu,cuda}"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("synth a --format gptq --experts 0", &out, &err), 2);
  EXPECT_NE(err.find("--experts: must be 1 or more, got 0"), std::string::npos) << err;
}

TEST(MessagesFlags, ParseErrorsAreJsonUnderJson) {
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert a b --threads -3 --json", &out, &err), 2);
  const json j = json::parse(out);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["exit_code"], 2);
  EXPECT_EQ(j["error"]["code"], "usage");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("--threads"), std::string::npos);
  EXPECT_EQ(moepack_cli("convert --json a", &out, &err), 2);  // a missing positional
  EXPECT_EQ(json::parse(out)["error"]["code"], "usage") << out;
  EXPECT_EQ(moepack_cli("inspect a --no-such-flag --json", &out, &err), 2);
  EXPECT_EQ(json::parse(out)["exit_code"], 2) << out;
}

TEST(MessagesFlags, AGpuNameGetsItsArch) {
  std::string out, err;
  EXPECT_EQ(moepack_cli("convert a b --target-arch h100", &out, &err), 2);
  EXPECT_NE(err.find("h100 is sm90, use --target-arch sm90"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("inspect a --target-arch B200", &out, &err), 2);
  EXPECT_NE(err.find("B200 is sm100"), std::string::npos) << err;
}

TEST(MessagesFlags, ReportIsCheckedBeforeTheWork) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq" + kSmall), 0);
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst), 0);
  std::string out, err;
  EXPECT_EQ(moepack_cli("verify " + dst + " --report " + (tmp / "missing/r.html"), &out, &err), 5);
  EXPECT_NE(err.find("the folder " + (tmp / "missing") + " does not exist"), std::string::npos)
      << err;
  EXPECT_EQ(out.find("layer"), std::string::npos) << "verify ran before the check: " << out;
  // A writable one: the verdict and the report.
  EXPECT_EQ(moepack_cli("verify " + dst + " --tokens 8 --report " + (tmp / "r.html"), &out, &err),
            0);
  EXPECT_TRUE(fs::exists(tmp / "r.html"));
}

// "Did you mean" for a mistyped subcommand, option and choice, in text and under --json.
TEST(MessagesFlags, DidYouMean) {
  std::string out, err;
  EXPECT_EQ(moepack_cli("conver a b", &out, &err), 2);
  EXPECT_NE(err.find("did you mean \"convert\"?"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("convert a b --thread 3", &out, &err), 2);
  EXPECT_NE(err.find("did you mean --threads (not --thread)?"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("convert a b --threads -3", &out, &err), 2);
  EXPECT_EQ(err.find("did you mean"), std::string::npos) << "a number is no typo: " << err;
  EXPECT_EQ(moepack_cli("verify a --device cdua", &out, &err), 2);
  EXPECT_NE(err.find("did you mean \"cuda\"?"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("synth a --format gtpq", &out, &err), 2);
  EXPECT_NE(err.find("did you mean \"gptq\"?"), std::string::npos) << err;
  EXPECT_EQ(moepack_cli("synth a --format gtpq --json", &out, &err), 2);
  EXPECT_NE(json::parse(out)["error"]["message"].get<std::string>().find("did you mean \"gptq\"?"),
            std::string::npos)
      << out;
  EXPECT_EQ(moepack_cli("verfiy a --json", &out, &err), 2);
  EXPECT_NE(json::parse(out)["error"]["message"].get<std::string>().find("\"verify\""),
            std::string::npos)
      << out;
}

// verify --source with another checkpoint than the one converted: the refusal names the source
// the artifact records.
TEST(MessagesFlags, WrongSourceNamesTheRecordedOne) {
  TempDir tmp;
  const std::string a = tmp / "model-a", b = tmp / "model-b", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + a + " --format gptq" + kSmall), 0);
  ASSERT_EQ(
      moepack_cli("synth " + b + " --format gptq --layers 2 --experts 8 --hidden 256 --inter 128"),
      0);
  ASSERT_EQ(moepack_cli("convert " + a + " " + dst), 0);
  std::string out, err;
  EXPECT_EQ(moepack_cli("verify " + dst + " --source " + b, &out, &err), 3);
  EXPECT_NE(err.find("the artifact was converted from a gptq checkpoint (model_type "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("is --source " + b + " that checkpoint?"), std::string::npos) << err;
}

// Without a terminal (a Slurm or Kubernetes log) convert prints plain progress lines on stderr
// (every $MOEPACK_PROGRESS_SECONDS, default 5 s; 0 here: every piece) ending with all bytes
// written, none under --json; the result ends with a summary (sizes, time, rate, peak memory).
TEST(MessagesFlags, ProgressWithoutATerminalAndASummary) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq" + kSmall), 0);
  std::string out, err;
  ASSERT_EQ(run_command("MOEPACK_PROGRESS_SECONDS=0 " + moepack_bin() + " convert " + src + " " +
                            (tmp / "a") + " 2>&1 >/dev/null | cat",
                        &err),
            0);
  EXPECT_NE(err.find("moepack: layers 0/1"), std::string::npos) << err;
  EXPECT_NE(err.find("moepack: layers 1/1"), std::string::npos) << err;
  ASSERT_EQ(run_command("MOEPACK_PROGRESS_SECONDS=0 " + moepack_bin() + " convert " + src + " " +
                            (tmp / "b") + " --json",
                        &out, &err),
            0);
  EXPECT_EQ(err.find("moepack: layers"), std::string::npos) << err;
  ASSERT_EQ(moepack_cli("convert " + src + " " + (tmp / "c"), &out, &err), 0);
  EXPECT_EQ(err.find("moepack: layers"), std::string::npos) << "a short run stays quiet: " << err;
  EXPECT_NE(out.find("summary: "), std::string::npos) << out;
  EXPECT_NE(out.find(" source -> "), std::string::npos) << out;
  EXPECT_NE(out.find("peak memory"), std::string::npos) << out;
}

// --progress json: one JSON object a line on stderr (every piece here), ending with all bytes;
// --progress none: nothing, even without a terminal; --progress plain beside --json's result.
TEST(MessagesFlags, ProgressModes) {
  TempDir tmp;
  const std::string src = tmp / "src";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq" + kSmall), 0);
  const std::string convert = "MOEPACK_PROGRESS_SECONDS=0 " + moepack_bin() + " convert " + src;
  std::string out, err;
  ASSERT_EQ(
      run_command(convert + " " + (tmp / "a") + " --progress json 2>&1 >/dev/null | cat", &err), 0);
  json last;
  size_t lines = 0;
  for (size_t at = 0, nl; (nl = err.find('\n', at)) != std::string::npos; at = nl + 1, ++lines)
    last = json::parse(err.substr(at, nl - at));
  ASSERT_GE(lines, 2u) << err;
  EXPECT_EQ(last["progress"], "convert");
  EXPECT_EQ(last["layers_done"], 1);
  EXPECT_EQ(last["bytes_done"], last["bytes_total"]);
  ASSERT_EQ(
      run_command(convert + " " + (tmp / "b") + " --progress none 2>&1 >/dev/null | cat", &err), 0);
  EXPECT_EQ(err, "");
  ASSERT_EQ(run_command(convert + " " + (tmp / "c") + " --json --progress plain", &out, &err), 0);
  EXPECT_NE(err.find("moepack: layers 1/1"), std::string::npos) << err;
  EXPECT_EQ(json::parse(out)["ok"], true);
}

// verify shares convert's progress (plain lines "moepack: verify: layers ..." ending with every
// layer checked, JSON lines under --progress json) and ends with a summary and the verdict.
TEST(MessagesFlags, VerifyProgressAndSummary) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq" + kSmall), 0);
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst), 0);
  const std::string verify = "MOEPACK_PROGRESS_SECONDS=0 " + moepack_bin() + " verify " + dst +
                             " --source " + src + " --tokens 8";
  std::string out, err;
  ASSERT_EQ(run_command(verify + " 2>&1 >/dev/null | cat", &err), 0);
  EXPECT_NE(err.find("moepack: verify: layers 0/1"), std::string::npos) << err;
  EXPECT_NE(err.find("moepack: verify: layers 1/1"), std::string::npos) << err;
  ASSERT_EQ(run_command(verify + " --progress json 2>&1 >/dev/null | cat", &err), 0);
  const json last = json::parse(err.substr(err.rfind('{')));
  EXPECT_EQ(last["progress"], "verify");
  EXPECT_EQ(last["layers_done"], 1);
  EXPECT_EQ(last["bytes_done"], last["bytes_total"]);
  EXPECT_GT(last["bytes_total"].get<uint64_t>(), 0u);
  ASSERT_EQ(moepack_cli("verify " + dst + " --tokens 8", &out, &err), 0);
  EXPECT_EQ(err.find("moepack: verify:"), std::string::npos) << "a short run stays quiet: " << err;
  EXPECT_NE(out.find("summary: "), std::string::npos) << out;
  EXPECT_NE(out.find("1 MoE layer(s) checked in"), std::string::npos) << out;
  EXPECT_NE(out.find("peak memory"), std::string::npos) << out;
  EXPECT_NE(out.find("verdict PASSED"), std::string::npos) << out;
}

// The JSON lines of --progress json (stderr), each parsed (a line that is not JSON fails).
std::vector<json> json_lines(const std::string& text) {
  std::vector<json> lines;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(json::parse(text.substr(at, nl - at)));
  return lines;
}

// What every long command's closing summary holds: the text line (source -> output, time, rate,
// peak memory, verdict) and the same as --json's "run" object.
void expect_summary(const std::string& text, const std::string& what, const std::string& verdict) {
  const size_t at = text.find("summary: ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string line = text.substr(at, text.find('\n', at) - at);
  EXPECT_NE(line.find(what), std::string::npos) << line;
  EXPECT_NE(line.find(" s ("), std::string::npos) << line;
  EXPECT_NE(line.find("/s), peak memory "), std::string::npos) << line;
  EXPECT_NE(line.find(" anonymous + "), std::string::npos) << line;
  EXPECT_NE(line.find(", verdict " + verdict), std::string::npos) << line;
}
void expect_run_json(const json& run, bool source, bool output, const std::string& verdict) {
  ASSERT_TRUE(run.is_object()) << run;
  EXPECT_EQ(run["source_bytes"].get<uint64_t>() > 0, source) << run;
  EXPECT_EQ(run["output_bytes"].get<uint64_t>() > 0, output) << run;
  EXPECT_GE(run["seconds"].get<double>(), 0) << run;
  EXPECT_GE(run["bytes_per_second"].get<double>(), 0) << run;
  EXPECT_GT(run["peak_rss_anon_bytes"].get<uint64_t>(), 0u) << run;
  EXPECT_TRUE(run["peak_rss_file_bytes"].is_number_unsigned()) << run;
  EXPECT_EQ(run["verdict"], verdict) << run;
}

// The progress of a command without a terminal, every piece (MOEPACK_PROGRESS_SECONDS=0): plain
// lines "moepack: <command>: <unit> 0/N ..." through "<unit> N/N", and under --progress json one
// object a line, ending with every unit and byte done. The command runs twice: `args`, then
// `args` + `again` (--force where the first run wrote the output).
void expect_progress(const std::string& args, const std::string& again, const std::string& command,
                     const std::string& unit) {
  SCOPED_TRACE(command);
  const std::string run = "MOEPACK_PROGRESS_SECONDS=0 " + moepack_bin() + " " + args;
  std::string err;
  ASSERT_EQ(run_command(run + " 2>&1 >/dev/null | cat", &err), 0);
  EXPECT_NE(err.find("moepack: " + command + ": " + unit + " 0/"), std::string::npos) << err;
  const size_t last = err.rfind("moepack: " + command + ": " + unit + " ");
  ASSERT_NE(last, std::string::npos) << err;
  const size_t slash = err.find('/', last);
  const std::string done = err.substr(last, slash - last);
  const std::string total = err.substr(slash + 1, err.find(' ', slash) - slash - 1);
  EXPECT_EQ(done.substr(done.rfind(' ') + 1), total) << err;
  ASSERT_EQ(run_command(run + again + " --progress json 2>&1 >/dev/null | cat", &err), 0);
  const std::vector<json> lines = json_lines(err);
  ASSERT_GE(lines.size(), 2u) << err;
  for (const json& j : lines) EXPECT_EQ(j["progress"], command) << j;
  EXPECT_EQ(lines.front()[unit + "_done"], 0) << err;
  EXPECT_EQ(lines.back()[unit + "_done"], lines.back()[unit + "_total"]) << err;
  EXPECT_GT(lines.back()[unit + "_total"].get<int64_t>(), 0) << err;
  EXPECT_EQ(lines.back()["bytes_done"], lines.back()["bytes_total"]) << err;
  EXPECT_GT(lines.back()["bytes_total"].get<uint64_t>(), 0u) << err;
}

// synth, merge and inspect's validation report their progress as convert and verify do, and end
// with the summary; --json results carry it as "run" (convert's and verify's too).
TEST(MessagesFlags, SynthProgressAndSummary) {
  TempDir tmp;
  const std::string src = tmp / "src";
  expect_progress("synth " + src + " --format gptq" + kSmall, " --force", "synth", "tensors");
  std::string out, err;
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq --force" + kSmall, &out, &err), 0);
  EXPECT_EQ(err.find("moepack: synth:"), std::string::npos) << "a short run stays quiet: " << err;
  expect_summary(out, "no source -> ", "written");
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq --force --json" + kSmall, &out, &err), 0);
  expect_run_json(json::parse(out)["run"], false, true, "written");
}

TEST(MessagesFlags, MergeProgressAndSummary) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq" + kSmall), 0);
  std::string out, err;
  for (const char* unit : {"0/2", "1/2"}) {
    ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --shard " + unit, &out, &err), 0);
    expect_summary(out, "unit " + std::string(unit, 1) + " of 2 -> ", "written");
  }
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --shard 1/2 --json", &out, &err), 0);
  expect_run_json(json::parse(out)["run"], false, false, "skipped");
  expect_progress("merge " + dst + " --source " + src, " --force", "merge", "tensors");
  ASSERT_EQ(moepack_cli("merge " + dst + " --source " + src + " --force", &out, &err), 0);
  EXPECT_EQ(err.find("moepack: merge:"), std::string::npos) << "a short run stays quiet: " << err;
  expect_summary(out, " in 2 part(s) -> ", "merged");
  ASSERT_EQ(moepack_cli("merge " + dst + " --source " + src + " --force --json", &out, &err), 0);
  expect_run_json(json::parse(out)["run"], true, true,
                  "merged, every tensor equal to its part's SHA-256");
}

TEST(MessagesFlags, InspectValidationProgressAndSummary) {
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src + " --format gptq" + kSmall), 0);
  expect_progress("inspect " + src, "", "inspect", "layers");
  std::string out, err;
  ASSERT_EQ(moepack_cli("inspect " + src, &out, &err), 0);
  expect_summary(out, "summary: read ", "validated");
  EXPECT_NE(out.find(" of experts in 1 MoE layer(s), nothing written, in "), std::string::npos)
      << out;
  ASSERT_EQ(moepack_cli("inspect " + src + " --json", &out, &err), 0);
  expect_run_json(json::parse(out)["run"], true, false, "validated");
  // Nothing read, no summary: --no-validate, and a converted checkpoint (verify's job).
  ASSERT_EQ(moepack_cli("inspect " + src + " --no-validate --json", &out, &err), 0);
  EXPECT_FALSE(json::parse(out).contains("run")) << out;
  ASSERT_EQ(moepack_cli("convert " + src + " " + dst + " --json", &out, &err), 0);
  expect_run_json(json::parse(out)["run"], true, true, "written");
  ASSERT_EQ(moepack_cli("inspect " + dst, &out, &err), 0);
  EXPECT_EQ(out.find("summary: "), std::string::npos) << out;
  ASSERT_EQ(moepack_cli("verify " + dst + " --tokens 8 --json", &out, &err), 0);
  expect_run_json(json::parse(out)["run"], true, false, "PASSED");
}

// `ulimit -d` far below what a conversion needs: exit 5 with advice (was: "terminate called
// without an active exception", exit 134), nothing left at the destination, JSON under --json.
TEST(MessagesFlags, OutOfMemoryIsExit5WithAdvice) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory does not start under a data-size limit";
#endif
  TempDir tmp;
  const std::string src = tmp / "src", dst = tmp / "dst";
  ASSERT_EQ(moepack_cli("synth " + src +
                        " --format gptq --layers 2 --experts 16 --hidden 1024 "
                        "--inter 512"),
            0);
  for (const char* limit : {"10000", "30000"}) {
    SCOPED_TRACE(std::string("ulimit -d ") + limit);
    std::string out, err;
    EXPECT_EQ(run_command("ulimit -d " + std::string(limit) + "; exec " + moepack_bin() +
                              " convert " + src + " " + dst + " --json",
                          &out, &err),
              5)
        << err;
    EXPECT_NE(err.find("out of memory: lower --threads or --chunk-size"), std::string::npos) << err;
    EXPECT_EQ(json::parse(out, nullptr, false)["error"]["code"], "io") << out;
    EXPECT_FALSE(fs::exists(dst));
  }
}

}  // namespace
}  // namespace moepack
