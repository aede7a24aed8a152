// NVTX: poolscope's scopes, allocator events and pool memory as seen by Nsight Systems and
// compute-sanitizer. docs/nsight.md shows how to look at them.
//
//   // Every POOLSCOPE_SCOPE is already an NVTX range in the domain "poolscope".
//   poolscope::profiler::nvtx_memory_hook heaps;           // pool segments and blocks for
//   poolscope::hooks::scoped_hook on{heaps};               // compute-sanitizer --nvtx yes
//   auto pool = poolscope::pool::make_allocator("bfc", *gpu);
//
//   poolscope::profiler::nvtx_marker_hook marks;           // each allocator event as a mark
//   poolscope::hooks::scoped_hook on_marks{marks};
//
// The domain "poolscope" is created once (nvtxDomainCreateA) with its categories named
// (nvtxDomainNameCategoryA): 1 "pool", 2 "darray.transfer", 3 "darray.compute", 4 "user"; each
// category has its own colour. Scope names are registered strings (nvtxDomainRegisterStringA,
// once per name). With no NVTX tool attached every call here costs a load and a branch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>

#include "poolscope/hooks/hook.hpp"
#include "poolscope/profiler/scope.hpp"

namespace poolscope::profiler {

/// The NVTX domain of every poolscope range, mark and heap.
inline constexpr std::string_view nvtx_domain_name = "poolscope";

/// True if an NVTX tool (Nsight Systems, compute-sanitizer, an injection library) is attached
/// to poolscope's domain. Initializes NVTX on first call. Thread-safe.
[[nodiscard]] bool nvtx_tool_attached() noexcept;

/// An instantaneous NVTX mark in the "poolscope" domain with `message` and an unsigned payload.
/// Never throws; messages longer than 255 bytes are cut, before a whole UTF-8 character.
void nvtx_mark(std::string_view message, category c = category::user,
               std::uint64_t payload = 0) noexcept;

/// Emits every allocator event it receives as an NVTX mark (nvtxDomainMarkEx) in the "poolscope"
/// domain, category pool, message "<kind>/<phase> <bytes> B <allocator> <ptr>" and the bytes as
/// payload: a thin timeline of the pools in Nsight Systems next to the ranges.
///
///   poolscope::profiler::nvtx_marker_hook marks;
///   poolscope::hooks::scoped_hook on{marks};
///
/// Ownership: owns nothing; must outlive its installation. Thread-safe (stateless but for a
/// relaxed counter). Stream semantics: none; marks are host-side instants on the raising thread.
/// Cost: a snprintf into a stack buffer and one NVTX call per event when a tool is attached;
/// a load and a branch when none is.
class nvtx_marker_hook final : public hooks::hook {
 public:
  /// With `with_pre_events` false (the default) only post and instant events become marks.
  explicit nvtx_marker_hook(bool with_pre_events = false) noexcept
      : with_pre_events_(with_pre_events) {}
  /// Emits the mark for `e`.
  void on_event(const hooks::event& e) noexcept override;
  /// Every event, or all but the pre events (the default).
  [[nodiscard]] hooks::event_filter interests() const noexcept override;
  /// False: a mark's text holds no sequence number, and NVTX times its marks itself.
  [[nodiscard]] bool wants_sequence() const noexcept override { return false; }
  [[nodiscard]] bool wants_time() const noexcept override { return false; }
  /// Marks emitted so far.
  [[nodiscard]] std::uint64_t marks() const noexcept {
    return marks_.load(std::memory_order_relaxed);
  }

 private:
  bool with_pre_events_;
  std::atomic<std::uint64_t> marks_{0};
};

/// Installs (true) or removes (false) a process-wide nvtx_marker_hook owned by the library: the
/// "when asked for" switch for tools and the CLI. Thread-safe; idempotent.
void set_nvtx_allocator_marks(bool on);

/// Describes pool memory to NVTX's memory API (nvToolsExtMem.h), so that compute-sanitizer
/// (--tool memcheck --nvtx yes) checks accesses against the blocks the pool handed out, not
/// against the whole cudaMalloc'd segment: an out-of-bounds write inside a pool segment is then
/// reported.
/// - device_alloc post: the new upstream segment [ptr, ptr + bytes) is registered as a heap with
///   usage NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
/// - pool_malloc post: the block [ptr, ptr + requested) is registered as a region of the heap
///   containing it (found in an interval map of the registered heaps);
/// - pool_free pre: the region is unregistered before the block can be reused;
/// - device_free pre: the heap is unregistered before the segment goes back upstream.
/// For the naive allocator each block is its own segment: the region is the whole heap.
/// Blocks from segments acquired before the hook was installed have no heap and are skipped
/// (counted in regions_without_heap): install the hook before creating the allocator.
///
/// Ownership: owns its maps; must outlive its installation. Thread safety: thread-safe, one mutex
/// around the maps and the NVTX calls (so a region is never registered after its heap is gone).
/// Stream semantics: none (NVTX regions are address ranges). Cost: an ordered-map lookup and one
/// NVTX call per malloc/free under the mutex; nothing for other event kinds.
class nvtx_memory_hook final : public hooks::hook {
 public:
  /// Counters of what was registered.
  struct counts {
    std::uint64_t heaps_registered = 0;
    std::uint64_t heaps_unregistered = 0;
    std::uint64_t regions_registered = 0;
    std::uint64_t regions_unregistered = 0;
    std::uint64_t regions_without_heap = 0;  ///< blocks in no known heap: not registered
  };

  /// With `device_memory_only`, host-memory allocators (device == -1) are ignored.
  explicit nvtx_memory_hook(bool device_memory_only = false) noexcept
      : device_memory_only_(device_memory_only) {}
  /// Unregisters what is still registered.
  ~nvtx_memory_hook() override;

  /// Registers or unregisters the heap or region `e` is about (see the class comment).
  void on_event(const hooks::event& e) noexcept override;
  /// The four (kind, phase) pairs above: allocators build no other event for it.
  [[nodiscard]] hooks::event_filter interests() const noexcept override;
  /// False: NVTX regions need no sequence numbers, nor timestamps.
  [[nodiscard]] bool wants_sequence() const noexcept override { return false; }
  [[nodiscard]] bool wants_time() const noexcept override { return false; }
  /// A snapshot of the counters.
  [[nodiscard]] counts snapshot() const;
  /// Heaps and regions registered now.
  [[nodiscard]] std::size_t live_heaps() const;
  [[nodiscard]] std::size_t live_regions() const;

 private:
  struct heap_entry {
    std::uintptr_t end;
    void* handle;  // nvtxMemHeapHandle_t
  };
  void on_segment(const hooks::event& e);
  void on_block(const hooks::event& e);
  void drop_heap(std::map<std::uintptr_t, heap_entry>::iterator it) noexcept;

  bool device_memory_only_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, heap_entry> heaps_;        // segment start -> end, handle
  std::map<std::uintptr_t, std::uintptr_t> regions_;  // block start -> its heap's start
  counts counts_;
};

}  // namespace poolscope::profiler
