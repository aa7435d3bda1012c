// OUT/index.html (tools/html_report.h): the small writers it is made of, and one page per
// kind of command (train, tensorsim of a pair and of a run, explain, stitch, bench) made by
// running the command on tiny inputs and read back: the title, the command line, the run's
// facts, the tables from its files, an embedded figure that decodes, links to its files,
// and nothing that would reach the network or run a script.
#include <doctest/doctest.h>
#include <stb/stb_image_write.h>

#include <filesystem>
#include <fstream>

#include "engine/error.h"
#include "engine/io/json.h"
#include "engine/random.h"
#include "engine/io/safetensors.h"
#include "tests/support.h"
#include "tools/html_report.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace fs = std::filesystem;

namespace {

int64_t count_of(const std::string& text, const std::string& part) {
  int64_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

std::string decode_base64(const std::string& text) {
  const std::string digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t group = 0;
  int bits = 0;
  for (char ch : text) {
    if (ch == '=') break;
    group = group << 6 | uint32_t(digits.find(ch));
    bits += 6;
    if (bits >= 8) bits -= 8, out += char((group >> bits) & 255);
  }
  return out;
}

// What every page must hold; `figure_type` "png" or "svg+xml": the first figure of that
// type is decoded and must be a PNG or an SVG document.
void check_page(const std::string& page_path, const std::string& title, const std::string& command,
                const std::string& table_header, const std::string& figure_type, const std::string& link) {
  INFO("page ", page_path);
  REQUIRE(fs::exists(page_path));
  const std::string html = read_text(page_path);
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(html.ends_with("</html>\n"));
  CHECK(contains(html, "<title>" + title));
  CHECK(contains(html, "<h1>" + title));
  CHECK(contains(html, "<th>command line</th><td>" + command));
  for (const char* fact : {"commit", "date", "CPU", "BLAS kernels", "threads", "seeds"})
    CHECK_MESSAGE(contains(html, cat("<th>", fact, "</th><td>")), fact);
  CHECK_FALSE(contains(html, "<th>commit</th><td></td>"));
  if (!table_header.empty()) CHECK(contains(html, "<th>" + table_header + "</th>"));
  if (!link.empty()) CHECK(contains(html, "<a href=\"./" + link + "\">"));
  CHECK(count_of(html, "<table>") == count_of(html, "</table>"));
  CHECK(count_of(html, "<tr>") == count_of(html, "</tr>"));
  // Offline and static.
  CHECK_FALSE(contains(html, "http:"));
  CHECK_FALSE(contains(html, "https:"));
  CHECK_FALSE(contains(html, "=\"//"));
  CHECK_FALSE(contains(html, "<script"));
  if (figure_type.empty()) return;
  const std::string prefix = "<img src=\"data:image/" + figure_type + ";base64,";
  const size_t at = html.find(prefix);
  REQUIRE_MESSAGE(at != std::string::npos, "no embedded ", figure_type, " figure");
  const size_t start = at + prefix.size(), end = html.find('"', start);
  const std::string bytes = decode_base64(html.substr(start, end - start));
  if (figure_type == "png")
    CHECK(bytes.rfind("\x89PNG\r\n\x1a\n", 0) == 0);
  else
    CHECK(contains(bytes, "<svg"));
}

// A folder of images (images:ROOT:8): two classes, dark and light squares with noise, six
// 8×8 grey PNGs each in train/ and in test/.
std::string write_tiny_images(const TempDir& dir) {
  Generator gen(7);
  for (const std::string split : {"train", "test"})
    for (const std::string cls : {"dark", "light"}) {
      const fs::path folder = dir.path() / "images" / split / cls;
      fs::create_directories(folder);
      for (int i = 0; i < 6; ++i) {
        std::vector<uint8_t> grey(64);
        for (uint8_t& g : grey) g = uint8_t((cls == "dark" ? 40 : 200) + int(randint(40, gen)));
        REQUIRE(stbi_write_png((folder / cat(i, ".png")).c_str(), 8, 8, 1, grey.data(), 8) != 0);
      }
    }
  return "images:" + (dir.path() / "images").string() + ":8";
}

CommandOutcome must_run(const std::vector<std::string>& words) {
  const CommandOutcome o = run_adjoint(words);
  REQUIRE_MESSAGE(o.code == 0, o.err);
  return o;
}

// A tiny bilinear MLP trained by the command on modadd:11.
std::vector<std::string> tiny_training(const std::string& out, const std::string& seed) {
  return {"train", "--data", "modadd:11", "--model", "bilinear_mlp", "--hidden", "16", "--epochs", "2", "--batch", "16",
          "--optimizer", "adamw", "--lr", "0.01", "--seed", seed, "--out", out};
}

}  // namespace

TEST_CASE("html report: text is escaped, bytes are base64, CSV and JSON files become tables") {
  using namespace adjoint::cli;
  CHECK(escape_html("a<b & \"c\" 'd'>") == "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
  CHECK(base64("") == "");
  CHECK(base64("f") == "Zg==");
  CHECK(base64("fo") == "Zm8=");
  CHECK(base64("foo") == "Zm9v");
  CHECK(base64("foobar") == "Zm9vYmFy");
  CHECK(base64(std::string("\xff\x00\x10", 3)) == "/wAQ");

  TempDir dir;
  std::ofstream(dir.file("t.csv")) << "name,value\n\"a, b\",1\n\"say \"\"x\"\"\",2\nc,3\n";
  const ReportTable t = csv_table(dir.file("t.csv"), "t", 2);
  CHECK(t.header == std::vector<std::string>{"name", "value"});
  REQUIRE(t.rows.size() == 2);
  CHECK(t.rows[0] == std::vector<std::string>{"a, b", "1"});
  CHECK(t.rows[1] == std::vector<std::string>{"say \"x\"", "2"});
  CHECK(t.rows_left_out == 1);

  std::ofstream(dir.file("b.json")) << R"({"threads": 2, "blas": "Haswell", "results": [{"op": "mm", "ms": 1.5}, {"op": "conv", "gflops": 9}]})";
  const std::vector<ReportTable> tables = json_tables(dir.file("b.json"));
  REQUIRE(tables.size() == 2);
  CHECK(tables[0].rows == std::vector<std::vector<std::string>>{{"threads", "2"}, {"blas", "Haswell"}});
  CHECK(tables[1].caption == "b.json: results");
  CHECK(tables[1].header == std::vector<std::string>{"op", "ms", "gflops"});
  CHECK(tables[1].rows == std::vector<std::vector<std::string>>{{"mm", "1.5", ""}, {"conv", "", "9"}});
  std::ofstream(dir.file("bad.json")) << "{\"a\": ";
  CHECK_THROWS_WITH_AS(json_tables(dir.file("bad.json")), doctest::Contains("bad.json"), Error);
}

TEST_CASE("html report: a file's link is relative and URL-encoded, so no file name becomes a script link") {
  using namespace adjoint::cli;
  TempDir dir;
  for (const std::string name : {"javascript:alert(1).json", "a b#c?d.csv", "plain.md"})
    std::ofstream(dir.file(name)) << "x\n1\n";
  const cli::Args args("probe", {}, {}, {});
  const std::string html = html_page(args, folder_report(dir.path().string(), "t"), dir.path().string());
  CAPTURE(html);
  CHECK(contains(html, "<a href=\"./javascript%3Aalert%281%29.json\">javascript:alert(1).json</a>"));
  CHECK(contains(html, "<a href=\"./a%20b%23c%3Fd.csv\">"));
  CHECK(contains(html, "<a href=\"./plain.md\">"));
  CHECK_FALSE(contains(html, "href=\"javascript"));
  // A file in a folder below keeps its slashes; one beside the page's folder its "../".
  HtmlReport nested{"t", {}, {}, {}, {dir.file("sub/x:y.csv"), (dir.path().parent_path() / "z.csv").string()}};
  const std::string nested_html = html_page(args, nested, dir.path().string());
  CHECK(contains(nested_html, "<a href=\"./sub/x%3Ay.csv\">"));
  CHECK(contains(nested_html, "<a href=\"../z.csv\">"));
}

TEST_CASE("html report: train's page has its log, its training curves and every option") {
  TempDir dir;
  const std::string out = dir.file("run");
  must_run(tiny_training(out, "3"));
  for (const char* curve : {"training_loss.png", "training_loss.svg", "training_accuracy.png", "training_accuracy.svg"})
    CHECK_MESSAGE(fs::exists(out + "/" + curve), curve);
  const std::string page = out + "/index.html";
  check_page(page, "adjoint train: bilinear_mlp on modadd:11, adamw lr 0.01, seed 3",
             "adjoint train --batch 16 --data modadd:11 --epochs 2 --hidden 16 --lr 0.01 --model bilinear_mlp "
             "--optimizer adamw --out " + out + " --seed 3",
             "train_loss", "svg+xml", "log.csv");
  const std::string html = read_text(page);
  CHECK(contains(html, "<th>seeds</th><td>seed 3</td>"));
  CHECK(contains(html, "<tr><td><code>--schedule</code></td><td>cosine</td><td>default</td></tr>"));  // a default, shown
  CHECK(contains(html, "<tr><td><code>--lr</code></td><td>0.01</td><td>given</td></tr>"));
  CHECK(count_of(html, "<img src=\"data:image/svg+xml;base64,") == 2);  // the two curves, as SVG only
  CHECK(contains(html, "<a href=\"./log.json\">"));
}

TEST_CASE("html report: tensorsim's pages, for a pair and for a run") {
  TempDir dir;
  must_run(tiny_training(dir.file("a"), "1"));
  must_run(tiny_training(dir.file("b"), "2"));
  const std::string a = dir.file("a/checkpoint.safetensors"), b = dir.file("b/checkpoint.safetensors");
  must_run({"tensorsim", a, b, "--slices", "--no-baselines", "--out", dir.file("pair")});
  check_page(dir.file("pair/index.html"), "adjoint tensorsim: " + a + " vs " + b,
             "adjoint tensorsim --no-baselines --out " + dir.file("pair") + " --slices", "measure", "",
             "tensorsim.csv");
  CHECK(contains(read_text(dir.file("pair/index.html")), " " + a + " " + b + "</td>"));  // the checkpoints, last

  std::vector<std::string> run = tiny_training(dir.file("run"), "1");
  run.insert(run.end(), {"--keep-checkpoints", "every:1"});
  must_run(run);
  must_run({"tensorsim", "--run", dir.file("run"), "--no-baselines", "--out", dir.file("over_run")});
  check_page(dir.file("over_run/index.html"), "adjoint tensorsim --run " + dir.file("run"),
             "adjoint tensorsim --no-baselines --out " + dir.file("over_run") + " --run " + dir.file("run"),
             "tensor_similarity_to_last", "png", "pairwise_similarity.csv");
}

TEST_CASE("html report: explain's and stitch's pages on tiny image models") {
  TempDir dir;
  const std::string data = write_tiny_images(dir);
  for (const std::string name : {"a", "b"})
    must_run({"train", "--data", data, "--model", "resnet18", "--width", "0.0625", "--epochs", "1", "--batch", "6",
              "--seed", name == "a" ? "1" : "2", "--out", dir.file(name)});
  const std::string a = dir.file("a/checkpoint.safetensors"), b = dir.file("b/checkpoint.safetensors");

  must_run({"explain", "--checkpoint", a, "--data", data, "--count", "2", "--methods", "gradient,soft_pullback",
            "--metrics", "none", "--out", dir.file("explain")});
  check_page(dir.file("explain/index.html"), "adjoint explain: gradient, soft_pullback on resnet18",
             "adjoint explain --checkpoint " + a, "", "png", "");
  CHECK(contains(read_text(dir.file("explain/index.html")), "<figcaption>image_0001/sheet.png</figcaption>"));

  must_run({"stitch", "--front", a, "--end", b, "--pairs", "2:2,4:3", "--train-images", "12", "--epochs", "1",
            "--batch", "6", "--objectives", "hlm", "--protocol", "standard,invariance", "--iri-images", "2",
            "--iri-steps", "2", "--test-images", "12", "--out", dir.file("stitch")});
  check_page(dir.file("stitch/index.html"), "adjoint stitch: " + a + " -&gt; " + b + " on " + data,
             "adjoint stitch --batch 6", "relative_score", "svg+xml", "results.csv");
  const std::string html = read_text(dir.file("stitch/index.html"));
  CHECK(contains(html, "<figcaption>layer_map_hlm_standard.svg</figcaption>"));
  CHECK(contains(html, "<figcaption>iris/front_block_2.svg</figcaption>"));
}

TEST_CASE("html report: bench's page sits beside its results file") {
  TempDir dir;
  const std::string out = dir.file("ours.json");
  must_run({"--threads", "1", "bench", "stitch", "--only", "vgg11_bn", "--batch", "2", "--steps", "1", "--repeats", "1",
            "--block", "7", "--out", out});
  check_page(dir.file("ours.html"), "adjoint bench stitch: ", "adjoint bench --batch 2 --block 7", "ms_per_step", "",
             "ours.json");
}
