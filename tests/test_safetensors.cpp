// JSON values and the safetensors reader/writer: round trips, the dtype fixture written
// by tests/goldens/gen_safetensors.py, corrupted files and the atomic write.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <thread>

#include <unistd.h>

#include "engine/error.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "tests/support.h"

namespace adjoint {
namespace {

namespace fs = std::filesystem;

// The message of the Error `action` throws; fails the test when it throws nothing.
std::string error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL_CHECK("expected adjoint::Error, nothing was thrown");
  return "";
}

// Names of the entries of `dir`, sorted.
std::vector<std::string> listing(const testing::TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from its parts: the 8-byte length is the header's true length.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  const uint64_t length = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &length, 8);
  return bytes + header + data;
}

// The JSON header of a safetensors file, parsed.
Json header_of(const std::string& path) {
  const std::string bytes = read_bytes(path);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return parse_json(std::string_view(bytes).substr(8, length));
}

}  // namespace

// ---------------------------------------------------------------------------------------
// JSON

TEST_CASE("json parses every kind of value") {
  const Json value = parse_json(R"( {"list": [1, -2.5, 1e3, 0.25E-1, true, false, null, "s"], "empty": {}, "none": []} )");
  REQUIRE(value.is_object());
  CHECK(value.size() == 3);
  const Json::Array& list = value.find("list")->as_array();
  REQUIRE(list.size() == 8);
  CHECK(list[0].as_int() == 1);
  CHECK(list[1].as_number() == -2.5);
  CHECK(list[2].as_number() == 1000.0);
  CHECK(list[3].as_number() == 0.025);
  CHECK(list[4].as_bool() == true);
  CHECK(list[5].as_bool() == false);
  CHECK(list[6].is_null());
  CHECK(list[7].as_string() == "s");
  CHECK(value.find("empty")->is_object());
  CHECK(value.find("empty")->size() == 0);
  CHECK(value.find("none")->as_array().empty());
  CHECK(value.find("missing") == nullptr);
}

TEST_CASE("json keeps insertion order and round trips compact and pretty") {
  Json value;
  value["zeta"] = 1;
  value["alpha"] = Json::Array{true, nullptr, "x", 2.5};
  value["nested"]["b"] = Json::object();
  value["nested"]["a"] = Json::array();
  value["alpha"].push_back(-3);

  const std::string compact = to_json(value);
  CHECK(compact == R"({"zeta":1,"alpha":[true,null,"x",2.5,-3],"nested":{"b":{},"a":[]}})");
  const std::string pretty = to_json(value, 2);
  CHECK(pretty ==
        "{\n"
        "  \"zeta\": 1,\n"
        "  \"alpha\": [\n"
        "    true,\n"
        "    null,\n"
        "    \"x\",\n"
        "    2.5,\n"
        "    -3\n"
        "  ],\n"
        "  \"nested\": {\n"
        "    \"b\": {},\n"
        "    \"a\": []\n"
        "  }\n"
        "}");
  CHECK(parse_json(compact) == value);
  CHECK(parse_json(pretty) == value);
  CHECK(parse_json(compact).as_object().front().first == "zeta");
}

TEST_CASE("json numbers: integers exact up to 2^53, others round trip") {
  const int64_t two53 = int64_t{1} << 53;
  CHECK(parse_json("9007199254740992").as_int() == two53);
  CHECK(parse_json("-9007199254740992").as_int() == -two53);
  CHECK(to_json(Json(two53)) == "9007199254740992");
  CHECK(to_json(Json(two53 - 1)) == "9007199254740991");
  CHECK(to_json(Json(-0.0)) == "0");  // integral, printed without sign or fraction
  CHECK(parse_json("1e2").as_int() == 100);
  // Beyond 2^53 the value is a double: printed in exponent form, still round-tripping.
  CHECK(parse_json(to_json(Json(1e300))).as_number() == 1e300);
  for (double x : {0.1, -2.5e-7, 1.0 / 3.0, 123456.789, 5e-324, 1.7976931348623157e308})
    CHECK(parse_json(to_json(Json(x))).as_number() == x);
  CHECK(to_json(Json(0.1)) == "0.1");
  CHECK_THROWS_WITH_AS(parse_json("1.5").as_int(), doctest::Contains("expected an integer within ±2^53, found 1.5"),
                       Error);
  CHECK_THROWS_WITH_AS(parse_json("1e300").as_int(), doctest::Contains("expected an integer"), Error);
  // JSON has no NaN or infinity: they are written as null, also inside containers.
  CHECK(to_json(Json(std::nan(""))) == "null");
  CHECK(to_json(Json(-std::numeric_limits<double>::infinity())) == "null");
  CHECK(to_json(Json(Json::Object{{"loss", std::numeric_limits<double>::infinity()}, {"acc", 0.5}})) ==
        R"({"loss":null,"acc":0.5})");
}

