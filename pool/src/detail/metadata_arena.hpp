// Host memory for one pool's own bookkeeping, on a transparent huge page where the OS grants one.
//
// Why: on random sizes each bfc operation reads a few lines picked at random from a few hundred
// KB of bookkeeping (the free index's class sentinels, the chunk nodes, the address table),
// spread over about a hundred 4 KiB pages: more than the first-level data TLB holds, so a good
// part of those reads also miss in it. One 2 MiB page holds them all (docs/perf.md has what it
// saves).
//
// The arena maps its region once (2 MiB-aligned, MADV_HUGEPAGE) and hands out pieces of it by
// bumping an offset; a piece given back is not reused (the region goes back whole when the arena
// dies). What does not fit, and everything when the region could not be mapped, comes from
// operator new and goes back to operator delete: an arena never fails where the heap would not.
// Whether a huge page backs the region is the kernel's choice (transparent_hugepage "madvise" or
// "always"); without one the region is ordinary pages, touched (committed) only where used.
//
// Thread safety: none; the owner's lock guards it. Ownership: the region, until destruction;
// pieces must not outlive the arena.
#pragma once

#include <cstddef>
#include <new>

namespace poolscope::pool::detail {

class metadata_arena {
 public:
  /// The size and alignment of the region's pages when huge pages back it.
  static constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

  /// Maps a region of `bytes` rounded up to huge_page_bytes, advised for huge pages when `huge`
  /// (only a test passes false, to measure against). Never throws: if the region cannot be
  /// mapped, the arena is empty (capacity() 0) and every piece comes from operator new.
  explicit metadata_arena(std::size_t bytes, bool huge = true) noexcept;
  ~metadata_arena();
  metadata_arena(const metadata_arena&) = delete;
  metadata_arena& operator=(const metadata_arena&) = delete;

  /// A piece of `bytes` aligned to `alignment` (a power of two, at most huge_page_bytes): from
  /// the region while it has room, else from operator new. Throws std::bad_alloc only.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment);
  /// Gives back a piece from allocate (same bytes and alignment). Pieces of the region stay
  /// used until the arena dies; others go to operator delete.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept;

  /// Whether `p` lies in the region.
  [[nodiscard]] bool owns(const void* p) const noexcept;
  /// operator new / delete for a piece of `bytes` aligned to `alignment` (the aligned forms only
  /// where the default alignment falls short, as new-expressions choose).
  [[nodiscard]] static void* heap_allocate(std::size_t bytes, std::size_t alignment);
  static void heap_deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept;

  /// Bytes of the region (0: not mapped).
  [[nodiscard]] std::size_t capacity() const noexcept { return size_; }
  /// Bytes of the region handed out so far (alignment padding included).
  [[nodiscard]] std::size_t used() const noexcept { return used_; }
  /// Whether the region was advised for huge pages (the kernel may still back it with small
  /// ones).
  [[nodiscard]] bool advised() const noexcept { return advised_; }

 private:
  char* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t used_ = 0;
  void* mapping_ = nullptr;  // what munmap takes back (base_ aligned within it)
  std::size_t mapping_bytes_ = 0;
  bool advised_ = false;
};

/// A standard allocator over a metadata_arena (null: operator new), for the containers of a
/// pool's bookkeeping. Copies share the arena.
template <typename T>
class arena_allocator {
 public:
  using value_type = T;

  explicit arena_allocator(metadata_arena* arena = nullptr) noexcept : arena_(arena) {}
  template <typename U>
  arena_allocator(const arena_allocator<U>& other) noexcept  // NOLINT: rebinding converts
      : arena_(other.arena()) {}

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) {
      throw std::bad_array_new_length();
    }
    return static_cast<T*>(arena_ != nullptr
                               ? arena_->allocate(n * sizeof(T), alignof(T))
                               : metadata_arena::heap_allocate(n * sizeof(T), alignof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (arena_ != nullptr) {
      arena_->deallocate(p, n * sizeof(T), alignof(T));
    } else {
      metadata_arena::heap_deallocate(p, n * sizeof(T), alignof(T));
    }
  }
  [[nodiscard]] metadata_arena* arena() const noexcept { return arena_; }

  template <typename U>
  friend bool operator==(const arena_allocator& a, const arena_allocator<U>& b) noexcept {
    return a.arena() == b.arena();
  }

 private:
  metadata_arena* arena_;
};

}  // namespace poolscope::pool::detail
