// A model ready to run, and the inputs it takes, from files: what `predict` and `explain`
// (through tools/model_options.h), the examples and the experiment programs load.
//
//   the model   a checkpoint written by `adjoint train`, or a state dict with
//               torchvision/timm names for a model the config describes (a stitched
//               model: load_stitched_model in analysis/stitching/stitched_model.h)
//   the inputs  one tensor of a safetensors file (taken as already normalised), or
//               image files decoded to the model's size and normalised with the model's
//               statistics, or examples of a data set (normalised as in training)
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/data/imagenet.h"
#include "engine/data/open.h"
#include "engine/tensor.h"
#include "models/model.h"

namespace adjoint {

// "0.5,0.25" → {0.5, 0.25}; a UsageError naming `option` otherwise.
std::vector<float> parse_floats(const std::string& text, const char* option);

// A model ready to run (eval mode) with the normalisation its inputs need.
struct LoadedModel {
  std::shared_ptr<Model> model;
  std::vector<float> mean, std;  // per-channel normalisation (empty: none known)
  std::string data_spec;         // the data set a checkpoint was trained on (empty: unknown)
  std::string origin;            // "checkpoint FILE" or "weights FILE", for messages
  const EvalPreset* preset = nullptr;  // --preset: image files through its transform
};

// The first value of m.mean that is not finite or of m.std that is not positive and
// finite, described with the names given ("--std value 0 is not a positive number"); ""
// when all are fine.
std::string normalisation_problem(const LoadedModel& m, const char* mean_name, const char* std_name);

// A checkpoint written by `adjoint train`, in eval mode, with its normalisation and data set.
LoadedModel load_checkpoint_model(const std::string& path);
// The model `config` describes (classes, channels and image size included) with the state
// dict of the weights file `weights_path` (safetensors or torch.save's archive; `weights_key`
// names a state dict nested in it), in eval mode; no normalisation known.
LoadedModel load_weights_model(const ModelConfig& config, const std::string& weights_path,
                               const std::string& weights_key = "");

// One tensor of a safetensors file: `tensor` names it, or the file must hold exactly one.
Tensor load_input_tensor(const std::string& path, const std::string& tensor = "");

// Refuses inputs the model cannot take, naming `source` (the input file), the model and
// the shape it expects, before any layer fails with a message about its own weights.
void check_model_input(const LoadedModel& m, const Tensor& x, const std::string& source);

// Image files decoded to the model's channels and size (values in [0, 1]; with --preset
// through its resize and centre crop), then normalised with m.mean/m.std when known:
// (N, C, S, S).
Tensor load_image_files(const std::vector<std::string>& files, const LoadedModel& m);

// The class names of a data set's spec; without one, ImageNet's for a model of 1000
// classes whose images come through a --preset (the presets are ImageNet-1k weights').
std::vector<std::string> class_names_for(const LoadedModel& m, const std::string& data_spec);

// The first `count` examples (0: all) of a data set's split ("test" or "train"),
// normalised as for evaluation, with their labels; with a shuffle seed, the first of the
// split in the Loader's order for that seed (epoch 0).
struct Examples {
  Tensor inputs;
  std::vector<int64_t> labels;
};
Examples load_examples(const DataSource& data, const std::string& split, int64_t count,
                       std::optional<uint64_t> shuffle_seed = std::nullopt);

}  // namespace adjoint
