#include "io/shard_writer.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/sha256.h"

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

ShardedWriter::ShardedWriter(const std::string& dir, ShardPlan plan)
    : dir_(dir), plan_(std::move(plan)) {
  for (size_t i = 0; i < plan_.shard_names.size(); ++i) {
    std::vector<SafetensorsEntry> layout = plan_.shards[i];
    writers_.push_back(
        std::make_unique<SafetensorsWriter>(dir_ + "/" + plan_.shard_names[i], layout));
  }
}

void ShardedWriter::write(const std::string& name, const void* data, uint64_t len) {
  auto it = plan_.shard_of.find(name);
  if (it == plan_.shard_of.end())
    throw Error(ErrorCode::kInternal, dir_, name, "tensor is not in the shard plan");
  const std::string digest = sha256_hex(data, len);
  writers_[it->second]->write(name, data, len);
  std::lock_guard<std::mutex> lock(mu_);
  sha_[name] = digest;
}

void ShardedWriter::write_part(const std::string& name, const void* data, uint64_t len,
                               uint64_t offset) {
  auto it = plan_.shard_of.find(name);
  if (it == plan_.shard_of.end())
    throw Error(ErrorCode::kInternal, dir_, name, "tensor is not in the shard plan");
  uint64_t total = 0;
  for (const auto& e : plan_.shards[it->second])
    if (e.name == name) total = e.end - e.begin;
  std::pair<uint64_t, Sha256>* state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state = &partial_[name];  // std::map: stable address
    if (state->first != offset || offset + len > total)
      throw Error(ErrorCode::kInternal, dir_, name, "tensor parts out of order or past its end");
  }
  state->second.update(data, len);
  writers_[it->second]->write(name, data, len, offset);
  std::lock_guard<std::mutex> lock(mu_);
  state->first += len;
  if (state->first == total) {
    sha_[name] = state->second.hex_digest();
    partial_.erase(name);
  }
}

void ShardedWriter::finish() {
  for (auto& w : writers_) w->finish();
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
