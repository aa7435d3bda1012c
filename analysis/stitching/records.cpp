#include "analysis/stitching/records.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "engine/io/table.h"

namespace adjoint {

std::string measured(double v, int digits) { return std::isnan(v) ? "" : fixed(v, digits); }

namespace {

// The fields of a JSON object read one by one, each error naming the file and the field.
class Fields {
public:
  Fields(const Json& json, const std::string& path, std::string where = "")
      : json_(json), path_(path), where_(std::move(where)) {
    check(json.is_object(), path_, ": ", where_.empty() ? "the file" : where_, " is ", described(json),
          ", expected an object");
  }
  const Json* find(const char* key) const { return json_.find(key); }
  const Json& get(const char* key) const {
    const Json* v = json_.find(key);
    check(v != nullptr, path_, ": no '", key, "'", where_.empty() ? "" : " in " + where_);
    return *v;
  }
  std::string text(const char* key) const {
    const Json& v = get(key);
    check(v.is_string(), path_, ": '", key, "' is ", described(v), ", expected a string");
    return v.as_string();
  }
  int64_t count(const char* key) const {
    const Json& v = get(key);
    check(v.is_number() && v.as_number() >= 0 && v.as_number() <= 9007199254740992.0 &&
              std::trunc(v.as_number()) == v.as_number(),
          path_, ": '", key, "' is ", to_json(v), ", expected a count (an integer at least 0)");
    return int64_t(v.as_number());
  }
  double share(const char* key) const {
    const Json& v = get(key);
    check(v.is_number() && v.as_number() >= 0 && v.as_number() <= 1, path_, ": '", key, "' is ", to_json(v),
          ", expected a share between 0 and 1");
    return v.as_number();
  }
  // Absent or null: NaN (not measured); otherwise a finite number.
  double optional_number(const char* key) const {
    const Json* v = json_.find(key);
    if (v == nullptr || v->is_null()) return NAN;
    check(v->is_number() && std::isfinite(v->as_number()), path_, ": '", key, "' is ", to_json(*v),
          ", expected a number or null");
    return v->as_number();
  }
  bool flag(const char* key) const {
    const Json* v = json_.find(key);
    if (v == nullptr || v->is_null()) return false;
    check(v->is_bool(), path_, ": '", key, "' is ", to_json(*v), ", expected true, false or null");
    return v->as_bool();
  }

private:
  const Json& json_;
  const std::string& path_;
  std::string where_;
};

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(); }

// A tensor of `file` that must be there, floating point and finite.
Tensor finite_tensor(const SafetensorsFile& file, const std::string& name, const std::string& path, const char* what) {
  check(file.tensors.count(name), what, " ", path, ": no tensor '", name, "'");
  require_floating_point(file, name, path);
  const Tensor& t = file.tensors.at(name);
  const Tensor c = t.contiguous();
  for (int64_t k = 0; k < c.numel(); ++k)
    check(std::isfinite(c.data()[k]), what, " ", path, ": tensor '", name, "' holds ", c.data()[k], " at element ", k,
          "; a file with non-finite values is refused");
  return t;
}

// Refuses tensors a file of this kind does not hold, listing what it should hold.
void only_tensors(const SafetensorsFile& file, const std::vector<std::string>& names, const std::string& path,
                  const char* what) {
  for (const auto& [name, tensor] : file.tensors)
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      std::string expected;
      for (const std::string& n : names) expected += cat(expected.empty() ? "" : ", ", n);
      throw Error(cat(what, " ", path, ": unexpected tensor '", name, "'; ", what, "s hold ", expected));
    }
}

}  // namespace

std::string StitchCell::key() const { return cat("front", front_block, "_end", end_block, "_", objective, "_", protocol); }

