#include "io/shard_writer.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "core/error.h"
#include "core/sha256.h"
#include "core/threads.h"

namespace moepack {

ShardPlan plan_shards(const std::vector<SafetensorsEntry>& tensors, uint64_t max_shard_bytes,
                      const std::string& stem) {
  ShardPlan p;
  std::vector<std::vector<SafetensorsEntry>> groups(1);
  uint64_t current = 0;
  for (const auto& t : tensors) {
    const auto bytes = dtype_bytes(t.dtype, static_cast<uint64_t>(numel(t.shape)));
    if (!bytes) throw Error(ErrorCode::kInternal, "", t.name, "tensor size is not whole bytes");
    if (!groups.back().empty() && max_shard_bytes > 0 && current + *bytes > max_shard_bytes) {
      groups.emplace_back();
      current = 0;
    }
    groups.back().push_back(t);
    current += *bytes;
    p.total_tensor_bytes += *bytes;
  }
  const size_t n = groups.size();
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    if (n == 1)
      std::snprintf(name, sizeof(name), ".safetensors");
    else
      std::snprintf(name, sizeof(name), "-%05zu-of-%05zu.safetensors", i + 1, n);
    p.shard_names.push_back(stem + name);
    std::vector<SafetensorsEntry> laid;
    const auto header = build_safetensors_header(groups[i], {}, &laid);
    uint64_t size = header.size();
    for (const auto& e : laid) {
      size = header.size() + e.end;
      p.shard_of[e.name] = i;
    }
    p.shard_file_bytes.push_back(size);
    p.shards.push_back(std::move(laid));
  }
  return p;
}

void append_shards(ShardPlan& into, const ShardPlan& more) {
  if (more.empty()) return;
  if (into.empty()) {
    into = more;
    return;
  }
  const size_t base = into.shard_names.size();
  for (size_t i = 0; i < more.shard_names.size(); ++i) {
    if (into.shard_of.count(more.shards[i].empty() ? "" : more.shards[i].front().name))
      throw Error(ErrorCode::kInternal, "", more.shard_names[i], "tensor in two shard groups");
    into.shard_names.push_back(more.shard_names[i]);
    into.shards.push_back(more.shards[i]);
    into.shard_file_bytes.push_back(more.shard_file_bytes[i]);
  }
  for (const auto& [name, i] : more.shard_of) into.shard_of[name] = base + i;
  into.total_tensor_bytes += more.total_tensor_bytes;
}

// The flusher's state: what each shard has had written (by completed pwrites), and the requests
// for its thread, in order.
struct ShardedWriter::Flusher {
  struct Request {
    size_t shard;
    bool close;  // fsync and close (the shard is complete); otherwise start its writeback
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Request> requests;
  bool stopping = false;
  std::exception_ptr error;  // the first of the flusher's errors
  std::vector<uint64_t> data_bytes, written, kicked;
  std::vector<bool> closed;  // finished (or being finished) by the flusher
  bool running = false;      // the thread started and takes requests
  std::thread thread;
};

ShardedWriter::ShardedWriter(const std::string& dir, ShardPlan plan)
    : dir_(dir),
      plan_(std::move(plan)),
      shard_write_mu_(new std::mutex[plan_.shard_names.size()]),
      flusher_(std::make_unique<Flusher>()) {
  for (size_t i = 0; i < plan_.shard_names.size(); ++i) {
    std::vector<SafetensorsEntry> layout = plan_.shards[i];
    writers_.push_back(
        std::make_unique<SafetensorsWriter>(dir_ + "/" + plan_.shard_names[i], layout));
    uint64_t bytes = 0;
    for (const auto& e : writers_.back()->layout()) bytes += e.end - e.begin;
    flusher_->data_bytes.push_back(bytes);
  }
  flusher_->written.assign(writers_.size(), 0);
  flusher_->kicked.assign(writers_.size(), 0);
  flusher_->closed.assign(writers_.size(), false);
  Flusher* f = flusher_.get();
  try {
    f->thread = std::thread([this, f] {
      while (true) {
        Flusher::Request r{};
        {
          std::unique_lock<std::mutex> lock(f->mu);
          f->cv.wait(lock, [&] { return f->stopping || !f->requests.empty(); });
          if (f->requests.empty()) return;
          r = f->requests.front();
          f->requests.pop_front();
        }
        try {
          if (r.close)
            writers_[r.shard]->finish();
          else
            writers_[r.shard]->start_writeback();
        } catch (...) {
          std::lock_guard<std::mutex> lock(f->mu);
          if (!f->error) f->error = std::current_exception();
        }
      }
    });
    std::lock_guard<std::mutex> lock(f->mu);
    f->running = true;
  } catch (const std::system_error&) {
    // No thread (a thread limit): no early writeback; finish() fsyncs every shard itself.
  }
}

ShardedWriter::~ShardedWriter() {
  stop_flusher(false);  // a failed conversion: what was asked is not worth waiting for
}

void ShardedWriter::stop_flusher(bool drain) noexcept {
  Flusher& f = *flusher_;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    f.stopping = true;
    f.running = false;
    if (!drain) f.requests.clear();
  }
  f.cv.notify_all();
  if (f.thread.joinable()) f.thread.join();
}

