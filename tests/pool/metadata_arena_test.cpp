// detail::metadata_arena: pieces from one 2 MiB-aligned region while it has room, from the heap
// after (and always when the region cannot be mapped); pieces aligned and disjoint; the heap's
// pieces go back to the heap (the sanitizer runs check that nothing leaks or is freed twice).
#include "../../pool/src/detail/metadata_arena.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

using poolscope::pool::detail::arena_allocator;
using poolscope::pool::detail::metadata_arena;

std::uintptr_t address(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

TEST(metadata_arena, region_is_whole_huge_pages_aligned_to_one) {
  metadata_arena a(100000);
  ASSERT_EQ(a.capacity(), metadata_arena::huge_page_bytes)
      << "could not map 2 MiB (the test machine has no memory?)";
  void* first = a.allocate(1, 1);
  EXPECT_EQ(address(first) % metadata_arena::huge_page_bytes, 0U);
  EXPECT_TRUE(a.owns(first));
  metadata_arena b(metadata_arena::huge_page_bytes + 1);
  EXPECT_EQ(b.capacity(), 2 * metadata_arena::huge_page_bytes);
}

TEST(metadata_arena, pieces_are_aligned_disjoint_and_writable_until_the_region_is_full) {
  metadata_arena a(metadata_arena::huge_page_bytes);
  ASSERT_EQ(a.capacity(), metadata_arena::huge_page_bytes);
  struct piece {
    char* p;
    std::size_t bytes;
    std::size_t alignment;
  };
  std::vector<piece> pieces;
  auto* const base = static_cast<char*>(a.allocate(0, 1));  // the region's start, using nothing
  ASSERT_TRUE(a.owns(base));
  std::size_t expected_used = 0;
  // Sizes and alignments in a fixed cycle, until one no longer fits.
  const std::size_t sizes[] = {24, 4096, 1000, 65536, 8, 300000};
  const std::size_t aligns[] = {8, 64, 16, 4096, 1, 64};
  for (std::size_t i = 0;; ++i) {
    const std::size_t n = sizes[i % 6];
    const std::size_t al = aligns[i % 6];
    const std::size_t start = (expected_used + al - 1) / al * al;
    auto* p = static_cast<char*>(a.allocate(n, al));
    if (start + n > a.capacity()) {
      EXPECT_FALSE(a.owns(p)) << "piece " << i << " past the end came from the region";
      EXPECT_EQ(address(p) % al, 0U);
      std::memset(p, 0xAB, n);
      a.deallocate(p, n, al);  // back to the heap
      break;
    }
    EXPECT_TRUE(a.owns(p)) << "piece " << i;
    EXPECT_EQ(p, base + start) << "piece " << i << " not where bump allocation puts it";
    EXPECT_EQ(address(p) % al, 0U) << "piece " << i;
    expected_used = start + n;
    EXPECT_EQ(a.used(), expected_used);
    std::memset(p, static_cast<int>(i & 0xFF), n);
    pieces.push_back({p, n, al});
  }
  ASSERT_GT(pieces.size(), 10U);
  // Disjoint: every piece still holds its own pattern.
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const auto want = static_cast<char>(i & 0xFF);
    EXPECT_TRUE(std::all_of(pieces[i].p, pieces[i].p + pieces[i].bytes,
                            [want](char c) { return c == want; }))
        << "piece " << i << " was overwritten";
  }
  // A piece of the region given back is not reused: the next one that fits follows the last.
  a.deallocate(pieces.back().p, pieces.back().bytes, pieces.back().alignment);
  const std::size_t before = a.used();
  void* small = a.allocate(8, 8);
  if (a.owns(small)) {
    EXPECT_GE(address(small), address(pieces.back().p) + pieces.back().bytes);
  }
  a.deallocate(small, 8, 8);
  EXPECT_GE(a.used(), before);
}

TEST(metadata_arena, without_a_region_every_piece_comes_from_the_heap) {
  metadata_arena none(std::size_t{1} << 41);  // more than the arena maps: no region
  EXPECT_EQ(none.capacity(), 0U);
  EXPECT_FALSE(none.advised());
  for (const std::size_t al : {1, 8, 64, 256}) {
    void* p = none.allocate(1000, al);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(address(p) % al, 0U);
    EXPECT_FALSE(none.owns(p));
    std::memset(p, 1, 1000);
    none.deallocate(p, 1000, al);
  }
  metadata_arena empty(0);
  EXPECT_EQ(empty.capacity(), 0U);
  void* p = empty.allocate(16, 16);
  empty.deallocate(p, 16, 16);
}

TEST(metadata_arena, containers_grow_in_the_region_and_then_on_the_heap) {
  metadata_arena a(metadata_arena::huge_page_bytes);
  ASSERT_EQ(a.capacity(), metadata_arena::huge_page_bytes);
  std::vector<std::uint64_t, arena_allocator<std::uint64_t>> v{arena_allocator<std::uint64_t>(&a)};
  bool left_region = false;
  for (std::uint64_t i = 0; i < 400000; ++i) {  // 3.2 MB of elements: past 2 MiB
    v.push_back(i * 3);
    left_region = left_region || !a.owns(v.data());
  }
  EXPECT_TRUE(left_region);
  for (std::uint64_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(v[i], i * 3) << "element " << i;
  }
  // Without an arena the allocator is the heap's.
  std::vector<int, arena_allocator<int>> h;
  h.assign(1000, 7);
  EXPECT_EQ(std::count(h.begin(), h.end(), 7), 1000);
  EXPECT_TRUE(arena_allocator<int>(&a) == arena_allocator<long>(&a));
  EXPECT_FALSE(arena_allocator<int>(&a) == arena_allocator<int>());
}

}  // namespace
