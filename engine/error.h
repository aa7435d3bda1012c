// Errors carry their context as a one-line message: the op, tensor, file or option
// at fault and the shapes involved. The command line turns them into an exit code.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

#include "engine/shape.h"  // operator<< for shapes in messages

namespace adjoint {

// A failure of the engine or of a computation (exit code 1 on the command line).
class Error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// The user asked for something malformed: an unknown option, a bad value (exit code 2).
class UsageError : public Error {
public:
  using Error::Error;
};

// Concatenates anything streamable into one string.
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Throws Error(cat(parts...)) when the condition fails. The message is only built on failure.
template <class... Parts>
void check(bool condition, const Parts&... parts) {
  if (!condition) throw Error(cat(parts...));
}

}  // namespace adjoint
