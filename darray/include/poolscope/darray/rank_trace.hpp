// rank_trace: what the timeline of one rank of several records so that `poolscope trace merge`
// joins the ranks' traces into one (profiler/distributed_info.hpp): who the rank is and its
// devices (the trace's distributedInfo), and its clock read around barriers of every rank, at the
// start and at the end of what is traced. `poolscope demo` and `poolscope bench darray` record
// their traces this way, and rank 0 then merges them.
//
//   auto tl_options = profiler::timeline_options{.trace_path = "t.rank1.json"};
//   tl_options.distributed = rank_trace_info(*be, "nccl");
//   profiler::timeline tl{tl_options};
//   tl.start();
//   sync_rank_clocks(*be->group(), tl, "start");
//   ... the run ...
//   sync_rank_clocks(*be->group(), tl, "end");
//   tl.stop();
//
// Ownership: plain functions. Thread safety: sync_rank_clocks is a collective of the group (one
// thread at a time, the same order on every rank). Cost: rank_trace_info names the devices;
// sync_rank_clocks passes 8 barriers.
#pragma once

#include <optional>
#include <string_view>

#include "poolscope/darray/backend.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/profiler/distributed_info.hpp"

namespace poolscope::profiler {
class timeline;
}  // namespace poolscope::profiler

namespace poolscope::darray {

/// Who this rank of `be`'s group is and its devices, with `transport` (what joins the ranks:
/// "mpi", "nccl") as the distributedInfo's backend; nullopt for a group of one (a trace without
/// distributedInfo).
[[nodiscard]] std::optional<profiler::distributed_info> rank_trace_info(const backend& be,
                                                                        std::string_view transport);

/// Samples this rank's clock around barriers of every rank of `g` into `tl` as the sync `label`
/// ("start", "end"). Collective; nothing for a group of one. Throws what the barriers throw
/// (communication_error).
void sync_rank_clocks(process_group& g, profiler::timeline& tl, std::string_view label);

}  // namespace poolscope::darray
