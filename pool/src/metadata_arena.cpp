#include "detail/metadata_arena.hpp"

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

// Under LeakSanitizer the region is a root region: it holds the only pointers to some heap
// blocks of its pool (segments, slab lists), and a pool kept for the life of the process (the
// plug-in's) would otherwise have them reported as leaked, since LSan scans no mapping it did not
// make unless told to.
#if defined(__SANITIZE_ADDRESS__)
#define POOLSCOPE_LSAN_ROOTS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define POOLSCOPE_LSAN_ROOTS 1
#endif
#endif
#if defined(POOLSCOPE_LSAN_ROOTS)
#include <sanitizer/lsan_interface.h>
#endif

namespace poolscope::pool::detail {

metadata_arena::metadata_arena(std::size_t bytes, bool huge) noexcept {
#if defined(__linux__)
  if (bytes == 0 || bytes > (std::size_t{1} << 40)) {
    return;  // nothing asked, or more than any pool's bookkeeping: the heap serves it
  }
  const std::size_t size = (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
  // One huge page more than needed, so that an aligned region lies within; the rest stays
  // mapped (address space only: it is never touched).
  const std::size_t mapped = size + huge_page_bytes;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return;
  }
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (at + huge_page_bytes - 1) & ~(huge_page_bytes - 1);
  base_ = reinterpret_cast<char*>(aligned);
  size_ = size;
  mapping_ = p;
  mapping_bytes_ = mapped;
  // Advice only: a kernel without transparent huge pages refuses it, and ordinary pages serve.
  advised_ = madvise(base_, size_, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) == 0 && huge;
#if defined(POOLSCOPE_LSAN_ROOTS)
  __lsan_register_root_region(base_, size_);
#endif
#else
  (void)bytes;
  (void)huge;
#endif
}

metadata_arena::~metadata_arena() {
#if defined(__linux__)
  if (mapping_ != nullptr) {
#if defined(POOLSCOPE_LSAN_ROOTS)
    __lsan_unregister_root_region(base_, size_);
#endif
    munmap(mapping_, mapping_bytes_);
  }
#endif
}

void* metadata_arena::allocate(std::size_t bytes, std::size_t alignment) {
  const std::size_t start = (used_ + alignment - 1) & ~(alignment - 1);
  if (base_ != nullptr && start <= size_ && bytes <= size_ - start) {
    used_ = start + bytes;
    return base_ + start;
  }
  return heap_allocate(bytes, alignment);
}

void metadata_arena::deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
  if (p == nullptr || owns(p)) {
    return;  // the region's pieces go back with the region
  }
  heap_deallocate(p, bytes, alignment);
}

void* metadata_arena::heap_allocate(std::size_t bytes, std::size_t alignment) {
  return alignment > __STDCPP_DEFAULT_NEW_ALIGNMENT__
             ? ::operator new (bytes, std::align_val_t{alignment})
             : ::operator new(bytes);
}

void metadata_arena::heap_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
  if (alignment > __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
    ::operator delete (p, bytes, std::align_val_t{alignment});
  } else {
    ::operator delete(p, bytes);
  }
}

bool metadata_arena::owns(const void* p) const noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const auto b = reinterpret_cast<std::uintptr_t>(base_);
  return base_ != nullptr && a >= b && a - b < size_;
}

}  // namespace poolscope::pool::detail
