#include "tools/reproduce/paper.h"

#include <cstdlib>
#include <filesystem>

#include "engine/error.h"
#include "engine/io/table.h"

namespace adjoint::reproduce {

namespace {

struct ScaleName {
  Scale scale;
  const char* name;
};
constexpr ScaleName kScales[] = {{Scale::Quick, "quick"}, {Scale::Full, "full"}};

}  // namespace

const char* scale_name(Scale scale) {
  for (const ScaleName& s : kScales)
    if (s.scale == scale) return s.name;
  return "?";
}

Scale parse_scale(const std::string& name) {
  for (const ScaleName& s : kScales)
    if (name == s.name) return s.scale;
  throw UsageError(cat("option --scale expects quick or full, got '", name, "'"));
}

const std::vector<Paper>& papers() {
  static const std::vector<Paper> table = {semantic_pullbacks_paper(), stitching_paper(), tensor_similarity_paper()};
  return table;
}

const Paper& find_paper(const std::string& name) {
  std::string names;
  for (const Paper& p : papers()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw UsageError(cat("reproduce: no paper '", name, "' (papers: ", names, ")"));
}

std::string with_seed(const std::string& pattern, int seed) {
  std::string out = pattern;
  const std::string key = "{seed}";
  for (size_t at = out.find(key); at != std::string::npos; at = out.find(key)) out.replace(at, key.size(), cat(seed));
  return out;
}

size_t CsvRows::column(const std::string& name) const {
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i] == name) return i;
  throw Error(cat(path, ": no column '", name, "'"));
}

double CsvRows::number(const std::string& name, const std::vector<std::pair<std::string, std::string>>& match) const {
  const size_t wanted = column(name);
  std::vector<size_t> keys;
  for (const auto& [key, value] : match) keys.push_back(column(key));
  std::string described;
  for (const auto& [key, value] : match) described += cat(described.empty() ? "" : ", ", key, " = ", value);
  for (const std::vector<std::string>& row : rows) {
    bool same = true;
    for (size_t k = 0; k < keys.size() && same; ++k) same = keys[k] < row.size() && row[keys[k]] == match[k].second;
    if (!same || wanted >= row.size()) continue;
    char* end = nullptr;
    const double v = std::strtod(row[wanted].c_str(), &end);
    if (row[wanted].empty() || *end != '\0') throw Error(cat(path, ": '", name, "' of the row ", described, " is no number"));
    return v;
  }
  throw Error(cat(path, ": no row with ", described));
}

CsvRows read_csv(const std::string& path) {
  if (!std::filesystem::exists(path)) throw Error(cat("reproduce: the result file ", path, " is missing"));
  const Table t = read_csv_table(path);
  return CsvRows{t.header, t.rows, path};
}

}  // namespace adjoint::reproduce
