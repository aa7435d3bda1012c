// The PGD attack's command-line options, shared by `adjoint train --adversarial pgd`,
// `adjoint eval --pgd-eps LIST` and `adjoint stitch --raua-eps LIST` (analysis/common/robustness.h).
// ε itself is each command's own (one value to train at, a grid to evaluate on).
#pragma once
#include <vector>

#include "analysis/common/robustness.h"
#include "tools/cli.h"

namespace adjoint {

// --pgd-norm, --pgd-steps, --pgd-step-size, --pgd-random-start, added to `options`.
std::vector<cli::OptionSpec> with_attack_options(std::vector<cli::OptionSpec> options);

// The attack those options describe, with ε = `eps` and the random start seeded by `seed`;
// throws UsageError naming the option at fault.
PgdOptions attack_options(const cli::Args& args, float eps, uint64_t seed);

// The ε grid of option `name` ("0,0.025,0.05"), checked (analysis/common/robustness.h).
std::vector<float> eps_grid(const cli::Args& args, const char* name);

}  // namespace adjoint
