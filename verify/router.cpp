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

namespace {

// Best first; equal values go to the lower index (deterministic tie-breaking).
auto by_value_desc(const std::vector<double>* v) {
  return [v](int32_t a, int32_t b) {
    const double va = (*v)[static_cast<size_t>(a)], vb = (*v)[static_cast<size_t>(b)];
    return va > vb || (va == vb && a < b);
  };
}

// score[e] = softmax or sigmoid of the token's logits, in double.
void score_token(const float* row, int64_t E, RouterScoring scoring, std::vector<double>* score) {
  if (scoring == RouterScoring::kSoftmax) {
    double mx = row[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(row[e]));
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      (*score)[static_cast<size_t>(e)] = std::exp(static_cast<double>(row[e]) - mx);
      sum += (*score)[static_cast<size_t>(e)];
    }
    for (double& v : *score) v /= sum;
  } else {
    for (int64_t e = 0; e < E; ++e)
      (*score)[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-static_cast<double>(row[e])));
  }
}

// Sets choice[e] = -inf for the experts of groups not kept (the topk_group best group scores).
void mask_groups(const RouterConfig& cfg, std::vector<double>* choice) {
  const int64_t group_size = cfg.num_experts / cfg.n_group;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> group_value(static_cast<size_t>(cfg.n_group));
  for (int g = 0; g < cfg.n_group; ++g) {
    const double* c = choice->data() + static_cast<int64_t>(g) * group_size;
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
  std::vector<int32_t> group_order(static_cast<size_t>(cfg.n_group));
  std::iota(group_order.begin(), group_order.end(), 0);
  std::stable_sort(group_order.begin(), group_order.end(), by_value_desc(&group_value));
  std::vector<char> kept(static_cast<size_t>(cfg.n_group), 0);
  for (int i = 0; i < cfg.topk_group; ++i)
    kept[static_cast<size_t>(group_order[static_cast<size_t>(i)])] = 1;
  for (int64_t e = 0; e < cfg.num_experts; ++e)
    if (!kept[static_cast<size_t>(e / group_size)]) (*choice)[static_cast<size_t>(e)] = neg_inf;
}

// PhiMoE's sparsemixer in eval mode for one token: two rounds, each taking the best remaining
// logit m (lower id on ties) and weighting it by a softmax over the logits l of the round with
// (m - l) / max(|l|, m) <= 2 eps (the second round excludes the first expert).
void sparsemixer_token(const float* row, int64_t E, double eps, int32_t* ids, double* weights) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> live(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) live[static_cast<size_t>(e)] = row[e];
  for (int round = 0; round < 2; ++round) {
    int32_t best = -1;
    for (int64_t e = 0; e < E; ++e)
      if (live[static_cast<size_t>(e)] != neg_inf &&
          (best < 0 || live[static_cast<size_t>(e)] > live[static_cast<size_t>(best)]))
        best = static_cast<int32_t>(e);
    const double m = live[static_cast<size_t>(best)];
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      const double l = live[static_cast<size_t>(e)];
      if (l == neg_inf) continue;
      const double factor = std::max(std::fabs(static_cast<double>(row[e])), m);
      if ((m - row[e]) / factor > 2.0 * eps) continue;
      sum += std::exp(l - m);
    }
    ids[round] = best;
    weights[round] = 1.0 / sum;  // exp(m - m) / sum
    live[static_cast<size_t>(best)] = neg_inf;
  }
}

}  // namespace

Routing route(const std::vector<float>& logits, const std::vector<float>& correction_bias,
              const RouterConfig& cfg, const std::vector<float>& per_expert_scale) {
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
  if (cfg.has_per_expert_scale && per_expert_scale.size() != static_cast<size_t>(E))
    throw Error(ErrorCode::kMissingTensor, "", "per_expert_scale",
                "router needs a per-expert scale of " + std::to_string(E) + " values, got " +
                    std::to_string(per_expert_scale.size()));
  const bool use_bias = cfg.has_correction_bias;
  const bool grouped = cfg.group_score != GroupScore::kNone && cfg.topk_group < cfg.n_group;

  Routing r;
  r.tokens = T;
  r.top_k = cfg.top_k;
  r.expert_ids.resize(static_cast<size_t>(T * cfg.top_k));
  r.weights.resize(static_cast<size_t>(T * cfg.top_k));

  std::vector<double> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      if (!std::isfinite(row[e]))
        throw Error(ErrorCode::kBadValue, "", "router_logits",
                    "non-finite router logit at token " + std::to_string(t) + ", expert " +
                        std::to_string(e));
    }
    const size_t first = static_cast<size_t>(t * cfg.top_k);
    if (cfg.kind == RouterKind::kSparseMixer) {
      sparsemixer_token(row, E, cfg.jitter_eps, &r.expert_ids[first], &r.weights[first]);
      continue;
    }
    score_token(row, E, cfg.scoring, &score);
    for (int64_t e = 0; e < E; ++e)
      choice[static_cast<size_t>(e)] =
          score[static_cast<size_t>(e)] +
          (use_bias ? static_cast<double>(correction_bias[static_cast<size_t>(e)]) : 0.0);
    if (grouped) mask_groups(cfg, &choice);

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
      double w = score[static_cast<size_t>(e)] / denom * cfg.routed_scaling_factor;
      if (cfg.has_per_expert_scale)
        w *= static_cast<double>(per_expert_scale[static_cast<size_t>(e)]);
      r.expert_ids[first + static_cast<size_t>(k)] = e;
      r.weights[first + static_cast<size_t>(k)] = w;
    }
  }
  return r;
}

std::vector<float> router_input(const RouterConfig& cfg, const float* x, int64_t tokens,
                                int64_t hidden, const std::vector<float>& input_scale) {
  const size_t n = static_cast<size_t>(tokens * hidden);
  if (cfg.input == RouterInput::kHidden) return std::vector<float>(x, x + n);
  if (static_cast<int64_t>(input_scale.size()) != hidden)
    throw Error(ErrorCode::kBadShape, "", "router.scale",
                "router input scale holds " + std::to_string(input_scale.size()) +
                    " values, want [" + std::to_string(hidden) + "]");
  std::vector<float> out(n);
  const double root = 1.0 / std::sqrt(static_cast<double>(hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xr = x + t * hidden;
    double ms = 0.0;
    for (int64_t h = 0; h < hidden; ++h) ms += static_cast<double>(xr[h]) * xr[h];
    const double inv = 1.0 / std::sqrt(ms / static_cast<double>(hidden) + cfg.input_norm_eps);
    for (int64_t h = 0; h < hidden; ++h)
      out[static_cast<size_t>(t * hidden + h)] =
          static_cast<float>(xr[h] * inv * input_scale[static_cast<size_t>(h)] * root);
  }
  return out;
}

bool device_routable(const RouterConfig& c) {
  return c.kind == RouterKind::kTopK && c.input == RouterInput::kHidden &&
         !c.has_per_expert_scale && !c.weights_on_input;
}

Routing routing_from_device(const MoeDeviceRouting& d) {
  Routing r;
  r.tokens = d.tokens;
  r.top_k = d.top_k;
  r.expert_ids = d.expert_ids;
  r.weights = d.weights;
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
