// Resources over virtual memory: one large address range reserved up front, physical memory
// mapped into it granule by granule and given back granule by granule.
//
//   poolscope::pool::host_vmm_resource host{{.granule_bytes = 64 << 10}};   // CPU twin of vmm
//   void* va = host.reserve(4 << 20);          // address space only: nothing behind it yet
//   if (!host.map(va, 64 << 10)) { /* out of memory */ }   // the first granule is usable
//   host.unmap(va, 64 << 10);                 // and given back; the addresses stay reserved
//   host.unreserve(va, 4 << 20);
//
// Two faces. As a plain `resource`, try_allocate(bytes) reserves a range of `bytes` rounded up to
// the granule and maps all of it, and deallocate unmaps and unreserves it: every strategy works
// over a virtual resource as over any other. A strategy that knows it (bfc_allocator) uses the
// second face instead: it reserves address ranges for its segments and maps and unmaps granules
// as its chunks need them, so that the memory physically mapped follows the live bytes.
// The logic (the reservation, the address-range bookkeeping, the capacity, the counts) is this
// class's; the two implementations differ only in their physical-mapping seam
// (detail/physical_mapping.hpp): host_vmm_resource (mmap PROT_NONE, mprotect, madvise) and
// vmm_resource (the CUDA driver's cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess).
//
// Contract: reserve(bytes) hands out granule-aligned ranges of the reservation (bytes a positive
// multiple of granularity()), nullptr when the reservation has no free range that large.
// map(ptr, bytes) backs a granule-aligned, currently unmapped part of a reserved range; it
// returns false when out of memory (the capacity, ENOMEM, CUDA_ERROR_OUT_OF_MEMORY), leaving
// nothing mapped, and throws for any other failure. unmap and unreserve are noexcept and take
// what map and reserve were given (unmap may cover several map calls' granules).
// Bad arguments (misaligned, outside the reservation) throw invalid_argument naming the value.
// Accounting: allocated_bytes() counts what callers asked for, as host_resource does: the sizes
// given to try_allocate plus the bytes mapped through map(); so it equals the `reserved` of the
// allocators over the resource. mapped_bytes() is what is physically mapped (try_allocate's
// blocks rounded up to granules) and is what the capacity bounds.
// Ownership: the resource owns its reservation and releases it on destruction, unmapping what is
// still mapped: blocks still handed out become invalid then (unlike host_resource, whose live
// blocks leak).
// Thread safety: thread-safe. The range bookkeeping is under a mutex (reserve, unreserve,
// try_allocate, deallocate); map and unmap take no lock of the resource's own, and counts are
// atomics. Callers must not map or unmap the same granule from two threads at once (a strategy
// owns the granules of the ranges it reserved). Stream: ignored; vmm_resource maps and unmaps
// synchronously (cuMemUnmap waits for work using the memory).
// Cost: reserve/unreserve O(log free ranges); map/unmap one system call (host) or four driver
// calls per granule (GPU): a strategy keeps free granules mapped for a while (bfc's unmap policy)
// to amortize.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "poolscope/pool/resource.hpp"

namespace poolscope::pool {

namespace detail {
class physical_mapping;
}  // namespace detail

/// What a virtual resource counts (virtual_resource::counts). A snapshot.
struct virtual_counts {
  std::size_t address_range = 0;   ///< bytes of the whole reservation
  std::size_t address_bytes = 0;   ///< bytes of it handed out (reserve, try_allocate)
  std::size_t mapped_bytes = 0;    ///< bytes physically mapped now
  std::size_t peak_mapped = 0;     ///< most bytes mapped at once
  std::uint64_t maps = 0;          ///< successful map calls (try_allocate's included)
  std::uint64_t unmaps = 0;        ///< unmap calls
  std::uint64_t map_failures = 0;  ///< map calls refused for lack of memory
};

/// Base of vmm_resource and host_vmm_resource; see the file comment.
class virtual_resource : public resource {
 public:
  ~virtual_resource() override;

  /// Bytes of one physical granule: every reserve, map and unmap is in multiples of it.
  [[nodiscard]] std::size_t granularity() const noexcept { return granule_; }
  /// A granule-aligned range of `bytes` (a positive multiple of granularity()) with nothing
  /// mapped in it, or nullptr when no free range of the reservation is that large.
  [[nodiscard]] void* reserve(std::size_t bytes);
  /// Takes [end, end + bytes) if that part of the reservation is free, so that a range ending at
  /// `end` grows in place; false (and nothing taken) otherwise.
  [[nodiscard]] bool extend(void* end, std::size_t bytes);
  /// Returns a range from reserve (or a part of one, granule-aligned). Everything in it must be
  /// unmapped first.
  void unreserve(void* ptr, std::size_t bytes) noexcept;
  /// Backs [ptr, ptr + bytes) with physical memory. false when out of memory (nothing mapped).
  [[nodiscard]] bool map(void* ptr, std::size_t bytes);
  /// Gives back the physical memory behind [ptr, ptr + bytes) (mapped granules only).
  void unmap(void* ptr, std::size_t bytes) noexcept;

  /// The start of the reservation and its size in bytes (a multiple of granularity()).
  [[nodiscard]] void* address_base() const noexcept { return reinterpret_cast<void*>(base_); }
  [[nodiscard]] std::size_t address_range() const noexcept { return range_; }
  /// True if `ptr` lies inside the reservation.
  [[nodiscard]] bool contains(const void* ptr) const noexcept {
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    return p >= base_ && p < base_ + range_;
  }
  /// True if the granule holding `ptr` is mapped (false outside the reservation).
  [[nodiscard]] bool is_mapped(const void* ptr) const noexcept;
  /// The sizes callers asked for (see Accounting in the file comment).
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    return asked_.load(std::memory_order_relaxed);
  }
  /// Bytes physically mapped now.
  [[nodiscard]] std::size_t mapped_bytes() const noexcept {
    return mapped_.load(std::memory_order_relaxed);
  }
  /// The most bytes that may be mapped at once (SIZE_MAX: whatever the system gives).
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// A snapshot of the counts.
  [[nodiscard]] virtual_counts counts() const;

 protected:
  /// Takes over `mapping` and reserves `range_bytes` (rounded up to its granule) through it.
  /// Throws invalid_argument naming `range_bytes` if it is 0, runtime_error if the address space
  /// cannot be reserved.
  virtual_resource(std::unique_ptr<detail::physical_mapping> mapping, std::size_t range_bytes,
                   std::size_t capacity);

 private:
  void* do_try_allocate(stream_view stream, std::size_t bytes) override;
  void do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept override;
  [[nodiscard]] int do_device() const noexcept override;

  void check_range(const char* what, const void* ptr, std::size_t bytes) const;
  bool map_counted(void* ptr, std::size_t bytes);
  std::size_t unmap_counted(void* ptr, std::size_t bytes) noexcept;

  std::unique_ptr<detail::physical_mapping> mapping_;
  std::size_t granule_;
  std::uintptr_t base_ = 0;
  std::size_t range_ = 0;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> free_;  // free ranges: start -> bytes (guarded)
  std::size_t handed_out_ = 0;                  // guarded
  std::unique_ptr<std::atomic<std::uint64_t>[]> mapped_bits_;  // one bit per granule
  std::atomic<std::size_t> mapped_{0};
  std::atomic<std::size_t> peak_mapped_{0};
  std::atomic<std::size_t> asked_{0};
  std::atomic<std::uint64_t> maps_{0};
  std::atomic<std::uint64_t> unmaps_{0};
  std::atomic<std::uint64_t> map_failures_{0};
};

}  // namespace poolscope::pool
