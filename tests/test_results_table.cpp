// The results table (engine/io/table.h): each format written by hand for a small table, the
// escaping of every format, the one spelling of a value that is not finite, and a CSV file
// read back into the table it was written from.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/table.h"
#include "tests/support.h"

using namespace adjoint;

namespace {

Table small_table() {
  Table t{{"method", "score"}};
  t.align = {Align::Left, Align::Right};
  t.add_row({"gradient", fixed(0.25, 3)});
  t.add_row({"soft pullback", fixed(-1.5, 1)});
  return t;
}

}  // namespace

TEST_CASE("results table: CSV, Markdown, HTML and JSON of a small table") {
  const Table t = small_table();
  CHECK(t.csv() == "method,score\ngradient,0.250\nsoft pullback,-1.5\n");
  CHECK(t.markdown() == "| method | score |\n|---|---:|\n| gradient | 0.250 |\n| soft pullback | -1.5 |\n");
  CHECK(t.html() == "<table>\n<tr><th>method</th><th>score</th></tr>\n<tr><td>gradient</td><td>0.250</td></tr>\n"
                    "<tr><td>soft pullback</td><td>-1.5</td></tr>\n</table>\n");
  CHECK(to_json(t.json()) == R"([{"method":"gradient","score":0.25},{"method":"soft pullback","score":-1.5}])");
}

TEST_CASE("results table: Markdown streamed a row at a time is the whole table's Markdown") {
  const Table t = small_table();
  std::string streamed = t.markdown_head();
  for (const auto& row : t.rows) streamed += t.markdown_row(row);
  CHECK(streamed == t.markdown());
  CHECK(t.markdown_head() == "| method | score |\n|---|---:|\n");
  CHECK(t.markdown_row({"a | b", "1"}) == "| a \\| b | 1 |\n");  // escaped as every Markdown cell
  CHECK_THROWS_WITH_AS(t.markdown_row({"1"}), doctest::Contains("a row of 1 cells for 2 columns"), Error);
}

TEST_CASE("results table: every format escapes what would break it") {
  const std::string awkward = "a, \"b\" | <c> & 'd'\ne";
  Table t{{"text"}};
  t.add_row({awkward});
  CHECK(t.csv() == "text\n\"a, \"\"b\"\" | <c> & 'd'\ne\"\n");
  CHECK(t.markdown() == "| text |\n|---|\n| a, \"b\" \\| <c> & 'd' e |\n");
  CHECK(t.html().find("<td>a, &quot;b&quot; | &lt;c&gt; &amp; &#39;d&#39;\ne</td>") != std::string::npos);
  CHECK(t.json().as_array()[0].find("text")->as_string() == awkward);
  // A cell that merely looks numeric in part stays text.
  Table u{{"v"}};
  u.add_row({"1e"});
  u.add_row({"0x10"});
  CHECK(u.json().as_array()[0].find("v")->is_string());
  CHECK(u.json().as_array()[1].find("v")->is_string());
  // The CSV reader takes back what the writer quoted.
  CHECK(csv_fields("\"a, \"\"b\"\"\",c") == std::vector<std::string>{"a, \"b\"", "c"});
}

TEST_CASE("results table: one spelling of a value that is not finite") {
  CHECK(fixed(std::nan(""), 3) == "nan");
  CHECK(fixed(-std::nan(""), 3) == "nan");  // never the stream's "-nan"
  CHECK(fixed(std::numeric_limits<double>::infinity(), 2) == "inf");
  CHECK(fixed(-std::numeric_limits<double>::infinity(), 2) == "-inf");
  CHECK(fixed(2.0 / 3.0, 4) == "0.6667");
  Table t{{"x"}};
  t.add_row({fixed(std::nan(""), 4)});
  t.add_row({fixed(-std::numeric_limits<double>::infinity(), 4)});
  CHECK(t.csv() == "x\nnan\n-inf\n");
  CHECK(t.json().as_array()[0].find("x")->is_null());
  CHECK(t.json().as_array()[1].find("x")->is_null());
}

TEST_CASE("results table: a row of the wrong width is refused; a CSV file reads back whole or cut") {
  Table t{{"a", "b"}};
  CHECK_THROWS_WITH_AS(t.add_row({"1"}), doctest::Contains("a row of 1 cells for 2 columns"), Error);

  adjoint::testing::TempDir dir;
  const Table written = small_table();
  write_file_atomic(dir.file("t.csv"), written.csv());
  const Table back = read_csv_table(dir.file("t.csv"));
  CHECK(back.header == written.header);
  CHECK(back.rows == written.rows);
  CHECK(back.rows_left_out == 0);
  const Table cut = read_csv_table(dir.file("t.csv"), 1);
  CHECK(cut.rows.size() == 1);
  CHECK(cut.rows_left_out == 1);
  CHECK_THROWS_WITH_AS(read_csv_table(dir.file("missing.csv")), doctest::Contains("missing.csv"), Error);
  // A file's row may be short: every format still writes it, JSON with null for the missing cell.
  write_file_atomic(dir.file("ragged.csv"), "a,b\n1\n");
  const Table ragged = read_csv_table(dir.file("ragged.csv"));
  CHECK(to_json(ragged.json()) == R"([{"a":1,"b":null}])");
  CHECK(ragged.csv() == "a,b\n1\n");
}
