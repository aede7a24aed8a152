// The allocator benchmark (docs/design.md §4): workloads A1-A5 on every allocator strategy, beside
// the raw resource as baseline, plus the cost of hooks. `poolscope bench alloc` and
// poolscope_bench_alloc both run this.
//
//   poolscope::bench::alloc_bench_options o;
//   o.resource = "host";
//   o.quick = true;
//   auto report = poolscope::bench::run_alloc_bench(o, &std::cerr);
//   report.print_table(std::cout);     // one row per workload/target, then the summary line
//   std::ofstream("perf.json") << report.to_json();
//
// Workloads (pairs are one allocate + one deallocate):
//   A1  fixed 1 MiB pairs, 1 thread (the cached fast path)
//   A2  1000 live blocks of log-uniform sizes in 512 B - 64 MiB; each pair frees a random live
//       block and allocates a new random size in its place
//   A3  64 KiB pairs from 1, 2, 4, 8, 16 threads on one shared allocator
//   A4  4 KiB / 16 KiB / 64 KiB blocks freed as holes between live 1 KiB blocks, then 1 KiB pairs
//   A5  sequence batches (workloads.hpp): peak reserved / peak requested; ns per pair over a step
//   H   hooks: best_fit/host 256 B pairs with no hook vs a counting hook, and the raw cost of
//       hooks::active() in a tight loop vs an empty loop
// Baselines: the resource's own try_allocate/deallocate, measured in the same run (on a device
// resource: cuda = cudaMalloc/cudaFree and cuda_async = cudaMallocAsync, where registered).
// Timing: see timing.hpp (batches of ~2 µs; median and p99 of per-batch means).
// Every allocator row uses a fresh allocator; its stats give peaks and upstream calls.
// Thread safety: run_alloc_bench is not reentrant with itself on one resource (timings would
// interfere), otherwise thread-safe. Cost: about workloads x targets x seconds_per_row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "poolscope/bench/timing.hpp"
#include "poolscope/pool/allocator_stats.hpp"

