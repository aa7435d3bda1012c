#include "tools/attack_options.h"

#include "engine/error.h"
#include "models/model_source.h"

namespace adjoint {

std::vector<cli::OptionSpec> with_attack_options(std::vector<cli::OptionSpec> options) {
  std::string norms;
  for (const std::string& n : pgd_norm_names()) norms += (norms.empty() ? "" : " or ") + n;
  options.push_back({"pgd-norm", "NAME", "PGD norm: " + norms + " (sign steps in the ε-box, or normalised L2 steps in the ε-ball)", "linf"});
  options.push_back({"pgd-steps", "N", "PGD steps", "5"});
  options.push_back({"pgd-step-size", "X", "PGD step in [0,1] pixel units (0: 2.5·ε/steps)", "0"});
  options.push_back({"pgd-random-start", "", "start PGD from a random point of the ε-set, not the clean image", ""});
  return options;
}

PgdOptions attack_options(const cli::Args& a, float eps, uint64_t seed) {
  PgdOptions o;
  o.norm = a.text("pgd-norm");
  o.eps = eps;
  o.steps = a.integer("pgd-steps");
  o.step_size = float(a.number("pgd-step-size"));
  o.random_start = a.flag("pgd-random-start");
  o.seed = seed;
  check_pgd_options(o);
  return o;
}

std::vector<float> eps_grid(const cli::Args& a, const char* name) {
  const std::vector<float> grid = parse_floats(a.text(name), name);
  check_eps_grid(grid, name);
  return grid;
}

}  // namespace adjoint
