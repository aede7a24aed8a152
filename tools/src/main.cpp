#include <cstdio>
#include <exception>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"poolscope: GPU memory pools and profiling"};
  app.require_subcommand(1);
  poolscope::tools::register_demo(app);
  poolscope::tools::register_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "poolscope: %s\n", e.what());
    return 1;
  }
  return 0;
}
