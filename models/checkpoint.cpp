#include "models/checkpoint.h"

#include <zlib.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <set>

#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "engine/threads.h"

namespace adjoint {

namespace {
constexpr const char* kFormat = "adjoint-checkpoint-1";
constexpr const char* kChecksumKey = "tensors.crc32";

// CRC-32 of the tensors as stored, in name order: each one's name, shape and float32 values.
// It finds any damage up to 32 bits long (one flipped bit included), which the finite-value
// check of load_state_dict misses when the damage leaves a number finite.
std::string tensors_checksum(const std::map<std::string, Tensor>& tensors) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto add = [&crc](const void* bytes, size_t count) {
    const auto* p = static_cast<const Bytef*>(bytes);
    for (size_t done = 0; done < count;) {  // crc32 takes at most a uInt of bytes at a time
      const uInt chunk = uInt(std::min<size_t>(count - done, size_t(1) << 30));
      crc = crc32(crc, p + done, chunk);
      done += chunk;
    }
  };
  for (const auto& [name, t] : tensors) {
    add(name.c_str(), name.size() + 1);
    for (int64_t d : t.shape()) add(&d, sizeof d);
    const Tensor values = t.contiguous();
    add(values.data(), size_t(values.numel()) * sizeof(float));
  }
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08lx", static_cast<unsigned long>(crc & 0xffffffffUL));
  return hex;
}

// Appends "label: a, b, c (+N more)" for a non-empty list.
void list_names(std::string& out, const char* label, const std::vector<std::string>& names) {
  if (names.empty()) return;
  out += cat("; ", label, ": ");
  for (size_t i = 0; i < names.size() && i < 12; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 12) out += cat(" (+", names.size() - 12, " more)");
}

int64_t metadata_int(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  check(it != meta.end(), "checkpoint ", path, ": metadata has no '", key, "'");
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    throw Error(cat("checkpoint ", path, ": metadata '", key, "' is not an integer: '", it->second, "'"));
  }
}
}  // namespace

namespace {

// Throws the Error listing every missing, unexpected and mis-shaped name unless the names
// and shapes of `given` (shape_of gives each one's) are those of the module's `own`.
template <typename Given, typename ShapeOf>
void check_names_and_shapes(const std::map<std::string, Tensor>& own, const Given& given, ShapeOf shape_of,
                            const std::string& source) {
  std::vector<std::string> missing, unexpected, mis_shaped;
  for (const auto& [name, t] : own) {
    auto it = given.find(name);
    // Exports from before PyTorch 0.4.1 have no num_batches_tracked; torch accepts that.
    if (it == given.end()) {
      if (name.size() < 19 || name.substr(name.size() - 19) != "num_batches_tracked") missing.push_back(name);
    }
    else if (shape_of(it->second) != t.shape())
      mis_shaped.push_back(cat(name, " ", shape_of(it->second), " vs model ", t.shape()));
  }
  for (const auto& [name, t] : given)
    if (!own.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !mis_shaped.empty()) {
    std::string msg = cat("loading ", source, ": state dict does not match the model");
    list_names(msg, "missing", missing);
    list_names(msg, "unexpected", unexpected);
    list_names(msg, "wrong shape", mis_shaped);
    throw Error(msg);
  }
}

// Throws the Error naming tensor `name` of `source` when any of its `n` values is NaN or infinite.
void check_finite(const std::string& name, const float* values, int64_t n, const std::string& source) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(values[i]);
  if (bad > 0)
    throw Error(cat("loading ", source, ": tensor '", name, "' holds ", bad, " NaN or infinite value",
                    bad > 1 ? "s" : "", " of ", n, " (a diverged or corrupted model)"));
}

}  // namespace

void load_state_dict(Module& module, const std::map<std::string, Tensor>& tensors, const std::string& source) {
  std::map<std::string, Tensor> own = module.state_dict();
  check_names_and_shapes(own, tensors, [](const Tensor& t) { return t.shape(); }, source);
  for (const auto& [name, t] : tensors) {
    const Tensor values = t.contiguous();
    check_finite(name, values.data(), values.numel(), source);
  }
  for (auto& [name, t] : own) {
    auto it = tensors.find(name);
    if (it == tensors.end()) continue;
    Tensor target = t;
    target.copy_from(it->second);
  }
}