Json cell_to_json(const StitchCell& c) {
  Json j = Json::object();
  j["front_block"] = int64_t(c.front_block);
  j["front_block_name"] = c.front_name;
  j["end_block"] = int64_t(c.end_block);
  j["end_block_name"] = c.end_name;
  j["objective"] = c.objective;
  j["protocol"] = c.protocol;
  j["train_images"] = c.train_images;
  j["steps"] = c.steps;
  j["final_loss"] = number_or_null(c.final_loss);
  j["stitched_accuracy"] = c.stitched_accuracy;
  j["end_accuracy"] = c.end_accuracy;
  j["relative_score"] = number_or_null(c.relative_score);
  j["iri_median_distance"] = number_or_null(c.iri_median);
  j["iri_p90_distance"] = number_or_null(c.iri_p90);
  j["iri_share_below_0.05"] = number_or_null(c.iri_share_below);
  j["iri_poor"] = c.has_iris() ? Json(c.iri_poor) : Json();
  j["end_agrees_on_iris"] = number_or_null(c.end_agrees_on_iris);
  j["end_agrees_with_starts_on_iris"] = number_or_null(c.end_agrees_with_starts_on_iris);
  j["raua"] = number_or_null(c.raua);
  Json tests = Json::array();
  for (const TestSetScore& t : c.test_sets) {
    Json one = Json::object();
    one["data"] = t.data;
    one["stitched_accuracy"] = t.stitched_accuracy;
    one["end_accuracy"] = t.end_accuracy;
    tests.push_back(one);
  }
  j["test_sets"] = tests;
  Json made = Json::object();
  for (const auto& [key, value] : c.made) made[key] = value;
  j["made"] = made;
  return j;
}

StitchCell cell_from_json(const Json& j, const std::string& path) {
  const Fields f(j, path);
  StitchCell c;
  c.front_block = size_t(f.count("front_block"));
  c.end_block = size_t(f.count("end_block"));
  c.front_name = f.text("front_block_name");
  c.end_name = f.text("end_block_name");
  c.objective = f.text("objective");
  c.protocol = f.text("protocol");
  c.train_images = f.count("train_images");
  c.steps = f.count("steps");
  c.final_loss = f.optional_number("final_loss");
  c.stitched_accuracy = f.share("stitched_accuracy");
  c.end_accuracy = f.share("end_accuracy");
  c.relative_score = f.optional_number("relative_score");
  c.iri_median = f.optional_number("iri_median_distance");
  c.iri_p90 = f.optional_number("iri_p90_distance");
  c.iri_share_below = f.optional_number("iri_share_below_0.05");
  c.iri_poor = f.flag("iri_poor");
  c.end_agrees_on_iris = f.optional_number("end_agrees_on_iris");
  c.end_agrees_with_starts_on_iris = f.optional_number("end_agrees_with_starts_on_iris");
  c.raua = f.optional_number("raua");
  const Json& tests = f.get("test_sets");
  check(tests.is_array(), path, ": 'test_sets' is ", described(tests), ", expected an array");
  for (const Json& t : tests.as_array()) {
    const Fields one(t, path, "an entry of 'test_sets'");
    c.test_sets.push_back({one.text("data"), one.share("stitched_accuracy"), one.share("end_accuracy")});
  }
  const Json& made = f.get("made");
  check(made.is_object(), path, ": 'made' is ", described(made), ", expected an object");
  for (const auto& [key, value] : made.as_object()) {
    check(value.is_string(), path, ": 'made' entry '", key, "' is ", described(value), ", expected a string");
    c.made[key] = value.as_string();
  }
  return c;
}

StitchCell read_cell_text(const std::string& text, const std::string& path) {
  Json json;
  try {
    json = parse_json(text);
  } catch (const Error& e) {
    throw Error(cat(path, ": not a cell file: ", e.what()));
  }
  return cell_from_json(json, path);
}

void write_iri_file(const std::string& path, const IriFile& file, const std::map<std::string, std::string>& extra) {
  const int64_t N = file.inputs.size(0);
  check(int64_t(file.start_index.size()) == N && int64_t(file.distance.size()) == N, "IRI file ", path, ": ", N,
        " IRIs, ", file.start_index.size(), " start indices and ", file.distance.size(), " distances");
  std::vector<float> distance(file.distance.begin(), file.distance.end()), index(file.start_index.begin(), file.start_index.end());
  std::map<std::string, std::string> metadata = extra;
  add_provenance(metadata, file.made);
  write_safetensors(path,
                    {{"inputs", file.inputs},
                     {"starts", file.starts},
                     {"start_index", Tensor::from_vector({N}, index)},
                     {"distance", Tensor::from_vector({N}, distance)}},
                    metadata);
}

