// The fixture types the typed allocator suites run over. Add a line per allocator here; never
// parameterise by strings (a type names its fixture at compile time; a misspelt string would
// fail only at run time).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/cuda_async_resource.hpp"
#include "poolscope/pool/cuda_resource.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/host_vmm_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"
#include "poolscope/pool/stream_pool_allocator.hpp"
#include "poolscope/pool/thread_cache_adaptor.hpp"
#include "poolscope/pool/vmm_resource.hpp"

namespace poolscope::pool::testing {

/// An allocator of type Alloc over a fresh host resource (capacity unlimited unless given).
/// `strategy_type` is the strategy whose behaviour the suites expect beyond the contract.
template <typename Alloc>
struct on_host {
  using allocator_type = Alloc;
  using strategy_type = Alloc;
  static constexpr bool needs_gpu = false;
  static std::unique_ptr<resource> make_resource(std::size_t capacity = SIZE_MAX) {
    return std::make_unique<host_resource>(capacity);
  }
  static std::unique_ptr<allocator> make(resource& r) { return std::make_unique<Alloc>(r); }
};

/// bfc with its bookkeeping on the heap (huge_page_metadata off), so that the suites run both
/// homes of it (the out-of-host-memory sweep reaches the heap's allocations only).
struct on_host_bfc_heap_metadata : on_host<bfc_allocator> {
  static std::unique_ptr<allocator> make(resource& r) {
    bfc_options o;
    o.huge_page_metadata = false;
    return std::make_unique<bfc_allocator>(r, o);
  }
};

/// A thread_cache_adaptor around a Strategy over a fresh host resource.
template <typename Strategy>
struct cached_on_host : on_host<Strategy> {
  using allocator_type = thread_cache_adaptor;
  static std::unique_ptr<allocator> make(resource& r) {
    return std::make_unique<thread_cache_adaptor>(std::make_unique<Strategy>(r));
  }
};

using host_allocators =
    ::testing::Types<on_host<naive_allocator>, on_host<best_fit_allocator>, on_host<bfc_allocator>,
                     on_host_bfc_heap_metadata, on_host<stream_pool_allocator>,
                     cached_on_host<naive_allocator>, cached_on_host<best_fit_allocator>,
                     cached_on_host<bfc_allocator>, cached_on_host<stream_pool_allocator>>;

/// An allocator of type Alloc over a fresh host_vmm resource: 64 KiB granules (so that chunks
/// share granules and cross their edges), 4 GiB of addresses, the mapping budget `capacity`.
/// bfc maps granules as its chunks need them; the other strategies map whole blocks.
template <typename Alloc>
struct on_host_vmm {
  using allocator_type = Alloc;
  using strategy_type = Alloc;
  static constexpr bool needs_gpu = false;
  static constexpr std::size_t granule_bytes = std::size_t{64} << 10;
  static std::unique_ptr<resource> make_resource(std::size_t capacity = SIZE_MAX) {
    return std::make_unique<host_vmm_resource>(
        host_vmm_options{.address_range_bytes = std::size_t{4} << 30,
                         .granule_bytes = granule_bytes,
                         .capacity = capacity});
  }
  static std::unique_ptr<allocator> make(resource& r) { return std::make_unique<Alloc>(r); }
};

/// bfc over host_vmm with no hysteresis: every free unmaps the granules it leaves free.
struct on_host_vmm_bfc_no_hysteresis : on_host_vmm<bfc_allocator> {
  static std::unique_ptr<allocator> make(resource& r) {
    bfc_options o;
    o.unmap_high_fraction = 0.0;
    o.unmap_low_fraction = 0.0;
    o.unmap_window_frees = 0;
    o.keep_mapped_granules = 0;
    return std::make_unique<bfc_allocator>(r, o);
  }
};

/// A thread_cache_adaptor around a Strategy over a fresh host_vmm resource.
template <typename Strategy>
struct cached_on_host_vmm : on_host_vmm<Strategy> {
  using allocator_type = thread_cache_adaptor;
  static std::unique_ptr<allocator> make(resource& r) {
    return std::make_unique<thread_cache_adaptor>(std::make_unique<Strategy>(r));
  }
};

using host_vmm_allocators =
    ::testing::Types<on_host_vmm<naive_allocator>, on_host_vmm<best_fit_allocator>,
                     on_host_vmm<bfc_allocator>, on_host_vmm_bfc_no_hysteresis,
                     on_host_vmm<stream_pool_allocator>, cached_on_host_vmm<bfc_allocator>>;

/// An allocator of type Alloc over cudaMalloc on device 0. Needs a GPU: suites check needs_gpu
/// and skip before calling make_resource (which throws device_unavailable without one). There
/// is no capacity-limited variant: the device's memory is the capacity.
template <typename Alloc>
struct on_cuda {
  using allocator_type = Alloc;
  using strategy_type = Alloc;
  static constexpr bool needs_gpu = true;
  static std::unique_ptr<resource> make_resource() { return std::make_unique<cuda_resource>(0); }
  static std::unique_ptr<allocator> make(resource& r) { return std::make_unique<Alloc>(r); }
};

/// A thread_cache_adaptor around a Strategy over cudaMalloc on device 0. Needs a GPU.
template <typename Strategy>
struct cached_on_cuda : on_cuda<Strategy> {
  using allocator_type = thread_cache_adaptor;
  static std::unique_ptr<allocator> make(resource& r) {
    return std::make_unique<thread_cache_adaptor>(std::make_unique<Strategy>(r));
  }
};

/// An allocator of type Alloc over cudaMallocAsync (its own pool, release threshold max) on
/// device 0. Needs a GPU, as on_cuda.
template <typename Alloc>
struct on_cuda_async {
  using allocator_type = Alloc;
  using strategy_type = Alloc;
  static constexpr bool needs_gpu = true;
  static std::unique_ptr<resource> make_resource() {
    return std::make_unique<cuda_async_resource>(0);
  }
  static std::unique_ptr<allocator> make(resource& r) { return std::make_unique<Alloc>(r); }
};

/// An allocator of type Alloc over the CUDA driver's virtual memory on device 0 (vmm_resource),
/// the mapping budget `capacity`. Needs a GPU, as on_cuda.
template <typename Alloc>
struct on_vmm {
  using allocator_type = Alloc;
  using strategy_type = Alloc;
  static constexpr bool needs_gpu = true;
  static std::unique_ptr<resource> make_resource(std::size_t capacity = SIZE_MAX) {
    return std::make_unique<vmm_resource>(0, vmm_options{.capacity = capacity});
  }
  static std::unique_ptr<allocator> make(resource& r) { return std::make_unique<Alloc>(r); }
};

/// A thread_cache_adaptor around a Strategy over vmm_resource on device 0. Needs a GPU.
template <typename Strategy>
struct cached_on_vmm : on_vmm<Strategy> {
  using allocator_type = thread_cache_adaptor;
  static std::unique_ptr<allocator> make(resource& r) {
    return std::make_unique<thread_cache_adaptor>(std::make_unique<Strategy>(r));
  }
};

using vmm_allocators =
    ::testing::Types<on_vmm<naive_allocator>, on_vmm<best_fit_allocator>, on_vmm<bfc_allocator>,
                     on_vmm<stream_pool_allocator>, cached_on_vmm<bfc_allocator>>;

using cuda_allocators =
    ::testing::Types<on_cuda<naive_allocator>, on_cuda<best_fit_allocator>, on_cuda<bfc_allocator>,
                     on_cuda<stream_pool_allocator>, cached_on_cuda<best_fit_allocator>,
                     cached_on_cuda<bfc_allocator>>;
using cuda_async_allocators =
    ::testing::Types<on_cuda_async<naive_allocator>, on_cuda_async<best_fit_allocator>,
                     on_cuda_async<bfc_allocator>, on_cuda_async<stream_pool_allocator>>;

}  // namespace poolscope::pool::testing