size_t ShardedWriter::shard_index(const std::string& name, uint64_t* tensor_bytes) const {
  auto it = plan_.shard_of.find(name);
  if (it == plan_.shard_of.end())
    throw Error(ErrorCode::kInternal, dir_, name, "tensor is not in the shard plan");
  if (tensor_bytes) {
    *tensor_bytes = 0;
    for (const auto& e : plan_.shards[it->second])
      if (e.name == name) *tensor_bytes = e.end - e.begin;
  }
  return it->second;
}

void ShardedWriter::write_range(size_t shard, const std::string& name, const void* data,
                                uint64_t len, uint64_t offset) {
  // Nothing to write (an empty tensor): its shard may already be complete, and closed by the
  // flusher, so it is not touched.
  if (len == 0) return;
  {
    // One pwrite per shard at a time: the kernel serialises buffered writes to a file on its
    // inode lock anyway, and its waiters spin on the CPU while the holder copies (a whole core
    // of two lost to spinning); a waiter here sleeps and leaves the core to hashing.
    std::lock_guard<std::mutex> one_at_a_time(shard_write_mu_[shard]);
    writers_[shard]->write(name, data, len, offset);
  }
  Flusher& f = *flusher_;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    if (f.error) std::rethrow_exception(f.error);
    if (!f.running || f.closed[shard]) return;
    f.written[shard] += len;
    if (f.written[shard] == f.data_bytes[shard]) {
      f.closed[shard] = true;
      f.requests.push_back({shard, true});
    } else if (f.written[shard] - f.kicked[shard] >= kWritebackBytes) {
      f.kicked[shard] = f.written[shard];
      f.requests.push_back({shard, false});
    } else {
      return;
    }
  }
  f.cv.notify_one();
}

void ShardedWriter::write(const std::string& name, const void* data, uint64_t len) {
  const size_t shard = shard_index(name, nullptr);
  const std::string digest = sha256_hex(data, len);
  write_range(shard, name, data, len, 0);
  std::lock_guard<std::mutex> lock(mu_);
  sha_[name] = digest;
}

std::pair<uint64_t, Sha256>* ShardedWriter::begin_part(const std::string& name, uint64_t len,
                                                       uint64_t offset, uint64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  auto* state = &partial_[name];  // std::map: stable address
  if (state->first != offset || offset + len > total)
    throw Error(ErrorCode::kInternal, dir_, name, "tensor parts out of order or past its end");
  return state;
}

void ShardedWriter::end_part(const std::string& name, std::pair<uint64_t, Sha256>* state,
                             uint64_t len, uint64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  state->first += len;
  if (state->first == total) {
    sha_[name] = state->second.hex_digest();
    partial_.erase(name);
  }
}

