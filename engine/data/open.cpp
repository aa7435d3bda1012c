#include "engine/data/open.h"

#include <algorithm>

#include "engine/data/cifar.h"
#include "engine/data/idx.h"
#include "engine/data/image_folder.h"
#include "engine/data/synthetic.h"
#include "engine/data/variants.h"
#include "engine/error.h"

namespace adjoint {

namespace {

// "name:a:b" → {"name", "a", "b"}.
std::vector<std::string> split_spec(const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= spec.size(); ++i)
    if (i == spec.size() || spec[i] == ':') parts.push_back(spec.substr(start, i - start)), start = i + 1;
  return parts;
}

int64_t positive(const std::string& spec, const std::string& text, const char* what) {
  try {
    size_t used = 0;
    const int64_t v = std::stoll(text, &used);
    if (used == text.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(cat("--data ", spec, ": ", what, " must be a positive integer, got '", text, "'"));
}

// Labels are positions in the sorted list of class folders: test folders with other
// classes would be scored against the wrong labels, or fail only after an epoch.
void check_same_classes(const std::string& spec, const ImageFolder& train, const ImageFolder& test) {
  if (train.classes() == test.classes()) return;
  const auto only_in = [](const std::vector<std::string>& a, const std::vector<std::string>& b) {
    std::string names;
    for (const std::string& name : a)
      if (std::find(b.begin(), b.end(), name) == b.end()) names += (names.empty() ? "" : ", ") + name;
    return names.empty() ? std::string("none") : names;
  };
  throw Error(cat("--data ", spec, ": the test classes differ from the train classes (only in train: ",
                  only_in(train.classes(), test.classes()), "; only in test: ", only_in(test.classes(), train.classes()),
                  "); both folders need the same class sub-folders"));
}

}  // namespace

Transforms DataSource::train_transforms(bool augment) const {
  Transforms t;
  if (augment && images) {
    const Shape s = train->shape();
    t.push_back(std::make_shared<RandomCrop>(s[1], s[2], s[1] >= 32 ? 4 : 2));
    t.push_back(std::make_shared<RandomHorizontalFlip>(0.5f));
  }
  if (!mean.empty()) t.push_back(std::make_shared<Normalize>(mean, std));
  return t;
}

Transforms DataSource::eval_transforms() const { return train_transforms(false); }

namespace {

DataSource open_base_data(const std::string& spec, bool with_train);

}  // namespace

DataSource open_data(const std::string& spec, DataSplits splits) {
  // BASE+VARIANT+VARIANT...: the base data set, then each variant in turn (variants.h).
  const size_t plus = spec.find('+');
  DataSource d = open_base_data(spec.substr(0, plus), splits == DataSplits::TrainAndTest);
  d.spec = spec;
  for (size_t start = plus; start != std::string::npos;) {
    const size_t next = spec.find('+', start + 1);
    apply_variant(d, spec.substr(start + 1, next == std::string::npos ? std::string::npos : next - start - 1), spec);
    start = next;
  }
  return d;
}

namespace {

DataSource open_base_data(const std::string& spec, bool with_train) {
  const std::vector<std::string> p = split_spec(spec);
  const std::string& kind = p[0];
  DataSource d;
  d.spec = spec;
  auto need = [&](size_t count, const char* form) {
    if (p.size() < count || p.size() > count + 1)
      throw UsageError(cat("--data ", spec, ": expected ", form));
  };
  if (kind == "fashion-mnist" || kind == "mnist") {
    if (p.size() > 2) throw UsageError(cat("--data ", spec, ": expected ", kind, "[:FOLDER]"));
    const std::string folder = p.size() == 2 ? p[1] : (kind == "mnist" ? "" : fashion_mnist_default_folder);
    if (folder.empty()) throw UsageError(cat("--data ", spec, ": mnist needs a folder (mnist:FOLDER)"));
    d.test = kind == "mnist" ? mnist("test", folder) : fashion_mnist("test", folder);
    d.train = !with_train ? d.test : kind == "mnist" ? mnist("train", folder) : fashion_mnist("train", folder);
    d.mean = kind == "mnist" ? std::vector<float>{0.1307f} : std::vector<float>{0.2860f};
    d.std = kind == "mnist" ? std::vector<float>{0.3081f} : std::vector<float>{0.3530f};
    d.images = true;
  } else if (kind == "cifar10") {
    need(2, "cifar10:FOLDER");
    d.test = cifar10(p[1], "test");
    d.train = with_train ? cifar10(p[1], "train") : d.test;
    d.mean = {0.4914f, 0.4822f, 0.4465f};
    d.std = {0.2470f, 0.2435f, 0.2616f};
    d.images = true;
  } else if (kind == "images") {
    need(2, "images:ROOT[:SIZE]");
    const int64_t size = p.size() == 3 ? positive(spec, p[2], "SIZE") : 32;
    auto test = std::make_shared<ImageFolder>(p[1] + "/test", 3, size, size);
    d.test = test;
    d.train = test;
    if (with_train) {
      auto train = std::make_shared<ImageFolder>(p[1] + "/train", 3, size, size);
      check_same_classes(spec, *train, *test);
      d.train = train;
    }
    d.mean = {0.5f, 0.5f, 0.5f};
    d.std = {0.5f, 0.5f, 0.5f};
    d.images = true;
  } else if (kind == "modadd") {
    if (p.size() > 2) throw UsageError(cat("--data ", spec, ": expected modadd[:P]"));
    const int64_t modulus = p.size() == 2 ? positive(spec, p[1], "P") : 113;
    d.train = std::make_shared<ModularAddition>(modulus, "train", 0.3, 0);
    d.test = std::make_shared<ModularAddition>(modulus, "validation", 0.3, 0);
  } else if (kind == "text") {
    need(2, "text:FILE[:LEN]");
    const int64_t len = p.size() == 3 ? positive(spec, p[2], "LEN") : 64;
    d.train = text_corpus(p[1], len, "train", 0.1);
    d.test = text_corpus(p[1], len, "validation", 0.1);
  } else {
    throw UsageError(cat("--data ", spec,
                         ": unknown data set (fashion-mnist[:FOLDER], mnist:FOLDER, cifar10:FOLDER, "
                         "images:ROOT[:SIZE], modadd[:P], text:FILE[:LEN], each optionally followed by "
                         "+VARIANT)"));
  }
  return d;
}

}  // namespace

}  // namespace adjoint
