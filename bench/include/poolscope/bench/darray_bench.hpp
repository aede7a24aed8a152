// The distributed-array benchmark (docs/design.md §4, D1-D5): darray's reshard, fused ops, small-op
// overhead, elementwise bandwidth and block matmul, each beside its baseline measured in the same
// run. `poolscope bench darray` runs this.
//
//   poolscope::bench::darray_bench_options o;
//   o.devices = "host:2";
//   o.n = 1 << 16;
//   auto report = poolscope::bench::run_darray_bench(o, &std::cerr);
//   report.print_table(std::cout);          // one row per figure, then the summary line
//   std::ofstream("darray.json") << report.to_json();
//
// Workloads (float32; "maps" are darray index maps over the backend's devices):
//   D1  1-D, n elements. A and B in equal blocks (split at n/2 on two devices), C in blocks shifted
//       by 0.4 of a block (split at 0.7 n on two devices). T_add = A + B, T_reshard =
//       C.reshard(A.index_map()), T_fused = A + C.reshard(A.index_map()),
//       eta = (T_reshard + T_add - T_fused) / min(T_reshard, T_add). Reshard bandwidth (remote
//       bytes / T_reshard) over the raw copies of the plan's links (cudaMemcpyPeerAsync, and NCCL
//       send/recv), and raw peer bandwidth 0 -> 1 and 0 <-> 1 of the same bytes.
//   D2  2-D side x side (side: the largest power of two <= sqrt(n / 2), 16384 at n = 2^29), rows
//       in blocks -> columns in blocks, fused with an add: X.reshard(cols) + Z (Z column-split),
//       beside the raw all-to-all copies of the plan's links.
//   D3  D1's ops at n = 4096: medians of T_add and T_fused in µs (the per-op overhead: each op
//       issued and waited for, a round trip), beside the raw copy of the fused op's remote bytes;
//       and the same ops per op in a chain of 64 (x = x + B, x = x + C.reshard(A.index_map())),
//       one wait at the end: the rate a loop of small dependent ops sustains.
//   D4  one device: A + B (2 reads + 1 write per element) effective bandwidth over the raw d2d
//       copy bandwidth of an array of the same size (1 read + 1 write).
//   D5  block matmul of two square matrices on grid maps over the devices,
//       matmul(x, y).change_mode(replica), in TFLOP/s, beside the same matmul on device 0 alone.
// Baselines: on GPUs raw CUDA/NCCL calls (bench's CUDA seam); on host devices memcpy, one thread
// per link (the table says which). Timing: wall clock from the first enqueue to the end of wait(),
// one untimed warm-up, then `repeat` runs (D3: max(100, 20 * repeat)); figures use the best run,
// the JSON also holds the median. Targets: docs/perf.md "Targets", checked on GPUs only.
// Thread safety: run_darray_bench runs on the calling thread and owns its backend; the report is a
// plain value. Cost: about 5 x (repeat + 1) x the largest op; minutes at GPU sizes on a host.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "poolscope/darray/process_group.hpp"

