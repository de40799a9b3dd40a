// Replays inputs through a libFuzzer target's own entry points (LLVMFuzzerInitialize,
// LLVMFuzzerTestOneInput) without libFuzzer, so that every build -- g++, the ASan/UBSan one --
// runs the committed seed corpora (tests/fuzz/corpus/<target>/) and the reproducer of every past
// finding (tests/fuzz/regressions/<target>/) as regression tests. A finding fails the test as it
// failed the fuzzer: a crash, a sanitizer report, an uncaught exception or a trap (each target's
// own verdict) ends the process; the last "replay:" line names the input.
//
//   replay_fuzz_<target> PATH...     (files, or folders read recursively; README* is skipped)
//
// A reproducer inside a folder named VAR=VALUE runs with that environment variable set and
// LLVMFuzzerInitialize called again (fuzz_unpack's MOEPACK_FUZZ_CODEC=<row>: a finding of one
// pinned codec is replayed pinned to it). Exit 1 when no input was found: a replay of nothing
// proves nothing.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {
namespace fs = std::filesystem;

// The VAR=VALUE folders between `root` and `file`, outermost first.
std::vector<std::string> env_settings(const fs::path& root, const fs::path& file) {
  std::vector<std::string> out;
  for (const fs::path& part : file.parent_path().lexically_relative(root)) {
    const std::string s = part.string();
    if (s.find('=') != std::string::npos && s.front() != '=') out.push_back(s);
  }
  return out;
}

void replay(const fs::path& root, const fs::path& file, int* argc, char*** argv) {
  const std::vector<std::string> settings = env_settings(root, file);
  for (const std::string& s : settings)
    ::setenv(s.substr(0, s.find('=')).c_str(), s.substr(s.find('=') + 1).c_str(), 1);
  if (!settings.empty() && LLVMFuzzerInitialize) LLVMFuzzerInitialize(argc, argv);
  std::ifstream in(file, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", file.string().c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  for (const std::string& s : settings) ::unsetenv(s.substr(0, s.find('=')).c_str());
  if (!settings.empty() && LLVMFuzzerInitialize) LLVMFuzzerInitialize(argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  size_t n = 0;
  for (int i = 1; i < argc; ++i) {
    const fs::path root = argv[i];
    std::vector<fs::path> files;
    if (fs::is_directory(root)) {
      for (const auto& e : fs::recursive_directory_iterator(root))
        if (e.is_regular_file() && e.path().filename().string().rfind("README", 0) != 0)
          files.push_back(e.path());
    } else if (fs::is_regular_file(root)) {
      files.push_back(root);
    }
    std::sort(files.begin(), files.end());  // the same order on every machine
    for (const fs::path& f : files)
      replay(fs::is_directory(root) ? root : root.parent_path(), f, &argc, &argv);
    n += files.size();
  }
  std::fprintf(stderr, "replayed %zu inputs: no finding\n", n);
  return n == 0 ? 1 : 0;
}
