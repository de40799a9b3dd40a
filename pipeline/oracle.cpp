#include "pipeline/oracle.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/half.h"

namespace moepack {

TargetArch parse_target_arch(const std::string& s) {
  if (s == "sm80") return TargetArch::kSm80;
  if (s == "sm89") return TargetArch::kSm89;
  if (s == "sm90" || s == "sm90a") return TargetArch::kSm90;
  if (s == "sm100" || s == "sm100a") return TargetArch::kSm100;
  if (s == "sm120") return TargetArch::kSm120;
  throw Error(ErrorCode::kUsage,
              "unknown --target-arch \"" + s + "\" (sm80, sm89, sm90, sm100, sm120)");
}

const char* target_arch_name(TargetArch a) {
  switch (a) {
    case TargetArch::kSm80:
      return "sm80";
    case TargetArch::kSm89:
      return "sm89";
    case TargetArch::kSm90:
      return "sm90";
    case TargetArch::kSm100:
      return "sm100";
    case TargetArch::kSm120:
      return "sm120";
  }
  return "?";
}

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> b = {"marlin", "triton-wna16", "triton-int8",
                                             "trtllm-mxfp8", "trtllm-fp8-block"};
  return b;
}

MoeExperts probe_experts(const QuantParams& q, int64_t hidden, int64_t inter, bool gated,
                         int act_order_w13, int act_order_w2) {
  auto make = [&](int64_t n, int64_t k, bool act_order) {
    QuantTensor t;
    t.experts = 1;
    t.n = n;
    t.k = k;
    t.bits = q.bits;
    t.symmetric = q.symmetric;
    switch (q.method) {
      case QuantMethod::kCtIntQuantized:
        t.kind = CodeKind::kInt;
        t.group_size = -1;
        t.scale_dtype = DType::kF32;
        break;
      case QuantMethod::kModeloptMxfp8:
      case QuantMethod::kCtMxfp8:
        t.kind = CodeKind::kFp8E4M3;
        t.group_size = 32;
        t.scale_dtype = DType::kU8;
        break;
      case QuantMethod::kFp8Block:
        t.kind = CodeKind::kFp8E4M3;
        t.group_size = q.block_k;
        t.scale_block_n = q.block_n;
        t.scale_dtype = DType::kF32;
        break;
      default:
        t.kind = CodeKind::kUint;
        t.group_size = q.group_size;
        t.scale_dtype = q.method == QuantMethod::kCtPackQuantized ? q.dtype : DType::kF16;
        break;
    }
    const int64_t G = t.groups(), SR = t.scale_rows();
    t.codes.assign(static_cast<size_t>(n * k), t.kind == CodeKind::kUint ? 1 : 0x38);
    t.scales.assign(static_cast<size_t>(SR * G * t.scale_bytes()), 0);
    for (int64_t i = 0; i < SR * G; ++i) {
      uint8_t* p = t.scales.data() + i * t.scale_bytes();
      switch (t.scale_dtype) {
        case DType::kF16: {
          const uint16_t h = float_to_f16(0.01f);
          std::memcpy(p, &h, 2);
          break;
        }
        case DType::kBF16: {
          const uint16_t h = float_to_bf16(0.01f);
          std::memcpy(p, &h, 2);
          break;
        }
        case DType::kF32: {
          const float f = 0.01f;
          std::memcpy(p, &f, 4);
          break;
        }
        default:
          *p = 120;
          break;  // E8M0 2^-7
      }
    }
    if (!t.symmetric) t.zeros.assign(static_cast<size_t>(n * G), 8);
    if (act_order && t.kind == CodeKind::kUint && t.groups() > 1) {
      // A non-monotonic g_idx: the act-order case as the kernels see it.
      const int64_t gs = t.group_size > 0 ? t.group_size : k;
      t.g_idx.resize(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i)
        t.g_idx[static_cast<size_t>(i)] = static_cast<int32_t>((k - 1 - i) / gs);
    }
    return t;
  };
  MoeExperts m;
  m.w13 =
      make(gated ? 2 * inter : inter, hidden, act_order_w13 < 0 ? q.act_order : act_order_w13 != 0);
  m.w2 = make(hidden, inter, act_order_w2 < 0 ? q.act_order : act_order_w2 != 0);
  return m;
}

namespace {

std::vector<std::string> split_reasons(const std::string& msg) {
  std::vector<std::string> out;
  // Layouts format their refusals either as "header:\n  - reason\n  - reason" or as
  // "header: reason; reason"; each reason is one entry either way.
  const std::string bullet = "\n  - ";
  if (msg.find(bullet) != std::string::npos) {
    size_t pos = msg.find(bullet);
    while (pos != std::string::npos) {
      const size_t start = pos + bullet.size();
      pos = msg.find(bullet, start);
      std::string part =
          msg.substr(start, pos == std::string::npos ? std::string::npos : pos - start);
      if (!part.empty()) out.push_back(part);
    }
    return out;
  }
  size_t start = 0;
  while (start <= msg.size()) {
    const size_t pos = msg.find("; ", start);
    std::string part =
        msg.substr(start, pos == std::string::npos ? std::string::npos : pos - start);
    if (!part.empty()) out.push_back(part);
    if (pos == std::string::npos) break;
    start = pos + 2;
  }
  return out;
}

// Asks the layout itself: packing a one-expert probe throws kUnsupported with every reason.
std::vector<std::string> layout_reasons(const std::string& backend, const OracleQuery& q) {
  const TargetLayout* layout = find_target_layout(backend);
  if (!layout) return {"backend " + backend + " is not built into this moepack"};
  LayoutOptions opts = q.layout;
  opts.gated = q.gated;
  opts.source_method = q.quant.method;
  opts.threads = 1;
  try {
    layout->pack(opts, probe_experts(q.quant, q.hidden, q.inter, q.gated));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kUnsupported || e.code() == ErrorCode::kBadShape ||
        e.code() == ErrorCode::kBadValue)
      return split_reasons(e.message());
    throw;
  }
  return {};
}

}  // namespace

