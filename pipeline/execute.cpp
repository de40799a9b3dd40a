// execute_plan(): writes exactly what make_plan() decided (STYLE.md §11).
#include "pipeline/execute.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/memory.h"
#include "core/sha256.h"
#include "core/threads.h"
#include "formats/parallel.h"
#include "io/atomic_dir.h"
#include "pipeline/artifact.h"
#include "pipeline/manifest.h"

namespace moepack {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The layer's planned output parameters.
std::vector<const PlannedTensor*> planned_params(const Plan& plan, const PlannedLayer& pl) {
  std::vector<const PlannedTensor*> planned;
  for (const auto& t : plan.tensors)
    if (t.layer == pl.index) planned.push_back(&t);
  return planned;
}

}  // namespace

DirectSource direct_source(const Checkpoint& ckpt, const PlannedLayer& pl, int64_t e0, int64_t e1) {
  const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
  DirectSource src;
  src.quant = pl.source_quant;
  src.hidden = L.hidden;
  src.inter = L.inter;
  src.gated = L.gated;
  src.g_idx_w13 = pl.act_order_w13;
  src.g_idx_w2 = pl.act_order_w2;
  src.linears.resize(static_cast<size_t>(e1 - e0));
  for (int64_t e = e0; e < e1 && e < static_cast<int64_t>(L.experts.size()); ++e)
    for (int p = 0; p < 3; ++p)
      for (const auto& [suffix, name] : L.experts[static_cast<size_t>(e)][p])
        src.linears[static_cast<size_t>(e - e0)][p][suffix] = ckpt.view(name);
  src.first_expert = e0;
  for (const auto& [suffix, name] : L.fused_gate_up) src.fused[0][suffix] = ckpt.view(name);
  for (const auto& [suffix, name] : L.fused_down) src.fused[1][suffix] = ckpt.view(name);
  return src;
}

namespace {

void check_chunk_params(const Plan& plan, const std::vector<Tensor>& params,
                        const std::vector<const PlannedTensor*>& planned, const MoeLayer& L,
                        int64_t e0, int64_t e1);

}  // namespace

std::vector<Tensor> convert_chunk(const Plan& plan, const Checkpoint& ckpt, const PlannedLayer& pl,
                                  int64_t e0, int64_t e1,
                                  const std::function<void(const char*)>& lap) {
  const MoeLayer& L = ckpt.moe_layers()[static_cast<size_t>(pl.index)];
  const std::vector<const PlannedTensor*> planned = planned_params(plan, pl);
  std::optional<std::vector<Tensor>> params;
  if (pl.direct) {
    if (lap) lap("load");  // views into the mapped source: nothing to load
    params = pl.direct->convert(pl.layout_options, direct_source(ckpt, pl, e0, e1));
    if (params && lap) lap("pack");
  }
  // A chunk the direct path declines goes the canonical way, which gives the reference bytes or
  // the reference error.
  if (!params) params = convert_chunk_canonical(plan, ckpt, pl, e0, e1, lap);
  check_chunk_params(plan, *params, planned, L, e0, e1);
  return std::move(*params);
}

std::vector<Tensor> convert_chunk_canonical(const Plan& plan, const Checkpoint& ckpt,
                                            const PlannedLayer& pl, int64_t e0, int64_t e1,
                                            const std::function<void(const char*)>& lap) {
  MoeExperts experts = load_planned_experts(plan, ckpt, pl, e0, e1);
  if (lap) lap("load");
  std::vector<Tensor> params = plan.options.parallel.whole()
                                   ? plan.layout->pack(pl.layout_options, experts)
                                   : pack_ranks(plan, pl, experts, e0, e1);
  experts = MoeExperts();  // release the canonical form before writing
  if (lap) lap("pack");
  return params;
}

std::vector<Tensor> pack_ranks(const Plan& plan, const PlannedLayer& pl, const MoeExperts& experts,
                               int64_t e0, int64_t e1) {
  const Parallelism& par = plan.options.parallel;
  const TargetLayout& row = *plan.layout;
  const int ranks = par.ranks();
  std::vector<Tensor> out;
  for (int r = 0; r < ranks; ++r) {
    // The rank's split, or its experts among [e0, e1) in global order (= its local order, both
    // placements), packed with the rank's options and decisions.
    const MoeExperts mine =
        rank_share_of(row, par, pl.layout_options.gated, pl.shape.experts, experts, r, e0, e1);
    if (mine.w13.experts == 0) continue;
    std::vector<Tensor> packed = row.pack(planned_rank_options(pl, par, r), mine);
    for (Tensor& t : packed) {
      t.name = rank_tensor_key(r, ranks, t.name);
      out.push_back(std::move(t));
    }
  }
  return out;
}

