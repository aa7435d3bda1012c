// What made a result of the stitching sweep, and whether a result found on disk may stand
// for the one a run asks for.
//
// A cell, an IRI set and a stitch file each record exactly what made them (records.h): the
// checkpoints' content hashes (file_hash), the data spec, the blocks, and every option
// that changes their numbers, as given: the IRI search's options for an IRI set and for
// an invariance-aware stitch; the training options for a stitch; the scoring options for a
// cell. One function builds the record; analysis/common/provenance.h compares two: a result
// is reused only when its record equals the one the run would write; otherwise the sweep
// refuses in one line naming what differs (or, with --overwrite, makes it again).
#pragma once
#include <string>

#include "analysis/common/provenance.h"
#include "analysis/stitching/protocol.h"
#include "analysis/stitching/records.h"

namespace adjoint {

// What a record is about. `objective` and `protocol` are empty for an IRI set.
struct RecordSubject {
  enum Kind { iri_set, stitch, cell } kind = cell;
  size_t front_block = 0, end_block = 0;
  std::string objective, protocol;
};

// The record of `subject` made by a sweep of `front` into `end` on `data_spec` with `o`.
Provenance make_provenance(const Endpoint& front, const Endpoint& end, const std::string& data_spec,
                           const StitchSweepOptions& o, const RecordSubject& subject);

// An endpoint's content hash: its checksum when set, else file_hash of its name when that
// names a file; empty when neither (a model built in memory).
std::string endpoint_hash(const Endpoint& e);

}  // namespace adjoint
