// `adjoint bench stitch` (tools/bench_stitch.cpp) and `bench models`: bad options are one line with the right
// exit code, and a tiny run writes the JSON that tools/bench_stitch_torch.py reads. No
// timing is checked: that is the benchmark's job, not a test's.
#include <doctest/doctest.h>

#include <cstdlib>

#include "engine/error.h"
#include "engine/io/json.h"
#include "engine/tensor.h"
#include "models/checkpoint.h"
#include "models/training.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::CommandOutcome;
using adjoint::testing::contains;
using adjoint::testing::read_text;
using adjoint::testing::run_adjoint;

TEST_CASE("bench stitch: bad options exit 2 naming the option, a block out of range exits 1 naming the model") {
  const CommandOutcome model = run_adjoint({"bench", "stitch", "--only", "vit_tiny"});
  CHECK(model.code == 2);
  CHECK(contains(model.err, "--only expects models among vgg11_bn, resnet18; got 'vit_tiny'"));
  const CommandOutcome steps = run_adjoint({"bench", "stitch", "--steps", "0"});
  CHECK(steps.code == 2);
  CHECK(contains(steps.err, "--steps expects a count >= 1, got 0"));
  const CommandOutcome batch = run_adjoint({"bench", "stitch", "--batch", "1"});
  CHECK(batch.code == 2);
  CHECK(contains(batch.err, "--batch expects a count >= 2"));
  const CommandOutcome clock = run_adjoint({"--threads", "2", "bench", "stitch", "--clock", "cpu"});
  CHECK(clock.code == 2);
  CHECK(contains(clock.err, "--clock cpu measures durations only with --threads 1 (2 threads)"));
  // VGG-11-BN has 9 blocks: stitch points 0..7.
  const CommandOutcome block = run_adjoint({"bench", "stitch", "--only", "vgg11_bn", "--block", "8"});
  CHECK(block.code == 1);
  CHECK(contains(block.err, "front block 8 is out of range for vgg11_bn seed 1 (vgg11_bn), which has 9 blocks"));
}

TEST_CASE("bench stitch: a tiny run writes one row per model and loop with the settings the peer reads") {
  adjoint::testing::TempDir dir;
  const std::string out = dir.file("ours.json");
  const CommandOutcome run = run_adjoint({"--threads", "1", "bench", "stitch", "--only", "vgg11_bn", "--batch", "2",
                                          "--steps", "1", "--repeats", "1", "--block", "7", "--out", out});
  REQUIRE_MESSAGE(run.code == 0, run.err);
  const Json doc = parse_json(read_text(out));
  for (const char* key : {"threads", "blas", "clock", "width", "image_size", "batch", "block", "steps", "repeats"})
    CHECK_MESSAGE(doc.find(key) != nullptr, key);
  CHECK(doc.find("batch")->as_int() == 2);
  CHECK(doc.find("block")->as_int() == 7);
  const Json::Array& rows = doc.find("results")->as_array();
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].find("loop")->as_string() == "iri");
  CHECK(rows[1].find("loop")->as_string() == "train");
  for (const Json& r : rows) {
    CHECK(r.find("model")->as_string() == "vgg11_bn");
    CHECK(r.find("block_name")->as_string() == "features.25");  // the last conv unit, 128×1×1
    CHECK(r.find("ms_fastest")->as_number() > 0);
    CHECK(r.find("ms_fastest")->as_number() <= r.find("ms_per_step")->as_number());
    CHECK(r.find("ms_per_step")->as_number() <= r.find("ms_slowest")->as_number());
  }
}

TEST_CASE("bench models: a tiny run writes each model's rates, its time in OpenBLAS and its memory") {
  adjoint::testing::TempDir dir;
  const std::string out = dir.file("ours.json");
  // The program itself, not run_adjoint: the memory is measured in a child process that
  // bench models starts from its own executable.
  const adjoint::testing::ProgramRun run = adjoint::testing::run_adjoint_program(
      "--threads 1 bench models --only bilinear_lm --repeats 1 --out " + out, dir);
  REQUIRE_MESSAGE(run.exit_code == 0, run.output);
  const Json doc = parse_json(read_text(out));
  for (const char* key : {"threads", "clock", "blas", "conv_gemm", "sgemm_gflops", "training_passes"})
    CHECK_MESSAGE(doc.find(key) != nullptr, key);
  const Json::Array& rows = doc.find("models")->as_array();
  REQUIRE(rows.size() == 1);
  const Json& lm = rows[0];
  CHECK(lm.find("model")->as_string() == "bilinear_lm");
  // The LM's products all run in OpenBLAS: its time there is a positive part of a step.
  for (const char* pass : {"train", "infer"}) {
    const double step_seconds = double(lm.find("batch")->as_int()) / lm.find(cat(pass, "_samples_per_s"))->as_number();
    const double blas = lm.find(cat(pass, "_blas_cpu_seconds"))->as_number();
    INFO(pass, ": ", blas, " s in OpenBLAS of a ", step_seconds, " s step");
    CHECK(blas > 0.0);
    CHECK(blas < 2.0 * step_seconds);  // the median step and the mean time in OpenBLAS: not far apart
  }
  CHECK(lm.find("peak_step_mib")->as_number() > 0.0);
}

