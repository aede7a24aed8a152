// event_ring: order, exact drops, the wake points, batches, peek, the layout, and many producers
// at once (the _concurrency suite also runs under TSan).
#include "../../profiler/src/detail/event_ring.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace poolscope::profiler::detail {
namespace {

using push_result = event_ring::push_result;

push_result push(event_ring& ring, std::uint64_t v) {
  return ring.try_push([v](void* slot) { std::memcpy(slot, &v, sizeof v); });
}

std::vector<std::uint64_t> drain_all(event_ring& ring, std::size_t max = SIZE_MAX) {
  std::vector<std::uint64_t> out;
  ring.drain(
      [&out](const void* slot) {
        std::uint64_t v = 0;
        std::memcpy(&v, slot, sizeof v);
        out.push_back(v);
      },
      max);
  return out;
}

std::vector<std::uint64_t> peek_all(const event_ring& ring) {
  std::vector<std::uint64_t> out;
  ring.peek([&out](const void* slot) {
    std::uint64_t v = 0;
    std::memcpy(&v, slot, sizeof v);
    out.push_back(v);
  });
  return out;
}

std::vector<std::uint64_t> iota(std::uint64_t from, std::uint64_t to) {
  std::vector<std::uint64_t> v;
  for (std::uint64_t i = from; i < to; ++i) {
    v.push_back(i);
  }
  return v;
}

TEST(event_ring, a_full_ring_drops_exactly_and_keeps_the_oldest_in_order) {
  event_ring ring{8, sizeof(std::uint64_t)};
  ASSERT_EQ(ring.capacity(), 8u);
  std::size_t stored = 0;
  std::size_t dropped = 0;
  for (std::uint64_t i = 0; i < 20; ++i) {
    const push_result r = push(ring, 100 + i);
    stored += r != push_result::dropped ? 1 : 0;
    dropped += r == push_result::dropped ? 1 : 0;
  }
  EXPECT_EQ(stored, 8u);
  EXPECT_EQ(dropped, 12u);
  EXPECT_EQ(ring.pushed(), 8u);
  EXPECT_EQ(ring.dropped(), 12u);
  EXPECT_EQ(ring.waiting(), 8u);
  EXPECT_EQ(drain_all(ring), iota(100, 108));
  EXPECT_EQ(ring.waiting(), 0u);
  // The freed slots take records again, after the ones drained.
  for (std::uint64_t i = 0; i < 8; ++i) {
    EXPECT_NE(push(ring, 200 + i), push_result::dropped) << i;
  }
  EXPECT_EQ(push(ring, 999), push_result::dropped);
  EXPECT_EQ(ring.dropped(), 13u);
  EXPECT_EQ(drain_all(ring), iota(200, 208));
}

TEST(event_ring, every_quarter_of_the_ring_asks_for_a_drain) {
  event_ring ring{16, sizeof(std::uint64_t)};
  std::vector<std::uint64_t> wakes;
  for (std::uint64_t i = 1; i <= 40; ++i) {
    if (push(ring, i) == push_result::stored_wake) {
      wakes.push_back(i);
    }
    if (i % 10 == 0) {
      (void)drain_all(ring);  // wherever the consumer is: the points depend on positions only
    }
  }
  EXPECT_EQ(wakes, (std::vector<std::uint64_t>{4, 8, 12, 16, 20, 24, 28, 32, 36, 40}));
}

TEST(event_ring, slot_counts_are_powers_of_two_of_at_least_two) {
  EXPECT_EQ((event_ring{0, 8}.capacity()), 2u);
  EXPECT_EQ((event_ring{1, 8}.capacity()), 2u);
  EXPECT_EQ((event_ring{100, 8}.capacity()), 128u);
  EXPECT_EQ((event_ring{128, 8}.capacity()), 128u);
  event_ring two{2, 8};  // a quarter of two slots is one: every record asks
  EXPECT_EQ(push(two, 1), push_result::stored_wake);
  EXPECT_EQ(push(two, 2), push_result::stored_wake);
  EXPECT_EQ(push(two, 3), push_result::dropped);
}

TEST(event_ring, drain_takes_at_most_max_across_batches) {
  event_ring ring{256, sizeof(std::uint64_t)};
  for (std::uint64_t i = 0; i < 200; ++i) {
    ASSERT_NE(push(ring, i), push_result::dropped);
  }
  EXPECT_EQ(drain_all(ring, 70), iota(0, 70));  // more than one batch, ending inside one
  EXPECT_EQ(peek_all(ring), iota(70, 200));
  EXPECT_EQ(drain_all(ring, 64), iota(70, 134));  // exactly one batch
  EXPECT_EQ(drain_all(ring), iota(134, 200));
  EXPECT_TRUE(drain_all(ring).empty());
  // Every slot was freed: a whole ring's worth fits again.
  for (std::uint64_t i = 0; i < 256; ++i) {
    ASSERT_NE(push(ring, 1000 + i), push_result::dropped) << i;
  }
  EXPECT_EQ(push(ring, 0), push_result::dropped);
  EXPECT_EQ(drain_all(ring), iota(1000, 1256));
}

TEST(event_ring, peek_sees_the_published_records_without_taking_them) {
  event_ring ring{8, sizeof(std::uint64_t)};
  EXPECT_TRUE(peek_all(ring).empty());
  for (std::uint64_t i = 0; i < 5; ++i) {
    (void)push(ring, 10 + i);
  }
  EXPECT_EQ(peek_all(ring), iota(10, 15));
  EXPECT_EQ(peek_all(ring), iota(10, 15));
  EXPECT_EQ(drain_all(ring, 3), iota(10, 13));
  EXPECT_EQ(peek_all(ring), iota(13, 15));
  // Around the end of the slots.
  for (std::uint64_t i = 0; i < 6; ++i) {
    (void)push(ring, 20 + i);
  }
  EXPECT_EQ(peek_all(ring), (std::vector<std::uint64_t>{13, 14, 20, 21, 22, 23, 24, 25}));
}

// A record and its sequence number share one 64-byte line up to 60 bytes; a larger one takes
// whole lines. Each slot is 64-byte aligned and keeps all of its bytes.
TEST(event_ring, records_keep_every_byte_in_aligned_slots) {
  for (std::size_t bytes : {std::size_t{1}, std::size_t{56}, event_ring::max_one_line_record,
                            event_ring::max_one_line_record + 1, std::size_t{200}}) {
    SCOPED_TRACE(bytes);
    event_ring ring{4, bytes};
    std::vector<std::uintptr_t> slots;
    for (int k = 0; k < 4; ++k) {
      ASSERT_NE(ring.try_push([&](void* slot) {
        slots.push_back(reinterpret_cast<std::uintptr_t>(slot));
        std::memset(slot, 0x40 + k, bytes);
      }),
                push_result::dropped);
    }
    for (std::uintptr_t s : slots) {
      EXPECT_EQ(s % 64, 0u);
    }
    const std::size_t stride = slots[1] - slots[0];
    EXPECT_EQ(stride, bytes <= event_ring::max_one_line_record ? 64u : (bytes + 4 + 63) / 64 * 64);
    int k = 0;
    ring.drain([&](const void* slot) {
      const auto* p = static_cast<const unsigned char*>(slot);
      for (std::size_t i = 0; i < bytes; ++i) {
        ASSERT_EQ(p[i], 0x40 + k) << "byte " << i;
      }
      ++k;
    });
    EXPECT_EQ(k, 4);
  }
}

// Sequence numbers are 32 bits: a ring whose positions pass 2^32 keeps its order and its drops.
TEST(event_ring, positions_past_two_to_the_32_keep_order_and_drops) {
  constexpr std::uint64_t start = (std::uint64_t{1} << 32) - 5;
  event_ring ring{8, sizeof(std::uint64_t), start};
  std::uint64_t next = 0;
  std::vector<std::uint64_t> got;
  std::size_t dropped = 0;
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 11; ++i) {
      dropped += push(ring, next++) == push_result::dropped ? 1 : 0;
    }
    const auto part = drain_all(ring);
    EXPECT_EQ(part.size(), 8u);
    got.insert(got.end(), part.begin(), part.end());
  }
  EXPECT_EQ(dropped, 12u);
  EXPECT_EQ(ring.dropped(), 12u);
  EXPECT_EQ(ring.pushed(), 32u);
  std::vector<std::uint64_t> expected;
  for (std::uint64_t r = 0; r < 4; ++r) {
    for (std::uint64_t i = 0; i < 8; ++i) {
      expected.push_back(r * 11 + i);
    }
  }
  EXPECT_EQ(got, expected);
}

