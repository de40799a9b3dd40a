// The offline backend oracle, table-driven: (scheme, shape, target arch, explicit backend) ->
// the chosen backend, or the refusal with every candidate's reasons. The expectations follow
// vLLM's method selection (spec/wna16_marlin.md §7 "Method selection", §8-9; spec/mxfp8*.md):
// Marlin needs H % 128 == 0, I % max(64, group) == 0 and symmetric GPTQ; TRT-LLM-Gen kernels run
// only on SM100; W8A8 int8 needs dynamic activations.
#include "pipeline/oracle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

QuantParams gptq(int bits, int64_t group, bool sym = true, bool act_order = false) {
  QuantParams q;
  q.method = QuantMethod::kGptq;
  q.bits = bits;
  q.group_size = group;
  q.symmetric = sym;
  q.act_order = act_order;
  q.dtype = DType::kBF16;
  return q;
}
QuantParams awq(int64_t group) {
  QuantParams q = gptq(4, group, /*sym=*/false);
  q.method = QuantMethod::kAwq;
  return q;
}
QuantParams ct_pack(int bits, int64_t group, const std::string& actorder = "") {
  QuantParams q = gptq(bits, group);
  q.method = QuantMethod::kCtPackQuantized;
  q.actorder = actorder;
  q.act_order = actorder == "group";
  return q;
}
QuantParams ct_w8a8(bool dynamic) {
  QuantParams q;
  q.method = QuantMethod::kCtIntQuantized;
  q.bits = 8;
  q.group_size = -1;
  q.dynamic_input = dynamic;
  return q;
}
QuantParams mxfp8(QuantMethod m = QuantMethod::kModeloptMxfp8) {
  QuantParams q;
  q.method = m;
  q.bits = 8;
  q.group_size = 32;
  return q;
}
QuantParams fp8_block() {
  QuantParams q;
  q.method = QuantMethod::kFp8Block;
  q.bits = 8;
  q.group_size = 128;
  q.block_n = q.block_k = 128;
  return q;
}
// FP8 with per-channel (compressed-tensors FP8_DYNAMIC) or per-tensor (ModelOpt FP8,
// compressed-tensors FP8 with static activations) scales.
QuantParams fp8_scaled(QuantMethod m) {
  QuantParams q;
  q.method = m;
  q.bits = 8;
  q.group_size = -1;
  q.dynamic_input = m == QuantMethod::kCtFp8Channel;
  return q;
}
QuantParams unquantized() {
  QuantParams q;
  q.method = QuantMethod::kNone;
  q.bits = 16;
  return q;
}

struct ReasonCheck {
  std::string backend;
  std::string substring;  // must appear in one of that backend's reasons ("" = any reason)
};

struct Case {
  std::string label;
  QuantParams quant;
  int64_t hidden, inter;
  TargetArch arch;
  std::string requested;
  std::string scheme;
  std::string chosen;                   // "" = refused
  std::vector<std::string> candidates;  // verdict backends in order
  std::vector<ReasonCheck> reasons;
  // The rows above describe the spec's vLLM; the 0.33 rows name their target.
  VllmTarget target = VllmTarget::kV2026_05;
};

// vLLM 0.33's float Marlin (formats/marlin_float.h): `auto` writes only what vLLM 0.33 runs;
// Marlin elsewhere on request.
std::vector<Case> float_marlin_cases() {
  const auto sm90 = TargetArch::kSm90;
  return {
      {"0.33: mxfp8 sm80 -> marlin-mxfp8",
       mxfp8(),
       256,
       128,
       TargetArch::kSm80,
       "auto",
       "mxfp8",
       "marlin-mxfp8",
       {"trtllm-mxfp8", "marlin-mxfp8"},
       {{"trtllm-mxfp8", "SM100"}},
       VllmTarget::kV0_33},
      {"0.33: ct mxfp8 sm86 I=96 -> marlin-mxfp8 (I padded to 128)",
       mxfp8(QuantMethod::kCtMxfp8),
       256,
       96,
       TargetArch::kSm86,
       "auto",
       "mxfp8",
       "marlin-mxfp8",
       {"trtllm-mxfp8", "marlin-mxfp8"},
       {},
       VllmTarget::kV0_33},
      {"0.33: mxfp8 sm90 -> nothing: vLLM runs Humming, Marlin on request",
       mxfp8(),
       256,
       128,
       sm90,
       "auto",
       "mxfp8",
       "",
       {"trtllm-mxfp8", "none"},
       {{"none", "runs HUMMING"}, {"none", "--backend marlin-mxfp8"}},
       VllmTarget::kV0_33},
      {"0.33: explicit marlin-mxfp8 on sm90 -> marlin-mxfp8",
       mxfp8(),
       256,
       128,
       sm90,
       "marlin-mxfp8",
       "mxfp8",
       "marlin-mxfp8",
       {"marlin-mxfp8"},
       {},
       VllmTarget::kV0_33},
      {"0.33: mxfp8 H=192 I=64 sm80 -> refused (no thread config for the down GEMM)",
       mxfp8(),
       192,
       64,
       TargetArch::kSm80,
       "marlin-mxfp8",
       "mxfp8",
       "",
       {"marlin-mxfp8"},
       {{"marlin-mxfp8", "w2 GEMM n=H=192, k=Ip=64"}},
       VllmTarget::kV0_33},
      {"0.33: fp8 block sm80 -> marlin-fp8",
       fp8_block(),
       256,
       128,
       TargetArch::kSm80,
       "auto",
       "fp8-block",
       "marlin-fp8",
       {"trtllm-fp8-block", "marlin-fp8"},
       {},
       VllmTarget::kV0_33},
      {"0.33: fp8 block sm89 -> nothing: vLLM's Triton reads the checkpoint as loaded",
       fp8_block(),
       256,
       128,
       TargetArch::kSm89,
       "auto",
       "fp8-block",
       "",
       {"trtllm-fp8-block", "none"},
       {{"none", "runs TRITON"}, {"none", "--backend marlin-fp8"}},
       VllmTarget::kV0_33},
      {"0.33: fp8 block H=192 -> marlin-fp8 refused (H % 128)",
       fp8_block(),
       192,
       128,
       TargetArch::kSm80,
       "marlin-fp8",
       "fp8-block",
       "",
       {"marlin-fp8"},
       {{"marlin-fp8", "H=192 is not a multiple of 128"}},
       VllmTarget::kV0_33},
  };
}

