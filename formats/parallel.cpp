#include "formats/parallel.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace moepack {

namespace {

std::string num(int64_t v) {
  return std::to_string(v);
}

// Copies `count` items of `width` bytes: src item (first + i) -> dst item (to + i).
void copy_items(const std::vector<uint8_t>& src, int64_t first, std::vector<uint8_t>& dst,
                int64_t to, int64_t count, int64_t width) {
  if (count <= 0 || width <= 0) return;
  std::memcpy(dst.data() + to * width, src.data() + first * width,
              static_cast<size_t>(count * width));
}

}  // namespace

const char* expert_placement_name(ExpertPlacement p) {
  return p == ExpertPlacement::kRoundRobin ? "round_robin" : "linear";
}

std::optional<ExpertPlacement> expert_placement_from_name(const std::string& name) {
  if (name == "linear") return ExpertPlacement::kLinear;
  if (name == "round_robin") return ExpertPlacement::kRoundRobin;
  return std::nullopt;
}

int64_t Parallelism::local_experts(int64_t experts, int rank) const {
  if (expert <= 1) return experts;
  const int64_t base = experts / expert, rem = experts % expert;
  return base + (rank < rem ? 1 : 0);
}

std::vector<int64_t> Parallelism::rank_experts(int64_t experts, int rank) const {
  std::vector<int64_t> ids;
  if (expert <= 1) {
    for (int64_t g = 0; g < experts; ++g) ids.push_back(g);
    return ids;
  }
  if (placement == ExpertPlacement::kRoundRobin) {
    for (int64_t g = rank; g < experts; g += expert) ids.push_back(g);
    return ids;
  }
  const int64_t base = experts / expert, rem = experts % expert;
  const int64_t start = rank * base + std::min<int64_t>(rank, rem);
  for (int64_t i = 0; i < local_experts(experts, rank); ++i) ids.push_back(start + i);
  return ids;
}

std::pair<int, int64_t> Parallelism::expert_owner(int64_t experts, int64_t g) const {
  if (expert <= 1) return {0, g};
  if (placement == ExpertPlacement::kRoundRobin) return {static_cast<int>(g % expert), g / expert};
  const int64_t base = experts / expert, rem = experts % expert;
  if (g < rem * (base + 1)) return {static_cast<int>(g / (base + 1)), g % (base + 1)};
  const int64_t rest = g - rem * (base + 1);
  return {static_cast<int>(rem + rest / base), rest % base};
}

int64_t Parallelism::local_before(int64_t experts, int rank, int64_t g) const {
  if (expert <= 1) return std::min(g, experts);
  int64_t n = 0;
  for (int64_t id : rank_experts(experts, rank)) n += id < g;
  return n;
}

std::string Parallelism::describe() const {
  if (tensor > 1) return "tensor parallel " + std::to_string(tensor);
  if (expert > 1)
    return "expert parallel " + std::to_string(expert) + " (" + expert_placement_name(placement) +
           ")";
  return "whole experts";
}

std::vector<std::string> tp_canonical_reasons(const LayoutOptions&, const MoeShape& x, int tp) {
  std::vector<std::string> why;
  const int64_t I = x.inter();
  if (tp < 2) return why;
  if (I % tp != 0) {
    why.push_back("intermediate size I=" + num(I) +
                  " is not a multiple of the tensor-parallel size " + num(tp) +
                  " (vLLM 0.33's FusedMoEConfig asserts intermediate_size % tp_size == 0)");
    return why;
  }
  const int64_t ip = I / tp;
  const std::string per_rank = "I / tp = " + num(I) + " / " + num(tp) + " = " + num(ip);
  const QuantSpec& q2 = x.w2.quant;
  if (q2.group_size > 0 && ip % q2.group_size != 0)
    why.push_back(
        "w2: a scale group of group_size " + num(q2.group_size) + " would straddle two ranks (" +
        per_rank +
        " is not a multiple of it; vLLM 0.33's Marlin MoE and compressed-tensors WNA16 refuse it; "
        "for FP8 blocks it pads or refines the blocks, which moepack does not write)");
  const QuantSpec& q13 = x.w13.quant;
  if (q13.scale_block_n > 1 && ip % q13.scale_block_n != 0)
    why.push_back("w13: a block of " + num(q13.scale_block_n) +
                  " rows sharing a scale would straddle two ranks (" + per_rank +
                  " is not a multiple of it; vLLM 0.33 then pads the rank's shard to whole "
                  "blocks or refines the block grid, which moepack does not write)");
  for (const QuantSpec* q : {&q13, &q2})
    if (q->kind == CodeKind::kUint && q->bits > 0 && q->bits < 32 && ip % (32 / q->bits) != 0) {
      why.push_back(per_rank + " is not a multiple of the " + num(32 / q->bits) +
                    " codes a checkpoint int32 word packs along I: vLLM's loader would cut "
                    "packed words between ranks");
      break;
    }
  if (x.w13.act_order || x.w2.act_order)
    why.push_back(
        "act-order (g_idx) experts are not split over ranks (vLLM 0.33 takes no act-order MoE "
        "checkpoints; a rank's w2 g_idx is not modelled)");
  return why;
}

