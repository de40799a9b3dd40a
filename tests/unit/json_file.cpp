// The one reader of untrusted JSON files (io/json_file.h): the rules of each kind of file (the
// message for a missing one, the byte and nesting caps), the kinds of path it refuses without
// blocking, and JsonField's errors naming the file and the field's path.
#include "io/json_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace moepack {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_error;

TEST(JsonFile, RulesOfAKindOfFile) {
  test::TempDir dir;
  const std::string p = dir / "x.json";
  {
    const Error e = expect_error([&] { read_json_file(p); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), p);
    EXPECT_EQ(e.message(), "not found");
    const Error f = expect_error([&] { read_json_file(p, {.if_missing = "no x.json: not an x"}); },
                                 ErrorCode::kBadConfig);
    EXPECT_EQ(f.message(), "no x.json: not an x");
  }
  std::ofstream(p) << "{\"a\": [1, 2, {\"b\": null}]}";
  EXPECT_EQ(read_json_file(p), json::parse("{\"a\": [1, 2, {\"b\": null}]}"));
  {  // the byte cap
    EXPECT_NO_THROW(read_json_file(p, {.max_bytes = fs::file_size(p)}));
    const Error e = expect_error([&] { read_json_file(p, {.max_bytes = fs::file_size(p) - 1}); },
                                 ErrorCode::kBadConfig);
    EXPECT_NE(e.message().find("larger than the " + std::to_string(fs::file_size(p) - 1)),
              std::string::npos)
        << e.message();
  }
  {  // the nesting cap: the value above nests 3 deep
    EXPECT_NO_THROW(read_json_file(p, {.max_depth = 3}));
    const Error e =
        expect_error([&] { read_json_file(p, {.max_depth = 2}); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.message(), "invalid JSON: nested more than 2 levels deep");
  }
  for (const char* bad : {"", "{", "{} {}", "{}x", "[1,]", "{\"a\": \"\xff\"}", "\xef\xbb"}) {
    SCOPED_TRACE(bad);
    std::ofstream(p) << bad;
    const Error e = expect_error([&] { read_json_file(p); }, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), p);
    EXPECT_EQ(e.message().rfind("invalid JSON: ", 0), 0u) << e.message();
  }
}

TEST(JsonFile, OnlyRegularFilesNeverBlocking) {
  test::TempDir dir;
  const std::string p = dir / "x.json";
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  EXPECT_EQ(expect_error([&] { read_json_file(p); }, ErrorCode::kBadConfig).message(),
            "is a FIFO, not a regular file");
  fs::remove(p);
  fs::create_directory(p);
  EXPECT_EQ(expect_error([&] { read_json_file(p); }, ErrorCode::kBadConfig).message(),
            "is a directory, not a file");
  fs::remove(p);
  fs::create_symlink(p + ".loop", p);
  fs::create_symlink(p, p + ".loop");
  EXPECT_EQ(
      expect_error([&] { read_json_file(p); }, ErrorCode::kBadConfig).message().rfind("symlink", 0),
      0u);
  fs::remove(p);
  fs::remove(p + ".loop");
  EXPECT_EQ(expect_error([&] { read_json_file("/dev/null"); }, ErrorCode::kBadConfig).message(),
            "is a device, not a regular file");
  // A symlink to a regular file is followed.
  std::ofstream(dir / "real.json") << "[true]";
  fs::create_symlink(dir / "real.json", p);
  EXPECT_EQ(read_json_file(p), json::parse("[true]"));
}

TEST(JsonFile, FieldsNameTheFileAndThePath) {
  const json j = json::parse(R"({"n": 4, "s": "x", "big": 18446744073709551615, "neg": -2,
    "a": [{"t": "u"}, 7], "m": {"k.1": {"v": true}}, "d": "BF16", "e": ""})");
  const std::string file = "d/x.json";
  const JsonField root(j, "", file);
  auto message = [&](const std::function<void()>& fn) {
    const Error e = expect_error(fn, ErrorCode::kBadConfig);
    EXPECT_EQ(e.file(), file);
    return e.message();
  };
  EXPECT_EQ(root["n"].integer(0, 10), 4);
  EXPECT_EQ(root["s"].str(), "x");
  EXPECT_EQ(root["big"].size(), UINT64_MAX);
  EXPECT_EQ(root["a"].item(0)["t"].str(), "u");
  EXPECT_TRUE(root["m"].member("k.1")["v"].boolean());
  EXPECT_EQ(root["d"].dtype(), DType::kBF16);
  EXPECT_TRUE(root.has("e"));
  EXPECT_FALSE(root.has("z"));
  EXPECT_EQ(message([&] { root["z"]; }), "z: missing");
  EXPECT_EQ(message([&] { root["n"]["x"]; }), "n: expected an object, got 4");
  EXPECT_EQ(message([&] { root["s"].integer(0, 1); }), "s: expected an integer, got \"x\"");
  EXPECT_EQ(message([&] { root["n"].integer(5, 10); }), "n: must be between 5 and 10, got 4");
  EXPECT_EQ(message([&] { root["big"].integer(0, INT64_MAX); }),
            "big: must be >= 0, got 18446744073709551615");
  EXPECT_EQ(message([&] { root["neg"].size(); }), "neg: must be non-negative, got -2");
  EXPECT_EQ(message([&] { root["a"].item(1).str(); }), "a[1]: expected a string, got 7");
  EXPECT_EQ(message([&] { root["a"].strings(); }), "a[0]: expected a string, got an object");
  EXPECT_EQ(message([&] { root["m"].member("k.1")["v"].str(); }),
            "m[\"k.1\"].v: expected a string, got true");
  EXPECT_EQ(message([&] { root["s"].array_size(); }), "s: expected an array, got \"x\"");
  EXPECT_EQ(message([&] { root["e"].nonempty_str(); }), "e: must not be empty");
  EXPECT_EQ(message([&] { root["s"].dtype(); }), "s: unknown dtype \"x\"");
  EXPECT_EQ(message([&] { root["n"].boolean(); }), "n: expected true or false, got 4");
  EXPECT_EQ(message([&] { JsonField(j["a"], "", file).expect_object(); }),
            "top level: expected an object, got an array");
  // Excerpts are ASCII and short whatever the input.
  EXPECT_EQ(json_excerpt(json("\xc3\xa9")), "\"\\u00e9\"");
  EXPECT_EQ(json_excerpt(json(std::string(200, 'a'))).size(), 80u);
}

}  // namespace
}  // namespace moepack