TEST_CASE("bench tensorsim: --clock and --out are honoured, --only closed skips the deep cases") {
  adjoint::testing::TempDir dir;
  const CommandOutcome bad = run_adjoint({"bench", "tensorsim", "--only", "deep"});
  CHECK(bad.code == 2);
  CHECK(contains(bad.err, "--only expects closed"));
  const CommandOutcome clock = run_adjoint({"--threads", "2", "bench", "tensorsim", "--clock", "cpu"});
  CHECK(clock.code == 2);
  CHECK(contains(clock.err, "--clock cpu measures durations only with --threads 1"));
  const std::string out = dir.file("ours.json");
  const CommandOutcome o =
      run_adjoint({"--threads", "1", "bench", "tensorsim", "--only", "closed", "--clock", "cpu", "--repeats", "1", "--out", out});
  REQUIRE_MESSAGE(o.code == 0, o.err);
  CHECK(!contains(o.out, "samples:"));  // no Monte Carlo run
  CHECK(!contains(o.out, "recursion"));
  const Json j = parse_json(read_text(out));
  CHECK(j.find("clock")->as_string() == "cpu");
  CHECK(j.find("threads")->as_number() == 1);
  const auto& results = j.find("results")->as_array();
  REQUIRE(results.size() == 6);  // three cases, two metrics
  for (const Json& r : results) CHECK(r.find("ms_per_pair")->as_number() > 0);
}

TEST_CASE("bench explain: --only is honoured with --checkpoint: the models it names, then the checkpoint's") {
  adjoint::testing::TempDir dir;
  ModelConfig c;
  c.arch = "resnet18", c.width = 0.0625, c.in_channels = 1, c.image_size = 8, c.num_classes = 10;
  Generator gen(0);
  const std::string ck = dir.file("tiny.safetensors");
  save_checkpoint(ck, *make_model(c, gen), nullptr, 0, 0);
  const CommandOutcome unknown = run_adjoint({"bench", "explain", "--checkpoint", ck, "--only", "frobnet"});
  CHECK(unknown.code == 2);
  CHECK(contains(unknown.err, "--only expects models among resnet18, vgg11_bn, vit_tiny; got 'frobnet'"));
  const std::string out = dir.file("rows.json");
  const CommandOutcome both = run_adjoint({"--threads", "1", "bench", "explain", "--checkpoint", ck, "--only", "vgg11_bn",
                                           "--batch", "1", "--repeats", "1", "--out", out});
  CAPTURE(both.err);
  REQUIRE(both.code == 0);
  CHECK(contains(both.out, "acceptance (soft pullback <= 1.2x gradient, pullback ascent K=5 <= 6x): vgg11_bn "));
  CHECK(contains(both.out, " resnet18 "));  // the checkpoint's model after the one --only names
  CHECK_FALSE(contains(both.out, "vit_tiny"));
}

TEST_CASE("bench models --size: bad workloads, sizes and models exit 2 naming them") {
  const CommandOutcome workload = run_adjoint({"bench", "models", "--size", "32", "--workloads", "infer,blur"});
  CHECK(workload.code == 2);
  CHECK(contains(workload.err, "unknown workload 'blur'"));
  const CommandOutcome size = run_adjoint({"bench", "models", "--size", "8"});
  CHECK(size.code == 2);
  CHECK(contains(size.err, "--size"));
  // The ImageNet table has no ResNet-18: asking for it there is a usage error.
  const CommandOutcome model = run_adjoint({"bench", "models", "--imagenet", "--only", "resnet18"});
  CHECK(model.code == 2);
  CHECK(contains(model.err, "unknown model 'resnet18'"));
  CHECK(contains(model.err, "resnet50"));
  CHECK(contains(model.err, "pvt_v2_b1"));  // the paper's third model has its row
}

TEST_CASE("bench models --size: a tiny run of the ImageNet models writes the chosen workloads per image") {
  adjoint::testing::TempDir dir;
  const std::string out = dir.file("ours.json");
  const adjoint::testing::ProgramRun run = adjoint::testing::run_adjoint_program(
      "--threads 1 bench models --size 32 --only resnet50 --batch 1 --repeats 1 --samples 2 "
      "--workloads infer,gradient,smoothgrad --out " + out, dir);
  REQUIRE_MESSAGE(run.exit_code == 0, run.output);
  CHECK(contains(run.output, "smoothgrad(2)"));
  CHECK_FALSE(contains(run.output, "step peak MiB"));  // no training step chosen, so no step memory
  const Json doc = parse_json(read_text(out));
  CHECK(doc.find("image_size")->as_int() == 32);
  const Json::Array& rows = doc.find("models")->as_array();
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].find("model")->as_string() == "resnet50");
  CHECK(rows[0].find("infer_samples_per_s")->as_number() > 0.0);
  CHECK(rows[0].find("train_samples_per_s")->as_number() == 0.0);  // not chosen
  const Json::Array& explained = rows[0].find("explanations")->as_array();
  REQUIRE(explained.size() == 2);
  CHECK(explained[0].find("workload")->as_string() == "gradient");
  CHECK(explained[1].find("workload")->as_string() == "smoothgrad(2)");
  for (const Json& e : explained) {
    CHECK(e.find("ms_per_image")->as_number() > 0.0);
    CHECK(e.find("peak_tensor_mib")->as_number() > 0.0);  // the recorded forward pass at least
  }
}

