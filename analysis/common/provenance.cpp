#include "analysis/common/provenance.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <vector>

#include "engine/error.h"

namespace adjoint {

namespace {

constexpr const char* kRecordPrefix = "made.";

}  // namespace

std::string file_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(bool(in), "cannot read ", path, " to hash it");
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a offset basis
  char buffer[1 << 16];
  while (in) {
    in.read(buffer, sizeof buffer);
    for (std::streamsize k = 0; k < in.gcount(); ++k) hash = (hash ^ uint8_t(buffer[k])) * 0x100000001b3ull;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, hash);
  return text;
}

void add_provenance(std::map<std::string, std::string>& metadata, const Provenance& record) {
  for (const auto& [key, value] : record) metadata[kRecordPrefix + key] = value;
}

Provenance provenance_from_metadata(const std::map<std::string, std::string>& metadata) {
  Provenance record;
  const std::string prefix = kRecordPrefix;
  for (const auto& [key, value] : metadata)
    if (key.rfind(prefix, 0) == 0) record[key.substr(prefix.size())] = value;
  return record;
}

std::string exact_text(double value) {
  char text[64];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  return std::string(text, end);
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

bool may_reuse(const std::string& command, const std::string& path, const Provenance& recorded,
               const Provenance& wanted, bool overwrite, const std::function<void(const std::string&)>& log) {
  const std::string difference = provenance_difference(recorded, wanted);
  if (difference.empty()) return true;
  if (!overwrite)
    throw UsageError(cat(command, ": ", path, " was made by another run: ", difference,
                         "; give --overwrite to make it again, or another --out"));
  if (log) log(cat("remaking ", path, " (--overwrite): ", difference));
  return false;
}

}  // namespace adjoint
