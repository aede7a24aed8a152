// poolscope_bench_alloc: the allocator benchmark as a stand-alone program (the same code and
// options as `poolscope bench alloc`; see poolscope/bench/alloc_bench.hpp).
#include <cstdio>
#include <exception>
#include <iostream>

#include "poolscope/bench/alloc_bench_cli.hpp"

int main(int argc, char** argv) {
  CLI::App app{"poolscope allocator benchmark: A1-A5 and hook costs, with raw-resource baselines"};
  poolscope::bench::alloc_bench_command cmd;
  cmd.add_options(app);
  try {
    app.parse(argc, argv);
    return cmd.run(std::cout, std::cerr);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "poolscope_bench_alloc: %s\n", e.what());
    return 1;
  }
}
