// The layout rules, checked on the source tree: the three analysis modules (pullbacks,
// stitching, similarity) never include one another, and what they share lives in
// analysis/common/, which includes none of them (analysis/README.md); nothing in engine/,
// ops/, models/, analysis/ or examples/ includes the command line (tools/); the core
// (engine/, ops/, models/ but the training loop) includes nothing of distribution.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = ADJOINT_SOURCE_DIR;
const std::vector<std::string> kModules = {"pullbacks", "stitching", "similarity"};

// The analysis folder each `#include "analysis/<folder>/..."` of a file names.
std::set<std::string> included_analysis_folders(const fs::path& file) {
  std::ifstream in(file);
  const std::regex include(R"re(^\s*#\s*include\s*"analysis/([a-z_]+)/)re");
  std::set<std::string> folders;
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, include)) folders.insert(m[1]);
  return folders;
}

std::vector<fs::path> sources_under(const fs::path& folder) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(folder)) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_regular_file() && (ext == ".h" || ext == ".cpp")) files.push_back(entry.path());
  }
  return files;
}

}  // namespace

TEST_CASE("layout: the analysis modules include one another only through analysis/common") {
  size_t checked = 0;
  for (const std::string& module : kModules) {
    const std::vector<fs::path> files = sources_under(kRoot / "analysis" / module);
    REQUIRE_FALSE(files.empty());  // the module folder exists and holds sources
    for (const fs::path& file : files) {
      for (const std::string& folder : included_analysis_folders(file)) {
        INFO(file.string(), " includes analysis/", folder, "/");
        CHECK((folder == module || folder == "common"));
      }
      ++checked;
    }
  }
  for (const fs::path& file : sources_under(kRoot / "analysis" / "common")) {
    for (const std::string& folder : included_analysis_folders(file)) {
      INFO(file.string(), " includes analysis/", folder, "/");
      CHECK(folder == "common");
    }
    ++checked;
  }
  CHECK(checked > 20);
}

TEST_CASE("layout: the include scan sees a crossing include") {
  // The scan itself must be able to find what the rule forbids.
  const fs::path probe = fs::temp_directory_path() / "adjoint_layout_probe.cpp";
  {
    std::ofstream out(probe);
    out << "#include \"analysis/stitching/pair.h\"\n  #  include \"analysis/common/plot.h\"\n";
  }
  CHECK(included_analysis_folders(probe) == std::set<std::string>{"stitching", "common"});
  fs::remove(probe);
}

// Whether a line of C++ includes a header under `folder` (e.g. "tools/", the command line).
bool includes_under(const std::string& line, const std::string& folder) {
  static const std::regex include(R"re(^\s*#\s*include\s*[<"]([^>"]*))re");
  std::smatch m;
  return std::regex_search(line, m, include) && m[1].str().rfind(folder, 0) == 0;
}
bool includes_tools(const std::string& line) { return includes_under(line, "tools/"); }

TEST_CASE("layout: nothing below the command line includes tools/") {
  // engine/, ops/, models/, analysis/ and examples/ are the library and its readers; the
  // command line (tools/) is built on them and never the other way round.
  size_t checked = 0;
  for (const char* folder : {"engine", "ops", "models", "analysis", "examples"})
    for (const fs::path& file : sources_under(kRoot / folder)) {
      std::ifstream in(file);
      std::string line;
      for (int64_t number = 1; std::getline(in, line); ++number) {
        INFO(file.string(), ":", number, ": ", line);
        CHECK_FALSE(includes_tools(line));
      }
      ++checked;
    }
  CHECK(checked > 100);
}

TEST_CASE("layout: the core knows nothing of distribution") {
  // Tensors, autograd, the ops and the models run the same in one process as in a job of
  // many: ranks, collectives and the gradient buckets live in engine/distributed/, and only
  // the layers that split work between processes include it (the training loop in
  // models/training.*, the analysis protocols, the command line). Open MPI itself is called
  // from engine/distributed/ranks.cpp alone.
  const fs::path distributed = kRoot / "engine" / "distributed";
  const std::set<fs::path> training = {kRoot / "models" / "training.h", kRoot / "models" / "training.cpp"};
  size_t core = 0, others = 0;
  for (const char* folder : {"engine", "ops", "models", "analysis", "tools", "examples", "tests", "fuzz"})
    for (const fs::path& file : sources_under(kRoot / folder)) {
      const bool in_distributed = file.parent_path() == distributed;
      const bool is_core = (std::string(folder) == "engine" && !in_distributed) || std::string(folder) == "ops" ||
                           (std::string(folder) == "models" && !training.count(file));
      std::ifstream in(file);
      std::string line;
      for (int64_t number = 1; std::getline(in, line); ++number) {
        INFO(file.string(), ":", number, ": ", line);
        if (is_core) CHECK_FALSE(includes_under(line, "engine/distributed/"));
        if (file != distributed / "ranks.cpp") CHECK_FALSE(includes_under(line, "mpi.h"));
      }
      ++(is_core ? core : others);
    }
  CHECK(core > 100);
  CHECK(others > 100);
}

TEST_CASE("layout: the tools/ scan sees an include of tools/") {
  CHECK(includes_tools("#include \"tools/cli.h\""));
  CHECK(includes_tools("  #  include <tools/progress.h>"));
  CHECK_FALSE(includes_tools("#include \"models/model_source.h\""));
  CHECK_FALSE(includes_tools("// tools/cli.h parses the options"));
  CHECK(includes_under("#include <mpi.h>", "mpi.h"));
  CHECK(includes_under("#include \"engine/distributed/ranks.h\"", "engine/distributed/"));
  CHECK_FALSE(includes_under("#include \"engine/tensor.h\"", "engine/distributed/"));
}

TEST_CASE("layout: no file of the repository cites material a clone does not have") {
  // The maths lives in docs/methods.md; a path into a sibling folder of the checkout, or the
  // spec file that once lived there, would leave a reader of a clone with a dead reference.
  const std::vector<std::string> forbidden = {std::string("..") + "/shared", std::string("METHODS") + ".md"};
  const std::set<std::string> text = {".h", ".cpp", ".md", ".sh", ".py", ".build", ".txt", ".in", ".svg"};
  size_t checked = 0;
  for (auto it = fs::recursive_directory_iterator(kRoot); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name == ".git" || name.rfind("build", 0) == 0 || name == "runs")) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file() || !text.count(it->path().extension().string())) continue;
    std::ifstream in(it->path());
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number)
      for (const std::string& f : forbidden) {
        INFO(it->path().string(), ":", number, ": ", line);
        CHECK(line.find(f) == std::string::npos);
      }
    ++checked;
  }
  CHECK(checked > 200);
}
