#include "formats/vllm_backends.h"

#include <algorithm>

namespace moepack {

namespace {

bool is_gated(const MoeShape& s) {
  return s.w13.n == 2 * s.inter();
}

bool has_act_order(const MoeShape& s) {
  return s.w13.act_order || s.w2.act_order;
}

std::string group_text(int64_t group_size) {
  return group_size > 0 ? "group size " + std::to_string(group_size) : "channelwise scales";
}

// check_moe_marlin_supports_config (quantization/utils/marlin_utils.py): whether the vLLM's
// GPTQ / AWQ method keeps the layer on Marlin instead of falling back to MoeWNA16. With tile
// padding (vLLM 0.33) the group size need only divide I; without it I % max(64, group) == 0.
bool vllm_marlin_takes_layer(const VllmTargetRow& target, const QuantParams& q, const MoeShape& s) {
  const int64_t g = q.group_size, h = s.hidden(), i = s.inter();
  const bool group_ok = g == -1 || g == 32 || g == 64 || g == 128;
  const bool shape_ok = target.marlin_pads_intermediate
                            ? h % 128 == 0 && (g <= 0 || i % g == 0)
                            : h % 128 == 0 && i % std::max<int64_t>(64, g) == 0;
  return group_ok && shape_ok;
}

void add_int4_group32_reasons(const QuantParams& q, const MoeShape& s,
                              std::vector<std::string>& r) {
  if (q.bits != 4 || q.group_size != 32)
    r.push_back(
        "FlashInfer's MxInt4 MoE takes 4-bit weights in groups of 32 (kInt4Static32); these "
        "are " +
        std::to_string(q.bits) + "-bit with " + group_text(q.group_size));
  if (!q.symmetric) r.push_back("FlashInfer's MxInt4 MoE takes no zero points");
  if (!is_gated(s)) r.push_back("FlashInfer's MxInt4 MoE takes gated experts only");
}

}  // namespace

std::vector<std::string> vllm033_wna16_mxint4_refusals(const VllmTargetRow& target,
                                                       const QuantParams& q, const MoeShape& s) {
  std::vector<std::string> r = wna16_act_order_refusals(target, q, s);
  add_int4_group32_reasons(q, s, r);
  if (q.method == QuantMethod::kAwq)
    r.push_back(
        "AWQ MoE checkpoints carry zero points, which FlashInfer's MxInt4 MoE does not "
        "take");
  if (q.method == QuantMethod::kGptq && vllm_marlin_takes_layer(target, q, s))
    r.push_back(std::string(target.follows) +
                " keeps this GPTQ layer on its GPTQ MoE method, which declares expert bias "
                "(may_have_bias) and so never tries FlashInfer's MxInt4 MoE");
  return r;
}

std::vector<std::string> spec_wna16_mxint4_refusals(const VllmTargetRow& target,
                                                    const QuantParams& q, const MoeShape& s) {
  std::vector<std::string> r = wna16_act_order_refusals(target, q, s);
  add_int4_group32_reasons(q, s, r);
  if (q.method != QuantMethod::kCtPackQuantized)
    r.push_back(std::string(target.follows) +
                " uses FlashInfer's MxInt4 MoE for compressed-tensors checkpoints only "
                "(../shared/spec wna16_marlin.md §7)");
  return r;
}

std::vector<std::string> wna16_act_order_refusals(const VllmTargetRow& target, const QuantParams&,
                                                  const MoeShape& s) {
  if (target.moe_act_order || !has_act_order(s)) return {};
  return {std::string(target.follows) +
          " takes no act-order MoE checkpoint (GPTQ desc_act, compressed-tensors actorder)"};
}

std::vector<std::string> vllm033_wna16_emulation_refusals(const VllmTargetRow& target,
                                                          const QuantParams& q, const MoeShape& s) {
  std::vector<std::string> r = wna16_act_order_refusals(target, q, s);
  if (q.bits != 4)
    r.push_back("the int4 emulation MoE takes 4-bit weights only; these are " +
                std::to_string(q.bits) + "-bit");
  if (q.method == QuantMethod::kGptq || q.method == QuantMethod::kAwq)
    r.push_back(std::string(target.follows) +
                "'s GPTQ / AWQ MoE methods try Marlin first and otherwise fall back to "
                "MoeWNA16, which excludes the int4 emulation");
  return r;
}

std::vector<std::string> gated_only_refusals(const VllmTargetRow&, const QuantParams&,
                                             const MoeShape& s) {
  if (is_gated(s)) return {};
  return {"its experts take gated layers only (_supports_no_act_and_mul is False)"};
}

}  // namespace moepack
