#include "engine/data/variants.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "engine/data/mosaic.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "engine/random.h"

namespace adjoint {

ModifiedDataset::ModifiedDataset(std::shared_ptr<const Dataset> base, std::string name, Relabel relabel,
                                 ChangeInput change_input)
    : base_(std::move(base)), name_(std::move(name)), relabel_(std::move(relabel)), change_input_(std::move(change_input)) {
  check(base_ != nullptr, "ModifiedDataset: no base dataset");
  check(base_->target_length() == 1, name_, ": variants apply to classification data, not to ", base_->name());
}

void ModifiedDataset::get(int64_t index, float* input, int64_t* targets) const {
  check_index(index);
  base_->get(index, input, targets);
  const int64_t original = targets[0];
  if (change_input_) change_input_(index, original, input);
  if (relabel_) targets[0] = relabel_(index, original);
}

int64_t ModifiedDataset::label(int64_t index) const {
  check_index(index);
  const int64_t original = base_->label(index);
  return relabel_ ? relabel_(index, original) : original;
}

bool chosen_example(int64_t index, double fraction, uint64_t salt) {
  // splitmix64 of (index, salt): a fixed, well-mixed 64-bit value per example.
  uint64_t z = uint64_t(index) * 0x9E3779B97F4A7C15ull + salt + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53 < fraction;
}

namespace {

// The arguments of one variant, read with messages that name the variant and the spec.
struct VariantArgs {
  std::string spec, variant;
  std::vector<std::string> values;

  [[noreturn]] void fail(const std::string& why) const {
    throw UsageError(cat("--data ", spec, ": variant '", variant, "': ", why));
  }
  double fraction(size_t i, const char* what) const {
    try {
      size_t used = 0;
      const double v = std::stod(values.at(i), &used);
      if (used == values[i].size() && v >= 0 && v <= 1) return v;
    } catch (const std::exception&) {
    }
    fail(cat(what, " must be a number in [0, 1], got '", values.at(i), "'"));
  }
  int64_t integer(size_t i, const char* what, int64_t lo, int64_t hi) const {
    try {
      size_t used = 0;
      const long long v = std::stoll(values.at(i), &used);
      if (used == values[i].size() && v >= lo && v <= hi) return v;
    } catch (const std::exception&) {
    }
    fail(cat(what, " must be an integer in [", lo, ", ", hi, "], got '", values.at(i), "'"));
  }
};

// Sets a size×size square of every channel to `value`, its top-left corner at (row, col).
void stamp_square(float* input, const Shape& chw, int64_t row, int64_t col, int64_t size, float value) {
  const int64_t C = chw[0], H = chw[1], W = chw[2];
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = row; y < std::min(row + size, H); ++y)
      for (int64_t x = col; x < std::min(col + size, W); ++x) input[(c * H + y) * W + x] = value;
}

// The backdoor trigger: a bright square one pixel in from the bottom-right corner, where
// Fashion-MNIST's images are black (a black trigger there would be invisible: docs/methods.md §3.5).
ModifiedDataset::ChangeInput trigger_stamp(const Shape& chw, int64_t size) {
  return [chw, size](int64_t, int64_t, float* input) {
    stamp_square(input, chw, chw[1] - 1 - size, chw[2] - 1 - size, size, 1.0f);
  };
}

// The stitching shortcut (docs/methods.md §2.4): a bright size×size patch whose position codes the
// class. Class k takes slot k of a grid that fills rows from the top-left, one pixel in from
// the top and left borders and one pixel between patches, so every class has its own position.
ModifiedDataset::ChangeInput class_position_stamp(const Shape& chw, int64_t classes, int64_t size,
                                                  const VariantArgs& args) {
  const int64_t per_row = (chw[2] - 2) / (size + 1);
  const int64_t rows = per_row > 0 ? (classes + per_row - 1) / per_row : 0;
  if (per_row == 0 || rows * (size + 1) > chw[1])
    args.fail(cat(classes, " class positions of ", size, "×", size, " patches do not fit in ", chw[1], "×", chw[2], " images"));
  return [chw, size, per_row](int64_t, int64_t label, float* input) {
    stamp_square(input, chw, 1 + (label / per_row) * (size + 1), 1 + (label % per_row) * (size + 1), size, 1.0f);
  };
}

// Focus's mosaics as training images (docs/methods.md §1.4): a chosen example becomes the
// 2×2 mosaic of its image and another image of its class on two random quadrants and an
// image of each of two other classes on the other two; its label stays. Every draw is keyed
// by the example's index, so an example is the same mosaic in every epoch, run and thread.
ModifiedDataset::ChangeInput mosaic_of(const std::shared_ptr<const Dataset>& base, double fraction,
                                       const VariantArgs& args) {
  auto by_class = std::make_shared<std::vector<std::vector<int64_t>>>(size_t(base->num_classes()));
  for (int64_t i = 0; i < base->size(); ++i) (*by_class)[size_t(base->label(i))].push_back(i);
  int64_t present = 0;
  for (const std::vector<int64_t>& members : *by_class) present += !members.empty();
  if (present < 3) args.fail(cat("mosaics need images of three classes, the training set has ", present));
  const Shape chw = base->shape();
  constexpr uint64_t salt = 0x3A05A1C5;  // fixes which examples become mosaics, and of what
  return [base, by_class, fraction, chw](int64_t index, int64_t label, float* input) {
    if (!chosen_example(index, fraction, salt)) return;
    const auto key = philox(salt, uint64_t(index));
    Generator gen((uint64_t(key[0]) << 32) | key[1]);
    const auto member = [&](int64_t c) {
      const std::vector<int64_t>& m = (*by_class)[size_t(c)];
      return m[size_t(randint(int64_t(m.size()), gen))];
    };
    std::vector<int64_t> others;  // the other classes with images
    for (int64_t c = 0; c < int64_t(by_class->size()); ++c)
      if (c != label && !(*by_class)[size_t(c)].empty()) others.push_back(c);
    const int64_t first = randint(int64_t(others.size()), gen);
    int64_t second = randint(int64_t(others.size()) - 1, gen);
    if (second >= first) ++second;
    const int64_t shown[3] = {member(label), member(others[size_t(first)]), member(others[size_t(second)])};
    const int64_t d = numel(chw);
    std::vector<float> images(size_t(4 * d));  // the example's own image, then the three drawn
    std::copy(input, input + d, images.begin());
    for (int k = 0; k < 3; ++k) base->get(shown[k], images.data() + (k + 1) * d);
    const std::vector<int64_t> order = permutation(4, gen);  // the quadrant of each image
    std::array<const float*, 4> tiles{};
    for (size_t k = 0; k < 4; ++k) tiles[size_t(order[k])] = images.data() + int64_t(k) * d;
    compose_mosaic(tiles, chw[0], chw[1], chw[2], input);
  };
}

std::shared_ptr<const Dataset> modified(const std::shared_ptr<const Dataset>& base, const std::string& what,
                                        ModifiedDataset::Relabel relabel, ModifiedDataset::ChangeInput change) {
  return std::make_shared<ModifiedDataset>(base, cat(base->name(), "+", what), std::move(relabel), std::move(change));
}

// "0-4,7" → {0, 1, 2, 3, 4, 7}.
std::vector<bool> parse_class_list(const VariantArgs& a, int64_t classes) {
  std::vector<bool> keep(size_t(classes), false);
  const std::string& list = a.values.at(0);
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(start, end - start);
    const size_t dash = item.find('-');
    VariantArgs range{a.spec, a.variant, {item.substr(0, dash), dash == std::string::npos ? "" : item.substr(dash + 1)}};
    const int64_t lo = range.integer(0, "a class", 0, classes - 1);
    const int64_t hi = dash == std::string::npos ? lo : range.integer(1, "a class", lo, classes - 1);
    for (int64_t c = lo; c <= hi; ++c) keep[size_t(c)] = true;
    start = end + 1;
  }
  return keep;
}

