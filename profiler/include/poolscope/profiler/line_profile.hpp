// line_profile: a finished, symbolized line-profiler report, and its three renderings.
//
//   poolscope::profiler::line_profile p = profiler.report();      // or load_line_profile(path)
//   std::cout << p.to_text({.threshold_bytes = 1 << 20});        // CuPy-style tree
//   write_file("alloc.json", p.to_json());                       // docs/line_profile.md
//   write_file("alloc.folded", p.to_folded());                   // flamegraph.pl, speedscope
//
// The tree: the root is a synthetic "<root>" frame; each child is a call site one level further
// in (outermost frame first), so a path from the root is a call stack as it was captured. Each
// node holds the figures of the allocations whose captured stack ended exactly at it (`self`);
// `total` adds those of its whole subtree. What the figures mean: see profile_counts.
//
// Reading a written profile back (load_line_profile): line_profile_reader.hpp.
//
// Ownership: a plain value; it owns its nodes. Thread safety: const methods may be called from
// any thread. Cost: rendering is linear in the number of nodes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace poolscope::profiler {

/// The "format" and "version" of the JSON document line_profile::to_json writes
/// (docs/line_profile.md; read back by line_profile_reader.hpp).
inline constexpr const char* line_profile_format = "poolscope.line_profile";
inline constexpr int line_profile_format_version = 1;

/// Byte and call figures of one node. Used bytes are those the caller asked for (pool_malloc
/// `requested`); acquired bytes are those the allocator took from its upstream resource
/// (device_alloc) while serving a call with this stack.
struct profile_counts {
  std::uint64_t count = 0;          ///< pool_malloc calls
  std::uint64_t used = 0;           ///< bytes requested, summed over the calls
  std::uint64_t rounded = 0;        ///< bytes the allocator took for them (its rounding)
  std::uint64_t freed = 0;          ///< requested bytes of those blocks freed since
  std::uint64_t live = 0;           ///< requested bytes allocated and not yet freed
  std::uint64_t live_at_peak = 0;   ///< `live` at the instant the profile's peak was reached
  std::uint64_t acquire_count = 0;  ///< device_alloc calls (upstream acquisitions)
  std::uint64_t acquired = 0;       ///< bytes acquired from upstream, summed
  std::uint64_t live_acquired = 0;  ///< acquired bytes not yet returned upstream

  profile_counts& operator+=(const profile_counts& o) noexcept;
  friend bool operator==(const profile_counts&, const profile_counts&) = default;
};

/// Which figure a rendering uses (folded stacks, thresholds).
enum class profile_metric : std::uint8_t {
  used,
  rounded,
  acquired,
  live,
  live_at_peak,
  count,
};
/// "used", "rounded", "acquired", "live", "live_at_peak", "count".
[[nodiscard]] std::string_view to_string(profile_metric m) noexcept;
/// Parses a name from to_string; throws poolscope::invalid_argument naming `name` otherwise.
[[nodiscard]] profile_metric parse_profile_metric(std::string_view name);

/// One call site (a return address) in the tree. Symbol fields are empty / 0 when unknown.
struct profile_node {
  std::string function;       ///< demangled function name
  std::string file;           ///< source file of the call
  int line = 0;               ///< source line of the call
  std::string module;         ///< shared object or executable path
  std::uint64_t offset = 0;   ///< return address - module load base
  std::uint64_t address = 0;  ///< return address in the profiled process
  profile_counts self;        ///< figures of stacks ending here
  profile_counts total;       ///< self plus every descendant's self
  std::vector<profile_node> children;

  /// How the frame is shown: "function (file.cpp:42)", "function (libx.so+0x1a2b)",
  /// "libx.so+0x1a2b" or "0x7f..." by what is known; never contains ';' or a newline.
  [[nodiscard]] std::string label() const;
  /// The `m` figure of `c`.
  [[nodiscard]] static std::uint64_t value(const profile_counts& c, profile_metric m) noexcept;
};

/// Options of line_profile::to_text.
struct text_options {
  /// Nodes whose total used and total acquired bytes are both below this are left out, with
  /// their subtrees.
  std::uint64_t threshold_bytes = 0;
  /// Also show live and live-at-peak bytes and the call count on each line.
  bool show_live = false;
};

/// A symbolized line profile. See the file comment.
class line_profile {
 public:
  /// The synthetic root: its `total` holds the figures of the whole profile.
  profile_node root;
  /// Highest sum of live requested bytes over the profile (the instant live_at_peak refers to).
  std::uint64_t peak_live = 0;
  /// Sequence number (hooks::event::seq) of the event that reached the peak, when a hook that
  /// numbers events (the recorder, the timeline) was installed beside the profiler; 0 otherwise
  /// (line_profiler::wants_sequence).
  std::uint64_t peak_seq = 0;
  /// Events attributed (pool_malloc, pool_free, device_alloc, device_free).
  std::uint64_t events = 0;
  /// Frees of pointers the profiler never saw allocated (allocated before it was installed).
  std::uint64_t unmatched_frees = 0;
  /// Stacks longer than max_depth, cut to their innermost max_depth frames.
  std::uint64_t truncated_stacks = 0;
  /// Events recorded by another thread than the one that raised them: the profiler's lock was
  /// held when they came (threads allocating at once), so they were left for its holder.
  std::uint64_t deferred_events = 0;
  /// How stacks were captured ("libunwind", "glibc_backtrace", "frame_pointer").
  std::string unwinder;
  /// How frames were symbolized ("libdw", "dladdr", "none").
  std::string symbolizer;
  /// Maximum captured depth.
  std::size_t max_depth = 0;
  /// False if the profiler disabled itself (see poolscope::log): the figures stop at that point.
  bool complete = true;

  /// CuPy's LineProfileHook tree: one `frame (used, acquired)` line per node, two spaces of
  /// indent per depth, children by decreasing used bytes.
  [[nodiscard]] std::string to_text(const text_options& options = {}) const;
  /// The JSON document described in docs/line_profile.md.
  [[nodiscard]] std::string to_json(int indent = 2) const;
  /// Folded stacks: one `frame;frame;frame value` line per node with a non-zero self value of
  /// `metric`, root-most frame first (the synthetic root left out).
  [[nodiscard]] std::string to_folded(profile_metric metric = profile_metric::used) const;

  /// Recomputes every node's `total` from the `self` figures below it.
  void recompute_totals();
};

}  // namespace poolscope::profiler
