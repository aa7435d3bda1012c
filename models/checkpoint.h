// Weights and checkpoints on disk, as safetensors.
//
// A weights file is a plain state dict (torchvision/timm names). A checkpoint adds the
// optimizer state ("optim.*" tensors beside "model.*") and metadata: the model config,
// epoch, step and RNG state, so that --resume continues bit for bit.
#pragma once
#include <map>
#include <string>

#include "engine/io/stored_tensor.h"
#include "engine/module.h"
#include "engine/optim.h"
#include "models/model.h"

namespace adjoint {

// Copies `tensors` into the module's parameters and buffers by name. Throws an Error that
// lists every missing, unexpected and mis-shaped name (as torch's load_state_dict does)
// unless all match, and one naming the first tensor holding NaN or infinity (a diverged
// or corrupted model would otherwise predict nonsense without a word); `source` names
// the file in the message.
void load_state_dict(Module& module, const std::map<std::string, Tensor>& tensors, const std::string& source);
// The same from a file's tensors not yet read (engine/io/stored_tensor.h): the names and
// shapes are checked first, then each tensor is read straight into the module's own, over
// the threads, and checked there. On a failure (a damaged storage, a value that is not
// finite) the module is left partly loaded; the Error names the first such tensor by name.
void load_state_dict(Module& module, const StoredTensors& tensors, const std::string& source);

struct Checkpoint {
  std::string path;  // the file it was read from, for messages
  ModelConfig config;
  std::map<std::string, Tensor> model;      // state dict
  std::map<std::string, Tensor> optimizer;  // optimizer state
  std::map<std::string, std::string> metadata;
  int64_t epoch = 0;  // epochs completed
  int64_t step = 0;   // optimizer steps taken
  // The run's batches per epoch (metadata "train.batches_per_epoch"); 0 where the file does
  // not say (checkpoints written before it was stored, or outside a training run).
  int64_t batches_per_epoch = 0;
  // The CRC-32 of the tensors (metadata "tensors.crc32"), checked when the file was read;
  // empty for a checkpoint written before it was recorded, which loads unchecked.
  std::string checksum;
};

// Where a run stands after `step` optimizer steps, in the words training prints after each
// epoch: "epoch 3" at the end of the third, "epoch 1 (150 of 468 batches)" within the first
// (a run cut short by --max-steps or --quick, or a --checkpoint-every save). Without the
// batches per epoch (0): "N epochs completed".
std::string training_position(int64_t step, int64_t epochs_completed, int64_t batches_per_epoch);
std::string training_position(const Checkpoint& checkpoint);

// Writes atomically (temporary file, then rename).
void save_checkpoint(const std::string& path, const Model& model, const Optimizer* optimizer,
                     int64_t epoch, int64_t step, std::map<std::string, std::string> extra_metadata = {});
// Refuses a file that is not an adjoint checkpoint, is truncated or corrupted (its tensors
// against the checksum its metadata records), naming the path and what is wrong.
Checkpoint load_checkpoint(const std::string& path);

// Builds the model a checkpoint describes and loads its weights. Metadata that describes
// no model is an Error naming the checkpoint (not a UsageError: the user gave no option).
std::shared_ptr<Model> model_from_checkpoint(const Checkpoint& checkpoint);

}  // namespace adjoint
