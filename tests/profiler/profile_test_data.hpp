// Line profiles built by hand for the tests of the profiler and of `poolscope report` / `replay`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "poolscope/profiler/line_profile.hpp"

namespace poolscope::profiler::test_data {

/// A frame known by function, file and line (no module or address), with its own figures.
inline profile_node source_frame(std::string function, std::string file, int line,
                                 profile_counts self = {}) {
  profile_node n;
  n.function = std::move(function);
  n.file = std::move(file);
  n.line = line;
  n.self = self;
  return n;
}

/// Figures of `count` allocations of `used` bytes taking `rounded`, having acquired `acquired`
/// in `acquire_count` upstream allocations.
inline profile_counts allocations(std::uint64_t count, std::uint64_t used, std::uint64_t rounded,
                                  std::uint64_t acquired = 0, std::uint64_t acquire_count = 0) {
  profile_counts c;
  c.count = count;
  c.used = used;
  c.rounded = rounded;
  c.acquired = acquired;
  c.acquire_count = acquire_count;
  return c;
}

/// A profile whose root ("<root>") holds `stacks`, totals computed (frame-pointer unwinder, no
/// symbolizer, depth 24).
inline line_profile profile_of(std::vector<profile_node> stacks) {
  line_profile p;
  p.root.function = "<root>";
  p.root.children = std::move(stacks);
  p.unwinder = "frame_pointer";
  p.symbolizer = "none";
  p.max_depth = 24;
  p.recompute_totals();
  return p;
}

/// A line profile document whose nodes are nested `levels` deep (root included), written as
/// text so that nothing recurses over it to build it.
inline std::string nested_profile_json(std::size_t levels) {
  const std::string self =
      R"("self":{"count":1,"used":8,"rounded":8,"freed":0,"live":8,"live_at_peak":8,)"
      R"("acquire_count":0,"acquired":0,"live_acquired":0})";
  std::string json =
      R"({"format":"poolscope.line_profile","version":1,"unwinder":"frame_pointer",)"
      R"("symbolizer":"none","max_depth":256,"complete":true,"events":1,)"
      R"("unmatched_frees":0,"truncated_stacks":0,"peak_live":8,"peak_seq":1,"root":)";
  for (std::size_t i = 0; i < levels; ++i) {
    json += "{\"function\":\"f" + std::to_string(i) + "\"," + self + ",\"children\":[";
  }
  for (std::size_t i = 0; i < levels; ++i) {
    json += "]}";
  }
  json += "}";
  return json;
}

}  // namespace poolscope::profiler::test_data
