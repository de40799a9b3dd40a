#include "core/sha256.h"

#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define MOEPACK_SHA_NI 1
#endif

namespace moepack {
namespace {
constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
inline uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

#ifdef MOEPACK_SHA_NI
// The x86 SHA extensions (SHA-NI): the same compression function, several times faster;
// checksumming the converted tensors is otherwise a large share of a conversion. Used when the
// CPU has them; tests compare it with the scalar path.
__attribute__((target("sha,sse4.1"))) void blocks_sha_ni(uint32_t h[8], const uint8_t* p,
                                                         size_t nblocks) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)), 0xB1);
  __m128i state1 =
      _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4)), 0x1B);
  __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);  // ABEF
  state1 = _mm_blend_epi16(state1, tmp, 0xF0);       // CDGH
  for (; nblocks; --nblocks, p += 64) {
    const __m128i abef = state0, cdgh = state1;
    __m128i w[16];
    for (int i = 0; i < 4; ++i)
      w[i] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)), bswap);
    for (int i = 4; i < 16; ++i)
      w[i] = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(w[i - 4], w[i - 3]),
                                                _mm_alignr_epi8(w[i - 1], w[i - 2], 4)),
                                  w[i - 1]);
    for (int i = 0; i < 16; ++i) {
      __m128i msg =
          _mm_add_epi32(w[i], _mm_loadu_si128(reinterpret_cast<const __m128i*>(kK + 4 * i)));
      state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
      msg = _mm_shuffle_epi32(msg, 0x0E);
      state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
    }
    state0 = _mm_add_epi32(state0, abef);
    state1 = _mm_add_epi32(state1, cdgh);
  }
  tmp = _mm_shuffle_epi32(state0, 0x1B);        // FEBA
  state1 = _mm_shuffle_epi32(state1, 0xB1);     // DCHG
  state0 = _mm_blend_epi16(tmp, state1, 0xF0);  // DCBA
  state1 = _mm_alignr_epi8(state1, tmp, 8);     // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), state0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), state1);
}

// Two independent messages at once, block for block: each SHA256RNDS2 waits for the one before
// it of its own message, so one message leaves the unit idle most cycles (latency 3-4, a new
// one every cycle); two messages' rounds interleaved fill those cycles.
__attribute__((target("sha,sse4.1"))) void blocks_sha_ni_x2(uint32_t ha[8], const uint8_t* pa,
                                                            uint32_t hb[8], const uint8_t* pb,
                                                            size_t nblocks) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i s0[2], s1[2];
  uint32_t* const hs[2] = {ha, hb};
  for (int m = 0; m < 2; ++m) {
    const __m128i tmp =
        _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hs[m])), 0xB1);
    const __m128i hi =
        _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hs[m] + 4)), 0x1B);
    s0[m] = _mm_alignr_epi8(tmp, hi, 8);     // ABEF
    s1[m] = _mm_blend_epi16(hi, tmp, 0xF0);  // CDGH
  }
  for (; nblocks; --nblocks, pa += 64, pb += 64) {
    const __m128i abef0 = s0[0], cdgh0 = s1[0], abef1 = s0[1], cdgh1 = s1[1];
    __m128i wa[16], wb[16];
    for (int i = 0; i < 4; ++i) {
      wa[i] =
          _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pa + 16 * i)), bswap);
      wb[i] =
          _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + 16 * i)), bswap);
    }
    for (int i = 4; i < 16; ++i) {
      wa[i] = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(wa[i - 4], wa[i - 3]),
                                                 _mm_alignr_epi8(wa[i - 1], wa[i - 2], 4)),
                                   wa[i - 1]);
      wb[i] = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(wb[i - 4], wb[i - 3]),
                                                 _mm_alignr_epi8(wb[i - 1], wb[i - 2], 4)),
                                   wb[i - 1]);
    }
    for (int i = 0; i < 16; ++i) {
      const __m128i k = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kK + 4 * i));
      __m128i ma = _mm_add_epi32(wa[i], k), mb = _mm_add_epi32(wb[i], k);
      s1[0] = _mm_sha256rnds2_epu32(s1[0], s0[0], ma);
      s1[1] = _mm_sha256rnds2_epu32(s1[1], s0[1], mb);
      ma = _mm_shuffle_epi32(ma, 0x0E);
      mb = _mm_shuffle_epi32(mb, 0x0E);
      s0[0] = _mm_sha256rnds2_epu32(s0[0], s1[0], ma);
      s0[1] = _mm_sha256rnds2_epu32(s0[1], s1[1], mb);
    }
    s0[0] = _mm_add_epi32(s0[0], abef0);
    s1[0] = _mm_add_epi32(s1[0], cdgh0);
    s0[1] = _mm_add_epi32(s0[1], abef1);
    s1[1] = _mm_add_epi32(s1[1], cdgh1);
  }
  for (int m = 0; m < 2; ++m) {
    const __m128i tmp = _mm_shuffle_epi32(s0[m], 0x1B);                                      // FEBA
    const __m128i dchg = _mm_shuffle_epi32(s1[m], 0xB1);                                     // DCHG
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hs[m]), _mm_blend_epi16(tmp, dchg, 0xF0));   // DCBA
    _mm_storeu_si128(reinterpret_cast<__m128i*>(hs[m] + 4), _mm_alignr_epi8(dchg, tmp, 8));  // HGFE
  }
}

