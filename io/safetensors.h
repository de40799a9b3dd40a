// safetensors: a reader that validates every header on open (exactly the reference reader's
// rules, spec/checkpoints.md §4.3) over an mmap, and a streaming writer.
//
//   [0, 8)        u64 LE header length N (<= 100,000,000)
//   [8, 8+N)      UTF-8 JSON object {name: {dtype, shape, data_offsets:[begin,end)}, __metadata__}
//   [8+N, EOF)    tensor bytes, contiguous from 0, no gap/overlap, file ends at the last byte
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace moepack {

constexpr uint64_t kMaxSafetensorsHeader = 100000000;  // reference reader's MAX_HEADER_SIZE

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // relative to the data section
};

// A validated, memory-mapped safetensors file. Move-only; unmaps on destruction.
class SafetensorsFile {
 public:
  // Opens, mmaps and validates; throws Error (kHeaderTooSmall, kHeaderTooLarge,
  // kInvalidHeaderLength, kInvalidHeaderUtf8, kInvalidHeaderJson, kInvalidHeaderLayout,
  // kDuplicateTensor, kUnknownDtype, kValidationOverflow, kTensorInvalidInfo, kInvalidOffset,
  // kMetadataIncompleteBuffer, kIo) naming the file and, where there is one, the tensor.
  static SafetensorsFile open(const std::string& path);
  // Validates an in-memory image (same rules); `label` names it in errors. Used by tests/fuzz.
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes, const std::string& label);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Tensors in data-offset order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr if absent
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  TensorView view(const SafetensorsEntry& e) const;
  TensorView view(const std::string& name) const;  // throws kMissingTensor
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t header_length() const { return header_len_; }
  uint64_t file_size() const { return size_; }
  // Whether the bytes are a read-only file mapping (open), not an in-memory image (from_bytes):
  // only then may a reader drop consumed pages (core/memory.h release_mapped).
  bool mapped() const { return mapped_; }

 private:
  SafetensorsFile() = default;
  void parse_and_validate();
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t header_len_ = 0;
  bool mapped_ = false;
  std::vector<uint8_t> owned_;  // from_bytes
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Header bytes (8-byte length + JSON padded with spaces so the data starts 8-aligned) for
// tensors laid out back to back in the given order, with __metadata__ {"format":"pt"} plus
// `metadata`. Returns the entries with their offsets.
std::vector<uint8_t> build_safetensors_header(const std::vector<SafetensorsEntry>& layout_in,
                                              const std::map<std::string, std::string>& metadata,
                                              std::vector<SafetensorsEntry>* layout_out);

// Streaming writer. The layout (names, dtypes, shapes, order) is fixed up front, so the header
// is written first and every tensor has a known offset: tensors may then be written in any
// order, from any thread (pwrite), and are never all held in memory.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::vector<SafetensorsEntry>& layout,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // closes; an unfinished file is left for the caller's temp dir cleanup
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes bytes [offset, offset + len) of tensor `name`. Thread-safe for disjoint ranges.
  void write(const std::string& name, const void* data, uint64_t len, uint64_t offset = 0);
  void write(const Tensor& t) { write(t.name, t.data.data(), t.data.size()); }
  // Asks the kernel to start writing the file's dirty pages to disk now, without waiting
  // (Linux sync_file_range SYNC_FILE_RANGE_WRITE; nothing elsewhere), so that finish()'s fsync
  // finds most of them written. A hint: errors are left for finish()'s fsync to report.
  // Thread-safe; never call it concurrently with finish().
  void start_writeback();
  // Checks every tensor was fully written, fsyncs and closes. Throws kIo / kInternal.
  void finish();
  uint64_t file_size() const { return file_size_; }
  const std::vector<SafetensorsEntry>& layout() const { return layout_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0, file_size_ = 0;
  std::vector<SafetensorsEntry> layout_;
  std::map<std::string, size_t> index_;
  std::vector<uint64_t> written_;  // bytes written per tensor
  std::unique_ptr<struct WriterLock> lock_;
};

// Convenience: writes `tensors` (in the given order) to `path` in one go.
void write_safetensors(const std::string& path, const std::vector<Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace moepack
