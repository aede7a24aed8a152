// The timelines that closed scopes are fed to: a registry of running timelines between the scope
// machinery (function_profiler.cpp) and the timeline (timeline.cpp, which defines these).
//
// A timeline with timeline_options::scopes registers itself at the end of start() and removes
// itself at the beginning of stop(). While the registry is not empty, the flag_timeline bit of
// g_scope_flags is set, so scopes read the clock at open and hand a host_slice to
// feed_running_timelines at close; with the registry empty the bit is clear and scopes cost
// nothing more than before.
//
// Thread safety: all four functions may be called from any thread. feed_running_timelines calls
// add_host_slice under the registry's mutex, and remove_running_timeline takes that mutex, so
// once remove returns no thread is inside (or will enter) that timeline's add_host_slice on a
// scope's behalf: the timeline may stop and be destroyed. Lock order: the registry's mutex, then
// a timeline's; a timeline never calls these while it holds its own mutex.
#pragma once

#include <cstdint>

#include "poolscope/profiler/timeline.hpp"

namespace poolscope::profiler::detail {

/// Adds `t` (running, its origin at `origin_ns`) and sets flag_timeline. Throws std::bad_alloc.
void add_running_timeline(timeline& t, std::uint64_t origin_ns);
/// Removes `t` (no-op if absent); clears flag_timeline when none is left. Returns once no scope
/// is feeding `t`.
void remove_running_timeline(const timeline& t) noexcept;
/// Adds `s` to every registered timeline whose origin is not after `s.begin_ns` (a scope opened
/// before a timeline started is not on it: its slice would begin before the trace does).
void feed_running_timelines(const host_slice& s) noexcept;
/// Counts, on every registered timeline, a host slice lost because a scope had no memory to note
/// its open time (stats().host_slices and events_dropped).
void lost_on_running_timelines() noexcept;

}  // namespace poolscope::profiler::detail
