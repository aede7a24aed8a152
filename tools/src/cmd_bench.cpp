// `poolscope bench alloc`: the allocator benchmark (bench/, the same code and options as the
// poolscope_bench_alloc program). Exit code 3 if a row failed.
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "poolscope/bench/alloc_bench_cli.hpp"

namespace poolscope::tools {

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "run benchmarks");
  bench->require_subcommand(1);
  auto cmd = std::make_shared<bench::alloc_bench_command>();
  auto* alloc = bench->add_subcommand(
      "alloc",
      "allocator benchmark: workloads A1-A5 and hook costs on every strategy, with the "
      "raw resource as baseline");
  cmd->add_options(*alloc);
  alloc->callback([cmd] {
    const int rc = cmd->run(std::cout, std::cerr);
    if (rc != 0) {
      throw CLI::RuntimeError(rc);
    }
  });
}

}  // namespace poolscope::tools