OracleDecision choose_backend(const OracleQuery& q) {
  OracleDecision d;
  std::vector<std::string> candidates;
  std::vector<std::string> scheme_reasons;  // apply to every candidate
  const bool sm100 = q.arch == TargetArch::kSm100;
  switch (q.quant.method) {
    case QuantMethod::kGptq:
    case QuantMethod::kAwq:
    case QuantMethod::kCtPackQuantized:
      d.scheme = "wna16";
      candidates = {"marlin", "triton-wna16"};
      break;
    case QuantMethod::kCtIntQuantized:
      d.scheme = "w8a8-int8";
      candidates = {"triton-int8"};
      if (!q.quant.dynamic_input)
        scheme_reasons.push_back(
            "static input scales are not supported (vLLM's W8A8 int8 MoE needs "
            "dynamic per-token activations)");
      break;
    case QuantMethod::kModeloptMxfp8:
    case QuantMethod::kCtMxfp8:
      d.scheme = "mxfp8";
      candidates = {"trtllm-mxfp8"};
      break;
    case QuantMethod::kFp8Block:
      d.scheme = "fp8-block";
      candidates = {"trtllm-fp8-block"};
      break;
    case QuantMethod::kModeloptFp8:
      d.scheme = "fp8-per-tensor";
      break;
    case QuantMethod::kNone:
      d.scheme = "unquantized";
      break;
  }
  auto arch_reasons = [&](const std::string& b) {
    std::vector<std::string> r;
    if ((b == "trtllm-mxfp8" || b == "trtllm-fp8-block") && !sm100)
      r.push_back(std::string("FlashInfer TRT-LLM-Gen MoE kernels run only on the SM100 family "
                              "(Blackwell); target is ") +
                  target_arch_name(q.arch));
    return r;
  };
  auto judge = [&](const std::string& b) {
    BackendVerdict v;
    v.backend = b;
    v.reasons = scheme_reasons;
    for (auto& r : arch_reasons(b)) v.reasons.push_back(r);
    if (std::find(candidates.begin(), candidates.end(), b) == candidates.end())
      v.reasons.push_back("backend " + b + " does not take " + d.scheme + " experts (" +
                          quant_method_name(q.quant.method) + ")");
    else
      for (auto& r : layout_reasons(b, q)) v.reasons.push_back(r);
    v.supported = v.reasons.empty();
    return v;
  };

  if (q.requested != "auto") {
    if (std::find(backend_names().begin(), backend_names().end(), q.requested) ==
        backend_names().end()) {
      std::string list = "auto";
      for (const auto& b : backend_names()) list += ", " + b;
      throw Error(ErrorCode::kUsage, "unknown --backend \"" + q.requested + "\" (" + list + ")");
    }
    d.verdicts.push_back(judge(q.requested));
  } else {
    for (const auto& b : candidates) d.verdicts.push_back(judge(b));
    if (candidates.empty()) {
      BackendVerdict v;
      v.backend = "none";
      v.reasons.push_back(d.scheme == "unquantized"
                              ? "unquantized experts need no kernel layout conversion (use "
                                "--quantize mxfp8 to produce MXFP8 experts)"
                              : "no moepack backend converts " + d.scheme + " experts (" +
                                    quant_method_name(q.quant.method) + ")");
      d.verdicts.push_back(v);
    }
  }
  for (const auto& v : d.verdicts)
    if (v.supported) {
      d.chosen = v.backend;
      break;
    }
  return d;
}

nlohmann::json OracleDecision::to_json() const {
  nlohmann::json j;
  j["scheme"] = scheme;
  j["chosen"] = chosen.empty() ? nlohmann::json(nullptr) : nlohmann::json(chosen);
  j["candidates"] = nlohmann::json::array();
  for (const auto& v : verdicts)
    j["candidates"].push_back(
        {{"backend", v.backend}, {"supported", v.supported}, {"reasons", v.reasons}});
  return j;
}

std::string OracleDecision::explain() const {
  std::ostringstream s;
  s << "scheme " << scheme << ": " << (chosen.empty() ? "no backend" : "backend " + chosen) << "\n";
  for (const auto& v : verdicts) {
    s << "  " << (v.supported ? "+ " : "- ") << v.backend;
    if (v.supported) s << (v.backend == chosen ? " (chosen)" : " (also possible)");
    s << "\n";
    for (const auto& r : v.reasons) s << "      " << r << "\n";
  }
  return s.str();
}

}  // namespace moepack
