// Which data each protocol reads (docs/methods.md §2.3), pinned by watching the models.
//
// Every image carries a tag in its first pixel: the natural training images, the test
// images and the IRIs each have their own tags. The front model A ignores the tag (its
// features mask it out), so an IRI search leaves the tag of the start image in place: with
// noise starts the IRIs' tags are random, unlike any natural image's. The end model B
// answers from the tag alone, and the labels are B's answers on the natural images, so B
// is right on every natural image and wrong on an IRI whose tag falls in another class than
// the image it imitates. Both models write down the tag of every image their first block
// sees, so a sweep of one cell tells exactly which images
//   - the stitch trains on (A's inputs besides the test images),
//   - B's targets come from (B's inputs besides the test images and the IRIs it scores),
//   - each column is scored on (the end accuracy, B on IRIs: their values).
#include <doctest/doctest.h>

#include <filesystem>
#include <memory>
#include <set>

#include "analysis/stitching/protocol.h"
#include "analysis/stitching/records.h"
#include "engine/data/dataset.h"
#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/matmul.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kPixels = 16;  // 1×4×4 images, the tag in pixel 0

// B's class for a tag: 0 below 1/3, 1 below 2/3, 2 above.
int64_t class_of_tag(float tag) { return tag < 1.0f / 3 ? 0 : tag < 2.0f / 3 ? 1 : 2; }

// A model of two blocks that writes down the tag of every image its first block sees.
// `masks_tag`: A (its features ignore the tag); otherwise B (its head reads the tag alone:
// logits 10·(c·t − c(c+1)/6), whose arg-max is class_of_tag(t)).
class TagModel : public Model {
public:
  TagModel(bool masks_tag, std::shared_ptr<std::vector<float>> seen) : Model(ModelConfig{}) {
    std::vector<float> mask(kPixels, 1.0f);
    if (masks_tag) mask[0] = 0.0f;
    const Tensor keep = Tensor::from_vector({1, 1, 4, 4}, mask);
    add_block("features", [seen, keep](const Tensor& x) {
      const Tensor c = x.contiguous();
      for (int64_t n = 0; n < c.size(0); ++n) seen->push_back(c.data()[n * kPixels]);
      return x * broadcast_to(keep, x.shape());
    });
    std::vector<float> weight(size_t(kPixels) * 3, 0.0f);
    weight[1] = 10, weight[2] = 20;  // row 0 (the tag): 0, 10, 20
    const Tensor w = Tensor::from_vector({kPixels, 3}, weight), b = Tensor::from_vector({1, 3}, {0, -10.0f / 3, -10});
    add_block("head", [w, b](const Tensor& x) {
      const Tensor logits = matmul(flatten(x), w);
      return logits + broadcast_to(b, logits.shape());
    });
    train(false);
  }
};

// `count` images of 1×4×4: the tag `first_tag + k·tag_step`, then faint content.
std::shared_ptr<InMemoryDataset> tagged_images(const std::string& name, int64_t count, float first_tag, float tag_step) {
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  for (int64_t k = 0; k < count; ++k) {
    const float tag = first_tag + float(k) * tag_step;
    pixels.push_back(tag);
    for (int64_t p = 1; p < kPixels; ++p) pixels.push_back(float((k * 7 + p * 3) % 11) / 11.0f);
    labels.push_back(class_of_tag(tag));
  }
  return std::make_shared<InMemoryDataset>(name, Shape{1, 4, 4}, pixels, labels, 3);
}

std::set<float> tags_of(const Dataset& set, int64_t count) {
  std::set<float> tags;
  std::vector<float> input(static_cast<size_t>(kPixels));
  for (int64_t k = 0; k < count; ++k) {
    set.get(k, input.data());
    tags.insert(input[0]);
  }
  return tags;
}

std::set<float> tags_of(const Tensor& images) {
  std::set<float> tags;
  const Tensor c = images.contiguous();
  for (int64_t n = 0; n < c.size(0); ++n) tags.insert(c.data()[n * kPixels]);
  return tags;
}

