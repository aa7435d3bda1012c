#include "analysis/stitching/provenance.h"

#include <filesystem>

#include "engine/error.h"

namespace adjoint {

namespace {

std::string numbers(const std::vector<double>& values) {
  std::string s;
  for (double v : values) {
    if (!s.empty()) s += ',';
    s += exact_text(v);
  }
  return s;
}

std::string transport_name(const Transport& t) {
  std::string name = to_string(t.kind);
  if (t.is_soft())
    name += cat(" tau relu ", exact_text(t.tau.relu), " gelu ", exact_text(t.tau.gelu), " silu ",
                exact_text(t.tau.silu), " max_pool ", exact_text(t.tau.max_pool), " attention ",
                exact_text(t.tau.attention));
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
    {"iri-step", reads_iris, [](const RecordContext& c) { return exact_text(c.o.iri.search.step); }},
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
    {"ridge", joins_models, [](const RecordContext& c) { return exact_text(c.o.ridge); }},
    {"init-images", joins_models, [](const RecordContext& c) { return cat(c.o.init_images); }},
    {"steps", joins_models, [](const RecordContext& c) { return cat(c.o.train.steps); }},
    {"epochs", joins_models, [](const RecordContext& c) { return cat(c.o.train.epochs); }},
    {"batch", joins_models, [](const RecordContext& c) { return cat(c.o.train.batch); }},
    {"lr", joins_models, [](const RecordContext& c) { return exact_text(c.o.train.lr); }},
    {"weight-decay", joins_models, [](const RecordContext& c) { return exact_text(c.o.train.weight_decay); }},
    {"temperature", soft_labels,
     [](const RecordContext& c) { return exact_text(c.o.train.objective_options.temperature); }},
    {"fula-weights", latent_alignment,
     [](const RecordContext& c) { return numbers(c.o.train.objective_options.fula_weights); }},
    {"fula-raw", latent_alignment,
     [](const RecordContext& c) { return std::string(c.o.train.objective_options.fula_normalise ? "no" : "yes"); }},
    {"test-images", scored, [](const RecordContext& c) { return cat(c.o.test_images); }},
    {"commit", scored, [](const RecordContext& c) { return c.o.commit; }},
    {"raua-eps", scored,
     [](const RecordContext& c) { return numbers(std::vector<double>(c.o.raua_eps.begin(), c.o.raua_eps.end())); }},
    {"raua-images", scored, [](const RecordContext& c) { return c.o.raua_eps.empty() ? "" : cat(c.o.raua_images); }},
    {"raua-attack", scored,
     [](const RecordContext& c) {
       const PgdOptions& a = c.o.raua_attack;
       return c.o.raua_eps.empty() ? std::string()
                                   : cat(a.norm, " steps ", a.steps, " step-size ", exact_text(a.step_size),
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

}  // namespace adjoint
