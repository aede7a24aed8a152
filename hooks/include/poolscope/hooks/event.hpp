// The allocator event model: what every poolscope allocator reports to installed hooks.
//
//   struct printer final : poolscope::hooks::hook {
//     void on_event(const poolscope::hooks::event& e) noexcept override {
//       if (e.kind == event_kind::pool_malloc && e.phase == event_phase::post)
//         std::printf("%s malloc %zu -> %p\n", e.allocator_name, e.requested, e.ptr);
//     }
//   };
//
// Ordering: `seq` is one process-wide sequence (given to an event, before any hook receives it,
// while an installed hook that receives it asks for one, hook::wants_sequence; 0 without one).
// Allocators emit a post event only after a successful allocation and a pre-free event before the
// block can be reused, so for any one pointer the sequence order is the true order of what happened
// to it. Clock: `time_ns` is CLOCK_MONOTONIC nanoseconds (hooks::now_ns()), the one clock every
// poolscope timestamp uses (taken, like seq, while an installed hook that receives the event asks
// for it: hook::wants_time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace poolscope::hooks {

/// What happened.
enum class event_kind : std::uint8_t {
  pool_malloc,   ///< a user request served by the pool (pre: asked; post: served)
  pool_free,     ///< a user block given back to the pool (pre: before it is reusable)
  device_alloc,  ///< the allocator acquired memory from its upstream resource
  device_free,   ///< the allocator returned memory to its upstream resource
  split,         ///< a free chunk was split: ptr/rounded the part taken, aux_* the remainder
  merge,         ///< a freed chunk merged with a neighbour: ptr/rounded the result, aux_* absorbed
  release,       ///< cached memory is going back upstream (release_cached or an OOM retry)
  oom,           ///< a request failed: the allocator is about to throw out_of_memory
  limit_hit,     ///< a request would exceed the allocator's limit
  invalid_free,  ///< a deallocation was rejected or corrected: see `error`
  /// Physical memory was mapped into a virtual range the allocator holds (vmm, host_vmm):
  /// ptr/rounded the range now backed. `reserved` counts it from this event on.
  segment_map,
  /// Physical memory was unmapped from such a range (pre: before the range stops being backed).
  segment_unmap,
};
inline constexpr int event_kind_count = 12;

/// Where in the operation the event is emitted.
enum class event_phase : std::uint8_t { pre, post, instant };

/// For invalid_free events: what was wrong.
enum class free_error : std::uint8_t {
  none,
  unknown_pointer,  ///< the allocator never handed out this pointer; ignored
  double_free,      ///< the block was already free; ignored
  size_mismatch,    ///< the size given differs from the size allocated; freed with the true size
  null_with_size,   ///< a null pointer with a non-zero size; ignored
};

/// One event. Plain data, valid only for the duration of the hook call (copy what you keep;
/// `allocator_name` lives as long as the allocator).
struct event {
  std::uint64_t seq = 0;      ///< process-wide sequence number (0: no hook asks for one)
  std::uint64_t time_ns = 0;  ///< monotonic clock, ns (0: no hook asks for it)
  std::uint64_t thread = 0;   ///< OS thread id of the caller
  event_kind kind = event_kind::pool_malloc;
  event_phase phase = event_phase::instant;
  free_error error = free_error::none;
  int device = -1;         ///< CUDA device ordinal; -1 for host memory
  void* stream = nullptr;  ///< the stream (cudaStream_t or host key)
  std::uint32_t allocator_id = 0;
  const char* allocator_name = "";
  void* ptr = nullptr;        ///< the block (null in pre-malloc and failure events)
  std::size_t requested = 0;  ///< bytes the caller asked for (or gave, on free)
  std::size_t rounded = 0;    ///< bytes the allocator took for it (size class, chunk, segment)
  void* aux_ptr = nullptr;    ///< split: remainder; merge: absorbed neighbour
  std::size_t aux_bytes = 0;  ///< size of aux_ptr's chunk
  std::size_t in_use = 0;     ///< allocator's bytes in use after the event (post/instant)
  std::size_t reserved = 0;   ///< allocator's bytes reserved from upstream after the event
};

[[nodiscard]] std::string_view to_string(event_kind k) noexcept;
[[nodiscard]] std::string_view to_string(event_phase p) noexcept;
[[nodiscard]] std::string_view to_string(free_error e) noexcept;

/// Monotonic nanoseconds: the clock of every poolscope timestamp.
[[nodiscard]] std::uint64_t now_ns() noexcept;
/// The calling thread's OS id (cached per thread).
[[nodiscard]] std::uint64_t current_thread_id() noexcept;

}  // namespace poolscope::hooks
