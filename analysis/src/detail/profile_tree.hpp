// What the line-profile tools share when they join call trees: a frame's identity across
// processes and the merge of one call site's subtree into another's. Internal to analysis/.
#pragma once

#include <algorithm>
#include <string>
#include <tuple>

#include "poolscope/profiler/line_profile.hpp"

namespace poolscope::analysis::detail {

/// A frame as merging matches it: function, file, line and module, never the address (each
/// process loads a module at its own base).
using frame_key = std::tuple<std::string, std::string, int, std::string>;

inline frame_key key_of(const profiler::profile_node& n) {
  return {n.function, n.file, n.line, n.module};
}

/// Adds `from`'s own figures and subtree into `into` (the same call site); totals are left for
/// line_profile::recompute_totals.
inline void add_node(profiler::profile_node& into, const profiler::profile_node& from) {
  into.self += from.self;
  for (const profiler::profile_node& c : from.children) {
    const auto it =
        std::find_if(into.children.begin(), into.children.end(),
                     [&](const profiler::profile_node& x) { return key_of(x) == key_of(c); });
    if (it == into.children.end()) {
      into.children.push_back(c);
    } else {
      add_node(*it, c);
    }
  }
}

}  // namespace poolscope::analysis::detail
