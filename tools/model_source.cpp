#include "tools/model_source.h"

#include <cmath>

#include <algorithm>
#include <cmath>

#include "analysis/stitching/stitched_model.h"
#include "engine/data/image_folder.h"
#include "engine/data/loader.h"
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "models/checkpoint.h"
#include "models/weights_file.h"

namespace adjoint {

const std::vector<cli::OptionSpec>& model_options() {
  static const std::vector<cli::OptionSpec> options = {
      {"model", "NAME", "resnet18|34|50, vgg11|13|16|19[_bn], vit_tiny|small|base|custom, vit_b_16|b_32|l_16, bilinear_mlp, "
       "bilinear_lm",
       ""},
      {"width", "X", "channel multiplier (ResNet, VGG)", "1"},
      {"imagenet-stem", "", "ResNet: 7x7 stride-2 stem + max-pool; VGG: ImageNet classifier", ""},
      {"patch", "N", "ViT patch size", "4"},
      {"pool", "KIND", "ViT head: token (class token) or avg (mean of patch tokens, timm's global_pool='avg')",
       "token"},
      {"dim", "N", "ViT / bilinear LM width, bilinear MLP embedding width (0: the model's default / none)", "0"},
      {"depth", "N", "ViT / bilinear LM blocks; bilinear MLP residual blocks (0: the model's default)", "0"},
      {"heads", "N", "attention heads (0: the model's default)", "0"},
      {"hidden", "N", "bilinear MLP hidden width", "256"},
      {"attention", "KIND", "bilinear LM attention: softmax or bilinear", "softmax"},
      {"mlp-ratio", "N", "ViT / bilinear LM MLP hidden width as a multiple of the width", "4"},
      {"residual-scale", "X", "bilinear LM and deep bilinear MLP: x + X·block(x)", "1"},
  };
  return options;
}

std::vector<cli::OptionSpec> with_model_options(std::vector<cli::OptionSpec> own) {
  own.insert(own.begin(), model_options().begin(), model_options().end());
  return own;
}

std::vector<cli::OptionSpec> with_model_source_options(std::vector<cli::OptionSpec> own) {
  static const std::vector<cli::OptionSpec> source = {
      {"checkpoint", "FILE", "a checkpoint written by adjoint train", ""},
      {"stitch", "FILE", "a stitch written by adjoint stitch: its front and end checkpoints (relative paths: to the "
                         "stitch file's folder; their content must be the checkpoints it was trained with) joined by it", ""},
      {"weights", "FILE", "a state dict for --model: safetensors, or a torch.save file (read without running it)", ""},
      {"weights-key", "KEY", "--weights: the entry of a saved dict that holds the state dict (e.g. model)", ""},
      {"classes", "N", "classes of --model", "1000"},
      {"in-channels", "N", "input channels of --model", "3"},
      {"image-size", "N", "input size of --model", "224"},
      {"mean", "LIST", "per-channel normalisation mean for images", ""},
      {"std", "LIST", "per-channel normalisation std for images", ""},
  };
  own.insert(own.begin(), source.begin(), source.end());
  return with_model_options(std::move(own));
}

ModelConfig model_config(const cli::Args& a) {
  ModelConfig c;
  c.arch = a.text("model");
  c.width = a.number("width");
  c.small_stem = !a.flag("imagenet-stem");
  c.patch = a.integer("patch");
  c.pool = a.text("pool");
  c.dim = a.integer("dim");
  c.depth = a.integer("depth");
  c.heads = a.integer("heads");
  c.hidden = a.integer("hidden");
  c.attention = a.text("attention");
  c.mlp_ratio = a.integer("mlp-ratio");
  c.residual_scale = a.number("residual-scale");
  if (c.mlp_ratio < 1) throw UsageError(cat("--mlp-ratio must be at least 1, got ", c.mlp_ratio));
  if (!std::isfinite(c.residual_scale)) throw UsageError(cat("--residual-scale must be a finite number, got ", c.residual_scale));
  return c;
}

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

namespace {
// The first value of m.mean that is not finite or of m.std that is not positive and
// finite, described with the names given ("--std value 0 is not a positive number"); ""
// when all are fine.
std::string normalisation_problem(const LoadedModel& m, const char* mean_name, const char* std_name) {
  for (float v : m.mean)
    if (!std::isfinite(v)) return cat(mean_name, " value ", v, " is not a finite number");
  for (float v : m.std)
    if (!(std::isfinite(v) && v > 0))
      return cat(std_name, " value ", v, " is not a positive number (images are divided by it)");
  return "";
}
}  // namespace

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

LoadedModel load_stitched_model(const std::string& path) {
  const StitchFile file = read_stitch_file(path);
  // Each model from its path (relative ones: to the stitch file's folder), and only when its
  // content is the checkpoint's the stitch was trained between.
  const auto load = [&](const std::string& checkpoint, const std::string& hash, const char* role) {
    const std::string resolved = stitch_checkpoint_path(file, checkpoint);
    LoadedModel m;
    try {
      m = load_checkpoint_model(resolved);
    } catch (const Error& e) {
      throw Error(cat("stitch file ", path, ": its ", role, " model: ", e.what()));
    }
    check(!hash.empty(), "stitch file ", path, " records no content hash of its ", role, " model ", resolved,
          ", so it cannot tell that model from another; make it again with adjoint stitch --overwrite");
    const std::string found = file_hash(resolved);
    check(found == hash, "stitch file ", path, ": its ", role, " model ", resolved, " is not the checkpoint it was trained "
          "with (content hash ", found, ", the stitch records ", hash, ")");
    return std::make_pair(resolved, m);
  };
  const auto [front_path, front] = load(file.front, file.front_hash, "front");
  const auto [end_path, end] = load(file.end, file.end_hash, "end");
  const ModelConfig& c = front.model->config();
  const StitchPair pair({front_path, front.model, front.mean, front.std}, file.front_block,
                        {end_path, end.model, end.mean, end.std}, file.end_block,
                        {c.in_channels, c.image_size, c.image_size});
  LoadedModel m;
  m.model = stitched_model(pair, file);
  m.mean = front.mean;  // the stitched model's inputs are the front model's
  m.std = front.std;
  m.data_spec = front.data_spec;
  m.origin = cat("stitch ", path, ": ", pair.shapes().where);
  return m;
}

LoadedModel load_model(const cli::Args& a) {
  LoadedModel m;
  if (a.has("stitch")) {
    if (a.has("checkpoint") || a.has("weights"))
      throw UsageError("give either --stitch or --checkpoint or --model with --weights, one of them");
    m = load_stitched_model(a.text("stitch"));
  } else if (a.has("checkpoint")) {
    if (a.has("weights")) throw UsageError("give either --checkpoint or --model with --weights, not both");
    m = load_checkpoint_model(a.text("checkpoint"));
  } else {
    if (!a.has("model") || !a.has("weights")) throw UsageError("give --checkpoint FILE, or --model NAME with --weights FILE");
    ModelConfig c = model_config(a);
    c.num_classes = a.integer("classes");
    c.in_channels = a.integer("in-channels");
    c.image_size = a.integer("image-size");
    Generator gen(0);
    m.model = make_model(c, gen);
    m.origin = "weights " + a.text("weights");
    load_weights_file(*m.model, a.text("weights"), a.has("weights-key") ? a.text("weights-key") : "");
  }
  if (a.has("mean")) m.mean = parse_floats(a.text("mean"), "mean");
  if (a.has("std")) m.std = parse_floats(a.text("std"), "std");
  const std::string problem = normalisation_problem(m, "--mean", "--std");
  if (!problem.empty()) throw UsageError(cat("option ", problem));
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
  for (size_t i = 0; i < files.size(); ++i) load_image(files[i], C, S, S, x.data() + int64_t(i) * C * S * S);
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

Examples load_examples(const DataSource& data, const std::string& split, int64_t count) {
  if (split != "test" && split != "train") throw UsageError(cat("option --split expects test or train, got '", split, "'"));
  const std::shared_ptr<const Dataset>& set = split == "test" ? data.test : data.train;
  check(set && set->size() > 0, data.spec, ": the ", split, " split is empty");
  const int64_t n = count > 0 ? std::min(count, set->size()) : set->size();
  LoaderOptions o;
  o.batch_size = std::min<int64_t>(n, 256);
  o.shuffle = false;    // the first n examples, in the data set's order
  o.prefetch = false;
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
