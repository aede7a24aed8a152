// The records of one rank's timeline for `trace merge` (rank_trace.hpp).
#include "poolscope/darray/rank_trace.hpp"

#include <string>

#include "poolscope/profiler/timeline.hpp"

namespace poolscope::darray {

std::optional<profiler::distributed_info> rank_trace_info(const backend& be,
                                                          std::string_view transport) {
  const process_group& g = *be.group();
  if (g.size() == 1) {
    return std::nullopt;
  }
  profiler::distributed_info d;
  d.rank = g.rank();
  d.world_size = g.size();
  d.backend = std::string(transport);
  for (int i = 0; i < be.local_device_count(); ++i) {
    d.devices.push_back(be.device_name(be.first_local_device() + i));
  }
  return d;
}

void sync_rank_clocks(process_group& g, profiler::timeline& tl, std::string_view label) {
  if (g.size() > 1) {
    tl.add_clock_sync(label, profiler::sample_barriers([&g] { g.barrier(); }));
  }
}

}  // namespace poolscope::darray
