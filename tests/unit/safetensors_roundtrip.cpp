// The writer's files are accepted by the reader with the same names, dtypes, shapes and bytes;
// hand-built legal files (no padding, leading whitespace, ...) are accepted; out-of-order
// multithreaded writes give the same bytes as in-order writes; the writer refuses misuse.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::TempDir;

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A raw file: u64 LE length of `header`, the header bytes, the data bytes.
std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> f;
  f.reserve(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (char c : header) f.push_back(static_cast<uint8_t>(c));
  for (uint8_t b : data) f.push_back(b);
  return f;
}

// Random non-zero-heavy bytes (never all zero, so a mixed-up view is visible).
Tensor random_tensor(std::mt19937_64& rng, const std::string& name, DType dt, const Shape& shape) {
  Tensor t(name, dt, shape);
  for (auto& b : t.data) b = static_cast<uint8_t>(rng() | 1);
  return t;
}

constexpr DType kAllDtypes[] = {
    DType::kBOOL,        DType::kF4,      DType::kF6_E2M3, DType::kF6_E3M2, DType::kU8,
    DType::kI8,          DType::kF8_E5M2, DType::kF8_E4M3, DType::kF8_E8M0, DType::kF8_E4M3FNUZ,
    DType::kF8_E5M2FNUZ, DType::kI16,     DType::kU16,     DType::kF16,     DType::kBF16,
    DType::kI32,         DType::kU32,     DType::kF32,     DType::kC64,     DType::kF64,
    DType::kI64,         DType::kU64};

// Random shapes whose element count times the dtype's bits is whole bytes (F4: even counts,
// F6: multiples of 4), including rank 0 for byte dtypes and odd byte counts for U8.
Shape random_shape(std::mt19937_64& rng, DType dt) {
  const int bits = dtype_bits(dt);
  const int64_t mult = bits % 8 == 0 ? 1 : (bits == 4 ? 2 : 4);
  const int rank = static_cast<int>(rng() % 4);
  Shape s;
  for (int i = 0; i < rank; ++i) s.push_back(1 + static_cast<int64_t>(rng() % 7));
  if (rank == 0 && mult != 1) s.push_back(mult);  // a sub-byte scalar is not whole bytes
  if (!s.empty()) s.back() *= mult;
  return s;
}

void expect_same_tensors(const SafetensorsFile& f, const std::vector<Tensor>& tensors) {
  ASSERT_EQ(f.entries().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsEntry& e = f.entries()[i];  // data order == written order
    EXPECT_EQ(e.name, tensors[i].name);
    EXPECT_EQ(e.dtype, tensors[i].dtype) << e.name;
    EXPECT_EQ(e.shape, tensors[i].shape) << e.name;
    const TensorView v = f.view(tensors[i].name);
    EXPECT_EQ(v.nbytes, tensors[i].data.size()) << e.name;
    EXPECT_TRUE(test::bytes_equal(v.data, static_cast<size_t>(v.nbytes), tensors[i].data.data(),
                                  tensors[i].data.size(), 16, e.name));
  }
}

TEST(SafetensorsRoundtrip, EveryDtypeRandomShapes) {
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    std::mt19937_64 rng(seed);
    std::vector<Tensor> tensors;
    for (DType dt : kAllDtypes) {
      tensors.push_back(
          random_tensor(rng, std::string("t.") + dtype_name(dt), dt, random_shape(rng, dt)));
      tensors.push_back(random_tensor(rng, std::string("z.") + dtype_name(dt), dt, {3, 0, 2}));
    }
    tensors.push_back(random_tensor(rng, "scalar.f32", DType::kF32, {}));
    tensors.push_back(random_tensor(rng, "scalar.u8", DType::kU8, {}));
    tensors.push_back(random_tensor(rng, "odd.u8", DType::kU8, {7}));  // misaligns the next one
    tensors.push_back(random_tensor(rng, "after.odd.f16", DType::kF16, {3, 5}));
    tensors.push_back(random_tensor(rng, "f4.even", DType::kF4, {5, 6}));
    tensors.push_back(random_tensor(rng, "e8m0.scales", DType::kF8_E8M0, {4, 3}));
    tensors.push_back(random_tensor(rng, "unicode.\xc3\xa9\xe2\x82\xac", DType::kI32, {2}));
    tensors.push_back(random_tensor(rng, "quote\"back\\slash", DType::kI8, {2}));
    std::shuffle(tensors.begin(), tensors.end(), rng);

    TempDir tmp;
    const std::string path = tmp / "model.safetensors";
    write_safetensors(path, tensors, {{"producer", "moepack"}, {"seed", std::to_string(seed)}});
    const SafetensorsFile f = SafetensorsFile::open(path);
    expect_same_tensors(f, tensors);
    EXPECT_EQ((8 + f.header_length()) % 8, 0u) << "data section must start 8-aligned";
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("producer"), "moepack");
    EXPECT_EQ(f.metadata().at("seed"), std::to_string(seed));
    EXPECT_EQ(f.metadata().size(), 3u);

    // The same image through from_bytes, and a second write, give the same result.
    const auto bytes = slurp(path);
    EXPECT_EQ(bytes.size(), f.file_size());
    expect_same_tensors(SafetensorsFile::from_bytes(bytes, "mem"), tensors);
    write_safetensors(tmp / "again.safetensors", tensors,
                      {{"seed", std::to_string(seed)}, {"producer", "moepack"}});
    EXPECT_TRUE(test::bytes_equal(slurp(tmp / "again.safetensors"), bytes, 64, "determinism"));
  }
}