namespace {

void check_chunk_params(const Plan& plan, const std::vector<Tensor>& params,
                        const std::vector<const PlannedTensor*>& planned, const MoeLayer& L,
                        int64_t e0, int64_t e1) {
  // An expert-parallel rank without experts in [e0, e1) has no parameters of this chunk.
  const Parallelism& par = plan.options.parallel;
  size_t expected = 0;
  for (const PlannedTensor* p : planned)
    expected += chunk_experts(par, L.num_experts, p->rank, e0, e1) > 0;
  if (params.size() != expected)
    throw Error(ErrorCode::kInternal, "", L.param_prefix,
                "layout produced a different parameter set than planned");
  for (const Tensor& t : params) {
    const PlannedTensor* want = nullptr;
    for (const PlannedTensor* p : planned)
      if (p->name == t.name) want = p;
    Shape chunk_shape = want ? want->shape : Shape{};
    if (!chunk_shape.empty())
      chunk_shape[0] = chunk_experts(par, L.num_experts, want->rank, e0, e1);
    if (!want || want->dtype != t.dtype || chunk_shape != t.shape)
      throw Error(ErrorCode::kInternal, "", t.name,
                  "layout output differs from the plan (" + shape_str(t.shape) + ")");
  }
}

}  // namespace

namespace {

// Calls read(i, e0, e1) for every chunk of `chunk[i]` experts of every layer `layers[i]`, in
// order, and reports it: a layer done when its last chunk is read, its source tensor bytes in
// proportion to the experts read (inspect's validation progress).
void read_expert_chunks(const Checkpoint& ckpt, const std::vector<const MoeLayer*>& layers,
                        const std::vector<int64_t>& chunk, const ProgressFn& progress,
                        const std::function<void(size_t, int64_t, int64_t)>& read) {
  std::vector<uint64_t> bytes;
  uint64_t total = 0;
  for (const MoeLayer* L : layers) {
    uint64_t b = 0;
    if (progress)
      for (const std::string& name : L->source_tensors) b += ckpt.view(name).nbytes;
    bytes.push_back(b);
    total += b;
  }
  ProgressCounter counter(progress, "layers", static_cast<int64_t>(layers.size()), total);
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t E = layers[i]->num_experts;
    uint64_t reported = 0;
    for (int64_t e0 = 0; e0 < E; e0 += chunk[i]) {
      const int64_t e1 = std::min(E, e0 + chunk[i]);
      read(i, e0, e1);
      const auto now = static_cast<uint64_t>(static_cast<double>(bytes[i]) *
                                             static_cast<double>(e1) / static_cast<double>(E));
      counter.add(e1 == E ? 1 : 0, (e1 == E ? bytes[i] : now) - reported);
      reported = e1 == E ? bytes[i] : now;
    }
  }
}

}  // namespace

void validate_plan(const Plan& plan, const Checkpoint& ckpt, const ProgressFn& progress) {
  std::vector<const MoeLayer*> layers;
  std::vector<int64_t> chunk;
  for (const PlannedLayer& pl : plan.layers) {
    layers.push_back(&ckpt.moe_layers()[static_cast<size_t>(pl.index)]);
    chunk.push_back(pl.experts_per_chunk);
  }
  read_expert_chunks(ckpt, layers, chunk, progress, [&](size_t i, int64_t e0, int64_t e1) {
    convert_chunk(plan, ckpt, plan.layers[i], e0, e1, {});
  });
}

