#include "engine/io/json.h"

#include <charconv>
#include <cmath>
#include <unordered_set>

#include "engine/error.h"

namespace adjoint {

// ---------------------------------------------------------------------------------------
// The value type.

const char* to_string(Json::Kind kind) {
  switch (kind) {
    case Json::Kind::Null: return "null";
    case Json::Kind::Bool: return "bool";
    case Json::Kind::Number: return "number";
    case Json::Kind::String: return "string";
    case Json::Kind::Array: return "array";
    case Json::Kind::Object: return "object";
  }
  return "?";
}

std::string described(const Json& value) {
  const std::string kind = to_string(value.kind());
  return value.is_null() ? kind : (kind[0] == 'a' || kind[0] == 'o' ? "an " : "a ") + kind;
}

namespace {

// Largest magnitude below which every integer is exactly representable in a double.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

void expect_kind(const Json& value, Json::Kind kind) {
  check(value.kind() == kind, "json: expected ", to_string(kind), ", found ", to_string(value.kind()));
}

}  // namespace

bool Json::as_bool() const {
  expect_kind(*this, Kind::Bool);
  return std::get<bool>(value_);
}

double Json::as_number() const {
  expect_kind(*this, Kind::Number);
  return std::get<double>(value_);
}

int64_t Json::as_int() const {
  const double x = as_number();
  if (std::trunc(x) != x || std::fabs(x) > kMaxExactInteger)
    throw Error(cat("json: expected an integer within ±2^53, found ", to_json(*this)));
  return static_cast<int64_t>(x);
}

const std::string& Json::as_string() const {
  expect_kind(*this, Kind::String);
  return std::get<std::string>(value_);
}

const Json::Array& Json::as_array() const {
  expect_kind(*this, Kind::Array);
  return std::get<Array>(value_);
}

Json::Array& Json::as_array() {
  expect_kind(*this, Kind::Array);
  return std::get<Array>(value_);
}

const Json::Object& Json::as_object() const {
  expect_kind(*this, Kind::Object);
  return std::get<Object>(value_);
}

Json::Object& Json::as_object() {
  expect_kind(*this, Kind::Object);
  return std::get<Object>(value_);
}

const Json* Json::find(std::string_view key) const {
  for (const Member& member : as_object())
    if (member.first == key) return &member.second;
  return nullptr;
}

Json& Json::operator[](std::string_view key) {
  if (is_null()) value_ = Object{};
  Object& members = as_object();
  for (Member& member : members)
    if (member.first == key) return member.second;
  members.emplace_back(std::string(key), Json());
  return members.back().second;
}

void Json::push_back(Json value) {
  if (is_null()) value_ = Array{};
  as_array().push_back(std::move(value));
}

size_t Json::size() const {
  if (is_array()) return as_array().size();
  if (is_object()) return as_object().size();
  throw Error(cat("json: size() of a ", to_string(kind()), ", expected array or object"));
}

// ---------------------------------------------------------------------------------------
// The parser: recursive descent over the grammar of RFC 8259, one function per rule.

namespace {

class Parser {
public:
  explicit Parser(std::string_view text) : text_(text) {}

  Json parse_document() {
    skip_whitespace();
    Json value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("end of input after the value");
    return value;
  }

private:
  // Deep enough for any real document, shallow enough never to exhaust the stack.
  static constexpr int kMaxDepth = 512;

  [[noreturn]] void fail(const std::string& expected) const { fail_at(pos_, expected); }

  [[noreturn]] void fail_at(size_t pos, const std::string& expected) const {
    throw Error(cat("json: at byte ", pos, ": expected ", expected, ", found ", describe(pos)));
  }

  // What sits at `pos`, printable in a one-line message.
  std::string describe(size_t pos) const {
    if (pos >= text_.size()) return "end of input";
    const auto c = static_cast<unsigned char>(text_[pos]);
    if (c >= 0x20 && c < 0x7f) return cat("'", static_cast<char>(c), "'");
    static const char* hex = "0123456789abcdef";
    return cat("byte 0x", hex[c >> 4], hex[c & 15]);
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  void expect_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) fail(cat("'", word, "'"));
    pos_ += word.size();
  }

