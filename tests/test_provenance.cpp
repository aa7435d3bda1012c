// What made a result, and whether it may stand for another: the stitching sweep's records
// (analysis/stitching/provenance.h), the readers of the files it reads back
// (analysis/stitching/records.h), and the training options a resumed or continued run must
// share with the checkpoint it starts from (models/training.h).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <fstream>

#include "analysis/stitching/provenance.h"
#include "analysis/stitching/stitched_model.h"
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "models/training.h"
#include "tests/stitch_fixture.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::TempDir;
using adjoint::testing::stitch_fixture_model;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// A cell as the sweep writes it, valid in every field.
StitchCell valid_cell() {
  StitchCell c;
  c.front_block = 2, c.end_block = 3, c.front_name = "layer1.1", c.end_name = "layer2.0";
  c.objective = "slm", c.protocol = "invariance", c.train_images = 20, c.steps = 8, c.final_loss = 0.5;
  c.stitched_accuracy = 0.75, c.end_accuracy = 0.8, c.relative_score = 0.9375;
  c.iri_median = 0.01, c.iri_p90 = 0.03, c.iri_share_below = 0.95, c.iri_poor = false;
  c.end_agrees_on_iris = 0.5, c.end_agrees_with_starts_on_iris = 0.25;
  c.test_sets = {{"fashion-mnist+invert", 0.5, 0.6}};
  c.made = {{"lr", "0.001"}, {"front.checkpoint", "0123456789abcdef"}};
  return c;
}

}  // namespace

TEST_CASE("provenance: FNV-1a 64 of a file's bytes, as 16 hex digits") {
  const TempDir dir;
  // The published FNV-1a 64 test vectors: "" and "a".
  write_bytes(dir.file("empty"), "");
  write_bytes(dir.file("a"), "a");
  CHECK(file_hash(dir.file("empty")) == "cbf29ce484222325");
  CHECK(file_hash(dir.file("a")) == "af63dc4c8601ec8c");
  write_bytes(dir.file("b"), "b");
  CHECK(file_hash(dir.file("b")) != file_hash(dir.file("a")));
  CHECK_THROWS_WITH_AS(file_hash(dir.file("none")), doctest::Contains(dir.file("none").c_str()), Error);
}

TEST_CASE("provenance: each record holds what changes its numbers, and a difference is named") {
  const Endpoint a = stitch_fixture_model("A"), b = stitch_fixture_model("B");
  Endpoint pinned_a = a, pinned_b = b;
  pinned_a.checksum = "aaaaaaaaaaaaaaaa", pinned_b.checksum = "bbbbbbbbbbbbbbbb";
  StitchSweepOptions o;
  o.train.lr = 1e-3;
  o.iri.search.steps = 40;
  const RecordSubject iris{RecordSubject::iri_set, 2, 0, "", ""};
  const RecordSubject standard{RecordSubject::cell, 2, 3, "hlm", "standard"};
  const RecordSubject invariance{RecordSubject::cell, 2, 3, "slm", "invariance"};
  const RecordSubject stitch{RecordSubject::stitch, 2, 3, "slm", "invariance"};
  const Provenance iri_record = make_provenance(pinned_a, pinned_b, "mnist", o, iris);
  const Provenance standard_record = make_provenance(pinned_a, pinned_b, "mnist", o, standard);
  const Provenance invariance_record = make_provenance(pinned_a, pinned_b, "mnist", o, invariance);
  const Provenance stitch_record = make_provenance(pinned_a, pinned_b, "mnist", o, stitch);
  // An IRI set: the front model, its block, the data and the search; nothing of B or training.
  CHECK(iri_record.at("front.checkpoint") == "aaaaaaaaaaaaaaaa");
  CHECK(iri_record.at("iri-steps") == "40");
  CHECK(iri_record.at("data") == "mnist");
  for (const char* key : {"end.checkpoint", "lr", "objective", "test-images"}) CHECK_MESSAGE(!iri_record.count(key), key);
  // A standard cell: both models and training, not the IRI search; an invariance cell both.
  CHECK(standard_record.at("end.checkpoint") == "bbbbbbbbbbbbbbbb");
  CHECK(standard_record.at("lr") == "0.001");
  CHECK(standard_record.at("train-images") == "5000");
  CHECK(!standard_record.count("iri-steps"));
  CHECK(invariance_record.at("iri-steps") == "40");
  CHECK(invariance_record.at("temperature") == "1");  // slm reads its temperature
  CHECK(!standard_record.count("temperature"));        // hlm does not
  // A stitch's record is its cell's without what only scores it.
  CHECK(invariance_record.count("test-images"));
  CHECK(!stitch_record.count("test-images"));

  CHECK(provenance_difference(invariance_record, invariance_record).empty());
  StitchSweepOptions other = o;
  other.train.lr = 1e-2;
  other.iri.search.steps = 80;
  const Provenance changed = make_provenance(pinned_a, pinned_b, "mnist", other, invariance);
  CHECK(provenance_difference(invariance_record, changed) == "iri-steps was 40, now 80; lr was 0.001, now 0.01");
  // Another front checkpoint: its content hash differs.
  const Provenance swapped = make_provenance(pinned_b, pinned_b, "mnist", o, standard);
  CHECK(provenance_difference(standard_record, swapped) == "front.checkpoint was aaaaaaaaaaaaaaaa, now bbbbbbbbbbbbbbbb");
  CHECK(provenance_difference({}, standard_record) == "it holds no record of what made it (an older adjoint wrote it)");

  CHECK(may_reuse("stitch", "x.json", standard_record, standard_record, false, {}));
  CHECK_THROWS_WITH_AS(may_reuse("stitch", "x.json", standard_record, swapped, false, {}),
                       doctest::Contains("stitch: x.json was made by another run: front.checkpoint was aaaaaaaaaaaaaaaa, "
                                         "now bbbbbbbbbbbbbbbb; give --overwrite to make it again, or another --out"),
                       UsageError);
  std::string said;
  CHECK(!may_reuse("stitch", "x.json", standard_record, swapped, true, [&](const std::string& line) { said = line; }));
  CHECK(said.find("remaking x.json (--overwrite): front.checkpoint was") == 0);
}

