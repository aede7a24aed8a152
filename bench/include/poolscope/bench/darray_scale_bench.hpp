// The darray scale benchmark: how the host-side bookkeeping of distributed arrays grows with the
// work, beside the same work unsplit in the same run. `poolscope_bench_darray_scale` runs it.
//
//   poolscope::bench::darray_scale_options o;
//   o.devices = "host:2";
//   auto report = poolscope::bench::run_darray_scale_bench(o, &std::cerr);
//   std::cout << report.text;                    // the two tables, then the summary line
//   std::ofstream("scale.json") << report.to_json();
//
// Parts: a 1-D float64 array of n elements in equal blocks is resharded to the blocks with the
//   devices rotated, with reshard_options::split_bytes set so that each chunk of the result `b`
//   arrives in P pieces (P = 1, 4, 16, ... max_parts); `a` holds the same values placed there
//   directly (one part per chunk). On one device, where nothing crosses devices, `b` is the array
//   placed in P blocks on the device and resharded to one block: P local pieces, each a part of
//   the new chunk reading its source chunk's buffer (no copy), so ops read P parts there too (P
//   at most n). For each P: T(a + a) (the unsplit op, the baseline), T(b + b),
//   T(b + a) and T(sum(b)), each from its enqueue to the end of wait(), the best of `repeat`
//   runs after a warm-up; the parts the executor visited per op (backend_stats::parts_visited);
//   and the growth of T(b + b) over the previous P (a 4x step in P should cost at most about 5x).
// Planner: plan_reshard between two index maps over D devices (D in planner_devices), without a
//   backend or data: rotate (blocks, each moved to the next device), rows_to_columns (a 2-D array
//   in row blocks to column blocks: D^2 pieces), split_07 (blocks to the seed example's split at
//   0.7 N, the first half of the devices sharing [0, 0.7 N), the rest [0.7 N, N)) and
//   replicate_to_blocks (the whole array on every device to blocks). For each: the planning time
//   (best of `repeat`), the target map's validation time (what a reshard to a new map adds), the
//   pieces and the plan's bytes, and the boxes visited over pieces * log2(pieces).
//
// Thread safety: run_darray_scale_bench runs on the calling thread and owns its backend; the report
// is a plain value. Cost: the parts rows take a few seconds on host devices; rows_to_columns at
// 4,096 devices plans 16.8 million pieces (about 2.5 GB of plan, seconds to plan).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace poolscope::bench {

/// What to run.
struct darray_scale_options {
  std::string devices = "host:2";          ///< the backend of the parts rows (auto, cuda:N, host:N)
  std::int64_t n = std::int64_t{1} << 18;  ///< float64 elements of the parts rows' arrays
  std::int64_t max_parts = std::int64_t{16384};  ///< the largest P (P = 1, 4, 16, ... up to it)
  int repeat = 5;                                ///< timed runs per figure, after one warm-up
  std::vector<int> planner_devices{64, 256, 1024, 4096};
  std::vector<std::string> planner_patterns;  ///< subset of planner_pattern_names() (empty: all)
  std::vector<std::string> only;              ///< "parts", "planner" (empty: both)
};

/// One P of the parts rows. Times in ms.
struct darray_parts_row {
  std::int64_t parts = 0;  ///< pieces per chunk of b
  double unsplit_add_ms = 0.0;
  double add_ms = 0.0;        ///< b + b
  double mixed_add_ms = 0.0;  ///< b + a
  double sum_ms = 0.0;        ///< sum(b)
  /// backend_stats::parts_visited per run of b + b, of sum(b).
  std::uint64_t add_visited = 0;
  std::uint64_t sum_visited = 0;
};

/// One (pattern, devices) of the planner rows.
struct darray_planner_row {
  std::string pattern;
  int devices = 0;
  std::size_t src_chunks = 0;
  std::size_t dst_chunks = 0;
  std::size_t pieces = 0;
  std::size_t remote_pieces = 0;
  std::size_t plan_bytes = 0;  ///< the pieces and their per-chunk lists
  double plan_ms = 0.0;
  double validate_ms = 0.0;
  std::uint64_t boxes_visited = 0;
};

/// Everything a run measured.
struct darray_scale_report {
  std::string backend;  ///< of the parts rows
  std::int64_t n = 0;
  int repeat = 0;
  std::vector<darray_parts_row> parts;
  std::vector<darray_planner_row> planner;
  std::string summary;  ///< one line
  std::string text;     ///< the tables, then the summary line last
  /// The options and rows as a JSON document.
  [[nodiscard]] std::string to_json() const;
};

/// "rotate", "rows_to_columns", "split_07", "replicate_to_blocks".
[[nodiscard]] std::vector<std::string> planner_pattern_names();

/// Runs the benchmark. Progress lines go to `progress` if given. Throws invalid_argument naming a
/// bad option, device_unavailable for "cuda" without a GPU.
[[nodiscard]] darray_scale_report run_darray_scale_bench(const darray_scale_options& options,
                                                         std::ostream* progress = nullptr);

}  // namespace poolscope::bench
