#include "model/hf_hub.h"

#include <fnmatch.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace moepack {
namespace fs = std::filesystem;

namespace {

bool hub_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

bool hub_name_part(const std::string& s) {
  if (s.empty() || s == "." || s == ".." || s.size() > 96) return false;
  for (char c : s)
    if (!hub_name_char(c)) return false;
  return true;
}

// A revision: a ref name (branches may hold '/': refs/pr/1) or a commit; no "." or ".." part.
bool revision_name(const std::string& s) {
  if (s.empty() || s.size() > 255 || s.front() == '/' || s.back() == '/') return false;
  size_t start = 0;
  for (;;) {
    const size_t slash = s.find('/', start);
    if (!hub_name_part(s.substr(start, slash == std::string::npos ? slash : slash - start)))
      return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// A cache repo root: snapshots/ beside refs/ or blobs/, and no config.json of its own.
bool is_cache_repo_root(const fs::path& p) {
  std::error_code ec;
  return is_dir(p / "snapshots") && (is_dir(p / "refs") || is_dir(p / "blobs")) &&
         !fs::exists(fs::symlink_status(p / "config.json", ec));
}

// "models--org--name" -> "org/name" (for messages; "" when the folder is named otherwise).
std::string hub_id_of_folder(const std::string& folder) {
  const std::string prefix = "models--";
  if (folder.rfind(prefix, 0) != 0) return "";
  const std::string rest = folder.substr(prefix.size());
  const size_t sep = rest.find("--");
  return sep == std::string::npos ? rest : rest.substr(0, sep) + "/" + rest.substr(sep + 2);
}

std::string snapshot_names(const fs::path& root) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(root / "snapshots", ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  std::sort(names.begin(), names.end());
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

// The snapshot of cache repo `root` that `ref` names: refs/<ref> holds its commit; a ref that is
// itself a snapshot's name is a commit.
ResolvedCheckpoint snapshot_of(const fs::path& root, const std::string& hub_id,
                               const std::string& ref) {
  ResolvedCheckpoint r;
  r.hub_id = hub_id.empty() ? root.filename().string() : hub_id;
  r.ref = ref;
  const fs::path ref_file = root / "refs" / ref;
  std::error_code ec;
  if (fs::is_regular_file(ref_file, ec)) {
    std::ifstream f(ref_file);
    std::string commit;
    std::getline(f, commit);
    while (!commit.empty() && (commit.back() == '\r' || commit.back() == ' ')) commit.pop_back();
    if (!hub_name_part(commit))
      throw Error(ErrorCode::kBadConfig, ref_file.string(), "",
                  "does not hold a commit hash (a damaged Hugging Face cache: download the "
                  "repository again)");
    r.revision = commit;
  } else if (is_dir(root / "snapshots" / ref)) {
    r.revision = ref;
  } else {
    throw Error(ErrorCode::kBadConfig, root.string(), "",
                "Hugging Face cache repository without refs/" + ref + " or a snapshot named " +
                    ref + " (snapshots: " + snapshot_names(root) +
                    "): pass the snapshot directory, or " + r.hub_id + "@<commit>");
  }
  const fs::path snap = root / "snapshots" / r.revision;
  if (!is_dir(snap))
    throw Error(ErrorCode::kBadConfig, snap.string(), "",
                "refs/" + ref + " names " + r.revision +
                    ", but no such snapshot exists (an interrupted download? run "
                    "`huggingface-cli download " +
                    r.hub_id + "` again)");
  r.dir = snap.string();
  return r;
}

}  // namespace

bool looks_like_hub_id(const std::string& text) {
  const size_t at = text.find('@');
  const std::string id = text.substr(0, at);
  if (at != std::string::npos && !revision_name(text.substr(at + 1))) return false;
  const size_t slash = id.find('/');
  if (slash == std::string::npos || id.find('/', slash + 1) != std::string::npos) return false;
  return hub_name_part(id.substr(0, slash)) && hub_name_part(id.substr(slash + 1));
}

std::vector<std::string> hub_cache_dirs() {
  std::vector<std::string> dirs;
  const auto add = [&](const std::string& d) {
    if (d.empty()) return;
    const std::string norm = fs::path(d).lexically_normal().string();
    if (std::find(dirs.begin(), dirs.end(), norm) == dirs.end()) dirs.push_back(norm);
  };
  const auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  add(env("HF_HUB_CACHE"));
  add(env("HUGGINGFACE_HUB_CACHE"));
  if (!env("HF_HOME").empty()) add(env("HF_HOME") + "/hub");
  if (!env("XDG_CACHE_HOME").empty()) add(env("XDG_CACHE_HOME") + "/huggingface/hub");
  std::string home = env("HOME");
  if (home.empty())
    if (const passwd* pw = getpwuid(getuid())) home = pw->pw_dir ? pw->pw_dir : "";
  if (!home.empty()) add(home + "/.cache/huggingface/hub");
  return dirs;
}

ResolvedCheckpoint resolve_checkpoint(const std::string& arg) {
  std::error_code ec;
  const fs::file_status st = fs::status(arg, ec);
  if (st.type() == fs::file_type::directory) {
    if (is_cache_repo_root(arg)) {
      const fs::path root = fs::path(arg).lexically_normal();
      const std::string folder =
          (root.has_filename() ? root : root.parent_path()).filename().string();
      return snapshot_of(root, hub_id_of_folder(folder), "main");
    }
    return {arg, "", "", ""};
  }
  // Not a directory: the command's own open says what it is, unless it is a hub id.
  if (st.type() != fs::file_type::not_found || !looks_like_hub_id(arg)) return {arg, "", "", ""};
  const size_t at = arg.find('@');
  const std::string id = arg.substr(0, at);
  const std::string ref = at == std::string::npos ? "main" : arg.substr(at + 1);
  const std::string folder =
      "models--" + id.substr(0, id.find('/')) + "--" + id.substr(id.find('/') + 1);
  std::string looked;
  for (const std::string& cache : hub_cache_dirs()) {
    const fs::path root = fs::path(cache) / folder;
    if (is_dir(root)) return snapshot_of(root, id, ref);
    looked += (looked.empty() ? "" : ", ") + root.string();
  }
  throw Error(ErrorCode::kIo, arg, "",
              "no such directory, and no Hugging Face cache holds " + id + " (looked in " +
                  (looked.empty() ? std::string("no cache: HOME is not set") : looked) +
                  "; set HF_HUB_CACHE or HF_HOME to another cache): download it first with "
                  "`huggingface-cli download " +
                  id + "`, or pass the checkpoint directory");
}

const std::vector<DefaultLeftOut>& default_left_out() {
  // Weight files of other formats that a Hugging Face repository often holds beside its
  // safetensors: moepack converts the safetensors shards, and a copy of the weights in another
  // format would be stale next to the converted experts (and doubles the output).
  static const std::vector<DefaultLeftOut> table = {
      {"*.bin", "PyTorch pickle weights"},
      {"*.bin.index.json", "the index of PyTorch pickle weights"},
      {"*.pt", "PyTorch checkpoint"},
      {"*.pth", "PyTorch checkpoint"},
      {"*.ckpt", "checkpoint weights"},
      {"*.h5", "TensorFlow weights"},
      {"*.h5.index.json", "the index of TensorFlow weights"},
      {"*.msgpack", "Flax weights"},
      {"*.msgpack.index.json", "the index of Flax weights"},
      {"*.onnx", "ONNX model"},
      {"*.onnx_data", "ONNX weights"},
      {"*.gguf", "GGUF weights"},
      {"*.tflite", "TensorFlow Lite model"},
      {"original/*", "the producer's original-format weights"},
  };
  return table;
}

FileSelection select_files(const std::vector<std::string>& files, const FileRule& rule) {
  const auto matches = [](const std::string& glob, const std::string& path) {
    return fnmatch(glob.c_str(), path.c_str(), 0) == 0;
  };
  FileSelection s;
  for (const std::string& f : files) {
    std::string why;
    for (const std::string& g : rule.exclude)
      if (why.empty() && matches(g, f)) why = "--exclude '" + g + "'";
    if (why.empty()) {
      bool included = false;
      for (const std::string& g : rule.include) included |= matches(g, f);
      for (const auto& d : default_left_out())
        if (why.empty() && !included && matches(d.glob, f))
          why = std::string(d.what) + " (" + d.glob + "; --include '" + d.glob + "' carries it)";
    }
    if (why.empty())
      s.carried.push_back(f);
    else
      s.left_out.push_back({f, why});
  }
  return s;
}

}  // namespace moepack
