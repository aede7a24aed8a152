// Every rank's file of one kind (its trace, its report) on rank 0's side of a launch. Rank 0 uses
// a rank's file at that rank's path when it sees the very bytes there (one host, or a shared file
// system: the ranks compare a checksum); otherwise (nodes with disks of their own, ranks in other
// working directories, a stale file of that name on rank 0's side) the rank sends rank 0 the
// bytes by the group's MPI, and rank 0 writes them at that same path when its folder exists
// there, else in the folder given. Either way rank 0 ends with every rank's file, as the run
// named them where it can.
//
//   const rank_files f = gather_rank_files(*group, "t.rank1.json", ".", "trace");  // every rank
//   if (group->rank() == 0 && f.problem.empty()) merge(f.paths);
//
// Thread safety: a collective of the group (called by one thread, in the same order on every
// rank), once every rank's backend work is over (it sends on a tag of its own). Cost: each rank
// reads its file once (the checksum); rank 0 reads every rank's once more, and writes those it
// is sent.
#pragma once

#include <string>
#include <vector>

#include "poolscope/darray/process_group.hpp"

namespace poolscope::tools {

/// Where rank 0 has every rank's file, and what went wrong.
struct rank_files {
  std::vector<std::string> paths;  ///< rank 0's: where it has rank r's file; the others': as named
  std::string
      problem;  ///< rank 0's: a rank that could not read its own file, or rank 0 write a copy
};

/// Brings every rank's `mine` to rank 0 (collective); copies whose folder rank 0 lacks go to
/// `fallback_dir`. `what` names the files in problems ("trace", "report"). Communication failures
/// throw (communication_error).
[[nodiscard]] rank_files gather_rank_files(darray::process_group& g, const std::string& mine,
                                           const std::string& fallback_dir,
                                           const std::string& what);

}  // namespace poolscope::tools