MoeExperts tp_canonical_split(const MoeExperts& whole, bool gated, int tp, int rank) {
  const QuantTensor &w13 = whole.w13, &w2 = whole.w2;
  const int64_t E = w13.experts, H = w13.k, I = w2.k, shards = gated ? 2 : 1;
  if (tp < 1 || rank < 0 || rank >= tp || I % tp != 0 || w13.n != shards * I)
    throw Error(ErrorCode::kInternal, "", "w13",
                "tensor-parallel split of I=" + num(I) + " over " + num(tp) + " ranks (rank " +
                    num(rank) + ")");
  if (!w2.g_idx.empty())
    throw Error(ErrorCode::kInternal, "", "w2_g_idx", "act-order experts are not split");
  const int64_t ip = I / tp, sbn = w13.scale_block_n;
  MoeExperts out;
  // w13: each shard's rows [rank ip, (rank + 1) ip); scale rows by blocks of scale_block_n.
  out.w13 = QuantTensor(w13.spec(), E, shards * ip, H);
  out.w13.g_idx = w13.g_idx;  // along H: unchanged by the split
  const int64_t G13 = w13.groups(), sb13 = w13.scale_bytes();
  const int64_t rows13 = w13.scale_rows(), rows13p = out.w13.scale_rows();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t s = 0; s < shards; ++s) {
      const int64_t from = e * shards * I + s * I + rank * ip, to = e * shards * ip + s * ip;
      copy_items(w13.codes, from, out.w13.codes, to, ip, H);
      if (!w13.symmetric) copy_items(w13.zeros, from, out.w13.zeros, to, ip, G13);
      const int64_t sfrom = e * rows13 + (s * I + rank * ip) / sbn;
      const int64_t sto = e * rows13p + s * ip / sbn;
      copy_items(w13.scales, sfrom, out.w13.scales, sto, ip / sbn, G13 * sb13);
    }
  // NVFP4's second-level scales are per expert (and per gate/up shard): every rank holds them.
  out.w13.global_scales = w13.global_scales;
  out.w13.input_scales = w13.input_scales;
  out.w13.global_shards = w13.global_shards;
  // w2: K columns [rank ip, (rank + 1) ip) and their groups; one group (channelwise) stays whole.
  out.w2 = QuantTensor(w2.spec(), E, w2.n, ip);
  const int64_t G2 = w2.groups(), G2p = out.w2.groups(), sb2 = w2.scale_bytes();
  const int64_t g0 = G2 == 1 ? 0 : rank * G2p;
  for (int64_t row = 0; row < E * w2.n; ++row)
    copy_items(w2.codes, row * I + rank * ip, out.w2.codes, row * ip, ip, 1);
  for (int64_t row = 0; row < E * w2.scale_rows(); ++row)
    copy_items(w2.scales, row * G2 + g0, out.w2.scales, row * G2p, G2p, sb2);
  if (!w2.symmetric)
    for (int64_t row = 0; row < E * w2.n; ++row)
      copy_items(w2.zeros, row * G2 + g0, out.w2.zeros, row * G2p, G2p, 1);
  out.w2.global_scales = w2.global_scales;
  out.w2.input_scales = w2.input_scales;
  out.w2.global_shards = w2.global_shards;
  out.w13.check_consistent("w13 of rank " + num(rank));
  out.w2.check_consistent("w2 of rank " + num(rank));
  return out;
}