TEST_CASE("json string escapes and UTF-8") {
  // \u00e9 is é (2 bytes), \u20ac € (3 bytes), the surrogate pair \ud83d\ude00 😀 (4 bytes).
  const Json s = parse_json(R"("a\n\t\"\\\/\b\f\r\u0041\u00e9\u20ac\ud83d\ude00 raw é")");
  CHECK(s.as_string() == "a\n\t\"\\/\b\f\rA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 raw \xc3\xa9");
  // The writer escapes what JSON requires and passes UTF-8 through.
  CHECK(to_json(s) == "\"a\\n\\t\\\"\\\\/\\b\\f\\rA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 raw \xc3\xa9\"");
  CHECK(to_json(Json(std::string("\x01\x1f", 2))) == R"("\u0001\u001f")");
  CHECK(parse_json(to_json(s)) == s);
  CHECK(parse_json(R"("\uD83D\uDE00")").as_string() == "\xf0\x9f\x98\x80");  // upper-case hex
  CHECK(parse_json(R"({"k\u00e9y": 1})").find("k\xc3\xa9y") != nullptr);
}

TEST_CASE("json parse errors name the byte offset and what was expected") {
  struct Case {
    std::string text;
    const char* message;
  };
  const Case cases[] = {
      {"", "at byte 0: expected a value (object, array, string, number, true, false or null), found end of input"},
      {"  [1,]", "at byte 5: expected a value"},
      {R"({"a":1,})", "at byte 7: expected a string key, found '}'"},
      {R"({"a" 1})", "at byte 5: expected ':' after an object key, found '1'"},
      {"[1 2]", "at byte 3: expected ',' or ']' after an array element, found '2'"},
      {R"({"a":1 "b":2})", "at byte 7: expected ',' or '}' after an object member"},
      {"01", "at byte 1: expected '.', 'e' or the end of the number after a leading 0"},
      {"1.", "at byte 2: expected a digit after the decimal point, found end of input"},
      {"-", "at byte 1: expected a digit"},
      {"1e+", "at byte 3: expected a digit in the exponent"},
      {"1e999", "at byte 0: expected a number within the range of a double"},
      {"+1", "at byte 0: expected a value"},
      {"NaN", "at byte 0: expected a value"},
      {"tru", "at byte 0: expected 'true'"},
      {"nul", "at byte 0: expected 'null'"},
      {R"("abc)", "at byte 4: expected '\"' to close the string, found end of input"},
      {R"("\x")", "at byte 2: expected an escape character"},
      {R"("\u12G4")", "at byte 5: expected a hex digit in a \\u escape, found 'G'"},
      {R"("\ud800")", "at byte 7: expected a \\u low surrogate after a high surrogate"},
      {R"("\ud800\u0041")", "at byte 7: expected a low surrogate (\\udc00-\\udfff)"},
      {R"("\udc00")", "at byte 1: expected a code point, not a lone low surrogate"},
      {"\"a\nb\"", "at byte 2: expected an escape (\\n, \\t, \\u00XX...) instead of a raw control character"},
      {"\"\xff\"", "at byte 1: expected valid UTF-8 in a string, found byte 0xff"},
      {"\"\xc3\"", "at byte 1: expected valid UTF-8"},           // truncated sequence
      {"\"\xc0\xaf\"", "at byte 1: expected valid UTF-8"},       // overlong '/'
      {"\"\xed\xa0\x80\"", "at byte 1: expected valid UTF-8"},   // encoded surrogate
      {R"({"a":1,"a":2})", "at byte 7: expected a key not seen before in this object, \"a\" repeats"},
      {"1 2", "at byte 2: expected end of input after the value, found '2'"},
      {"[1] // comment", "at byte 4: expected end of input"},
      {std::string(600, '['), "expected nesting no deeper than 512 levels"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    const std::string message = error_message([&] { parse_json(c.text); });
    CHECK(message.rfind("json: ", 0) == 0);
    CHECK_MESSAGE(message.find(c.message) != std::string::npos, message);
    CHECK(message.find('\n') == std::string::npos);
  }
}

TEST_CASE("json typed access names the expected and actual kinds") {
  CHECK_THROWS_WITH_AS(Json(1).as_string(), "json: expected string, found number", Error);
  CHECK_THROWS_WITH_AS(Json("x").as_array(), "json: expected array, found string", Error);
  CHECK_THROWS_WITH_AS(Json().find("k"), "json: expected object, found null", Error);
  CHECK_THROWS_WITH_AS(Json(true).size(), doctest::Contains("size() of a bool"), Error);
}

// ---------------------------------------------------------------------------------------
// safetensors

TEST_CASE("safetensors write then read round trips shapes, values and metadata") {
  testing::TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const Tensor matrix = testing::random_tensor({3, 4}, 7);
  // A transposed view: the writer must store its values in row-major order.
  const Tensor transposed = matrix.view_as_strided({4, 3}, {1, 4}, 0);
  REQUIRE(!transposed.is_contiguous());
  const std::map<std::string, Tensor> tensors = {
      {"layer.weight", matrix},
      {"layer.bias", Tensor::from_vector({4}, {1.5f, -2.0f, 0.0f, 1e-30f})},
      {"transposed", transposed},
      {"scalar", Tensor::scalar(3.5f)},
      {"zero_rows", Tensor::zeros({0, 4})},
      {"zero_middle", Tensor::zeros({2, 0, 3})},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "caf\xc3\xa9 \"q\"\n"}};
  write_safetensors(path, tensors, metadata);

  const SafetensorsFile file = read_safetensors(path);
  REQUIRE(file.tensors.size() == tensors.size());
  for (const auto& [name, tensor] : tensors) {
    CAPTURE(name);
    REQUIRE(file.tensors.count(name) == 1);
    CHECK(file.tensors.at(name).shape() == tensor.shape());
    CHECK(file.tensors.at(name).to_vector() == tensor.to_vector());  // bit-exact
    CHECK(file.dtypes.at(name) == "F32");
  }
  CHECK(file.tensors.at("transposed").at({1, 2}) == matrix.at({2, 1}));
  CHECK(file.tensors.at("scalar").dim() == 0);
  CHECK(file.metadata == metadata);

  // The layout the reference implementation writes: header padded with spaces to a
  // multiple of 8, __metadata__ then the tensors in sorted order, back to back.
  const std::string bytes = read_bytes(path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  CHECK(header_length % 8 == 0);
  const Json header = header_of(path);
  std::vector<std::string> keys;
  for (const auto& member : header.as_object()) keys.push_back(member.first);
  CHECK(keys == std::vector<std::string>{"__metadata__", "layer.bias", "layer.weight", "scalar", "transposed",
                                         "zero_middle", "zero_rows"});
  CHECK(to_json(*header.find("layer.weight")) == R"({"dtype":"F32","shape":[3,4],"data_offsets":[16,64]})");
  CHECK(bytes.size() == 8 + header_length + 4 * (4 + 12 + 1 + 12));

  // Without metadata there is no __metadata__ entry; an empty file of tensors is valid.
  write_safetensors(path, {{"x", Tensor::scalar(1.0f)}});
  CHECK(header_of(path).find("__metadata__") == nullptr);
  CHECK(read_safetensors(path).metadata.empty());
  write_safetensors(path, {});
  CHECK(read_safetensors(path).tensors.empty());
  CHECK(read_bytes(path).size() == 16);  // length + "{}" padded to 8
}

TEST_CASE("safetensors reads every dtype of the fixture from gen_safetensors.py") {
  const SafetensorsFile& file = testing::fixture("safetensors_dtypes");
  const auto values = [&](const std::string& name) { return file.tensors.at(name).to_vector(); };
  const auto dtype = [&](const std::string& name) { return file.dtypes.at(name); };
  CHECK(file.tensors.size() == 12);

  CHECK(dtype("f32") == "F32");
  CHECK(file.tensors.at("f32").shape() == Shape{2, 3});
  CHECK(values("f32") == std::vector<float>{0.0f, 1.0f, -2.5f, 3.25f, 1e-8f, -1e30f});

  CHECK(dtype("f16") == "F16");
  const std::vector<float> f16 = values("f16");
  CHECK(f16 == std::vector<float>{1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), -0.0f,
                                  std::numeric_limits<float>::infinity()});
  CHECK(std::signbit(f16[5]));

  CHECK(dtype("bf16") == "BF16");
  CHECK(file.tensors.at("bf16").shape() == Shape{2, 2});
  CHECK(values("bf16") == std::vector<float>{1.0f, -3.140625f, std::ldexp(1.0f, 100), std::ldexp(1.0f, -130)});

  CHECK(dtype("f64") == "F64");
  CHECK(values("f64") == std::vector<float>{0.1f, -1e10f, 2.5f});

  // BatchNorm's counter: an I64 scalar.
  CHECK(dtype("bn.num_batches_tracked") == "I64");
  CHECK(file.tensors.at("bn.num_batches_tracked").dim() == 0);
  CHECK(file.tensors.at("bn.num_batches_tracked").item() == 12345.0f);
  CHECK(values("i64") == std::vector<float>{-7.0f, 0.0f, 1099511627776.0f});

  CHECK(dtype("i32") == "I32");
  CHECK(values("i32") == std::vector<float>{-2147483648.0f, 123456.0f});
  CHECK(dtype("i16") == "I16");
  CHECK(values("i16") == std::vector<float>{-32768.0f, 32767.0f});
  CHECK(dtype("i8") == "I8");
  CHECK(values("i8") == std::vector<float>{-128.0f, 0.0f, 127.0f});
  CHECK(dtype("u8") == "U8");
  CHECK(values("u8") == std::vector<float>{0.0f, 200.0f, 255.0f});
  CHECK(dtype("bool") == "BOOL");
  CHECK(values("bool") == std::vector<float>{1.0f, 0.0f, 0.0f, 1.0f});

  CHECK(file.tensors.at("empty").shape() == Shape{2, 0});
  CHECK(file.tensors.at("empty").numel() == 0);

  // Written by Python's json with \u escapes, including a surrogate pair.
  CHECK(file.metadata.at("format") == "pt");
  CHECK(file.metadata.at("note") == "caf\xc3\xa9 \"quoted\" \xf0\x9f\x99\x82");
}

