#include "analysis/stitching/provenance.h"

#include <charconv>
#include <filesystem>

#include "engine/error.h"

namespace adjoint {

namespace {

// The shortest text that reads back as the same double: 0.001, not 0.0010000000000000000208.
std::string exact(double v) {
  char text[64];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, v);
  return std::string(text, end);
}

std::string numbers(const std::vector<double>& values) {
  std::string s;
  for (double v : values) {
    if (!s.empty()) s += ',';
    s += exact(v);
  }
  return s;
}

std::string transport_name(const Transport& t) {
  std::string name = to_string(t.kind);
  if (t.is_soft())
    name += cat(" tau relu ", exact(t.tau.relu), " gelu ", exact(t.tau.gelu), " silu ", exact(t.tau.silu), " max_pool ",
                exact(t.tau.max_pool), " attention ", exact(t.tau.attention));
  return name;
}

struct RecordContext {
  const Endpoint& front;
  const Endpoint& end;
  const std::string& data;
  const StitchSweepOptions& o;
  const RecordSubject& s;
};

using Subject = RecordSubject;

// Which records an entry belongs to.
bool always(const Subject&) { return true; }
bool joins_models(const Subject& s) { return s.kind != Subject::iri_set; }
bool scored(const Subject& s) { return s.kind == Subject::cell; }
bool reads_iri_images(const Subject& s) {
  return s.kind == Subject::iri_set || s.protocol == "control" || s.protocol == "invariance";
}
bool reads_iris(const Subject& s) { return s.kind == Subject::iri_set || s.protocol == "invariance"; }
bool reads_standard_images(const Subject& s) { return joins_models(s) && s.protocol == "standard"; }
bool soft_labels(const Subject& s) { return joins_models(s) && s.objective == "slm"; }
bool latent_alignment(const Subject& s) { return joins_models(s) && s.objective == "fula"; }

struct RecordEntry {
  const char* key;  // the option's name where it is one
  bool (*belongs)(const Subject&);
  std::string (*value)(const RecordContext&);
};

// Every entry that changes the numbers of an IRI set, a stitch or a cell.
const RecordEntry kEntries[] = {
    {"front.checkpoint", always, [](const RecordContext& c) { return endpoint_hash(c.front); }},
    {"front.block", always, [](const RecordContext& c) { return cat(c.s.front_block); }},
    {"data", always, [](const RecordContext& c) { return c.data; }},
    {"seed", always, [](const RecordContext& c) { return cat(c.o.train.seed); }},
    {"iri-images", reads_iri_images, [](const RecordContext& c) { return cat(c.o.iri_images); }},
    {"iri-rule", reads_iris, [](const RecordContext& c) { return c.o.iri.search.rule; }},
    {"iri-steps", reads_iris, [](const RecordContext& c) { return cat(c.o.iri.search.steps); }},
    {"iri-step", reads_iris, [](const RecordContext& c) { return exact(c.o.iri.search.step); }},
    {"iri-transport", reads_iris, [](const RecordContext& c) { return transport_name(c.o.iri.search.transport); }},
    {"iri-start", reads_iris, [](const RecordContext& c) { return c.o.iri.start; }},
    {"iri-batch", reads_iris, [](const RecordContext& c) { return cat(c.o.iri.batch); }},
    {"iri-seed", reads_iris, [](const RecordContext& c) { return cat(c.o.iri.seed); }},
    {"end.checkpoint", joins_models, [](const RecordContext& c) { return endpoint_hash(c.end); }},
    {"end.block", joins_models, [](const RecordContext& c) { return cat(c.s.end_block); }},
    {"objective", joins_models, [](const RecordContext& c) { return c.s.objective; }},
    {"protocol", joins_models, [](const RecordContext& c) { return c.s.protocol; }},
    {"train-images", reads_standard_images, [](const RecordContext& c) { return cat(c.o.train_images); }},
    {"init", joins_models, [](const RecordContext& c) { return c.o.init; }},
    {"ridge", joins_models, [](const RecordContext& c) { return exact(c.o.ridge); }},
    {"init-images", joins_models, [](const RecordContext& c) { return cat(c.o.init_images); }},
    {"steps", joins_models, [](const RecordContext& c) { return cat(c.o.train.steps); }},
    {"epochs", joins_models, [](const RecordContext& c) { return cat(c.o.train.epochs); }},
    {"batch", joins_models, [](const RecordContext& c) { return cat(c.o.train.batch); }},
    {"lr", joins_models, [](const RecordContext& c) { return exact(c.o.train.lr); }},
    {"weight-decay", joins_models, [](const RecordContext& c) { return exact(c.o.train.weight_decay); }},
    {"temperature", soft_labels, [](const RecordContext& c) { return exact(c.o.train.objective_options.temperature); }},
    {"fula-weights", latent_alignment,
     [](const RecordContext& c) { return numbers(c.o.train.objective_options.fula_weights); }},
    {"fula-raw", latent_alignment,
     [](const RecordContext& c) { return std::string(c.o.train.objective_options.fula_normalise ? "no" : "yes"); }},
    {"test-images", scored, [](const RecordContext& c) { return cat(c.o.test_images); }},
    {"raua-eps", scored,
     [](const RecordContext& c) { return numbers(std::vector<double>(c.o.raua_eps.begin(), c.o.raua_eps.end())); }},
    {"raua-images", scored, [](const RecordContext& c) { return c.o.raua_eps.empty() ? "" : cat(c.o.raua_images); }},
    {"raua-attack", scored,
     [](const RecordContext& c) {
       const PgdOptions& a = c.o.raua_attack;
       return c.o.raua_eps.empty() ? std::string()
                                   : cat(a.norm, " steps ", a.steps, " step-size ", exact(a.step_size),
                                         a.random_start ? " random-start" : "", " seed ", a.seed);
     }},
};

}  // namespace

