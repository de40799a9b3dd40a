// Hostile safetensors files (spec/checkpoints.md §4.3-4.4): one hand-built file per failure
// mode, each asserting the error code, that the message names the file, and the tensor where
// there is one; plus a bounded randomized mutation test (accept or throw Error, never crash).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>

#include "core/error.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace moepack {
namespace {

using test::TempDir;

std::vector<uint8_t> with_length(uint64_t n, const std::string& header,
                                 const std::vector<uint8_t>& data) {
  std::vector<uint8_t> f;
  f.reserve(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (char c : header) f.push_back(static_cast<uint8_t>(c));
  for (uint8_t b : data) f.push_back(b);
  return f;
}
std::vector<uint8_t> file_of(const std::string& header, const std::vector<uint8_t>& data) {
  return with_length(header.size(), header, data);
}
std::vector<uint8_t> bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(0xA5 ^ i);
  return v;
}
// One entry's JSON.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

// Writes `image` to a file, opens it, and checks the error; also checks from_bytes agrees.
void expect_rejected(const std::vector<uint8_t>& image, ErrorCode code, const std::string& tensor) {
  TempDir tmp;
  const std::string path = tmp / "hostile.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(image.data()),
              static_cast<std::streamsize>(image.size()));
  }
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "accepted; expected " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << "got " << error_code_name(e.code()) << ": " << e.what();
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_EQ(e.tensor(), tensor) << e.what();
    if (!tensor.empty()) {
      EXPECT_NE(std::string(e.what()).find("'" + tensor + "'"), std::string::npos) << e.what();
    }
    EXPECT_EQ(e.exit_code(), code == ErrorCode::kIo ? ExitCode::kIo : ExitCode::kInvalidInput);
  }
  try {
    SafetensorsFile::from_bytes(image, "label.safetensors");
    ADD_FAILURE() << "from_bytes accepted; expected " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.file(), "label.safetensors");
  }
}

const std::string kGood4 = entry("a", "U8", "[4]", "[0,4]");

TEST(SafetensorsHostile, HeaderTooSmall) {
  expect_rejected({}, ErrorCode::kHeaderTooSmall, "");
  expect_rejected({1, 0, 0, 0, 0, 0, 0}, ErrorCode::kHeaderTooSmall, "");
}

TEST(SafetensorsHostile, HeaderTooLarge) {
  expect_rejected(with_length(kMaxSafetensorsHeader + 1, "{}", {}), ErrorCode::kHeaderTooLarge, "");
  expect_rejected(with_length(UINT64_MAX, "{}", {}), ErrorCode::kHeaderTooLarge, "");
  expect_rejected(with_length(uint64_t{1} << 63, "{}", {}), ErrorCode::kHeaderTooLarge, "");
}

TEST(SafetensorsHostile, HeaderLengthBeyondEof) {
  // Exactly at the cap is not "too large", but runs past the end.
  expect_rejected(with_length(kMaxSafetensorsHeader, "{}", {}), ErrorCode::kInvalidHeaderLength,
                  "");
  expect_rejected(with_length(100, "{" + kGood4 + "}", bytes(4)), ErrorCode::kInvalidHeaderLength,
                  "");
  expect_rejected(with_length(1, "", {}), ErrorCode::kInvalidHeaderLength, "");
}

TEST(SafetensorsHostile, InvalidUtf8) {
  for (const std::string bad : {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82",
                                "\x80", "\xf8\x88\x80\x80\x80"}) {
    SCOPED_TRACE(bad);
    expect_rejected(file_of("{" + entry("a" + bad, "U8", "[4]", "[0,4]") + "}", bytes(4)),
                    ErrorCode::kInvalidHeaderUtf8, "");
  }
  // Truncated sequence as the very last header byte.
  expect_rejected(file_of("{}\xe2", {}), ErrorCode::kInvalidHeaderUtf8, "");
}

TEST(SafetensorsHostile, NotJson) {
  for (const std::string& h :
       {std::string(""), std::string("{"), std::string("{\"a\":"), std::string("{} x"),
        std::string("{}{}"), std::string("{,}"), std::string("{'a':1}"),
        std::string("{\"a\":{}} // c"), std::string("{\"a\":NaN}"),
        std::string("{}\0{\"smuggled\":1}", 17),  // nlohmann alone would stop at NUL
        std::string("\xef\xbb\xbf{}"),            // BOM: serde_json refuses it
        std::string("{\"a\":\"\\ud800\"}"),       // lone surrogate escape
        std::string("\x0b{}")}) {                 // vertical tab is not JSON whitespace
    SCOPED_TRACE(h);
    expect_rejected(file_of(h, {}), ErrorCode::kInvalidHeaderJson, "");
  }
}

