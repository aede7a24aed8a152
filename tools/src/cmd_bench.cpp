// `poolscope bench alloc`: the allocator benchmark (bench/, the same code and options as the
// poolscope_bench_alloc program). `poolscope bench darray`: the distributed-array benchmark D1-D5
// (bench/darray_bench.hpp). Exit code 3 if a row or workload failed.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "alloc_bench_cli.hpp"
#include "cli_checks.hpp"
#include "cli_files.hpp"
#include "commands.hpp"
#include "devices_option.hpp"
#include "host_memory.hpp"
#include "launch.hpp"
#include "output_option.hpp"
#include "poolscope/bench/darray_bench.hpp"
#include "poolscope/bench/memory_access.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/error.hpp"
#include "rank_traces.hpp"

namespace poolscope::tools {

namespace {

// On host devices the arrays are host memory: refuses an --n or --matmul-n whose workloads
// clearly cannot fit, before anything runs (a workload that failed to allocate would otherwise
// fail alone, after filling the memory, and the run go on to the next). A lower bound of the
// largest workload's arrays at once: D1 A, B, C and A + B (16n bytes); D2 its side x side X, Z and
// the reshard (12 side^2); D4 A, B and the memcpy baseline's source and destination (16n); D5 X,
// Y, their one-device copies (16 m^2) and the product as a replica on every device (4 m^2 each).
// GPUs hold their arrays in device memory: not checked here.
void check_darray_bench_memory(const bench::darray_bench_options& o) {
  const bool host =
      o.devices.starts_with("host:") || (o.devices == "auto" && bench::gpu_count() == 0);
  if (!host) {
    return;
  }
  const std::int64_t devs = o.devices == "auto" ? 2 : std::stoll(o.devices.substr(5));
  const std::int64_t n = o.n > 0 ? o.n : std::int64_t{1} << 20;
  const std::int64_t m = o.matmul_n > 0 ? o.matmul_n : 256;
  const auto runs = [&o](const char* w) {
    return o.only.empty() || std::find(o.only.begin(), o.only.end(), w) != o.only.end();
  };
  const std::int64_t side = bench::d2_side(n, devs);
  const double nd = static_cast<double>(n);
  const double sd = static_cast<double>(side);
  const double md = static_cast<double>(m);
  const double vectors =
      std::max(runs("D1") || runs("D4") ? 16.0 * nd : 0.0, runs("D2") ? 12.0 * sd * sd : 0.0);
  const double matmul = runs("D5") ? (16.0 + 4.0 * static_cast<double>(devs)) * md * md : 0.0;
  const std::string what =
      vectors >= matmul
          ? "--n " + std::to_string(n) + " (on " + std::to_string(devs) + " host devices)"
          : "--matmul-n " + std::to_string(m) + " (on " + std::to_string(devs) + " host devices)";
  check_host_memory("poolscope bench darray", what, std::max(vectors, matmul));
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "run benchmarks");
  bench->require_subcommand(1);
  auto cmd = std::make_shared<alloc_bench_command>();
  auto* alloc = bench->add_subcommand(
      "alloc",
      "allocator benchmark: workloads A1-A5 and hook costs on every strategy, with the "
      "raw resource as baseline");
  cmd->add_options(*alloc);
  // The seed is unsigned: a negative one would wrap silently.
  alloc->get_option("--seed")->check(poolscope::tools::non_negative_number());
  alloc->callback([cmd] {
    check_file_arguments("poolscope bench alloc", {{"--json", cmd->json_path(), true}},
                         cmd->force());
    const int rc = cmd->run(std::cout, std::cerr);
    if (rc != 0) {
      throw CLI::RuntimeError(rc);
    }
  });