void validate_source(const Checkpoint& ckpt, int threads, uint64_t chunk_bytes,
                     const ProgressFn& progress) {
  const bool dense = ckpt.quant().method == QuantMethod::kNone;
  std::vector<const MoeLayer*> layers;
  std::vector<int64_t> chunk;
  for (const MoeLayer& L : ckpt.moe_layers()) {
    layers.push_back(&L);
    // The plan's chunk rule: canonical bytes per expert (a float each when dense).
    chunk.push_back(experts_per_chunk(
        chunk_bytes, L.num_experts,
        canonical_expert_bytes(L.gated ? 2 * L.inter : L.inter, L.hidden, L.inter, dense)));
  }
  read_expert_chunks(ckpt, layers, chunk, progress, [&](size_t i, int64_t e0, int64_t e1) {
    ExpertRange range;
    range.begin = e0;
    range.end = e1;
    if (dense)
      load_dense_experts(ckpt, *layers[i], range);
    else
      load_moe_experts(ckpt, *layers[i], threads, range);
  });
}

namespace {

// A FIFO of at most `capacity` items between the converting thread and the writer. close() wakes
// both sides: push() then refuses (the writer has stopped), pop() drains what is left, then
// reports the end.
template <class T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(capacity) {}
  bool push(T item) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return closed_ || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }
  bool pop(T& item) {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return false;
    item = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return true;
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_full_.notify_all();
    not_empty_.notify_all();
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_full_, not_empty_;
  std::deque<T> items_;
  bool closed_ = false;
};

// Busy time per stage of one thread.
class StageClock {
 public:
  explicit StageClock(std::map<std::string, double>& seconds) : seconds_(seconds) {}
  void operator()(const char* stage) {
    const auto now = std::chrono::steady_clock::now();
    seconds_[stage] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  std::map<std::string, double>& seconds_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

struct ChunkRef {
  const PlannedLayer* pl;
  int64_t e0, e1;
  bool ends_layer;
};

// A converted chunk on its way to the writer: its tensors and each one's byte offset in the
// output tensor.
struct ConvertedChunk {
  std::vector<Tensor> params;
  std::vector<uint64_t> offsets;
  bool ends_layer = false;
};

// The SHA-256 of each source tensor a conversion reads, hashed in the order the reader reads
// them (a fused tensor's experts arrive chunk after chunk). The reader queues a chunk's ranges and
// hashes them on several threads: SHA-256 is sequential within a tensor but not across tensors,
// so each queued tensor's range is hashed whole by one thread and the tensors are split between
// threads by bytes. A range that ends before what was queued already (a tensor named twice) adds
// nothing; one that starts after it queues the gap first, so every digest covers its tensor's
// bytes exactly once, in order, whatever the thread count.
class SourceHasher {
 public:
  explicit SourceHasher(int threads) : threads_(std::max(1, threads)) {}

  // Queues v's bytes up to `end` that are not queued yet.
  void add(const TensorView& v, uint64_t end) {
    State& st = states_[v.name];  // the reader thread alone inserts, between hash_queued() calls
    if (end <= st.queued) return;
    const auto [at, fresh] = batch_index_.emplace(&st, batch_.size());
    if (fresh)
      batch_.push_back({&st, v.data, st.queued, end});
    else
      batch_[at->second].end = end;  // contiguous with the tensor's queued range
    st.queued = end;
  }

  // Hashes everything queued, on up to `threads` threads; each range is read once (the advice for
  // its pages, then every byte into its tensor's SHA-256), which also brings the pages in for the
  // converting thread.
  void hash_queued() {
    std::vector<uint64_t> first(batch_.size());  // offset of each range in the batch's bytes
    uint64_t total = 0;
    for (size_t i = 0; i < batch_.size(); ++i) {
      first[i] = total;
      total += batch_[i].end - batch_[i].begin;
    }
    const int64_t workers =
        std::min<int64_t>(threads_, static_cast<int64_t>(std::max<size_t>(1, batch_.size())));
    parallel_for(workers, static_cast<int>(workers), [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w) {
        // Worker w hashes the ranges that start in its share of the batch's bytes.
        const uint64_t lo = total * static_cast<uint64_t>(w) / static_cast<uint64_t>(workers);
        const uint64_t hi = total * static_cast<uint64_t>(w + 1) / static_cast<uint64_t>(workers);
        for (size_t i = 0; i < batch_.size(); ++i)
          if (first[i] >= lo && first[i] < hi) hash(batch_[i]);
      }
    });
    batch_.clear();
    batch_index_.clear();
  }

  // Hashes the rest of each named tensor and returns name -> SHA-256 (hex) of all of them.
  std::map<std::string, std::string> finish(const Checkpoint& ckpt,
                                            const std::set<std::string>& names) {
    for (const std::string& name : names) {
      const TensorView v = ckpt.view(name);
      add(v, v.nbytes);
    }
    hash_queued();
    std::map<std::string, std::string> out;
    for (const std::string& name : names) out[name] = states_[name].sha.hex_digest();
    return out;
  }

 private:
  struct State {
    Sha256 sha;
    uint64_t queued = 0;  // bytes queued (and, after hash_queued, hashed) so far
  };
  struct Range {
    State* state;
    const uint8_t* data;  // the tensor's first byte
    uint64_t begin, end;
  };
  static void hash(const Range& r) {
    advise_willneed(r.data + r.begin, r.end - r.begin);
    r.state->sha.update(r.data + r.begin, r.end - r.begin);
  }

  int threads_;
  std::map<std::string, State> states_;
  std::vector<Range> batch_;
  std::map<const State*, size_t> batch_index_;
};

// Queues the mapped source bytes a chunk's conversion reads into the hasher: its experts'
// tensors (per-expert families), or the experts' share of each fused tensor (experts are the
// leading dimension).
void queue_chunk(const Checkpoint& ckpt, const MoeLayer& L, int64_t e0, int64_t e1,
                 SourceHasher& hasher) {
  if (!L.experts.empty()) {
    for (int64_t e = e0; e < e1 && e < static_cast<int64_t>(L.experts.size()); ++e)
      for (const auto& proj : L.experts[static_cast<size_t>(e)])
        for (const auto& [suffix, name] : proj) {
          const TensorView v = ckpt.view(name);
          hasher.add(v, v.nbytes);
        }
    return;
  }
  const uint64_t E = static_cast<uint64_t>(std::max<int64_t>(1, L.num_experts));
  for (const auto* fused : {&L.fused_gate_up, &L.fused_down})
    for (const auto& [suffix, name] : *fused) {
      const TensorView v = ckpt.view(name);
      hasher.add(v, v.nbytes * static_cast<uint64_t>(e1) / E);
    }
}

// What write_planned_tensors writes of a plan: the copy-through tensors, and every chunk of every
// wanted MoE layer in the order the writer needs them (a tensor's parts arrive in order).
struct PlannedWork {
  std::vector<const PlannedTensor*> copies;
  // The converted tensors wanted, when they are not all of their layers' (a part of a parallel
  // output may hold some ranks of a layer); empty: all.
  std::set<std::string> wanted;
  std::vector<ChunkRef> chunks;
  uint64_t bytes = 0;
  int64_t layers = 0;
};

}  // namespace