  Json parse_value(int depth) {
    switch (peek()) {
      case '{': return parse_object(depth);
      case '[': return parse_array(depth);
      case '"': return Json(parse_string());
      case 't': expect_literal("true"); return Json(true);
      case 'f': expect_literal("false"); return Json(false);
      case 'n': expect_literal("null"); return Json();
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return Json(parse_number());
        fail("a value (object, array, string, number, true, false or null)");
    }
  }

  void enter(int depth) const {
    if (depth >= kMaxDepth) fail(cat("nesting no deeper than ", kMaxDepth, " levels"));
  }

  Json parse_object(int depth) {
    enter(depth);
    ++pos_;  // '{'
    Json::Object members;
    std::unordered_set<std::string> seen;  // catches duplicates without a quadratic scan
    skip_whitespace();
    if (peek() == '}') {
      ++pos_;
      return Json(std::move(members));
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"') fail("a string key");
      const size_t key_pos = pos_;
      std::string key = parse_string();
      if (!seen.insert(key).second) fail_at(key_pos, cat("a key not seen before in this object, \"", key, "\" repeats"));
      skip_whitespace();
      if (peek() != ':') fail("':' after an object key");
      ++pos_;
      skip_whitespace();
      Json value = parse_value(depth + 1);
      members.emplace_back(std::move(key), std::move(value));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return Json(std::move(members));
      }
      fail("',' or '}' after an object member");
    }
  }

  Json parse_array(int depth) {
    enter(depth);
    ++pos_;  // '['
    Json::Array elements;
    skip_whitespace();
    if (peek() == ']') {
      ++pos_;
      return Json(std::move(elements));
    }
    while (true) {
      skip_whitespace();
      elements.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return Json(std::move(elements));
      }
      fail("',' or ']' after an array element");
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, converted without locale.
  double parse_number() {
    const size_t start = pos_;
    auto digits = [&](const char* what) {
      if (!(peek() >= '0' && peek() <= '9')) fail(what);
      while (peek() >= '0' && peek() <= '9') ++pos_;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
      if (peek() >= '0' && peek() <= '9') fail("'.', 'e' or the end of the number after a leading 0");
    } else {
      digits("a digit");
    }
    if (peek() == '.') {
      ++pos_;
      digits("a digit after the decimal point");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      digits("a digit in the exponent");
    }
    double value = 0.0;
    const auto [end, error] = std::from_chars(text_.data() + start, text_.data() + pos_, value);
    // The grammar was checked above, so the only failure left is a magnitude beyond double.
    if (error != std::errc() || end != text_.data() + pos_) fail_at(start, "a number within the range of a double");
    return value;
  }

  // Four hex digits of a \u escape.
  uint32_t parse_hex4() {
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = peek();
      uint32_t digit;
      if (c >= '0' && c <= '9') digit = c - '0';
      else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
      else fail("a hex digit in a \\u escape");
      code = code * 16 + digit;
      ++pos_;
    }
    return code;
  }

