// Tessera's exception types. Every public entry point reports bad input by
// throwing one of these, with a message that names the argument and what was
// expected, so callers (and the Python bindings) can map them precisely.
#pragma once
#include <stdexcept>
#include <string>

namespace tessera {

// Base of all Tessera errors.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed a value that violates the documented contract
// (shape, range, monotonicity, divisibility, workspace size ...).
// Python maps it to ValueError.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A caller passed a value of the wrong kind (dtype, device).
// Python maps it to TypeError.
class TypeMismatch : public Error {
 public:
  using Error::Error;
};

// A CUDA runtime / NVRTC call failed, or no GPU is present when one is needed.
class CudaError : public Error {
 public:
  using Error::Error;
};

// NVRTC rejected generated source; the message carries the log and the path
// of the generated source on disk.
class CompileError : public Error {
 public:
  using Error::Error;
};

}  // namespace tessera

// Throws InvalidArgument with a formatted message when `cond` is false.
#define TESSERA_CHECK_ARG(cond, msg)                    \
  do {                                                  \
    if (!(cond)) throw ::tessera::InvalidArgument(msg); \
  } while (0)
