// One error type for the whole project. Thrown inside, turned into an exit code and a
// --json object at main(). Every error names the file and tensor it is about when known.
#pragma once

#include <stdexcept>
#include <string>

namespace moepack {

// Process exit codes (documented in README.md). Stable: scripts depend on them.
enum class ExitCode : int {
  kOk = 0,
  kVerifyFailed = 1,
  kUsage = 2,
  kInvalidInput = 3,
  kUnsupported = 4,
  kIo = 5,
  kInternal = 70,  // a bug in moepack (EX_SOFTWARE)
};

// Fine-grained error codes. Each maps to one ExitCode (exit_code_for). A failed verification is
// not an error: verify reports it and exits ExitCode::kVerifyFailed.
enum class ErrorCode {
  // usage (exit 2)
  kUsage,
  kOutputExists,  // output exists and --force was not given
  kOutputAliasesInput,
  // safetensors validation (exit 3), named after the reference reader's errors
  kHeaderTooSmall,       // file shorter than 8 bytes
  kHeaderTooLarge,       // u64 header length > 100,000,000
  kInvalidHeaderLength,  // 8 + N beyond the end of the file
  kInvalidHeaderUtf8,
  kInvalidHeaderJson,
  kInvalidHeaderLayout,  // not an object / wrong field types / bad __metadata__
  kDuplicateTensor,
  kUnknownDtype,
  kValidationOverflow,        // prod(shape) * bits overflows
  kTensorInvalidInfo,         // end - begin != prod(shape) * bits / 8, or sub-byte misaligned
  kInvalidOffset,             // gap, overlap, end < begin, first not at 0
  kMetadataIncompleteBuffer,  // trailing bytes after the last tensor
  // checkpoint / config (exit 3)
  kBadConfig,
  kMissingTensor,
  kBadShape,
  kBadDtype,
  kBadValue,  // NaN/Inf scale, out-of-range g_idx, ...
  // unsupported (exit 4)
  kUnsupported,  // known but not supported (format, shape constraint, no backend for a layer)
  kNoCuda,       // built without CUDA / no device
  // I/O (exit 5)
  kIo,
  // a bug in moepack (exit 70)
  kInternal,
};

ExitCode exit_code_for(ErrorCode code);
const char* error_code_name(ErrorCode code);  // "header_too_large", ...

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message);
  Error(ErrorCode code, std::string file, std::string tensor, std::string message);

  ErrorCode code() const { return code_; }
  const std::string& file() const { return file_; }
  const std::string& tensor() const { return tensor_; }
  const std::string& message() const { return message_; }
  ExitCode exit_code() const { return exit_code_for(code_); }

 private:
  static std::string compose(const std::string& file, const std::string& tensor,
                             const std::string& message);
  ErrorCode code_;
  std::string file_, tensor_, message_;
};

}  // namespace moepack
