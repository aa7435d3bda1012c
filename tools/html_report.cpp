#include "tools/html_report.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/error.h"
#include "engine/gemm.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/threads.h"
#include "tools/commit.h"  // generated at build time (tools/meson.build): ADJOINT_COMMIT

namespace adjoint::cli {

namespace fs = std::filesystem;

namespace {

// The CPU's name as the kernel reports it.
std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      const std::string name = line.substr(line.find(':') + 1);
      return name.substr(std::min(name.size(), name.find_first_not_of(' ')));
    }
  return "unknown";
}

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return text;
}

// A shell word, quoted when it needs to be.
std::string shell_word(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=+,@%") == std::string::npos)
    return word;
  std::string quoted = "'";
  for (char ch : word) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

// Whether the command's option `name` is a flag (it takes no value).
bool is_flag(const std::string& command, const std::string& name) {
  for (const Command* c : commands())
    if (c->name == command)
      for (const OptionSpec& o : c->options)
        if (o.name == name) return o.value.empty();
  return false;
}

// The command line the options came from, options in name order.
std::string command_line(const Args& args) {
  std::string line = "adjoint " + args.command();
  for (const auto& [name, value] : args.given()) {
    if (name == "help") continue;
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on `" " + a_temporary`.
    line += " --";
    line += name;
    if (!is_flag(args.command(), name)) line.append(" ").append(shell_word(value));
  }
  for (const std::string& p : args.positionals()) line.append(" ").append(shell_word(p));
  return line;
}

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

std::string data_uri(const std::string& path) {
  const std::string type = ends_with(path, ".svg") ? "image/svg+xml" : "image/png";
  return "data:" + type + ";base64," + base64(read_text_file(path));
}

// `path` as a link from a page in `dir`: relative to it when inside it.
std::string relative_to(const std::string& path, const std::string& dir) {
  const fs::path rel = fs::path(path).lexically_proximate(dir);
  return rel.string();
}

// The href of a file the page links, relative to the page: each byte outside the unreserved
// set (letters, digits, - . _ ~) and the path's slashes percent-encoded, and "./" in front
// unless it starts with "../". A file name is then never read as a scheme: without both,
// a file named "javascript:alert(1).json" would be a script link.
std::string relative_link(const std::string& name) {
  static const char* kHex = "0123456789ABCDEF";
  std::string link = name.rfind("../", 0) == 0 ? "" : "./";
  for (const unsigned char ch : name) {
    if (std::isalnum(ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~' || ch == '/') {
      link += char(ch);
    } else {
      link += '%';
      link += kHex[ch >> 4];
      link += kHex[ch & 15];
    }
  }
  return link;
}

void definition(std::string& html, const std::string& term, const std::string& value) {
  html += "<tr><th>" + escape_html(term) + "</th><td>" + escape_html(value) + "</td></tr>\n";
}

constexpr const char* kStyle = R"(body{font-family:"DejaVu Sans",sans-serif;margin:2em;max-width:1100px;color:#111}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0 1em}th,td{border:1px solid #ccc;padding:.2em .5em;text-align:left;font-size:.9em}
th{background:#f2f2f2}code{background:#f6f6f6;padding:.1em .3em}figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.85em;color:#555})";

}  // namespace

std::string base64(const std::string& bytes) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (size_t k = 0; k < 3; ++k) group = group << 8 | (k < n ? uint8_t(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? digits[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

ReportTable csv_table(const std::string& path, const std::string& caption, size_t max_rows) {
  try {
    return ReportTable{read_csv_table(path, max_rows), caption};
  } catch (const Error& e) {
    throw Error(cat("html report: ", e.what()));
  }
}

namespace {

std::string scalar_text(const Json& v) {
  if (v.is_string()) return v.as_string();
  return to_json(v);
}

// An array of objects as a table, its columns the keys in the order first met.
ReportTable object_rows(const std::string& caption, const Json::Array& items, size_t max_rows) {
  ReportTable table{{}, caption};
  for (const Json& item : items)
    for (const auto& [key, value] : item.as_object())
      if (std::find(table.header.begin(), table.header.end(), key) == table.header.end()) table.header.push_back(key);
  for (const Json& item : items) {
    if (table.rows.size() == max_rows) {
      ++table.rows_left_out;
      continue;
    }
    std::vector<std::string> row;
    for (const std::string& key : table.header) {
      const Json* v = item.find(key);
      row.push_back(v ? scalar_text(*v) : "");
    }
    table.rows.push_back(row);
  }
  return table;
}

bool all_objects(const Json& v) {
  if (!v.is_array() || v.size() == 0) return false;
  for (const Json& item : v.as_array())
    if (!item.is_object()) return false;
  return true;
}

}  // namespace

std::vector<ReportTable> json_tables(const std::string& path, size_t max_rows) {
  const std::string name = fs::path(path).filename().string();
  Json doc;
  try {
    doc = parse_json(read_text_file(path));
  } catch (const Error& e) {
    throw Error(cat("html report: ", path, ": ", e.what()));
  }
  std::vector<ReportTable> tables;
  if (all_objects(doc)) return {object_rows(name, doc.as_array(), max_rows)};
  if (!doc.is_object()) return tables;
  ReportTable settings{{{"key", "value"}}, name + ": settings"};
  for (const auto& [key, value] : doc.as_object()) {
    if (all_objects(value)) tables.push_back(object_rows(name + ": " + key, value.as_array(), max_rows));
    else if (!value.is_array() && !value.is_object()) settings.rows.push_back({key, scalar_text(value)});
  }
  if (!settings.rows.empty()) tables.insert(tables.begin(), settings);
  return tables;
}

HtmlReport file_report(const std::string& path, const std::string& title) {
  HtmlReport report{title, {}, {}, {}, {path}};
  if (ends_with(path, ".json")) report.tables = json_tables(path);
  else report.tables.push_back(csv_table(path, fs::path(path).filename().string()));
  return report;
}

namespace {

// The regular files of a folder, by name, but for dot files (the folder's .lock).
std::vector<std::string> file_names(const std::string& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.') names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A picture to show: an .svg, or a .png without an .svg of the same name beside it.
bool shown_picture(const std::string& name, const std::set<std::string>& present) {
  return ends_with(name, ".svg") || (ends_with(name, ".png") && !present.count(fs::path(name).stem().string() + ".svg"));
}

}  // namespace

void add_figures(HtmlReport& report, const std::string& dir) {
  if (!fs::is_directory(dir)) return;
  const std::vector<std::string> names = file_names(dir);
  const std::set<std::string> present(names.begin(), names.end());
  for (const std::string& name : names)
    if (shown_picture(name, present)) report.figures.push_back((fs::path(dir) / name).string());
}

HtmlReport folder_report(const std::string& dir, const std::string& title) {
  HtmlReport report{title, {}, {}, {}, {}};
  for (const std::string& name : file_names(dir)) {
    const std::string path = (fs::path(dir) / name).string();
    if (ends_with(name, ".csv")) report.tables.push_back(csv_table(path, name));
    if (ends_with(name, ".csv") || ends_with(name, ".json") || ends_with(name, ".md")) report.files.push_back(path);
  }
  add_figures(report, dir);
  return report;
}

std::string html_page(const Args& args, const HtmlReport& report, const std::string& dir) {
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                     escape_html(report.title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  html += "<h1>" + escape_html(report.title) + "</h1>\n";
  for (const std::string& note : report.notes) html += "<p>" + escape_html(note) + "</p>\n";

  html += "<h2>Run</h2>\n<table>\n";
  definition(html, "command line", command_line(args));
  definition(html, "commit", ADJOINT_COMMIT);
  definition(html, "date", utc_now());
  definition(html, "CPU", cpu_name());
  definition(html, "BLAS kernels", std::string("OpenBLAS ") + blas_kernels());
  definition(html, "threads", std::to_string(num_threads()));
  std::string seeds;
  for (const auto& [name, value] : args.options())
    if (name.find("seed") != std::string::npos)  // an empty value: the command picks (reproduce's --seeds)
      seeds += (seeds.empty() ? "" : ", ") + name + " " + (value.empty() ? "default" : value);
  definition(html, "seeds", seeds.empty() ? "none (the command draws no random numbers)" : seeds);
  html += "</table>\n";

  html += "<h2>Options</h2>\n<table>\n<tr><th>option</th><th>value</th><th></th></tr>\n";
  for (const auto& [name, value] : args.options())
    html += "<tr><td><code>--" + escape_html(name) + "</code></td><td>" + escape_html(value) + "</td><td>" +
            (args.has(name) ? "given" : "default") + "</td></tr>\n";
  html += "</table>\n";

  for (const ReportTable& t : report.tables) {
    html += "<h2>" + escape_html(t.caption) + "</h2>\n" + t.html();
    if (t.rows_left_out > 0) html += "<p>(" + std::to_string(t.rows_left_out) + " more rows in the file)</p>\n";
  }

  if (!report.figures.empty()) html += "<h2>Figures</h2>\n";
  for (const std::string& path : report.figures) {
    const std::string name = relative_to(path, dir);
    html += "<figure><img src=\"" + data_uri(path) + "\" alt=\"" + escape_html(name) + "\"><figcaption>" +
            escape_html(name) + "</figcaption></figure>\n";
  }

  if (!report.files.empty()) {
    html += "<h2>Files</h2>\n<ul>\n";
    for (const std::string& path : report.files) {
      const std::string name = relative_to(path, dir);
      html += "<li><a href=\"" + relative_link(name) + "\">" + escape_html(name) + "</a></li>\n";
    }
    html += "</ul>\n";
  }
  return html + "</body>\n</html>\n";
}

void write_html_report(const std::string& dir, const Args& args, const HtmlReport& report) {
  write_file_atomic((fs::path(dir) / "index.html").string(), html_page(args, report, dir));
}

void write_html_report_for_file(const std::string& file, const Args& args, const HtmlReport& report) {
  const fs::path path(file);
  const std::string dir = path.has_parent_path() ? path.parent_path().string() : ".";
  fs::path page = path;
  page.replace_extension(".html");
  if (page == path) page += ".html";  // never over the result itself
  write_file_atomic(page.string(), html_page(args, report, dir));
}

}  // namespace adjoint::cli
