#include "analysis/pullbacks/cells.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "engine/error.h"
#include "engine/io/json.h"

namespace adjoint {

namespace {

const Json& entry(const Json& object, const char* key, const std::string& path, const std::string& where) {
  const Json* v = object.find(key);
  check(v != nullptr, path, ": no '", key, "' in ", where);
  return *v;
}

const Json& of_kind(const Json& v, bool ok, const char* expected, const std::string& path, const std::string& what) {
  check(ok, path, ": ", what, " is ", described(v), ", expected ", expected);
  return v;
}

// A count: an integer in [lowest, 2^53].
int64_t count_entry(const Json& object, const char* key, int64_t lowest, const std::string& path) {
  const Json& v = entry(object, key, path, "the cell");
  check(v.is_number() && v.as_number() >= double(lowest) && v.as_number() <= 9007199254740992.0 &&
            std::trunc(v.as_number()) == v.as_number(),
        path, ": '", key, "' is ", to_json(v), ", expected an integer at least ", lowest);
  return int64_t(v.as_number());
}

// A value's text back to the double it was written from (exact_text), NaN and infinities
// included; anything else is refused.
double value_from_text(const std::string& text, const std::string& path, const std::string& where) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  check(!text.empty() && ec == std::errc() && stop == end, path, ": ", where, " holds '", text,
        "', expected a number's text");
  return value;
}

// A picture's path must stay inside the report's folder.
bool inside_folder(const std::string& relative) {
  if (relative.empty() || relative.front() == '/') return false;
  for (size_t at = 0; at <= relative.size();) {
    const size_t slash = std::min(relative.find('/', at), relative.size());
    if (relative.compare(at, slash - at, "..") == 0 && slash - at == 2) return false;
    at = slash + 1;
  }
  return true;
}

}  // namespace

std::vector<ImageRange> image_cells(int64_t images, int64_t batch) {
  check(batch >= 1, "image_cells: the batch must hold at least one image, got ", batch);
  std::vector<ImageRange> cells;
  for (int64_t first = 0; first < images; first += batch) cells.push_back({first, std::min(batch, images - first)});
  return cells;
}

std::string cell_file_name(const ImageRange& range, const std::optional<MetricPiece>& piece) {
  char name[64];
  std::snprintf(name, sizeof name, "images_%04lld-%04lld", static_cast<long long>(range.first),
                static_cast<long long>(range.first + range.count - 1));
  if (!piece) return cat(name, ".json");
  if (piece->steps == 0) return cat(name, ".", piece->metric, ".", piece->method, ".json");
  char steps[48];
  std::snprintf(steps, sizeof steps, "steps_%03lld-%03lld", static_cast<long long>(piece->first_step),
                static_cast<long long>(piece->first_step + piece->steps - 1));
  return cat(name, ".", piece->metric, ".", piece->method, ".", steps, ".json");
}

std::string piece_step_key(int64_t step) {
  char key[48];
  std::snprintf(key, sizeof key, "randomisation_step_%03lld", static_cast<long long>(step));
  return key;
}

std::string image_cell_text(const ImageCell& cell) {
  Json root = Json::object();
  root["first_image"] = cell.images.first;
  root["images"] = cell.images.count;
  if (cell.piece) {
    Json piece = Json::object();
    piece["metric"] = cell.piece->metric;
    piece["method"] = cell.piece->method;
    piece["first_step"] = cell.piece->first_step;
    piece["steps"] = cell.piece->steps;
    root["piece"] = piece;
  }
  Json scores = Json::object();
  for (const auto& [method, metrics] : cell.scores) {
    Json by_metric = Json::object();
    for (const auto& [metric, values] : metrics) {
      Json texts = Json::array();
      for (double v : values) texts.push_back(exact_text(v));
      by_metric[metric] = texts;
    }
    scores[method] = by_metric;
  }
  root["scores"] = scores;
  Json files = Json::array();
  for (const std::string& f : cell.files) files.push_back(f);
  root["files"] = files;
  Json made = Json::object();
  for (const auto& [key, value] : cell.made) made[key] = value;
  root["made"] = made;
  return to_json(root, 1) + "\n";
}

ImageCell read_image_cell_text(const std::string& text, const std::string& path) {
  Json root;
  try {
    root = parse_json(text);
  } catch (const Error& e) {
    throw Error(cat(path, ": not a cell file: ", e.what()));
  }
  of_kind(root, root.is_object(), "an object", path, "the file");
  ImageCell cell;
  cell.images.first = count_entry(root, "first_image", 0, path);
  cell.images.count = count_entry(root, "images", 1, path);
  if (const Json* piece = root.find("piece")) {
    of_kind(*piece, piece->is_object(), "an object", path, "'piece'");
    // A metric's and a method's name: they become part of a file name.
    const auto name = [&](const char* key) {
      const Json& v = entry(*piece, key, path, "'piece'");
      of_kind(v, v.is_string(), "a string", path, cat("the piece's ", key));
      const std::string& text = v.as_string();
      check(!text.empty() && text.size() <= 64 &&
                text.find_first_not_of("abcdefghijklmnopqrstuvwxyz_0123456789") == std::string::npos,
            path, ": the piece's ", key, " '", text, "' is not a name");
      return text;
    };
    cell.piece = MetricPiece{name("metric"), name("method"), count_entry(*piece, "first_step", 0, path),
                             count_entry(*piece, "steps", 0, path)};
  }

  const Json& scores = entry(root, "scores", path, "the cell");
  of_kind(scores, scores.is_object(), "an object", path, "'scores'");
  for (const auto& [method, by_metric] : scores.as_object()) {
    const std::string where = cat("'scores' of ", method);
    of_kind(by_metric, by_metric.is_object(), "an object", path, where);
    std::map<std::string, std::vector<double>>& metrics = cell.scores[method];
    for (const auto& [metric, texts] : by_metric.as_object()) {
      const std::string values_where = cat("'scores' of ", method, ", ", metric);
      of_kind(texts, texts.is_array(), "an array", path, values_where);
      check(int64_t(texts.size()) <= cell.images.count, path, ": ", values_where, " holds ", texts.size(),
            " values for a cell of ", cell.images.count, " images");
      std::vector<double>& values = metrics[metric];
      for (const Json& t : texts.as_array()) {
        of_kind(t, t.is_string(), "a number's text", path, cat("a value of ", values_where));
        values.push_back(value_from_text(t.as_string(), path, values_where));
      }
    }
  }

  const Json& files = entry(root, "files", path, "the cell");
  of_kind(files, files.is_array(), "an array", path, "'files'");
  for (const Json& f : files.as_array()) {
    of_kind(f, f.is_string(), "a string", path, "an entry of 'files'");
    check(inside_folder(f.as_string()), path, ": picture '", f.as_string(),
          "' is not a path inside the report's folder");
    cell.files.push_back(f.as_string());
  }

  const Json& made = entry(root, "made", path, "the cell");
  of_kind(made, made.is_object(), "an object", path, "'made'");
  for (const auto& [key, value] : made.as_object()) {
    of_kind(value, value.is_string(), "a string", path, cat("'made' entry '", key, "'"));
    cell.made[key] = value.as_string();
  }
  return cell;
}

}  // namespace adjoint
