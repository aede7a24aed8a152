// The command-line face of the allocator benchmark, shared by `poolscope bench alloc` and
// poolscope_bench_alloc so both accept the same options and print the same output.
//
//   CLI::App app{"allocator benchmark"};
//   poolscope::tools::alloc_bench_command cmd;
//   cmd.add_options(app);
//   CLI11_PARSE(app, argc, argv);
//   return cmd.run(std::cout, std::cerr);
//
// Header-only: compiled into both programs (the bench library itself needs no CLI11).
// Thread safety: a plain value; run() runs the benchmark on the calling thread.
#pragma once

#include <CLI/CLI.hpp>
#include <fstream>
#include <ostream>
#include <string>

#include "cli_checks.hpp"
#include "output_option.hpp"
#include "poolscope/bench/alloc_bench.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/factory.hpp"

namespace poolscope::tools {

/// Options and action of the allocator benchmark command.
class alloc_bench_command {
 public:
  /// Adds --resource, --allocators, --threads, --workloads, --quick, --seed, --seconds,
  /// --capacity-gib, --no-baselines and --json to `app`.
  void add_options(CLI::App& app) {
    app.add_option("--resource", options_.resource,
                   "upstream resource (default: cuda with a GPU, else host)")
        ->check(CLI::IsMember(pool::resource_names()));
    app.add_option("--device", options_.device, "GPU ordinal for device resources")
        ->check(poolscope::tools::non_negative_number());
    app.add_option("--allocators", options_.allocators,
                   "comma-separated strategies (default: all registered)")
        ->delimiter(',')
        ->check(CLI::IsMember(pool::allocator_names()));
    app.add_option("--threads", options_.threads,
                   "comma-separated A3 thread counts (default "
                   "1,2,4,8,16)")
        ->delimiter(',')
        ->check(poolscope::tools::whole_number(1, 1024));
    app.add_option("--workloads", options_.workloads, "comma-separated workloads: A1..A5, H")
        ->delimiter(',')
        ->check(CLI::IsMember(bench::alloc_workload_names()));
    app.add_flag("--quick", options_.quick, "a few seconds on host: fewer pairs, smaller A5");
    app.add_option("--seed", options_.seed, "seed of the random workloads (A2, A5)");
    app.add_option("--seconds", options_.seconds_per_row,
                   "time budget per row (default 1, quick 0.05)")
        ->check(poolscope::tools::positive_number());
    app.add_option("--capacity-gib", options_.capacity_gib,
                   "cap the resource at this many GiB; 0 = none (default: 80 on host, none on a "
                   "GPU)")
        ->check(poolscope::tools::non_negative_number());
    app.add_flag("--no-baselines", no_baselines_, "skip the raw resource rows");
    app.add_flag("--no-vmm-rows", no_vmm_rows_,
                 "skip the rows of bfc over the resource's virtual-memory twin (vmm on a GPU, "
                 "host_vmm on the host)");
    app.add_flag("--compare-thread-cache", options_.compare_thread_cache,
                 "also run bfc and best_fit without the per-thread cache the default "
                 "composition puts in front of them (rows '<name> -tc') and with their locks "
                 "unbiased (rows '<name> -bias')");
    app.add_flag("--compare-mapped-fit", options_.compare_mapped_fit,
                 "also run bfc over a virtual resource (vmm, host_vmm) with the plain best fit "
                 "instead of its mapped fit (rows '<name> -mapfit')");
    app.add_option("--json", json_path_,
                   "also write the results as JSON to this file ('-': stdout, the table then "
                   "going to stderr)")
        ->check(path_value(true))
        ->transform(output_path_option());
    app.add_flag("--force", force_, "replace the --json file if it exists");
  }

  /// Runs the benchmark: table and summary line to `out`, progress to `progress`, JSON to the
  /// --json file. With --json - the JSON goes to `out` and the table to `progress`, so `out`
  /// holds one JSON document. Returns 0, or 1 if a row failed. Throws on bad names or a missing
  /// device.
  int run(std::ostream& out, std::ostream& progress) {
    options_.baselines = !no_baselines_;
    options_.vmm_rows = !no_vmm_rows_;
    const bench::alloc_bench_report rep = bench::run_alloc_bench(options_, &progress);
    if (json_path_ == "-") {
      rep.print_table(progress);
      out << rep.to_json() << '\n';
      out.flush();
      return rep.any_error() ? 1 : 0;
    }
    rep.print_table(out);
    if (!json_path_.empty()) {
      std::ofstream f(json_path_);
      f << rep.to_json() << '\n';
      if (!f) {
        throw runtime_error("poolscope bench: cannot write " + json_path_);
      }
    }
    return rep.any_error() ? 1 : 0;
  }

  [[nodiscard]] const bench::alloc_bench_options& options() const noexcept { return options_; }
  /// The --json path ("" if none, "-" for stdout).
  [[nodiscard]] const std::string& json_path() const noexcept { return json_path_; }
  /// Whether --force was given (an existing --json file may be replaced).
  [[nodiscard]] bool force() const noexcept { return force_; }
  /// Sets the time budget per row (what --seconds sets).
  void set_seconds_per_row(double s) noexcept { options_.seconds_per_row = s; }

 private:
  bench::alloc_bench_options options_;
  bool no_baselines_ = false;
  bool no_vmm_rows_ = false;
  bool force_ = false;
  std::string json_path_;
};

}  // namespace poolscope::tools