// FP8 with per-channel or per-tensor scales (vLLM 0.33 fp8.py, docs/fp8_scaled.md).
std::vector<Case> fp8_scaled_cases() {
  const auto sm90 = TargetArch::kSm90;
  return {
      {"0.33: ct fp8 channel sm80 I=96 -> marlin-fp8 (I padded to 128)",
       fp8_scaled(QuantMethod::kCtFp8Channel),
       192,
       96,
       TargetArch::kSm80,
       "auto",
       "fp8-channel",
       "marlin-fp8",
       {"marlin-fp8"},
       {},
       VllmTarget::kV0_33},
      {"0.33: ct fp8 channel sm90 -> nothing: vLLM's CUTLASS reads the checkpoint as loaded",
       fp8_scaled(QuantMethod::kCtFp8Channel),
       256,
       128,
       sm90,
       "auto",
       "fp8-channel",
       "",
       {"none"},
       {{"none", "runs VLLM_CUTLASS"}, {"none", "--backend marlin-fp8"}},
       VllmTarget::kV0_33},
      {"0.33: modelopt fp8 sm86 -> marlin-fp8",
       fp8_scaled(QuantMethod::kModeloptFp8),
       256,
       128,
       TargetArch::kSm86,
       "auto",
       "fp8-tensor",
       "marlin-fp8",
       {"marlin-fp8"},
       {},
       VllmTarget::kV0_33},
      {"0.33: modelopt fp8 sm89 -> nothing: Triton",
       fp8_scaled(QuantMethod::kModeloptFp8),
       256,
       128,
       TargetArch::kSm89,
       "auto",
       "fp8-tensor",
       "",
       {"none"},
       {{"none", "runs TRITON"}},
       VllmTarget::kV0_33},
      {"0.33: ct fp8 tensor sm90 -> nothing: FlashInfer CUTLASS",
       fp8_scaled(QuantMethod::kCtFp8Tensor),
       256,
       128,
       sm90,
       "auto",
       "fp8-tensor",
       "",
       {"none"},
       {{"none", "runs FLASHINFER_CUTLASS"}},
       VllmTarget::kV0_33},
      {"0.33: explicit marlin-fp8 for ct fp8 tensor on sm90 -> marlin-fp8",
       fp8_scaled(QuantMethod::kCtFp8Tensor),
       256,
       128,
       sm90,
       "marlin-fp8",
       "fp8-tensor",
       "marlin-fp8",
       {"marlin-fp8"},
       {},
       VllmTarget::kV0_33},
  };
}

std::vector<Case> base_cases() {
  const auto sm90 = TargetArch::kSm90, sm100 = TargetArch::kSm100;
  return {
      {"gptq int4 g128 -> marlin",
       gptq(4, 128),
       256,
       128,
       sm90,
       "auto",
       "wna16",
       "marlin",
       {"marlin", "triton-wna16"},
       {}},
      {"gptq int4 g128 act-order -> marlin",
       gptq(4, 128, true, true),
       256,
       128,
       sm90,
       "auto",
       "wna16",
       "marlin",
       {"marlin", "triton-wna16"},
       {}},
      {"gptq int4 g32 I=96 -> triton (I % 64)",
       gptq(4, 32),
       256,
       96,
       sm90,
       "auto",
       "wna16",
       "triton-wna16",
       {"marlin", "triton-wna16"},
       {{"marlin", "96"}}},
      {"gptq asym -> triton",
       gptq(4, 128, /*sym=*/false),
       256,
       128,
       sm90,
       "auto",
       "wna16",
       "triton-wna16",
       {"marlin", "triton-wna16"},
       {{"marlin", "sym"}}},
      {"awq g128 -> marlin",
       awq(128),
       256,
       128,
       sm90,
       "auto",
       "wna16",
       "marlin",
       {"marlin", "triton-wna16"},
       {}},
      {"ct w4a16 g128 -> marlin",
       ct_pack(4, 128),
       256,
       128,
       sm90,
       "auto",
       "wna16",
       "marlin",
       {"marlin", "triton-wna16"},
       {}},
      {"ct w8a16 channel -> marlin",
       ct_pack(8, -1),
       256,
       128,
       TargetArch::kSm80,
       "auto",
       "wna16",
       "marlin",
       {"marlin", "triton-wna16"},
       {}},
      {"ct actorder group, I=96 g32 -> nothing",
       ct_pack(4, 32, "group"),
       256,
       96,
       sm90,
       "auto",
       "wna16",
       "",
       {"marlin", "triton-wna16"},
       {{"marlin", "96"}, {"triton-wna16", "act"}}},
      {"ct w8a8 dynamic -> triton-int8",
       ct_w8a8(true),
       256,
       128,
       sm90,
       "auto",
       "w8a8-int8",
       "triton-int8",
       {"triton-int8"},
       {}},
      {"ct w8a8 static -> refused",
       ct_w8a8(false),
       256,
       128,
       sm90,
       "auto",
       "w8a8-int8",
       "",
       {"triton-int8"},
       {{"triton-int8", "static"}}},
      {"mxfp8 sm100 -> trtllm-mxfp8",
       mxfp8(),
       256,
       128,
       sm100,
       "auto",
       "mxfp8",
       "trtllm-mxfp8",
       {"trtllm-mxfp8", "marlin-mxfp8"},
       {}},
      {"ct mxfp8 sm100 -> trtllm-mxfp8",
       mxfp8(QuantMethod::kCtMxfp8),
       256,
       128,
       sm100,
       "auto",
       "mxfp8",
       "trtllm-mxfp8",
       {"trtllm-mxfp8", "marlin-mxfp8"},
       {}},
      {"mxfp8 sm90 -> refused (SM100)",
       mxfp8(),
       256,
       128,
       sm90,
       "auto",
       "mxfp8",
       "",
       {"trtllm-mxfp8", "marlin-mxfp8"},
       {{"trtllm-mxfp8", "SM100"}, {"marlin-mxfp8", "follows vLLM 0.33.0"}}},
      {"mxfp8 I=96 sm100 -> refused (128)",
       mxfp8(),
       256,
       96,
       sm100,
       "auto",
       "mxfp8",
       "",
       {"trtllm-mxfp8", "marlin-mxfp8"},
       {{"trtllm-mxfp8", "128"}}},
      {"fp8 block sm100 -> trtllm-fp8-block",
       fp8_block(),
       256,
       128,
       sm100,
       "auto",
       "fp8-block",
       "trtllm-fp8-block",
       {"trtllm-fp8-block", "marlin-fp8"},
       {}},
      {"fp8 block sm90 -> refused",
       fp8_block(),
       256,
       128,
       sm90,
       "auto",
       "fp8-block",
       "",
       {"trtllm-fp8-block", "marlin-fp8"},
       {{"trtllm-fp8-block", "SM100"}, {"marlin-fp8", "--vllm-target 2026-05"}}},
      {"explicit marlin on mxfp8 -> refused",
       mxfp8(),
       256,
       128,
       sm100,
       "marlin",
       "mxfp8",
       "",
       {"marlin"},
       {{"marlin", "mxfp8"}}},
      {"explicit triton on gptq g128 -> triton",
       gptq(4, 128),
       256,
       128,
       sm90,
       "triton-wna16",
       "wna16",
       "triton-wna16",
       {"triton-wna16"},
       {}},
      {"explicit marlin on gptq I=96 -> refused",
       gptq(4, 32),
       256,
       96,
       sm90,
       "marlin",
       "wna16",
       "",
       {"marlin"},
       {{"marlin", "96"}}},
      {"0.33: gptq act-order -> refused, naming 2026-05",
       [] {
         QuantParams q = gptq(4, 128);
         q.act_order = true;
         return q;
       }(),
       256,
       128,
       sm90,
       "auto",
       "wna16",
       "",
       {"humming", "marlin", "triton-wna16"},
       {{"humming", "act-order"},
        {"marlin", "--vllm-target 2026-05"},
        {"triton-wna16", "act-order"}},
       VllmTarget::kV0_33},
      {"0.33: gptq g32 I=96 -> humming (N padded to 256 at the end)",
       gptq(4, 32),
       256,
       96,
       sm90,
       "auto",
       "wna16",
       "humming",
       {"humming", "marlin", "triton-wna16"},
       {},
       VllmTarget::kV0_33},
      {"0.33 on sm80: gptq g32 I=96 -> marlin (I padded to 128)",
       gptq(4, 32),
       256,
       96,
       TargetArch::kSm80,
       "auto",
       "wna16",
       "marlin",
       {"marlin", "triton-wna16", "humming"},
       {{"humming", "sm90 only"}},
       VllmTarget::kV0_33},
      {"0.33: gptq channelwise -> marlin (stock vLLM's Humming path cannot load it)",
       gptq(4, -1),
       256,
       128,
       sm90,
       "auto",
       "wna16",
       "marlin",
       {"humming", "marlin", "triton-wna16"},
       {{"humming", "GPTQ channelwise"}},
       VllmTarget::kV0_33},
      {"0.33: gptq g128 I=64 -> triton (a group would straddle the padding)",
       gptq(4, 128),
       256,
       64,
       sm90,
       "auto",
       "wna16",
       "triton-wna16",
       {"humming", "marlin", "triton-wna16"},
       {{"humming", "MoeWNA16Method"}, {"marlin", "group_size=128"}},
       VllmTarget::kV0_33},
      {"unquantized -> refused, suggests --quantize",
       unquantized(),
       256,
       128,
       sm100,
       "auto",
       "unquantized",
       "",
       {"none"},
       {{"none", "--quantize mxfp8"}}},
      {"modelopt fp8 per-tensor on sm100 for 2026-05 -> refused (marlin-fp8 writes 0.33 only)",
       fp8_scaled(QuantMethod::kModeloptFp8),
       256,
       128,
       sm100,
       "auto",
       "fp8-tensor",
       "",
       {"marlin-fp8"},
       {{"marlin-fp8", "--vllm-target 2026-05 is not written"}}},
  };
}