TEST(SafetensorsRoundtrip, HeaderStartsWithMetadataAndIsSpacePadded) {
  std::vector<SafetensorsEntry> layout(2), out;
  layout[0].name = "b";
  layout[0].dtype = DType::kF16;
  layout[0].shape = {3};
  layout[1].name = "a";
  layout[1].dtype = DType::kU8;
  layout[1].shape = {5};
  const auto hdr = build_safetensors_header(layout, {{"x", "y"}}, &out);
  ASSERT_GE(hdr.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | hdr[static_cast<size_t>(i)];
  EXPECT_EQ(n + 8, hdr.size());
  EXPECT_EQ(hdr.size() % 8, 0u);
  const std::string js(hdr.begin() + 8, hdr.end());
  EXPECT_EQ(js.rfind("{\"__metadata__\":{\"format\":\"pt\"", 0), 0u) << js;
  EXPECT_LT(js.find("\"b\""), js.find("\"a\"")) << "tensors keep the given order";
  const size_t last = js.find_last_not_of(' ');
  EXPECT_EQ(js[last], '}');
  const auto j = nlohmann::json::parse(js);
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({0, 6}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::json::array({6, 11}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].begin, 6u);
  EXPECT_EQ(out[1].end, 11u);
}

TEST(SafetensorsRoundtrip, HandBuiltFilesAccepted) {
  const std::vector<uint8_t> d7 = {1, 2, 3, 4, 5, 6, 7};
  struct Case {
    const char* what;
    std::string header;
    std::vector<uint8_t> data;
    size_t tensors;
  };
  const std::vector<Case> cases = {
      {"no padding, no metadata", R"({"a":{"dtype":"U8","shape":[7],"data_offsets":[0,7]}})", d7,
       1},
      {"leading whitespace",
       " \t\r\n{\"a\":{\"dtype\":\"U8\",\"shape\":[7],\"data_offsets\":[0,7]}}", d7, 1},
      {"trailing spaces and newline",
       "{\"a\":{\"dtype\":\"U8\",\"shape\":[7],\"data_offsets\":[0,7]}}   \n", d7, 1},
      {"empty header object", "{}", {}, 0},
      {"only metadata", R"({"__metadata__":{"format":"pt"}})", {}, 0},
      {"metadata null",
       R"({"__metadata__":null,"a":{"dtype":"U8","shape":[7],"data_offsets":[0,7]}})", d7, 1},
      {"unknown entry field ignored",
       R"({"a":{"x":[{"y":1}],"dtype":"U8","shape":[7],"data_offsets":[0,7]}})", d7, 1},
      {"fields in another order", R"({"a":{"data_offsets":[0,7],"shape":[7],"dtype":"U8"}})", d7,
       1},
      {"header order differs from data order",
       R"({"b":{"dtype":"U8","shape":[3],"data_offsets":[4,7]},"a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})",
       d7, 2},
      {"zero-size tensors anywhere",
       R"({"z1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[7,1],"data_offsets":[0,7]},"z2":{"dtype":"F4","shape":[4,0],"data_offsets":[7,7]}})",
       d7, 3},
      {"only zero-size tensors",
       R"({"z":{"dtype":"BF16","shape":[0,4],"data_offsets":[0,0]}})",
       {},
       1},
      {"F4 odd dims even count", R"({"a":{"dtype":"F4","shape":[7,2],"data_offsets":[0,7]}})", d7,
       1},
      {"F6 count multiple of 4",
       R"({"a":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]},"b":{"dtype":"F8_E8M0","shape":[4],"data_offsets":[3,7]}})",
       d7, 2},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir tmp;
    const std::string path = tmp / "x.safetensors";
    spit(path, raw_file(c.header, c.data));
    try {
      const SafetensorsFile f = SafetensorsFile::open(path);
      EXPECT_EQ(f.entries().size(), c.tensors);
      EXPECT_EQ(f.header_length(), c.header.size());
      uint64_t covered = 0;
      for (const auto& e : f.entries()) {
        EXPECT_EQ(e.begin, covered) << e.name;
        covered = e.end;
        const TensorView v = f.view(e);
        if (v.nbytes) {
          EXPECT_EQ(std::vector<uint8_t>(v.data, v.data + v.nbytes),
                    std::vector<uint8_t>(c.data.begin() + static_cast<int64_t>(e.begin),
                                         c.data.begin() + static_cast<int64_t>(e.end)));
        }
      }
      EXPECT_EQ(covered, c.data.size());
    } catch (const Error& e) {
      ADD_FAILURE() << "rejected: " << e.what();
    }
  }
  // Data-order entries: "a" (begin 0) before "b" (begin 4).
  TempDir tmp;
  spit(tmp / "o.safetensors", raw_file(cases[8].header, d7));
  const SafetensorsFile f = SafetensorsFile::open(tmp / "o.safetensors");
  EXPECT_EQ(f.entries()[0].name, "a");
  EXPECT_EQ(f.entries()[1].name, "b");
  EXPECT_TRUE(f.entries()[0].shape.empty());
  EXPECT_EQ(f.view("a").nbytes, 4u);
}

