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

}  // namespace

std::map<std::string, Tensor> absorb_final_norm(const std::map<std::string, Tensor>& state, const std::string& source) {
  auto energy_it = state.find("final_norm.running_mean_energy");
  if (energy_it == state.end()) return state;
  check(energy_it->second.numel() == 1, source, ": tensor 'final_norm.running_mean_energy' holds ",
        energy_it->second.numel(), " values, expected one");
  const double energy = double(energy_it->second.contiguous().to_vector()[0]);
  check(std::isfinite(energy) && energy + 1e-6 > 0, source, ": final_norm.running_mean_energy is ", energy);
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : state)
    if (name.rfind(kFinalNorm, 0) != 0) out.emplace(name, t);
  auto un = out.find("unembed.weight");
  check(un != out.end(), source, ": no tensor 'unembed.weight' (not a checkpoint of the paper's bilinear-attention LMs)");
  const double factor = 1.0 / std::sqrt(energy + 1e-6);
  std::vector<float> w = un->second.contiguous().to_vector();
  for (float& x : w) x = float(double(x) * factor);
  un->second = Tensor::from_vector(un->second.shape(), w);
  return out;
}

namespace {

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
    a.heads = shape.heads, a.rotary = shape.rotary, a.residual = true, a.scale = shape.attention_scale;
    v.steps.push_back(a);
  }
  PolynomialStep u;
  u.kind = PolynomialStep::Kind::Linear, u.name = "unembed";
  u.weight = tensor(state, "unembed.weight", {vocab, d}, source);
  v.steps.push_back(u);
  return v;
}

const Json& member(const Json& block, const char* key, const std::string& path) {
  const Json* v = block.find(key);
  check(v != nullptr, path, ": no '", key, "' (the paper's config.json names the model's n_head, d_model, n_layers)");
  return *v;
}

}  // namespace

std::map<std::string, Tensor> paper_lm_random_state(const PaperLmShape& shape, Generator& gen, double weight_std,
                                                    double bias_std, const std::map<std::string, Tensor>* from) {
  check(shape.vocab > 0 && shape.dim > 0 && shape.layers > 0, "paper_lm_random_state: vocab, dim and layers must be set, got ",
        shape.vocab, ", ", shape.dim, ", ", shape.layers);
  const int64_t d = shape.dim;
  std::map<std::string, Tensor> state;
  state["embed.weight"] = normal({shape.vocab, d}, 0.0f, float(weight_std), gen);
  for (int64_t i = 0; i < shape.layers; ++i) {
    const std::string p = cat("layers.", i, ".");
    for (const char* part : {"q1", "k1", "q2", "k2"}) {
      state[p + part + ".weight"] = normal({d, d}, 0.0f, float(weight_std), gen);
      if (shape.qk_bias) state[p + part + ".bias"] = normal({d}, 0.0f, float(bias_std), gen);
    }
    state[p + "v.weight"] = normal({d, d}, 0.0f, float(weight_std), gen);
    state[p + "o.weight"] = normal({d, d}, 0.0f, float(weight_std), gen);
  }
  state["unembed.weight"] = normal({shape.vocab, d}, 0.0f, float(weight_std), gen);
  if (from)
    for (auto& [name, w] : state) {
      const auto it = from->find(name);
      check(it != from->end() && it->second.shape() == w.shape(), "paper_lm_random_state: the state to start from has no ", name,
            " of shape ", to_string(w.shape()));
      std::vector<float> v = w.to_vector();
      const std::vector<float> base = it->second.contiguous().to_vector();
      for (size_t i = 0; i < v.size(); ++i) v[i] += base[i];
      w = Tensor::from_vector(w.shape(), v);
    }
  return state;
}

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

}  // namespace adjoint
