#include "commands.hpp"

namespace poolscope::tools {
void register_bench(CLI::App& app) {
  app.add_subcommand("bench", "run benchmarks");
}
}  // namespace poolscope::tools
