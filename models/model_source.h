// Where a command's model and inputs come from: shared by `predict` (tools/train.cpp) and
// `explain` (tools/explain.cpp), so both read the same options the same way.
//
//   the model   --checkpoint FILE, --stitch FILE (a stitched model: analysis/stitching/stitched_model.h),
//               or --model NAME --weights FILE (a torchvision/timm-named state dict) with
//               --classes/--in-channels/--image-size
//   the inputs  --input X.safetensors [--tensor NAME] (taken as already normalised), or
//               image files decoded to the model's size and normalised with the model's
//               statistics, or examples of a data set (normalised as in training)
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/open.h"
#include "engine/tensor.h"
#include "models/model.h"
#include "tools/cli.h"

namespace adjoint {

// Model-shape options (--model, --width, --patch, ...) shared by train, predict and explain.
const std::vector<cli::OptionSpec>& model_options();
// `own` with the model-shape options in front.
std::vector<cli::OptionSpec> with_model_options(std::vector<cli::OptionSpec> own);
// `own` with the model-shape options and the options load_model reads (--checkpoint,
// --weights, --classes, --in-channels, --image-size, --mean, --std) in front.
std::vector<cli::OptionSpec> with_model_source_options(std::vector<cli::OptionSpec> own);
// The config the model-shape options describe (data-dependent fields left at defaults).
ModelConfig model_config(const cli::Args& args);

// "0.5,0.25" → {0.5, 0.25}; a UsageError naming `option` otherwise.
std::vector<float> parse_floats(const std::string& text, const char* option);

// A model ready to run (eval mode) with the normalisation its inputs need.
struct LoadedModel {
  std::shared_ptr<Model> model;
  std::vector<float> mean, std;  // per-channel normalisation (empty: none known)
  std::string data_spec;         // the data set a checkpoint was trained on (empty: unknown)
  std::string origin;            // "checkpoint FILE" or "weights FILE", for messages
};

// Reads --checkpoint, --stitch, or --model/--weights/--classes/--in-channels/--image-size;
// then --mean/--std when the command has them and they are given.
LoadedModel load_model(const cli::Args& args);
// A checkpoint written by `adjoint train`, in eval mode, with its normalisation and data set.
LoadedModel load_checkpoint_model(const std::string& path);
// A stitch written by `adjoint stitch` (analysis/stitching/stitched_model.h): the front and end
// checkpoints its metadata names, joined at its blocks; inputs normalised as the front's.
LoadedModel load_stitched_model(const std::string& path);

// One tensor of a safetensors file: `tensor` names it, or the file must hold exactly one.
Tensor load_input_tensor(const std::string& path, const std::string& tensor = "");

// Refuses inputs the model cannot take, naming `source` (the input file), the model and
// the shape it expects, before any layer fails with a message about its own weights.
void check_model_input(const LoadedModel& m, const Tensor& x, const std::string& source);

// Image files decoded to the model's channels and size (values in [0, 1]), then
// normalised with m.mean/m.std when known: (N, C, S, S).
Tensor load_image_files(const std::vector<std::string>& files, const LoadedModel& m);

// The first `count` examples (0: all) of a data set's split ("test" or "train"),
// normalised as for evaluation, with their labels.
struct Examples {
  Tensor inputs;
  std::vector<int64_t> labels;
};
Examples load_examples(const DataSource& data, const std::string& split, int64_t count);

}  // namespace adjoint