int64_t pipeline_experts_per_chunk(const Plan& plan, const PlannedLayer& pl, int64_t E,
                                   uint64_t chunk_bytes) {
  if (!pl.direct || E < 1) return pl.experts_per_chunk;
  uint64_t layer_bytes = 0;
  for (const PlannedTensor& t : plan.tensors)
    if (t.converted && t.layer == pl.index) layer_bytes += t.bytes;
  const uint64_t per_expert = std::max<uint64_t>(1, layer_bytes / static_cast<uint64_t>(E));
  const uint64_t fit = chunk_bytes / per_expert + (chunk_bytes % per_expert != 0);
  const auto cut = static_cast<int64_t>(std::min<uint64_t>(fit, static_cast<uint64_t>(E)));
  return std::min(pl.experts_per_chunk, std::max<int64_t>(cut, std::max(1, plan.threads)));
}

namespace {

PlannedWork planned_work(const Plan& plan, const Checkpoint& ckpt,
                         const std::vector<size_t>& tensors) {
  PlannedWork w;
  std::set<int64_t> layers_wanted;
  for (size_t i : tensors) {
    const PlannedTensor& t = plan.tensors.at(i);
    w.bytes += t.bytes;
    if (t.converted) {
      layers_wanted.insert(t.layer);
      w.wanted.insert(t.name);
    } else {
      w.copies.push_back(&t);
    }
  }
  size_t converted_in_layers = 0;
  for (const PlannedTensor& t : plan.tensors) converted_in_layers += layers_wanted.count(t.layer);
  if (converted_in_layers == w.wanted.size()) w.wanted.clear();
  w.layers = static_cast<int64_t>(layers_wanted.size());
  for (const PlannedLayer& pl : plan.layers) {
    if (!layers_wanted.count(pl.index)) continue;
    const int64_t E = ckpt.moe_layers()[static_cast<size_t>(pl.index)].num_experts;
    const int64_t step = pipeline_experts_per_chunk(plan, pl, E, kPipelineChunkBytes);
    for (int64_t e0 = 0; e0 < E; e0 += step) {
      const int64_t e1 = std::min(E, e0 + step);
      w.chunks.push_back({&pl, e0, e1, e1 == E});
    }
  }
  return w;
}

// The three threads of write_planned_tensors and what they share: the reader reads (hashes) the
// source bytes of chunk n+1, the calling thread converts chunk n, the writer writes chunk n-1,
// and a copy thread writes the copy-through tensors beside them. The destructor stops and joins
// the others however the caller's scope is left -- also when starting one fails (out of memory),
// since a joinable std::thread must never be destroyed.
class ChunkPipeline {
 public:
  ChunkPipeline(const Plan& plan, const Checkpoint& ckpt, ShardedWriter& writer, PlannedWork work,
                const ProgressFn& progress)
      : plan_(plan), ckpt_(ckpt), writer_(writer), work_(std::move(work)), progress_(progress) {
    state_.bytes_total = work_.bytes;
    state_.layers_total = work_.layers;
  }
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;
  ~ChunkPipeline() { stop(); }

