// The offline backend oracle, table-driven: (scheme, shape, target arch, explicit backend) ->
// the chosen backend, or the refusal with every candidate's reasons. The expectations follow
// vLLM's method selection (spec/wna16_marlin.md §7 "Method selection", §8-9; spec/mxfp8*.md):
// Marlin needs H % 128 == 0, I % max(64, group) == 0 and symmetric GPTQ; TRT-LLM-Gen kernels run
// only on SM100; W8A8 int8 needs dynamic activations.
#include "pipeline/oracle.h"

#include <gtest/gtest.h>

#include <algorithm>
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

std::vector<Case> cases() {
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
       {"trtllm-mxfp8"},
       {}},
      {"ct mxfp8 sm100 -> trtllm-mxfp8",
       mxfp8(QuantMethod::kCtMxfp8),
       256,
       128,
       sm100,
       "auto",
       "mxfp8",
       "trtllm-mxfp8",
       {"trtllm-mxfp8"},
       {}},
      {"mxfp8 sm90 -> refused (SM100)",
       mxfp8(),
       256,
       128,
       sm90,
       "auto",
       "mxfp8",
       "",
       {"trtllm-mxfp8"},
       {{"trtllm-mxfp8", "SM100"}}},
      {"mxfp8 I=96 sm100 -> refused (128)",
       mxfp8(),
       256,
       96,
       sm100,
       "auto",
       "mxfp8",
       "",
       {"trtllm-mxfp8"},
       {{"trtllm-mxfp8", "128"}}},
      {"fp8 block sm100 -> trtllm-fp8-block",
       fp8_block(),
       256,
       128,
       sm100,
       "auto",
       "fp8-block",
       "trtllm-fp8-block",
       {"trtllm-fp8-block"},
       {}},
      {"fp8 block sm90 -> refused",
       fp8_block(),
       256,
       128,
       sm90,
       "auto",
       "fp8-block",
       "",
       {"trtllm-fp8-block"},
       {{"trtllm-fp8-block", "SM100"}}},
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
       {"marlin", "triton-wna16"},
       {{"marlin", "--vllm-target 2026-05"}, {"triton-wna16", "act-order"}},
       VllmTarget::kV0_33},
      {"0.33: gptq g32 I=96 -> marlin (I padded to 128)",
       gptq(4, 32),
       256,
       96,
       sm90,
       "auto",
       "wna16",
       "marlin",
       {"marlin", "triton-wna16"},
       {},
       VllmTarget::kV0_33},
      {"0.33: gptq g128 I=64 -> triton (a group would straddle the padding)",
       gptq(4, 128),
       256,
       64,
       sm90,
       "auto",
       "wna16",
       "triton-wna16",
       {"marlin", "triton-wna16"},
       {{"marlin", "group_size=128"}},
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
      {"modelopt fp8 per-tensor -> refused",
       [] {
         QuantParams q;
         q.method = QuantMethod::kModeloptFp8;
         q.bits = 8;
         return q;
       }(),
       256,
       128,
       sm100,
       "auto",
       "fp8-per-tensor",
       "",
       {"none"},
       {{"none", ""}}},
  };
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

// vLLM 0.33 on SM90 would run Humming for WNA16; moepack writes Marlin and says so beside it.
TEST(Oracle, VllmOwnChoiceIsShownBesideTheChosenLayout) {
  OracleQuery q;
  q.quant = gptq(4, 128);
  q.hidden = 256;
  q.inter = 128;
  q.vllm_target = VllmTarget::kV0_33;
  q.arch = TargetArch::kSm90;
  OracleDecision d = choose_backend(q);
  EXPECT_EQ(d.chosen, "marlin");
  EXPECT_EQ(d.vllm_would_pick, "humming");
  EXPECT_NE(d.explain().find("prioritize_humming"), std::string::npos) << d.explain();
  EXPECT_EQ(d.to_json()["vllm_would_pick"], "humming");
  for (const auto& [target, arch] : {std::make_pair(VllmTarget::kV0_33, TargetArch::kSm100),
                                     std::make_pair(VllmTarget::kV2026_05, TargetArch::kSm90)}) {
    q.vllm_target = target;
    q.arch = arch;
    d = choose_backend(q);
    EXPECT_EQ(d.vllm_would_pick, "");
    EXPECT_EQ(d.to_json()["vllm_would_pick"], "marlin");
  }
}

TEST(Oracle, TargetArchNames) {
  EXPECT_EQ(parse_target_arch("sm90a"), TargetArch::kSm90);
  EXPECT_EQ(parse_target_arch("sm100"), TargetArch::kSm100);
  for (TargetArch a : {TargetArch::kSm80, TargetArch::kSm89, TargetArch::kSm90, TargetArch::kSm100,
                       TargetArch::kSm120})
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

}  // namespace
}  // namespace moepack
