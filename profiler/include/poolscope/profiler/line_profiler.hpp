// line_profiler: which native call stacks asked for the memory. CuPy's LineProfileHook for C++.
//
//   poolscope::profiler::line_profiler prof;                  // default: 24 frames
//   {
//     poolscope::hooks::scoped_hook on{prof};
//     run_model();                                            // allocations anywhere, any thread
//   }
//   auto report = prof.report();                              // symbolized here, once
//   std::cout << report.to_text({.threshold_bytes = 1 << 20});
//   // <root> (1.50GiB, 2.00GiB)
//   //   main (main.cpp:40) (1.50GiB, 2.00GiB)
//   //     run_model() (model.cpp:12) (1.00GiB, 1.00GiB)
//   //       ...
//
// What it records: every pool_malloc post event (requested and rounded bytes) and every
// device_alloc post event (bytes acquired from upstream) is attributed to the native call stack
// of the thread that raised it, poolscope's own frames removed; in a Python process, with the
// thread's Python frames (file, function, line) in place of the interpreter's (docs/
// line_profile.md, "Python frames"). Frees (pool_free and device_free,
// at their pre events, which are in true order) are matched by pointer to the stack that
// allocated the block. Per distinct stack the profiler keeps calls, used, rounded, acquired and
// freed bytes, bytes live now and bytes live at the peak: the instant the sum of live requested
// bytes over everything this profiler saw was highest (with `only_allocator` set: that
// allocator's peak of requested bytes).
//
// Storage: stacks are deduplicated in a prefix tree of return addresses (root = outermost
// frame), so each distinct stack is stored once; a hash of the whole stack finds its leaf in
// O(1) on the hot path. Live-at-peak costs O(1) per event: each node remembers its live bytes as
// of the latest peak lazily, the first time it changes after that peak (peak epochs).
//
// Symbolization happens in report(), once per distinct address: function, file:line through
// libdw when poolscope was built with it, else dladdr (exported names) with module+offset.
//
// Ownership: the profiler owns its tree and tables; it must outlive its installation
// (scoped_hook). Thread safety: thread-safe. Events arrive from many threads at once: the stack
// is captured without any lock, then one spin lock guards the tree and the pointer tables for a
// few hash-table operations. A thread that finds that lock taken does not wait for it: it leaves
// a copy of its event on a lock-free list, and the next thread to take the lock applies the
// events left there, oldest first, before its own; so events are applied in an order that keeps
// every free after its block's malloc, and the figures stay exact (`deferred_events` in the
// report counts them). While more than 256 wait, threads wait for the lock instead. report(),
// node_count() and reset() take the same lock (the first two apply what was left too). Stream
// semantics: none (the stream is not part of the attribution). Errors: on_event never throws; if
// recording fails (no memory) the profiler disables itself, says so once through poolscope::log,
// and the report is marked incomplete. Cost: one stack capture plus a locked hash lookup per malloc
// or device_alloc event (bench/line_profiler_bench.cpp; docs/perf.md); a locked hash lookup per
// free; nothing for other kinds; a heap copy of the event (with its frames) when the lock was
// taken. Memory: one node per distinct call site, one table entry per live block.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "poolscope/hooks/hook.hpp"
#include "poolscope/profiler/line_profile.hpp"