TEST(SafetensorsHostile, JsonNotAnObject) {
  for (const std::string h : {"[]", "[{\"a\":1}]", "\"x\"", "1", "null", "true"}) {
    SCOPED_TRACE(h);
    expect_rejected(file_of(h, {}), ErrorCode::kInvalidHeaderJson, "");
  }
}

TEST(SafetensorsHostile, EntryNotObject) {
  expect_rejected(file_of(R"({"a":5})", {}), ErrorCode::kInvalidHeaderLayout, "a");
  expect_rejected(file_of(R"({"a":[0,4]})", {}), ErrorCode::kInvalidHeaderLayout, "a");
  expect_rejected(file_of(R"({"a":"U8"})", {}), ErrorCode::kInvalidHeaderLayout, "a");
  expect_rejected(file_of(R"({"a":null})", {}), ErrorCode::kInvalidHeaderLayout, "a");
}

TEST(SafetensorsHostile, MissingOrWrongTypedFields) {
  const auto d4 = bytes(4);
  expect_rejected(file_of(R"({"a":{"shape":[4],"data_offsets":[0,4]}})", d4),
                  ErrorCode::kInvalidHeaderLayout, "a");
  expect_rejected(file_of(R"({"a":{"dtype":"U8","data_offsets":[0,4]}})", d4),
                  ErrorCode::kInvalidHeaderLayout, "a");
  expect_rejected(file_of(R"({"a":{"dtype":"U8","shape":[4]}})", d4),
                  ErrorCode::kInvalidHeaderLayout, "a");
  expect_rejected(file_of(R"({"a":{"dtype":8,"shape":[4],"data_offsets":[0,4]}})", d4),
                  ErrorCode::kInvalidHeaderLayout, "a");
  expect_rejected(file_of(R"({"a":{"dtype":["U8"],"shape":[4],"data_offsets":[0,4]}})", d4),
                  ErrorCode::kInvalidHeaderLayout, "a");
  // The same field twice inside one entry is a smuggling vector too.
  expect_rejected(
      file_of(R"({"a":{"dtype":"U8","dtype":"I8","shape":[4],"data_offsets":[0,4]}})", d4),
      ErrorCode::kInvalidHeaderLayout, "a");
}

TEST(SafetensorsHostile, BadShape) {
  const auto d4 = bytes(4);
  for (const std::string shape :
       {"[-4]", "[4.0]", "[1.5]", "[\"4\"]", "[true]", "[null]", "[[4]]", "[{}]", "4", "\"[4]\"",
        "{}", "[1e2]", "[18446744073709551616]", "[281474976710656]"}) {
    SCOPED_TRACE(shape);
    expect_rejected(file_of("{" + entry("w", "U8", shape, "[0,4]") + "}", d4),
                    ErrorCode::kInvalidHeaderLayout, "w");
  }
}

TEST(SafetensorsHostile, BadDataOffsets) {
  const auto d4 = bytes(4);
  for (const std::string off :
       {"\"0,4\"", "[0]", "[]", "[0,4,8]", "[0,-4]", "[-1,3]", "[0,4.0]", "[0,\"4\"]", "[[0],4]",
        "{\"0\":4}", "4", "null", "[0,18446744073709551616]"}) {
    SCOPED_TRACE(off);
    expect_rejected(file_of("{" + entry("o", "U8", "[4]", off) + "}", d4),
                    ErrorCode::kInvalidHeaderLayout, "o");
  }
}

TEST(SafetensorsHostile, BadMetadata) {
  const auto d4 = bytes(4);
  for (const std::string md :
       {R"({"format":1})", R"({"format":null})", R"({"a":["pt"]})", R"({"a":{"b":"c"}})",
        R"({"a":true})", R"([])", R"("pt")", R"(5)", R"({"format":"pt","format":"tf"})"}) {
    SCOPED_TRACE(md);
    expect_rejected(file_of("{\"__metadata__\":" + md + "," + kGood4 + "}", d4),
                    ErrorCode::kInvalidHeaderLayout, "");
  }
  expect_rejected(file_of(R"({"__metadata__":{"format":"pt"},"__metadata__":{"format":"tf"}})", {}),
                  ErrorCode::kInvalidHeaderLayout, "");
}

TEST(SafetensorsHostile, DuplicateTensorIsNotLastWins) {
  // The second definition alone is a fully consistent file (8 bytes of data); a last-wins
  // parser would accept it and silently drop the first.
  expect_rejected(file_of("{" + entry("dup", "U8", "[4]", "[0,4]") + "," +
                              entry("dup", "U8", "[8]", "[0,8]") + "}",
                          bytes(8)),
                  ErrorCode::kDuplicateTensor, "dup");
  // Same with the first one consistent and an identical redefinition.
  expect_rejected(
      file_of("{" + kGood4 + "," + entry("x", "U8", "[0]", "[4,4]") + "," + kGood4 + "}", bytes(4)),
      ErrorCode::kDuplicateTensor, "a");
}

