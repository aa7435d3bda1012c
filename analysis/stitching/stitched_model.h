// The stitched model F(x) = B_{>j}(S(A_{≤i}(x))) (docs/methods.md §2.1) as a Model of its own,
// so that everything that runs a model (predict, explain, the metrics) runs it too, and
// the file a trained stitch is kept in.
//
// Its blocks are the front model's blocks 0..i ("front.<name>"), the stitch ("stitch") and
// the end model's blocks after j ("end.<name>"); its parameters are those of the three
// modules under the same prefixes. Its inputs are normalised as the front model's are (the
// end model never sees the input). Its config is the front model's with the end model's
// classes, and arch "stitched:<front arch>→<end arch>" so that nothing mistakes it for a
// plain architecture (make_model cannot rebuild it: model-parameter randomisation refuses it).
//
// The stitch is affine (linear maps, a resize, reshapes, a mean), so each transport
// (gradient, pullback, soft pullback) carries a cotangent through it by the same linear
// map; the blocks of A and B keep their own rules.
//
// A stitch file (.safetensors, analysis/stitching/records.h) holds "weight" and "bias", and
// in its metadata the front and end models (their checkpoint paths and content hashes) and
// blocks, which is all it takes to rebuild the stitched model and to know it is the one.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "analysis/stitching/pair.h"
#include "analysis/stitching/records.h"
#include "models/model.h"
#include "models/model_source.h"

namespace adjoint {

class StitchedModel : public Model {
public:
  // `stitch` must join the pair's shapes (pair.shapes()).
  StitchedModel(const StitchPair& pair, std::shared_ptr<Stitch> stitch);
  const Stitch& stitch() const { return *stitch_; }

private:
  std::shared_ptr<Stitch> stitch_;
};

// Writes weight, bias, the models it joins and their blocks atomically, with the record of
// what made it (`made`, completed by the endpoints' content hashes and the blocks). A model
// given by a relative path is written relative to the stitch file's folder, so that the
// stitch and its checkpoints may move together.
void write_stitch_file(const std::string& path, const StitchPair& pair, const Stitch& stitch, const Provenance& made = {});

// A checkpoint path of a stitch file as a path to open: a relative one is relative to the
// stitch file's folder.
std::string stitch_checkpoint_path(const StitchFile& file, const std::string& checkpoint);

// The pair's stitch with the parameters of `file`; throws Error naming the file, the blocks
// and both shapes when they do not fit it.
std::shared_ptr<Stitch> load_stitch(const StitchPair& pair, const StitchFile& file);
// The stitched model of `pair` with the parameters of `file` (load_stitch).
std::shared_ptr<StitchedModel> stitched_model(const StitchPair& pair, const StitchFile& file);

// A stitch written by `adjoint stitch`, ready to run: the front and end checkpoints its
// metadata names, joined at its blocks; inputs normalised as the front's.
LoadedModel load_stitched_model(const std::string& path);

}  // namespace adjoint