TEST(SafetensorsRoundtrip, EmptyLayoutAndMove) {
  TempDir tmp;
  write_safetensors(tmp / "empty.safetensors", {});
  SafetensorsFile f = SafetensorsFile::open(tmp / "empty.safetensors");
  EXPECT_TRUE(f.entries().empty());
  EXPECT_EQ(f.file_size(), 8 + f.header_length());

  std::mt19937_64 rng(7);
  const std::vector<Tensor> ts = {random_tensor(rng, "w", DType::kF32, {4, 4})};
  write_safetensors(tmp / "one.safetensors", ts);
  SafetensorsFile g = SafetensorsFile::open(tmp / "one.safetensors");
  SafetensorsFile moved(std::move(g));
  expect_same_tensors(moved, ts);
  f = std::move(moved);
  expect_same_tensors(f, ts);
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_FALSE(f.contains("nope"));
  EXPECT_TRUE(f.contains("w"));
  try {
    f.view("nope");
    ADD_FAILURE() << "view of a missing tensor must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kMissingTensor);
    EXPECT_EQ(e.tensor(), "nope");
  }
  SafetensorsFile mem = SafetensorsFile::from_bytes(slurp(tmp / "one.safetensors"), "mem");
  SafetensorsFile mem2(std::move(mem));
  expect_same_tensors(mem2, ts);
}

// A path that cannot be opened is an I/O error; one that is not a regular file (a directory, a
// FIFO: opened without blocking) is an input error, exit 3, as for JSON inputs.
TEST(SafetensorsRoundtrip, OpenErrors) {
  TempDir tmp;
  ASSERT_EQ(::mkfifo((tmp / "fifo.safetensors").c_str(), 0644), 0);
  for (const auto& [p, code] :
       {std::pair<std::string, ErrorCode>{tmp / "missing.safetensors", ErrorCode::kIo},
        {tmp.path, ErrorCode::kBadConfig},
        {tmp / "fifo.safetensors", ErrorCode::kBadConfig}}) {
    try {
      SafetensorsFile::open(p);
      ADD_FAILURE() << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_EQ(e.file(), p);
    }
  }
}

std::vector<SafetensorsEntry> layout_of(const std::vector<Tensor>& ts) {
  std::vector<SafetensorsEntry> l;
  for (const auto& t : ts) {
    SafetensorsEntry e;
    e.name = t.name;
    e.dtype = t.dtype;
    e.shape = t.shape;
    l.push_back(e);
  }
  return l;
}

