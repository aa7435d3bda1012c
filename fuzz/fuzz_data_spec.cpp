// Data specs (--data): parsing and the synthetic sets (moduli up to 1000). Specs of the
// file-backed sets (fashion-mnist, mnist, cifar10, images, text) are given a folder of
// this process as their path, so that the fuzzer never reads the machine's own files.
#include <cstdlib>
#include <string>

#include "engine/data/open.h"
#include "engine/error.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string spec(reinterpret_cast<const char*>(data), size);
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  if (kind == "modadd" && colon != std::string::npos) {
    const long long modulus = std::strtoll(spec.c_str() + colon + 1, nullptr, 10);
    if (modulus > 1000 && modulus <= 4096) return 0;  // valid, but seconds each under ASan
  }
  if (kind != "modadd") {
    if (kind == "fashion-mnist" && colon == std::string::npos) return 0;  // the system's data set
    if (colon != std::string::npos) spec = kind + ":" + adjoint::fuzz::folder() + "/" + spec.substr(colon + 1);
  }
  try {
    adjoint::DataSource source = adjoint::open_data(spec);
    (void)source;
  } catch (const adjoint::Error&) {
  }
  return 0;
}
