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

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const void* data, size_t len);

}  // namespace moepack
