#include <algorithm>
#include <cmath>
#include <set>

#include "engine/error.h"
#include "models/paper_lm.h"

namespace adjoint {

namespace {

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
    return paper_lm_view(state_, shape_, positions == 0 ? kPaperLmPositions : positions, source_);
  }

private:
  std::map<std::string, Tensor> state_;
  PaperLmShape shape_;
  std::string source_;
};

}  // namespace

std::shared_ptr<Model> paper_lm_model(const std::map<std::string, Tensor>& state, const PaperLmShape& shape,
                                      const std::string& source) {
  std::map<std::string, Tensor> absorbed = absorb_final_norm(state, source);
  const PolynomialView v = paper_lm_view(absorbed, shape, 1, source);
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
