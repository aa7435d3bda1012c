#include "analysis/stitching/stitched_model.h"

#include <string>

#include "engine/error.h"
#include "engine/io/safetensors.h"

namespace adjoint {

namespace {

ModelConfig stitched_config(const StitchPair& pair) {
  ModelConfig c = pair.front().model->config();
  c.num_classes = pair.end().model->config().num_classes;
  c.arch = cat("stitched:", c.arch, "→", pair.end().model->config().arch);
  return c;
}

size_t block_entry(const SafetensorsFile& f, const std::string& path, const std::string& key) {
  const auto it = f.metadata.find(key);
  check(it != f.metadata.end(), "stitch file ", path, ": no '", key, "' in its metadata; it was not written by adjoint stitch");
  try {
    size_t used = 0;
    const unsigned long long block = std::stoull(it->second, &used);
    if (used == it->second.size()) return size_t(block);
  } catch (const std::exception&) {
  }
  throw Error(cat("stitch file ", path, ": metadata '", key, "' is '", it->second, "', not a block index"));
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

void write_stitch_file(const std::string& path, const StitchPair& pair, const Stitch& stitch,
                       const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> metadata = extra;
  metadata["front"] = pair.front().name;
  metadata["end"] = pair.end().name;
  metadata["front_block"] = std::to_string(pair.front_block());
  metadata["end_block"] = std::to_string(pair.end_block());
  metadata["where"] = pair.shapes().where;
  write_safetensors(path, {{"weight", stitch.weight}, {"bias", stitch.bias}}, metadata);
}

namespace {
// The weight and bias of a stitch file already read.
StitchFile parameters_of(const SafetensorsFile& f, const std::string& path) {
  StitchFile s;
  s.path = path;
  for (const char* name : {"weight", "bias"}) {
    check(f.tensors.count(name), "stitch file ", path, ": no tensor '", name, "'");
    require_floating_point(f, name, path);
  }
  s.weight = f.tensors.at("weight");
  s.bias = f.tensors.at("bias");
  return s;
}
}  // namespace

StitchFile read_stitch_parameters(const std::string& path) { return parameters_of(read_safetensors(path), path); }

StitchFile read_stitch_file(const std::string& path) {
  const SafetensorsFile f = read_safetensors(path);
  StitchFile s = parameters_of(f, path);
  for (const char* key : {"front", "end"})
    check(f.metadata.count(key), "stitch file ", path, ": no '", key, "' in its metadata; it was not written by adjoint stitch");
  s.front = f.metadata.at("front");
  s.end = f.metadata.at("end");
  s.front_block = block_entry(f, path, "front_block");
  s.end_block = block_entry(f, path, "end_block");
  return s;
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

}  // namespace adjoint
