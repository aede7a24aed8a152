// `poolscope demo`: the distributed-array demo (see darray_demo.hpp). Exit code 2 when a check
// against the host fails (on any rank, under a launcher: every rank exits so).
#include <iostream>
#include <memory>

#include "cli_checks.hpp"
#include "commands.hpp"
#include "darray_demo.hpp"
#include "devices_option.hpp"
#include "launch.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/pool/factory.hpp"

namespace poolscope::tools {

void register_demo(CLI::App& app) {
  auto o = std::make_shared<darray_demo_options>();
  auto* sub = app.add_subcommand(
      "demo",
      "the seed example at scale on every GPU (host:2 without one): A + B, A + "
      "C.reshard(A.index_map()), reductions and a block matmul, checked against the host, with a "
      "Chrome trace and a JSON report");
  sub->add_option("--devices", o->devices,
                  "auto, cuda (every GPU), cuda:N (the first N GPUs) or host:N (N host devices)")
      ->check(devices_spec())
      ->capture_default_str();
  sub->add_option("--n", o->n,
                  "elements of the 1-D arrays (default 2^26 on 1-2 GPUs, times (GPUs/2)^2 on more; "
                  "2^22 on host devices)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 34));
  sub->add_option("--matmul-n", o->matmul_n, "size of the square matmul (default 2048 / 192)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  sub->add_option("--allocator", o->allocator, "pool strategy of every device")
      ->check(CLI::IsMember(pool::allocator_names()))
      ->capture_default_str();
  sub->add_option("--resource", o->resource,
                  "upstream resource of every device's pool (default: cuda on GPUs, host on host "
                  "devices; vmm / host_vmm: memory mapped as the pools need it)")
      ->check(CLI::IsMember(pool::resource_names()));
  sub->add_option("--transport", o->transport, "how pieces move between GPUs")
      ->check(CLI::IsMember({"auto", "peer", "nccl"}))
      ->capture_default_str();
  sub->add_option("--between-ranks", o->between_ranks,
                  "how GPU data moves between ranks: nccl (a GPU of its own per rank) or mpi "
                  "(staged through pinned host memory; ranks may share a GPU)")
      ->check(CLI::IsMember({"nccl", "mpi"}))
      ->capture_default_str();
  sub->add_option("--trace", o->trace_path, "Chrome trace to write (.gz compresses)")
      ->capture_default_str();
  sub->add_option("--report", o->report_path, "JSON report to write (not the --trace file)")
      ->capture_default_str();
  sub->add_option("--repeat", o->repeat,
                  "timed rounds of A + B, the reshard and the fused op, taking turns; the best "
                  "of each is kept (default 3 on GPUs, 20 on host devices)")
      ->check(CLI::Range(1, 1000));
  sub->add_option("--seed", o->seed, "seed of the data")
      ->check(poolscope::tools::non_negative_number())
      ->capture_default_str();
  sub->add_option("--kernel-graphs", o->kernel_graphs,
                  "CUDA: launch kernels as one-node graphs (1) or with cudaLaunchKernel (0)")
      ->check(poolscope::tools::on_off())
      ->capture_default_str();
  sub->add_option("--yield-to-copies", o->yield_to_copies,
                  "CUDA: element-wise kernels run with fewer blocks while a large copy out of "
                  "their device is in flight (1) or always at full occupancy (0)")
      ->check(poolscope::tools::on_off())
      ->capture_default_str();
  sub->add_flag("!--no-cupti", o->cupti, "do not collect CUPTI activity");
  sub->add_option("--cupti-kinds", o->cupti_kinds,
                  "CUPTI activity to collect: all, or a comma-separated list of kernels, copies, "
                  "memsets, memory, sync, runtime, driver, markers (markers makes CUPTI the "
                  "NVTX tool). The default leaves out the API records (runtime, driver, sync, "
                  "memory), which cost the small steps most; add runtime for the trace's launch "
                  "flows")
      ->capture_default_str();
  sub->callback([o] {
    const auto group = darray::process_group::from_launcher();
    agree_on_arguments(*group, "poolscope demo", "");
    darray_demo_result r;
    on_every_rank(*group, "poolscope demo",
                  [&] { r = run_darray_demo(*o, group->rank() == 0 ? &std::cerr : nullptr); });
    std::cout << r.text;
    if (!r.ok()) {
      throw CLI::RuntimeError(2);
    }
  });
}

}  // namespace poolscope::tools