  static void append_utf8(std::string& out, uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xc0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xe0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    }
  }

  // \uXXXX, with a UTF-16 surrogate pair combined into one code point.
  void parse_unicode_escape(std::string& out) {
    const size_t start = pos_ - 2;  // at the backslash
    uint32_t code = parse_hex4();
    if (code >= 0xdc00 && code <= 0xdfff) fail_at(start, "a code point, not a lone low surrogate");
    if (code >= 0xd800 && code <= 0xdbff) {
      if (text_.substr(pos_, 2) != "\\u") fail("a \\u low surrogate after a high surrogate");
      pos_ += 2;
      const uint32_t low = parse_hex4();
      if (low < 0xdc00 || low > 0xdfff) fail_at(pos_ - 6, "a low surrogate (\\udc00-\\udfff) after a high surrogate");
      code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
    }
    append_utf8(out, code);
  }

  // Copies one well-formed UTF-8 sequence of 2-4 bytes (no overlongs, no surrogates).
  void copy_utf8_sequence(std::string& out) {
    const auto byte = [&](size_t i) { return pos_ + i < text_.size() ? static_cast<unsigned char>(text_[pos_ + i]) : 0u; };
    const unsigned lead = byte(0);
    int length;
    unsigned low = 0x80, high = 0xbf;  // allowed range of the second byte
    if (lead >= 0xc2 && lead <= 0xdf) length = 2;
    else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3;
      if (lead == 0xe0) low = 0xa0;   // overlong
      if (lead == 0xed) high = 0x9f;  // surrogates
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4;
      if (lead == 0xf0) low = 0x90;   // overlong
      if (lead == 0xf4) high = 0x8f;  // beyond U+10FFFF
    } else {
      fail("valid UTF-8 in a string");
    }
    for (int i = 1; i < length; ++i) {
      const unsigned b = byte(i);
      const bool ok = i == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xbf);
      if (!ok) fail("valid UTF-8 in a string");
    }
    out.append(text_.substr(pos_, length));
    pos_ += length;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail("'\"' to close the string");
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("an escape (\\n, \\t, \\u00XX...) instead of a raw control character in a string");
      if (c >= 0x80) {
        copy_utf8_sequence(out);
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      ++pos_;  // backslash
      const char escape = peek();
      ++pos_;
      switch (escape) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': parse_unicode_escape(out); break;
        default: fail_at(pos_ - 1, "an escape character (\" \\ / b f n r t u) after '\\'");
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

Json parse_json(std::string_view text) { return Parser(text).parse_document(); }

// ---------------------------------------------------------------------------------------
// The writer.

namespace {

void write_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          static const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;  // UTF-8 passes through unchanged
        }
    }
  }
  out += '"';
}

void write_number(std::string& out, double x) {
  // JSON has no NaN or infinity; null is what JavaScript's JSON.stringify and Python's
  // json.dumps(allow_nan=False) users expect for "no number here" (a diverged loss).
  if (!std::isfinite(x)) {
    out += "null";
    return;
  }
  char buffer[32];
  std::to_chars_result result;
  if (std::trunc(x) == x && std::fabs(x) <= kMaxExactInteger) {
    result = std::to_chars(buffer, buffer + sizeof buffer, static_cast<int64_t>(x));
  } else {
    result = std::to_chars(buffer, buffer + sizeof buffer, x);  // shortest round-trip form
  }
  out.append(buffer, result.ptr);
}

void write_value(std::string& out, const Json& value, int indent, int depth) {
  // Between elements: nothing (compact) or a newline and the indentation of `level`.
  const auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * level, ' ');
  };
  switch (value.kind()) {
    case Json::Kind::Null: out += "null"; return;
    case Json::Kind::Bool: out += value.as_bool() ? "true" : "false"; return;
    case Json::Kind::Number: write_number(out, value.as_number()); return;
    case Json::Kind::String: write_string(out, value.as_string()); return;
    case Json::Kind::Array: {
      const Json::Array& elements = value.as_array();
      out += '[';
      for (size_t i = 0; i < elements.size(); ++i) {
        if (i > 0) out += ',';
        newline(depth + 1);
        write_value(out, elements[i], indent, depth + 1);
      }
      if (!elements.empty()) newline(depth);
      out += ']';
      return;
    }
    case Json::Kind::Object: {
      const Json::Object& members = value.as_object();
      out += '{';
      for (size_t i = 0; i < members.size(); ++i) {
        if (i > 0) out += ',';
        newline(depth + 1);
        write_string(out, members[i].first);
        out += indent < 0 ? ":" : ": ";
        write_value(out, members[i].second, indent, depth + 1);
      }
      if (!members.empty()) newline(depth);
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string to_json(const Json& value, int indent) {
  std::string out;
  write_value(out, value, indent, 0);
  return out;
}

}  // namespace adjoint
