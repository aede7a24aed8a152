// The poolscope command: one subcommand per cmd_<name>.cpp, registered below.
#include <cstdio>
#include <exception>
#include <string_view>

#include "commands.hpp"

#ifndef POOLSCOPE_VERSION
#define POOLSCOPE_VERSION "unknown"
#endif

int main(int argc, char** argv) {
  CLI::App app{"poolscope: GPU memory pools and profiling"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "poolscope " POOLSCOPE_VERSION);
  poolscope::tools::register_demo(app);
  poolscope::tools::register_pools(app);
  poolscope::tools::register_bench(app);
  poolscope::tools::register_replay(app);
  poolscope::tools::register_report(app);
  poolscope::tools::register_trace(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    // poolscope's own messages already start with "poolscope: ".
    const std::string_view what = e.what();
    std::fprintf(stderr, "%s%.*s\n",
                 what.starts_with("poolscope") ? "" : "poolscope: ", static_cast<int>(what.size()),
                 what.data());
    return 1;
  }
  return 0;
}