TEST_CASE("safetensors rejects corrupted files with a one-line error naming the file") {
  testing::TempDir dir;
  const std::string good = dir.file("good.safetensors");
  write_safetensors(good, {{"a", Tensor::ones({2})}, {"b", Tensor::ones({3})}});
  const std::string good_bytes = read_bytes(good);
  const std::string f32_2 = R"("dtype":"F32","shape":[2])";

  struct Case {
    const char* name;
    std::string bytes;
    std::string message;
  };
  std::string long_length = good_bytes, over_limit = good_bytes;
  const uint64_t huge = 1'000'000, beyond = 150'000'092;
  std::memcpy(long_length.data(), &huge, 8);
  std::memcpy(over_limit.data(), &beyond, 8);
  const Case cases[] = {
      {"truncated", good_bytes.substr(0, good_bytes.size() - 4),
       "tensor 'b': data_offsets [8, 20] reach beyond the data section of 16 bytes (file truncated?)"},
      {"short", "abc", "file of 3 bytes is too short for the 8-byte header length"},
      {"long_header", long_length, "header length 1000000 exceeds the"},
      {"over_limit", over_limit, "header length 150000092 is over the limit of 100000000 bytes"},
      {"huge_offset",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18014398509481984]}})", ""),
       "tensor 'a': \"data_offsets\" end is 18014398509481984, too large (integers above 2^53 are not exact"},
      {"bad_json", safetensors_bytes(R"({"a":{"dtype":"F32",}})", ""),
       "malformed JSON header: json: at byte 20: expected a string key, found '}'"},
      {"not_object", safetensors_bytes("[1]", ""), "header is a JSON array, expected an object"},
      {"size_mismatch", safetensors_bytes(R"({"a":{)" + f32_2 + R"(,"data_offsets":[0,12]}})", std::string(12, '\0')),
       "tensor 'a': dtype F32 and shape [2] need 8 bytes, data_offsets [0, 12] span 12"},
      {"unknown_dtype", safetensors_bytes(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", ""),
       "tensor 'a': unknown dtype 'F128' (supported: F32, F16, BF16"},
      {"overlap",
       safetensors_bytes(R"({"a":{)" + f32_2 + R"(,"data_offsets":[0,8]},"b":{)" + f32_2 + R"(,"data_offsets":[4,12]}})",
                         std::string(12, '\0')),
       "tensor 'b': data_offsets [4, 12] overlap tensor 'a' (data_offsets [0, 8])"},
      {"gap",
       safetensors_bytes(R"({"a":{)" + f32_2 + R"(,"data_offsets":[0,8]},"b":{)" + f32_2 + R"(,"data_offsets":[12,20]}})",
                         std::string(20, '\0')),
       "tensor 'b': data_offsets [12, 20] leave a gap of 4 bytes after tensor 'a'"},
      {"not_at_start", safetensors_bytes(R"({"a":{)" + f32_2 + R"(,"data_offsets":[4,12]}})", std::string(12, '\0')),
       "tensor 'a': data_offsets [4, 12] leave a gap of 4 bytes after the start of the data section"},
      {"reversed", safetensors_bytes(R"({"a":{)" + f32_2 + R"(,"data_offsets":[8,0]}})", std::string(8, '\0')),
       "tensor 'a': data_offsets [8, 0] end before begin"},
      {"trailing", safetensors_bytes(R"({"a":{)" + f32_2 + R"(,"data_offsets":[0,8]}})", std::string(9, '\0')),
       "1 bytes after the last tensor 'a': the data section is 9 bytes, the tensors cover 8"},
      {"missing_shape", safetensors_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0')),
       "tensor 'a': missing \"shape\""},
      {"negative_extent", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", ""),
       "tensor 'a': a \"shape\" extent is -1, expected a non-negative integer"},
      {"bad_offsets", safetensors_bytes(R"({"a":{)" + f32_2 + R"(,"data_offsets":[0]}})", ""),
       "tensor 'a': \"data_offsets\" is [0], expected [begin, end]"},
      {"overflow", safetensors_bytes(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                                     std::string(8, '\0')),
       "need more than 2^63 bytes"},
      {"metadata_value", safetensors_bytes(R"({"__metadata__":{"epoch":3}})", ""),
       "__metadata__ value of 'epoch' is a number, expected a string"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string path = dir.file(cat(c.name, ".safetensors"));
    write_bytes(path, c.bytes);
    const std::string message = error_message([&] { read_safetensors(path); });
    CHECK_MESSAGE(message.find(cat("read_safetensors: ", path, ": ")) == 0, message);
    CHECK_MESSAGE(message.find(c.message) != std::string::npos, message);
    CHECK(message.find('\n') == std::string::npos);
  }

  const std::string missing = dir.file("missing.safetensors");
  CHECK(error_message([&] { read_safetensors(missing); }) ==
        cat("read_safetensors: ", missing, ": cannot open: No such file or directory"));
  // The good file itself still reads.
  CHECK(read_safetensors(good).tensors.size() == 2);
}

