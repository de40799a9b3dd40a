// Atomic output directories: a conversion writes into a temporary sibling of the final path,
// which commit() fsyncs and renames into place. A conversion that fails (throws) before commit
// leaves neither partial output nor the temp dir behind, and an output never aliases an input.
//
//   <parent>/<stem>.moepack-tmp-<owner tag>/   written by the conversion   (path())
//   (stem: <name>, shortened for a name too long to carry the suffix: sibling_stem)
//        -- commit(): fsync files + dirs --
//   <parent>/<name>                 (old one, with force: renamed to <name>.moepack-old-<owner
//                                    tag>, removed after the new one is in place)
//
// No leftovers (docs/leftovers.md):
// - Every live AtomicOutputDir is also in a fixed process-wide table that a signal handler may
//   read: abandon_pending_outputs() removes the temporaries (and rolls back a half-done replace)
//   with async-signal-safe calls only. tools/main.cpp calls it from its handlers.
// - The owner tag names the process that made the sibling:
//     <machine>-<boot>-<pid>-<start>-<rand>
//   machine = 16 hex digits of FNV-1a over the host name and the PID namespace, boot = the first
//   8 hex digits of /proc/sys/kernel/random/boot_id, pid, start = the process start time
//   (field 22 of /proc/<pid>/stat, clock ticks since boot), rand = 12 hex digits. The
//   constructor removes siblings of the same final path whose owner is provably gone (same
//   machine, and another boot, or no process with that pid and start time), and never touches
//   one whose owner may be alive or that another machine made, or one that is not a directory
//   (moepack makes only directories there).
// - A missing parent directory the constructor made (DST.parts/ of a --shard part) is removed
//   with the temporary when it is left empty (by the destructor and abandon_pending_outputs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moepack {

class AtomicOutputDir {
 public:
  // Throws Error kOutputAliasesInput when `final_path` equals, is inside, or contains any of
  // `input_paths` (compared after resolving symlinks, and by inode where both exist);
  // kOutputExists when `final_path` exists and !force; kIo when the temp dir cannot be made.
  // Missing parent directories of `final_path` are created.
  AtomicOutputDir(const std::string& final_path, bool force,
                  const std::vector<std::string>& input_paths);
  // Without commit(): removes the temp dir and everything in it (never throws).
  ~AtomicOutputDir();
  AtomicOutputDir(const AtomicOutputDir&) = delete;
  AtomicOutputDir& operator=(const AtomicOutputDir&) = delete;

  const std::string& path() const { return temp_; }  // where to write
  const std::string& final_path() const { return final_; }
  bool committed() const { return committed_; }
  // Stale siblings the constructor removed (or, for an interrupted replace whose final path was
  // missing, moved back into place): full paths.
  const std::vector<std::string>& stale_removed() const { return stale_removed_; }

  // fsyncs every file and directory in the temp dir, moves it to the final path (replacing an
  // existing one when force was given; refusing one that appeared meanwhile otherwise), fsyncs
  // the parent and removes the replaced output. Throws kIo / kOutputExists.
  void commit();

 private:
  std::string final_, temp_, parent_;
  std::string created_parent_;  // the parent directory this made ("" when it existed)
  bool force_ = false;
  bool committed_ = false;
  int slot_ = -1;  // in the signal-time table, -1 when it was full
  std::vector<std::string> stale_removed_;
};

// What a sibling of an output named NAME starts with: NAME itself, or -- where NAME.moepack-tmp-
// <tag> would exceed NAME_MAX (255 bytes) -- a prefix of NAME, "~" and 16 hex digits of FNV-1a
// over the whole NAME, so that a temporary name fits for any legal output name.
std::string sibling_stem(const std::string& name);

// Who made a temporary sibling (see the owner tag above).
struct OutputOwner {
  std::string machine;  // 16 hex digits
  std::string boot;     // 8 hex digits, "00000000" when unknown
  int64_t pid = 0;
  uint64_t start = 0;  // clock ticks after boot
};
// This process.
const OutputOwner& this_process_owner();
// "<machine>-<boot>-<pid>-<start>-<12 hex digits>" for this process.
std::string new_owner_tag();
// The owner of TAG (the part after ".moepack-tmp-" / ".moepack-old-"), nullopt unless it is
// exactly the format above.
std::optional<OutputOwner> parse_owner_tag(const std::string& tag);
enum class OwnerState : uint8_t {
  kAlive,    // this very process, or a process with that pid and start time exists
  kGone,     // same machine, and it rebooted since, or that process no longer exists
  kUnknown,  // another machine or PID namespace, or this one cannot tell: never touched
};
OwnerState owner_state(const OutputOwner& owner);

// Removes (or rolls back) every AtomicOutputDir of this process that is not committed: temp
// dirs are removed; a replace interrupted between its two renames moves the old output back;
// one interrupted after them removes the old output. Async-signal-safe (no allocation, no locks:
// open/getdents64/unlinkat/rename on fixed buffers), for signal handlers; best effort.
void abandon_pending_outputs() noexcept;

// Writes `text` to `path` whole or not at all: into a temporary sibling (sibling_stem +
// ".moepack-tmp-" + owner tag), fsynced, then renamed over `path`. A failed write (a full disk,
// a file-size limit) removes the temporary and leaves `path` as it was. Throws kIo naming `path`.
void write_file_atomically(const std::string& path, const std::string& text);

// Opens `path` read-only and fsyncs it (works for regular files and directories). Throws kIo.
void fsync_file(const std::string& path);

// Throws kOutputAliasesInput if `output` equals, lies inside, or contains one of `inputs`.
void check_output_not_aliasing(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace moepack