IriFile read_iri_file(const std::string& path) {
  const char* what = "IRI file";
  const SafetensorsFile f = read_safetensors(path);
  only_tensors(f, {"inputs", "starts", "start_index", "distance"}, path, what);
  IriFile out;
  out.inputs = finite_tensor(f, "inputs", path, what);
  out.starts = finite_tensor(f, "starts", path, what);
  const Tensor index = finite_tensor(f, "start_index", path, what), distance = finite_tensor(f, "distance", path, what);
  const Shape& shape = out.inputs.shape();
  check(shape.size() == 4 && shape[0] > 0, what, " ", path, ": inputs ", shape, ", expected images (N, C, H, W)");
  const int64_t N = shape[0];
  check(out.starts.shape() == shape, what, " ", path, ": starts ", out.starts.shape(), " do not match inputs ", shape);
  check(index.shape() == Shape{N} && distance.shape() == Shape{N}, what, " ", path, ": start_index ", index.shape(),
        " and distance ", distance.shape(), ", expected [", N, "] each");
  for (const Tensor* images : {&out.inputs, &out.starts}) {
    const Tensor c = images->contiguous();
    for (int64_t k = 0; k < c.numel(); ++k)
      check(c.data()[k] >= 0 && c.data()[k] <= 1, what, " ", path, ": a pixel is ", c.data()[k],
            ", outside the image range [0, 1]");
  }
  const Tensor ic = index.contiguous(), dc = distance.contiguous();
  for (int64_t n = 0; n < N; ++n) {
    const float i = ic.data()[n], d = dc.data()[n];
    check(i == std::trunc(i) && i >= -1 && i < float(N) && i != float(n), what, " ", path, ": start_index[", n, "] is ",
          i, ", expected another image's index in [0, ", N, ") or -1 (noise)");
    check(d >= 0, what, " ", path, ": distance[", n, "] is ", d, ", expected a relative distance at least 0");
    out.start_index.push_back(int64_t(i));
    out.distance.push_back(d);
  }
  out.made = provenance_from_metadata(f.metadata);
  return out;
}

namespace {

// The weight, bias and record of a stitch file already read.
StitchFile parameters_of(const SafetensorsFile& f, const std::string& path) {
  const char* what = "stitch file";
  only_tensors(f, {"weight", "bias"}, path, what);
  StitchFile s;
  s.path = path;
  s.weight = finite_tensor(f, "weight", path, what);
  s.bias = finite_tensor(f, "bias", path, what);
  s.made = provenance_from_metadata(f.metadata);
  return s;
}

size_t block_entry(const SafetensorsFile& f, const std::string& path, const std::string& key) {
  const auto it = f.metadata.find(key);
  check(it != f.metadata.end(), "stitch file ", path, ": no '", key, "' in its metadata; it was not written by adjoint stitch");
  try {
    size_t used = 0;
    const unsigned long long block = std::stoull(it->second, &used);
    if (used == it->second.size() && it->second[0] != '-') return size_t(block);
  } catch (const std::exception&) {
  }
  throw Error(cat("stitch file ", path, ": metadata '", key, "' is '", it->second, "', not a block index"));
}

}  // namespace

StitchFile read_stitch_parameters(const std::string& path) { return parameters_of(read_safetensors(path), path); }

StitchFile read_stitch_file(const std::string& path) {
  const SafetensorsFile f = read_safetensors(path);
  StitchFile s = parameters_of(f, path);
  for (const char* key : {"front", "end"})
    check(f.metadata.count(key) && !f.metadata.at(key).empty(), "stitch file ", path, ": no '", key,
          "' in its metadata; it was not written by adjoint stitch");
  s.front = f.metadata.at("front");
  s.end = f.metadata.at("end");
  s.front_block = block_entry(f, path, "front_block");
  s.end_block = block_entry(f, path, "end_block");
  if (s.made.count("front.checkpoint")) s.front_hash = s.made.at("front.checkpoint");
  if (s.made.count("end.checkpoint")) s.end_hash = s.made.at("end.checkpoint");
  return s;
}

}  // namespace adjoint
