// rank_profiles: the profiles of the ranks of one launch (each rank's `POOLSCOPE_PROFILE=p.%r.json`
// or `poolscope demo --report r.json`), side by side and summed: what `poolscope report
// r.rank0.json r.rank1.json ...` prints.
//
//   std::vector<function_profile> ranks = ...;                    // one per rank
//   std::cout << poolscope::analysis::side_by_side({"rank 0", "rank 1"}, ranks, 10);
//   std::cout << poolscope::analysis::sum_profiles(ranks).to_table();
//
// Summing: a function profile's scopes are matched by name, and every figure is added (calls, CPU
// and GPU time, bytes); a line profile's call sites are matched by their path from the root
// (function, file, line and module of each frame: never the address, which each process loads
// at its own base), their own figures added and the totals recomputed. The ranks' peaks are
// added too, an upper bound of the launch's (the ranks need not peak at once).
//
// Ownership: plain values. Thread safety: reentrant. Cost: linear in the scopes and nodes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/line_profile.hpp"

namespace poolscope::analysis {

/// The function profiles summed, scope by scope (sorted as function_profile's).
[[nodiscard]] profiler::function_profile sum_profiles(
    const std::vector<profiler::function_profile>& ranks);
/// The line profiles summed, call site by call site.
[[nodiscard]] profiler::line_profile sum_profiles(const std::vector<profiler::line_profile>& ranks);

/// A table of the `top` scopes of the summed profile (by CPU time): per rank its calls and
/// inclusive CPU time, then the sum's; the last line sums every column. `labels` names the ranks
/// (invalid_argument if it has another size than `ranks`).
[[nodiscard]] std::string side_by_side(const std::vector<std::string>& labels,
                                       const std::vector<profiler::function_profile>& ranks,
                                       std::size_t top);
/// A table of the `top` call sites where the summed profile first branches (by used
/// bytes): per rank its used and acquired bytes, then the sum's; the last line is each whole
/// profile's (its root).
[[nodiscard]] std::string side_by_side(const std::vector<std::string>& labels,
                                       const std::vector<profiler::line_profile>& ranks,
                                       std::size_t top);

}  // namespace poolscope::analysis
