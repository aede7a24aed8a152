// One trace of every rank: after each rank of a launch has written its own trace (recorded as
// darray/rank_trace.hpp says), rank 0 joins them into the one the command line named
// (`poolscope trace merge`, analysis/trace_merge.hpp) and checks it. `poolscope demo --trace` and
// `poolscope bench darray --trace` under a launcher do this the same way.
//
//   const merged_trace m = merge_rank_traces(*group, "t.json", "t.rank1.json");  // every rank
//   if (!m.problem.empty()) ...;   // the same verdict on every rank
//
// Rank 0 reads each rank's trace where it has it (rank_files.hpp: a rank whose file it cannot
// see at that rank's path sends it the bytes).
//
// Thread safety: a collective of the group (called by one thread, in the same order on every
// rank). Cost: rank_files', then rank 0 reads every rank's trace twice more and writes the
// merged one; the others wait.
#pragma once

#include <string>
#include <vector>

#include "poolscope/darray/process_group.hpp"

namespace poolscope::tools {

/// What rank 0 made of every rank's trace.
struct merged_trace {
  std::string path;     ///< the merged trace (merged_output_path of the path asked for)
  std::string summary;  ///< rank 0's: events, flows and clock skew ("" on the other ranks)
  std::string problem;  ///< every rank's: "" when the merged trace is valid, else why not
  /// Where rank 0 has each rank's trace (rank 0's; the others': the paths the ranks wrote).
  std::vector<std::string> rank_paths;
};

/// Joins every rank's trace (`mine` on each rank; `requested`, the path the command line named,
/// gives the merged one's) on rank 0 and checks it with `poolscope trace check`. Collective:
/// called once every rank has written its own. A merge that fails is a `problem` on every rank;
/// communication failures throw.
[[nodiscard]] merged_trace merge_rank_traces(darray::process_group& g, const std::string& requested,
                                             const std::string& mine);

}  // namespace poolscope::tools