  // Runs every chunk through; busy time per stage is added to stage_seconds. Rethrows the
  // converter's error (after stopping the others) or the writer's.
  // Returns the SHA-256 of every source tensor of the converted layers (the reader's).
  std::map<std::string, std::string> run(std::map<std::string, double>& stage_seconds) {
    copy_thread_ = std::thread([this] { copy_all(); });
    writer_thread_ = std::thread([this] { write_all(); });
    reader_thread_ = std::thread([this] { read_ahead(); });
    convert_all(stage_seconds);
    // Every chunk is converted: the reader may run to its end (it hashes what it has not yet).
    if (reader_thread_.joinable()) reader_thread_.join();
    stop();
    for (const auto& [stage, s] : writer_seconds_) stage_seconds[stage] += s;
    for (const auto& [stage, s] : copy_seconds_) stage_seconds[stage] += s;
    if (copy_error_) std::rethrow_exception(copy_error_);
    if (writer_error_) std::rethrow_exception(writer_error_);
    if (reader_error_) std::rethrow_exception(reader_error_);
    return std::move(source_sha_);
  }

 private:
  // The copy-through tensors, straight from the mapped source (no copies held), on their own
  // thread beside the chunk writer: they are other tensors than the chunks', so their hashing
  // runs beside the chain of the chunks' largest parts instead of before it.
  void copy_all() {
    try {
      StageClock lap(copy_seconds_);
      std::vector<TensorPart> parts;
      uint64_t copied = 0;
      for (const PlannedTensor* t : work_.copies) {
        const TensorView v = ckpt_.view(t->name);
        parts.push_back({v.name, v.data, v.nbytes, 0});
        copied += v.nbytes;
      }
      writer_.write_parts(parts, plan_.writers);
      lap("copy");
      report(copied, false);
    } catch (...) {
      copy_error_ = std::current_exception();
      queue_.close();  // the converting thread stops at its next push, the writer after its chunk
    }
  }

  // The writer: each converted chunk as it comes.
  void write_all() {
    try {
      StageClock lap(writer_seconds_);
      std::vector<TensorPart> parts;
      ConvertedChunk c;
      while (true) {
        lap("write");
        const bool more = queue_.pop(c);
        lap("writer_idle");
        if (!more) break;
        uint64_t bytes = 0;
        parts.clear();
        for (size_t k = 0; k < c.params.size(); ++k) {
          const Tensor& t = c.params[k];
          parts.push_back({t.name, t.data.data(), t.data.size(), c.offsets[k]});
          bytes += t.data.size();
        }
        writer_.write_parts(parts, plan_.writers);
        const bool ends_layer = c.ends_layer;
        c = ConvertedChunk();  // free the chunk before waiting for the next one
        report(bytes, ends_layer);
      }
    } catch (...) {
      writer_error_ = std::current_exception();
      queue_.close();  // the converting thread stops at its next push
    }
  }

