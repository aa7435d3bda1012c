#include "engine/data/open.h"

#include <algorithm>
#include <filesystem>

#include "engine/data/cifar.h"
#include "engine/data/idx.h"
#include "engine/data/image_folder.h"
#include "engine/data/imagenet.h"
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

Transforms DataSource::train_transforms(bool augment, RescaleRange rescale) const {
  Transforms t;
  if (augment && images) {
    const Shape s = train->shape();
    t.push_back(std::make_shared<RandomCrop>(s[1], s[2], s[1] >= 32 ? 4 : 2));
    t.push_back(std::make_shared<RandomHorizontalFlip>(0.5f));
  }
  if (rescale.active() && images) t.push_back(std::make_shared<RandomRescale>(rescale));
  if (!mean.empty()) t.push_back(std::make_shared<Normalize>(mean, std));
  return t;
}

Transforms DataSource::eval_transforms() const { return train_transforms(false); }

namespace {

// One family of data sets: its name on the command line, the form its spec takes, how it
// opens, and its class names where the family has them (known without reading a file, so
// a figure of a checkpoint names its classes on a machine without the data).
struct DataFamily {
  const char* name;
  const char* form;  // for messages
  DataSource (*open)(const std::string& spec, const std::vector<std::string>& parts, bool with_train);
  std::vector<std::string> (*class_names)(const std::vector<std::string>& parts);
};

// The spec's parts must number between `least` and `least + optional`.
void expect_parts(const std::string& spec, const std::vector<std::string>& parts, size_t least, size_t optional,
                  const char* form) {
  if (parts.size() < least || parts.size() > least + optional)
    throw UsageError(cat("--data ", spec, ": expected ", form));
}

DataSource open_idx_images(const std::string& spec, const std::vector<std::string>& p, bool with_train,
                           bool fashion) {
  expect_parts(spec, p, fashion ? 1 : 2, fashion ? 1 : 0, fashion ? "fashion-mnist[:FOLDER]" : "mnist:FOLDER");
  const std::string folder = p.size() == 2 ? p[1] : fashion_mnist_default_folder;
  const auto open_split = [&](const char* split) { return fashion ? fashion_mnist(split, folder) : mnist(split, folder); };
  DataSource d;
  d.test = open_split("test");
  d.train = with_train ? open_split("train") : d.test;
  d.mean = {fashion ? 0.2860f : 0.1307f};
  d.std = {fashion ? 0.3530f : 0.3081f};
  d.images = true;
  return d;
}

DataSource open_cifar10(const std::string& spec, const std::vector<std::string>& p, bool with_train) {
  expect_parts(spec, p, 2, 0, "cifar10:FOLDER");
  DataSource d;
  d.test = cifar10(p[1], "test");
  d.train = with_train ? cifar10(p[1], "train") : d.test;
  d.mean = {0.4914f, 0.4822f, 0.4465f};
  d.std = {0.2470f, 0.2435f, 0.2616f};
  d.images = true;
  return d;
}

DataSource open_image_folders(const std::string& spec, const std::vector<std::string>& p, bool with_train) {
  expect_parts(spec, p, 2, 1, "images:ROOT[:SIZE]");
  const int64_t size = p.size() == 3 ? positive(spec, p[2], "SIZE") : 32;
  DataSource d;
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
  return d;
}

// ImageNet's layout: ROOT/val/<wnid>/*.JPEG, and ROOT/train/<wnid>/... when a command
// trains. Labels are positions among the sorted wnids, the order of the pretrained heads.
DataSource open_imagenet(const std::string& spec, const std::vector<std::string>& p, bool with_train) {
  expect_parts(spec, p, 2, 1, "imagenet:ROOT[:PRESET]");
  const EvalPreset* found = nullptr;
  try {
    found = &eval_preset(p.size() == 3 ? p[2] : kDefaultEvalPreset);
  } catch (const UsageError& e) {
    throw UsageError(cat("--data ", spec, ": ", e.what()));
  }
  const EvalPreset& preset = *found;
  DataSource d;
  auto val = std::make_shared<ImageFolder>(p[1] + "/val", preset);
  d.test = val;
  d.train = val;
  if (with_train) {
    std::error_code error;
    if (!std::filesystem::is_directory(p[1] + "/train", error))
      throw Error(cat("--data ", spec, ": ", p[1], "/train is missing; this command trains, and ImageNet's training "
                      "images go there (ROOT/train/<wnid>/*.JPEG)"));
    auto train = std::make_shared<ImageFolder>(p[1] + "/train", preset);
    check_same_classes(spec, *train, *val);
    d.train = train;
  }
  d.mean.assign(preset.mean.begin(), preset.mean.end());
  d.std.assign(preset.std.begin(), preset.std.end());
  d.images = true;
  return d;
}

// The human-readable names where the folder holds ImageNet-1k's 1000 classes (or is not
// there to read); the folder names (wnids) for a folder of other classes, since the names'
// list is by label, not by wnid, and a subset's labels are not ImageNet's.
std::vector<std::string> imagenet_names(const std::vector<std::string>& p) {
  std::vector<std::string> wnids;
  std::error_code error;
  if (p.size() < 2 || !std::filesystem::is_directory(p[1] + "/val", error)) return imagenet_class_names();
  for (const auto& entry : std::filesystem::directory_iterator(p[1] + "/val", error))
    if (entry.is_directory(error)) wnids.push_back(entry.path().filename().string());
  if (wnids.size() == imagenet_class_names().size()) return imagenet_class_names();
  std::sort(wnids.begin(), wnids.end());
  return wnids;
}

DataSource open_modular_addition(const std::string& spec, const std::vector<std::string>& p, bool) {
  expect_parts(spec, p, 1, 1, "modadd[:P]");
  const int64_t modulus = p.size() == 2 ? positive(spec, p[1], "P") : 113;
  DataSource d;
  d.train = std::make_shared<ModularAddition>(modulus, "train", 0.3, 0);
  d.test = std::make_shared<ModularAddition>(modulus, "validation", 0.3, 0);
  return d;
}

DataSource open_text(const std::string& spec, const std::vector<std::string>& p, bool) {
  expect_parts(spec, p, 2, 1, "text:FILE[:LEN]");
  const int64_t len = p.size() == 3 ? positive(spec, p[2], "LEN") : 64;
  DataSource d;
  d.train = text_corpus(p[1], len, "train", 0.1);
  d.test = text_corpus(p[1], len, "validation", 0.1);
  return d;
}

// Debian's `fortunes` package: English quotations, jokes and literature, real language for
// the language models with nothing downloaded. Its collections are read in name order,
// leaving out the index files (.dat), the UTF-8 copies (.u8) and the ASCII-art collections,
// whose lines are pictures, not language. FOLDER is for tests.
constexpr const char* kFortunesFolder = "/usr/share/games/fortunes";

std::vector<std::string> fortune_collections(const std::string& spec, const std::string& folder) {
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error))
    throw Error(cat("--data ", spec, ": ", folder, " is missing: install Debian's fortunes package (apt-get install fortunes)"));
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    const std::string extension = entry.path().extension().string();
    if (!entry.is_regular_file(error) || extension == ".dat" || extension == ".u8" || name.find("art") != std::string::npos)
      continue;
    files.push_back(entry.path().string());
  }
  if (files.empty()) throw Error(cat("--data ", spec, ": ", folder, " holds no fortune collections"));
  std::sort(files.begin(), files.end());
  return files;
}