TEST(SafetensorsWriter, MultithreadedOutOfOrderWritesEqualInOrder) {
  std::mt19937_64 rng(42);
  std::vector<Tensor> ts;
  for (int i = 0; i < 24; ++i) {
    const DType dt = kAllDtypes[rng() % std::size(kAllDtypes)];
    Shape s = random_shape(rng, dt);
    s.insert(s.begin(), 1 + static_cast<int64_t>(rng() % 50));
    ts.push_back(random_tensor(rng, "layer." + std::to_string(i), dt, s));
  }
  TempDir tmp;
  const auto layout = layout_of(ts);
  {
    SafetensorsWriter w(tmp / "in_order.safetensors", layout, {{"k", "v"}});
    for (const auto& t : ts) w.write(t);
    w.finish();
  }
  // Chunks of every tensor (3 per tensor, uneven), shuffled, written by 4 threads.
  struct Chunk {
    size_t tensor;
    uint64_t off, len;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < ts.size(); ++i) {
    const uint64_t n = ts[i].data.size();
    const uint64_t a = n / 3, b = n - n / 5;
    chunks.push_back({i, 0, a});
    chunks.push_back({i, a, b - a});
    chunks.push_back({i, b, n - b});
  }
  std::shuffle(chunks.begin(), chunks.end(), rng);
  {
    SafetensorsWriter w(tmp / "threads.safetensors", layout, {{"k", "v"}});
    std::vector<std::thread> th;
    for (size_t k = 0; k < 4; ++k)
      th.emplace_back([&, k] {
        for (size_t c = k; c < chunks.size(); c += 4) {
          const Chunk& ch = chunks[c];
          w.write(ts[ch.tensor].name, ts[ch.tensor].data.data() + ch.off, ch.len, ch.off);
        }
      });
    for (auto& t : th) t.join();
    w.finish();
  }
  const auto a = slurp(tmp / "in_order.safetensors");
  EXPECT_TRUE(test::bytes_equal(slurp(tmp / "threads.safetensors"), a, 64, "threaded vs in order"));
  write_safetensors(tmp / "oneshot.safetensors", ts, {{"k", "v"}});
  EXPECT_TRUE(test::bytes_equal(slurp(tmp / "oneshot.safetensors"), a, 64, "write_safetensors"));
  expect_same_tensors(SafetensorsFile::open(tmp / "threads.safetensors"), ts);
}

template <typename F>
void expect_error(ErrorCode code, const std::string& tensor, F&& f) {
  try {
    f();
    ADD_FAILURE() << "expected " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    if (!tensor.empty()) {
      EXPECT_EQ(e.tensor(), tensor) << e.what();
    }
  }
}

TEST(SafetensorsWriter, RefusesMisuse) {
  std::mt19937_64 rng(9);
  const std::vector<Tensor> ts = {random_tensor(rng, "a", DType::kF16, {4}),
                                  random_tensor(rng, "b", DType::kU8, {3})};
  TempDir tmp;
  const std::string path = tmp / "w.safetensors";
  {
    SafetensorsWriter w(path, layout_of(ts));
    EXPECT_EQ(w.file_size(), slurp(path).size()) << "file is sized up front";
    const uint8_t buf[16] = {1};
    expect_error(ErrorCode::kInternal, "nope", [&] { w.write("nope", buf, 1); });
    expect_error(ErrorCode::kInternal, "a", [&] { w.write("a", buf, 9); });     // 8 bytes
    expect_error(ErrorCode::kInternal, "a", [&] { w.write("a", buf, 2, 7); });  // past end
    expect_error(ErrorCode::kInternal, "a", [&] { w.write("a", buf, 1, 9); });  // offset past
    expect_error(ErrorCode::kInternal, "a", [&] { w.write("a", buf, 1, UINT64_MAX); });
    w.write("a", buf, 8);
    expect_error(ErrorCode::kInternal, "a", [&] { w.write("a", buf, 1, 3); });  // twice
    expect_error(ErrorCode::kInternal, "b", [&] { w.finish(); });               // b missing
    w.write("b", buf, 3);
    w.finish();
    expect_error(ErrorCode::kInternal, "", [&] { w.finish(); });
  }
  // Invalid layouts: duplicate name, reserved name, sub-byte odd count, negative dim.
  auto one = [](const std::string& name, DType dt, Shape s) {
    SafetensorsEntry e;
    e.name = name;
    e.dtype = dt;
    e.shape = std::move(s);
    return e;
  };
  expect_error(ErrorCode::kBadValue, "a", [&] {
    SafetensorsWriter w(path, {one("a", DType::kU8, {1}), one("a", DType::kU8, {1})});
  });
  expect_error(ErrorCode::kBadValue, "__metadata__",
               [&] { SafetensorsWriter w(path, {one("__metadata__", DType::kU8, {1})}); });
  expect_error(ErrorCode::kTensorInvalidInfo, "f4",
               [&] { SafetensorsWriter w(path, {one("f4", DType::kF4, {3})}); });
  expect_error(ErrorCode::kBadShape, "neg",
               [&] { SafetensorsWriter w(path, {one("neg", DType::kU8, {-1})}); });
  expect_error(ErrorCode::kBadValue, "",
               [&] { SafetensorsWriter w(path, {one("bad\xff", DType::kU8, {1})}); });
  expect_error(ErrorCode::kInternal, "x", [&] {
    Tensor t("x", DType::kU8, {4});
    t.data.resize(3);
    write_safetensors(tmp / "short.safetensors", {t});
  });
  expect_error(ErrorCode::kIo, "",
               [&] { write_safetensors(tmp / "no/such/dir/x.safetensors", ts); });
}

}  // namespace
}  // namespace moepack