TEST_CASE("safetensors write is atomic and leaves no temporary file") {
  testing::TempDir dir;
  const std::string path = dir.file("weights.safetensors");
  write_safetensors(path, {{"w", Tensor::ones({2, 2})}});
  write_safetensors(path, {{"w", Tensor::full({3}, 2.0f)}});  // replaces the old file
  CHECK(listing(dir) == std::vector<std::string>{"weights.safetensors"});
  CHECK(read_safetensors(path).tensors.at("w").to_vector() == std::vector<float>{2.0f, 2.0f, 2.0f});

  // A missing directory: the error names the path, and nothing is created.
  const std::string nowhere = dir.file("no_such_dir/weights.safetensors");
  const std::string message = error_message([&] { write_safetensors(nowhere, {{"w", Tensor::ones({2})}}); });
  CHECK(message.find(cat("write_safetensors: ", nowhere, ": cannot create ")) == 0);
  CHECK(message.find("No such file or directory") != std::string::npos);
  CHECK(!fs::exists(dir.file("no_such_dir")));

  // The rename fails when a directory sits at the target: the temporary file, already
  // fully written, is removed and the directory left as it was.
  const std::string blocked = dir.file("blocked.safetensors");
  fs::create_directories(fs::path(blocked) / "inside");
  CHECK(error_message([&] { write_safetensors(blocked, {{"w", Tensor::ones({2})}}); }).find("renaming") !=
        std::string::npos);
  CHECK(listing(dir) == std::vector<std::string>{"blocked.safetensors", "weights.safetensors"});
  CHECK(fs::is_directory(fs::path(blocked) / "inside"));

  // Invalid input fails before anything touches the disk; the old file stays intact.
  CHECK(error_message([&] { write_safetensors(path, {{"__metadata__", Tensor::ones({1})}}); })
            .find("'__metadata__' is reserved") != std::string::npos);
  CHECK(error_message([&] { write_safetensors(path, {{"undefined", Tensor()}}); }) ==
        cat("write_safetensors: ", path, ": tensor 'undefined' is undefined"));
  CHECK(read_safetensors(path).tensors.at("w").numel() == 3);
  CHECK(listing(dir) == std::vector<std::string>{"blocked.safetensors", "weights.safetensors"});
}