void ShardedWriter::write_part(const std::string& name, const void* data, uint64_t len,
                               uint64_t offset) {
  uint64_t total = 0;
  const size_t shard = shard_index(name, &total);
  auto* state = begin_part(name, len, offset, total);
  state->second.update(data, len);
  write_range(shard, name, data, len, offset);
  end_part(name, state, len, total);
}

void ShardedWriter::write_parts(const std::vector<TensorPart>& parts, int writers) {
  struct Job {
    const TensorPart* part;
    size_t shard;
    uint64_t total;
    std::pair<uint64_t, Sha256>* state;
    size_t first_piece, pieces;
  };
  std::vector<Job> jobs;
  size_t n_pieces = 0;
  for (const TensorPart& p : parts) {
    Job j{&p,      0,        0,
          nullptr, n_pieces, static_cast<size_t>((p.len + kPieceBytes - 1) / kPieceBytes)};
    j.shard = shard_index(p.name, &j.total);
    j.state = begin_part(p.name, p.len, p.offset, j.total);  // a tensor twice: out of order
    n_pieces += j.pieces;
    jobs.push_back(j);
  }
  // The largest parts are hashed first: the batch ends when its largest hash does.
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const Job& a, const Job& b) { return a.part->len > b.part->len; });
  std::unique_ptr<std::atomic<bool>[]> taken(new std::atomic<bool>[n_pieces]);
  for (size_t i = 0; i < n_pieces; ++i) taken[i].store(false);
  std::atomic<size_t> next_job{0};
  std::atomic<bool> failed{false};
  const auto piece = [&](const Job& j, size_t k, bool hash) {
    const uint64_t begin = k * kPieceBytes;
    const uint64_t len = std::min(kPieceBytes, j.part->len - begin);
    const uint8_t* data = static_cast<const uint8_t*>(j.part->data) + begin;
    if (hash) j.state->second.update(data, len);
    if (!taken[j.first_piece + k].exchange(true))
      write_range(j.shard, j.part->name, data, len, j.part->offset + begin);
  };
  const int64_t workers = std::max<int64_t>(
      1, std::min<int64_t>(resolve_threads(writers), static_cast<int64_t>(n_pieces)));
  parallel_for(workers, static_cast<int>(workers), [&](int64_t, int64_t) {
    try {
      // Hash whole parts, largest first, writing each piece from cache right after its hash.
      while (!failed) {
        const size_t n = next_job++;
        if (n >= jobs.size()) break;
        for (size_t k = 0; k < jobs[n].pieces && !failed; ++k) piece(jobs[n], k, true);
      }
      // Then write what no hasher has reached yet, from each part's end.
      for (const Job& j : jobs)
        for (size_t k = j.pieces; k-- > 0 && !failed;)
          if (!taken[j.first_piece + k].load()) piece(j, k, false);
    } catch (...) {
      failed = true;
      throw;
    }
  });
  for (const Job& j : jobs) end_part(j.part->name, j.state, j.part->len, j.total);
}

void ShardedWriter::finish() {
  // Whatever the flusher was asked to do is done first: a shard it closed is fsynced.
  stop_flusher(true);
  if (flusher_->error) std::rethrow_exception(flusher_->error);
  for (size_t i = 0; i < writers_.size(); ++i)
    if (!flusher_->closed[i]) writers_[i]->finish();
  if (plan_.indexed()) {
    nlohmann::json idx;
    idx["metadata"]["total_size"] = plan_.total_tensor_bytes;
    idx["weight_map"] = nlohmann::json::object();
    for (const auto& [tensor, shard] : plan_.shard_of)
      idx["weight_map"][tensor] = plan_.shard_names[shard];
    const std::string path = dir_ + "/model.safetensors.index.json";
    std::ofstream out(path);
    out << idx.dump(2) << "\n";
    if (!out) throw Error(ErrorCode::kIo, path, "", "write failed");
  }
}

std::map<std::string, std::string> ShardedWriter::checksums() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sha_;
}

}  // namespace moepack
