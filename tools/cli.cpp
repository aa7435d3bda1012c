#include "tools/cli.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <sstream>

#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint::cli {

namespace {

// Function-local so that registrations from other files' static objects find it built.
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}

// Options every command takes.
const std::vector<OptionSpec>& global_options() {
  static const std::vector<OptionSpec> options = {
      {"threads", "N", "worker threads, 0 for all cores", "0"},
      {"help", "", "show this help and exit", ""},
  };
  return options;
}

const Command* find_command(const std::string& name) {
  for (const Command& c : registry())
    if (c.name == name) return &c;
  return nullptr;
}

std::string usage_line(const Command* command) {
  if (!command) return "usage: adjoint [--threads N] <command> [options]";
  std::string line = "usage: adjoint " + command->name + " [options]";
  if (!command->arguments.empty()) line += " " + command->arguments;
  return line;
}

void print_options(std::ostream& out, const std::vector<OptionSpec>& options) {
  size_t width = 0;
  for (const OptionSpec& o : options)
    width = std::max(width, o.name.size() + (o.value.empty() ? 0 : o.value.size() + 1));
  for (const OptionSpec& o : options) {
    std::string left = "--" + o.name + (o.value.empty() ? "" : " " + o.value);
    out << "  " << left << std::string(width + 4 - left.size() + 2, ' ') << o.help;
    if (!o.fallback.empty() && !o.value.empty()) out << " (default: " << o.fallback << ")";
    out << "\n";
  }
}

void print_main_help(std::ostream& out) {
  out << usage_line(nullptr) << "\n\nadjoint: a deep-learning engine with adjoint transports.\n\ncommands:\n";
  size_t width = 0;
  for (const Command* c : commands()) width = std::max(width, c->name.size());
  for (const Command* c : commands())
    out << "  " << c->name << std::string(width + 3 - c->name.size(), ' ') << c->summary << "\n";
  out << "\nglobal options:\n";
  print_options(out, global_options());
  out << "\nRun 'adjoint <command> --help' for a command's options.\n";
}

void print_command_help(std::ostream& out, const Command& c) {
  out << usage_line(&c) << "\n\n" << c.summary << "\n";
  if (!c.description.empty()) out << "\n" << c.description << "\n";
  if (!c.options.empty()) {
    out << "\noptions:\n";
    print_options(out, c.options);
  }
  out << "\nglobal options:\n";
  print_options(out, global_options());
}

const OptionSpec* find_option(const Command* command, const std::string& name) {
  if (command)
    for (const OptionSpec& o : command->options)
      if (o.name == name) return &o;
  for (const OptionSpec& o : global_options())
    if (o.name == name) return &o;
  return nullptr;
}

// The parse of argv: the command (null when none was named) and its Args.
struct Parsed {
  const Command* command = nullptr;
  std::map<std::string, std::string> values;
  std::vector<std::string> positionals;
};

// Reads `[global options] <command> [options and arguments]`. Options may come before or
// after the command name; an option's value is the next word unless given as --name=value.
Parsed parse(int argc, char** argv, const Command*& failed_in) {
  Parsed p;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    failed_in = p.command;
    if (!options_done && word == "--") {
      options_done = true;
      continue;
    }
    if (!options_done && (word == "-h" || word.rfind("--", 0) == 0)) {
      std::string name = word == "-h" ? "help" : word.substr(2), value;
      const size_t eq = name.find('=');
      const bool inline_value = eq != std::string::npos;
      if (inline_value) value = name.substr(eq + 1), name = name.substr(0, eq);
      const OptionSpec* spec = find_option(p.command, name);
      if (!spec)
        throw UsageError(p.command ? cat("unknown option --", name, " for '", p.command->name, "'")
                                   : cat("unknown option --", name, " (command options go after the command name)"));
      if (spec->value.empty()) {
        if (inline_value) throw UsageError(cat("option --", name, " takes no value"));
        value = std::string("true");  // (a temporary: GCC 12 misreports -Wrestrict on a literal)
      } else if (!inline_value) {
        if (i + 1 >= argc) throw UsageError(cat("option --", name, " expects a value ", spec->value));
        value = argv[++i];
      }
      if (p.values.count(name)) throw UsageError(cat("option --", name, " given more than once"));
      p.values[name] = value;
      continue;
    }
    if (!p.command) {
      p.command = find_command(word);
      if (!p.command) throw UsageError(cat("unknown command '", word, "'"));
      continue;
    }
    if (p.command->arguments.empty())
      throw UsageError(cat("unexpected argument '", word, "' ('", p.command->name, "' takes no arguments)"));
    p.positionals.push_back(word);
  }
  failed_in = p.command;
  return p;
}

