// SHA-256 (FIPS 180-4) for the manifest's per-tensor checksums. Streaming: update() in pieces.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace moepack {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  std::array<uint8_t, 32> digest();  // finalises; call once
  std::string hex_digest();
  // a.update(data_a, len) and b.update(data_b, len), the two messages' blocks computed together
  // (twice one message's throughput a core with the SHA extensions, where both are at a block
  // boundary): for a reader with two streams to hash.
  static void update_pair(Sha256& a, const void* data_a, Sha256& b, const void* data_b, size_t len);

  // Use the CPU's SHA extensions when present (default). Tests turn it off to compare paths.
  static bool use_hardware;

 private:
  void block(const uint8_t* p);  // scalar compression of one 64-byte block
  void blocks(const uint8_t* p, size_t nblocks);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const void* data, size_t len);

}  // namespace moepack
