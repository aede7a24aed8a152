// The --devices option of `poolscope demo` and `poolscope bench darray`: a darray backend spec
// (darray::make_backend), checked while the command line is parsed so that a bad one is named
// with what is wrong before anything runs:
//   --devices: 'cuda:0': the device count 0 is outside 1..64 (host:N: N host devices; cuda:N: ...)
//
// Header-only (needs CLI11). Thread safety: reentrant.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "poolscope/darray/backend.hpp"

namespace poolscope::tools {

/// A CLI11 validator for a darray backend spec (darray::backend_spec_error says what is wrong).
inline CLI::Validator devices_spec() {
  return CLI::Validator(
      [](std::string& s) {
        const std::string error = darray::backend_spec_error(s);
        return error.empty() ? error : "'" + s + "': " + error;
      },
      "SPEC", "devices_spec");
}

}  // namespace poolscope::tools