// Several producers and a consumer draining as they push: every record drained once, each
// producer's records in its order, and what was not drained was counted as dropped.
TEST(event_ring_concurrency, producers_and_a_consumer_lose_only_what_is_counted) {
  constexpr int producers = 4;
  constexpr std::uint64_t per_producer = 20000;
  event_ring ring{256, 2 * sizeof(std::uint64_t)};
  std::atomic<int> running{producers};
  std::vector<std::uint64_t> drops(producers, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < producers; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < per_producer; ++i) {
        const std::uint64_t rec[2] = {static_cast<std::uint64_t>(t), i};
        if (ring.try_push([&rec](void* slot) { std::memcpy(slot, rec, sizeof rec); }) ==
            push_result::dropped) {
          ++drops[static_cast<std::size_t>(t)];
        }
      }
      running.fetch_sub(1, std::memory_order_release);
    });
  }
  std::vector<std::vector<std::uint64_t>> seen(producers);
  const auto take = [&](const void* slot) {
    std::uint64_t rec[2];
    std::memcpy(rec, slot, sizeof rec);
    ASSERT_LT(rec[0], static_cast<std::uint64_t>(producers));
    seen[rec[0]].push_back(rec[1]);
  };
  while (running.load(std::memory_order_acquire) != 0) {
    ring.drain(take);
  }
  for (auto& th : threads) {
    th.join();
  }
  ring.drain(take);
  std::uint64_t drained = 0;
  std::uint64_t dropped = 0;
  for (int t = 0; t < producers; ++t) {
    const auto& s = seen[static_cast<std::size_t>(t)];
    for (std::size_t i = 1; i < s.size(); ++i) {
      ASSERT_LT(s[i - 1], s[i]) << "producer " << t;
    }
    EXPECT_EQ(s.size() + drops[static_cast<std::size_t>(t)], per_producer) << "producer " << t;
    drained += s.size();
    dropped += drops[static_cast<std::size_t>(t)];
  }
  EXPECT_EQ(ring.dropped(), dropped);
  EXPECT_EQ(ring.pushed(), drained);
  EXPECT_EQ(ring.pushed() + ring.dropped(), producers * per_producer);
}

}  // namespace
}  // namespace poolscope::profiler::detail
