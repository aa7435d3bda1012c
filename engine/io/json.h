// JSON values, a strict parser and a writer (RFC 8259).
//
// Used for the safetensors header, checkpoint metadata and machine-readable command
// line output. Numbers are doubles, so integers are exact up to 2^53 (enough for byte
// offsets and shapes). Objects keep their keys in insertion order, which makes output
// reproducible: whoever builds an object decides the order (e.g. sorted, from a map).
#pragma once
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace adjoint {

class Json {
public:
  enum class Kind { Null, Bool, Number, String, Array, Object };
  using Array = std::vector<Json>;
  using Member = std::pair<std::string, Json>;
  using Object = std::vector<Member>;  // insertion-ordered, keys unique

  Json() = default;  // null
  Json(std::nullptr_t) {}
  Json(bool value) : value_(value) {}
  Json(double value) : value_(value) {}
  // Every integer type except bool (which has its own constructor above).
  template <std::integral Int>
    requires(!std::same_as<Int, bool>)
  Json(Int value) : value_(static_cast<double>(value)) {}
  Json(const char* value) : value_(std::string(value)) {}
  Json(std::string value) : value_(std::move(value)) {}
  Json(std::string_view value) : value_(std::string(value)) {}
  Json(Array value) : value_(std::move(value)) {}
  Json(Object value) : value_(std::move(value)) {}

  static Json array() { return Json(Array{}); }
  static Json object() { return Json(Object{}); }

  Kind kind() const { return static_cast<Kind>(value_.index()); }
  bool is_null() const { return kind() == Kind::Null; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_number() const { return kind() == Kind::Number; }
  bool is_string() const { return kind() == Kind::String; }
  bool is_array() const { return kind() == Kind::Array; }
  bool is_object() const { return kind() == Kind::Object; }

  // Typed access; each throws Error naming the expected and the actual kind.
  bool as_bool() const;
  double as_number() const;
  // The number as an integer; throws unless it is integral and within ±2^53.
  int64_t as_int() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Object lookup: the member's value, or nullptr when absent (throws if not an object).
  const Json* find(std::string_view key) const;
  // Object access that inserts null for a missing key (a null value becomes an object).
  Json& operator[](std::string_view key);
  // Array append (a null value becomes an array).
  void push_back(Json value);
  // Number of elements of an array or members of an object (throws otherwise).
  size_t size() const;

  bool operator==(const Json& other) const = default;

private:
  std::variant<std::nullptr_t, bool, double, std::string, Array, Object> value_;
};

// "null", "bool", ... for messages.
const char* to_string(Json::Kind kind);
// What a value is, for messages: "an object", "a number", "null".
std::string described(const Json& value);

// Parses exactly one JSON value, surrounded by optional whitespace. Strict: no
// comments, trailing commas, NaN, leading zeros, raw control characters, invalid UTF-8,
// lone surrogates or duplicate object keys. Throws Error "json: at byte N: expected
// ..., found ..." where N is the 0-based offset into `text`.
Json parse_json(std::string_view text);

// Serialises a value. indent < 0: compact, no spaces ({"a":[1,2]}); indent >= 0: one
// element per line, nested levels indented by `indent` spaces more. Integral numbers up
// to 2^53 print without a fraction, other numbers in the shortest form that round-trips.
// NaN and infinity, which JSON cannot represent, are written as null.
std::string to_json(const Json& value, int indent = -1);

}  // namespace adjoint
