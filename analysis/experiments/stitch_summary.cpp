// The summary figure of a stitching experiment (analysis/experiments/stitch_*.sh): the mean
// relative score over seeds of every pair and block (rows) under each protocol (columns),
// drawn as a heat map with each cell's value in it.
//
//   build/analysis/experiments/stitch_summary GATHERED.csv OUT_STEM "TITLE"
//
// GATHERED.csv is what stitching_lib.sh's `collect` writes (seed, pair, group, front_block,
// objective, protocol, …, relative_score); writes OUT_STEM.png and OUT_STEM.svg.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "analysis/common/figure.h"
#include "engine/error.h"
#include "engine/io/table.h"

using namespace adjoint;

int main(int argc, char** argv) try {
  check(argc == 4, "usage: stitch_summary GATHERED.csv OUT_STEM TITLE");
  const Table table = read_csv_table(argv[1]);
  const auto column = [&](const std::string& name) {
    const auto at = std::find(table.header.begin(), table.header.end(), name);
    check(at != table.header.end(), argv[1], ": no column ", name);
    return size_t(at - table.header.begin());
  };
  const size_t pair = column("pair"), block = column("front_block"), protocol = column("protocol"),
               objective = column("objective"), score = column("relative_score");

  // Rows: pair and block, in the file's order; columns: the protocols, in the file's order.
  std::vector<std::string> rows, protocols;
  std::map<std::pair<std::string, std::string>, std::vector<double>> values;  // (row, protocol) → one per seed
  for (const auto& r : table.rows) {
    const std::string row = cat(r[pair], ", block ", r[block], r[objective] == "slm" ? "" : cat(", ", r[objective]));
    if (std::find(rows.begin(), rows.end(), row) == rows.end()) rows.push_back(row);
    if (std::find(protocols.begin(), protocols.end(), r[protocol]) == protocols.end()) protocols.push_back(r[protocol]);
    values[{row, r[protocol]}].push_back(std::atof(r[score].c_str()));
  }
  HeatMap map;
  map.title = argv[3];
  map.x_label = "protocol";
  map.y_label = "front → end, block";
  map.rows = int64_t(rows.size());
  map.cols = int64_t(protocols.size());
  size_t seeds = 0;
  for (const std::string& row : rows) {
    for (const std::string& p : protocols) {
      const std::vector<double>& v = values[{row, p}];
      double sum = 0;
      for (double x : v) sum += x;
      map.values.push_back(v.empty() ? NAN : sum / double(v.size()));
      seeds = std::max(seeds, v.size());
    }
    map.row_labels.push_back(row);
  }
  map.col_labels = protocols;
  map.lo = 0;
  map.hi = std::max(1.2, data_range(map.values).second);
  map.range_note = cat("mean over ", seeds, " seeds; scale fixed from 0 to ", map.hi, " (1: as good as the end model)");
  map.print_values = true;
  Figure(map).write(argv[2]);
  std::printf("wrote %s.png and %s.svg\n", argv[2], argv[2]);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "stitch_summary: %s\n", e.what());
  return 1;
}