std::vector<Case> cases() {
  std::vector<Case> all = base_cases();
  for (Case& c : float_marlin_cases()) all.push_back(std::move(c));
  for (Case& c : fp8_scaled_cases()) all.push_back(std::move(c));
  return all;
}

TEST(Oracle, Table) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label);
    OracleQuery q;
    q.quant = c.quant;
    q.experts = 8;
    q.hidden = c.hidden;
    q.inter = c.inter;
    q.arch = c.arch;
    q.requested = c.requested;
    q.vllm_target = c.target;
    const OracleDecision d = choose_backend(q);
    SCOPED_TRACE(d.explain());
    EXPECT_EQ(d.scheme, c.scheme);
    EXPECT_EQ(d.chosen, c.chosen);
    std::vector<std::string> got;
    for (const auto& v : d.verdicts) got.push_back(v.backend);
    EXPECT_EQ(got, c.candidates);
    for (const auto& v : d.verdicts) {
      // A verdict is supported exactly when it has no reasons, and the chosen one is the first
      // supported candidate.
      EXPECT_EQ(v.supported, v.reasons.empty()) << v.backend;
      for (const auto& r : v.reasons) EXPECT_FALSE(r.empty()) << v.backend;
    }
    for (const auto& v : d.verdicts) {
      if (v.supported) {
        EXPECT_EQ(v.backend, d.chosen);
        break;
      }
    }
    if (c.chosen.empty()) {
      for (const auto& v : d.verdicts) EXPECT_GE(v.reasons.size(), 1u) << v.backend;
    }
    for (const auto& rc : c.reasons) {
      const BackendVerdict* v = nullptr;
      for (const auto& x : d.verdicts)
        if (x.backend == rc.backend) v = &x;
      ASSERT_NE(v, nullptr) << rc.backend;
      EXPECT_FALSE(v->supported) << rc.backend;
      bool found = false;
      for (const auto& r : v->reasons) found |= r.find(rc.substring) != std::string::npos;
      EXPECT_TRUE(found) << rc.backend << " has no reason containing \"" << rc.substring << "\"";
    }
  }
}

TEST(Oracle, ReasonsAreListedOneByOne) {
  // Channelwise CT experts fail the CT Triton method once per projection (w13 and w2): separate
  // entries, whichever way the layout formats its message, not one run-on string.
  OracleQuery q;
  q.quant = ct_pack(4, -1);
  q.hidden = 256;
  q.inter = 128;
  q.requested = "triton-wna16";
  const OracleDecision d = choose_backend(q);
  ASSERT_EQ(d.verdicts.size(), 1u);
  ASSERT_GE(d.verdicts[0].reasons.size(), 2u) << d.explain();
  for (const auto& r : d.verdicts[0].reasons) {
    EXPECT_EQ(r.find('\n'), std::string::npos) << r;
    EXPECT_NE(r.find("channelwise"), std::string::npos) << r;
  }
}

