// poolscope_bench_alloc: the allocator benchmark as a stand-alone program (the same code and
// options as `poolscope bench alloc`; see poolscope/bench/alloc_bench.hpp).
#include <cstdio>
#include <exception>
#include <iostream>

#include "alloc_bench_cli.hpp"
#include "cli_checks.hpp"

int main(int argc, char** argv) {
  CLI::App app{"poolscope allocator benchmark: A1-A5 and hook costs, with raw-resource baselines"};
  poolscope::tools::alloc_bench_command cmd;
  cmd.add_options(app);
  // Scripts that drive every *_bench* program the Google Benchmark way pass this; here it is the
  // time budget per row.
  double min_time = 0.0;
  app.add_option("--benchmark_min_time", min_time,
                 "same as --seconds (for Google Benchmark "
                 "drivers)")
      ->check(poolscope::tools::positive_number());
  try {
    app.parse(argc, argv);
    if (min_time > 0.0) {
      cmd.set_seconds_per_row(min_time);
    }
    return cmd.run(std::cout, std::cerr);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "poolscope_bench_alloc: %s\n", e.what());
    return 1;
  }
}