TEST(SafetensorsHostile, UnknownDtype) {
  for (const std::string dt : {"F128", "f16", "FP8", "", "U8 ", "F8_E4M3FN", "float16"}) {
    SCOPED_TRACE(dt);
    expect_rejected(file_of("{" + entry("d", dt, "[4]", "[0,4]") + "}", bytes(4)),
                    ErrorCode::kUnknownDtype, "d");
  }
}

TEST(SafetensorsHostile, ValidationOverflow) {
  // 2^40 * 2^40 elements overflow u64.
  expect_rejected(
      file_of("{" + entry("big", "F32", "[1099511627776,1099511627776]", "[0,4]") + "}", bytes(4)),
      ErrorCode::kValidationOverflow, "big");
  // 2^61 elements fit, 2^61 * 64 bits do not.
  expect_rejected(
      file_of("{" + entry("bits", "F64", "[1099511627776,2097152]", "[0,8]") + "}", bytes(8)),
      ErrorCode::kValidationOverflow, "bits");
  // The reference folds the product left to right with checked_mul, so an overflow before a
  // zero dimension is still an overflow (it would accept [0, huge, huge]).
  expect_rejected(
      file_of("{" + entry("z", "F32", "[281474976710655,281474976710655,0]", "[0,0]") + "}", {}),
      ErrorCode::kValidationOverflow, "z");
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(
      file_of("{" + entry("z", "F32", "[0,281474976710655,281474976710655]", "[0,0]") + "}", {}),
      "zero first"));
}

TEST(SafetensorsHostile, SizeMismatch) {
  expect_rejected(file_of("{" + entry("s", "U8", "[4]", "[0,5]") + "}", bytes(5)),
                  ErrorCode::kTensorInvalidInfo, "s");
  expect_rejected(file_of("{" + entry("s", "F16", "[4]", "[0,4]") + "}", bytes(4)),
                  ErrorCode::kTensorInvalidInfo, "s");
  expect_rejected(file_of("{" + entry("s", "F32", "[]", "[0,0]") + "}", {}),
                  ErrorCode::kTensorInvalidInfo, "s");
  // Shape says 2^47 bytes, offsets claim them; the file has 4: must not read out of bounds.
  expect_rejected(
      file_of("{" + entry("huge", "U8", "[140737488355328]", "[0,140737488355328]") + "}",
              bytes(4)),
      ErrorCode::kMetadataIncompleteBuffer, "huge");
}

TEST(SafetensorsHostile, SubByteMisaligned) {
  expect_rejected(file_of("{" + entry("f4", "F4", "[3]", "[0,2]") + "}", bytes(2)),
                  ErrorCode::kTensorInvalidInfo, "f4");
  expect_rejected(file_of("{" + entry("f6", "F6_E2M3", "[3]", "[0,3]") + "}", bytes(3)),
                  ErrorCode::kTensorInvalidInfo, "f6");
  expect_rejected(file_of("{" + entry("f4", "F4", "[]", "[0,1]") + "}", bytes(1)),
                  ErrorCode::kTensorInvalidInfo, "f4");
}

TEST(SafetensorsHostile, InvalidOffsets) {
  // Gap between a and b.
  expect_rejected(file_of("{" + kGood4 + "," + entry("b", "U8", "[4]", "[8,12]") + "}", bytes(12)),
                  ErrorCode::kInvalidOffset, "b");
  // Overlap (a DoS amplifier: many tensors on one region).
  expect_rejected(file_of("{" + kGood4 + "," + entry("b", "U8", "[4]", "[2,6]") + "}", bytes(6)),
                  ErrorCode::kInvalidOffset, "b");
  expect_rejected(file_of("{" + kGood4 + "," + entry("b", "U8", "[4]", "[0,4]") + "}", bytes(4)),
                  ErrorCode::kInvalidOffset, "b");
  // First tensor not at 0.
  expect_rejected(file_of("{" + entry("a", "U8", "[4]", "[4,8]") + "}", bytes(8)),
                  ErrorCode::kInvalidOffset, "a");
  // END < BEGIN (the unsigned-underflow bug of other parsers).
  expect_rejected(file_of("{" + kGood4 + "," + entry("b", "U8", "[0]", "[4,2]") + "}", bytes(4)),
                  ErrorCode::kInvalidOffset, "b");
  expect_rejected(file_of("{" + entry("a", "U8", "[4]", "[0,18446744073709551615]") + "," +
                              entry("b", "U8", "[4]", "[18446744073709551615,3]") + "}",
                          bytes(4)),
                  ErrorCode::kTensorInvalidInfo, "a");
}

