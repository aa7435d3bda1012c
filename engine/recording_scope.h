// Which leaves a recorded graph is for. Inside a RecordingFor scope the graph is recorded for
// the cotangent of one leaf alone (an explained input): every other leaf, the model's
// parameters among them, counts as a constant while recording, so no node reaches it and an
// op keeps only what the cotangents of its recorded inputs read (a convolution under it keeps
// no input, which only its weight's gradient reads). Per thread, like the recording switch.
#pragma once
#include "engine/tensor.h"

namespace adjoint {

class RecordingFor {
public:
  explicit RecordingFor(const Tensor& leaf);
  ~RecordingFor();
  RecordingFor(const RecordingFor&) = delete;
  RecordingFor& operator=(const RecordingFor&) = delete;

private:
  const TensorImpl* previous_;
};

// Whether t takes part in the graph being recorded: an op output with history, or a leaf
// that requires grad and, inside a RecordingFor scope, is that scope's leaf.
bool takes_part(const Tensor& t);

}  // namespace adjoint