DataSource open_fortunes(const std::string& spec, const std::vector<std::string>& p, bool) {
  expect_parts(spec, p, 1, 2, "fortunes[:LEN[:FOLDER]]");
  const int64_t len = p.size() >= 2 ? positive(spec, p[1], "LEN") : 64;
  const std::vector<std::string> files = fortune_collections(spec, p.size() == 3 ? p[2] : kFortunesFolder);
  DataSource d;
  d.train = text_corpus(files, "fortunes", len, "train", 0.1);
  d.test = text_corpus(files, "fortunes", len, "validation", 0.1);
  return d;
}

std::vector<std::string> no_class_names(const std::vector<std::string>&) { return {}; }

const std::vector<DataFamily>& data_families() {
  static const std::vector<DataFamily> families = {
      {"fashion-mnist", "fashion-mnist[:FOLDER]",
       [](const std::string& spec, const std::vector<std::string>& p, bool train) {
         return open_idx_images(spec, p, train, true);
       },
       [](const std::vector<std::string>&) {
         return std::vector<std::string>{"T-shirt/top", "trouser", "pullover", "dress", "coat",
                                         "sandal",      "shirt",   "sneaker",  "bag",   "ankle boot"};
       }},
      {"mnist", "mnist:FOLDER",
       [](const std::string& spec, const std::vector<std::string>& p, bool train) {
         return open_idx_images(spec, p, train, false);
       },
       [](const std::vector<std::string>&) {
         return std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
       }},
      {"cifar10", "cifar10:FOLDER", open_cifar10,
       [](const std::vector<std::string>&) {
         return std::vector<std::string>{"airplane", "automobile", "bird",  "cat",  "deer",
                                         "dog",      "frog",       "horse", "ship", "truck"};
       }},
      // The class folders' names, in ImageFolder's order, where the folder is there to read.
      {"images", "images:ROOT[:SIZE]", open_image_folders,
       [](const std::vector<std::string>& p) {
         std::vector<std::string> names;
         std::error_code error;
         if (p.size() < 2 || !std::filesystem::is_directory(p[1] + "/test", error)) return names;
         for (const auto& entry : std::filesystem::directory_iterator(p[1] + "/test", error))
           if (entry.is_directory(error)) names.push_back(entry.path().filename().string());
         std::sort(names.begin(), names.end());
         return names;
       }},
      {"imagenet", "imagenet:ROOT[:PRESET]", open_imagenet, imagenet_names},
      {"modadd", "modadd[:P]", open_modular_addition, no_class_names},
      {"text", "text:FILE[:LEN]", open_text, no_class_names},
      {"fortunes", "fortunes[:LEN[:FOLDER]]", open_fortunes, no_class_names},
  };
  return families;
}

