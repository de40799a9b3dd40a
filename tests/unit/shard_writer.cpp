// ShardedWriter::write_parts (several writers: each part hashed by one thread, its pieces
// pwritten by whichever thread takes them) writes the bytes and checksums of write_part called
// part by part, at every writer count, with tensors of 0 bytes, under one piece, exactly one
// piece and several pieces, across shard boundaries and batches; the flusher closes complete
// shards early without changing a byte; misuse and an error on a writer thread are one Error.
#include "io/shard_writer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "core/error.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::TempDir;

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

struct Named {
  std::string name;
  std::vector<uint8_t> bytes;
};

// Tensors of U8 whose sizes straddle the piece size; every byte random (never all zero).
std::vector<Named> random_tensors() {
  const uint64_t piece = ShardedWriter::kPieceBytes;
  const uint64_t sizes[] = {
      0, 5, piece, 3 * piece + piece / 2 + 3, 2 * piece / 9, 64 << 10, piece + 1, 7 * piece, 17};
  std::mt19937_64 rng(7);
  std::vector<Named> ts;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    Named t{"layers." + std::to_string(i) + ".weight", std::vector<uint8_t>(sizes[i])};
    for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(rng());
    ts.push_back(std::move(t));
  }
  return ts;
}

ShardPlan plan_of(const std::vector<Named>& ts) {
  std::vector<SafetensorsEntry> entries;
  for (const Named& t : ts) {
    SafetensorsEntry e;
    e.name = t.name;
    e.dtype = DType::kU8;
    e.shape = {static_cast<int64_t>(t.bytes.size())};
    entries.push_back(e);
  }
  return plan_shards(entries, 6 * ShardedWriter::kPieceBytes);  // several shards
}

// The k-th of three uneven parts of a tensor: [0, n/3), [n/3, n - n/5), [n - n/5, n).
std::pair<uint64_t, uint64_t> part_range(uint64_t n, int k) {
  const uint64_t cut[] = {0, n / 3, n - n / 5, n};
  return {cut[k], cut[k + 1] - cut[k]};
}

TEST(ShardedWriter, WritePartsEqualWritePartAtEveryWriterCount) {
  const std::vector<Named> ts = random_tensors();
  const ShardPlan plan = plan_of(ts);
  ASSERT_GT(plan.shard_names.size(), 2u);
  TempDir tmp;
  const std::string ref = tmp / "ref";
  std::filesystem::create_directories(ref);
  std::map<std::string, std::string> ref_sha;
  {
    ShardedWriter w(ref, plan);
    for (const Named& t : ts)
      for (int k = 0; k < 3; ++k) {
        const auto [off, len] = part_range(t.bytes.size(), k);
        w.write_part(t.name, t.bytes.data() + off, len, off);
      }
    w.finish();
    ref_sha = w.checksums();
  }
  ASSERT_EQ(ref_sha.size(), ts.size());
  for (const int writers : {1, 2, 3, 8, 0}) {
    SCOPED_TRACE("writers " + std::to_string(writers));
    const std::string dir = tmp / ("w" + std::to_string(writers));
    std::filesystem::create_directories(dir);
    ShardedWriter w(dir, plan);
    // Batch k holds the k-th part of every tensor: a tensor's parts arrive in order, batch by
    // batch, as a chunk's tensors do from convert.
    for (int k = 0; k < 3; ++k) {
      std::vector<TensorPart> batch;
      for (const Named& t : ts) {
        const auto [off, len] = part_range(t.bytes.size(), k);
        batch.push_back({t.name, t.bytes.data() + off, len, off});
      }
      w.write_parts(batch, writers);
    }
    w.finish();
    EXPECT_EQ(w.checksums(), ref_sha);
    for (const std::string& shard : plan.shard_names)
      EXPECT_TRUE(test::bytes_equal(slurp(dir + "/" + shard), slurp(ref + "/" + shard), 64, shard));
    EXPECT_TRUE(test::bytes_equal(slurp(dir + "/model.safetensors.index.json"),
                                  slurp(ref + "/model.safetensors.index.json"), 64, "index"));
  }
}

// Empty tensors written after the rest of their shard (which the flusher has then closed) and a
// shard of empty tensors only: nothing is closed twice or written after its close, every file is
// whole.
TEST(ShardedWriter, EmptyTensorsAfterTheirShardIsComplete) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, n] : std::vector<std::pair<std::string, int64_t>>{
           {"e0", 0}, {"a", 100}, {"e1", 0}, {"b", 100}, {"e2", 0}}) {
    SafetensorsEntry e;
    e.name = name;
    e.dtype = DType::kU8;
    e.shape = {n};
    entries.push_back(e);
  }
  const ShardPlan plan = plan_shards(entries, 150);  // [e0 a e1] [b e2]
  ASSERT_EQ(plan.shard_names.size(), 2u);
  const std::vector<uint8_t> bytes(100, 0x5a);
  TempDir tmp;
  ShardedWriter w(tmp.path, plan);
  w.write("a", bytes.data(), bytes.size());
  // Time for the flusher to close the complete shard before its empty tensors come.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  w.write("e0", nullptr, 0);
  w.write_part("e1", nullptr, 0, 0);
  w.write_parts({{"b", bytes.data(), bytes.size(), 0}, {"e2", nullptr, 0, 0}}, 2);
  w.finish();
  EXPECT_EQ(w.checksums().size(), 5u);
  for (const std::string& shard : plan.shard_names)
    EXPECT_NO_THROW(SafetensorsFile::open(tmp / shard)) << shard;
}

template <typename F>
void expect_error(ErrorCode code, const std::string& tensor, F&& f) {
  try {
    f();
    ADD_FAILURE() << "expected " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.tensor(), tensor) << e.what();
  }
}

TEST(ShardedWriter, WritePartsRefusesMisuseAndRethrowsAWriterThreadsError) {
  const std::vector<Named> ts = random_tensors();
  const ShardPlan plan = plan_of(ts);
  TempDir tmp;
  ShardedWriter w(tmp.path, plan);
  const Named& big = ts[7];  // 7 pieces
  // Not planned; the same tensor twice in one batch; a part past the tensor's end.
  expect_error(ErrorCode::kInternal, "nope", [&] {
    w.write_parts({{"nope", big.bytes.data(), 1, 0}}, 4);
  });
  expect_error(ErrorCode::kInternal, big.name, [&] {
    w.write_parts({{big.name, big.bytes.data(), 10, 0}, {big.name, big.bytes.data() + 10, 10, 10}},
                  4);
  });
  expect_error(ErrorCode::kInternal, big.name, [&] {
    w.write_parts({{big.name, big.bytes.data(), big.bytes.size() + 1, 0}}, 4);
  });
  // Written whole by write(), then again as a part: the refusal comes from a writer thread's
  // pwrite accounting (bytes written more than once, or a write after the flusher closed the
  // complete shard) and reaches the caller as the one Error, naming the tensor.
  w.write(big.name, big.bytes.data(), big.bytes.size());
  expect_error(ErrorCode::kInternal, big.name, [&] {
    w.write_parts({{big.name, big.bytes.data(), big.bytes.size(), 0}}, 4);
  });
}

}  // namespace
}  // namespace moepack
