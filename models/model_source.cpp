#include "models/model_source.h"

#include <algorithm>
#include <cmath>

#include "engine/data/image_folder.h"
#include "engine/data/imagenet.h"
#include "engine/data/loader.h"
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "models/checkpoint.h"
#include "models/weights_file.h"

namespace adjoint {

std::vector<float> parse_floats(const std::string& text, const char* option) {
  std::vector<float> out;
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t end = text.find(',', start);
    const std::string part = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    try {
      size_t used = 0;
      out.push_back(std::stof(part, &used));
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw UsageError(cat("option --", option, " expects comma-separated numbers, got '", text, "'"));
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

std::string normalisation_problem(const LoadedModel& m, const char* mean_name, const char* std_name) {
  for (float v : m.mean)
    if (!std::isfinite(v)) return cat(mean_name, " value ", v, " is not a finite number");
  for (float v : m.std)
    if (!(std::isfinite(v) && v > 0))
      return cat(std_name, " value ", v, " is not a positive number (images are divided by it)");
  return "";
}

LoadedModel load_checkpoint_model(const std::string& path) {
  LoadedModel m;
  Checkpoint ck = load_checkpoint(path);
  m.model = model_from_checkpoint(ck);
  m.origin = "checkpoint " + ck.path;
  // The checkpoint's statistics: malformed ones are the file's fault, not an option's.
  try {
    if (ck.metadata.count("data.mean")) m.mean = parse_floats(ck.metadata.at("data.mean"), "data.mean");
    if (ck.metadata.count("data.std")) m.std = parse_floats(ck.metadata.at("data.std"), "data.std");
  } catch (const Error& e) {
    throw Error(cat("checkpoint ", ck.path, ": metadata: ", e.what()));
  }
  const std::string problem = normalisation_problem(m, "data.mean", "data.std");
  if (!problem.empty()) throw Error(cat("checkpoint ", ck.path, ": metadata ", problem));
  if (ck.metadata.count("data.spec")) m.data_spec = ck.metadata.at("data.spec");
  m.model->train(false);
  return m;
}

LoadedModel load_weights_model(const ModelConfig& config, const std::string& weights_path,
                               const std::string& weights_key) {
  LoadedModel m;
  // The loader refuses a file that misses any of the model's tensors, so every parameter is
  // overwritten: none is drawn first.
  Generator gen = Generator::without_draws();
  m.model = make_model(config, gen);
  m.origin = "weights " + weights_path;
  load_weights_file(*m.model, weights_path, weights_key);
  m.model->train(false);
  return m;
}

Tensor load_input_tensor(const std::string& path, const std::string& tensor) {
  SafetensorsFile f = read_safetensors(path);
  if (tensor.empty()) check(f.tensors.size() == 1, path, " holds ", f.tensors.size(), " tensors; choose one with --tensor");
  auto it = tensor.empty() ? f.tensors.begin() : f.tensors.find(tensor);
  check(it != f.tensors.end(), path, ": no tensor named '", tensor, "'");
  require_floating_point(f, it->first, path);
  return it->second;
}

void check_model_input(const LoadedModel& m, const Tensor& x, const std::string& source) {
  const ModelConfig& c = m.model->config();
  const bool flat = c.arch == "bilinear_mlp", tokens = c.arch == "bilinear_lm";
  const int64_t features = c.in_features > 0 ? c.in_features : c.in_channels * c.image_size * c.image_size;
  bool fits = x.dim() >= 1 && x.size(0) > 0;
  std::string expected;
  if (tokens) {
    expected = cat("(N, ", c.seq_len, ") token ids");
    fits = fits && x.dim() == 2 && x.size(1) == c.seq_len;
  } else if (flat) {
    expected = cat("N examples of ", features, " values");
    fits = fits && x.numel() / std::max<int64_t>(x.size(0), 1) == features;
  } else {
    expected = cat("(N, ", c.in_channels, ", ", c.image_size, ", ", c.image_size, ") images");
    fits = fits && x.dim() == 4 && x.size(1) == c.in_channels;
    if (c.arch.rfind("vit", 0) == 0) fits = fits && x.size(2) == c.image_size && x.size(3) == c.image_size;
  }
  check(fits, source, ": inputs of shape ", x.shape(), " do not fit the model ", c.arch, " (", m.origin,
        "), which expects ", expected);
}

Tensor load_image_files(const std::vector<std::string>& files, const LoadedModel& m) {
  const ModelConfig& c = m.model->config();
  const int64_t C = c.in_channels, S = c.image_size;
  Tensor x = Tensor::empty({int64_t(files.size()), C, S, S});
  for (size_t i = 0; i < files.size(); ++i) {
    float* out = x.data() + int64_t(i) * C * S * S;
    if (m.preset == nullptr) {
      load_image(files[i], C, S, S, out);
      continue;
    }
    const DecodedImage image = load_image_bytes(files[i], 3);
    preprocess_image(image.pixels.data(), image.height, image.width, *m.preset, out, files[i]);
  }
  if (!m.mean.empty()) {
    float* p = x.data();
    for (int64_t n = 0; n < x.size(0); ++n)
      for (int64_t ch = 0; ch < C; ++ch) {
        const float mu = m.mean[size_t(ch) % m.mean.size()], sd = m.std.empty() ? 1.0f : m.std[size_t(ch) % m.std.size()];
        for (int64_t k = 0; k < S * S; ++k) {
          float& v = p[(n * C + ch) * S * S + k];
          v = (v - mu) / sd;
        }
      }
  }
  return x;
}

std::vector<std::string> class_names_for(const LoadedModel& m, const std::string& data_spec) {
  std::vector<std::string> names = class_names_if_known(data_spec);
  if (names.empty() && m.preset != nullptr && m.model->config().num_classes == int64_t(imagenet_class_names().size()))
    names = imagenet_class_names();
  return names;
}

Examples load_examples(const DataSource& data, const std::string& split, int64_t count,
                       std::optional<uint64_t> shuffle_seed) {
  if (split != "test" && split != "train") throw UsageError(cat("option --split expects test or train, got '", split, "'"));
  const std::shared_ptr<const Dataset>& set = split == "test" ? data.test : data.train;
  check(set && set->size() > 0, data.spec, ": the ", split, " split is empty");
  const int64_t n = count > 0 ? std::min(count, set->size()) : set->size();
  LoaderOptions o;
  o.batch_size = std::min<int64_t>(n, 256);
  o.shuffle = shuffle_seed.has_value();  // else the first n examples, in the data set's order
  o.seed = shuffle_seed.value_or(0);
  o.prefetch = false;  // batches are built here, each decoded in parallel
  o.transforms = data.eval_transforms();
  Loader loader(set, o);
  Shape shape = loader.example_shape();
  shape.insert(shape.begin(), n);
  Examples out{Tensor::empty(shape), {}};
  const int64_t per_example = out.inputs.numel() / n;
  for (int64_t b = 0; int64_t(out.labels.size()) < n; ++b) {
    Batch batch = loader.batch(0, b);
    const int64_t take = std::min(batch.size(), n - int64_t(out.labels.size()));
    const Tensor inputs = batch.inputs.contiguous();
    std::copy(inputs.data(), inputs.data() + take * per_example,
              out.inputs.data() + int64_t(out.labels.size()) * per_example);
    const int64_t per_label = int64_t(batch.labels.size()) / batch.size();
    for (int64_t i = 0; i < take; ++i) out.labels.push_back(batch.labels[size_t(i * per_label)]);
  }
  return out;
}

}  // namespace adjoint
