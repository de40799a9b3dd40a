// Hugging Face inputs, offline: a hub id or a cache repo root resolved to a snapshot directory,
// and which of a checkpoint's non-weight files a conversion carries into its output.
//
// The hub cache huggingface_hub writes (`huggingface-cli download org/name`):
//
//   $HF_HUB_CACHE/models--org--name/           the cache repo root
//     refs/main                                the revision "main" names (a commit hash)
//     blobs/<sha>                              every file's bytes, once
//     snapshots/<commit>/config.json -> ../../blobs/<sha>   relative symlinks, one per file
//
// A snapshot directory is an ordinary checkpoint directory whose files are symlinks: every
// command reads it through them (the links are followed, each must end at a regular file).
#pragma once

#include <string>
#include <vector>

namespace moepack {

// Where `arg` (a command's checkpoint argument) is on disk:
//   - an existing directory that is a cache repo root (it holds snapshots/ and refs/): the
//     snapshot refs/main names;
//   - any other existing directory: itself (a snapshot directory included);
//   - a hub id "org/name" or "org/name@REV" that is not a path: the snapshot of
//     models--org--name in the first cache that holds it, in the order hub_cache_dirs() gives;
//     REV is a ref under refs/ (default "main") or a commit with a snapshot directory.
// Anything else is returned unchanged: the command's own open reports it. Throws kIo when a hub
// id is in no cache (naming every directory looked in and how to download it) and kBadConfig
// when a cache repo is malformed (refs/main missing or naming a snapshot that does not exist).
struct ResolvedCheckpoint {
  std::string dir;       // the directory to read
  std::string hub_id;    // "org/name" when resolved through a cache, else ""
  std::string revision;  // the commit of the snapshot (cache only)
  std::string ref;       // the ref or revision asked for ("main"), cache only
  bool from_cache() const { return !hub_id.empty(); }
};
ResolvedCheckpoint resolve_checkpoint(const std::string& arg);

// The hub caches looked in, in order, as huggingface_hub finds them: $HF_HUB_CACHE (or the
// older $HUGGINGFACE_HUB_CACHE), $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub,
// ~/.cache/huggingface/hub (each once, unset variables skipped).
std::vector<std::string> hub_cache_dirs();

// Whether `text` is shaped like a hub id: "org/name" or "org/name@REV", each part of
// [A-Za-z0-9._-], not "." or "..".
bool looks_like_hub_id(const std::string& text);

// Which non-weight files of a checkpoint (Checkpoint::other_files(): paths relative to its
// root, '/'-separated) a conversion carries. By default every file except other weight formats
// (kLeftOutByDefault: PyTorch .bin/.pt/.pth, TensorFlow .h5, Flax .msgpack, ONNX, GGUF, their
// indexes, and the original/ folder of the producer's own format); `include` globs carry a
// file the defaults leave out, `exclude` globs leave out any file (exclude wins). Globs are
// fnmatch(3) patterns on the relative path, where `*` also matches '/'.
struct FileRule {
  std::vector<std::string> include, exclude;
  bool is_default() const { return include.empty() && exclude.empty(); }
};

struct LeftOutFile {
  std::string path;  // relative to the checkpoint root
  std::string why;   // "PyTorch weights (*.bin)", "--exclude '*.md'"
};

struct FileSelection {
  std::vector<std::string> carried;   // in the order of `files`
  std::vector<LeftOutFile> left_out;  // in the order of `files`
};

// The default rule's patterns and what each leaves out.
struct DefaultLeftOut {
  const char* glob;
  const char* what;
};
const std::vector<DefaultLeftOut>& default_left_out();

FileSelection select_files(const std::vector<std::string>& files, const FileRule& rule);

}  // namespace moepack
