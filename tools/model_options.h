// Where a command's model and inputs come from: the options shared by `predict`
// (tools/train.cpp) and `explain` (tools/explain.cpp), so both read them the same way. The
// loading itself is models/model_source.h's (and analysis/stitching/stitched_model.h's for
// a stitch).
//
//   the model   --checkpoint FILE, --stitch FILE (a stitched model: analysis/stitching/stitched_model.h),
//               or --model NAME --weights FILE (a torchvision/timm-named state dict) with
//               --classes/--in-channels/--image-size
//   the inputs  --input X.safetensors [--tensor NAME] (taken as already normalised), or
//               image files decoded to the model's size and normalised with the model's
//               statistics, or examples of a data set (normalised as in training)
#pragma once
#include <vector>

#include "models/model.h"
#include "models/model_source.h"
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

// Reads --checkpoint, --stitch, or --model/--weights/--classes/--in-channels/--image-size;
// then --mean/--std when the command has them and they are given.
LoadedModel load_model(const cli::Args& args);

}  // namespace adjoint
