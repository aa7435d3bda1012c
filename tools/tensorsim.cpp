// `adjoint tensorsim`: tensor similarity of bilinear checkpoints (analysis/similarity/model_similarity.h)
// with its baselines, for one pair or for every checkpoint a training run kept.
//
//   adjoint tensorsim A.ckpt B.ckpt [--metric identity|gaussian] [--slices] [--diff A0.ckpt] [--out DIR]
//   adjoint tensorsim --run DIR [--out DIR]
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "analysis/similarity/model_similarity.h"
#include "analysis/common/plot.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "models/checkpoint.h"
#include "models/training.h"
#include "tools/cli.h"
#include "tools/html_report.h"
#include "tools/model_source.h"
#include "tools/progress.h"

namespace adjoint {
namespace {

namespace fs = std::filesystem;

// A checkpoint's model in eval mode (loading refuses non-finite weights, naming the tensor).
struct LoadedCheckpoint {
  std::string path;
  Checkpoint checkpoint;
  std::shared_ptr<Model> model;
};

LoadedCheckpoint load(const std::string& path) {
  LoadedCheckpoint c{path, load_checkpoint(path), nullptr};
  c.model = model_from_checkpoint(c.checkpoint);
  c.model->train(false);
  return c;
}

TensorSimOptions options_from(const cli::Args& a) {
  TensorSimOptions o;
  o.metric = a.text("metric");
  o.bias = !a.flag("no-bias");
  o.positions = a.integer("positions");
  o.input_std = a.number("input-std");
  if (o.positions < 0) throw UsageError(cat("--positions must be 0 or more, got ", o.positions));
  return o;
}

// Runs `fn`, prefixing any error with the files it concerns, keeping its kind.
template <class Fn>
auto naming(const std::string& files, Fn fn) {
  try {
    return fn();
  } catch (const UsageError& e) {
    throw UsageError(cat(files, ": ", e.what()));
  } catch (const Error& e) {
    throw Error(cat(files, ": ", e.what()));
  }
}

// The first --count test examples of the data set the first checkpoint names (or --data).
Examples baseline_inputs(const cli::Args& a, const Checkpoint& first) {
  const std::string spec = a.has("data") ? a.text("data")
                           : first.metadata.count("data.spec") ? first.metadata.at("data.spec")
                                                                : "";
  if (spec.empty()) throw UsageError("tensorsim: the checkpoint names no data set for the baselines; give --data");
  return load_examples(open_data(spec, DataSplits::TestOnly), "test", a.integer("count"));
}

std::string fixed(double v, int digits = 4) {
  if (!std::isfinite(v)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

Json number(double v) { return std::isfinite(v) ? Json(v) : Json(); }

int run_pair(const cli::Args& a) {
  const auto& files = a.positionals();
  if (files.size() != 2) throw UsageError("tensorsim: give two checkpoints (A B), or --run DIR");
  const TensorSimOptions o = options_from(a);
  const LoadedCheckpoint ca = load(files[0]), cb = load(files[1]);
  std::optional<LoadedCheckpoint> reference;
  if (a.has("diff")) reference = load(a.text("diff"));
  const std::string pair = cat(files[0], " vs ", files[1]);
  const TensorSimScore score = naming(pair, [&] {
    return tensor_similarity(*ca.model, *cb.model, o, reference ? reference->model.get() : nullptr);
  });
  const std::string compared = reference ? cat("(A - ", a.text("diff"), ") against B") : "A and B";
  std::printf("tensor similarity of %s: %s (%s)\n", compared.c_str(), fixed(score.total).c_str(), score.method.c_str());
  Json json(Json::Object{{"a", files[0]}, {"b", files[1]}, {"method", score.method}, {"tensor_similarity", number(score.total)}});
  if (reference) json["diff_reference"] = a.text("diff");
  std::string md = cat("# Tensor similarity\n\nA = `", files[0], "`, B = `", files[1], "`",
                       reference ? cat(", compared as (A − `", a.text("diff"), "`) against B") : "", "\n\n| measure | value |\n|---|---:|\n",
                       "| tensor similarity (", score.method, ") | ", fixed(score.total), " |\n");
  std::string csv = cat("measure,value\ntensor_similarity,", score.total, "\n");

  if (a.flag("slices")) {
    Json slices = Json::array();
    std::printf("per-output slices:");
    for (size_t k = 0; k < score.slices.size(); ++k) {
      std::printf(" %zu:%s", k, fixed(score.slices[k], 3).c_str());
      slices.push_back(number(score.slices[k]));
      csv += cat("slice_", k, ",", score.slices[k], "\n");
      md += cat("| slice ", k, " | ", fixed(score.slices[k]), " |\n");
    }
    std::printf("\n");
    json["slices"] = slices;
  }
  if (!a.flag("no-baselines")) {
    const Examples ex = baseline_inputs(a, ca.checkpoint);
    Json base = Json::object();
    for (const BaselineScore& b : naming(pair, [&] { return baseline_scores(*ca.model, *cb.model, ex.inputs); })) {
      std::printf("  %-20s %s  (%s)\n", b.name.c_str(), fixed(b.value).c_str(), b.summary.c_str());
      base[b.name] = number(b.value);
      csv += cat(b.name, ",", b.value, "\n");
      md += cat("| ", b.name, " | ", fixed(b.value), " |\n");
    }
    json["baselines"] = base;
    json["baseline_examples"] = Json(int64_t(ex.labels.size()));
  }
  if (a.has("out")) {
    const std::string out = a.text("out");
    fs::create_directories(out);
    write_file_atomic(out + "/tensorsim.csv", csv);
    write_file_atomic(out + "/tensorsim.json", to_json(json, 2) + "\n");
    write_file_atomic(out + "/tensorsim.md", md);
    std::printf("wrote %s/tensorsim.{csv,json,md}\n", out.c_str());
    cli::write_html_report(out, a, cli::folder_report(out, cat("adjoint tensorsim: ", pair, ", ", score.method)));
  }
  return 0;
}

// The kept checkpoints of a run folder (adjoint train --keep-checkpoints), in step order.
std::vector<std::string> run_checkpoints(const std::string& dir) {
  const fs::path folder = fs::path(dir) / "checkpoints";
  check(fs::is_directory(folder), "tensorsim --run ", dir, ": no checkpoints folder (train with --keep-checkpoints)");
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());  // step_%08d names sort by step
  check(files.size() >= 2, "tensorsim --run ", dir, ": ", files.size(), " checkpoint(s) in ", folder.string(),
        "; at least two are needed");
  return files;
}

int run_run(const cli::Args& a) {
  const std::string dir = a.text("run");
  const std::string out = a.has("out") ? a.text("out") : dir + "/tensorsim";
  const TensorSimOptions o = options_from(a);
  const std::vector<std::string> files = run_checkpoints(dir);
  const size_t K = files.size();
  std::vector<LoadedCheckpoint> cks;
  for (const std::string& f : files) cks.push_back(load(f));
  const Examples ex = baseline_inputs(a, cks.front().checkpoint);
  const DataSource data = open_data(a.has("data") ? a.text("data") : cks.front().checkpoint.metadata.at("data.spec"),
                                    DataSplits::TestOnly);

  cli::ProgressBar bar("tensorsim", int64_t(K * (K + 1) / 2 + K), "comparison");
  int64_t done = 0;
  std::vector<double> steps, loss, accuracy, to_last, cka_logits;
  std::vector<std::string> labels;
  std::string method;
  MomentCache traces;  // each checkpoint's own moments, computed once
  for (const LoadedCheckpoint& c : cks) {
    steps.push_back(double(c.checkpoint.step));
    labels.push_back(std::to_string(c.checkpoint.step));
    const Evaluation e = evaluate(*c.model, data.test, data.eval_transforms(), 256, a.integer("count"));
    loss.push_back(e.loss), accuracy.push_back(e.accuracy);
    const TensorSimScore score =
        naming(c.path, [&] { return tensor_similarity(*c.model, *cks.back().model, o, nullptr, &traces); });
    to_last.push_back(score.total);
    method = score.method;
    cka_logits.push_back(baseline_scores(*c.model, *cks.back().model, ex.inputs, {"cka_logits"}).front().value);
    bar.update(++done);
  }
  std::vector<double> pairwise(K * K, 1.0);
  for (size_t i = 0; i < K; ++i)
    for (size_t j = i + 1; j < K; ++j) {
      pairwise[i * K + j] = pairwise[j * K + i] =
          naming(cat(files[i], " vs ", files[j]),
                 [&] { return tensor_similarity(*cks[i].model, *cks[j].model, o, nullptr, &traces).total; });
      bar.update(++done);
    }
  bar.finish();

  fs::create_directories(out);
  std::string csv = "step,test_loss,test_accuracy,tensor_similarity_to_last,cka_logits_to_last\n";
  std::string md = cat("# Tensor similarity over a run\n\nRun `", dir, "`, ", K, " checkpoints, compared with the last (step ",
                       labels.back(), "); accuracy on ", a.integer("count") ? cat("the first ", a.integer("count")) : std::string("all"),
                       " test examples.\n\n| step | test loss | test accuracy | tensor similarity to last | CKA of logits to last |\n"
                       "|---:|---:|---:|---:|---:|\n");
  Json rows = Json::array(), matrix = Json::array();
  for (size_t i = 0; i < K; ++i) {
    csv += cat(labels[i], ",", loss[i], ",", accuracy[i], ",", to_last[i], ",", cka_logits[i], "\n");
    md += cat("| ", labels[i], " | ", fixed(loss[i]), " | ", fixed(accuracy[i]), " | ", fixed(to_last[i]), " | ",
              fixed(cka_logits[i]), " |\n");
    rows.push_back(Json(Json::Object{{"step", steps[i]}, {"test_loss", number(loss[i])}, {"test_accuracy", number(accuracy[i])},
                                     {"tensor_similarity_to_last", number(to_last[i])},
                                     {"cka_logits_to_last", number(cka_logits[i])}}));
    Json row = Json::array();
    for (size_t j = 0; j < K; ++j) row.push_back(number(pairwise[i * K + j]));
    matrix.push_back(row);
  }
  std::string pair_csv = "step";
  for (const std::string& l : labels) pair_csv += "," + l;
  pair_csv += "\n";
  for (size_t i = 0; i < K; ++i) {
    pair_csv += labels[i];
    for (size_t j = 0; j < K; ++j) pair_csv += cat(",", pairwise[i * K + j]);
    pair_csv += "\n";
  }
  write_file_atomic(out + "/run_similarity.csv", csv);
  write_file_atomic(out + "/pairwise_similarity.csv", pair_csv);
  write_file_atomic(out + "/run_similarity.md", md);
  write_file_atomic(out + "/run_similarity.json",
                    to_json(Json(Json::Object{{"run", dir}, {"method", method},
                                              {"checkpoints", rows}, {"pairwise", matrix}}), 2) + "\n");
  const bool log_x = steps.front() > 0 && steps.back() / steps.front() > 50;
  Image over_steps = line_chart("similarity to the last checkpoint", "step", steps,
                                {{"tensor similarity", to_last, Rgb{200, 30, 30}},
                                 {"CKA of logits", cka_logits, Rgb{30, 90, 200}},
                                 {"test accuracy", accuracy, Rgb{40, 150, 60}}},
                                log_x, NAN, 1.0);
  write_png(out + "/similarity_over_steps.png", over_steps);
  const int64_t cell = std::max<int64_t>(4, 480 / int64_t(K));
  write_png(out + "/pairwise_similarity.png",
            matrix_heatmap("tensor similarity between checkpoints (steps)", pairwise, int64_t(K), int64_t(K), labels, 1.0, cell));
  std::printf("%zu checkpoints; similarity of the first to the last %s; wrote %s/run_similarity.{csv,json,md}, "
              "pairwise_similarity.{csv,png}, similarity_over_steps.png\n",
              K, fixed(to_last.front()).c_str(), out.c_str());
  cli::write_html_report(out, a, cli::folder_report(out, cat("adjoint tensorsim --run ", dir, ": ", method)));
  return 0;
}

int run_tensorsim(const cli::Args& a) { return a.has("run") ? run_run(a) : run_pair(a); }

const cli::Registration tensorsim_command({
    .name = "tensorsim",
    .summary = "tensor similarity of bilinear checkpoints, with CKA and behavioural baselines",
    .description =
        "Compares two checkpoints of bilinear models through their weights alone (METHODS.md §3): the\n"
        "symmetrised tensors' inner product in closed form for one bilinear layer (--metric identity or\n"
        "gaussian), the second-moment recursion for deeper networks. Beside it, on --count test examples:\n"
        "linear CKA (biased, debiased) of hidden features and logits, prediction agreement, output\n"
        "correlation and the cosine of the weights. --run DIR compares every checkpoint a run kept\n"
        "(adjoint train --keep-checkpoints) with the last and with each other, and plots both.",
    .arguments = "[A.ckpt B.ckpt]",
    .options = {{"metric", "NAME", "identity or gaussian (inputs x ~ N(0, I))", "gaussian"},
                {"no-bias", "", "compare the parts quadratic in x only (drop the constant coordinate)", ""},
                {"slices", "", "also the similarity per output (class)", ""},
                {"diff", "A0.ckpt", "compare (A − A0) against B: what changed since A0", ""},
                {"positions", "T", "sequence models: positions compared (0: the whole context)", "0"},
                {"input-std", "X",
                 "gaussian metric: inputs x ~ N(0, X²·I); token models' one-hot inputs have the norm of "
                 "X = 1/sqrt(vocab)",
                 "1"},
                {"run", "DIR", "compare every kept checkpoint of a training run", ""},
                {"data", "SPEC", "data set for the baselines and accuracy (default: the checkpoint's)", ""},
                {"count", "N", "test examples for the baselines and accuracy (0: all)", "2000"},
                {"no-baselines", "", "skip the data-based baselines", ""},
                {"out", "DIR", "write the results as CSV, JSON and Markdown (and PNG with --run)", ""}},
    .run = run_tensorsim,
});

}  // namespace
}  // namespace adjoint
