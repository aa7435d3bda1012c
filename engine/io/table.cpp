#include "engine/io/table.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "engine/error.h"
#include "engine/io/csv.h"

namespace adjoint {

void Table::add_row(std::vector<std::string> cells) {
  check(cells.size() == header.size(), "table: a row of ", cells.size(), " cells for ", header.size(), " columns");
  rows.push_back(std::move(cells));
}

std::string Table::csv() const {
  const auto line = [](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i > 0) out += ',';
      out += csv_field(cells[i]);
    }
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& row : rows) out += line(row);
  return out;
}

namespace {

std::string markdown_line(const std::vector<std::string>& cells) {
  std::string out = "|";
  for (const std::string& cell : cells) {
    out += ' ';
    out += markdown_cell(cell);
    out += " |";
  }
  return out + "\n";
}

}  // namespace

std::string Table::markdown_head() const {
  std::string out = markdown_line(header) + "|";
  for (size_t i = 0; i < header.size(); ++i) out += i < align.size() && align[i] == Align::Right ? "---:|" : "---|";
  return out + "\n";
}

std::string Table::markdown_row(const std::vector<std::string>& cells) const {
  check(cells.size() == header.size(), "table: a row of ", cells.size(), " cells for ", header.size(), " columns");
  return markdown_line(cells);
}

std::string Table::markdown() const {
  std::string out = markdown_head();
  for (const auto& row : rows) out += markdown_line(row);
  return out;
}

std::string Table::html() const {
  std::string out = "<table>\n<tr>";
  for (const std::string& h : header) out += "<th>" + escape_html(h) + "</th>";
  out += "</tr>\n";
  for (const auto& row : rows) {
    out += "<tr>";
    for (const std::string& cell : row) out += "<td>" + escape_html(cell) + "</td>";
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

namespace {

// A cell as a JSON value: a number when the whole cell is one, null for a non-finite one.
Json json_cell(const std::string& cell) {
  if (cell == "nan" || cell == "inf" || cell == "-inf") return Json();
  if (!cell.empty() && cell.find_first_not_of("0123456789+-.eE") == std::string::npos) {
    char* end = nullptr;
    const double v = std::strtod(cell.c_str(), &end);
    if (*end == '\0' && std::isfinite(v)) return Json(v);
  }
  return Json(cell);
}

}  // namespace

Json Table::json() const {
  Json out = Json::array();
  for (const auto& row : rows) {
    Json object = Json::object();
    for (size_t i = 0; i < header.size(); ++i) object[header[i]] = i < row.size() ? json_cell(row[i]) : Json();
    out.push_back(object);
  }
  return out;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return csv_number(v);
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : c == '\n' || c == '\r' ? std::string(" ") : std::string(1, c);
  return out;
}

std::string escape_html(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted && ch == '"' && i + 1 < line.size() && line[i + 1] == '"') fields.back() += '"', ++i;
    else if (ch == '"') quoted = !quoted;
    else if (ch == ',' && !quoted) fields.emplace_back();
    else if (ch != '\r') fields.back() += ch;
  }
  return fields;
}

Table read_csv_table(const std::string& path, size_t max_rows) {
  std::ifstream in(path);
  check(in.good(), "cannot read the table ", path);
  Table table;
  std::string line;
  if (std::getline(in, line)) table.header = csv_fields(line);
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (table.rows.size() < max_rows) table.rows.push_back(csv_fields(line));
    else ++table.rows_left_out;
  }
  return table;
}

}  // namespace adjoint