TEST(Oracle, UnknownBackendIsUsageError) {
  OracleQuery q;
  q.quant = gptq(4, 128);
  q.hidden = 256;
  q.inter = 128;
  q.requested = "cutlass";
  try {
    choose_backend(q);
    FAIL() << "expected kUsage";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUsage);
    EXPECT_EQ(e.exit_code(), ExitCode::kUsage);
    for (const auto& t : target_layouts())
      for (const std::string b : {t.name})
        EXPECT_NE(e.message().find(b), std::string::npos) << b << " not listed: " << e.message();
  }
}

// vLLM 0.33 on SM90 runs Humming for WNA16, and so does `auto`; an explicit Marlin there is
// written with the note that says what that vLLM would run and how it is told to run Marlin.
TEST(Oracle, VllmOwnChoiceIsShownBesideTheChosenLayout) {
  OracleQuery q;
  q.quant = gptq(4, 128);
  q.hidden = 256;
  q.inter = 128;
  q.vllm_target = VllmTarget::kV0_33;
  q.arch = TargetArch::kSm90;
  OracleDecision d = choose_backend(q);
  EXPECT_EQ(d.chosen, "humming");
  EXPECT_EQ(d.vllm_would_pick, "humming");
  EXPECT_EQ(d.vllm_note, "");
  EXPECT_NE(d.explain().find("prioritize_humming"), std::string::npos) << d.explain();
  q.requested = "marlin";
  d = choose_backend(q);
  EXPECT_EQ(d.chosen, "marlin");
  EXPECT_EQ(d.vllm_would_pick, "humming");
  // The note, from the rows: vLLM's backend and moepack's layout of it, what moepack writes
  // instead and how that vLLM is told to run it.
  for (const char* part : {"vLLM 0.33.0", "sm90", "would run HUMMING (moepack's humming layout)",
                           "writes marlin (--backend marlin)", "--moe-backend marlin"})
    EXPECT_NE(d.vllm_note.find(part), std::string::npos) << part << " not in: " << d.vllm_note;
  EXPECT_EQ(d.to_json()["vllm_would_pick"], "humming");
  EXPECT_EQ(d.to_json()["vllm_note"], d.vllm_note);
  q.requested = "auto";
  for (const auto& [target, arch] : {std::make_pair(VllmTarget::kV0_33, TargetArch::kSm100),
                                     std::make_pair(VllmTarget::kV2026_05, TargetArch::kSm90)}) {
    q.vllm_target = target;
    q.arch = arch;
    d = choose_backend(q);
    EXPECT_EQ(d.vllm_would_pick, "marlin");
    EXPECT_EQ(d.vllm_note, "");
    EXPECT_EQ(d.to_json()["vllm_would_pick"], "marlin");
    EXPECT_FALSE(d.to_json().contains("vllm_note"));
  }
}

TEST(Oracle, TargetArchNames) {
  EXPECT_EQ(parse_target_arch("sm90a"), TargetArch::kSm90);
  EXPECT_EQ(parse_target_arch("sm100"), TargetArch::kSm100);
  for (TargetArch a : {TargetArch::kSm80, TargetArch::kSm86, TargetArch::kSm89, TargetArch::kSm90,
                       TargetArch::kSm100, TargetArch::kSm120})
    EXPECT_EQ(parse_target_arch(target_arch_name(a)), a);
  try {
    parse_target_arch("sm75");
    FAIL() << "expected kUsage";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUsage);
  }
}

TEST(Oracle, JsonRecordsEveryCandidate) {
  OracleQuery q;
  q.quant = gptq(4, 32);
  q.hidden = 256;
  q.inter = 96;
  q.vllm_target = VllmTarget::kV2026_05;  // no padding: Marlin refuses I = 96
  const nlohmann::json j = choose_backend(q).to_json();
  EXPECT_EQ(j["scheme"], "wna16");
  EXPECT_EQ(j["chosen"], "triton-wna16");
  ASSERT_EQ(j["candidates"].size(), 2u);
  EXPECT_EQ(j["candidates"][0]["backend"], "marlin");
  EXPECT_EQ(j["candidates"][0]["supported"], false);
  EXPECT_GE(j["candidates"][0]["reasons"].size(), 1u);

  q.quant = mxfp8();
  q.arch = TargetArch::kSm90;
  q.inter = 128;
  EXPECT_TRUE(choose_backend(q).to_json()["chosen"].is_null());
}

TEST(Oracle, ShapesForAQueryFollowTheCodecSpec) {
  for (const QuantParams& qp : {gptq(4, 128), gptq(8, -1, true, true), awq(64),
                                ct_pack(4, 32, "group"), ct_w8a8(true), mxfp8(), fp8_block()}) {
    SCOPED_TRACE(quant_method_name(qp.method));
    const MoeShape m = moe_shape_for(qp, 3, 256, 128, true);
    EXPECT_EQ(m.experts, 3);
    EXPECT_EQ(m.w13.n, 256);
    EXPECT_EQ(m.w13.k, 256);
    EXPECT_EQ(m.w2.n, 256);
    EXPECT_EQ(m.w2.k, 128);
    EXPECT_EQ(m.w13.quant, find_source_codec(qp.method)->spec_for(qp));
    // Act-order only where it can be non-trivial: integer codes, more than one group.
    EXPECT_EQ(m.w13.act_order, qp.act_order && m.w13.quant.kind == CodeKind::kUint &&
                                   m.w13.quant.groups(m.w13.k) > 1);
    // The explicit per-projection switch overrides the checkpoint's flag.
    const MoeShape w2_only = moe_shape_for(qp, 1, 256, 128, true, 0, 1);
    EXPECT_FALSE(w2_only.w13.act_order);
    const MoeShape u = moe_shape_for(qp, 1, 256, 128, false);
    EXPECT_EQ(u.w13.n, 128);
  }
  QuantParams none;
  EXPECT_THROW(moe_shape_for(none, 1, 256, 128, true), Error);
}

