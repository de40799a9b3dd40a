// Device code of the MoE router: logits, then per token the top-k experts and their weights.
// Mirrors verify/router.cpp (ref::router_logits and ref::route) operation for operation, with
// its precision choices, so that both route random hidden states the same way:
//   logits[t, e] = float(sum_h double(x[t, h]) * double(w[e, h]) + double(bias[e]))
//   score        = softmax over e in double (max subtracted) | sigmoid in double
//   choice       = score + double(correction_bias[e])              (selection only)
//   grouped      : group value = max | sum of the two best choices; keep topk_group groups
//                  (best first, ties to the lower group id); other experts' choice = -inf
//   top_k        : best choice first, ties to the lower expert id
//   weight       = score / (sum of the selected scores + 1e-20 if renormalize, else 1)
//                  * routed_scaling_factor
// Raw pointers only; one thread per token (E is at most a few hundred, T at most thousands).
#pragma once

#include <cstdint>

namespace moepack::kernels {

// ref::RouterConfig as plain numbers (kernels include no verify/ types).
struct RouterArgs {
  int64_t experts = 0;
  int top_k = 1;
  int sigmoid = 0;      // 0: softmax, 1: sigmoid
  int renormalize = 0;  // divide the selected weights by their sum
  int n_group = 1;
  int topk_group = 1;
  int group_score = 0;  // 0: none, 1: max, 2: sum of the top 2
  double routed_scaling_factor = 1.0;
  int use_correction_bias = 0;
};

// logits [T, E]; one thread per (t, e), the h sum in order.
__global__ void router_logits_kernel(const float* x, int64_t tokens, int64_t hidden,
                                     const float* weight, int64_t experts, const float* bias,
                                     float* logits) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * experts) return;
  const int64_t t = i / experts, e = i % experts;
  const float* xr = x + t * hidden;
  const float* wr = weight + e * hidden;
  double acc = 0.0;
  for (int64_t h = 0; h < hidden; ++h)
    acc += static_cast<double>(xr[h]) * static_cast<double>(wr[h]);
  logits[i] = static_cast<float>(acc + (bias ? static_cast<double>(bias[e]) : 0.0));
}

// The index of the best value among those not taken (ties: the lowest index); -1 if none left.
__device__ inline int64_t best_untaken(const double* v, const uint8_t* taken, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (taken[i]) continue;
    if (best < 0 || v[i] > v[best]) best = i;
  }
  return best;
}

// One thread per token. Scratch: score/choice/taken [T, E], group_value/group_taken [T, n_group].
// *bad_logit gets 1 + the flat index of the first non-finite logit a thread saw (the host reports
// the lowest, as ref::route names the first).
__global__ void route_kernel(const float* logits, int64_t tokens, RouterArgs a,
                             const float* correction_bias, double* score_buf, double* choice_buf,
                             uint8_t* taken_buf, double* group_buf, uint8_t* group_taken_buf,
                             int32_t* expert_ids, double* weights, unsigned long long* bad_logit) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const int64_t E = a.experts;
  const float* row = logits + t * E;
  double* score = score_buf + t * E;
  double* choice = choice_buf + t * E;
  uint8_t* taken = taken_buf + t * E;
  for (int64_t e = 0; e < E; ++e)
    if (!isfinite(row[e])) {
      atomicMin(bad_logit, static_cast<unsigned long long>(t * E + e) + 1ull);
      return;
    }
  if (!a.sigmoid) {
    double mx = row[0];
    for (int64_t e = 1; e < E; ++e) mx = fmax(mx, static_cast<double>(row[e]));
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      score[e] = exp(static_cast<double>(row[e]) - mx);
      sum += score[e];
    }
    for (int64_t e = 0; e < E; ++e) score[e] /= sum;
  } else {
    for (int64_t e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + exp(-static_cast<double>(row[e])));
  }
  for (int64_t e = 0; e < E; ++e) {
    choice[e] = score[e] + (a.use_correction_bias ? static_cast<double>(correction_bias[e]) : 0.0);
    taken[e] = 0;
  }
  const bool grouped = a.group_score != 0 && a.topk_group < a.n_group;
  if (grouped) {
    const int64_t group_size = E / a.n_group;
    double* gv = group_buf + t * a.n_group;
    uint8_t* gt = group_taken_buf + t * a.n_group;
    for (int g = 0; g < a.n_group; ++g) {
      const double* c = choice + g * group_size;
      double v;
      if (a.group_score == 1) {
        v = c[0];
        for (int64_t i = 1; i < group_size; ++i) v = c[i] > v ? c[i] : v;
      } else {
        double best = -INFINITY, second = -INFINITY;
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
      gv[g] = v;
      gt[g] = 0;
    }
    for (int i = 0; i < a.topk_group; ++i) gt[best_untaken(gv, gt, a.n_group)] = 1;
    for (int64_t e = 0; e < E; ++e)
      if (!gt[e / group_size]) choice[e] = -INFINITY;
  }
  int32_t* ids = expert_ids + t * a.top_k;
  double* w = weights + t * a.top_k;
  double sum = 0.0;
  for (int k = 0; k < a.top_k; ++k) {
    const int64_t e = best_untaken(choice, taken, E);
    taken[e] = 1;
    ids[k] = static_cast<int32_t>(e);
    sum += score[e];
  }
  const double denom = a.renormalize ? sum + 1e-20 : 1.0;
  for (int k = 0; k < a.top_k; ++k) w[k] = score[ids[k]] / denom * a.routed_scaling_factor;
}

}  // namespace moepack::kernels