MoeExperts tp_canonical_merge(const std::vector<MoeExperts>& ranks, bool gated) {
  const int tp = static_cast<int>(ranks.size());
  if (tp < 1) throw Error(ErrorCode::kInternal, "", "w13", "merge of no ranks");
  const QuantTensor &r13 = ranks[0].w13, &r2 = ranks[0].w2;
  const int64_t E = r13.experts, H = r13.k, ip = r2.k, I = ip * tp, shards = gated ? 2 : 1;
  const int64_t sbn = r13.scale_block_n;
  MoeExperts out;
  out.w13 = QuantTensor(r13.spec(), E, shards * I, H);
  out.w13.g_idx = r13.g_idx;
  out.w2 = QuantTensor(r2.spec(), E, r2.n, I);
  // Every rank holds the experts' second-level scales whole: rank 0's.
  out.w13.global_scales = r13.global_scales;
  out.w13.input_scales = r13.input_scales;
  out.w13.global_shards = r13.global_shards;
  out.w2.global_scales = r2.global_scales;
  out.w2.input_scales = r2.input_scales;
  out.w2.global_shards = r2.global_shards;
  const int64_t G13 = r13.groups(), sb13 = r13.scale_bytes();
  const int64_t rows13 = out.w13.scale_rows(), rows13p = r13.scale_rows();
  const int64_t G2 = out.w2.groups(), G2p = r2.groups(), sb2 = r2.scale_bytes();
  for (int r = 0; r < tp; ++r) {
    const QuantTensor &w13 = ranks[static_cast<size_t>(r)].w13,
                      &w2 = ranks[static_cast<size_t>(r)].w2;
    if (w13.experts != E || w13.n != shards * ip || w13.k != H || w2.k != ip || w2.n != r2.n)
      throw Error(ErrorCode::kBadShape, "", "w13",
                  "rank " + num(r) + "'s experts do not match rank 0's shape");
    for (int64_t e = 0; e < E; ++e)
      for (int64_t s = 0; s < shards; ++s) {
        const int64_t to = e * shards * I + s * I + r * ip, from = e * shards * ip + s * ip;
        copy_items(w13.codes, from, out.w13.codes, to, ip, H);
        if (!w13.symmetric) copy_items(w13.zeros, from, out.w13.zeros, to, ip, G13);
        copy_items(w13.scales, e * rows13p + s * ip / sbn, out.w13.scales,
                   e * rows13 + (s * I + r * ip) / sbn, ip / sbn, G13 * sb13);
      }
    const int64_t g0 = G2 == 1 ? 0 : r * G2p;
    if (G2 == 1 && r > 0) continue;  // codes below; scales and zeros whole on rank 0
    for (int64_t row = 0; row < E * w2.scale_rows(); ++row)
      copy_items(w2.scales, row * G2p, out.w2.scales, row * G2 + g0, G2p, sb2);
    if (!w2.symmetric)
      for (int64_t row = 0; row < E * w2.n; ++row)
        copy_items(w2.zeros, row * G2p, out.w2.zeros, row * G2 + g0, G2p, 1);
  }
  for (int r = 0; r < tp; ++r)
    for (int64_t row = 0; row < E * r2.n; ++row)
      copy_items(ranks[static_cast<size_t>(r)].w2.codes, row * ip, out.w2.codes, row * I + r * ip,
                 ip, 1);
  out.w13.check_consistent("merged w13");
  out.w2.check_consistent("merged w2");
  return out;
}

MoeShape rank_shape(const MoeShape& whole, const Parallelism& p, int rank) {
  MoeShape s = whole;
  s.experts = p.local_experts(whole.experts, rank);
  if (p.tensor > 1 && whole.inter() > 0) {
    const int64_t shards = whole.w13.n / whole.inter();
    const int64_t ip = p.rank_inter(whole.inter());
    s.w13.n = shards * ip;
    s.w2.k = ip;
  }
  return s;
}

LayoutOptions rank_layout_options(const LayoutOptions& whole, const Parallelism& p) {
  LayoutOptions o = whole;
  if (o.inter > 0) o.inter = p.rank_inter(o.inter);
  return o;
}

bool written_whole_only(QuantMethod source) {
  return source == QuantMethod::kGptOssMxfp4;
}

std::vector<std::string> parallel_reasons(const TargetLayout& row, const LayoutOptions& lo,
                                          const MoeShape& shape, const Parallelism& p) {
  std::vector<std::string> why;
  if (p.whole()) return why;
  if (p.tensor > 1 && p.expert > 1) {
    why.push_back("tensor parallel " + std::to_string(p.tensor) + " and expert parallel " +
                  std::to_string(p.expert) +
                  " at once: vLLM 0.33 splits a MoE layer one way (with "
                  "expert parallelism its MoE tp_size is 1)");
    return why;
  }
  if (written_whole_only(lo.source_method)) {
    // vLLM's gpt-oss loader narrows the interleaved gate/up rows in pairs and loads w2's bias
    // on rank 0 only (_load_weights_mxfp4); moepack's parallel writers do not model that.
    why.push_back(
        "gpt-oss experts (interleaved gate/up, expert biases) are written for one rank "
        "only: vLLM 0.33's gpt-oss loader splits them its own way (_load_weights_mxfp4)");
    return why;
  }
  if (row.tensor_parallel.unsupported) {
    why.push_back(std::string(row.name) + " is not written for " + p.describe() + ": " +
                  row.tensor_parallel.unsupported);
    return why;
  }
  std::string label;
  if (p.tensor > 1) {
    const TensorParallelSplit& tp = row.tensor_parallel;
    if (!tp.reasons || !tp.split) {
      why.push_back(std::string("layout ") + row.name +
                    " has no tensor-parallel split rule (TargetLayout::tensor_parallel, "
                    "formats/registry.cpp)");
      return why;
    }
    why = tp.reasons(lo, shape, p.tensor);
    if (!why.empty()) return why;
    label = "per rank (tensor parallel " + std::to_string(p.tensor) +
            ", I=" + num(p.rank_inter(shape.inter())) + "): ";
  } else if (shape.experts < p.expert) {
    why.push_back("expert parallel " + std::to_string(p.expert) + " over " + num(shape.experts) +
                  " experts: ranks " + num(shape.experts) + ".." + num(p.expert - 1) +
                  " would hold no expert");
    return why;
  }
  std::set<int64_t> local_counts;
  for (int r = 0; r < p.ranks(); ++r) local_counts.insert(p.local_experts(shape.experts, r));
  const LayoutOptions ro = rank_layout_options(lo, p);
  std::set<std::string> seen;
  for (int64_t count : local_counts) {
    MoeShape s = rank_shape(shape, p, 0);
    s.experts = count;
    const std::string prefix = p.tensor > 1
                                   ? label
                                   : "per rank (expert parallel " + std::to_string(p.expert) +
                                         ", " + num(count) + " experts): ";
    for (const auto& r : row.unsupported_reasons(ro, s))
      if (seen.insert(r).second) why.push_back(prefix + r);
  }
  return why;
}