// Per vLLM target x arch x scheme, for a layer every layout takes (E 8, H 256, I 128, gated):
// what `auto` writes and what that vLLM's own oracle would run. The expectations follow vLLM
// 0.33.0's oracles (fused_moe/oracle/int_wna16.py, int8.py, mxfp8.py, fp8.py with
// prioritize_humming) and, for 2026-05, ../shared/spec (wna16_marlin.md §7, §9; mxfp8_trtllm.md
// §2): Humming ahead of Marlin on SM90 only in 0.33; FlashInfer's MxInt4 (TRT-LLM) first on
// SM100 for compressed-tensors int4 g32; MXFP8 on Marlin (or Humming on SM90) off SM100; block
// FP8 on Triton on SM89/SM90, Marlin on SM80/SM86, DeepGEMM on SM120. For MXFP8 and block FP8
// `auto` writes only vLLM's pick (VllmBackendOrder::auto_writes_only_vllm_pick): Marlin where
// vLLM 0.33 runs it, nothing where it runs Humming, Triton or DeepGEMM.
struct ArchExpectation {
  TargetArch arch;
  std::string chosen, vllm_would_pick;
};
struct OrderCase {
  std::string label;
  QuantParams quant;
  VllmTarget target;
  std::vector<ArchExpectation> per_arch;  // every arch
};

std::vector<OrderCase> order_cases() {
  using A = TargetArch;
  const auto v033 = VllmTarget::kV0_33, v2605 = VllmTarget::kV2026_05;
  // On SM90 `auto` writes what that vLLM runs there when moepack has its layout (Humming).
  auto wna16 = [](const std::string& on_sm90, const std::string& on_sm100) {
    const std::string chosen_sm90 = on_sm90 == "humming" ? "humming" : "marlin";
    return std::vector<ArchExpectation>{
        {A::kSm80, "marlin", "marlin"},  {A::kSm86, "marlin", "marlin"},
        {A::kSm89, "marlin", "marlin"},  {A::kSm90, chosen_sm90, on_sm90},
        {A::kSm100, "marlin", on_sm100}, {A::kSm120, "marlin", "marlin"}};
  };
  const std::vector<ArchExpectation> int8 = {
      {A::kSm80, "triton-int8", "triton-int8"},  {A::kSm86, "triton-int8", "triton-int8"},
      {A::kSm89, "triton-int8", "triton-int8"},  {A::kSm90, "triton-int8", "triton-int8"},
      {A::kSm100, "triton-int8", "triton-int8"}, {A::kSm120, "triton-int8", "triton-int8"}};
  // 0.33: `auto` writes only vLLM's pick for the float schemes (Marlin where vLLM runs it).
  const std::vector<ArchExpectation> mx033 = {
      {A::kSm80, "marlin-mxfp8", "marlin-mxfp8"},  {A::kSm86, "marlin-mxfp8", "marlin-mxfp8"},
      {A::kSm89, "marlin-mxfp8", "marlin-mxfp8"},  {A::kSm90, "", "humming"},
      {A::kSm100, "trtllm-mxfp8", "trtllm-mxfp8"}, {A::kSm120, "marlin-mxfp8", "marlin-mxfp8"}};
  // 2026-05: moepack's float Marlin rows follow vLLM 0.33.0 only, and MARLIN is judged by them.
  const std::vector<ArchExpectation> mx2605 = {{A::kSm80, "", ""},
                                               {A::kSm86, "", ""},
                                               {A::kSm89, "", ""},
                                               {A::kSm90, "", ""},
                                               {A::kSm100, "trtllm-mxfp8", "trtllm-mxfp8"},
                                               {A::kSm120, "", ""}};
  auto block = [](const std::string& on_sm80) {
    return std::vector<ArchExpectation>{{A::kSm80, on_sm80, on_sm80},
                                        {A::kSm86, on_sm80, on_sm80},
                                        {A::kSm89, "", "triton"},
                                        {A::kSm90, "", "triton"},
                                        {A::kSm100, "trtllm-fp8-block", "trtllm-fp8-block"},
                                        {A::kSm120, "", "deep_gemm"}};
  };
  return {
      {"gptq int4 g128", gptq(4, 128), v033, wna16("humming", "marlin")},
      {"gptq int4 g128", gptq(4, 128), v2605, wna16("marlin", "marlin")},
      {"awq g128", awq(128), v033, wna16("humming", "marlin")},
      {"awq g128", awq(128), v2605, wna16("marlin", "marlin")},
      {"ct w4a16 g32", ct_pack(4, 32), v033, wna16("humming", "flashinfer_trtllm")},
      {"ct w4a16 g32", ct_pack(4, 32), v2605, wna16("marlin", "flashinfer_trtllm")},
      // Channelwise compressed-tensors: vLLM 0.33's method asserts the group strategy off Marlin,
      // so its Humming path cannot load the layer (the humming row's reason says so).
      {"ct w8a16 channel", ct_pack(8, -1), v033, wna16("marlin", "marlin")},
      {"ct w8a8 dynamic", ct_w8a8(true), v033, int8},
      {"ct w8a8 dynamic", ct_w8a8(true), v2605, int8},
      {"modelopt mxfp8", mxfp8(), v033, mx033},
      {"ct mxfp8", mxfp8(QuantMethod::kCtMxfp8), v033, mx033},
      {"ct mxfp8", mxfp8(QuantMethod::kCtMxfp8), v2605, mx2605},
      {"fp8 block", fp8_block(), v033, block("marlin-fp8")},
      {"fp8 block", fp8_block(), v2605, block("")},
  };
}

TEST(Oracle, ChoiceAndVllmPickPerTargetArchScheme) {
  for (const OrderCase& c : order_cases()) {
    ASSERT_EQ(c.per_arch.size(), all_target_archs().size()) << c.label;
    for (const ArchExpectation& e : c.per_arch) {
      SCOPED_TRACE(c.label + " on " + target_arch_name(e.arch) + " for " +
                   vllm_target_name(c.target));
      OracleQuery q;
      q.quant = c.quant;
      q.experts = 8;
      q.hidden = 256;
      q.inter = 128;
      q.arch = e.arch;
      q.vllm_target = c.target;
      const OracleDecision d = choose_backend(q);
      SCOPED_TRACE(d.explain());
      EXPECT_EQ(d.chosen, e.chosen);
      EXPECT_EQ(d.vllm_would_pick, e.vllm_would_pick);
      // A note exactly where they differ, and the order is the target's for the scheme and arch.
      EXPECT_EQ(d.vllm_note.empty(), d.chosen == d.vllm_would_pick) << d.vllm_note;
      const VllmBackendOrder* order =
          vllm_backend_order(vllm_target_row(c.target), d.scheme, e.arch);
      ASSERT_NE(order, nullptr);
      ASSERT_EQ(d.vllm_order.size(), order->backends.size());
      for (size_t i = 0; i < d.vllm_order.size(); ++i) {
        EXPECT_EQ(d.vllm_order[i].backend, order->backends[i].name);
        EXPECT_EQ(d.vllm_order[i].vllm_runs, d.vllm_order[i].reasons.empty());
      }
      EXPECT_EQ(d.vllm_order_source, order->source);
    }
  }
}

