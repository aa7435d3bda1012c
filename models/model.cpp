#include "models/model.h"

#include "engine/error.h"

namespace adjoint {

namespace {
// Keys of ModelConfig with their string converters, in one table so that to_map and
// from_map cannot drift apart.
template <class F>
void for_each_field(ModelConfig& c, F f) {
  f("arch", c.arch);
  f("num_classes", c.num_classes);
  f("in_channels", c.in_channels);
  f("image_size", c.image_size);
  f("small_stem", c.small_stem);
  f("width", c.width);
  f("patch", c.patch);
  f("dim", c.dim);
  f("depth", c.depth);
  f("heads", c.heads);
  f("mlp_ratio", c.mlp_ratio);
  f("pool", c.pool);
  f("hidden", c.hidden);
  f("in_features", c.in_features);
  f("vocab", c.vocab);
  f("seq_len", c.seq_len);
  f("attention", c.attention);
  f("residual_scale", c.residual_scale);
  f("layer_norm", c.layer_norm);
}

std::string format(const std::string& v) { return v; }
std::string format(int64_t v) { return std::to_string(v); }
std::string format(bool v) { return v ? "true" : "false"; }
std::string format(double v) { return cat(v); }

void parse(const std::string&, const std::string& s, std::string& v) { v = s; }
void parse(const std::string& key, const std::string& s, int64_t& v) {
  size_t used = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty()) throw UsageError(cat("model config: '", key, "' must be an integer, got '", s, "'"));
}
void parse(const std::string& key, const std::string& s, bool& v) {
  if (s != "true" && s != "false") throw UsageError(cat("model config: '", key, "' must be true or false, got '", s, "'"));
  v = s == "true";
}
void parse(const std::string& key, const std::string& s, double& v) {
  size_t used = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty()) throw UsageError(cat("model config: '", key, "' must be a number, got '", s, "'"));
}
}  // namespace

std::map<std::string, std::string> ModelConfig::to_map() const {
  std::map<std::string, std::string> out;
  ModelConfig copy = *this;
  for_each_field(copy, [&](const char* key, auto& value) { out[key] = format(value); });
  return out;
}

ModelConfig ModelConfig::from_map(const std::map<std::string, std::string>& values) {
  ModelConfig c;
  for_each_field(c, [&](const char* key, auto& value) {
    auto it = values.find(key);
    if (it == values.end()) return;
    parse(key, it->second, value);
  });
  return c;
}

size_t Model::block_index(const std::string& name) const {
  std::string names;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (blocks_[i].name == name) return i;
    names += (i ? ", " : "") + blocks_[i].name;
  }
  throw UsageError(cat("model ", config_.arch, " has no block '", name, "'; blocks: ", names));
}

Tensor Model::run(const Tensor& x, size_t from, size_t to) const {
  check(from <= to && to <= blocks_.size(), "Model::run: block range [", from, ", ", to, ") is outside the ",
        blocks_.size(), " blocks of ", config_.arch);
  Tensor h = x;
  for (size_t i = from; i < to; ++i) {
    if (blocks_[i].with_next && i + 1 < to) h = blocks_[i++].with_next(h);
    else h = blocks_[i].forward(h);
  }
  return h;
}

PolynomialView Model::polynomial_view(int64_t) const {
  throw Error(cat(config_.arch, " is not a polynomial network: its block '", blocks_.empty() ? "" : blocks_[0].name,
                  "' already applies ReLU, GELU, softmax or a normalisation. Tensor similarity compares bilinear_mlp ",
                  "and bilinear_lm (--attention bilinear, no --layer-norm)"));
}

std::vector<Tensor> Model::trace(const Tensor& x, size_t from, size_t to) const {
  check(from <= to && to <= blocks_.size(), "Model::trace: block range [", from, ", ", to, ") is outside the ",
        blocks_.size(), " blocks of ", config_.arch);
  std::vector<Tensor> outputs;
  Tensor h = x;
  for (size_t i = from; i < to; ++i) outputs.push_back(h = blocks_[i].forward(h));
  return outputs;
}

void Model::add_block(std::string name, std::function<Tensor(const Tensor&)> forward) {
  blocks_.push_back({std::move(name), std::move(forward), nullptr});
}

void Model::set_with_next(std::function<Tensor(const Tensor&)> both) {
  check(!blocks_.empty(), "Model::set_with_next: ", config_.arch, " has no block yet");
  blocks_.back().with_next = std::move(both);
}

std::vector<std::string> model_names() {
  return {"resnet18", "resnet34", "resnet50", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn",
          "vgg19", "vgg19_bn", "vit_tiny", "vit_small", "vit_base", "vit_custom", "vit_b_16", "vit_b_32", "vit_l_16",
          "bilinear_mlp", "bilinear_lm", "pvt_v2_b0", "pvt_v2_b1", "pvt_v2_b2", "pvt_v2_b3", "pvt_v2_b4", "pvt_v2_b5"};
}

std::shared_ptr<Model> make_model(const ModelConfig& config, Generator& gen) {
  const std::string& a = config.arch;
  // Sizes every architecture needs; a negative one would otherwise surface as a failed
  // allocation deep inside a layer.
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"num_classes", config.num_classes},
                                   {"in_channels", config.in_channels},
                                   {"image_size", config.image_size}})
    if (value < 1) throw UsageError(cat("model config: '", key, "' must be positive, got ", value));
  if (a.rfind("resnet", 0) == 0) return make_resnet(config, gen);
  if (a.rfind("vgg", 0) == 0) return make_vgg(config, gen);
  if (a.rfind("vit", 0) == 0) return make_vit(config, gen);
  if (a.rfind("bilinear", 0) == 0) return make_bilinear(config, gen);
  if (a.rfind("pvt_v2", 0) == 0) return make_pvt(config, gen);
  std::string names;
  for (const auto& n : model_names()) names += " " + n;
  throw UsageError(cat("unknown model '", a, "'; known:", names));
}

}  // namespace adjoint