// Refuses an --out that names no folder of its own: "" and "/" (however spelled) put every
// file a command writes into the filesystem root. Checked here, once, for every command.
void check_out_option(const Args& args) {
  if (!args.has("out")) return;
  const std::string out = args.text("out");
  if (out.empty()) throw UsageError("option --out expects a path, got ''");
  std::error_code ec;
  const std::filesystem::path resolved = std::filesystem::weakly_canonical(std::filesystem::absolute(out), ec);
  if (!ec && resolved == resolved.root_path())
    throw UsageError(cat("option --out: '", out, "' is the filesystem root; name a folder or file of its own"));
}

}  // namespace

Args::Args(std::string command, std::map<std::string, std::string> values, std::map<std::string, std::string> fallbacks,
           std::vector<std::string> positionals)
    : command_(std::move(command)),
      values_(std::move(values)),
      fallbacks_(std::move(fallbacks)),
      positionals_(std::move(positionals)) {}

std::map<std::string, std::string> Args::options() const {
  std::map<std::string, std::string> all = fallbacks_;
  for (const auto& [name, value] : values_) all[name] = value;
  all.erase("help");
  return all;
}

bool Args::flag(const std::string& name) const { return values_.count(name) > 0; }
bool Args::has(const std::string& name) const { return values_.count(name) > 0; }

std::string Args::text(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = fallbacks_.find(name); it != fallbacks_.end() && !it->second.empty()) return it->second;
  throw UsageError(cat("option --", name, " is required"));
}

int64_t Args::integer(const std::string& name) const {
  const std::string s = text(name);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range && end == s.data() + s.size())
    throw UsageError(cat("option --", name, ": ", s, " is too large (the limit is ±9223372036854775807)"));
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    throw UsageError(cat("option --", name, " expects an integer, got '", s, "'"));
  return v;
}

double Args::number(const std::string& name) const {
  const std::string s = text(name);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE)
    throw UsageError(cat("option --", name, " expects a number, got '", s, "'"));
  return v;
}

std::vector<std::string> Args::list(const std::string& name) const {
  std::vector<std::string> out;
  std::stringstream in(text(name));
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  if (out.empty()) throw UsageError(cat("option --", name, " expects a comma-separated list, got '", text(name), "'"));
  return out;
}

Registration::Registration(Command command) {
  check(!find_command(command.name), "command '", command.name, "' registered twice");
  registry().push_back(std::move(command));
}

std::vector<const Command*> commands() {
  std::vector<const Command*> out;
  for (const Command& c : registry()) out.push_back(&c);
  std::sort(out.begin(), out.end(), [](const Command* a, const Command* b) { return a->name < b->name; });
  return out;
}

int run(int argc, char** argv) {
  const Command* context = nullptr;  // the command a usage error belongs to
  try {
    Parsed p = parse(argc, argv, context);
    if (p.values.count("help")) {
      if (p.command)
        print_command_help(std::cout, *p.command);
      else
        print_main_help(std::cout);
      return 0;
    }
    if (!p.command) {
      print_main_help(std::cerr);
      return 2;
    }
    std::map<std::string, std::string> fallbacks;
    for (const OptionSpec& o : global_options()) fallbacks[o.name] = o.fallback;
    for (const OptionSpec& o : p.command->options) fallbacks[o.name] = o.fallback;
    Args args(p.command->name, std::move(p.values), std::move(fallbacks), std::move(p.positionals));
    const int64_t threads = args.integer("threads");
    if (threads < 0) throw UsageError(cat("option --threads expects a count >= 0, got ", threads));
    set_num_threads(static_cast<int>(threads));
    check_out_option(args);
    std::cout.flush();
    const int code = p.command->run(args);
    std::cout.flush();
    return code;
  } catch (const UsageError& e) {
    std::cerr << usage_line(context) << "\nadjoint: error: " << e.what() << "\n";
    std::cerr << "Run 'adjoint " << (context ? context->name + " " : std::string()) << "--help' for the options.\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "adjoint: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "adjoint: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "adjoint: error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << "adjoint: error: unknown failure\n";
    return 1;
  }
}

}  // namespace adjoint::cli
