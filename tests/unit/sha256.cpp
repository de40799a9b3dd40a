// SHA-256: FIPS 180-4 test vectors, and the SHA-NI path equal to the scalar one on random data of
// every length around the block boundaries and across update() splits.
#include "core/sha256.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace moepack {
namespace {

std::string hash_with(bool hw, const std::vector<uint8_t>& data, size_t split) {
  Sha256::use_hardware = hw;
  Sha256 h;
  h.update(data.data(), std::min(split, data.size()));
  if (split < data.size()) h.update(data.data() + split, data.size() - split);
  Sha256::use_hardware = true;
  return h.hex_digest();
}

TEST(Sha256, KnownVectors) {
  for (bool hw : {false, true}) {
    Sha256::use_hardware = hw;
    EXPECT_EQ(sha256_hex("", 0),
              "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha256_hex("abc", 3),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    EXPECT_EQ(sha256_hex(two.data(), two.size()),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const std::string million(1000000, 'a');
    EXPECT_EQ(sha256_hex(million.data(), million.size()),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  }
  Sha256::use_hardware = true;
}

TEST(Sha256, HardwarePathEqualsScalarPath) {
  std::mt19937_64 rng(5);
  for (size_t len : {0, 1, 55, 56, 63, 64, 65, 127, 128, 129, 1000, 4096, 100003}) {
    std::vector<uint8_t> data(len);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    for (size_t split : {size_t(0), size_t(1), size_t(63), len / 2, len}) {
      EXPECT_EQ(hash_with(true, data, split), hash_with(false, data, split)) << len << " " << split;
    }
  }
}

}  // namespace
}  // namespace moepack
