// OUT/index.html: one self-contained page per output folder, written by every command that
// writes one (train, explain, stitch, tensorsim, bench) as its last step.
//
// The page holds what is needed to trust and redo the result: the command line, the commit
// the executable was built from, the date, the CPU and the BLAS kernel family, the thread
// count, the seeds and every option with its value (given or default); then the command's
// tables (read from the CSV files it wrote), its figures embedded as data URIs (SVG where
// the folder has one, else PNG), and links to its CSV, JSON and Markdown files. No script,
// no stylesheet or image from elsewhere: it opens from disk, offline, in any browser.
//
//   cli::write_html_report(out, a, cli::folder_report(out, "adjoint train: resnet18 on fashion-mnist"));
#pragma once
#include <string>
#include <vector>

#include "engine/io/table.h"
#include "tools/cli.h"

namespace adjoint::cli {

// A table of the page: a results table (engine/io/table.h; rows_left_out: the rows of its
// file not shown, a long table is cut) under its caption.
struct ReportTable : Table {
  std::string caption;
};

struct HtmlReport {
  std::string title;
  std::vector<std::string> notes;    // paragraphs under the title
  std::vector<ReportTable> tables;
  std::vector<std::string> figures;  // paths of .svg or .png files, embedded in order
  std::vector<std::string> files;    // paths linked from the page (relative to its folder)
};

// The CSV file at `path` as a table: its first line the header, at most `max_rows` rows
// (the rest counted in rows_left_out). Quoted fields ("a, b", "say ""x""") are read whole.
ReportTable csv_table(const std::string& path, const std::string& caption, size_t max_rows = 60);

// A report of what the folder `dir` holds at its top level, in name order: a table per
// .csv, a figure per picture (its .svg when there is one, else its .png), a link per .csv,
// .json and .md file.
HtmlReport folder_report(const std::string& dir, const std::string& title);

// The tables of a JSON file: its top-level numbers, strings and booleans as one table of
// settings, and each array of objects (at the top level or a member of the top-level
// object) as a table with a column per key (nested values shown as JSON).
std::vector<ReportTable> json_tables(const std::string& path, size_t max_rows = 60);

// A report of one result file: its tables (CSV or JSON) and a link to it.
HtmlReport file_report(const std::string& path, const std::string& title);

// Adds the pictures of the folder `dir` to the report's figures (an .svg in place of the
// .png of the same name), in name order; nothing when there is no such folder.
void add_figures(HtmlReport& report, const std::string& dir);

// The page's HTML, every text escaped.
std::string html_page(const Args& args, const HtmlReport& report, const std::string& dir);

// Writes `dir`/index.html atomically, figures and links relative to `dir`; prints nothing.
void write_html_report(const std::string& dir, const Args& args, const HtmlReport& report);

// The same for a command whose result is one file (`adjoint bench --out FILE`): the page is
// FILE without its extension + ".html", beside it.
void write_html_report_for_file(const std::string& file, const Args& args, const HtmlReport& report);

// RFC 4648 base64 of bytes.
std::string base64(const std::string& bytes);

}  // namespace adjoint::cli
