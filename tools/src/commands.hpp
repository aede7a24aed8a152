// Subcommands of the poolscope CLI. Each lives in its own cmd_<name>.cpp and registers itself
// on the app; main.cpp calls every register function.
#pragma once

#include <CLI/CLI.hpp>

namespace poolscope::tools {

void register_demo(CLI::App& app);
void register_bench(CLI::App& app);

}  // namespace poolscope::tools