  struct darray_cli {
    bench::darray_bench_options options;
    std::string json_path;
    bool force = false;
  };
  auto d = std::make_shared<darray_cli>();
  auto* darray_cmd = bench->add_subcommand(
      "darray",
      "distributed-array benchmark: D1-D5 (reshard, fused ops, overhead, bandwidth, matmul) "
      "beside raw peer-copy / NCCL / d2d baselines (memcpy on host devices)");
  darray_cmd
      ->add_option("--devices", d->options.devices,
                   "backend: auto, cuda (every GPU), cuda:N (the first N GPUs), host:N (N host "
                   "devices)")
      ->check(devices_spec())
      ->capture_default_str();
  darray_cmd
      ->add_option("--n", d->options.n,
                   "D1 and D4 elements; D2's array is side x side, side the largest power of two "
                   "with side^2 <= n/2 (at least 1), raised to the device count if below it "
                   "(default 2^29 on GPUs, 2^20 on host devices)")
      ->check(poolscope::tools::positive_number());
  darray_cmd
      ->add_option("--matmul-n", d->options.matmul_n,
                   "D5 matrix side (default 8192 on GPUs, 256 on host devices)")
      ->check(poolscope::tools::positive_number());
  darray_cmd->add_option("--repeat", d->options.repeat, "timed runs per figure after a warm-up")
      ->check(poolscope::tools::whole_number(1, 100000))
      ->capture_default_str();
  darray_cmd->add_option("--transport", d->options.transport, "how reshards move data")
      ->check(CLI::IsMember({"auto", "peer", "nccl"}))
      ->capture_default_str();
  darray_cmd
      ->add_option("--between-ranks", d->options.between_ranks,
                   "how GPU data moves between ranks: auto (copy engines through CUDA IPC between "
                   "GPUs of one host, NCCL between hosts), nccl (a GPU of its own per rank) or "
                   "mpi (staged through pinned host memory; ranks may share a GPU)")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}))
      ->capture_default_str();
  darray_cmd
      ->add_option(
          "--staging-chunk", d->options.staging_chunk,
          "with --between-ranks mpi: each piece moves in chunks of this many bytes (16M, 4M; "
          "0: whole), so that its copy to the host, its MPI transfer and its copy to the "
          "device overlap; every rank must give the same")
      ->check(poolscope::tools::byte_count())
      ->capture_default_str();
  darray_cmd
      ->add_option("--issue-threads", d->options.issue_threads,
                   "threads enqueueing devices' shares of an op beside the caller's (-1: the "
                   "backend's default, one per GPU after the first with --kernel-graphs 0, "
                   "else none; 0: none)")
      ->check(poolscope::tools::whole_number(-1, 1024))
      ->capture_default_str();
  darray_cmd
      ->add_option("--kernel-graphs", d->options.kernel_graphs,
                   "CUDA: launch kernels as one-node graphs (1) or with cudaLaunchKernel (0)")
      ->check(poolscope::tools::on_off())
      ->capture_default_str();
  darray_cmd
      ->add_option("--yield-to-copies", d->options.yield_to_copies,
                   "CUDA: element-wise kernels run with fewer blocks while a large copy out of "
                   "their device is in flight (1) or always at full occupancy (0)")
      ->check(poolscope::tools::on_off())
      ->capture_default_str();
  darray_cmd
      ->add_option("--split-mib", d->options.split_mib,
                   "reshard pieces above this many MiB are split (0: never)")
      ->check(poolscope::tools::whole_number(0, std::int64_t{1} << 30))
      ->capture_default_str();
  darray_cmd->add_option("--allocator", d->options.allocator, "pool strategy per device")
      ->check(CLI::IsMember(pool::allocator_names()))
      ->capture_default_str();
  darray_cmd->add_option("--only", d->options.only, "comma-separated workloads: D1,D2,D3,D4,D5")
      ->delimiter(',')
      ->check(CLI::IsMember(bench::darray_workload_names()));
  darray_cmd
      ->add_option("--json", d->json_path,
                   "also write the results as JSON to this file ('-': stdout, the table "
                   "then goes to stderr)")
      ->check(path_value(true))
      ->transform(output_path_option());
  darray_cmd
      ->add_option("--trace", d->options.trace_path,
                   "write a Chrome trace of the runs (.gz compresses; on GPUs with CUPTI's "
                   "kernels, copies, memsets and markers); times then include its cost")
      ->check(path_value());
  darray_cmd->add_flag("--force", d->force, "replace the --json or --trace file if it exists");
  darray_cmd
      ->add_option("--cupti-kinds", d->options.cupti_kinds,
                   "with --trace on GPUs, the CUPTI activity to collect: all, or a "
                   "comma-separated list of kernels, copies, memsets, memory, sync, runtime, "
                   "driver, markers; add runtime to see every CUDA call an op makes")
      ->capture_default_str();
  darray_cmd->callback([d] {
    // Under a launcher every rank runs it over the devices of every rank; rank 0 prints and
    // writes the JSON, each rank its own trace, and rank 0 then joins them into the one --trace
    // names (as the demo does).
    const auto group = darray::process_group::from_launcher();
    agree_on_arguments(*group, "poolscope bench darray", "");
    bench::darray_bench_options o = d->options;
    o.group = group;
    o.trace_path = rank_output_path(o.trace_path, *group);
    const bool prints = group->rank() == 0;
    bench::darray_bench_report rep;
    merged_trace merged;
    on_every_rank(*group, "poolscope bench darray", [&] {
      check_file_arguments("poolscope bench darray",
                           {{"--json", d->json_path, true}, {"--trace", o.trace_path, true}},
                           d->force);
      check_darray_bench_memory(o);
      rep = bench::run_darray_bench(o, prints ? &std::cerr : nullptr);
      if (group->size() > 1 && !o.trace_path.empty()) {
        merged = merge_rank_traces(*group, d->options.trace_path, o.trace_path);
      }
    });
    if (prints) {
      // With the JSON on stdout, stdout holds nothing else.
      std::ostream& out = d->json_path == "-" ? std::cerr : std::cout;
      rep.print_table(out);
      if (!merged.path.empty() && merged.problem.empty()) {
        out << "trace of every rank: " << merged.path << " (" << merged.summary
            << "; poolscope trace summary " << merged.path << ")\n";
      }
      if (!d->json_path.empty()) {
        write_output("poolscope bench darray", "--json", d->json_path, rep.to_json() + "\n");
      }
    }
    if (!merged.problem.empty()) {
      if (prints) {
        std::cerr << "poolscope bench darray: the ranks' traces do not merge into " << merged.path
                  << ": " << merged.problem << "\n";
      }
      throw CLI::RuntimeError(1);
    }
    if (rep.any_error()) {
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace poolscope::tools