std::set<float> both(std::set<float> a, const std::set<float>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

std::string listed(const std::set<float>& tags) {
  std::string s;
  for (float t : tags) s += cat(s.empty() ? "" : " ", t);
  return s;
}

struct Watched {
  std::shared_ptr<std::vector<float>> front_seen = std::make_shared<std::vector<float>>();
  std::shared_ptr<std::vector<float>> end_seen = std::make_shared<std::vector<float>>();
  Endpoint front{"A", std::make_shared<TagModel>(true, front_seen), {}, {}, "a"};
  Endpoint end{"B", std::make_shared<TagModel>(false, end_seen), {}, {}, "b"};
  void forget() { front_seen->clear(), end_seen->clear(); }
};

// 12 training images (tags 0.04 .. 0.96, four of each class) and 6 test images between them.
DataSource tagged_data() {
  DataSource data;
  data.spec = "tagged";
  data.images = true;
  data.train = tagged_images("tagged train", 12, 0.5f / 12, 1.0f / 12);
  data.test = tagged_images("tagged test", 6, 0.6f / 12, 2.0f / 12);
  return data;
}

}  // namespace

TEST_CASE("stitching protocols: which images the stitch trains on, B's targets come from, and every column is "
          "scored on, for every protocol and objective") {
  const TempDir dir;
  Watched w;
  const DataSource data = tagged_data();
  StitchSweepOptions o;
  o.points = {{0, 0}};
  o.train_images = 12;  // standard: all 12
  o.iri_images = 6;     // control and invariance: the first 6
  o.train.steps = 4;
  o.train.batch = 4;
  o.init_images = 4;
  o.iri.search.steps = 3;
  o.iri.start = "noise";
  o.out_dir = dir.file("sweep");
  const std::set<float> natural = tags_of(*data.train, 12), source = tags_of(*data.train, 6), test = tags_of(*data.test, 6);

  // The IRIs, made once: their tags are their noise starts', unlike any natural image's.
  o.protocols = {"invariance"}, o.objectives = {"dm"};
  run_stitch_sweep(w.front, w.end, data, o);
  const IriFile iri_file = read_iri_file(o.out_dir + "/iris/front_block_0.safetensors");
  const std::set<float> iris = tags_of(iri_file.inputs);
  REQUIRE(iris.size() == 6);
  for (float t : iris) REQUIRE(!natural.count(t));
  REQUIRE(tags_of(iri_file.starts) == iris);  // the search never moves the tag A ignores

  // What the stitch trains on (A's inputs: the training set, then the test set it is scored
  // on) and what B's targets come from (B's inputs: the test set for its own accuracy, the
  // training set's end images, and for invariance the IRIs it is scored on).
  // hlm reads no target of B: B sees only the least-squares start's first 4 images (and,
  // for invariance, every IRI it is scored on).
  const std::set<float> first_four = tags_of(*data.train, 4);
  struct Expected {
    const char* protocol;
    std::set<float> trains_on, targets_from, hlm_targets_from;
  };
  const Expected expected[] = {
      {"standard", natural, natural, first_four},
      {"control", source, source, first_four},
      {"invariance", iris, iris, iris},
  };
  for (const Expected& e : expected)
    for (const std::string objective : {"hlm", "slm", "dm", "fula"}) {
      CAPTURE(std::string(e.protocol));
      CAPTURE(objective);
      fs::remove(o.out_dir + "/cells/front0_end0_" + objective + "_" + e.protocol + ".json");
      o.protocols = {e.protocol}, o.objectives = {objective};
      w.forget();
      const std::vector<StitchCell> cells = run_stitch_sweep(w.front, w.end, data, o);
      REQUIRE(cells.size() == 1);
      std::set<float> front_seen(w.front_seen->begin(), w.front_seen->end());
      std::set<float> end_seen(w.end_seen->begin(), w.end_seen->end());
      // The all-zero image with which a stitch pair probes its shapes (no image's tag is 0).
      front_seen.erase(0.0f), end_seen.erase(0.0f);
      CHECK_MESSAGE(front_seen == both(e.trains_on, test), "A saw ", listed(front_seen));
      CHECK_MESSAGE(end_seen == both(objective == "hlm" ? e.hlm_targets_from : e.targets_from, test), "B saw ",
                    listed(end_seen));
      const StitchCell& c = cells.front();
      CHECK(c.train_images == int64_t(e.trains_on.size()));
      CHECK(c.steps == 4);  // the same budget under every protocol
      // B is right on every natural image: its accuracy is on the test set, not the IRIs.
      CHECK(c.end_accuracy == 1.0);
      if (std::string(e.protocol) == "invariance") {
        // B on IRIs: B's answers on the IRIs against the labels of the images they imitate.
        int64_t agree = 0;
        const Tensor x = iri_file.inputs.contiguous();
        for (int64_t n = 0; n < 6; ++n) agree += class_of_tag(x.data()[n * kPixels]) == data.train->label(n);
        REQUIRE(agree < 6);  // the set tells IRIs from natural images apart
        CHECK(c.end_agrees_on_iris == doctest::Approx(double(agree) / 6));
        CHECK(std::isnan(c.end_agrees_with_starts_on_iris));  // noise starts have no label
        CHECK(c.iri_median == doctest::Approx(iri_quality(iri_file.distance).median));
      } else {
        CHECK(std::isnan(c.end_agrees_on_iris));
        CHECK(!c.has_iris());
      }
    }
}

