#include "core/error.h"

namespace moepack {

ExitCode exit_code_for(ErrorCode code) {
  switch (code) {
    case ErrorCode::kUsage:
    case ErrorCode::kOutputExists:
    case ErrorCode::kOutputAliasesInput:
      return ExitCode::kUsage;
    case ErrorCode::kUnsupported:
    case ErrorCode::kNoCuda:
      return ExitCode::kUnsupported;
    case ErrorCode::kIo:
      return ExitCode::kIo;
    case ErrorCode::kInternal:
      return ExitCode::kInternal;
    default:
      return ExitCode::kInvalidInput;
  }
}

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kUsage:
      return "usage";
    case ErrorCode::kOutputExists:
      return "output_exists";
    case ErrorCode::kOutputAliasesInput:
      return "output_aliases_input";
    case ErrorCode::kHeaderTooSmall:
      return "header_too_small";
    case ErrorCode::kHeaderTooLarge:
      return "header_too_large";
    case ErrorCode::kInvalidHeaderLength:
      return "invalid_header_length";
    case ErrorCode::kInvalidHeaderUtf8:
      return "invalid_header_utf8";
    case ErrorCode::kInvalidHeaderJson:
      return "invalid_header_json";
    case ErrorCode::kInvalidHeaderLayout:
      return "invalid_header_layout";
    case ErrorCode::kDuplicateTensor:
      return "duplicate_tensor";
    case ErrorCode::kUnknownDtype:
      return "unknown_dtype";
    case ErrorCode::kValidationOverflow:
      return "validation_overflow";
    case ErrorCode::kTensorInvalidInfo:
      return "tensor_invalid_info";
    case ErrorCode::kInvalidOffset:
      return "invalid_offset";
    case ErrorCode::kMetadataIncompleteBuffer:
      return "metadata_incomplete_buffer";
    case ErrorCode::kBadConfig:
      return "bad_config";
    case ErrorCode::kMissingTensor:
      return "missing_tensor";
    case ErrorCode::kBadShape:
      return "bad_shape";
    case ErrorCode::kBadDtype:
      return "bad_dtype";
    case ErrorCode::kBadValue:
      return "bad_value";
    case ErrorCode::kUnsupported:
      return "unsupported";
      return "no_backend";
    case ErrorCode::kNoCuda:
      return "no_cuda";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

Error::Error(ErrorCode code, std::string message)
    : std::runtime_error(message), code_(code), message_(std::move(message)) {}

Error::Error(ErrorCode code, std::string file, std::string tensor, std::string message)
    : std::runtime_error(compose(file, tensor, message)),
      code_(code),
      file_(std::move(file)),
      tensor_(std::move(tensor)),
      message_(std::move(message)) {}

std::string Error::compose(const std::string& file, const std::string& tensor,
                           const std::string& message) {
  std::string out;
  if (!file.empty()) out += file + ": ";
  if (!tensor.empty()) out += "tensor '" + tensor + "': ";
  return out + message;
}

}  // namespace moepack
