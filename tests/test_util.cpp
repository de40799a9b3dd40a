#include "tests/test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace moepack::test {
namespace fs = std::filesystem;

std::string shared_dir() {
  if (const char* env = std::getenv("MOEPACK_SHARED_DIR")) return env;
  return MOEPACK_TEST_SHARED_DIR;
}
std::string source_dir() {
  return MOEPACK_TEST_SOURCE_DIR;
}
std::string moepack_bin() {
  return MOEPACK_TEST_BIN;
}

bool have_golden(const std::string& folder) {
  std::error_code ec;
  return fs::is_directory(shared_dir() + "/golden/" + folder, ec);
}

std::string golden_missing_message(const std::string& folder) {
  return "golden fixtures not found at " + shared_dir() + "/golden/" + folder +
         ": configure with -DMOEPACK_SHARED_DIR=/path/to/shared (or set MOEPACK_SHARED_DIR in "
         "the environment) to run them";
}

std::vector<std::string> golden_cases_if_present(const std::string& folder) {
  // Runs while tests are listed, outside any test: never throw here. A present but unreadable
  // manifest yields no cases, and the suite's manifest test (which reads it inside a test) fails.
  std::error_code ec;
  if (!fs::is_regular_file(shared_dir() + "/golden/" + folder + "/manifest.json", ec)) return {};
  try {
    return golden_cases(folder);
  } catch (const std::exception&) {
    return {};
  }
}

static nlohmann::json read_manifest(const std::string& folder) {
  const std::string path = shared_dir() + "/golden/" + folder + "/manifest.json";
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "golden manifest missing: " << path;
    throw std::runtime_error("golden manifest missing: " + path);
  }
  return nlohmann::json::parse(in);
}

Golden load_golden(const std::string& folder, const std::string& case_name,
                   const std::string& tensor) {
  const auto m = read_manifest(folder);
  if (!m["cases"].contains(case_name) || !m["cases"][case_name].contains(tensor)) {
    ADD_FAILURE() << "golden " << folder << "/" << case_name << "/" << tensor << " not in manifest";
    throw std::runtime_error("golden entry missing");
  }
  const auto& e = m["cases"][case_name][tensor];
  Golden g;
  g.dtype = e["dtype"].get<std::string>();
  for (const auto& d : e["shape"]) g.shape.push_back(d.get<int64_t>());
  const std::string path = shared_dir() + "/golden/" + folder + "/" + e["file"].get<std::string>();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "golden file missing: " << path;
    throw std::runtime_error("golden file missing");
  }
  g.bytes.assign(std::istreambuf_iterator<char>(in), {});
  return g;
}

std::vector<std::string> golden_cases(const std::string& folder) {
  std::vector<std::string> out;
  const nlohmann::json manifest = read_manifest(folder);  // keep alive while iterating
  for (auto& [k, v] : manifest["cases"].items()) out.push_back(k);
  return out;
}

std::string golden_manifest_json(const std::string& folder) {
  return read_manifest(folder).dump();
}

::testing::AssertionResult bytes_equal(const void* actual, size_t actual_len, const void* expected,
                                       size_t expected_len, size_t block, const std::string& what) {
  if (actual_len != expected_len)
    return ::testing::AssertionFailure()
           << what << ": size " << actual_len << " bytes, expected " << expected_len;
  const auto* a = static_cast<const uint8_t*>(actual);
  const auto* b = static_cast<const uint8_t*>(expected);
  if (block == 0) block = 1;
  size_t diff_blocks = 0, first = SIZE_MAX, worst = SIZE_MAX, worst_bytes = 0;
  for (size_t off = 0; off < actual_len; off += block) {
    size_t nd = 0;
    for (size_t i = off; i < std::min(actual_len, off + block); ++i) nd += a[i] != b[i];
    if (nd) {
      ++diff_blocks;
      if (first == SIZE_MAX) first = off / block;
      if (nd > worst_bytes) worst_bytes = nd, worst = off / block;
    }
  }
  if (!diff_blocks) return ::testing::AssertionSuccess();
  auto hex = [&](const uint8_t* p, size_t idx) {
    std::ostringstream s;
    s << std::hex;
    for (size_t i = idx * block; i < std::min(actual_len, (idx + 1) * block); ++i)
      s << (i == idx * block ? "" : " ") << static_cast<int>(p[i]);
    return s.str();
  };
  return ::testing::AssertionFailure()
         << what << ": " << diff_blocks << " of " << (actual_len + block - 1) / block << " "
         << block << "-byte blocks differ; first at block " << first << " (got " << hex(a, first)
         << ", want " << hex(b, first) << "); worst at block " << worst << " (got " << hex(a, worst)
         << ", want " << hex(b, worst) << ")";
}

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "moepack-test-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  path = buf.data();
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

int run_command(const std::string& cmd, std::string* out, std::string* err) {
  TempDir tmp;
  const std::string o = tmp / "out", e = tmp / "err";
  const int rc = std::system((cmd + " >" + o + " 2>" + e).c_str());
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  if (out) *out = slurp(o);
  if (err) *err = slurp(e);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

}  // namespace moepack::test
