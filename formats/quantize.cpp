#include "formats/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "formats/fp8.h"
#include "formats/fp8_block.h"

namespace moepack {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

// Rounds a float scale to the storage dtype and returns the value the dequantiser will see.
float store_scale(float s, DType dt, uint8_t* out) {
  switch (dt) {
    case DType::kF16: {
      const uint16_t h = float_to_f16(s);
      std::memcpy(out, &h, 2);
      return f16_to_float(h);
    }
    case DType::kBF16: {
      const uint16_t h = float_to_bf16(s);
      std::memcpy(out, &h, 2);
      return bf16_to_float(h);
    }
    default: {
      std::memcpy(out, &s, 4);
      return s;
    }
  }
}
}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}
uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}
double Rng::uniform() {
  return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
}
float Rng::normal() {
  const double u1 = 1.0 - uniform(), u2 = uniform();
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
uint64_t Rng::hash(uint64_t seed, const std::string& label) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;  // FNV-1a over the label, mixed with the seed
  for (unsigned char c : label) h = (h ^ c) * 0x100000001b3ull;
  return splitmix64(h);
}

QuantTensor quantize_int(const float* w, int64_t n, int64_t k, const IntQuantSpec& spec) {
  QuantSpec encoding;
  encoding.kind = CodeKind::kUint;
  encoding.bits = spec.bits;
  encoding.group_size = spec.group_size;
  encoding.symmetric = spec.symmetric;
  encoding.scale_dtype = spec.scale_dtype;
  QuantTensor q(encoding, 1, n, k);
  const int64_t G = q.groups(), gs = spec.group_size > 0 ? spec.group_size : k;
  const int maxq = (1 << spec.bits) - 1;
  const bool act_order = !spec.order.empty();
  std::vector<int32_t> order(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i)
    order[static_cast<size_t>(i)] =
        act_order ? spec.order[static_cast<size_t>(i)] : static_cast<int32_t>(i);
  if (act_order) {
    q.g_idx.assign(static_cast<size_t>(k), 0);
    for (int64_t i = 0; i < k; ++i)
      q.g_idx[static_cast<size_t>(order[static_cast<size_t>(i)])] = static_cast<int32_t>(i / gs);
  }
  q.codes.assign(static_cast<size_t>(n * k), 0);
  q.scales.assign(static_cast<size_t>(n * G * q.scale_bytes()), 0);
  if (!spec.symmetric) q.zeros.assign(static_cast<size_t>(n * G), 0);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = w + r * k;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t b = g * gs, e = std::min(k, b + gs);
      float lo = 0.0f, hi = 0.0f;  // GPTQ/AWQ include 0 in the range
      for (int64_t i = b; i < e; ++i) {
        const float v = row[order[static_cast<size_t>(i)]];
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      float scale, zero;
      if (spec.symmetric) {
        const float amax = std::max(-lo, hi);
        scale = amax > 0 ? 2.0f * amax / static_cast<float>(maxq) : 1.0f;
        zero = static_cast<float>(1 << (spec.bits - 1));
      } else {
        scale = hi > lo ? (hi - lo) / static_cast<float>(maxq) : 1.0f;
        zero = std::min<float>(static_cast<float>(maxq), std::max(static_cast<float>(spec.min_zero),
                                                                  std::round(-lo / scale)));
      }
      uint8_t* sp = q.scales.data() + (r * G + g) * q.scale_bytes();
      const float s = store_scale(scale, spec.scale_dtype, sp);
      if (!spec.symmetric) q.zeros[static_cast<size_t>(r * G + g)] = static_cast<uint8_t>(zero);
      for (int64_t i = b; i < e; ++i) {
        const int64_t col = order[static_cast<size_t>(i)];
        const float v = std::round(row[col] / s) + zero;
        q.codes[static_cast<size_t>(r * k + col)] =
            static_cast<uint8_t>(std::min<float>(static_cast<float>(maxq), std::max(0.0f, v)));
      }
    }
  }
  return q;
}

QuantTensor quantize_int8_channel(const float* w, int64_t n, int64_t k, DType scale_dtype) {
  QuantSpec encoding;
  encoding.kind = CodeKind::kInt;
  encoding.bits = 8;
  encoding.group_size = -1;
  encoding.symmetric = true;
  encoding.scale_dtype = scale_dtype;
  QuantTensor q(encoding, 1, n, k);
  q.codes.resize(static_cast<size_t>(n * k));
  q.scales.resize(static_cast<size_t>(n * q.scale_bytes()));
  for (int64_t r = 0; r < n; ++r) {
    float amax = 0;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(w[r * k + i]));
    const float s = store_scale(amax > 0 ? amax / 127.0f : 1.0f, scale_dtype,
                                q.scales.data() + r * q.scale_bytes());
    for (int64_t i = 0; i < k; ++i) {
      const float v = std::max(-127.0f, std::min(127.0f, std::round(w[r * k + i] / s)));
      q.codes[static_cast<size_t>(r * k + i)] = static_cast<uint8_t>(static_cast<int8_t>(v));
    }
  }
  return q;
}

QuantTensor quantize_fp8_block(const float* w, int64_t n, int64_t k, int64_t block_n,
                               int64_t block_k) {
  QuantTensor q(fp8_block_spec(block_n, block_k), 1, n, k);
  const int64_t SR = q.scale_rows(), G = q.groups();
  q.codes.resize(static_cast<size_t>(n * k));
  q.scales.resize(static_cast<size_t>(SR * G * 4));
  for (int64_t br = 0; br < SR; ++br)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r0 = br * block_n, r1 = std::min(n, r0 + block_n);
      const int64_t c0 = g * block_k, c1 = std::min(k, c0 + block_k);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * k + c]));
      const float s = amax > 0 ? amax / 448.0f : 1.0f;
      std::memcpy(q.scales.data() + (br * G + g) * 4, &s, 4);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          q.codes[static_cast<size_t>(r * k + c)] = float_to_e4m3_satfinite(w[r * k + c] / s);
    }
  return q;
}

}  // namespace moepack
