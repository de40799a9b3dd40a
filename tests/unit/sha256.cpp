// SHA-256: FIPS 180-4 test vectors, and the SHA-NI path equal to the scalar one on random data of
// every length around the block boundaries and across update() splits; two messages at once
// (update_pair) equal to each alone; hashing a mapped range
// read once (core/memory.h) equal to hashing it whole, its pages dropped.
#include "core/sha256.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/memory.h"
#include "tests/test_util.h"

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

// update_pair (two messages' blocks at once) equal to each message's own update, hardware and
// scalar, from any prefix (a pending partial block takes the one-message path) over any length.
TEST(Sha256, UpdatePairEqualsTwoUpdates) {
  std::mt19937_64 rng(11);
  for (bool hw : {true, false}) {
    for (int trial = 0; trial < 200; ++trial) {
      const size_t pre_a = rng() % 3 == 0 ? 64 * (rng() % 3) : rng() % 200;
      const size_t pre_b = rng() % 2 == 0 ? pre_a : rng() % 200;
      const size_t len = trial < 10 ? static_cast<size_t>(trial) * 64 : rng() % 9000;
      std::vector<uint8_t> da(pre_a + len), db(pre_b + len);
      for (auto& x : da) x = static_cast<uint8_t>(rng());
      for (auto& x : db) x = static_cast<uint8_t>(rng());
      Sha256::use_hardware = hw;
      Sha256 a, b;
      a.update(da.data(), pre_a);
      b.update(db.data(), pre_b);
      Sha256::update_pair(a, da.data() + pre_a, b, db.data() + pre_b, len);
      const std::string got_a = a.hex_digest(), got_b = b.hex_digest();
      Sha256::use_hardware = false;
      EXPECT_EQ(got_a, sha256_hex(da.data(), da.size())) << hw << " " << pre_a << " " << len;
      EXPECT_EQ(got_b, sha256_hex(db.data(), db.size())) << hw << " " << pre_b << " " << len;
    }
  }
  Sha256::use_hardware = true;
}

// sha256_hex_read_once over a read-only file mapping: the digest of the range whatever its
// offset and length (pieces of 4 MiB, ranges starting and ending inside pages), the range's pages
// dropped from the process's resident memory and the bytes still the file's; without release,
// on ordinary memory, sha256_hex and the bytes untouched.
TEST(Sha256, ReadOnceOfAMappingEqualsTheWholeHashAndDropsItsPages) {
  test::TempDir tmp;
  const std::string path = tmp / "data.bin";
  std::vector<uint8_t> data((size_t{24} << 20) + 4321);
  std::mt19937_64 rng(11);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* map = ::mmap(nullptr, data.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  const auto* mapped = static_cast<const uint8_t*>(map);
  for (const auto& [off, len] : std::vector<std::pair<size_t, size_t>>{
           {0, 0}, {0, 100}, {77, (size_t{4} << 20) + 1}, {4095, (size_t{9} << 20) + 123}}) {
    SCOPED_TRACE(std::to_string(off) + " + " + std::to_string(len));
    EXPECT_EQ(sha256_hex_read_once(mapped + off, len, true), sha256_hex(data.data() + off, len));
  }
  // Resident, then dropped as hashed: all but a page at each end of the range.
  const std::string want = sha256_hex(data.data() + 100, data.size() - 200);
  EXPECT_EQ(sha256_hex(mapped, data.size()), sha256_hex(data.data(), data.size()));
  const uint64_t before = resident_memory().file_bytes;
  EXPECT_EQ(sha256_hex_read_once(mapped + 100, data.size() - 200, true), want);
  const uint64_t after = resident_memory().file_bytes;
  EXPECT_GT(before, after + (size_t{23} << 20)) << "before " << before << " after " << after;
  EXPECT_EQ(std::memcmp(mapped, data.data(), data.size()), 0);  // faulted back, the same bytes
  ::munmap(map, data.size());
  std::vector<uint8_t> copy = data;
  EXPECT_EQ(sha256_hex_read_once(copy.data(), copy.size(), false),
            sha256_hex(data.data(), data.size()));
  EXPECT_EQ(copy, data);
}

}  // namespace
}  // namespace moepack