void load_state_dict(Module& module, const StoredTensors& tensors, const std::string& source) {
  std::map<std::string, Tensor> own = module.state_dict();
  check_names_and_shapes(own, tensors, [](const StoredTensor& t) { return t.shape; }, source);
  std::vector<std::pair<std::string, Tensor>> targets;
  for (const auto& [name, t] : own)
    if (tensors.count(name)) targets.emplace_back(name, t);
  // Each tensor read into its own, over the threads; the first failure in name order is the
  // one reported, whatever the threads.
  std::vector<std::exception_ptr> failures(targets.size());
  parallel_for(int64_t(targets.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      auto& [name, target] = targets[size_t(i)];
      try {
        const StoredTensor& stored = tensors.at(name);
        Tensor landing = target.is_contiguous() ? target : Tensor::empty(target.shape());
        stored.read_into(landing.data());
        check_finite(name, landing.data(), landing.numel(), source);
        if (landing.data() != target.data()) target.copy_from(landing);
      } catch (...) {
        failures[size_t(i)] = std::current_exception();
      }
    }
  });
  for (const std::exception_ptr& failure : failures)
    if (failure) std::rethrow_exception(failure);
}

void save_checkpoint(const std::string& path, const Model& model, const Optimizer* optimizer, int64_t epoch,
                     int64_t step, std::map<std::string, std::string> metadata) {
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, t] : model.state_dict()) tensors["model." + name] = t;
  if (optimizer)
    for (const auto& [name, t] : optimizer->state()) tensors["optim." + name] = t;
  for (const auto& [key, value] : model.config().to_map()) metadata["config." + key] = value;
  metadata["format"] = kFormat;
  metadata["epoch"] = std::to_string(epoch);
  metadata["step"] = std::to_string(step);
  metadata[kChecksumKey] = tensors_checksum(tensors);
  write_safetensors(path, tensors, metadata);
}

Checkpoint load_checkpoint(const std::string& path) {
  SafetensorsFile file = read_safetensors(path);
  auto format = file.metadata.find("format");
  check(format != file.metadata.end() && format->second == kFormat, "checkpoint ", path,
        ": not an adjoint checkpoint (metadata 'format' is missing or not ", kFormat,
")");
  Checkpoint c;
  c.path = path;
  std::map<std::string, std::string> config;
  for (const auto& [key, value] : file.metadata)
    if (key.rfind("config.", 0) == 0) config[key.substr(7)] = value;
  check(config.count("arch"), "checkpoint ", path, ": metadata has no model config");
  try {
    c.config = ModelConfig::from_map(config);
  } catch (const Error& e) {
    throw Error(cat("checkpoint ", path, ": metadata: ", e.what()));
  }
  c.epoch = metadata_int(file.metadata, "epoch", path);
  c.step = metadata_int(file.metadata, "step", path);
  if (file.metadata.count("train.batches_per_epoch"))
    c.batches_per_epoch = metadata_int(file.metadata, "train.batches_per_epoch", path);
  c.metadata = file.metadata;
  if (auto recorded = file.metadata.find(kChecksumKey); recorded != file.metadata.end()) {
    const std::string actual = tensors_checksum(file.tensors);
    check(actual == recorded->second, "checkpoint ", path, ": its tensors do not match the crc32 its metadata records (",
          recorded->second, ", the file's ", actual, "): the file is damaged or was edited");
    c.checksum = actual;
  }
  for (auto& [name, t] : file.tensors) {
    require_floating_point(file, name, path);
    if (name.rfind("model.", 0) == 0) c.model[name.substr(6)] = t;
    else if (name.rfind("optim.", 0) == 0) c.optimizer[name.substr(6)] = t;
    else throw Error(cat("checkpoint ", path, ": unexpected tensor '", name, "'"));
  }
  return c;
}

std::shared_ptr<Model> model_from_checkpoint(const Checkpoint& checkpoint) {
  Generator gen(0);
  std::shared_ptr<Model> model;
  try {
    model = make_model(checkpoint.config, gen);
  } catch (const Error& e) {
    throw Error(cat("checkpoint ", checkpoint.path, ": metadata config.*: ", e.what()));
  }
  load_state_dict(*model, checkpoint.model, cat("checkpoint ", checkpoint.path, " (", checkpoint.config.arch, ")"));
  return model;
}

std::string training_position(int64_t step, int64_t epochs_completed, int64_t batches_per_epoch) {
  if (batches_per_epoch <= 0) return cat(epochs_completed, epochs_completed == 1 ? " epoch" : " epochs", " completed");
  if (step == 0) return "epoch 0 (no step taken)";
  const int64_t epoch = (step + batches_per_epoch - 1) / batches_per_epoch;  // the epoch the last step belongs to
  const int64_t done = step - (epoch - 1) * batches_per_epoch;
  if (done == batches_per_epoch) return cat("epoch ", epoch);
  return cat("epoch ", epoch, " (", done, " of ", batches_per_epoch, " batches)");
}

std::string training_position(const Checkpoint& checkpoint) {
  return training_position(checkpoint.step, checkpoint.epoch, checkpoint.batches_per_epoch);
}

}  // namespace adjoint