// The family a spec (without its variants) names; UsageError listing them for an unknown one.
const DataFamily& family_of(const std::string& base_spec) {
  const std::string kind = split_spec(base_spec)[0];
  for (const DataFamily& f : data_families())
    if (kind == f.name) return f;
  std::string forms;
  for (const DataFamily& f : data_families()) forms += cat(forms.empty() ? "" : ", ", f.form);
  throw UsageError(cat("--data ", base_spec, ": unknown data set (", forms, ", each optionally followed by +VARIANT)"));
}

DataSource open_base_data(const std::string& spec, bool with_train) {
  DataSource d = family_of(spec).open(spec, split_spec(spec), with_train);
  d.spec = spec;
  return d;
}

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

std::vector<std::string> class_names_of(const std::string& spec) {
  const std::string base = spec.substr(0, spec.find('+'));
  return family_of(base).class_names(split_spec(base));
}

std::vector<std::string> class_names_if_known(const std::string& spec) {
  if (spec.empty()) return {};
  try {
    return class_names_of(spec);
  } catch (const UsageError&) {  // an unknown data set is reported where it is opened, not here
    return {};
  }
}

std::string class_name(const std::vector<std::string>& names, int64_t label) {
  if (label >= 0 && label < int64_t(names.size())) return names[size_t(label)];
  return cat("class ", label);
}

}  // namespace adjoint
