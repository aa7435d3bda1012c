#include "models/paper_lm.h"

#include <cmath>

#include "engine/error.h"

namespace adjoint {

namespace {

const Tensor& tensor(const std::map<std::string, Tensor>& state, const std::string& name, const std::vector<int64_t>& shape,
                     const std::string& source) {
  auto it = state.find(name);
  check(it != state.end(), source, ": no tensor '", name, "' (not a checkpoint of the paper's bilinear-attention LMs)");
  check(it->second.shape() == shape, source, ": tensor '", name, "' has shape ", it->second.shape(), ", expected ", shape);
  return it->second;
}

}  // namespace

PolynomialView paper_lm_view(const std::map<std::string, Tensor>& state, const PaperLmShape& shape, int64_t positions,
                             const std::string& source) {
  auto embed_it = state.find("embed.weight");
  check(embed_it != state.end() && embed_it->second.dim() == 2, source,
        ": no 2-D tensor 'embed.weight' (not a checkpoint of the paper's bilinear-attention LMs)");
  const int64_t vocab = embed_it->second.size(0), d = embed_it->second.size(1);
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
  for (int64_t i = 0; i < layers; ++i) {
    const std::string p = cat("layers.", i, ".");
    std::vector<float> qkv, bias;
    for (const char* part : {"q1", "k1", "q2", "k2", "v"}) {
      const std::vector<float> w = tensor(state, p + part + ".weight", {d, d}, source).contiguous().to_vector();
      qkv.insert(qkv.end(), w.begin(), w.end());
      if (std::string(part) == "v") continue;
      const std::vector<float> b = tensor(state, p + part + ".bias", {d}, source).contiguous().to_vector();
      bias.insert(bias.end(), b.begin(), b.end());
    }
    PolynomialStep a;
    a.kind = PolynomialStep::Kind::Attention, a.name = p + "attention";
    a.qkv = Tensor::from_vector({5 * d, d}, qkv);
    a.qk_bias = Tensor::from_vector({4 * d}, bias);
    a.proj = tensor(state, p + "o.weight", {d, d}, source);
    a.heads = shape.heads, a.rotary = true, a.residual = true, a.scale = shape.attention_scale;
    v.steps.push_back(a);
  }
  PolynomialStep u;
  u.kind = PolynomialStep::Kind::Linear, u.name = "unembed";
  std::vector<float> w = tensor(state, "unembed.weight", {vocab, d}, source).contiguous().to_vector();
  if (auto it = state.find("final_norm.running_mean_energy"); it != state.end()) {
    check(it->second.numel() == 1, source, ": tensor 'final_norm.running_mean_energy' holds ", it->second.numel(),
          " values, expected one");
    const double energy = double(it->second.contiguous().to_vector()[0]);
    check(std::isfinite(energy) && energy + 1e-6 > 0, source, ": final_norm.running_mean_energy is ", energy);
    const double factor = 1.0 / std::sqrt(energy + 1e-6);
    for (float& x : w) x = float(double(x) * factor);
  }
  u.weight = Tensor::from_vector({vocab, d}, w);
  v.steps.push_back(u);
  return v;
}

}  // namespace adjoint