// Where the layer decides: Marlin's shape rules, the act-order rule of 0.33 and the GPTQ route to
// FlashInfer's MxInt4 when vLLM's Marlin refuses the layer.
TEST(Oracle, VllmPickFollowsTheLayer) {
  OracleQuery q;
  q.experts = 8;
  q.hidden = 256;
  q.inter = 96;
  q.quant = gptq(4, 32);
  q.arch = TargetArch::kSm90;
  q.vllm_target = VllmTarget::kV2026_05;  // Marlin refuses I = 96, so moepack and vLLM take Triton
  OracleDecision d = choose_backend(q);
  EXPECT_EQ(d.chosen, "triton-wna16");
  EXPECT_EQ(d.vllm_would_pick, "triton-wna16");
  EXPECT_EQ(d.vllm_note, "");
  q.vllm_target = VllmTarget::kV0_33;  // vLLM 0.33 on SM90 runs Humming (N padded at the end)
  d = choose_backend(q);
  EXPECT_EQ(d.chosen, "humming");
  EXPECT_EQ(d.vllm_would_pick, "humming");

  // vLLM 0.33 takes no act-order MoE checkpoint: neither side runs anything, and no note.
  q.inter = 128;
  q.quant = gptq(4, 128, true, true);
  d = choose_backend(q);
  EXPECT_EQ(d.chosen, "");
  EXPECT_EQ(d.vllm_would_pick, "");
  EXPECT_EQ(d.vllm_note, "");
  EXPECT_TRUE(d.to_json()["vllm_would_pick"].is_null());
  for (const auto& v : d.vllm_order) EXPECT_FALSE(v.vllm_runs) << v.backend;

  // GPTQ int4 g32 with H % 128 != 0 on SM100: Marlin refuses the layer, vLLM 0.33's GPTQ method
  // falls back to MoeWNA16, whose first backend is FlashInfer's MxInt4; moepack writes Triton.
  q.quant = gptq(4, 32);
  q.hidden = 192;
  q.arch = TargetArch::kSm100;
  d = choose_backend(q);
  EXPECT_EQ(d.chosen, "triton-wna16");
  EXPECT_EQ(d.vllm_would_pick, "flashinfer_trtllm");
  for (const char* part : {"would run FLASHINFER_TRTLLM", "no trtllm-mxint4 layout yet",
                           "writes triton-wna16", "--moe-backend triton"})
    EXPECT_NE(d.vllm_note.find(part), std::string::npos) << part << " not in: " << d.vllm_note;
  q.hidden = 256;  // Marlin takes it: the GPTQ method declares bias and never tries MxInt4
  d = choose_backend(q);
  EXPECT_EQ(d.vllm_would_pick, "marlin");
  ASSERT_FALSE(d.vllm_order.empty());
  EXPECT_FALSE(d.vllm_order.front().vllm_runs);

  // No layout, nothing to convert: block FP8 on SM90 runs vLLM's Triton on the checkpoint as is.
  q.quant = fp8_block();
  q.arch = TargetArch::kSm90;
  d = choose_backend(q);
  EXPECT_EQ(d.chosen, "");
  EXPECT_EQ(d.vllm_would_pick, "triton");
  EXPECT_NE(d.vllm_note.find("serve the checkpoint as it is (--moe-backend triton)"),
            std::string::npos)
      << d.vllm_note;
}

// An explicit --backend is judged alone; the note still says what vLLM would run.
TEST(Oracle, ExplicitBackendBesideVllmPick) {
  OracleQuery q;
  q.quant = gptq(4, 128);
  q.hidden = 256;
  q.inter = 128;
  q.requested = "triton-wna16";
  q.vllm_target = VllmTarget::kV0_33;
  q.arch = TargetArch::kSm80;
  OracleDecision d = choose_backend(q);
  EXPECT_EQ(d.chosen, "triton-wna16");
  ASSERT_EQ(d.verdicts.size(), 1u);
  EXPECT_EQ(d.vllm_would_pick, "marlin");
  for (const char* part : {"would run MARLIN (moepack's marlin layout)",
                           "writes triton-wna16 (--backend triton-wna16)", "--moe-backend triton"})
    EXPECT_NE(d.vllm_note.find(part), std::string::npos) << part << " not in: " << d.vllm_note;
  q.requested = "marlin";
  d = choose_backend(q);
  EXPECT_EQ(d.chosen, "marlin");
  EXPECT_EQ(d.vllm_note, "");
}

// The backend of an order that vLLM calls `vllm_name`.
const VllmBackend* order_entry(const VllmBackendOrder& o, const std::string& vllm_name) {
  for (const auto& b : o.backends)
    if (vllm_name == b.name) return &b;
  return nullptr;
}

