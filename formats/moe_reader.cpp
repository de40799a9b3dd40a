#include "formats/moe_reader.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace moepack {

using reader::ActQuant;
using reader::Kind;
using reader::ProjReader;

namespace {

std::string num(int64_t v) {
  return std::to_string(v);
}

}  // namespace

ProjReader blank_reader(Kind kind, ActQuant act) {
  ProjReader r;
  std::memset(&r, 0, sizeof r);
  r.kind = kind;
  r.act = act;
  return r;
}

int32_t reader_scale_type(DType d, const std::string& what) {
  switch (d) {
    case DType::kF16:
      return reader::kScaleF16;
    case DType::kBF16:
      return reader::kScaleBf16;
    case DType::kF32:
      return reader::kScaleF32;
    case DType::kF8_E4M3:
      return reader::kScaleE4m3;
    default:
      if (is_scale_byte_dtype(d)) return reader::kScaleE8m0;
      throw Error(ErrorCode::kBadDtype, "", what,
                  std::string("no reader for scale dtype ") + dtype_name(d));
  }
}

const void* locate_param(const ParamLocator& locate, const TensorMap& params,
                         const std::string& name) {
  const Tensor& t = require_tensor(params, name);
  const void* p = locate(name, t);
  if (!p && !t.data.empty())
    throw Error(ErrorCode::kInternal, "", name, "the parameter locator returned no address");
  return p;
}

ActQuant act_quant_16bit(const LayoutOptions& lo) {
  return lo.act_dtype == DType::kF16 ? ActQuant::kFp16 : ActQuant::kBf16;
}

const void* host_param(const std::string&, const Tensor& host_tensor) {
  return host_tensor.data.data();
}

const void* host_buffer(const void* host_ptr, size_t) {
  return host_ptr;
}

namespace {

[[noreturn]] void throw_wide_codes() {
  throw Error(ErrorCode::kInternal, "", "canonical reader",
              "codes do not fit in 4 bits: cannot be packed two per byte");
}

uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

void pack_code_nibbles_scalar(const uint8_t* codes, size_t count, bool signed_codes, uint8_t* out) {
  // A code fits when its byte is what its low nibble unpacks to (code_nibble).
  uint32_t bad = 0;
  const auto fit = [signed_codes, &bad](uint8_t c) {
    const uint32_t nib = c & 0xfu;
    const uint32_t back = signed_codes && (nib & 8u) ? nib | 0xf0u : nib;
    bad |= back ^ c;
    return nib;
  };
  const size_t pairs = count / 2;
  for (size_t i = 0; i < pairs; ++i)
    out[i] = static_cast<uint8_t>(fit(codes[2 * i]) | (fit(codes[2 * i + 1]) << 4));
  if (count % 2) out[pairs] = static_cast<uint8_t>(fit(codes[count - 1]));
  if (bad) throw_wide_codes();
}

void pack_code_nibbles(const uint8_t* codes, size_t count, bool signed_codes, uint8_t* out) {
  // Eight codes a step as one 64-bit word. A byte fits when its high nibble is what sign (or
  // zero) extension of its low nibble gives: 0xf where bit 3 is set and the codes are signed,
  // else 0. The packed byte of codes 2i, 2i + 1 is low nibble | next byte's low nibble << 4;
  // the four even bytes are then gathered into 32 bits.
  constexpr uint64_t kLow = 0x0f0f0f0f0f0f0f0full, kHigh = 0xf0f0f0f0f0f0f0f0ull;
  constexpr uint64_t kOnes = 0x0101010101010101ull;
  const uint64_t sign_mask = signed_codes ? kOnes : 0;
  uint64_t bad = 0;
  const size_t words = count / 8;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t v = load_u64(codes + 8 * i);
    bad |= (v & kHigh) ^ (((v >> 3) & sign_mask) * 0xf0u);
    uint64_t x = v & kLow;
    x = (x | (x >> 4)) & 0x00ff00ff00ff00ffull;
    x = (x | (x >> 8)) & 0x0000ffff0000ffffull;
    x = (x | (x >> 16)) & 0x00000000ffffffffull;
    const uint32_t packed = static_cast<uint32_t>(x);
    std::memcpy(out + 4 * i, &packed, 4);
  }
  const size_t done = 8 * words;
  if (count > done) {
    try {
      pack_code_nibbles_scalar(codes + done, count - done, signed_codes, out + done / 2);
    } catch (const Error&) {
      bad = 1;
    }
  }
  if (bad) throw_wide_codes();
}

