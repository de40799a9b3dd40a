#include "verify/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace moepack::ref {

std::vector<int64_t> Routing::tokens_per_expert(int64_t experts) const {
  std::vector<int64_t> counts(static_cast<size_t>(experts), 0);
  for (int32_t e : expert_ids)
    if (e >= 0 && e < experts) ++counts[static_cast<size_t>(e)];
  return counts;
}

Routing route(const std::vector<float>& logits, const std::vector<float>& correction_bias,
              const RouterConfig& cfg) {
  cfg.validate();
  const int64_t E = cfg.num_experts;
  if (logits.size() % static_cast<size_t>(E) != 0)
    throw Error(ErrorCode::kBadShape, "", "router_logits",
                "logits hold " + std::to_string(logits.size()) +
                    " values, not a multiple of E=" + std::to_string(E));
  const int64_t T = static_cast<int64_t>(logits.size()) / E;
  if (cfg.has_correction_bias && correction_bias.size() != static_cast<size_t>(E))
    throw Error(ErrorCode::kMissingTensor, "", "e_score_correction_bias",
                "router needs a correction bias of " + std::to_string(E) + " values, got " +
                    std::to_string(correction_bias.size()));
  const bool use_bias = cfg.has_correction_bias;
  const int64_t group_size = E / cfg.n_group;
  const bool grouped = cfg.group_score != GroupScore::kNone && cfg.topk_group < cfg.n_group;

  Routing r;
  r.tokens = T;
  r.top_k = cfg.top_k;
  r.expert_ids.resize(static_cast<size_t>(T * cfg.top_k));
  r.weights.resize(static_cast<size_t>(T * cfg.top_k));

  std::vector<double> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::vector<double> group_value(static_cast<size_t>(cfg.n_group));
  std::vector<int32_t> group_order(static_cast<size_t>(cfg.n_group));
  std::vector<char> group_kept(static_cast<size_t>(cfg.n_group));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  // Best first; equal values go to the lower index (deterministic tie-breaking).
  auto by_value_desc = [](const std::vector<double>* v) {
    return [v](int32_t a, int32_t b) {
      const double va = (*v)[static_cast<size_t>(a)], vb = (*v)[static_cast<size_t>(b)];
      return va > vb || (va == vb && a < b);
    };
  };

  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      if (!std::isfinite(row[e]))
        throw Error(ErrorCode::kBadValue, "", "router_logits",
                    "non-finite router logit at token " + std::to_string(t) + ", expert " +
                        std::to_string(e));
    }
    if (cfg.scoring == RouterScoring::kSoftmax) {
      double mx = row[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(row[e]));
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        score[static_cast<size_t>(e)] = std::exp(static_cast<double>(row[e]) - mx);
        sum += score[static_cast<size_t>(e)];
      }
      for (double& v : score) v /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e)
        score[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-static_cast<double>(row[e])));
    }
    for (int64_t e = 0; e < E; ++e)
      choice[static_cast<size_t>(e)] =
          score[static_cast<size_t>(e)] +
          (use_bias ? static_cast<double>(correction_bias[static_cast<size_t>(e)]) : 0.0);

    if (grouped) {
      for (int g = 0; g < cfg.n_group; ++g) {
        const double* c = choice.data() + static_cast<int64_t>(g) * group_size;
        double v;
        if (cfg.group_score == GroupScore::kMax) {
          v = *std::max_element(c, c + group_size);
        } else {
          // Sum of the two best (a group of one expert contributes its only score).
          double best = neg_inf, second = neg_inf;
          for (int64_t i = 0; i < group_size; ++i) {
            if (c[i] > best) {
              second = best;
              best = c[i];
            } else if (c[i] > second) {
              second = c[i];
            }
          }
          v = group_size >= 2 ? best + second : best;
        }
        group_value[static_cast<size_t>(g)] = v;
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::stable_sort(group_order.begin(), group_order.end(), by_value_desc(&group_value));
      std::fill(group_kept.begin(), group_kept.end(), 0);
      for (int i = 0; i < cfg.topk_group; ++i)
        group_kept[static_cast<size_t>(group_order[static_cast<size_t>(i)])] = 1;
      for (int64_t e = 0; e < E; ++e)
        if (!group_kept[static_cast<size_t>(e / group_size)])
          choice[static_cast<size_t>(e)] = neg_inf;
    }

    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + cfg.top_k, order.end(),
                      by_value_desc(&choice));
    double sum = 0.0;
    for (int k = 0; k < cfg.top_k; ++k)
      sum += score[static_cast<size_t>(order[static_cast<size_t>(k)])];
    // transformers adds 1e-20 to the denominator (DeepSeek); softmax sums are never that small.
    const double denom = cfg.renormalize ? sum + 1e-20 : 1.0;
    for (int k = 0; k < cfg.top_k; ++k) {
      const int32_t e = order[static_cast<size_t>(k)];
      const size_t slot = static_cast<size_t>(t * cfg.top_k + k);
      r.expert_ids[slot] = e;
      r.weights[slot] = score[static_cast<size_t>(e)] / denom * cfg.routed_scaling_factor;
    }
  }
  return r;
}

MoeRouterSpec runtime_router_spec(const RouterConfig& c) {
  MoeRouterSpec s;
  s.experts = c.num_experts;
  s.top_k = c.top_k;
  s.sigmoid = c.scoring == RouterScoring::kSigmoid;
  s.renormalize = c.renormalize;
  s.n_group = c.n_group;
  s.topk_group = c.topk_group;
  s.group_score = c.group_score == GroupScore::kNone  ? 0
                  : c.group_score == GroupScore::kMax ? 1
                                                      : 2;
  s.routed_scaling_factor = c.routed_scaling_factor;
  s.correction_bias = c.has_correction_bias;
  return s;
}

}  // namespace moepack::ref
