#include "io/safetensors_index.h"

#include <set>

#include "core/error.h"
#include "io/json_file.h"

namespace moepack {
using nlohmann::json;

SafetensorsIndex parse_safetensors_index(const json& j, const std::string& path) {
  auto bad = [&](const std::string& tensor, const std::string& msg) {
    return Error(ErrorCode::kBadConfig, path, tensor, msg);
  };
  auto shown = [](const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); };
  if (!j.is_object()) throw bad("", "top level: expected an object, got " + shown(j));
  const auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) throw bad("", "weight_map: missing or not an object");
  SafetensorsIndex idx;
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : wm->items()) {
    const std::string field = "weight_map[\"" + tensor + "\"]";
    if (!shard.is_string())
      throw bad(tensor, field + ": expected a shard file name, got " + shown(shard));
    const std::string s = shard.get<std::string>();
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos ||
        s.find('\0') != std::string::npos)
      throw bad(tensor, field + ": shard name \"" + s + "\" is not a plain file name");
    // What loaders read: a weight_map entry names a .safetensors file (never config.json,
    // moepack.json or another file the directory also holds).
    const std::string ext = ".safetensors";
    if (s.size() <= ext.size() || s.compare(s.size() - ext.size(), ext.size(), ext) != 0)
      throw bad(tensor, field + ": shard name \"" + s + "\" does not end in " + ext);
    idx.weight_map[tensor] = s;
    shards.insert(s);
  }
  if (shards.empty()) throw bad("", "weight_map: names no shard");
  idx.shard_names.assign(shards.begin(), shards.end());
  const auto md = j.find("metadata");
  if (md != j.end() && !md->is_null()) {
    if (!md->is_object()) throw bad("", "metadata: expected an object, got " + shown(*md));
    const auto ts = md->find("total_size");
    if (ts != md->end() && !ts->is_null()) {
      if (!ts->is_number_integer() || (!ts->is_number_unsigned() && ts->get<int64_t>() < 0))
        throw bad("", "metadata.total_size: expected a non-negative integer, got " + shown(*ts));
      idx.total_size = ts->get<uint64_t>();
    }
  }
  return idx;
}

SafetensorsIndex read_safetensors_index(const std::string& path) {
  return parse_safetensors_index(read_json_file(path), path);
}

}  // namespace moepack
