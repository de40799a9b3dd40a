// libFuzzer target: every source codec's unpack (the rows of source_codecs(), formats/registry.cpp)
// on hostile tensors. unpack, logical_shape, refine and has_act_order must return or throw a
// moepack::Error other than kInternal -- never crash, read out of bounds or hit undefined
// behaviour -- whatever the bytes, shapes and dtypes of the tensors.
//
// Input: [0] codec row (ignored when MOEPACK_FUZZ_CODEC names one), [1] params index into the
// row's param_space(), [2] N and [3] K selectors, [4] mutation (bit 7: one tensor's shape changes
// by one, bit 6: its dtype changes, bit 5: one tensor is removed, bits 0-4: which), then the
// bytes. The tensors are first the codec's own pack of a zero QuantTensor of that shape (right
// names, dtypes and shapes), then their bytes are replaced by the input's, then mutated.
//
//   MOEPACK_FUZZ_CODEC=gptq build-fuzz/bin/fuzz_unpack corpus/  (one row: bench/fuzz.sh)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/codec.h"

namespace {

using moepack::DType;
using moepack::Error;
using moepack::ErrorCode;

const moepack::SourceCodec* g_pinned = nullptr;

// The dtypes a mutated tensor may take (every dtype a codec stores or might be handed).
constexpr DType kDtypes[] = {DType::kF4,   DType::kI32, DType::kU8,      DType::kF16,
                             DType::kBF16, DType::kF32, DType::kF8_E4M3, DType::kF8_E8M0,
                             DType::kI8,   DType::kI64, DType::kU32,     DType::kF8_E5M2,
                             DType::kBOOL};

void mutate(moepack::TensorMap& tm, uint8_t how) {
  if (tm.empty() || (how & 0xe0) == 0) return;
  auto it = tm.begin();
  std::advance(it, (how & 0x1f) % tm.size());
  moepack::Tensor& t = it->second;
  if (how & 0x20) {
    tm.erase(it);
    return;
  }
  if ((how & 0x80) && !t.shape.empty()) {
    int64_t& d = t.shape[(how & 0x1f) % t.shape.size()];
    d = (how & 1) ? d + 1 : (d > 0 ? d - 1 : 0);
  }
  if (how & 0x40) t.dtype = kDtypes[(how >> 1) % (sizeof(kDtypes) / sizeof(kDtypes[0]))];
  // A Tensor's bytes always match its shape and dtype (the invariant every reader relies on).
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  t.data.resize(static_cast<size_t>((numel * moepack::dtype_bits(t.dtype) + 7) / 8));
}

}  // namespace

// MOEPACK_FUZZ_CODEC=<row> pins a row (unset: the input's first byte picks one); =list prints the
// rows, one a line, and exits (bench/fuzz.sh runs one target per row). Called again by the replay
// driver (replay_main.cpp) when a reproducer's folder sets the variable.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_pinned = nullptr;
  const char* name = std::getenv("MOEPACK_FUZZ_CODEC");
  if (name && std::strcmp(name, "list") == 0) {
    for (const auto& row : moepack::source_codecs()) std::printf("%s\n", row.name);
    std::exit(0);
  }
  if (name && *name) {
    for (const auto& row : moepack::source_codecs())
      if (std::strcmp(row.name, name) == 0) g_pinned = &row;
    if (!g_pinned) {
      std::string known;
      for (const auto& row : moepack::source_codecs()) known += std::string(" ") + row.name;
      std::fprintf(stderr, "MOEPACK_FUZZ_CODEC=%s: no such source codec (%s)\n", name,
                   known.c_str());
      std::abort();
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const auto& rows = moepack::source_codecs();
  const moepack::SourceCodec& row = g_pinned ? *g_pinned : rows[data[0] % rows.size()];
  const std::vector<moepack::QuantParams> space = row.param_space();
  if (space.empty()) return 0;
  const moepack::QuantParams params = space[data[1] % space.size()];
  const moepack::QuantSpec spec = row.spec_for(params);
  // Shapes the codec's own pack takes: N a multiple of the scale block, K of the group and of 32.
  const int64_t block_n = std::max<int64_t>(16, spec.scale_block_n);
  const int64_t block_k = std::max<int64_t>(32, spec.group_size > 0 ? spec.group_size : 32);
  const int64_t n = block_n * (1 + data[2] % 2), k = block_k * (1 + data[3] % 3);
  moepack::TensorMap tm;
  try {
    tm = row.pack(params, moepack::QuantTensor(spec, 1, n, k));
  } catch (const Error&) {
    return 0;  // a shape this params set does not pack
  }
  // The input's bytes in place of pack's, cycling.
  size_t at = 5;
  for (auto& [suffix, t] : tm)
    for (auto& b : t.data) b = size > 5 ? data[5 + (at++ - 5) % (size - 5)] : 0;
  mutate(tm, data[4]);
  std::map<std::string, moepack::TensorView> views;
  for (const auto& [suffix, t] : tm) views[suffix] = t.view();
  try {
    const auto [ln, lk] = row.logical_shape(params, views);
    if (row.refine) row.refine(params, views);
    if (row.has_act_order) row.has_act_order(params, views);
    const moepack::QuantTensor q = row.unpack(params, tm, ln, lk);
    q.check_consistent("fuzz_unpack");  // sizes of what unpack returned match its shape
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInternal) __builtin_trap();  // a bug, not bad input
  }
  return 0;
}
