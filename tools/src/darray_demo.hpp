// `poolscope demo`: the seed example at scale on every GPU present (host:2 without one) —
// A and B split at N/2, C split at 0.7 N; A + B; A + C.reshard(A.index_map()); reductions; a
// block matmul — every result checked against a host computation, under the timeline, the line
// profiler and the function profiler, writing a Chrome trace and a JSON report.
//
//   poolscope::tools::darray_demo_options o;
//   o.devices = "host:2";
//   auto r = poolscope::tools::run_darray_demo(o, &std::cerr);
//   std::cout << r.text;
//   return r.ok() ? 0 : 1;
//
// Times are wall-clock on the host from the first enqueue to the end of the last piece of work:
// the three steps take turns for `repeat` rounds after a warm-up round, and each keeps its best
// (so a drift of the machine's speed slows all three alike). eta = (T_reshard + T_add - T_fused) /
// min(T_reshard, T_add), docs/design.md §4 (D1): 1 when the fused op costs no more than the longer
// of its parts; n/a (NaN, null in the report) when the reshard moves nothing. Thread safety:
// run_darray_demo runs on the calling thread. The result is a plain value.
//
// Under a launcher (mpirun -np N poolscope demo --devices host:K) every rank runs it (SPMD): the
// arrays spread over the devices of every rank, each rank checks what to_host gathers against
// the host, writes its own trace and report (t.json -> t.rank<r>.json; %r and %p in a path are
// the rank and the pid), and rank 0 prints the summary of every rank's part.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace poolscope::tools {

/// The CUPTI activity the demo collects unless told otherwise: what runs on the devices and the
/// NVTX ranges, without the per-call records of the CUDA APIs.
inline constexpr std::string_view default_demo_cupti_kinds = "kernels,copies,memsets,markers";

/// What the demo runs.
struct darray_demo_options {
  std::string devices = "auto";  ///< backend spec: auto, cuda, cuda:N, host:N
  std::int64_t n = 0;            ///< elements of A, B, C (0: 2^26 on 1-2 GPUs, times (GPUs / 2)^2
                                 ///< on more; 2^22 on host devices)
  std::int64_t matmul_n = 0;     ///< matmul size (0: 2048 on GPUs, 192 on host devices)
  std::string allocator = "bfc";
  /// Upstream resource of every device's pool ("": cuda on GPUs, host on host devices; vmm and
  /// host_vmm map memory as the pools need it, docs/vmm.md).
  std::string resource;
  std::string transport = "auto";  ///< auto, peer, nccl
  /// darray::backend_options::between_ranks: auto, nccl or mpi (GPUs of several ranks).
  std::string between_ranks = "auto";
  /// darray::backend_options::staging_chunk_bytes as a byte count ("16M"; "0": pieces whole).
  std::string staging_chunk = "16M";
  std::string trace_path = "trace.json";
  std::string report_path = "report.json";
  bool overwrite = false;  ///< replace a trace or report file that exists (else refused)
  int repeat = 0;          ///< rounds; 0: 3 on GPUs, 20 on host devices
  std::uint64_t seed = 1;
  bool cupti = true;  ///< collect CUPTI activity on GPUs
  /// profiler::with_activity_kinds' list. The records of API calls (runtime, driver, sync,
  /// memory), left out by default, are what makes CUPTI costly (docs/perf.md, "CUPTI's default
  /// kinds"); with runtime the trace has its launch flows.
  std::string cupti_kinds = std::string(default_demo_cupti_kinds);
  /// CUDA: kernels launched as one-node graphs (darray::backend_options::kernel_graphs) or with
  /// cudaLaunchKernel; ignored on host devices.
  bool kernel_graphs = true;
  /// darray::backend_options::yield_to_copies; ignored on host devices (counted there).
  bool yield_to_copies = true;
};

/// One check against the host reference.
struct demo_check {
  std::string what;
  bool ok = false;
  double max_error = 0.0;  ///< largest |device - host| (relative for floating sums)
  std::string detail;
};

/// What the demo found.
struct darray_demo_result {
  std::vector<demo_check> checks;
  double t_add_ms = 0, t_reshard_ms = 0, t_fused_ms = 0;
  double eta = 0;  ///< NaN when the reshard moves nothing (one device): no transfer to hide
  /// eta of each timed round from that round's own three times: its spread (NaN as eta).
  double eta_min = 0, eta_median = 0, eta_max = 0;
  std::int64_t bytes_moved = 0;  ///< remote bytes of C.reshard(A.index_map())
  std::int64_t bytes_local = 0;  ///< bytes already in place
  std::vector<double> overlap;   ///< per device: overlap ratio from the trace (NaN: unknown)
  /// per device: the median overlap ratio over the timed fused runs (NaN: unknown, or no run
  /// moved data there)
  std::vector<double> overlap_median;
  /// Per rank (one entry without a launcher): its failed checks (every rank runs them all).
  std::vector<std::size_t> failed_per_rank;
  nlohmann::json report;  ///< what this rank wrote to its report
  std::string text;  ///< the printed summary (last line sums it up); rank 0's only ("" on others)
  /// Every check of every rank passed.
  [[nodiscard]] bool ok() const;
};

/// Runs the demo. Throws invalid_argument for bad options, device_unavailable for "cuda"
/// without a GPU; a failed check is reported in the result, not thrown.
[[nodiscard]] darray_demo_result run_darray_demo(const darray_demo_options& options,
                                                 std::ostream* progress = nullptr);

}  // namespace poolscope::tools
