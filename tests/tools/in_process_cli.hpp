// poolscope subcommands run in-process by tests (replay_cli_test.cpp, report_cli_test.cpp): the
// arguments parsed on a fresh CLI::App with the given commands registered, and what they wrote to
// std::cout returned. Exceptions (a command's typed errors, CLI11's parse errors) propagate to the
// test; std::cout is restored on every path.
#pragma once

#include <CLI/CLI.hpp>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace poolscope::testing {

/// Parses `args` (after the program name) on an app with `commands` registered (each a
/// `void(CLI::App&)`, such as tools::register_report); returns what the command printed.
template <typename... Register>
std::string run_in_process(const std::vector<std::string>& args, Register... commands) {
  CLI::App app{"poolscope"};
  app.require_subcommand(1);
  (commands(app), ...);
  std::vector<const char*> argv{"poolscope"};
  for (const auto& a : args) {
    argv.push_back(a.c_str());
  }
  std::ostringstream out;
  std::streambuf* const old = std::cout.rdbuf(out.rdbuf());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  return out.str();
}

}  // namespace poolscope::testing
