// Atomic output directories: a conversion writes into a temporary sibling of the final path,
// which commit() fsyncs and renames into place. A conversion that fails (throws) before commit
// leaves neither partial output nor the temp dir behind, and an output never aliases an input.
//
//   <parent>/<name>.moepack-tmp-<pid>-<rand>/   written by the conversion   (path())
//        -- commit(): fsync files + dirs --
//   <parent>/<name>                 (old one, with force: renamed to <name>.moepack-old-...,
//                                    removed after the new one is in place)
#pragma once

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

  // fsyncs every file and directory in the temp dir, moves it to the final path (replacing an
  // existing one when force was given; refusing one that appeared meanwhile otherwise), fsyncs
  // the parent and removes the replaced output. Throws kIo / kOutputExists.
  void commit();

 private:
  std::string final_, temp_, parent_;
  bool force_ = false;
  bool committed_ = false;
};

// Opens `path` read-only and fsyncs it (works for regular files and directories). Throws kIo.
void fsync_file(const std::string& path);

// Throws kOutputAliasesInput if `output` equals, lies inside, or contains one of `inputs`.
void check_output_not_aliasing(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace moepack