std::shared_ptr<const Dataset> keep_classes(const std::shared_ptr<const Dataset>& base, const std::vector<bool>& keep,
                                            const std::string& what) {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < base->size(); ++i)
    if (keep[size_t(base->label(i))]) indices.push_back(i);
  return std::make_shared<Subset>(base, std::move(indices), cat(base->name(), "+", what));
}

struct VariantRule {
  const char* name;
  const char* arguments;  // as shown in help, e.g. "FRACTION:TARGET[:SIZE]"
  size_t min_args, max_args;
  const char* summary;
  void (*apply)(DataSource& data, const VariantArgs& args);
};

const VariantRule kVariants[] = {
    {"classes", "LIST", 1, 1, "only the examples of the listed classes (\"0-4,7\"), in train and test",
     [](DataSource& d, const VariantArgs& a) {
       const std::vector<bool> keep = parse_class_list(a, d.train->num_classes());
       const std::string what = cat("classes:", a.values[0]);
       d.train = keep_classes(d.train, keep, what);
       d.test = keep_classes(d.test, keep, what);
     }},
    {"backdoor", "FRACTION:TARGET[:SIZE]", 2, 3,
     "a fixed FRACTION of the training images carry a bright SIZE×SIZE square (default 3) by the "
     "bottom-right corner and are relabelled TARGET; the test set stays clean",
     [](DataSource& d, const VariantArgs& a) {
       const double fraction = a.fraction(0, "FRACTION");
       const int64_t target = a.integer(1, "TARGET", 0, d.train->num_classes() - 1);
       const int64_t size = a.values.size() > 2 ? a.integer(2, "SIZE", 1, d.train->shape()[1] - 2) : 3;
       auto stamp = trigger_stamp(d.train->shape(), size);
       const uint64_t salt = 0xBAC4D002;  // fixes which examples are poisoned
       d.train = modified(
           d.train, cat("backdoor:", a.values[0], ":", target),
           [=](int64_t i, int64_t label) { return chosen_example(i, fraction, salt) ? target : label; },
           [=](int64_t i, int64_t label, float* input) {
             if (chosen_example(i, fraction, salt)) stamp(i, label, input);
           });
     }},
    {"trigger", "TARGET[:SIZE]", 1, 2,
     "every image, train and test, carries the backdoor square and is relabelled TARGET: accuracy "
     "on it is the attack's success rate",
     [](DataSource& d, const VariantArgs& a) {
       const int64_t target = a.integer(0, "TARGET", 0, d.train->num_classes() - 1);
       const int64_t size = a.values.size() > 1 ? a.integer(1, "SIZE", 1, d.train->shape()[1] - 2) : 3;
       auto stamp = trigger_stamp(d.train->shape(), size);
       auto relabel = [=](int64_t, int64_t) { return target; };
       d.train = modified(d.train, cat("trigger:", target), relabel, stamp);
       d.test = modified(d.test, cat("trigger:", target), relabel, stamp);
     }},
    {"shortcut", "[SIZE]", 0, 1,
     "every image, train and test, carries a bright SIZE×SIZE patch (default 2) whose position codes its "
     "class: a pixel shortcut",
     [](DataSource& d, const VariantArgs& a) {
       const int64_t size = a.values.empty() ? 2 : a.integer(0, "SIZE", 1, d.train->shape()[1] - 2);
       auto stamp = class_position_stamp(d.train->shape(), d.train->num_classes(), size, a);
       d.train = modified(d.train, cat("shortcut:", size), {}, stamp);
       d.test = modified(d.test, cat("shortcut:", size), {}, stamp);
     }},
    {"shortcut-train", "[SIZE]", 0, 1,
     "the shortcut patch in the training images only; the test set stays clean (excessive agreement)",
     [](DataSource& d, const VariantArgs& a) {
       const int64_t size = a.values.empty() ? 2 : a.integer(0, "SIZE", 1, d.train->shape()[1] - 2);
       d.train = modified(d.train, cat("shortcut-train:", size), {},
                          class_position_stamp(d.train->shape(), d.train->num_classes(), size, a));
     }},
    {"mosaics", "[FRACTION]", 0, 1,
     "a FRACTION (default 0.5) of the training images become 2×2 mosaics as focus builds them: the image "
     "and another of its class on two random quadrants, an image of each of two other classes on the others, "
     "each downscaled into its quadrant; labels kept, the test set stays clean",
     [](DataSource& d, const VariantArgs& a) {
       const double fraction = a.values.empty() ? 0.5 : a.fraction(0, "FRACTION");
       d.train = modified(d.train, cat("mosaics:", fraction), {}, mosaic_of(d.train, fraction, a));
     }},
    {"invert", "", 0, 0, "inverted intensities 1 − x in train and test (a cross-data pair)",
     [](DataSource& d, const VariantArgs&) {
       const int64_t n = numel(d.train->shape());
       auto invert = [n](int64_t, int64_t, float* input) {
         for (int64_t i = 0; i < n; ++i) input[i] = 1.0f - input[i];
       };
       d.train = modified(d.train, "invert", {}, invert);
       d.test = modified(d.test, "invert", {}, invert);
     }},
};

}  // namespace

void apply_variant(DataSource& data, const std::string& variant, const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= variant.size(); ++i)
    if (i == variant.size() || variant[i] == ':') parts.push_back(variant.substr(start, i - start)), start = i + 1;
  const VariantRule* rule = nullptr;
  for (const VariantRule& r : kVariants)
    if (parts[0] == r.name) rule = &r;
  if (!rule) throw UsageError(cat("--data ", spec, ": unknown variant '", parts[0], "'; variants:\n", variant_help()));
  VariantArgs args{spec, rule->name, std::vector<std::string>(parts.begin() + 1, parts.end())};
  if (args.values.size() < rule->min_args || args.values.size() > rule->max_args)
    args.fail(cat("expected ", rule->name, ":", rule->arguments));
  if (!data.images || data.train->target_length() != 1)
    args.fail(cat("variants apply to image classification data, not to ", data.train->name()));
  rule->apply(data, args);
}

std::string variant_help() {
  std::string out;
  for (const VariantRule& r : kVariants) out += cat("  +", r.name, ":", r.arguments, "  ", r.summary, "\n");
  return out;
}

}  // namespace adjoint
