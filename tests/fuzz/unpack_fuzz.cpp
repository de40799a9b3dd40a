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
// Cost per execution (bench/fuzz.sh runs each row to 10 M): the zero QuantTensor's pack is the
// same for every input with the same (row, params, N, K), so it is made once per combination and
// copied (pack is not what this target tests: the registry suite's round trips do); the input's
// bytes are laid over the tensors in runs of memcpy rather than one instrumented byte at a time
// (the same bytes in the same order as before: a saved corpus means what it meant). What unpack,
// logical_shape, refine and has_act_order see, and every check below, are unchanged.
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
#include <tuple>
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

// The input's bytes from `at` on, cycling, over `out` (size > 0): byte i of out is
// bytes[(at + i) % size]. One period is copied, then the filled prefix (a whole number of
// periods) doubles: a few memcpy calls instead of one per period (inputs are tens of bytes,
// tensors up to ~100 KB). Returns the next position.
size_t lay_cyclic(const uint8_t* bytes, size_t size, size_t at, std::vector<uint8_t>& out) {
  const size_t n = out.size();
  const size_t first = std::min(size - at, n);
  std::memcpy(out.data(), bytes + at, first);
  if (first < n) std::memcpy(out.data() + first, bytes, std::min(at, n - first));
  for (size_t filled = std::min(size, n); filled < n; filled *= 2)
    std::memcpy(out.data() + filled, out.data(), std::min(filled, n - filled));
  return (at + n) % size;
}

// What the row's pack makes of a zero QuantTensor, per (row, params, N selector, K selector):
// made on first use (pack is deterministic); `refused` where pack throws for that shape.
struct Packed {
  bool made = false, refused = false;
  moepack::TensorMap tensors;
};
using PackedKey = std::tuple<const moepack::SourceCodec*, size_t, int, int>;
std::map<PackedKey, Packed>& packed_zeros() {
  static std::map<PackedKey, Packed> cache;
  return cache;
}

const std::vector<moepack::QuantParams>& param_space_of(const moepack::SourceCodec& row) {
  static std::map<const moepack::SourceCodec*, std::vector<moepack::QuantParams>> cache;
  auto it = cache.find(&row);
  if (it == cache.end()) it = cache.emplace(&row, row.param_space()).first;
  return it->second;
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
  const std::vector<moepack::QuantParams>& space = param_space_of(row);
  if (space.empty()) return 0;
  const size_t params_index = data[1] % space.size();
  const moepack::QuantParams& params = space[params_index];
  const int n_sel = data[2] % 2, k_sel = data[3] % 3;
  Packed& packed = packed_zeros()[{&row, params_index, n_sel, k_sel}];
  if (!packed.made) {
    packed.made = true;
    const moepack::QuantSpec spec = row.spec_for(params);
    // Shapes the codec's own pack takes: N a multiple of the scale block, K of the group and of
    // 32.
    const int64_t block_n = std::max<int64_t>(16, spec.scale_block_n);
    const int64_t block_k = std::max<int64_t>(32, spec.group_size > 0 ? spec.group_size : 32);
    const int64_t n = block_n * (1 + n_sel), k = block_k * (1 + k_sel);
    try {
      packed.tensors = row.pack(params, moepack::QuantTensor(spec, 1, n, k));
    } catch (const Error&) {
      packed.refused = true;  // a shape this params set does not pack
    }
  }
  if (packed.refused) return 0;
  moepack::TensorMap tm = packed.tensors;
  // The input's bytes in place of pack's, cycling.
  if (size > 5) {
    size_t at = 0;
    for (auto& [suffix, t] : tm) at = lay_cyclic(data + 5, size - 5, at, t.data);
  } else {
    for (auto& [suffix, t] : tm) std::fill(t.data.begin(), t.data.end(), uint8_t{0});
  }
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
