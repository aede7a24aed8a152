// poolscope_bench_darray_scale: how darray's bookkeeping grows with the work — ops on arrays whose
// chunks arrived in P pieces beside the unsplit op, and the reshard planner over thousands of
// devices (poolscope/bench/darray_scale_bench.hpp says what each row measures).
//
//   poolscope_bench_darray_scale                          # every GPU, else host:2; both parts
//   poolscope_bench_darray_scale --only planner --planner-devices 1024,4096 --json plan.json
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>

#include "cli_checks.hpp"
#include "poolscope/bench/darray_scale_bench.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "darray at scale: ops on arrays of P pieces per chunk beside the unsplit op, and the "
      "reshard planner over thousands of devices"};
  poolscope::bench::darray_scale_options o;
  o.devices = "auto";
  std::string json_path;
  app.add_option("--devices", o.devices, "backend of the parts rows: auto, cuda, cuda:N, host:N")
      ->capture_default_str();
  app.add_option("--n", o.n, "float64 elements of the parts rows' arrays")
      ->check(poolscope::tools::positive_number())
      ->capture_default_str();
  app.add_option("--max-parts", o.max_parts, "the largest pieces per chunk (P = 1, 4, 16, ...)")
      ->check(poolscope::tools::positive_number())
      ->capture_default_str();
  app.add_option("--repeat", o.repeat, "timed runs per figure after a warm-up")
      ->check(poolscope::tools::whole_number(1, 100000))
      ->capture_default_str();
  app.add_option("--planner-devices", o.planner_devices, "device counts of the planner rows")
      ->delimiter(',')
      ->check(poolscope::tools::whole_number(2, 1 << 20));
  app.add_option("--planner-patterns", o.planner_patterns,
                 "planner patterns: rotate, rows_to_columns, split_07, replicate_to_blocks")
      ->delimiter(',')
      ->check(CLI::IsMember(poolscope::bench::planner_pattern_names()));
  app.add_option("--only", o.only, "parts, planner (default: both)")
      ->delimiter(',')
      ->check(CLI::IsMember({"parts", "planner"}));
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  // Scripts that drive every *_bench* program the Google Benchmark way pass this; each figure here
  // is the best of --repeat runs, so it is accepted and has no effect.
  double min_time = 0.0;
  app.add_option("--benchmark_min_time", min_time,
                 "accepted for Google Benchmark drivers; no effect")
      ->check(poolscope::tools::positive_number());
  try {
    app.parse(argc, argv);
    const auto rep = poolscope::bench::run_darray_scale_bench(o, &std::cerr);
    std::cout << rep.text;
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << rep.to_json() << "\n";
      if (!out) {
        std::fprintf(stderr, "poolscope_bench_darray_scale: cannot write %s\n", json_path.c_str());
        return 1;
      }
    }
    return 0;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "poolscope_bench_darray_scale: %s\n", e.what());
    return 1;
  }
}