// The humming row is the one the order maps vLLM's HUMMING to, added with no oracle change:
// `auto` takes it where vLLM's order puts Humming first; elsewhere Marlin keeps its place ahead
// of it; without the row the same query writes Marlin.
TEST(Oracle, NewLayoutRowIsPickedWithNoOracleChange) {
  const VllmTargetRow& v033 = vllm_target_row(VllmTarget::kV0_33);
  const VllmBackendOrder* order = vllm_backend_order(v033, "wna16", TargetArch::kSm90);
  ASSERT_NE(order, nullptr);
  const VllmBackend* humming = order_entry(*order, "HUMMING");
  ASSERT_NE(humming, nullptr);
  ASSERT_NE(humming->layout, nullptr);
  const std::string name = humming->layout;
  ASSERT_NE(find_target_layout(name), nullptr) << "the registry has the row";

  OracleQuery q;
  q.quant = gptq(4, 128);
  q.hidden = 256;
  q.inter = 128;
  q.vllm_target = VllmTarget::kV0_33;
  q.arch = TargetArch::kSm90;
  OracleDecision d = choose_backend(q);
  EXPECT_EQ(d.chosen, name);
  EXPECT_EQ(d.vllm_would_pick, name);
  EXPECT_EQ(d.vllm_note, "");
  std::vector<std::string> got;
  for (const auto& v : d.verdicts) got.push_back(v.backend);
  EXPECT_EQ(got, (std::vector<std::string>{name, "marlin", "triton-wna16"}));
  // Without the row, the same query writes Marlin and says what vLLM would run.
  std::vector<TargetLayout> without;
  for (const auto& t : target_layouts())
    if (name != t.name) without.push_back(t);
  d = choose_backend(q, without);
  EXPECT_EQ(d.chosen, "marlin");
  EXPECT_NE(d.vllm_note.find("no humming layout yet"), std::string::npos) << d.vllm_note;

  q.arch = TargetArch::kSm100;  // Humming after Marlin and Triton
  d = choose_backend(q);
  EXPECT_EQ(d.chosen, "marlin");
  got.clear();
  for (const auto& v : d.verdicts) got.push_back(v.backend);
  EXPECT_EQ(got, (std::vector<std::string>{"marlin", "triton-wna16", name}));

  q.vllm_target = VllmTarget::kV2026_05;  // the spec's vLLM has no Humming: not a candidate
  d = choose_backend(q);
  EXPECT_EQ(d.chosen, "marlin");
  EXPECT_EQ(d.verdicts.size(), 2u);

  // --backend knows the row from the table it is given, and only from it.
  q.requested = name;
  q.vllm_target = VllmTarget::kV0_33;
  q.arch = TargetArch::kSm90;
  EXPECT_EQ(choose_backend(q).chosen, name);
  try {
    choose_backend(q, without);
    FAIL() << "expected kUsage";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUsage);
  }
}

// The order is data: a target row with Triton ahead of Marlin makes `auto` write Triton.
TEST(Oracle, BackendOrderIsData) {
  std::vector<VllmTargetRow> targets = vllm_target_rows();
  for (auto& t : targets)
    for (auto& o : t.moe_backend_orders) {
      if (std::string(o.scheme) != "wna16") continue;
      auto marlin = std::find_if(o.backends.begin(), o.backends.end(), [](const VllmBackend& b) {
        return std::string(b.name) == "MARLIN";
      });
      auto triton = std::find_if(o.backends.begin(), o.backends.end(), [](const VllmBackend& b) {
        return std::string(b.name) == "TRITON";
      });
      ASSERT_TRUE(marlin != o.backends.end() && triton != o.backends.end());
      std::iter_swap(marlin, triton);
    }
  OracleQuery q;
  q.quant = gptq(4, 128);
  q.hidden = 256;
  q.inter = 128;
  q.arch = TargetArch::kSm80;
  const OracleDecision d = choose_backend(q, target_layouts(), targets);
  EXPECT_EQ(d.chosen, "triton-wna16");
  EXPECT_EQ(d.vllm_would_pick, "triton-wna16");
  ASSERT_EQ(d.verdicts.size(), 3u);  // Triton, Marlin, then Humming (vLLM 0.33 off SM90)
  EXPECT_EQ(d.verdicts[0].backend, "triton-wna16");
  EXPECT_EQ(choose_backend(q).chosen, "marlin");
}

// The rows themselves: one order per (target, scheme a codec reads, arch); every layout row that
// takes the scheme is in it (else `auto` could never pick it); a backend moepack writes runs
// where its layout row says; no backend twice; every order says where it comes from.
TEST(VllmBackendOrders, CoverEverySchemeArchAndLayout) {
  std::set<std::string> schemes;
  for (const auto& c : source_codecs()) schemes.insert(c.scheme);
  for (const auto& target : vllm_target_rows()) {
    for (const auto& o : target.moe_backend_orders) {
      SCOPED_TRACE(std::string(target.name) + " " + o.scheme);
      EXPECT_TRUE(schemes.count(o.scheme)) << "no codec has this scheme";
      EXPECT_FALSE(std::string(o.source).empty());
      std::set<std::string> names;
      for (const auto& b : o.backends) {
        EXPECT_TRUE(names.insert(b.name).second) << b.name << " twice";
        EXPECT_FALSE(b.archs.empty()) << b.name;
        EXPECT_FALSE(std::string(b.reads).empty()) << b.name;
        const TargetLayout* t = b.layout ? find_target_layout(b.layout) : nullptr;
        if (t && std::find(t->schemes.begin(), t->schemes.end(), o.scheme) != t->schemes.end()) {
          EXPECT_EQ(b.archs, t->archs) << b.name << " vs layout " << t->name;
          EXPECT_EQ(b.vllm_refusals, nullptr) << b.name << ": judged by its layout row";
        }
      }
    }
    for (const std::string& scheme : schemes)
      for (TargetArch a : all_target_archs()) {
        SCOPED_TRACE(std::string(target.name) + " " + scheme + " " + target_arch_name(a));
        int n = 0;
        for (const auto& o : target.moe_backend_orders)
          n += scheme == o.scheme && std::count(o.archs.begin(), o.archs.end(), a);
        ASSERT_EQ(n, 1) << "orders for this (scheme, arch)";
        const VllmBackendOrder* o = vllm_backend_order(target, scheme, a);
        for (const auto& t : target_layouts()) {
          if (std::find(t.schemes.begin(), t.schemes.end(), scheme) == t.schemes.end()) continue;
          if (std::any_of(o->backends.begin(), o->backends.end(), [&](const VllmBackend& b) {
                return b.layout && std::string(b.layout) == t.name;
              }))
            continue;
          // Out of the order only where the layout writes nothing for this target: it refuses a
          // plain layer of every codec of the scheme (Humming for the spec's vLLM).
          for (const auto& c : source_codecs()) {
            if (scheme != c.scheme) continue;
            const QuantParams p = c.param_space().front();
            LayoutOptions lo;
            lo.vllm_target = target.target;
            lo.target_arch = a;
            lo.source_method = p.method;
            EXPECT_FALSE(t.unsupported_reasons(lo, moe_shape_for(p, 8, 256, 128, true)).empty())
                << t.name << " is in no place of the order but takes " << c.name;
          }
        }
      }
  }
}

