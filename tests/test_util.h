// Shared test helpers: golden fixture loading, byte comparison that reports where, random data.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moepack::test {

std::string shared_dir();   // ../shared (MOEPACK_SHARED_DIR at configure time)
std::string source_dir();   // the repository root
std::string moepack_bin();  // build/bin/moepack

// Whether shared/golden/<folder> exists. A clone without ../shared has no fixtures: its golden
// tests skip (MOEPACK_SKIP_WITHOUT_GOLDEN); with the folder present every case runs and a missing
// file fails the test.
bool have_golden(const std::string& folder);
// "golden fixtures not found at <path>: configure with -DMOEPACK_SHARED_DIR=... to run them".
std::string golden_missing_message(const std::string& folder);
// Case names of a golden folder for test discovery: golden_cases(folder), or empty when its
// manifest is absent or unreadable (listing tests never throws; see the .cpp).
std::vector<std::string> golden_cases_if_present(const std::string& folder);

// A golden fixture tensor: raw bytes + manifest dtype string + shape.
struct Golden {
  std::string dtype;  // "int32", "uint8", "float32", "f16bits", "bf16bits", "f8_e4m3", "e8m0"
  Shape shape;
  std::vector<uint8_t> bytes;
  template <typename T>
  std::vector<T> as() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
  }
};
// Loads shared/golden/<folder>/<case>__<tensor>.bin via its manifest.json. Fails the test
// (ADD_FAILURE + throws) if missing.
Golden load_golden(const std::string& folder, const std::string& case_name,
                   const std::string& tensor);
std::vector<std::string> golden_cases(const std::string& folder);
// Manifest's extra fields for a folder (e.g. "gated" of mxfp8), as JSON text.
std::string golden_manifest_json(const std::string& folder);

// Byte-compare that reports the first and the worst differing `block`-byte block and the count,
// not just "not equal". Use: EXPECT_TRUE(bytes_equal(a, b, 4, "w13_qweight")).
::testing::AssertionResult bytes_equal(const void* actual, size_t actual_len, const void* expected,
                                       size_t expected_len, size_t block, const std::string& what);
template <typename A, typename B>
::testing::AssertionResult bytes_equal(const A& actual, const B& expected, size_t block,
                                       const std::string& what) {
  return bytes_equal(actual.data(), actual.size() * sizeof(actual[0]), expected.data(),
                     expected.size() * sizeof(expected[0]), block, what);
}

// A fresh temporary directory under the build's temp space, removed by the destructor.
struct TempDir {
  TempDir();
  ~TempDir();
  std::string path;
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// Runs a shell command; returns the exit code and fills stdout/stderr.
int run_command(const std::string& cmd, std::string* out = nullptr, std::string* err = nullptr);

}  // namespace moepack::test

// First statement of every test that reads shared/golden/<folder>.
#define MOEPACK_SKIP_WITHOUT_GOLDEN(folder)                            \
  do {                                                                 \
    if (!::moepack::test::have_golden(folder))                         \
      GTEST_SKIP() << ::moepack::test::golden_missing_message(folder); \
  } while (0)