  // The reader: reads (hashes) the source bytes of chunk n+1 while chunk n is converted, so the
  // converting thread finds their pages in memory and convert reads the source once for both.
  void read_ahead() {
    try {
      SourceHasher hasher(plan_.threads);
      std::set<std::string> names;
      for (size_t n = 0; n < work_.chunks.size(); ++n) {
        {
          std::unique_lock<std::mutex> lock(read_mu_);
          read_cv_.wait(lock, [&] { return stop_reading_ || n <= converting_ + 1; });
          if (stop_reading_) return;
        }
        const ChunkRef& c = work_.chunks[n];
        const MoeLayer& L = ckpt_.moe_layers()[static_cast<size_t>(c.pl->index)];
        queue_chunk(ckpt_, L, c.e0, c.e1, hasher);
        hasher.hash_queued();
        if (c.ends_layer) names.insert(L.source_tensors.begin(), L.source_tensors.end());
      }
      source_sha_ = hasher.finish(ckpt_, names);
    } catch (...) {
      reader_error_ = std::current_exception();
    }
  }

  // The calling thread: converts each chunk and hands it to the writer with each tensor's
  // offset (planned bytes / E * first expert).
  void convert_all(std::map<std::string, double>& stage_seconds) {
    StageClock lap(stage_seconds);
    for (size_t n = 0; n < work_.chunks.size(); ++n) {
      {
        std::lock_guard<std::mutex> lock(read_mu_);
        converting_ = n;
      }
      read_cv_.notify_all();
      const ChunkRef& ref = work_.chunks[n];
      const PlannedLayer& pl = *ref.pl;
      const int64_t E = ckpt_.moe_layers()[static_cast<size_t>(pl.index)].num_experts;
      const std::vector<const PlannedTensor*> planned = planned_params(plan_, pl);
      ConvertedChunk c;
      c.params = convert_chunk(plan_, ckpt_, pl, ref.e0, ref.e1, std::ref(lap));
      // A part writes only its tensors (a unit may hold some ranks of a layer).
      if (!work_.wanted.empty())
        c.params.erase(std::remove_if(c.params.begin(), c.params.end(),
                                      [&](const Tensor& t) { return !work_.wanted.count(t.name); }),
                       c.params.end());
      const Parallelism& par = plan_.options.parallel;
      for (const Tensor& t : c.params) {
        const PlannedTensor* want = nullptr;
        for (const PlannedTensor* p : planned)
          if (p->name == t.name) want = p;
        const uint64_t local = static_cast<uint64_t>(chunk_experts(par, E, want->rank, 0, E));
        const uint64_t before = static_cast<uint64_t>(chunk_experts(par, E, want->rank, 0, ref.e0));
        c.offsets.push_back(want->bytes / local * before);
      }
      c.ends_layer = ref.ends_layer;
      const bool taken = queue_.push(std::move(c));
      lap("write_wait");
      if (!taken) {  // the writer failed: its error is rethrown by run()
        stop();
        break;
      }
    }
  }

  void report(uint64_t bytes, bool ends_layer) {
    std::lock_guard<std::mutex> lock(report_mu_);  // the writer's and the copy thread's
    state_.bytes_done += bytes;
    if (ends_layer) ++state_.layers_done;
    state_.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
    if (progress_) progress_(state_);
  }

  // Closes the queue (the writer drains what is left, then ends), stops the reader, joins the
  // three (the copy thread ends its copies).
  void stop() {
    queue_.close();
    {
      std::lock_guard<std::mutex> lock(read_mu_);
      stop_reading_ = true;
    }
    read_cv_.notify_all();
    if (writer_thread_.joinable()) writer_thread_.join();
    if (reader_thread_.joinable()) reader_thread_.join();
    if (copy_thread_.joinable()) copy_thread_.join();
  }