// docs/oracle.md's table of orders is the rows, rendered: a row change that forgets the doc
// fails here and prints the table to paste.
std::string render_order_row(const VllmTargetRow& target, const VllmBackendOrder& o) {
  std::string archs, backends;
  for (TargetArch a : o.archs)
    archs += (archs.empty() ? "" : ", ") + std::string(target_arch_name(a));
  for (const auto& b : o.backends) {
    const TargetLayout* t = b.layout ? find_target_layout(b.layout) : nullptr;
    const bool writes =
        t && std::find(t->schemes.begin(), t->schemes.end(), o.scheme) != t->schemes.end();
    std::string cell = b.name;
    if (writes)
      cell = std::string("**") + b.name + "** `" + b.layout + "`";
    else if (b.layout)
      cell += std::string(" (`") + b.layout + "`: not yet)";
    else
      cell += " (as loaded)";
    backends += (backends.empty() ? "" : ", ") + cell;
  }
  return "| `" + std::string(target.name) + "` | `" + o.scheme + "` | " + archs + " | " + backends +
         " |";
}

TEST(VllmBackendOrders, DocTableMatchesTheRows) {
  std::string want;
  for (const auto& target : vllm_target_rows())
    for (const auto& o : target.moe_backend_orders) want += render_order_row(target, o) + "\n";
  std::ifstream f(test::source_dir() + "/docs/oracle.md");
  ASSERT_TRUE(f.good());
  std::string line, got;
  bool inside = false;
  while (std::getline(f, line)) {
    if (line == "<!-- vllm-orders:end -->") inside = false;
    if (inside && line.rfind("| `", 0) == 0) got += line + "\n";
    if (line == "<!-- vllm-orders:begin -->") inside = true;
  }
  EXPECT_EQ(got, want) << "docs/oracle.md, between the vllm-orders markers, should hold:\n" << want;
}

// gpt-oss on Blackwell: vLLM 0.33's _get_priority_backends_for_gpt_oss runs
// FLASHINFER_TRTLLM_MXFP4_BF16 first (no activation quantisation declared, so the BF16 variants);
// auto writes trtllm-mxfp4, the padded layer included. Not for the 2026-05 target (the row follows
// vLLM 0.33.0 only) and never for compressed-tensors MXFP4 (vLLM runs CUTLASS MXFP4 there).
TEST(Oracle, GptOssOnSm100WritesTrtllmMxfp4) {
  OracleQuery q;
  q.quant.method = QuantMethod::kGptOssMxfp4;
  q.quant.bits = 4;
  q.quant.group_size = 32;
  q.experts = 8;
  q.arch = TargetArch::kSm100;
  for (const auto& [h, i] : std::vector<std::pair<int64_t, int64_t>>{{256, 128}, {2880, 2880}}) {
    q.hidden = h;
    q.inter = i;
    const OracleDecision d = choose_backend(q);
    SCOPED_TRACE(d.explain());
    EXPECT_EQ(d.chosen, "trtllm-mxfp4");
    EXPECT_EQ(d.vllm_would_pick, "trtllm-mxfp4");
    ASSERT_FALSE(d.vllm_order.empty());
    EXPECT_EQ(d.vllm_order[0].backend, "FLASHINFER_TRTLLM_MXFP4_BF16");
    EXPECT_TRUE(d.vllm_order[0].vllm_runs);
    EXPECT_TRUE(d.vllm_order[0].moepack_writes);
  }
  q.vllm_target = VllmTarget::kV2026_05;
  EXPECT_EQ(choose_backend(q).chosen, "");
  q.vllm_target = VllmTarget::kV0_33;
  q.quant.method = QuantMethod::kCtMxfp4;
  const OracleDecision ct = choose_backend(q);
  EXPECT_NE(ct.chosen, "trtllm-mxfp4");
  q.requested = "trtllm-mxfp4";
  EXPECT_EQ(choose_backend(q).chosen, "");
}

// NVFP4 W4A4 on Blackwell: vLLM 0.33's select_nvfp4_moe_backend runs FLASHINFER_TRTLLM first
// (TrtLlmNvFp4Experts: kNvfp4Static weights, NVFP4 activations); auto writes trtllm-nvfp4 for
// ModelOpt and compressed-tensors W4A4, padded layers included. Never for weight-only NVFP4
// (NVFP4A16 / W4A16_NVFP4: no activation scales, TrtLlmNvFp4Experts refuses them), never on
// another arch, and not for the 2026-05 target (the row follows vLLM 0.33.0 only).
TEST(Oracle, Nvfp4W4a4OnSm100WritesTrtllmNvfp4) {
  OracleQuery q;
  q.quant.bits = 4;
  q.quant.group_size = 16;
  q.quant.dynamic_input = false;
  q.experts = 8;
  q.arch = TargetArch::kSm100;
  q.vllm_target = VllmTarget::kV0_33;
  for (QuantMethod m : {QuantMethod::kModeloptNvfp4, QuantMethod::kCtNvfp4})
    for (const auto& [h, i] : std::vector<std::pair<int64_t, int64_t>>{{256, 128}, {2880, 96}}) {
      q.quant.method = m;
      q.hidden = h;
      q.inter = i;
      const OracleDecision d = choose_backend(q);
      SCOPED_TRACE(d.explain());
      EXPECT_EQ(d.chosen, "trtllm-nvfp4");
      EXPECT_EQ(d.vllm_would_pick, "trtllm-nvfp4");
      ASSERT_FALSE(d.vllm_order.empty());
      EXPECT_EQ(d.vllm_order[0].backend, "FLASHINFER_TRTLLM");
      EXPECT_TRUE(d.vllm_order[0].moepack_writes);
    }
  q.quant.dynamic_input = true;  // weight-only
  const OracleDecision a16 = choose_backend(q);
  EXPECT_NE(a16.chosen, "trtllm-nvfp4") << a16.explain();
  q.requested = "trtllm-nvfp4";
  EXPECT_EQ(choose_backend(q).chosen, "");
  q.quant.dynamic_input = false;
  q.arch = TargetArch::kSm90;
  EXPECT_EQ(choose_backend(q).chosen, "");
  q.arch = TargetArch::kSm100;
  q.vllm_target = VllmTarget::kV2026_05;
  EXPECT_EQ(choose_backend(q).chosen, "");
  q.vllm_target = VllmTarget::kV0_33;
  EXPECT_EQ(choose_backend(q).chosen, "trtllm-nvfp4");
}

}  // namespace
}  // namespace moepack