std::string endpoint_hash(const Endpoint& e) {
  if (!e.checksum.empty()) return e.checksum;
  std::error_code ec;
  return std::filesystem::is_regular_file(e.name, ec) ? file_hash(e.name) : "";
}

Provenance make_provenance(const Endpoint& front, const Endpoint& end, const std::string& data_spec,
                           const StitchSweepOptions& o, const RecordSubject& subject) {
  const RecordContext context{front, end, data_spec, o, subject};
  Provenance record;
  for (const RecordEntry& e : kEntries)
    if (e.belongs(subject)) record[e.key] = e.value(context);
  return record;
}

std::string provenance_difference(const Provenance& recorded, const Provenance& wanted) {
  if (recorded.empty() && !wanted.empty()) return "it holds no record of what made it (an older adjoint wrote it)";
  std::vector<std::string> differences;
  auto note = [&](const std::string& key, const std::string& was, const std::string& now) {
    differences.push_back(cat(key, " was ", was.empty() ? "(none)" : was, ", now ", now.empty() ? "(none)" : now));
  };
  for (const auto& [key, value] : wanted) {
    const auto it = recorded.find(key);
    if (it == recorded.end()) note(key, "not recorded", value);
    else if (it->second != value) note(key, it->second, value);
  }
  for (const auto& [key, value] : recorded)
    if (!wanted.count(key)) note(key, value, "not asked for");
  std::string text;
  for (size_t k = 0; k < differences.size() && k < 3; ++k) {
    if (k > 0) text += "; ";
    text += differences[k];
  }
  if (differences.size() > 3) text += cat("; and ", differences.size() - 3, " more");
  return text;
}

bool may_reuse(const std::string& path, const Provenance& recorded, const Provenance& wanted, bool overwrite,
               const std::function<void(const std::string&)>& log) {
  const std::string difference = provenance_difference(recorded, wanted);
  if (difference.empty()) return true;
  if (!overwrite)
    throw UsageError(cat("stitch: ", path, " was made by another run: ", difference,
                         "; give --overwrite to make it again, or another --out"));
  if (log) log(cat("remaking ", path, " (--overwrite): ", difference));
  return false;
}

}  // namespace adjoint