namespace poolscope::bench {

/// What to run. Zero sizes mean "the default".
struct darray_bench_options {
  std::string devices = "auto";    ///< backend spec: auto, cuda, cuda:N, host:N
  std::int64_t n = 0;              ///< D1 elements (0: 2^29 on GPUs, 2^20 on host devices)
  std::int64_t matmul_n = 0;       ///< D5 matrix side (0: 8192 on GPUs, 256 on host devices)
  int repeat = 5;                  ///< timed runs per figure, after one warm-up
  std::string transport = "auto";  ///< auto, peer or nccl: how reshards move data
  /// darray::backend_options::between_ranks: auto, nccl or mpi (GPUs of several ranks).
  std::string between_ranks = "auto";
  /// darray::backend_options::staging_chunk_bytes as a byte count ("16M"; "0": pieces whole).
  std::string staging_chunk = "16M";
  std::string allocator = "bfc";  ///< darray's pool strategy per device
  /// backend_options::issue_threads (-1: the backend's default)
  int issue_threads = -1;
  /// backend_options::kernel_graphs: CUDA kernels launched as graphs (default) or plainly.
  bool kernel_graphs = true;
  /// backend_options::yield_to_copies: compute yields memory bandwidth to copies out of its
  /// device (default) or runs at full occupancy.
  bool yield_to_copies = true;
  /// Reshard pieces above this many MiB are split (reshard_options::split_bytes; 0: never).
  std::int64_t split_mib = 64;
  std::vector<std::string> only;  ///< subset of darray_workload_names() (empty: all)
  /// Write a Chrome trace of the runs here (".gz" compresses): the darray ops' host slices, the
  /// pools' events and, on GPUs, what ran on the devices (CUPTI kernels, copies, memsets and
  /// NVTX markers); each workload is a slice "bench.D1" ..., each run of a timed figure one
  /// "bench.D1.fused" ... (warm-up included). Empty: no trace. The times then include the
  /// tracing's cost.
  std::string trace_path;
  /// With trace_path on GPUs: the CUPTI activity kinds to collect (profiler::with_activity_kinds:
  /// "all" or a list of kernels, copies, memsets, memory, sync, runtime, driver, markers). Add
  /// "runtime" to see each CUDA call an op makes, and how long it held the host.
  std::string cupti_kinds = "kernels,copies,memsets,markers";
  /// The ranks the backend spans (null: a group of one). With several, each timed run starts
  /// after a barrier and takes its slowest rank's time; the raw baselines (one process's calls)
  /// and D3, D4 are left out.
  std::shared_ptr<darray::process_group> group;
};

/// One baseline: what was timed, on how many bytes, and how fast.
struct darray_baseline {
  std::string method;      ///< "cudaMemcpyPeerAsync", "ncclSend/ncclRecv", "memcpy", ...
  std::int64_t bytes = 0;  ///< bytes moved per run (all links together)
  double best_ms = 0.0;
  double median_ms = 0.0;
  double gbps = 0.0;  ///< bytes / best, in GB/s (1e9 B/s)
};

/// What one workload measured. Figures are named in snake_case with their unit as suffix
/// (t_add_ms, reshard_gbps, eta, bytes_moved, ...); see the workload list in the file comment.
struct darray_workload_result {
  std::string name;  ///< "D1" ... "D5"
  std::string what;  ///< one line
  std::map<std::string, double> figures;
  std::map<std::string, darray_baseline> baselines;  ///< "peer", "peer_bidirectional", "nccl", ...
  /// What the darray backend did during the workload (warm-up, timed runs, and the darray
  /// side of baselines), as differences of darray::backend_stats under the names of
  /// darray::backend_stats_fields ("bytes_peer", "compute_yielding", ...) — whether a mechanism
  /// engaged (compute yielding to copies in D1 and D2 on GPUs, say).
  std::map<std::string, std::uint64_t> backend;
  std::string error;  ///< non-empty if the workload failed
};

/// One line of the table.
struct darray_bench_row {
  std::string workload;
  std::string figure;
  std::string value;
  std::string baseline;
  std::string ratio;
  std::string target;
  std::optional<bool> met;  ///< set where a target applies (GPUs only)
};

/// Everything a run measured.
struct darray_bench_report {
  std::string backend;  ///< "host:2", "cuda:2"
  int devices = 0;
  bool gpu = false;
  std::vector<std::string> device_names;
  std::string baselines;  ///< "cuda" or "memcpy"
  std::string allocator;
  std::string transport;
  std::string between_ranks;            ///< darray_bench_options::between_ranks
  std::size_t staging_chunk_bytes = 0;  ///< darray_bench_options::staging_chunk, parsed
  std::size_t issue_threads = 0;        ///< the backend's issuing threads (backend::issue_threads)
  bool kernel_graphs = true;            ///< darray_bench_options::kernel_graphs
  bool yield_to_copies = true;          ///< darray_bench_options::yield_to_copies
  std::int64_t split_mib = 64;          ///< reshard pieces above this are split (0: never)
  int repeat = 0;
  std::int64_t n = 0;      ///< D1 elements
  std::string trace_path;  ///< darray_bench_options::trace_path (empty: not traced)
  /// The CUPTI activity kinds the trace collected (activity_kinds_of; empty: no CUPTI).
  std::string cupti_kinds;
  std::vector<darray_workload_result> workloads;
  std::vector<darray_bench_row> rows;
  std::string summary;  ///< one line
  std::string text;     ///< the table, then the summary line last

  /// Prints `text`.
  void print_table(std::ostream& out) const;
  /// The report as a JSON document: options, workloads (figures, baselines), rows, summary.
  [[nodiscard]] std::string to_json() const;
  /// True if a workload failed.
  [[nodiscard]] bool any_error() const;
};

/// η of docs/design.md §4 (D1), (T_reshard + T_add - T_fused) / min(T_reshard, T_add): 1 when the
/// fused op costs no more than the longer of its parts. None when the reshard moved no byte (one
/// device: no transfer to hide, and the formula would divide by a reshard of no time) or a time
/// is not positive. `poolscope bench darray` and `poolscope demo` both report it.
[[nodiscard]] inline std::optional<double> fusion_eta(double add_ms, double reshard_ms,
                                                      double fused_ms,
                                                      std::int64_t bytes_moved) noexcept {
  const double lo = add_ms < reshard_ms ? add_ms : reshard_ms;
  if (bytes_moved <= 0 || !(lo > 0)) {
    return std::nullopt;
  }
  return (reshard_ms + add_ms - fused_ms) / lo;
}

/// D2's side for D1's `n` elements on `devices` devices: the largest power of two whose square
/// is at most n / 2 (at least 1), raised to `devices` if below it (a block per device).
[[nodiscard]] inline std::int64_t d2_side(std::int64_t n, std::int64_t devices) noexcept {
  std::int64_t side = 1;
  while ((2 * side) * (2 * side) <= n / 2) {
    side *= 2;
  }
  return side < devices ? devices : side;
}

/// "D1", "D2", "D3", "D4", "D5".
[[nodiscard]] std::vector<std::string> darray_workload_names();

/// Runs the benchmark. Progress lines go to `progress` if given. Throws invalid_argument for bad
/// options (naming the value), device_unavailable for "cuda" without a GPU; a failure inside a
/// workload (out of memory, say) is recorded in that workload and the run goes on.
[[nodiscard]] darray_bench_report run_darray_bench(const darray_bench_options& options,
                                                   std::ostream* progress = nullptr);

}  // namespace poolscope::bench