namespace poolscope::profiler {

/// How the line profiler walks the stack.
enum class stack_unwinder : std::uint8_t {
  automatic,        ///< cached_dwarf on x86-64, else libunwind when poolscope was built
                    ///< with it, else glibc_backtrace
  libunwind,        ///< unw_backtrace: DWARF unwind tables with caching; fast and exact
  glibc_backtrace,  ///< backtrace(3): DWARF unwind through libgcc; exact, slow (~100+ ns/frame)
  frame_pointer,    ///< the frame-pointer chain: fastest; exact only for code built with
                    ///< -fno-omit-frame-pointer (else stacks come out short or partial)
  cached_dwarf,     ///< poolscope's own .eh_frame walker with a per-thread cache of unwind rules
                    ///< (x86-64): libunwind's approach without libunwind; stops at frames it
                    ///< cannot describe (signal trampolines)
};
/// "automatic", "libunwind", "glibc_backtrace", "frame_pointer", "cached_dwarf".
[[nodiscard]] std::string_view to_string(stack_unwinder u) noexcept;
/// True if `u` can be used in this build (automatic and glibc_backtrace always can).
[[nodiscard]] bool unwinder_available(stack_unwinder u) noexcept;
/// True if this build symbolizes with libdw (file:line for frames with debug info).
[[nodiscard]] bool has_libdw() noexcept;

/// Settings of a line_profiler.
struct line_profiler_options {
  /// Frames kept per stack (innermost ones); deeper stacks are cut and counted as truncated.
  std::size_t max_depth = 24;
  /// Stack walker.
  stack_unwinder unwinder = stack_unwinder::automatic;
  /// Drop the frames of poolscope's shared libraries from the top of each stack (by address
  /// range; in static builds this finds nothing and `skip_frames` must do it).
  bool skip_poolscope_frames = true;
  /// Further frames dropped from the top after poolscope's, e.g. the application's own
  /// allocation wrapper.
  std::size_t skip_frames = 0;
  /// Code addresses (any function of each) whose shared objects count as poolscope's own for
  /// skip_poolscope_frames: a library that wraps poolscope's allocators, such as the C ABI
  /// plug-in, so that each stack starts at the wrapper's caller. At most 8, each in a shared
  /// object other than the main executable (whose frames an address range cannot tell from
  /// the application's: use skip_frames there).
  std::vector<const void*> skip_modules_of{};
  /// Only events of this allocator id (hooks::event::allocator_id); 0 = every allocator.
  std::uint32_t only_allocator = 0;
  /// In a Python process, Python frames kept per stack (the innermost ones), in place of the
  /// interpreter's native frames; 0: native frames only. At most 256.
  std::size_t max_python_depth = 32;
};

/// Settings of line_profiler::report.
struct report_options {
  /// Symbolize frames (else only addresses are filled in).
  bool symbolize = true;
};

/// Attributes allocations to call stacks. See the file comment.
class line_profiler final : public hooks::hook {
 public:
  /// Throws invalid_argument if max_depth is 0 or above 256, or if `options.unwinder` is not
  /// available in this build.
  explicit line_profiler(const line_profiler_options& options = {});
  ~line_profiler() override;

  /// Records pool_malloc/device_alloc post and pool_free/device_free pre events. Never throws.
  void on_event(const hooks::event& e) noexcept override;
  /// Those four (kind, phase) pairs: allocators build no other event for it.
  [[nodiscard]] hooks::event_filter interests() const noexcept override;
  /// False: the profile is of call stacks and bytes, not of time.
  [[nodiscard]] bool wants_time() const noexcept override { return false; }
  /// False: events are numbered for it only while a hook that reads the number is installed
  /// too (the recorder, the timeline), so `peak_seq` can be found in their logs; alone, the
  /// profiler leaves it 0. Numbering is one process-wide atomic per event, which threads
  /// allocating at once would contend on.
  [[nodiscard]] bool wants_sequence() const noexcept override { return false; }

  /// A symbolized snapshot of everything recorded so far. Thread-safe; the lock is held only
  /// while the tree is copied, symbolization runs outside it.
  [[nodiscard]] line_profile report(const report_options& options = {}) const;
  /// Forgets everything recorded (blocks live now are forgotten too: their frees will count as
  /// unmatched) and re-enables a disabled profiler.
  void reset() noexcept;

  /// False once the profiler disabled itself after a failure.
  [[nodiscard]] bool enabled() const noexcept { return !disabled_.load(std::memory_order_relaxed); }
  /// Distinct call sites recorded (tree nodes, root excluded).
  [[nodiscard]] std::size_t node_count() const;
  /// The unwinder actually in use (never automatic).
  [[nodiscard]] stack_unwinder unwinder() const noexcept;
  /// The options given at construction.
  [[nodiscard]] const line_profiler_options& options() const noexcept { return options_; }

 private:
  struct state;
  void disable(const char* what) const noexcept;
  // With the table lock held: applies the events other threads left (disables on failure).
  void drain_locked() const noexcept;

  line_profiler_options options_;
  std::unique_ptr<state> state_;
  mutable std::atomic<bool> disabled_{false};
};

}  // namespace poolscope::profiler
