#include "models/paper_lm.h"

#include <cmath>
#include <filesystem>
#include <algorithm>
#include <set>

#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/json.h"

namespace adjoint {

namespace {

const Tensor& tensor(const std::map<std::string, Tensor>& state, const std::string& name, const std::vector<int64_t>& shape,
                     const std::string& source) {
  auto it = state.find(name);
  check(it != state.end(), source, ": no tensor '", name, "' (not a checkpoint of the paper's bilinear-attention LMs)");
  check(it->second.shape() == shape, source, ": tensor '", name, "' has shape ", it->second.shape(), ", expected ", shape);
  return it->second;
}

constexpr const char* kFinalNorm = "final_norm.";

// The state with the final normalisation folded into unembed.weight and final_norm.* dropped.
// As the paper's loader does, a checkpoint without the buffer takes its initial value, 1.
std::map<std::string, Tensor> absorb_final_norm(const std::map<std::string, Tensor>& state, const std::string& source) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : state)
    if (name.rfind(kFinalNorm, 0) != 0) out.emplace(name, t);
  double energy = 1.0;
  if (auto it = state.find("final_norm.running_mean_energy"); it != state.end()) {
    check(it->second.numel() == 1, source, ": tensor 'final_norm.running_mean_energy' holds ", it->second.numel(),
          " values, expected one");
    energy = double(it->second.contiguous().to_vector()[0]);
    check(std::isfinite(energy) && energy + 1e-6 > 0, source, ": final_norm.running_mean_energy is ", energy);
  }
  auto un = out.find("unembed.weight");
  check(un != out.end(), source, ": no tensor 'unembed.weight' (not a checkpoint of the paper's bilinear-attention LMs)");
  const double factor = 1.0 / std::sqrt(energy + 1e-6);
  std::vector<float> w = un->second.contiguous().to_vector();
  for (float& x : w) x = float(double(x) * factor);
  un->second = Tensor::from_vector(un->second.shape(), w);
  return out;
}

// The view of a state whose final norm is already folded into the unembedding.
PolynomialView view_of_absorbed(const std::map<std::string, Tensor>& state, const PaperLmShape& shape, int64_t positions,
                                const std::string& source) {
  auto embed_it = state.find("embed.weight");
  check(embed_it != state.end() && embed_it->second.dim() == 2, source,
        ": no 2-D tensor 'embed.weight' (not a checkpoint of the paper's bilinear-attention LMs)");
  const int64_t vocab = embed_it->second.size(0), d = embed_it->second.size(1);
  check(shape.vocab == 0 || shape.vocab == vocab, source, ": embed.weight has ", vocab, " tokens, the config's vocab_size is ",
        shape.vocab);
  check(shape.dim == 0 || shape.dim == d, source, ": embed.weight has width ", d, ", the config's d_model is ", shape.dim);
  check(shape.heads > 0 && d % shape.heads == 0 && (d / shape.heads) % 2 == 0, source, ": ", shape.heads,
        " heads do not split the width ", d, " into heads of an even size (rotary pairs)");
  check(positions >= 1, source, ": a context of ", positions, " positions");
  PolynomialView v{"paper_lm", vocab, positions, {}};
  PolynomialStep e;
  e.kind = PolynomialStep::Kind::Linear, e.name = "embed";
  const std::vector<float> rows = embed_it->second.contiguous().to_vector();  // a row per token
  std::vector<float> columns(rows.size());
  for (int64_t t = 0; t < vocab; ++t)
    for (int64_t c = 0; c < d; ++c) columns[size_t(c * vocab + t)] = rows[size_t(t * d + c)];
  e.weight = Tensor::from_vector({d, vocab}, columns);  // (d, vocab)
  v.steps.push_back(e);
  int64_t layers = 0;
  while (state.count(cat("layers.", layers, ".q1.weight"))) ++layers;
  check(layers > 0, source, ": no attention layers (layers.0.q1.weight)");
  check(shape.layers == 0 || shape.layers == layers, source, ": ", layers, " attention layers, the config's n_layers is ",
        shape.layers);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = cat("layers.", i, ".");
    std::vector<float> qkv, bias;
    for (const char* part : {"q1", "k1", "q2", "k2", "v"}) {
      const std::vector<float> w = tensor(state, p + part + ".weight", {d, d}, source).contiguous().to_vector();
      qkv.insert(qkv.end(), w.begin(), w.end());
      if (std::string(part) == "v" || !shape.qk_bias) continue;
      const std::vector<float> b = tensor(state, p + part + ".bias", {d}, source).contiguous().to_vector();
      bias.insert(bias.end(), b.begin(), b.end());
    }
    PolynomialStep a;
    a.kind = PolynomialStep::Kind::Attention, a.name = p + "attention";
    a.qkv = Tensor::from_vector({5 * d, d}, qkv);
    if (shape.qk_bias) a.qk_bias = Tensor::from_vector({4 * d}, bias);
    a.proj = tensor(state, p + "o.weight", {d, d}, source);
    a.heads = shape.heads, a.rotary = true, a.residual = true, a.scale = shape.attention_scale;
    v.steps.push_back(a);
  }
  PolynomialStep u;
  u.kind = PolynomialStep::Kind::Linear, u.name = "unembed";
  u.weight = tensor(state, "unembed.weight", {vocab, d}, source);
  v.steps.push_back(u);
  return v;
}

