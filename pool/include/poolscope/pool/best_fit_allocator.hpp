// best_fit: CuPy's first pool. Requests are rounded up to 512 bytes; freed blocks are cached by
// exact rounded size and reused only for a request of the same rounded size. Never splits or
// merges, so a cached 1 MiB block cannot serve a 512 KiB request.
//
//   poolscope::pool::best_fit_allocator pool{resource};
//   void* a = pool.allocate(s, 1000);   // takes a 1024-byte block from upstream
//   pool.deallocate(s, a, 1000);        // cached under 1024
//   void* b = pool.allocate(s, 700);    // 1024 again: the cached block, no upstream call
//
// Thread safety: thread-safe; one mutex guards the cache and the live table (upstream calls run
// outside it). make_allocator("best_fit") puts a thread_cache_adaptor in front of it, so that a
// thread's repeated sizes do not take the mutex.
// Cost: O(log distinct sizes) per operation under the mutex; one upstream call per cache miss.
// Stream: not stream-aware. A block freed on one stream may be handed out for another at once;
// use stream_pool_allocator when several streams share a pool.
#pragma once

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "poolscope/pool/allocator.hpp"

namespace poolscope::pool {

class best_fit_allocator final : public allocator {
 public:
  /// Size-class granularity.
  static constexpr std::size_t round_bytes = 512;

  /// A pool over `upstream` (which must outlive it).
  explicit best_fit_allocator(resource& upstream);
  ~best_fit_allocator() override;

 private:
  block do_allocate(stream_view stream, std::size_t bytes, std::size_t alignment) override;
  free_outcome do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                             std::size_t alignment) noexcept override;
  void do_cache_stats(allocator_stats& s) const override;
  std::size_t do_release_cached() override;

  bool cache_block(void* ptr, std::size_t rounded) noexcept;  // caller holds mutex_

  struct live_block {
    std::size_t rounded;
    std::size_t requested;
  };
  mutable std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;  // rounded size -> cached blocks
  std::unordered_map<void*, live_block> live_;
  std::unordered_map<void*, std::size_t> cached_;  // cached block -> rounded size
  std::size_t cached_bytes_ = 0;
};

}  // namespace poolscope::pool