namespace poolscope::bench {

/// What to run. Empty lists mean "all"; zero or negative numbers mean "the default".
struct alloc_bench_options {
  std::string resource;                 ///< "" -> default_resource_name()
  int device = 0;                       ///< GPU ordinal for device resources
  std::vector<std::string> allocators;  ///< subset of pool::allocator_names()
  std::vector<int> threads;             ///< A3 thread counts (default 1, 2, 4, 8, 16)
  std::vector<std::string> workloads;   ///< subset of alloc_workload_names()
  bool quick = false;                   ///< a few seconds on host: fewer pairs, smaller A5
  std::uint64_t seed = 1;               ///< A2 / A5 random streams
  double seconds_per_row = 0.0;         ///< time budget per row (default 1 s, quick 0.05 s)
  double capacity_gib = -1.0;           ///< cap on the resource (default: host 80, device none)
  bool baselines = true;                ///< measure the raw resource rows
  /// Also run every allocator that make_allocator puts behind a thread_cache_adaptor (bfc,
  /// best_fit) without it, the strategy alone (target "<name> -tc"), and with no lock biased
  /// towards a thread (thread_cache_adaptor_options::owner_bias and, for bfc,
  /// bfc_options::lock_bias off: "<name> -bias"), beside the default rows: their effects in one
  /// run; for bfc also with neither ("bfc -tc -bias": against "bfc -tc", the pool lock's bias
  /// alone).
  bool compare_thread_cache = false;
  /// Also run bfc over a virtual resource (the "bfc over vmm" / "bfc over host_vmm" rows, and
  /// "bfc" when the resource is vmm or host_vmm) with the plain best fit instead of its mapped
  /// fit (bfc_options::mapped_fit_candidates 0; target "<name> -mapfit"): what the mapped fit
  /// saves in maps, in one run.
  bool compare_mapped_fit = false;
  /// Also run bfc over the virtual-memory twin of the resource (vmm on a GPU, host_vmm on the
  /// host; target "bfc over vmm" / "bfc over host_vmm"), where reserved is the bytes physically
  /// mapped: its rows beside the others in one run. Off, or when the resource is one of them.
  bool vmm_rows = true;
};

/// One row: a workload on one target.
struct bench_row {
  std::string workload;  ///< "A1" ... "A5", "H"
  std::string target;    ///< allocator strategy, resource name (baseline) or hook variant
  std::string kind;      ///< "allocator", "baseline" or "hook"
  int threads = 1;
  std::size_t ops = 0;    ///< timed pairs (all threads), or loop iterations for hook checks
  std::size_t batch = 0;  ///< pairs per timed batch
  sample_summary ns;      ///< ns per pair (per iteration for hook checks)
  std::optional<std::size_t> peak_requested;
  std::optional<std::size_t> peak_reserved;
  std::optional<double> ratio;                 ///< peak_reserved / peak_requested
  std::optional<pool::allocator_stats> stats;  ///< allocator rows: stats after the workload
  std::string note;
  std::string error;  ///< non-empty if the row failed (its numbers are then meaningless)
};

/// The hook-cost figures (also present as "H" rows).
struct hook_costs {
  double check_loop_ns = 0.0;  ///< per iteration of a loop testing hooks::active()
  double empty_loop_ns = 0.0;  ///< per iteration of the same loop without the test
  double check_ns = 0.0;       ///< check_loop_ns - empty_loop_ns: the cost of the check
  double pair_no_hook_ns = 0.0;
  double pair_counting_ns = 0.0;
  double per_event_ns = 0.0;  ///< (pair_counting - pair_no_hook) / events per pair
  std::size_t events_per_pair = 4;
  /// The largest --threads count, and per_event_ns measured with that many threads at once, each
  /// on a pool of its own (0 when threads is 1).
  int threads = 1;
  double per_event_threads_ns = 0.0;
  /// Per event on the allocating thread with profiler::recorder installed (POOLSCOPE_RECORD: a
  /// copy into its ring, written by its thread) and with profiler::snapshot_recorder (with
  /// stacks: POOLSCOPE_SNAPSHOT), each (pair - pair_no_hook) / 2: a pair's malloc post and free pre
  /// are the events they take. Events their rings dropped are counted beside.
  double per_event_recorder_ns = 0.0;
  double per_event_snapshot_ns = 0.0;
  std::uint64_t recorder_dropped = 0;
  std::uint64_t snapshot_dropped = 0;
};

/// Everything a run measured.
struct alloc_bench_report {
  std::string resource;
  int device = 0;
  bool quick = false;
  std::uint64_t seed = 0;
  double timer_overhead_ns = 0.0;
  bool owner_bias = false;              ///< locks may be biased towards threads here (membarrier)
  std::optional<std::size_t> capacity;  ///< the cap put on the resource, if any
  std::vector<bench_row> rows;
  std::optional<hook_costs> hooks;
  std::string summary;  ///< one line

  /// The table, then the summary line last.
  void print_table(std::ostream& out) const;
  /// The report as a JSON document (for docs/perf.md); includes the timing method.
  [[nodiscard]] std::string to_json() const;
  /// True if any row failed.
  [[nodiscard]] bool any_error() const;
};

/// "A1", "A2", "A3", "A4", "A5", "H".
[[nodiscard]] std::vector<std::string> alloc_workload_names();

/// "cuda" when a GPU is visible and the cuda resource is registered, else "host".
[[nodiscard]] std::string default_resource_name();

/// Runs the benchmark. Progress lines go to `progress` if given. Throws invalid_argument for
/// unknown names, device_unavailable / cuda_error if the resource cannot be created; a failure
/// inside one row is recorded in that row and the run goes on.
[[nodiscard]] alloc_bench_report run_alloc_bench(const alloc_bench_options& options,
                                                 std::ostream* progress = nullptr);

/// How the timings were taken, in a sentence or three (also in the JSON).
[[nodiscard]] std::string timing_method();

}  // namespace poolscope::bench