TEST_CASE("bench models --memory: each chosen workload's peak in a fresh process; the prepared forms' budget") {
  adjoint::testing::TempDir dir;
  const std::string out = dir.file("ours.json");
  const adjoint::testing::ProgramRun run = adjoint::testing::run_adjoint_program(
      "--threads 1 bench models --size 32 --only resnet50 --batch 1 --repeats 1 --samples 2 "
      "--workloads infer,gradient,smoothgrad --memory --out " + out, dir);
  REQUIRE_MESSAGE(run.exit_code == 0, run.output);
  CHECK(contains(run.output, "peak memory of each workload in a fresh process"));
  Json doc = parse_json(read_text(out));
  CHECK(doc.find("prepared_forms_budget_mib")->as_number() == double(kDefaultPreparedFormsMiB));
  const Json& row = doc.find("models")->as_array().at(0);
  CHECK(row.find("peak_rss_infer_mib")->as_number() > 0.0);
  CHECK(row.find("peak_infer_mib")->as_number() > 0.0);  // the activations of a forward pass at least
  const Json::Array& explained = row.find("explanations")->as_array();
  REQUIRE(explained.size() == 2);
  for (const Json& e : explained) {
    CAPTURE(e.find("workload")->as_string());
    CHECK(e.find("peak_rss_mib")->as_number() > 0.0);
    CHECK(e.find("fresh_peak_tensor_mib")->as_number() > 0.0);
    CHECK(e.find("kept_forms_mib")->as_number() > 0.0);  // the eval convolutions keep their forms
  }
  // Each child ran its own workload: the recorded graphs hold more than inference's activations.
  CHECK(explained[0].find("fresh_peak_tensor_mib")->as_number() > row.find("peak_infer_mib")->as_number());

  // A budget of 0 keeps no form: each is dropped once made, and the count says so.
  ::setenv("ADJOINT_PREPARED_FORMS_MIB", "0", 1);
  const adjoint::testing::ProgramRun none = adjoint::testing::run_adjoint_program(
      "--threads 1 bench models --size 32 --only resnet50 --batch 1 --repeats 1 --workloads gradient --out " + out, dir);
  ::setenv("ADJOINT_PREPARED_FORMS_MIB", "lots", 1);
  const adjoint::testing::ProgramRun bad = adjoint::testing::run_adjoint_program(
      "--threads 1 bench models --size 32 --only resnet50 --batch 1 --repeats 1 --workloads gradient", dir);
  ::unsetenv("ADJOINT_PREPARED_FORMS_MIB");
  REQUIRE_MESSAGE(none.exit_code == 0, none.output);
  doc = parse_json(read_text(out));
  CHECK(doc.find("prepared_forms_budget_mib")->as_number() == 0.0);
  const Json& gradient = doc.find("models")->as_array().at(0).find("explanations")->as_array().at(0);
  CHECK(gradient.find("kept_forms_mib")->as_number() == 0.0);
  CHECK(gradient.find("forms_dropped")->as_number() > 0.0);
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "ADJOINT_PREPARED_FORMS_MIB: expected a count of MiB (0 or more) or 'unlimited', got 'lots'"));
}

TEST_CASE("bench explain: --size and --samples set the models' images and the many-pass methods' count") {
  const CommandOutcome samples = run_adjoint({"bench", "explain", "--samples", "1"});
  CHECK(samples.code == 2);
  CHECK(contains(samples.err, "--samples"));
  const CommandOutcome max_batch = run_adjoint({"bench", "explain", "--max-batch", "0"});
  CHECK(max_batch.code == 2);
  CHECK(contains(max_batch.err, "--max-batch"));
  adjoint::testing::TempDir dir;
  const std::string out = dir.file("explain.csv");
  const CommandOutcome run = run_adjoint({"--threads", "1", "bench", "explain", "--only", "resnet18", "--size", "16",
                                          "--batch", "2", "--samples", "3", "--repeats", "1", "--out", out});
  REQUIRE_MESSAGE(run.code == 0, run.err);
  const std::string csv = read_text(out);
  CHECK(contains(csv, "resnet18,smoothgrad(3),1,2,"));
  CHECK(contains(csv, "resnet18,integrated_gradients(3),1,2,"));
  CHECK_FALSE(contains(csv, "(50)"));
}