TEST_CASE("safetensors written in parts, out of order from two threads, is write_safetensors' bytes") {
  testing::TempDir dir;
  const Tensor a = testing::random_tensor({3, 4}, 11), b = testing::random_tensor({5}, 12),
               c = testing::random_tensor({2, 2, 3}, 13);
  const std::map<std::string, std::string> metadata = {{"method", "gradient"}, {"model", "tiny"}};
  write_safetensors(dir.file("whole.safetensors"), {{"a", a}, {"b", b}, {"c", c}}, metadata);

  SafetensorsWriter parts(dir.file("parts.safetensors"), {{"a", a.shape()}, {"b", b.shape()}, {"c", c.shape()}},
                          metadata);
  const auto rows = [](const Tensor& t, int64_t begin, int64_t end) {  // a copy of rows [begin, end)
    const int64_t row = t.numel() / t.size(0);
    std::vector<float> values(t.data() + begin * row, t.data() + end * row);
    Shape shape = t.shape();
    shape[0] = end - begin;
    return Tensor::from_vector(shape, values);
  };
  std::thread other([&] {
    parts.write("c", 6, rows(c, 1, 2));
    parts.write("a", 0, rows(a, 0, 2));
  });
  parts.write("b", 0, b);
  parts.write("a", 8, rows(a, 2, 3));
  parts.write("c", 0, rows(c, 0, 1));
  other.join();
  CHECK(listing(dir) == std::vector<std::string>{cat("parts.safetensors.tmp.", ::getpid()), "whole.safetensors"});
  parts.commit();
  CHECK(testing::read_text(dir.file("parts.safetensors")) == testing::read_text(dir.file("whole.safetensors")));
  CHECK(listing(dir) == std::vector<std::string>{"parts.safetensors", "whole.safetensors"});
}

