#include "commands.hpp"

namespace poolscope::tools {
void register_demo(CLI::App& app) {
  app.add_subcommand("demo", "run the demo workload");
}
}  // namespace poolscope::tools
