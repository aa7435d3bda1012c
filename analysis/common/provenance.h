// What made a result written to disk, and whether a result found there may stand for the
// one a run asks for: the part of the provenance rules every analysis shares.
//
// A result read back later (a stitching cell, an IRI set, a stitch file, a cell of an
// explanation report) records what made it as a Provenance: the checkpoints' content
// hashes (file_hash), the data spec and every option that changes its numbers. Each
// analysis builds its own record (analysis/stitching/provenance.h,
// analysis/pullbacks/cells.h); this file compares two: a result is reused only when its
// record equals the one the run would write; otherwise the command refuses in one line
// naming what differs (or, with --overwrite, makes it again).
//
// This file needs the engine alone, so that the fuzz targets can link it.
#pragma once
#include <functional>
#include <map>
#include <string>

namespace adjoint {

// What made a result: key → value, both text.
using Provenance = std::map<std::string, std::string>;

// FNV-1a (64 bits) of a file's bytes, as 16 hex digits: a checkpoint's identity, so that a
// result records which weights made it, not where they were. Throws Error naming the file.
std::string file_hash(const std::string& path);

// A record under `prefix` in a safetensors metadata map ("made.lr" → "0.001"), and back.
void add_provenance(std::map<std::string, std::string>& metadata, const Provenance& record);
Provenance provenance_from_metadata(const std::map<std::string, std::string>& metadata);

// The shortest text that reads back as the same double: 0.001, not 0.0010000000000000000208.
std::string exact_text(double value);

// Empty when `recorded` equals `wanted`; otherwise one phrase naming the entries that
// differ, at most three: "lr was 0.001, now 0.01; iri-steps was 40, now 80".
std::string provenance_difference(const Provenance& recorded, const Provenance& wanted);

// Whether the result at `path`, made as `recorded` says, may stand for one made as `wanted`:
// true when the records agree; false when they differ and `overwrite` lets the command
// make it again (said through `log`); otherwise a UsageError, starting with `command`
// ("stitch: …"), naming the file and what differs.
bool may_reuse(const std::string& command, const std::string& path, const Provenance& recorded,
               const Provenance& wanted, bool overwrite, const std::function<void(const std::string&)>& log);

}  // namespace adjoint
