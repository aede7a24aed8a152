// The pools' internal structures against simple references: bfc's size classes against a class
// computed bit by bit, its free index's best fit against a scan of every free chunk, the address
// table against std::unordered_map, and a thread cache's lock-free filters against its table.
#include <gtest/gtest.h>

#include <cstdint>
#include <list>
#include <random>
#include <unordered_map>
#include <vector>

#include "../../pool/src/detail/bfc_structures.hpp"
#include "../../pool/src/detail/thread_cache.hpp"

namespace poolscope::pool::detail {
namespace {

// The class definition spelled out: a class per unit count below 2^sub_bits units, then
// 2^sub_bits linear classes per power of two.
unsigned reference_class(std::size_t size) {
  const std::size_t units = size / bfc_granularity;
  unsigned fl = 0;
  while ((units >> (fl + 1)) != 0) {
    ++fl;
  }
  const unsigned sub = bfc_free_index::sub_bits;
  if (fl < sub) {
    return static_cast<unsigned>(units);
  }
  const std::size_t sl = (units >> (fl - sub)) - (std::size_t{1} << sub);
  const std::size_t cls = (fl - sub + 1) * bfc_free_index::sub_count + sl;
  return static_cast<unsigned>(std::min<std::size_t>(cls, bfc_free_index::class_count - 1));
}

TEST(bfc_free_index, class_of_matches_the_definition) {
  for (std::size_t units = 1; units < (1U << 16); ++units) {
    ASSERT_EQ(bfc_free_index::class_of(units * bfc_granularity), reference_class(units * 512))
        << units << " units";
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const std::size_t size = ((rng() >> (rng() % 60)) | 1U) * bfc_granularity;
    ASSERT_EQ(bfc_free_index::class_of(size), reference_class(size)) << size;
  }
  // Classes never decrease with size, and the largest sizes share the last class.
  EXPECT_EQ(bfc_free_index::class_of(SIZE_MAX / 512 * 512), bfc_free_index::class_count - 1);
}

TEST(bfc_free_index, best_fit_is_the_smallest_fitting_chunk_most_recent_first) {
  std::mt19937_64 rng(11);
  // Sizes crowd a few classes (so lists hold several chunks and ties) and span the rest.
  const auto random_size = [&rng] {
    switch (rng() % 3) {
      case 0:
        return (1 + rng() % 8) * std::size_t{512};
      case 1:
        return (std::size_t{1} << 20) + (rng() % 64) * 512;
      default:
        return (1 + rng() % (std::size_t{1} << 17)) * 512;
    }
  };
  std::list<bfc_chunk> storage;
  std::vector<bfc_chunk*> free;  // in insertion order: the newest last
  bfc_free_index index;
  for (int step = 0; step < 20000; ++step) {
    if (free.empty() || rng() % 5 < 3) {
      bfc_chunk& c = storage.emplace_back();
      c.size = random_size();
      c.is_free = true;
      index.insert(&c);
      free.push_back(&c);
    } else {
      const std::size_t i = rng() % free.size();
      index.remove(free[i]);
      free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
    }
    const std::size_t want = random_size();
    const bfc_chunk* expected = nullptr;
    for (const bfc_chunk* c : free) {  // smallest >= want; among equals the newest
      if (c->size >= want && (expected == nullptr || c->size <= expected->size)) {
        expected = c;
      }
    }
    const bfc_chunk* got = index.best_fit(want);
    // In its own class the fit is exact; from a higher class, the head (smallest) of the
    // first non-empty one, which is the smallest fitting size overall.
    ASSERT_EQ(got == nullptr, expected == nullptr) << "step " << step << " want " << want;
    if (got != nullptr) {
      ASSERT_EQ(got->size, expected->size) << "step " << step << " want " << want;
      ASSERT_EQ(got, expected) << "tie not broken by recency, step " << step;
    }
    std::size_t largest = 0;
    for (const bfc_chunk* c : free) {
      largest = std::max(largest, c->size);
    }
    ASSERT_EQ(index.largest(), largest) << "step " << step;
  }
  // Every class list is sorted, its bitmap bit set exactly when it holds chunks.
  for (std::size_t cls = 0; cls < bfc_free_index::class_count; ++cls) {
    const bfc_chunk* prev = nullptr;
    for (const bfc_chunk* c = index.head(cls); c != nullptr; c = index.next_in_class(c)) {
      ASSERT_EQ(index.prev_in_class(c), prev);
      ASSERT_TRUE(prev == nullptr || prev->size <= c->size);
      prev = c;
    }
    ASSERT_EQ(index.tail(cls), prev);
    ASSERT_EQ(index.marked(cls), prev != nullptr) << "class " << cls;
  }
}

struct test_slot {
  std::uintptr_t key = 0;
  int value = 0;
};

TEST(address_table, agrees_with_a_map_through_growth_and_erasure) {
  address_table<test_slot, 8> table;
  std::unordered_map<std::uintptr_t, int> ref;
  std::mt19937_64 rng(3);
  std::vector<std::uintptr_t> keys;
  for (int step = 0; step < 200000; ++step) {
    if (keys.empty() || rng() % 2 == 0) {
      // Nearby keys (512-byte multiples, as chunk addresses are) collide in runs.
      const std::uintptr_t key = (1 + rng() % 4096) * 512;
      if (ref.count(key) != 0) {
        continue;
      }
      table.reserve_one();
      table.insert({key, step});
      ref[key] = step;
      keys.push_back(key);
    } else {
      const std::size_t i = rng() % keys.size();
      test_slot* s = table.find(reinterpret_cast<const void*>(keys[i]));
      ASSERT_NE(s, nullptr);
      ASSERT_EQ(s->value, ref[keys[i]]);
      table.erase(s);
      ref.erase(keys[i]);
      keys[i] = keys.back();
      keys.pop_back();
    }
    if (step % 1000 == 0) {
      ASSERT_EQ(table.size(), ref.size());
      for (std::uintptr_t k = 512; k <= 4096 * 512; k += 512) {
        const test_slot* s = table.find(reinterpret_cast<const void*>(k));
        const auto it = ref.find(k);
        ASSERT_EQ(s != nullptr, it != ref.end()) << k;
        if (s != nullptr) {
          ASSERT_EQ(s->value, it->second);
        }
      }
    }
  }
}

// may_hold may say yes for an address the table lacks (a shared slot), never no for one it holds;
// surely_passes never for a size that has a bin or was wanted lately.
TEST(thread_cache_filters, never_deny_what_the_cache_holds) {
  thread_cache c(false);
  std::mt19937_64 rng(5);
  std::unordered_map<std::uintptr_t, bool> held;
  std::size_t false_yes = 0;
  std::size_t asked_absent = 0;
  for (int step = 0; step < 50000; ++step) {
    const std::uintptr_t key = (1 + rng() % 20000) * 512;
    if (held.count(key) == 0) {
      if (c.may_hold(reinterpret_cast<const void*>(key))) {
        ++false_yes;
      }
      ++asked_absent;
      if (rng() % 2 == 0) {
        c.table.reserve_one();
        c.table_insert({key, 512, 512, 512, nullptr, false});
        held[key] = true;
      }
    } else {
      ASSERT_TRUE(c.may_hold(reinterpret_cast<const void*>(key))) << "step " << step;
      if (rng() % 2 == 0) {
        c.table_erase(c.table.find(reinterpret_cast<const void*>(key)));
        held.erase(key);
      }
    }
    if (step == 40000) {
      c.table_clear();
      held.clear();
      for (std::uintptr_t k = 512; k <= 20000 * 512; k += 512) {
        ASSERT_FALSE(c.may_hold(reinterpret_cast<const void*>(k)));
      }
    }
  }
  // With up to ~10000 entries over 1024 slots most absent addresses share a slot; the filter
  // must still have said no sometimes (it is a filter, not a constant yes).
  EXPECT_LT(false_yes, asked_absent);

  // Sizes: a bin's size and a wanted size never pass; the others mostly do.
  c.bins[3].rounded = 7 * 512;
  c.rekey_bins();
  EXPECT_FALSE(c.surely_passes(7 * 512));
  c.add_wanted(9 * 512, nullptr);
  EXPECT_FALSE(c.surely_passes(9 * 512));
  std::size_t passed = 0;
  for (std::size_t units = 100; units < 1100; ++units) {
    passed += c.surely_passes(units * 512) ? 1 : 0;
  }
  EXPECT_GT(passed, 900U);  // 2 bits of 256 set: about 99 % pass
}

// find_bin answers as a scan of every bin would, whether a filter bit has no bin, one, or
// several (sizes that share a bit, one size on two streams), through random rekeyings.
TEST(thread_cache_filters, find_bin_agrees_with_a_scan) {
  thread_cache c(false);
  std::mt19937_64 rng(11);
  // Sizes in few filter bits, so that bins share bits often.
  std::vector<std::size_t> sizes;
  const unsigned wanted_bits[] = {thread_cache::size_bit(3 * 512),
                                  thread_cache::size_bit(40 * 512)};
  for (std::size_t units = 1; sizes.size() < 12; ++units) {
    const unsigned bit = thread_cache::size_bit(units * 512);
    if (bit == wanted_bits[0] || bit == wanted_bits[1]) {
      sizes.push_back(units * 512);
    }
  }
  void* const streams[] = {nullptr, reinterpret_cast<void*>(0x1000)};
  const auto scan = [&c](std::size_t rounded, void* stream) {
    for (std::size_t i = 0; i < thread_cache::bin_count; ++i) {
      if (c.bins[i].rounded == rounded && c.bins[i].stream == stream) {
        return i;
      }
    }
    return thread_cache::bin_count;
  };
  std::size_t found = 0;
  for (int round = 0; round < 2000; ++round) {
    // Rekey a few bins (keys stay distinct, as tc_cache_locked keeps them), or clear one.
    for (int k = 0; k < 3; ++k) {
      const std::size_t i = rng() % thread_cache::bin_count;
      const std::size_t rounded = rng() % 4 == 0 ? 0 : sizes[rng() % sizes.size()];
      void* const stream = streams[rng() % 2];
      if (rounded == 0 || scan(rounded, stream) == thread_cache::bin_count) {
        c.bins[i].rounded = rounded;
        c.bins[i].stream = rounded == 0 ? nullptr : stream;
      }
    }
    c.rekey_bins();
    for (const std::size_t rounded : sizes) {
      for (void* const stream : streams) {
        const std::size_t want = scan(rounded, stream);
        ASSERT_EQ(c.find_bin(rounded, stream), want) << "round " << round << ", size " << rounded;
        found += want != thread_cache::bin_count ? 1 : 0;
      }
    }
    ASSERT_EQ(c.find_bin(7777 * 512, nullptr), thread_cache::bin_count);
  }
  EXPECT_GT(found, 0U);
}

}  // namespace
}  // namespace poolscope::pool::detail