TEST(SafetensorsHostile, TrailingOrMissingBytes) {
  expect_rejected(file_of("{" + kGood4 + "}", bytes(5)), ErrorCode::kMetadataIncompleteBuffer, "a");
  expect_rejected(file_of("{" + kGood4 + "}", bytes(3)), ErrorCode::kMetadataIncompleteBuffer, "a");
  expect_rejected(file_of("{}", bytes(1)), ErrorCode::kMetadataIncompleteBuffer, "");
  expect_rejected(file_of(R"({"__metadata__":{"format":"pt"}})", bytes(8)),
                  ErrorCode::kMetadataIncompleteBuffer, "");
}

// Bounded randomized mutation: a valid file (several dtypes, a scalar, a zero-size tensor) has
// random bytes flipped / replaced by JSON-significant characters / digits, is truncated or
// extended; the reader must accept it (and then every view lies inside the image and the views
// tile the data section) or throw moepack::Error -- nothing else, and never crash.
TEST(SafetensorsHostile, RandomMutationsAcceptOrThrowError) {
  std::mt19937_64 rng(20240531);
  std::vector<Tensor> ts;
  ts.emplace_back("model.layers.0.mlp.experts.0.gate_proj.weight", DType::kF16, Shape{4, 3});
  ts.emplace_back("s", DType::kF32, Shape{});
  ts.emplace_back("z", DType::kBF16, Shape{0, 2});
  ts.emplace_back("f4", DType::kF4, Shape{2, 6});
  ts.emplace_back("odd", DType::kU8, Shape{5});
  ts.emplace_back("e8", DType::kF8_E8M0, Shape{3});
  for (auto& t : ts)
    for (auto& b : t.data) b = static_cast<uint8_t>(rng());
  TempDir tmp;
  write_safetensors(tmp / "seed.safetensors", ts, {{"k", "v"}});
  std::ifstream in(tmp / "seed.safetensors", std::ios::binary);
  const std::vector<uint8_t> seed((std::istreambuf_iterator<char>(in)), {});
  const uint64_t hdr_end = 8 + SafetensorsFile::from_bytes(seed, "seed").header_length();

  const std::string alphabet = "{}[],:\" -0123456789.eE\\\x00\xff\x80";
  std::map<ErrorCode, int> seen;
  int accepted = 0;
  constexpr int kIterations = 20000;
  for (int it = 0; it < kIterations; ++it) {
    std::vector<uint8_t> img = seed;
    const int n_mut = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < n_mut; ++m) {
      const uint64_t kind = rng() % 10;
      // Mostly inside the header, where the parsing happens.
      const size_t limit = (rng() % 8 == 0) ? img.size() : std::min<size_t>(img.size(), hdr_end);
      if (limit == 0) break;
      const size_t pos = static_cast<size_t>(rng() % limit);
      if (kind < 3) {
        img[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
      } else if (kind < 5) {
        img[pos] = static_cast<uint8_t>(alphabet[rng() % alphabet.size()]);
      } else if (kind < 7) {
        if (img[pos] >= '0' && img[pos] <= '9')
          img[pos] = static_cast<uint8_t>('0' + rng() % 10);
        else
          img[pos] = static_cast<uint8_t>(rng());
      } else if (kind == 7) {
        img.resize(pos);
      } else if (kind == 8) {
        img.insert(img.begin() + static_cast<int64_t>(pos), static_cast<uint8_t>(rng()));
      } else {
        img.erase(img.begin() + static_cast<int64_t>(pos));
      }
    }
    try {
      const SafetensorsFile f = SafetensorsFile::from_bytes(img, "mut");
      ++accepted;
      const uint64_t data_start = 8 + f.header_length();
      uint64_t covered = 0;
      for (const auto& e : f.entries()) {
        const TensorView v = f.view(e);
        ASSERT_EQ(e.begin, covered);
        ASSERT_LE(data_start + e.end, img.size());
        ASSERT_EQ(v.nbytes, e.end - e.begin);
        ASSERT_EQ(dtype_bytes(e.dtype, static_cast<uint64_t>(numel(e.shape))), v.nbytes);
        covered = e.end;
      }
      ASSERT_EQ(data_start + covered, img.size());
    } catch (const Error& e) {
      ++seen[e.code()];
      ASSERT_EQ(e.file(), "mut");
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-moepack exception " << e.what();
    }
  }
  std::string summary;
  for (const auto& [code, count] : seen)
    summary += std::string(error_code_name(code)) + "=" + std::to_string(count) + " ";
  std::cout << "accepted=" << accepted << " " << summary << "\n";
  // The mutations must actually reach the validation stages, not only the JSON parser.
  EXPECT_GT(accepted, 0);
  EXPECT_GE(seen.size(), 7u) << summary;
  EXPECT_GT(seen[ErrorCode::kInvalidHeaderJson], 0);
  EXPECT_GT(seen[ErrorCode::kTensorInvalidInfo] + seen[ErrorCode::kInvalidOffset], 0);
}

}  // namespace
}  // namespace moepack
