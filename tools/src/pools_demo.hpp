// `poolscope pools`: replays one allocation trace (sequence batches, then a random mix) on every
// allocator strategy over one resource, checks that the blocks never overlap and keep their
// contents, and reports each pool's memory and speed.
//
//   poolscope::tools::demo_options o;
//   o.resource = "host";
//   o.steps = 4;
//   auto report = poolscope::tools::run_demo(o, &std::cerr);
//   report.print(std::cout);
//   return report.integrity_ok() ? 0 : 2;
//
// Integrity checks, per block: 256-byte alignment; no overlap with any live block (an interval
// map of live blocks); a pattern written after allocation (memcpy on host memory, cudaMemcpy on
// device memory) is intact just before the block is freed.
// Thread safety: run_demo runs on the calling thread; reports are plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "poolscope/pool/allocator_stats.hpp"

namespace poolscope::tools {

/// What the demo runs.
struct demo_options {
  std::string resource;  ///< "" -> cuda with a GPU, else host
  int device = 0;
  std::size_t steps = 8;  ///< sequence-batch steps (the mix has steps*100 pairs)
  std::uint64_t seed = 1;
  std::vector<std::string> allocators;  ///< empty -> every registered strategy
};

/// One strategy's outcome.
struct demo_result {
  std::string allocator;        ///< strategy ("bfc")
  std::string name;             ///< allocator name ("bfc/host")
  pool::allocator_stats stats;  ///< after the trace, before the allocator is destroyed
  std::size_t allocations = 0;  ///< allocate calls made
  std::size_t frees = 0;        ///< deallocate calls made
  double ns_per_op = 0.0;       ///< mean time of one allocate or deallocate call
  std::size_t integrity_failures = 0;
  std::vector<std::string> failures;  ///< the first few integrity failures, described
  std::string error;                  ///< set if the trace could not be completed
};

/// Everything the demo found.
struct demo_report {
  std::string resource;
  int device = 0;
  std::size_t steps = 0;
  std::uint64_t seed = 0;
  std::string trace_description;
  std::size_t trace_ops = 0;
  std::size_t trace_allocations = 0;
  std::size_t peak_live_bytes = 0;  ///< what every strategy's peak_requested must equal
  std::vector<demo_result> results;
  std::string summary;

  /// True if no strategy had an integrity failure.
  [[nodiscard]] bool integrity_ok() const;
  /// True if some strategy could not complete the trace.
  [[nodiscard]] bool any_error() const;
  /// The pool report table, then the summary line last.
  void print(std::ostream& out) const;
  [[nodiscard]] std::string to_json() const;
};

/// Runs the demo. Throws invalid_argument for unknown names, device_unavailable without a GPU
/// for a device resource; a strategy that fails records its error and the others still run.
[[nodiscard]] demo_report run_demo(const demo_options& options, std::ostream* progress = nullptr);

}  // namespace poolscope::tools