  const Plan& plan_;
  const Checkpoint& ckpt_;
  ShardedWriter& writer_;
  const PlannedWork work_;
  const ProgressFn& progress_;
  const std::chrono::steady_clock::time_point t_start_ = std::chrono::steady_clock::now();
  ConvertProgress state_;  // the writer's and the copy thread's, under report_mu_
  std::mutex report_mu_;
  // kChunksInFlight = the chunk being converted + one queued + the one being written.
  BoundedQueue<ConvertedChunk> queue_{static_cast<size_t>(kChunksInFlight - 2)};
  std::map<std::string, double> writer_seconds_, copy_seconds_;
  std::exception_ptr writer_error_, reader_error_, copy_error_;
  std::map<std::string, std::string> source_sha_;  // the reader's, once it has ended
  std::mutex read_mu_;
  std::condition_variable read_cv_;
  size_t converting_ = 0;  // index of the chunk the converting thread is on
  bool stop_reading_ = false;
  std::thread writer_thread_, reader_thread_, copy_thread_;
};

}  // namespace

std::map<std::string, std::string> write_planned_tensors(
    const Plan& plan, const Checkpoint& ckpt, ShardedWriter& writer,
    const std::vector<size_t>& tensors, const ProgressFn& progress,
    std::map<std::string, double>& stage_seconds) {
  const PlannedWork work = planned_work(plan, ckpt, tensors);
  std::vector<std::string> copies;
  for (const PlannedTensor* t : work.copies) copies.push_back(t->name);
  ChunkPipeline pipeline(plan, ckpt, writer, work, progress);
  std::map<std::string, std::string> source_sha = pipeline.run(stage_seconds);
  // A copy-through tensor is written with the source's bytes: the SHA-256 the writer computed
  // while writing it is the source tensor's.
  const std::map<std::string, std::string> written = writer.checksums();
  for (const std::string& name : copies) source_sha[name] = written.at(name);
  return source_sha;
}

void write_config_and_files(const Plan& plan, const Checkpoint& ckpt, const std::string& dir,
                            const std::map<std::string, std::string>& checksums,
                            const std::map<std::string, std::string>& source_sha) {
  // Other files, then config.json with a moepack block, then the manifest.
  for (const auto& rel : plan.copied_files) {
    const fs::path dst = fs::path(dir) / rel;
    fs::create_directories(dst.parent_path());
    std::error_code ec;
    fs::copy_file(fs::path(ckpt.dir()) / rel, dst, fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw Error(ErrorCode::kIo, (fs::path(ckpt.dir()) / rel).string(), "",
                  "copy failed: " + ec.message());
  }
  // The manifest's bytes first: config.json's quantization_config carries their digest, so a
  // server can tell that the config and the manifest belong together.
  const std::string manifest = manifest_text(build_manifest(plan, ckpt, checksums, source_sha));
  json cfg = output_config(ckpt.config().raw, plan.config_patch);
  cfg["quantization_config"]["manifest_sha256"] = sha256_hex(manifest.data(), manifest.size());
  for (const auto& [name, text] :
       {std::pair<const char*, std::string>{"config.json", cfg.dump(2) + "\n"},
        {"moepack.json", manifest}}) {
    const std::string p = dir + "/" + name;
    std::ofstream f(p);
    f << text;
    if (!f) throw Error(ErrorCode::kIo, p, "", "write failed");
  }
}

ConvertResult execute_plan(const Plan& plan, const Checkpoint& ckpt, const ProgressFn& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  PeakMemorySampler memory;
  ConvertResult r;
  AtomicOutputDir out(plan.options.dst, plan.options.force, {plan.options.src});
  ShardedWriter writer(out.path(), plan.shards);
  std::vector<size_t> all(plan.tensors.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  const std::map<std::string, std::string> source_sha =
      write_planned_tensors(plan, ckpt, writer, all, progress, r.stage_seconds);
  const auto t_finish = std::chrono::steady_clock::now();
  writer.finish();
  write_config_and_files(plan, ckpt, out.path(), writer.checksums(), source_sha);
  out.commit();

  const auto t1 = std::chrono::steady_clock::now();
  r.stage_seconds["finish"] += std::chrono::duration<double>(t1 - t_finish).count();
  const ResidentMemory peak = memory.stop();
  r.peak_rss_anon_bytes = peak.anon_bytes;
  r.peak_rss_file_bytes = peak.file_bytes;
  r.dst = plan.options.dst;
  r.bytes_written = plan.total_bytes();
  r.tensors = static_cast<int64_t>(plan.tensors.size());
  r.seconds = std::chrono::duration<double>(t1 - t0).count();
  return r;
}

}  // namespace moepack