TEST_CASE("cell files: a valid cell reads back as written; every malformed one is one Error naming the file") {
  const StitchCell c = valid_cell();
  const StitchCell back = read_cell_text(to_json(cell_to_json(c)), "cell.json");
  CHECK(back.key() == c.key());
  CHECK(back.steps == 8);
  CHECK(back.end_agrees_with_starts_on_iris == c.end_agrees_with_starts_on_iris);
  CHECK(back.iri_p90 == c.iri_p90);
  CHECK(back.made == c.made);
  CHECK(back.test_sets.size() == 1);

  // Each malformed file: the text and what the one line says.
  const std::string good = to_json(cell_to_json(c));
  auto with = [&](const std::string& key, const std::string& value) {
    Json j = cell_to_json(c);
    j[key] = parse_json(value);
    return to_json(j);
  };
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"{}", "cell.json: no 'front_block'"},
           {"[]", "cell.json: the file is an array, expected an object"},
           {"{", "cell.json: not a cell file"},
           {"", "cell.json: not a cell file"},
           {with("front_block", "-1"), "cell.json: 'front_block' is -1, expected a count"},
           {with("front_block", "1.5"), "cell.json: 'front_block' is 1.5, expected a count"},
           {with("objective", "3"), "cell.json: 'objective' is a number, expected a string"},
           {with("stitched_accuracy", "2"), "cell.json: 'stitched_accuracy' is 2, expected a share between 0 and 1"},
           {with("raua", "\"x\""), "cell.json: 'raua' is \"x\", expected a number or null"},
           {with("iri_poor", "1"), "cell.json: 'iri_poor' is 1, expected true, false or null"},
           {with("test_sets", "{}"), "cell.json: 'test_sets' is an object, expected an array"},
           {with("test_sets", "[3]"), "cell.json: an entry of 'test_sets' is a number, expected an object"},
           {with("test_sets", "[{}]"), "cell.json: no 'data' in an entry of 'test_sets'"},
           {with("made", "[]"), "cell.json: 'made' is an array, expected an object"},
           {with("made", "{\"lr\": 1}"), "cell.json: 'made' entry 'lr' is a number, expected a string"},
       }) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(read_cell_text(text, "cell.json"), doctest::Contains(message.c_str()), Error);
  }
}

