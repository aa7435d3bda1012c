// Results tables: the one type every command writes its tables with, in four formats, and
// reads a CSV file back into (the report pages show the CSV files a command wrote).
//
//   format    a cell is escaped as                          the table is
//   CSV       quoted when it holds , " CR or LF; " doubled   the header line, then a line per row
//   Markdown  | as \|, a line break as a space               | header |, the rule (---, or ---: for a
//                                                            right-aligned column), | row |
//   HTML      & < > " ' as entities                          <table>, a <tr> of <th>, a <tr> of <td> per row
//   JSON      a finite number as a number, "nan", "inf",     an array of objects, one per row, keyed by
//             "-inf" as null, any other text as a string     the header
//
// Cells are text, so that every format shows the same cell: a command formats its numbers
// with fixed() (or csv_number, engine/io/csv.h, at full precision), whose spelling of a
// value that is not finite is the one of every table: "nan", "inf", "-inf".
//
//   Table t{{"method", "score"}};
//   t.add_row({"gradient", fixed(0.25, 3)});
//   write_file_atomic(out + "/scores.csv", t.csv());
//   std::fputs(t.markdown_head().c_str(), stdout);           // or streamed, a row as it is measured
//   std::fputs(t.markdown_row({"gradient", fixed(0.25, 3)}).c_str(), stdout);
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "engine/io/json.h"

namespace adjoint {

enum class Align { Left, Right };

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows = {};  // a row of a file read back may be short or long
  std::vector<Align> align = {};  // per column, for Markdown; missing columns: Left
  size_t rows_left_out = 0;       // rows of a file read back but not held (read_csv_table's max_rows)

  // Appends a row; throws Error unless it has a cell per header column.
  void add_row(std::vector<std::string> cells);

  std::string csv() const;
  std::string markdown() const;
  // The Markdown table written a row at a time, as its rows are measured: the header and its
  // rule, then a line per row (throws Error unless it has a cell per header column), the same
  // text markdown() gives for the rows held.
  std::string markdown_head() const;
  std::string markdown_row(const std::vector<std::string>& cells) const;
  std::string html() const;
  Json json() const;
};

// v with `digits` digits after the point; a value that is not finite as "nan", "inf" or "-inf".
std::string fixed(double v, int digits);

// One cell in each format's escaping (the table above).
std::string csv_field(const std::string& text);
std::string markdown_cell(const std::string& text);
std::string escape_html(const std::string& text);

// One CSV line split into its fields: a quoted field may hold commas and doubled quotes.
std::vector<std::string> csv_fields(const std::string& line);

// The CSV file at `path` as a table: its first line the header, at most `max_rows` rows (the
// rest counted in rows_left_out; empty lines skipped). Throws Error naming the file when it
// cannot be read.
Table read_csv_table(const std::string& path, size_t max_rows = size_t(-1));

}  // namespace adjoint