QuantTensor concat_experts(const std::vector<QuantTensor>& parts) {
  if (parts.empty()) return QuantTensor();
  QuantTensor out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const QuantTensor& q = parts[i];
    if (q.n != out.n || q.k != out.k ||
        q.scales.size() * static_cast<size_t>(parts[0].experts) !=
            parts[0].scales.size() * static_cast<size_t>(q.experts))
      throw Error(ErrorCode::kBadShape, "", "experts", "experts of different shapes");
    out.experts += q.experts;
    out.codes.insert(out.codes.end(), q.codes.begin(), q.codes.end());
    out.scales.insert(out.scales.end(), q.scales.begin(), q.scales.end());
    out.zeros.insert(out.zeros.end(), q.zeros.begin(), q.zeros.end());
    out.g_idx.insert(out.g_idx.end(), q.g_idx.begin(), q.g_idx.end());
    out.global_scales.insert(out.global_scales.end(), q.global_scales.begin(),
                             q.global_scales.end());
    out.input_scales.insert(out.input_scales.end(), q.input_scales.begin(), q.input_scales.end());
  }
  out.check_consistent("concatenated experts");
  return out;
}

int64_t chunk_experts(const Parallelism& p, int64_t experts, int rank, int64_t e0, int64_t e1) {
  if (p.expert <= 1 || rank < 0) return e1 - e0;
  return p.local_before(experts, rank, e1) - p.local_before(experts, rank, e0);
}

QuantTensor select_experts(const QuantTensor& q, const std::vector<int64_t>& ids) {
  QuantTensor out = q;
  out.experts = static_cast<int64_t>(ids.size());
  const auto pick = [&](const auto& v, auto& dst) {
    if (v.empty()) return;
    const size_t per = v.size() / static_cast<size_t>(q.experts);
    dst.assign(per * ids.size(), {});
    for (size_t i = 0; i < ids.size(); ++i)
      std::copy(v.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(ids[i]) * per),
                v.begin() + static_cast<std::ptrdiff_t>((static_cast<size_t>(ids[i]) + 1) * per),
                dst.begin() + static_cast<std::ptrdiff_t>(i * per));
  };
  pick(q.codes, out.codes);
  pick(q.scales, out.scales);
  pick(q.zeros, out.zeros);
  pick(q.g_idx, out.g_idx);
  pick(q.global_scales, out.global_scales);
  pick(q.input_scales, out.input_scales);
  out.check_consistent("selected experts");
  return out;
}

std::string rank_dir_name(int rank, int ranks) {
  size_t width = 2;
  for (int n = ranks; n >= 100; n /= 10) ++width;
  const auto padded = [width](int v) {
    std::string t = std::to_string(v);
    return std::string(t.size() < width ? width - t.size() : 0, '0') + t;
  };
  return "rank" + padded(rank) + "-of-" + padded(ranks);
}

std::string rank_tensor_key(int rank, int ranks, const std::string& name) {
  return rank_dir_name(rank, ranks) + "/" + name;
}

int rank_of_tensor_key(const std::string& key, int ranks) {
  const size_t slash = key.find('/');
  if (slash == std::string::npos || ranks < 1) return -1;
  for (int r = 0; r < ranks; ++r)  // the names are short; ranks <= kMaxParallelRanks
    if (key.compare(0, slash, rank_dir_name(r, ranks)) == 0) return r;
  return -1;
}

std::string rank_tensor_name(const std::string& key) {
  const size_t slash = key.find('/');
  if (slash == std::string::npos || key.rfind("rank", 0) != 0) return key;
  return key.substr(slash + 1);
}

}  // namespace moepack