TEST_CASE("stitching protocols: with derangement starts B labels every IRI as its start image, y(x₀)") {
  const TempDir dir;
  Watched w;
  const DataSource data = tagged_data();
  StitchSweepOptions o;
  o.points = {{0, 0}};
  o.protocols = {"invariance"}, o.objectives = {"hlm"};
  o.iri_images = 12;
  o.train.steps = 2;
  o.iri.search.steps = 3;
  o.out_dir = dir.file("sweep");
  const StitchCell c = run_stitch_sweep(w.front, w.end, data, o).front();
  const IriFile f = read_iri_file(o.out_dir + "/iris/front_block_0.safetensors");
  // x′ keeps its start's tag, so B answers y(x₀) on every IRI and y(x) where the two agree.
  int64_t same_class = 0;
  for (int64_t n = 0; n < 12; ++n) {
    REQUIRE(f.start_index[size_t(n)] != n);
    same_class += data.train->label(n) == data.train->label(f.start_index[size_t(n)]);
  }
  REQUIRE(same_class < 12);
  CHECK(c.end_agrees_with_starts_on_iris == 1.0);
  CHECK(c.end_agrees_on_iris == doctest::Approx(double(same_class) / 12));
}

TEST_CASE("stitch budgets: --steps is the same under every protocol, --epochs counts passes, 0 leaves the start") {
  StitchTrainOptions o;
  o.batch = 4;
  o.steps = 200;
  CHECK(stitch_steps(o, 10) == 200);  // whatever the set's size
  CHECK(stitch_steps(o, 5000) == 200);
  o.epochs = 3;
  CHECK(stitch_steps(o, 10) == 9);  // 3 passes of ⌈10/4⌉ batches
  o.epochs = 0;
  CHECK(stitch_steps(o, 10) == 0);

  // 0 steps: the initialisation alone, its weights untouched; a diverging rate is refused.
  const TempDir dir;
  Watched w;
  const DataSource data = tagged_data();
  StitchSweepOptions s;
  s.points = {{0, 0}};
  s.protocols = {"standard"}, s.objectives = {"dm"};
  s.init = "identity";
  s.train.steps = 0;
  s.out_dir = dir.file("none");
  const StitchCell c = run_stitch_sweep(w.front, w.end, data, s).front();
  CHECK(c.steps == 0);
  CHECK(std::isnan(c.final_loss));
  const StitchFile identity = read_stitch_parameters(s.out_dir + "/stitches/front0_end0_dm_standard.safetensors");
  CHECK(identity.weight.to_vector() == std::vector<float>{1});
  CHECK(identity.bias.to_vector() == std::vector<float>{0});
  s.train.steps = 8;
  s.train.lr = 1e38;
  s.out_dir = dir.file("diverged");
  CHECK_THROWS_WITH_AS(run_stitch_sweep(w.front, w.end, data, s),
                       doctest::Contains("dm standard: training diverged (non-finite weights after 8 steps at lr 1e+38)"),
                       Error);
  CHECK(!fs::exists(s.out_dir + "/stitches"));  // no NaN stitch written
}