namespace {

// QuantTensor::check_consistent for a tensor whose codes live elsewhere (codes_at): no codes
// held, every other buffer the size its shape says.
void check_consistent_without_codes(const QuantTensor& q) {
  const auto fail = [](const std::string& m) {
    throw Error(ErrorCode::kInternal, "", "canonical reader", "inconsistent QuantTensor: " + m);
  };
  if (!q.codes.empty()) fail("codes held and located elsewhere");
  if (q.experts < 0 || q.n < 0 || q.k < 0) fail("negative extent");
  if (static_cast<int64_t>(q.scales.size()) !=
      q.experts * q.scale_rows() * q.groups() * q.scale_bytes())
    fail("scales size");
  if (q.symmetric ? !q.zeros.empty()
                  : static_cast<int64_t>(q.zeros.size()) != q.experts * q.n * q.groups())
    fail("zeros size");
  if (!q.g_idx.empty() && static_cast<int64_t>(q.g_idx.size()) != q.experts * q.k)
    fail("g_idx size");
  if (q.global_scale == GlobalScale::kNone
          ? !q.global_scales.empty()
          : q.global_shards < 1 || q.n % q.global_shards != 0 ||
                static_cast<int64_t>(q.global_scales.size()) != q.experts * q.global_shards)
    fail("global scales");
}

}  // namespace

ProjReader make_canonical_reader(const QuantTensor& q, ActQuant act, const BufferLocator& locate,
                                 const NibbleLocator& pack, const uint8_t* codes_at) {
  if (codes_at)
    check_consistent_without_codes(q);
  else
    q.check_consistent("canonical reader");
  ProjReader r = blank_reader(Kind::kCanonical, act);
  r.experts = q.experts;
  r.n = q.n;
  r.k = q.k;
  const auto at = [&](const void* p, size_t bytes) -> const void* {
    if (bytes == 0) return nullptr;
    const void* d = locate(p, bytes);
    if (!d) throw Error(ErrorCode::kInternal, "", "canonical reader", "the locator returned null");
    return d;
  };
  reader::CanonicalParams& c = r.canonical;
  if (codes_at) {
    c.codes = codes_at;
    c.packed_codes = q.bits <= 4 ? 1 : 0;
  } else if (pack && q.bits <= 4 && !q.codes.empty()) {
    c.codes = static_cast<const uint8_t*>(pack(q.codes.data(), q.codes.size()));
    if (!c.codes)
      throw Error(ErrorCode::kInternal, "", "canonical reader", "the locator returned null");
    c.packed_codes = 1;
  } else {
    c.codes = static_cast<const uint8_t*>(at(q.codes.data(), q.codes.size()));
  }
  c.scales = at(q.scales.data(), q.scales.size());
  if (!q.symmetric) c.zeros = static_cast<const uint8_t*>(at(q.zeros.data(), q.zeros.size()));
  if (!q.g_idx.empty()) {  // weight() follows g_idx into the scales
    c.g_idx = static_cast<const int32_t*>(at(q.g_idx.data(), q.g_idx.size() * 4));
    const int64_t G = q.groups();
    for (size_t i = 0; i < q.g_idx.size(); ++i)
      if (q.g_idx[i] < 0 || q.g_idx[i] >= G)
        throw Error(ErrorCode::kBadValue, "", "g_idx",
                    "g_idx[" + num(static_cast<int64_t>(i)) + "] = " + num(q.g_idx[i]) +
                        " outside [0, " + num(G) + ")");
  }
  c.code_type = q.kind == CodeKind::kUint      ? reader::kCodeUint
                : q.kind == CodeKind::kInt     ? reader::kCodeInt
                : q.kind == CodeKind::kFp4E2M1 ? reader::kCodeFp4
                                               : reader::kCodeFp8;
  c.bits = q.bits;
  c.scale_type = reader_scale_type(q.scale_dtype, "scales");
  c.group_size = q.group_size;
  c.groups = q.groups();
  c.scale_block_n = q.scale_block_n;
  c.scale_rows = q.scale_rows();
  c.global_type = q.global_scale == GlobalScale::kDecodeMultiplier ? reader::kGlobalDecode
                  : q.global_scale == GlobalScale::kEncodeDivisor  ? reader::kGlobalEncode
                                                                   : reader::kGlobalNone;
  if (c.global_type != reader::kGlobalNone) {
    c.global_scales =
        static_cast<const float*>(at(q.global_scales.data(), q.global_scales.size() * 4));
    c.global_shards = q.global_shards;
    c.global_shard_rows = q.n / q.global_shards;
  }
  return r;
}

