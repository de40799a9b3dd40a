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