// The names the layout holds for `layers` layers.
std::set<std::string> layout_names(int64_t layers, bool qk_bias) {
  std::set<std::string> names = {"embed.weight", "unembed.weight"};
  for (int64_t i = 0; i < layers; ++i)
    for (const char* part : {"q1", "k1", "q2", "k2", "v", "o"}) {
      names.insert(cat("layers.", i, ".", part, ".weight"));
      if (qk_bias && std::string(part) != "v" && std::string(part) != "o") names.insert(cat("layers.", i, ".", part, ".bias"));
    }
  return names;
}

// One-hot rows (batch, T·vocab) of token ids (batch, T) stored as floats.
std::vector<double> one_hot(const Tensor& tokens, int64_t vocab) {
  check(tokens.dim() == 2, "paper_lm: expects token ids of shape (batch, length), got ", tokens.shape());
  const std::vector<float> ids = tokens.contiguous().to_vector();
  std::vector<double> x(ids.size() * size_t(vocab), 0.0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = int64_t(ids[i]);
    check(ids[i] == float(id) && id >= 0 && id < vocab, "paper_lm: token ", ids[i], " at position ", i,
          " is not an id in [0, ", vocab, ")");
    x[i * size_t(vocab) + size_t(id)] = 1.0;
  }
  return x;
}

Tensor as_tensor(const std::vector<double>& values, std::vector<int64_t> shape) {
  return Tensor::from_vector(std::move(shape), std::vector<float>(values.begin(), values.end()));
}

class PaperLm : public Model {
public:
  PaperLm(ModelConfig config, std::map<std::string, Tensor> state, PaperLmShape shape, std::string source)
      : Model(std::move(config)), state_(std::move(state)), shape_(shape), source_(std::move(source)) {
    for (const auto& [name, t] : state_) register_parameter(name, t);
    // The residual stream after the attention layers: the view without its unembedding.
    add_block("layers", [this](const Tensor& tokens) {
      const int64_t batch = tokens.size(0), T = tokens.dim() == 2 ? tokens.size(1) : 0;
      PolynomialView v = polynomial_view(std::max<int64_t>(T, 1));
      v.steps.pop_back();
      const std::vector<double> h = evaluate_polynomial(v, one_hot(tokens, v.input_dim), batch);
      return as_tensor(h, {batch, T, this->config().dim});
    });
    add_block("unembed", [this](const Tensor& hidden) {
      check(hidden.dim() == 3 && hidden.size(2) == this->config().dim, "paper_lm: the unembedding reads (batch, T, ",
            this->config().dim, "), got ", hidden.shape());
      const int64_t batch = hidden.size(0), T = hidden.size(1);
      const PolynomialView full = polynomial_view(std::max<int64_t>(T, 1));
      const PolynomialView v{"paper_lm", this->config().dim, T, {full.steps.back()}};
      const std::vector<float> h = hidden.contiguous().to_vector();
      return as_tensor(evaluate_polynomial(v, std::vector<double>(h.begin(), h.end()), batch), {batch, T, this->config().vocab});
    });
  }