ProjReader make_reference_reader(const ProjReader& layout, const QuantTensor& q,
                                 const BufferLocator& locate, const NibbleLocator& pack,
                                 const uint8_t* codes_at) {
  ProjReader r = make_canonical_reader(q, layout.act, locate, pack, codes_at);
  r.act_scale = layout.act_scale;
  return r;
}

// ---- the generic expert matmul ---------------------------------------------------------------

namespace {

// Output rows decoded together: their dot products run as independent chains (each still sums
// its K products in column order, so the result equals one row at a time bit for bit).
constexpr int64_t kRowsAtOnce = 4;

// y[i, n0 + j] = x[i, :] . w[j, :] for j < rows, i < m (x [m, k], w [rows, k], y [m, ldy]).
void dot_rows(const float* x, int64_t m, int64_t k, const float* w, int64_t rows, float* y,
              int64_t ldy, int64_t n0) {
  if (rows != kRowsAtOnce) {
    for (int64_t j = 0; j < rows; ++j)
      dot_weight_row_into_column(x, m, k, w + j * k, y, ldy, n0 + j);
    return;
  }
  const float *w0 = w, *w1 = w + k, *w2 = w + 2 * k, *w3 = w + 3 * k;
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * k;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float v = xi[kk];
      a0 += v * w0[kk];
      a1 += v * w1[kk];
      a2 += v * w2[kk];
      a3 += v * w3[kk];
    }
    float* yi = y + i * ldy + n0;
    yi[0] = a0;
    yi[1] = a1;
    yi[2] = a2;
    yi[3] = a3;
  }
}

}  // namespace

void reader_expert_matmul(const ProjReader& r, int64_t expert, const float* x, int64_t m,
                          float* y) {
  if (expert < 0 || expert >= r.experts)
    throw Error(ErrorCode::kBadValue, "", "expert",
                "expert " + num(expert) + " outside the reader's [0, " + num(r.experts) + ")");
  const int64_t N = r.n, K = r.k;
  // Activations in the layout's column order (act-order permutes them), gathered once.
  std::vector<int64_t> col(static_cast<size_t>(K));
  reader::act_cols(r, expert, col.data());
  bool identity = true;
  for (int64_t kk = 0; kk < K; ++kk) identity = identity && col[static_cast<size_t>(kk)] == kk;
  std::vector<float> gathered;
  const float* xs = x;
  if (!identity) {
    gathered.resize(static_cast<size_t>(m * K));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t kk = 0; kk < K; ++kk)
        gathered[static_cast<size_t>(i * K + kk)] = x[i * K + col[static_cast<size_t>(kk)]];
    xs = gathered.data();
  }
  std::vector<float> w(static_cast<size_t>(kRowsAtOnce * K));
  for (int64_t n0 = 0; n0 < N; n0 += kRowsAtOnce) {
    const int64_t rows = std::min(kRowsAtOnce, N - n0);
    for (int64_t j = 0; j < rows; ++j) reader::weight_row(r, expert, n0 + j, w.data() + j * K);
    dot_rows(xs, m, K, w.data(), rows, y, N, n0);
  }
}

}  // namespace moepack