bool have_sha_ni() {
  // CPUID leaf 7 EBX bit 29 = SHA, leaf 1 ECX bit 19 = SSE4.1 (portable across GCC and Clang,
  // whose __builtin_cpu_supports feature names differ).
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19))) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 29)) != 0;
  }();
  return yes;
}
#endif
}  // namespace

bool Sha256::use_hardware = true;

Sha256::Sha256() {
  const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                            0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(h_, init, sizeof(h_));
}

void Sha256::blocks(const uint8_t* p, size_t nblocks) {
#ifdef MOEPACK_SHA_NI
  if (use_hardware && have_sha_ni()) {
    blocks_sha_ni(h_, p, nblocks);
    return;
  }
#endif
  for (; nblocks; --nblocks, p += 64) block(p);
}

void Sha256::update_pair(Sha256& a, const void* data_a, Sha256& b, const void* data_b, size_t len) {
#ifdef MOEPACK_SHA_NI
  if (use_hardware && have_sha_ni() && a.buf_len_ == 0 && b.buf_len_ == 0 && len >= 64) {
    const size_t whole = len / 64 * 64;
    blocks_sha_ni_x2(a.h_, static_cast<const uint8_t*>(data_a), b.h_,
                     static_cast<const uint8_t*>(data_b), whole / 64);
    a.total_ += whole;
    b.total_ += whole;
    a.update(static_cast<const uint8_t*>(data_a) + whole, len - whole);
    b.update(static_cast<const uint8_t*>(data_b) + whole, len - whole);
    return;
  }
#endif
  a.update(data_a, len);
  b.update(data_b, len);
}

void Sha256::block(const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t(p[4 * i]) << 24) | (uint32_t(p[4 * i + 1]) << 16) |
           (uint32_t(p[4 * i + 2]) << 8) | uint32_t(p[4 * i + 3]);
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = h + s1 + ch + kK[i] + w[i];
    const uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::update(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += len;
  if (buf_len_) {
    const size_t take = std::min(len, 64 - buf_len_);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    len -= take;
    if (buf_len_ == 64) {
      blocks(buf_, 1);
      buf_len_ = 0;
    }
  }
  if (len >= 64) {
    blocks(p, len / 64);
    p += len / 64 * 64;
    len %= 64;
  }
  if (len) {
    std::memcpy(buf_, p, len);
    buf_len_ = len;
  }
}

std::array<uint8_t, 32> Sha256::digest() {
  const uint64_t bits = total_ * 8;
  const uint8_t pad = 0x80;
  update(&pad, 1);
  const uint8_t zero = 0;
  while (buf_len_ != 56) update(&zero, 1);
  uint8_t len_be[8];
  for (int i = 0; i < 8; ++i) len_be[i] = uint8_t(bits >> (56 - 8 * i));
  update(len_be, 8);
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) out[4 * i + j] = uint8_t(h_[i] >> (24 - 8 * j));
  return out;
}

std::string Sha256::hex_digest() {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : digest()) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

std::string sha256_hex(const void* data, size_t len) {
  Sha256 h;
  h.update(data, len);
  return h.hex_digest();
}

}  // namespace moepack