TEST_CASE("IRI files: written and read back; other tensors, NaN, bad shapes and indices are refused naming the file") {
  const TempDir dir;
  IriFile f;
  f.inputs = Tensor::from_vector({2, 1, 2, 2}, {0, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 1});
  f.starts = Tensor::from_vector({2, 1, 2, 2}, {1, 0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0});
  f.start_index = {1, 0};
  f.distance = {0.01, 0.02};
  f.made = {{"iri-steps", "40"}};
  const std::string path = dir.file("iris.safetensors");
  write_iri_file(path, f);
  const IriFile back = read_iri_file(path);
  CHECK(back.start_index == f.start_index);
  CHECK(back.made == f.made);
  CHECK(back.distance.size() == 2);

  auto tampered = [&](const std::function<void(std::map<std::string, Tensor>&)>& change) {
    SafetensorsFile file = read_safetensors(path);
    change(file.tensors);
    write_safetensors(dir.file("bad.safetensors"), file.tensors, file.metadata);
    return dir.file("bad.safetensors");
  };
  const std::string at = "IRI file " + dir.file("bad.safetensors") + ": ";
  CHECK_THROWS_WITH_AS(read_iri_file(tampered([](auto& t) { t["extra"] = Tensor::zeros({1}); })),
                       doctest::Contains((at + "unexpected tensor 'extra'; IRI files hold inputs, starts, start_index, distance").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(read_iri_file(tampered([](auto& t) { t.erase("starts"); })),
                       doctest::Contains((at + "no tensor 'starts'").c_str()), Error);
  CHECK_THROWS_WITH_AS(read_iri_file(tampered([](auto& t) { t["inputs"].data()[3] = NAN; })),
                       doctest::Contains((at + "tensor 'inputs' holds nan at element 3").c_str()), Error);
  CHECK_THROWS_WITH_AS(read_iri_file(tampered([](auto& t) { t["inputs"].data()[3] = 1.5f; })),
                       doctest::Contains((at + "a pixel is 1.5, outside the image range [0, 1]").c_str()), Error);
  CHECK_THROWS_WITH_AS(read_iri_file(tampered([](auto& t) { t["start_index"].data()[0] = 0; })),
                       doctest::Contains((at + "start_index[0] is 0, expected another image's index").c_str()), Error);
  CHECK_THROWS_WITH_AS(read_iri_file(tampered([](auto& t) { t["distance"] = Tensor::zeros({3}); })),
                       doctest::Contains((at + "start_index [2] and distance [3], expected [2] each").c_str()), Error);
  CHECK_THROWS_WITH_AS(read_iri_file(tampered([](auto& t) { t["distance"].data()[1] = -1; })),
                       doctest::Contains((at + "distance[1] is -1").c_str()), Error);
}

TEST_CASE("stitch files: NaN weights and foreign tensors are refused naming the file") {
  const TempDir dir;
  const Endpoint a = stitch_fixture_model("A");
  const StitchPair pair(a, 2, a, 2, {1, 16, 16});
  Stitch stitch(pair.shapes());
  stitch.init_identity();
  const std::string path = dir.file("stitch.safetensors");
  write_stitch_file(path, pair, stitch, {{"lr", "0.001"}});
  CHECK(read_stitch_parameters(path).made.at("lr") == "0.001");
  CHECK(read_stitch_parameters(path).made.at("front.block") == "2");
  SafetensorsFile f = read_safetensors(path);
  f.tensors.at("weight").data()[0] = NAN;
  write_safetensors(dir.file("nan.safetensors"), f.tensors, f.metadata);
  CHECK_THROWS_WITH_AS(read_stitch_file(dir.file("nan.safetensors")),
                       doctest::Contains(("stitch file " + dir.file("nan.safetensors") +
                                          ": tensor 'weight' holds nan at element 0; a file with non-finite values is refused")
                                             .c_str()),
                       Error);
  f = read_safetensors(path);
  f.tensors["inputs"] = Tensor::zeros({1});
  write_safetensors(dir.file("other.safetensors"), f.tensors, f.metadata);
  CHECK_THROWS_WITH_AS(read_stitch_parameters(dir.file("other.safetensors")),
                       doctest::Contains("unexpected tensor 'inputs'; stitch files hold weight, bias"), Error);
}

TEST_CASE("kept checkpoints: log:K with K far beyond the run's steps keeps every step, at once") {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> steps = checkpoint_steps("log:99999999999999", 50);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 1.0);
  REQUIRE(steps.size() == 50);
  for (int64_t s = 1; s <= 50; ++s) CHECK(steps[size_t(s - 1)] == s);
  // Just below the bound the loop runs, and agrees: K = 200 over 50 steps already hits each.
  CHECK(checkpoint_steps("log:200", 50) == steps);
  CHECK(checkpoint_steps("log:4", 1000) == std::vector<int64_t>{1, 10, 100, 1000});
}

TEST_CASE("provenance: a cell records the commit and the ridge; another ridge or commit is not reused") {
  Endpoint a = stitch_fixture_model("A"), b = stitch_fixture_model("B");
  a.checksum = "aaaaaaaaaaaaaaaa", b.checksum = "bbbbbbbbbbbbbbbb";
  StitchSweepOptions o;
  o.commit = "abc123";
  const RecordSubject cell{RecordSubject::cell, 2, 3, "hlm", "standard"};
  const RecordSubject stitch{RecordSubject::stitch, 2, 3, "hlm", "standard"};
  const Provenance record = make_provenance(a, b, "mnist", o, cell);
  CHECK(record.at("commit") == "abc123");
  CHECK(record.at("ridge") == "1e-04");
  CHECK(make_provenance(a, b, "mnist", o, stitch).at("ridge") == "1e-04");  // the stitch file too
  StitchSweepOptions ridged = o;
  ridged.ridge = 100;
  CHECK(provenance_difference(record, make_provenance(a, b, "mnist", ridged, cell)) == "ridge was 1e-04, now 100");
  CHECK(provenance_difference(make_provenance(a, b, "mnist", o, stitch), make_provenance(a, b, "mnist", ridged, stitch)) ==
        "ridge was 1e-04, now 100");
  StitchSweepOptions rebuilt = o;
  rebuilt.commit = "def456";
  CHECK(provenance_difference(record, make_provenance(a, b, "mnist", rebuilt, cell)) == "commit was abc123, now def456");
}

TEST_CASE("resume: a longer run on a cosine schedule is refused, since its schedule would end elsewhere") {
  const TempDir dir;
  const std::string out = dir.file("run");
  // 3 steps of 6: the cosine schedule of the first run ends at step 3.
  adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) { o.out_dir = out, o.schedule = "cosine", o.max_steps = 3; });
  const std::string checkpoint = out + "/checkpoint.safetensors";
  for (const auto& [change, message] : std::vector<std::pair<std::function<void(TrainOptions&)>, std::string>>{
           {[](TrainOptions& o) { o.max_steps = 5; }, "ends its cosine schedule at step 3, this run at step 5"},
           {[](TrainOptions& o) { o.max_steps = 0; }, "ends its cosine schedule at step 3, this run at step 6"},
       }) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
                           o.out_dir = out, o.schedule = "cosine", o.resume = checkpoint;
                           change(o);
                         }),
                         doctest::Contains(message.c_str()), UsageError);
  }
  // A step schedule whose steps are fixed does not depend on where the run ends, nor does a
  // constant one: those may be extended.
  const std::string step = dir.file("step");
  adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
    o.out_dir = step, o.schedule = "step", o.step_every = 2, o.max_steps = 3;
  });
  CHECK_NOTHROW(adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
    o.out_dir = step, o.schedule = "step", o.step_every = 2, o.max_steps = 5, o.resume = step + "/checkpoint.safetensors";
  }));
  // A step schedule whose steps are thirds of the run does.
  const std::string thirds = dir.file("thirds");
  adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) { o.out_dir = thirds, o.schedule = "step", o.max_steps = 3; });
  CHECK_THROWS_WITH_AS(adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
                         o.out_dir = thirds, o.schedule = "step", o.max_steps = 6, o.resume = thirds + "/checkpoint.safetensors";
                       }),
                       doctest::Contains("ends its step schedule at step 3, this run at step 6"), UsageError);
}

