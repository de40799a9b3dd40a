// The error codes and the exit codes they map to (core/error.h; README.md "Exit codes",
// docs/architecture.md "Errors and exit codes"): every ErrorCode has its own name, the one
// `--json` prints, and the documented exit code.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "core/error.h"

namespace moepack {
namespace {

TEST(ErrorCodes, EachMapsToItsDocumentedExitCodeUnderItsOwnName) {
  const std::map<ErrorCode, std::pair<const char*, ExitCode>> want = {
      {ErrorCode::kUsage, {"usage", ExitCode::kUsage}},
      {ErrorCode::kOutputExists, {"output_exists", ExitCode::kUsage}},
      {ErrorCode::kOutputAliasesInput, {"output_aliases_input", ExitCode::kUsage}},
      {ErrorCode::kHeaderTooSmall, {"header_too_small", ExitCode::kInvalidInput}},
      {ErrorCode::kHeaderTooLarge, {"header_too_large", ExitCode::kInvalidInput}},
      {ErrorCode::kInvalidHeaderLength, {"invalid_header_length", ExitCode::kInvalidInput}},
      {ErrorCode::kInvalidHeaderUtf8, {"invalid_header_utf8", ExitCode::kInvalidInput}},
      {ErrorCode::kInvalidHeaderJson, {"invalid_header_json", ExitCode::kInvalidInput}},
      {ErrorCode::kInvalidHeaderLayout, {"invalid_header_layout", ExitCode::kInvalidInput}},
      {ErrorCode::kDuplicateTensor, {"duplicate_tensor", ExitCode::kInvalidInput}},
      {ErrorCode::kUnknownDtype, {"unknown_dtype", ExitCode::kInvalidInput}},
      {ErrorCode::kValidationOverflow, {"validation_overflow", ExitCode::kInvalidInput}},
      {ErrorCode::kTensorInvalidInfo, {"tensor_invalid_info", ExitCode::kInvalidInput}},
      {ErrorCode::kInvalidOffset, {"invalid_offset", ExitCode::kInvalidInput}},
      {ErrorCode::kMetadataIncompleteBuffer,
       {"metadata_incomplete_buffer", ExitCode::kInvalidInput}},
      {ErrorCode::kBadConfig, {"bad_config", ExitCode::kInvalidInput}},
      {ErrorCode::kMissingTensor, {"missing_tensor", ExitCode::kInvalidInput}},
      {ErrorCode::kBadShape, {"bad_shape", ExitCode::kInvalidInput}},
      {ErrorCode::kBadDtype, {"bad_dtype", ExitCode::kInvalidInput}},
      {ErrorCode::kBadValue, {"bad_value", ExitCode::kInvalidInput}},
      {ErrorCode::kUnsupported, {"unsupported", ExitCode::kUnsupported}},
      {ErrorCode::kNoCuda, {"no_cuda", ExitCode::kUnsupported}},
      {ErrorCode::kIo, {"io", ExitCode::kIo}},
      {ErrorCode::kInternal, {"internal", ExitCode::kInternal}},
  };
  // The enum is dense from kUsage to kInternal: the table above lists every value.
  ASSERT_EQ(want.size(), static_cast<size_t>(ErrorCode::kInternal) + 1);
  std::set<std::string> names;
  for (const auto& [code, expect] : want) {
    SCOPED_TRACE(expect.first);
    EXPECT_STREQ(error_code_name(code), expect.first);
    EXPECT_EQ(exit_code_for(code), expect.second);
    EXPECT_TRUE(names.insert(error_code_name(code)).second);
    const Error e(code, "f.json", "t", "m");
    EXPECT_EQ(e.exit_code(), expect.second);
    EXPECT_STREQ(e.what(), "f.json: tensor 't': m");
  }
  // The stable process exit codes scripts depend on.
  EXPECT_EQ(static_cast<int>(ExitCode::kOk), 0);
  EXPECT_EQ(static_cast<int>(ExitCode::kVerifyFailed), 1);
  EXPECT_EQ(static_cast<int>(ExitCode::kUsage), 2);
  EXPECT_EQ(static_cast<int>(ExitCode::kInvalidInput), 3);
  EXPECT_EQ(static_cast<int>(ExitCode::kUnsupported), 4);
  EXPECT_EQ(static_cast<int>(ExitCode::kIo), 5);
  EXPECT_EQ(static_cast<int>(ExitCode::kInternal), 70);
}

}  // namespace
}  // namespace moepack
