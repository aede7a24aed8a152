// naive: every request goes straight to the resource (cudaMalloc/cudaFree on a cuda_resource).
//
//   poolscope::pool::cuda_resource gpu{0};
//   poolscope::pool::naive_allocator plain{gpu};    // the baseline every pool is measured against
//
// Caches nothing, so release_cached() is a no-op and reserved == in use. Keeps a table of live
// blocks to detect unknown pointers, double frees and wrong sizes before they reach the resource.
// Thread safety: thread-safe; one mutex guards the live table (the resource call runs outside
// it). Cost: one resource call per allocate/deallocate plus a hash-table update.
// Stream: passed through to the resource.
#pragma once

#include <mutex>
#include <unordered_map>

#include "poolscope/pool/allocator.hpp"

namespace poolscope::pool {

class naive_allocator final : public allocator {
 public:
  explicit naive_allocator(resource& upstream);
  ~naive_allocator() override;

 private:
  struct live_block {
    std::size_t requested;
  };
  block do_allocate(stream_view stream, std::size_t bytes, std::size_t alignment) override;
  free_outcome do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                             std::size_t alignment) noexcept override;
  void do_cache_stats(allocator_stats& s) const override;
  std::size_t do_release_cached() override { return 0; }

  mutable std::mutex mutex_;
  std::unordered_map<void*, live_block> live_;
};

}  // namespace poolscope::pool