TEST_CASE("resume: another lr, weight decay, schedule or momentum is refused naming it; continue-from another "
          "optimizer is refused") {
  const TempDir dir;
  const std::string out = dir.file("run");
  adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) { o.out_dir = out, o.max_steps = 3, o.epochs = 2; });
  const std::string checkpoint = out + "/checkpoint.safetensors";
  for (const auto& [change, message] : std::vector<std::pair<std::function<void(TrainOptions&)>, std::string>>{
           {[](TrainOptions& o) { o.lr = 2e-2; }, "trained with --lr 0.01, this run has --lr 0.02"},
           {[](TrainOptions& o) { o.weight_decay = 0.1; }, "trained with --weight-decay 0, this run has --weight-decay 0.1"},
           {[](TrainOptions& o) { o.schedule = "cosine"; }, "trained with --schedule constant, this run has --schedule cosine"},
           {[](TrainOptions& o) { o.warmup_steps = 2; }, "trained with --warmup 0, this run has --warmup 2"},
       }) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
                           o.out_dir = out, o.resume = checkpoint;
                           change(o);
                         }),
                         doctest::Contains(message.c_str()), UsageError);
  }
  // Momentum belongs to SGD: a run of SGD resumed with another momentum.
  const std::string sgd = dir.file("sgd");
  adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
    o.optimizer = "sgd", o.momentum = 0.9, o.out_dir = sgd, o.max_steps = 3;
  });
  CHECK_THROWS_WITH_AS(adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
                         o.optimizer = "sgd", o.momentum = 0.5, o.out_dir = sgd, o.resume = sgd + "/checkpoint.safetensors";
                       }),
                       doctest::Contains("trained with --momentum 0.9, this run has --momentum 0.5"), UsageError);
  // The same options resume.
  CHECK_NOTHROW(adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) { o.out_dir = out, o.resume = checkpoint; }));
  // An AdamW checkpoint continued by an SGD run would lose Adam's moments without a word.
  CHECK_THROWS_WITH_AS(adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
                         o.optimizer = "sgd", o.out_dir = dir.file("branch"), o.continue_from = checkpoint;
                       }),
                       doctest::Contains(("--continue-from " + checkpoint + ": the checkpoint was trained with --optimizer "
                                         "adamw, this run uses sgd, whose state (momentum, moments) cannot carry over").c_str()),
                       UsageError);
}