  PolynomialView polynomial_view(int64_t positions) const override {
    return view_of_absorbed(state_, shape_, positions == 0 ? kPaperLmPositions : positions, source_);
  }

private:
  std::map<std::string, Tensor> state_;
  PaperLmShape shape_;
  std::string source_;
};

const Json& member(const Json& block, const char* key, const std::string& path) {
  const Json* v = block.find(key);
  check(v != nullptr, path, ": no '", key, "' (the paper's config.json names the model's n_head, d_model, n_layers)");
  return *v;
}

}  // namespace

PolynomialView paper_lm_view(const std::map<std::string, Tensor>& state, const PaperLmShape& shape, int64_t positions,
                             const std::string& source) {
  return view_of_absorbed(absorb_final_norm(state, source), shape, positions, source);
}

PaperLmShape read_paper_lm_config(const std::string& path) {
  PaperLmShape shape;
  try {
    const Json whole = parse_json(read_text_file(path));
    check(whole.is_object(), "the config is ", described(whole), ", not an object");
    const Json* inner = whole.find("model");
    const Json& m = inner ? *inner : whole;
    check(m.is_object(), "'model' is ", described(m), ", not an object");
    shape.heads = member(m, "n_head", path).as_int();
    check(shape.heads > 0, "n_head is ", shape.heads);
    if (const Json* s = m.find("attn_scale")) shape.attention_scale = s->as_number();
    check(std::isfinite(shape.attention_scale), "attn_scale is ", shape.attention_scale);
    if (const Json* b = m.find("use_bias_qk")) shape.qk_bias = b->as_bool();
    if (const Json* t = m.find("attn_type"))
      check(t->as_string() == "bilinear", "attn_type is '", t->as_string(), "'; only the bilinear attention is a polynomial");
    if (const Json* v = m.find("vocab_size")) shape.vocab = v->as_int();
    if (const Json* v = m.find("d_model")) shape.dim = v->as_int();
    if (const Json* v = m.find("n_layers")) shape.layers = v->as_int();
  } catch (const Error& e) {
    const std::string what = e.what();
    throw Error(what.rfind(path, 0) == 0 ? what : cat(path, ": ", what));
  }
  return shape;
}

std::string paper_lm_config_for(const std::string& checkpoint_path) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::absolute(checkpoint_path).parent_path();
  for (const fs::path& candidate : {folder / "config.json", folder.parent_path() / "config.json"})
    if (fs::is_regular_file(candidate)) return candidate.string();
  return "";
}

std::shared_ptr<Model> paper_lm_model(const std::map<std::string, Tensor>& state, const PaperLmShape& shape,
                                      const std::string& source) {
  std::map<std::string, Tensor> absorbed = absorb_final_norm(state, source);
  const PolynomialView v = view_of_absorbed(absorbed, shape, 1, source);
  const int64_t layers = int64_t(v.steps.size()) - 2;
  const std::set<std::string> names = layout_names(layers, shape.qk_bias);
  for (const auto& [name, t] : absorbed)
    check(names.count(name), source, ": unexpected tensor '", name, "' (not in the paper's bilinear-attention LM layout of ",
          layers, " layers", shape.qk_bias ? "" : " without QK biases", ")");
  for (const auto& [name, t] : absorbed) {
    const std::vector<float> values = t.contiguous().to_vector();
    for (float x : values) check(std::isfinite(x), source, ": tensor '", name, "' holds ", x);
  }
  ModelConfig config;
  config.arch = "paper_lm";
  config.vocab = v.input_dim, config.dim = v.steps.front().weight.size(0), config.depth = layers;
  config.heads = shape.heads, config.residual_scale = shape.attention_scale, config.attention = "bilinear";
  config.num_classes = config.vocab, config.seq_len = kPaperLmPositions;
  auto model = std::make_shared<PaperLm>(config, std::move(absorbed), shape, source);
  model->train(false);
  return model;
}

}  // namespace adjoint