TEST_CASE("safetensors written in parts: a value unwritten, an unknown tensor or a range outside it is refused") {
  testing::TempDir dir;
  const std::string path = dir.file("maps.safetensors");
  {
    SafetensorsWriter parts(path, {{"x", {2, 3}}, {"y", {4}}});
    parts.write("x", 0, Tensor::ones({2, 3}));
    parts.write("y", 0, Tensor::ones({3}));
    CHECK(error_message([&] { parts.write("z", 0, Tensor::ones({1})); }) ==
          cat("write_safetensors: ", path, ": no tensor 'z' in its header"));
    CHECK(error_message([&] { parts.write("y", 2, Tensor::ones({3})); }) ==
          cat("write_safetensors: ", path, ": tensor 'y' has 4 values, not [2, 5)"));
    CHECK(error_message([&] { parts.commit(); }) ==
          cat("write_safetensors: ", path, ": tensor 'y' has 3 of its 4 values written"));
  }
  CHECK(listing(dir).empty());  // the writer, gone uncommitted, took its temporary with it
  {
    SafetensorsWriter abandoned(path, {{"x", {2}}});
    abandoned.write("x", 0, Tensor::ones({2}));
  }
  CHECK(listing(dir).empty());
}

// A benchmark, skipped by default: ./adjoint_tests -tc='safetensors 100 MB*' --no-skip
TEST_CASE("safetensors 100 MB write and read timing" * doctest::skip()) {
  testing::TempDir dir;
  const std::string path = dir.file("big.safetensors");
  std::map<std::string, Tensor> tensors;
  for (int i = 0; i < 25; ++i) tensors.emplace(cat("layer", i), Tensor::full({1000, 1000}, static_cast<float>(i)));
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); };
  auto start = Clock::now();
  write_safetensors(path, tensors);
  MESSAGE("write 100 MB: ", seconds(start), " s");
  start = Clock::now();
  const SafetensorsFile file = read_safetensors(path);
  MESSAGE("read 100 MB: ", seconds(start), " s");
  CHECK(file.tensors.at("layer24").at({999, 999}) == 24.0f);
}

}  // namespace adjoint
