// The CLI's output options under a launcher: `--json out.%r.json` becomes out.1.json on rank 1
// (%r: the launcher's rank, %p: the pid, %%: a '%'; profiler/output_path.hpp), so the ranks of
// one launch never write over each other's files.
//
//   sub->add_option("--json", cmd->json_path, "...")->transform(output_path_option());
//
// Header-only (needs CLI11 and poolscope::profiler). Thread safety: reentrant (reads the
// environment). A '%' followed by anything else is refused when the option is parsed, naming it.
#pragma once

#include <CLI/CLI.hpp>
#include <exception>
#include <string>

#include "poolscope/profiler/output_path.hpp"

namespace poolscope::tools {

/// Expands %r, %p and %% in an output path as it is parsed ("-", stdout, stays).
inline CLI::Validator output_path_option() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s == "-") {
          return {};
        }
        try {
          s = profiler::expand_output_path(s);
        } catch (const std::exception& e) {
          return e.what();
        }
        return {};
      },
      "PATH (%r: rank, %p: pid)", "output_path");
}

}  // namespace poolscope::tools
