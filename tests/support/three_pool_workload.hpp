// The workload of the out-of-host-memory sweeps: three sizes, one from each of bfc's pools (small,
// mid, large), allocated and then freed on `stream`. The caller arms the failing operator new
// (failing_new.hpp) around it; an allocation may fail with std::bad_alloc (the pool's own
// bookkeeping, its documented error), nothing else may escape, and every block it got back is
// freed. Thread safety: as the allocator's.
#pragma once

#include <cstddef>
#include <new>

#include "poolscope/pool/allocator.hpp"

namespace poolscope::testing {

/// What one run of the workload did.
struct three_pool_counts {
  int allocations = 0;  ///< that succeeded
  int frees = 0;
};

inline three_pool_counts run_three_pool_workload(pool::allocator& alloc, stream_view stream) {
  three_pool_counts c;
  void* live[3] = {};
  const std::size_t sizes[3] = {3000, std::size_t{70} << 10, std::size_t{3} << 20};
  for (int i = 0; i < 3; ++i) {
    try {
      live[i] = alloc.allocate(stream, sizes[i]);
      ++c.allocations;
    } catch (const std::bad_alloc&) {
      live[i] = nullptr;
    }
  }
  for (int i = 0; i < 3; ++i) {
    if (live[i] != nullptr) {
      alloc.deallocate(stream, live[i], sizes[i]);
      ++c.frees;
    }
  }
  return c;
}

}  // namespace poolscope::testing
