// `poolscope demo`: the distributed-array demo (see darray_demo.hpp). Exit code 1 when a check
// against the host fails (on any rank, under a launcher: every rank exits so), 2 for a usage
// error. The trace and the report go where --trace and --report say, else into --out, else into
// a fresh folder made for the run (printed with the summary): a plain `poolscope demo` writes
// nothing into the current folder and replaces no file.
#include <filesystem>
#include <iostream>
#include <memory>
#include <system_error>

#include "cli_checks.hpp"
#include "cli_files.hpp"
#include "commands.hpp"
#include "darray_demo.hpp"
#include "devices_option.hpp"
#include "launch.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/pool/factory.hpp"

namespace poolscope::tools {

namespace {

// Where the demo's outputs go, as given on the command line ("" where not given).
struct demo_outputs {
  std::string folder;
  std::string trace;
  std::string report;
};

// The trace and report paths of the run: those named, the others in the folder named (made if
// missing) or in a fresh one.
void resolve_outputs(const demo_outputs& d, darray_demo_options& o) {
  std::string folder = d.folder;
  if (!d.trace.empty() && !d.report.empty()) {
    folder.clear();
  } else if (folder.empty()) {
    folder = fresh_output_folder("poolscope demo", "poolscope-demo");
  } else {
    std::error_code ec;
    std::filesystem::create_directories(folder, ec);
    if (ec) {
      throw usage_error("poolscope demo: --out '" + folder + "' cannot be made: " + ec.message());
    }
  }
  const auto in_folder = [&folder](const char* name) {
    return (std::filesystem::path(folder) / name).string();
  };
  o.trace_path = d.trace.empty() ? in_folder("trace.json") : d.trace;
  o.report_path = d.report.empty() ? in_folder("report.json") : d.report;
}

}  // namespace

void register_demo(CLI::App& app) {
  auto o = std::make_shared<darray_demo_options>();
  auto outputs = std::make_shared<demo_outputs>();
  auto* sub = app.add_subcommand(
      "demo",
      "distributed arrays on every GPU (host:2 without one): A + B, A + "
      "C.reshard(A.index_map()), reductions and a block matmul, checked against the host, with a "
      "Chrome trace and a JSON report");
  sub->add_option("--devices", o->devices,
                  "auto, cuda (every GPU), cuda:N (the first N GPUs) or host:N (N host devices)")
      ->check(devices_spec())
      ->capture_default_str();
  sub->add_option("--n", o->n,
                  "elements of the 1-D arrays (default 2^26 on 1-2 GPUs, times (GPUs/2)^2 on more; "
                  "2^22 on host devices)")
      ->check(poolscope::tools::whole_number(1, std::int64_t{1} << 34));
  sub->add_option("--matmul-n", o->matmul_n, "size of the square matmul (default 2048 / 192)")
      ->check(poolscope::tools::whole_number(1, std::int64_t{1} << 16));
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
                  "how GPU data moves between ranks: auto (copy engines through CUDA IPC between "
                  "GPUs of one host, NCCL between hosts), nccl (a GPU of its own per rank) or mpi "
                  "(staged through pinned host memory; ranks may share a GPU)")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}))
      ->capture_default_str();
  sub->add_option(
         "--staging-chunk", o->staging_chunk,
         "with --between-ranks mpi: each piece moves in chunks of this many bytes (16M, 4M; "
         "0: whole), so that its copy to the host, its MPI transfer and its copy to the "
         "device overlap; every rank must give the same")
      ->check(poolscope::tools::byte_count())
      ->capture_default_str();
  sub->add_option("--out", outputs->folder,
                  "folder for trace.json and report.json (made if missing; default: a fresh "
                  "folder in $TMPDIR, named in the summary)")
      ->check(path_value());
  sub->add_option("--trace", outputs->trace,
                  "the Chrome trace's path instead (.gz compresses; open it in Perfetto); "
                  "alone, the default")
      ->expected(0, 1)
      ->check(path_value());
  sub->add_option("--report", outputs->report,
                  "the JSON report's path instead (not the --trace file); alone, the default")
      ->expected(0, 1)
      ->check(path_value());
  sub->add_flag("--force", o->overwrite, "replace a trace or report file that exists");
  sub->add_option("--repeat", o->repeat,
                  "timed rounds of A + B, the reshard and the fused op, taking turns; the best "
                  "of each is kept (default 3 on GPUs, 20 on host devices)")
      ->check(poolscope::tools::whole_number(1, 1000));
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
  sub->callback([o, outputs] {
    const auto group = darray::process_group::from_launcher();
    agree_on_arguments(*group, "poolscope demo", "");
    darray_demo_result r;
    on_every_rank(*group, "poolscope demo", [&] {
      resolve_outputs(*outputs, *o);
      r = run_darray_demo(*o, group->rank() == 0 ? &std::cerr : nullptr);
    });
    std::cout << r.text;
    if (!r.ok()) {
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace poolscope::tools
