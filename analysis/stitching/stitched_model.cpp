#include "analysis/stitching/stitched_model.h"

#include <filesystem>
#include <string>

#include "analysis/stitching/provenance.h"
#include "engine/error.h"
#include "engine/io/safetensors.h"

namespace adjoint {

namespace fs = std::filesystem;

namespace {

ModelConfig stitched_config(const StitchPair& pair) {
  ModelConfig c = pair.front().model->config();
  c.num_classes = pair.end().model->config().num_classes;
  c.arch = cat("stitched:", c.arch, "→", pair.end().model->config().arch);
  return c;
}

}  // namespace

StitchedModel::StitchedModel(const StitchPair& pair, std::shared_ptr<Stitch> stitch)
    : Model(stitched_config(pair)), stitch_(std::move(stitch)) {
  const std::shared_ptr<Model> front = pair.front().model, end = pair.end().model;
  register_module("front", front);
  register_module("stitch", stitch_);
  register_module("end", end);
  // A block keeps its `with_next` where the block after it is copied too.
  auto copy = [&](const std::string& prefix, const Block& block, bool next_copied) {
    add_block(prefix + block.name, block.forward);
    if (next_copied && block.with_next) set_with_next(block.with_next);
  };
  for (size_t k = 0; k <= pair.front_block(); ++k) copy("front.", front->blocks()[k], k < pair.front_block());
  const Stitch* s = stitch_.get();
  add_block("stitch", [s](const Tensor& h) { return s->forward(h); });
  for (size_t k = pair.end_block() + 1; k < end->num_blocks(); ++k) copy("end.", end->blocks()[k], true);
  train(false);
}

void write_stitch_file(const std::string& path, const StitchPair& pair, const Stitch& stitch, const Provenance& made) {
  const fs::path folder = fs::absolute(fs::path(path)).parent_path();
  // A relative checkpoint path as seen from the stitch file's folder.
  auto reference = [&](const std::string& checkpoint) {
    std::error_code ec;
    if (fs::path(checkpoint).is_absolute() || !fs::is_regular_file(checkpoint, ec)) return checkpoint;
    return fs::absolute(checkpoint).lexically_normal().lexically_relative(folder.lexically_normal()).string();
  };
  Provenance record = made;
  record["front.checkpoint"] = endpoint_hash(pair.front());
  record["end.checkpoint"] = endpoint_hash(pair.end());
  record["front.block"] = std::to_string(pair.front_block());
  record["end.block"] = std::to_string(pair.end_block());
  std::map<std::string, std::string> metadata;
  add_provenance(metadata, record);
  metadata["front"] = reference(pair.front().name);
  metadata["end"] = reference(pair.end().name);
  metadata["front_block"] = std::to_string(pair.front_block());
  metadata["end_block"] = std::to_string(pair.end_block());
  metadata["where"] = pair.shapes().where;
  write_safetensors(path, {{"weight", stitch.weight}, {"bias", stitch.bias}}, metadata);
}

std::string stitch_checkpoint_path(const StitchFile& file, const std::string& checkpoint) {
  if (fs::path(checkpoint).is_absolute()) return checkpoint;
  return (fs::path(file.path).parent_path() / checkpoint).lexically_normal().string();
}

std::shared_ptr<Stitch> load_stitch(const StitchPair& pair, const StitchFile& file) {
  auto stitch = std::make_shared<Stitch>(pair.shapes());
  check(file.weight.shape() == stitch->weight.shape() && file.bias.shape() == stitch->bias.shape(), "stitch file ",
        file.path, ": weight ", file.weight.shape(), " and bias ", file.bias.shape(), " do not fit the stitch ",
        pair.shapes().where, " from ", pair.shapes().front, " to ", pair.shapes().end, ", which needs weight ",
        stitch->weight.shape(), " and bias ", stitch->bias.shape());
  stitch->weight.copy_from(file.weight);
  stitch->bias.copy_from(file.bias);
  stitch->train(false);
  return stitch;
}

std::shared_ptr<StitchedModel> stitched_model(const StitchPair& pair, const StitchFile& file) {
  return std::make_shared<StitchedModel>(pair, load_stitch(pair, file));
}

LoadedModel load_stitched_model(const std::string& path) {
  const StitchFile file = read_stitch_file(path);
  // Each model from its path (relative ones: to the stitch file's folder), and only when its
  // content is the checkpoint's the stitch was trained between.
  const auto load = [&](const std::string& checkpoint, const std::string& hash, const char* role) {
    const std::string resolved = stitch_checkpoint_path(file, checkpoint);
    LoadedModel m;
    try {
      m = load_checkpoint_model(resolved);
    } catch (const Error& e) {
      throw Error(cat("stitch file ", path, ": its ", role, " model: ", e.what()));
    }
    check(!hash.empty(), "stitch file ", path, " records no content hash of its ", role, " model ", resolved,
          ", so it cannot tell that model from another; make it again with adjoint stitch --overwrite");
    const std::string found = file_hash(resolved);
    check(found == hash, "stitch file ", path, ": its ", role, " model ", resolved, " is not the checkpoint it was trained "
          "with (content hash ", found, ", the stitch records ", hash, ")");
    return std::make_pair(resolved, m);
  };
  const auto [front_path, front] = load(file.front, file.front_hash, "front");
  const auto [end_path, end] = load(file.end, file.end_hash, "end");
  const ModelConfig& c = front.model->config();
  const StitchPair pair({front_path, front.model, front.mean, front.std}, file.front_block,
                        {end_path, end.model, end.mean, end.std}, file.end_block,
                        {c.in_channels, c.image_size, c.image_size});
  LoadedModel m;
  m.model = stitched_model(pair, file);
  m.mean = front.mean;  // the stitched model's inputs are the front model's
  m.std = front.std;
  m.data_spec = front.data_spec;
  m.origin = cat("stitch ", path, ": ", pair.shapes().where);
  return m;
}

}  // namespace adjoint
