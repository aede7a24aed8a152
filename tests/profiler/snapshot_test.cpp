// snapshot_builder and snapshot_recorder: segments and blocks that tile them, trace entries, the
// bounded trace and ring with exact drop counts, every strategy's snapshot checked against the
// workload that made it and, through python3, against the structure of a snapshot PyTorch wrote
// (scripts/snapshot_check.py: keys, types, tiling, the viewer's backwards replay).
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pool/allocator_types.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/profiler/line_profiler.hpp"
#include "poolscope/profiler/snapshot_builder.hpp"
#include "poolscope/profiler/snapshot_recorder.hpp"

namespace poolscope::profiler {
namespace {

using hooks::event_kind;
using hooks::event_phase;

snapshot_event ev(event_kind k, std::uint64_t ptr, std::uint64_t requested,
                  std::uint64_t rounded = 0, std::uint32_t stack = 0) {
  snapshot_event e;
  e.kind = k;
  e.phase = k == event_kind::pool_free || k == event_kind::device_free ? event_phase::pre
            : k == event_kind::oom                                     ? event_phase::instant
                                                                       : event_phase::post;
  e.device = 0;
  e.ptr = ptr;
  e.requested = requested;
  e.rounded = rounded;
  e.stack = stack;
  return e;
}

void expect_tiled(const memory_snapshot& s) {
  for (const auto& seg : s.segments) {
    std::uint64_t at = seg.address;
    std::uint64_t allocated = 0;
    for (const auto& b : seg.blocks) {
      EXPECT_EQ(b.address, at);
      EXPECT_GT(b.size, 0U);
      at += b.size;
      if (b.state == block_state::active_allocated) {
        allocated += b.size;
      }
    }
    EXPECT_EQ(at, seg.address + seg.total_size);
    EXPECT_EQ(seg.allocated_size, allocated);
  }
}

TEST(snapshot_builder, blocks_tile_their_segment_and_the_trace_says_what_happened) {
  snapshot_builder b;
  b.add(ev(event_kind::device_alloc, 0x10000, 8192, 8192, 1));
  b.add(ev(event_kind::pool_malloc, 0x10000, 1000, 1024, 2));
  b.add(ev(event_kind::pool_malloc, 0x10800, 300, 512, 3));
  b.add(ev(event_kind::pool_free, 0x10000, 1000));
  const memory_snapshot s =
      b.snapshot({{}, {{"seg", "a.cpp", 1}}, {{"m1", "a.cpp", 2}}, {{"m2", "a.cpp", 3}}});
  ASSERT_EQ(s.segments.size(), 1U);
  const snapshot_segment& seg = s.segments[0];
  EXPECT_EQ(seg.address, 0x10000U);
  EXPECT_EQ(seg.total_size, 8192U);
  EXPECT_EQ(seg.stack, 1U);
  EXPECT_FALSE(seg.large);
  ASSERT_EQ(seg.blocks.size(), 3U);  // [inactive 2048][active 512][inactive 5632]
  EXPECT_EQ(seg.blocks[0].state, block_state::inactive);
  EXPECT_EQ(seg.blocks[0].size, 0x800U);
  EXPECT_EQ(seg.blocks[1].state, block_state::active_allocated);
  EXPECT_EQ(seg.blocks[1].size, 512U);
  EXPECT_EQ(seg.blocks[1].requested_size, 300U);
  EXPECT_EQ(seg.blocks[1].stack, 3U);
  EXPECT_EQ(seg.blocks[2].size, 8192U - 0x800U - 512U);
  EXPECT_EQ(seg.allocated_size, 512U);
  EXPECT_EQ(seg.requested_size, 300U);
  expect_tiled(s);

  ASSERT_EQ(s.device_traces.size(), 1U);
  const auto& t = s.device_traces[0];
  ASSERT_EQ(t.size(), 5U);
  const trace_action want[] = {trace_action::segment_alloc, trace_action::alloc,
                               trace_action::alloc, trace_action::free_requested,
                               trace_action::free_completed};
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(t[i].action, want[i]) << i;
  }
  EXPECT_EQ(t[1].size, 1000U);  // an alloc entry: the bytes asked for
  EXPECT_EQ(t[3].size, 1000U);
  EXPECT_EQ(t[3].stack, 2U);  // a free shows the stack of its allocation
  EXPECT_EQ(s.stacks.size(), 4U);

  b.add(ev(event_kind::pool_free, 0x10800, 300));
  b.add(ev(event_kind::device_free, 0x10000, 8192, 8192));
  const memory_snapshot after = b.snapshot();
  EXPECT_TRUE(after.segments.empty());
  EXPECT_EQ(after.device_traces[0].back().action, trace_action::segment_free);
  EXPECT_EQ(after.device_traces[0].back().size, 8192U);
}

TEST(snapshot_builder, keeps_the_last_max_entries_and_counts_the_rest) {
  snapshot_builder b({.max_entries = 5});
  b.add(ev(event_kind::device_alloc, 0x100000, 1 << 20, 1 << 20));
  for (std::uint64_t i = 0; i < 6; ++i) {  // 1 + 6 * 2 entries
    b.add(ev(event_kind::pool_malloc, 0x100000 + i * 512, 100, 512));
    b.add(ev(event_kind::pool_free, 0x100000 + i * 512, 100));
  }
  EXPECT_EQ(b.stats().dropped_entries, 1U + 6U * 3U - 5U);
  const memory_snapshot s = b.snapshot();
  ASSERT_EQ(s.device_traces[0].size(), 5U);
  // The last five, oldest first: free_completed(4), alloc(5), free_requested(5),
  // free_completed(5)... as written.
  EXPECT_EQ(s.device_traces[0].front().action, trace_action::free_requested);
  EXPECT_EQ(s.device_traces[0].front().addr, 0x100000U + 4 * 512);
  EXPECT_EQ(s.device_traces[0].back().action, trace_action::free_completed);
  EXPECT_EQ(s.device_traces[0].back().addr, 0x100000U + 5 * 512);
  bool found = false;
  for (const auto& [key, value] : s.allocator_settings) {
    if (key == "dropped_entries") {
      EXPECT_EQ(std::get<std::int64_t>(value), 14);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(snapshot_builder, memory_from_before_the_first_event_gets_segments_that_cover_it) {
  snapshot_builder b;
  b.add(ev(event_kind::device_alloc, 0x800000, 4096, 4096));
  b.add(ev(event_kind::pool_malloc, 0x100000, 100, 512));  // its segment came before
  b.add(ev(event_kind::pool_malloc, 0x100100, 50, 512));   // overlapping the first's segment
  b.add(ev(event_kind::pool_free, 0x200000, 64));          // allocated before, freed now
  b.add(ev(event_kind::pool_free, 0x100100, 64));          // a live block: its real free
  b.add(ev(event_kind::pool_free, 0x800010, 64));          // inside a segment seen acquired
  const memory_snapshot s = b.snapshot();
  expect_tiled(s);
  std::map<std::uint64_t, std::uint64_t> segments;
  for (const auto& seg : s.segments) {
    segments[seg.address] = seg.total_size;
  }
  const std::map<std::uint64_t, std::uint64_t> want = {
      {0x100000, 0x100 + 512}, {0x200000, 64}, {0x800000, 4096}};
  EXPECT_EQ(segments, want);
  EXPECT_EQ(b.stats().unknown_segments, 3U);
  EXPECT_EQ(b.stats().untracked_frees, 1U);
  // No segment_alloc for memory from before: for the viewer it was there from the start.
  std::size_t segment_allocs = 0;
  for (const auto& t : s.device_traces[0]) {
    segment_allocs += t.action == trace_action::segment_alloc ? 1 : 0;
  }
  EXPECT_EQ(segment_allocs, 1U);
}

TEST(snapshot_builder, devices_index_the_traces_and_host_memory_has_its_own) {
  snapshot_builder b({.host_device = 2});
  snapshot_event gpu1 = ev(event_kind::device_alloc, 0x1000, 4096, 4096);
  gpu1.device = 1;
  snapshot_event host = ev(event_kind::device_alloc, 0x9000, 4096, 4096);
  host.device = -1;
  b.add(gpu1);
  b.add(host);
  snapshot_event oom = ev(event_kind::oom, 0, 1 << 30);
  oom.device = 1;
  oom.device_free = 12345;
  b.add(oom);
  const memory_snapshot s = b.snapshot();
  ASSERT_EQ(s.device_traces.size(), 3U);
  EXPECT_TRUE(s.device_traces[0].empty());
  ASSERT_EQ(s.device_traces[1].size(), 2U);
  EXPECT_EQ(s.device_traces[1][1].action, trace_action::oom);
  EXPECT_EQ(s.device_traces[1][1].addr, 12345U);  // device_free
  EXPECT_EQ(s.device_traces[1][1].size, 1U << 30);
  ASSERT_EQ(s.device_traces[2].size(), 1U);
  ASSERT_EQ(s.segments.size(), 2U);
  EXPECT_EQ(s.segments[0].device, 1);
  EXPECT_EQ(s.segments[1].device, 2);
  EXPECT_THROW(snapshot_builder({.max_entries = 0}), invalid_argument);
}

// ---- the recorder on real allocators ----------------------------------------------------------

/// Runs `python3 scripts/snapshot_check.py FILE --reference <PyTorch's sample>`: true if it
/// passed. Skips the calling test if python3 is missing.
bool python_check(const std::string& file, std::string& output) {
  const std::string cmd = "python3 " + std::string(POOLSCOPE_SNAPSHOT_CHECK) + " " + file +
                          " --reference " + std::string(POOLSCOPE_TEST_DATA_DIR) +
                          "/torch_snapshot_varlen.pickle 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    return false;
  }
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
    output += buf;
  }
  return ::pclose(p) == 0;
}

bool have_python3() {
  return std::system("python3 -c 'import pickle' >/dev/null 2>&1") == 0;
}

__attribute__((noipa)) void* snapshot_site(pool::allocator& a, std::size_t n) {
  void* p = a.allocate({}, n);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

/// A random workload on a fresh Fixture allocator, snapshotted; the snapshot must hold the
/// workload's live blocks, the pool's reserved bytes, its allocations, frees, maps and unmaps, and
/// load as PyTorch's does.
template <typename Fixture>
void check_workload_snapshot() {
  using TypeParam = Fixture;
  const std::uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937_64 rng(seed);
  auto host = TypeParam::make_resource();
  auto alloc = TypeParam::make(*host);
  snapshot_recorder snap;
  std::map<void*, std::size_t> live;  // the reference: what the workload holds
  std::uint64_t mallocs = 0;
  std::uint64_t frees = 0;
  {
    hooks::scoped_hook on{snap};
    std::uniform_int_distribution<int> log_size(8, 22);
    for (int i = 0; i < 2000; ++i) {
      if (!live.empty() && rng() % 5 < 2) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        alloc->deallocate({}, it->first, it->second);
        live.erase(it);
        ++frees;
      } else {
        const std::size_t n = (std::size_t{1} << log_size(rng)) + rng() % 1000;
        live.emplace(snapshot_site(*alloc, n), n);
        ++mallocs;
      }
      if (i % 500 == 499) {
        (void)alloc->release_cached();
      }
    }
  }
  const memory_snapshot s = snap.snapshot();
  expect_tiled(s);
  std::map<void*, std::size_t> active;
  std::uint64_t reserved = 0;
  for (const auto& seg : s.segments) {
    reserved += seg.total_size;
    for (const auto& b : seg.blocks) {
      if (b.state == block_state::active_allocated) {
        active.emplace(reinterpret_cast<void*>(b.address), b.requested_size);
        EXPECT_GE(b.size, b.requested_size);
      }
    }
  }
  EXPECT_EQ(active, live);
  EXPECT_EQ(reserved, alloc->stats().reserved);
  ASSERT_EQ(s.device_traces.size(), 1U);  // host memory: device 0
  std::uint64_t allocs = 0;
  std::uint64_t completed = 0;
  for (const auto& t : s.device_traces[0]) {
    allocs += t.action == trace_action::alloc ? 1 : 0;
    completed += t.action == trace_action::free_completed ? 1 : 0;
  }
  EXPECT_EQ(allocs, mallocs);
  EXPECT_EQ(completed, frees);
  EXPECT_EQ(snap.stats().dropped_events, 0U);
  // Over a virtual resource, bfc's mapped memory: segments that are its contiguous mapped
  // ranges (expandable, as PyTorch's), an entry for each map and unmap.
  std::uint64_t maps = 0;
  std::uint64_t unmaps = 0;
  for (const auto& t : s.device_traces[0]) {
    maps += t.action == trace_action::segment_map ? 1 : 0;
    unmaps += t.action == trace_action::segment_unmap ? 1 : 0;
  }
  EXPECT_EQ(maps, alloc->stats().maps);
  EXPECT_EQ(unmaps, alloc->stats().unmaps);
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    EXPECT_EQ(s.segments[i].is_expandable, maps != 0);
    if (maps != 0 && i > 0) {
      EXPECT_LT(s.segments[i - 1].address + s.segments[i - 1].total_size, s.segments[i].address)
          << "adjacent mapped ranges are one segment";
    }
  }
  // Allocations carry the stack that asked: snapshot_site is on it.
  const auto& first_alloc =
      *std::find_if(s.device_traces[0].begin(), s.device_traces[0].end(),
                    [](const trace_entry& t) { return t.action == trace_action::alloc; });
  ASSERT_NE(first_alloc.stack, 0U);
  bool site_seen = false;
  for (const auto& f : s.stacks[first_alloc.stack]) {
    site_seen = site_seen || f.name.find("snapshot_site") != std::string::npos;
  }
  if (has_libdw()) {
    EXPECT_TRUE(site_seen);
  }

  std::string name = alloc->name();
  std::replace_if(
      name.begin(), name.end(),
      [](char c) { return std::isalnum(static_cast<unsigned char>(c)) == 0; }, '_');
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("poolscope_snapshot_" + name + "_" + std::to_string(::getpid()) + ".pickle"))
          .string();
  snap.write(path);
  if (!have_python3()) {
    GTEST_SKIP() << "python3 is not here: the structure check did not run";
  }
  std::string output;
  EXPECT_TRUE(python_check(path, output)) << output;
  std::filesystem::remove(path);
}

template <typename Fixture>
class snapshot_on_every_strategy : public ::testing::Test {};
TYPED_TEST_SUITE(snapshot_on_every_strategy, pool::testing::host_allocators);

TYPED_TEST(snapshot_on_every_strategy, holds_the_workloads_blocks_and_loads_as_pytorchs) {
  check_workload_snapshot<TypeParam>();
}

template <typename Fixture>
class snapshot_over_host_vmm : public ::testing::Test {};
TYPED_TEST_SUITE(snapshot_over_host_vmm, pool::testing::host_vmm_allocators);

TYPED_TEST(snapshot_over_host_vmm, holds_the_workloads_blocks_and_mapped_ranges) {
  check_workload_snapshot<TypeParam>();
}

TEST(snapshot_recorder, an_oom_carries_the_free_host_memory) {
  pool::host_resource host;
  auto alloc = pool::make_allocator("bfc", host);
  alloc->set_limit(1 << 20);
  snapshot_recorder snap;
  {
    hooks::scoped_hook on{snap};
    EXPECT_THROW((void)alloc->allocate({}, 4 << 20), out_of_memory);
  }
  const memory_snapshot s = snap.snapshot();
  ASSERT_EQ(s.device_traces.size(), 1U);
  ASSERT_EQ(s.device_traces[0].size(), 1U);
  const trace_entry& oom = s.device_traces[0][0];
  EXPECT_EQ(oom.action, trace_action::oom);
  EXPECT_EQ(oom.size, 4U << 20);
  EXPECT_GT(oom.addr, 0U);                           // the host's available memory
  EXPECT_GT(oom.time_us, 1'500'000'000'000'000ULL);  // wall-clock microseconds (after 2017)
}

hooks::event malloc_event(std::uint64_t i) {
  hooks::event e;
  e.kind = event_kind::pool_malloc;
  e.phase = event_phase::post;
  e.device = -1;
  e.allocator_name = "test";
  e.ptr = reinterpret_cast<void*>(0x10000 + i * 256);
  e.requested = 100;
  e.rounded = 256;
  return e;
}

TEST(snapshot_recorder, a_full_ring_drops_and_counts_exactly) {
  snapshot_recorder snap({.stacks = false, .ring_slots = 64, .writer_thread = false});
  for (std::uint64_t i = 0; i < 100; ++i) {
    snap.on_event(malloc_event(i));
  }
  snapshot_recorder_stats st = snap.stats();  // drains the ring
  EXPECT_EQ(st.events, 64U);
  EXPECT_EQ(st.dropped_events, 36U);
  for (std::uint64_t i = 100; i < 110; ++i) {
    snap.on_event(malloc_event(i));
  }
  const memory_snapshot s = snap.snapshot();
  EXPECT_EQ(s.device_traces[0].size(), 74U);
  for (const auto& [key, value] : s.allocator_settings) {
    if (key == "dropped_events") {
      EXPECT_EQ(std::get<std::int64_t>(value), 36);
    }
  }
}

TEST(snapshot_recorder_concurrency, threads_pushing_at_once_lose_nothing_uncounted) {
  constexpr int threads = 4;
  constexpr std::uint64_t per_thread = 5000;
  for (bool writer : {false, true}) {
    snapshot_recorder snap({.stacks = false, .ring_slots = 256, .writer_thread = writer});
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&snap, t] {
        for (std::uint64_t i = 0; i < per_thread; ++i) {
          snap.on_event(malloc_event(static_cast<std::uint64_t>(t) * per_thread + i));
        }
      });
    }
    for (auto& th : pool) {
      th.join();
    }
    const snapshot_recorder_stats st = snap.stats();
    EXPECT_EQ(st.events + st.dropped_events, threads * per_thread) << "writer " << writer;
    const memory_snapshot s = snap.snapshot();
    std::uint64_t active = 0;
    for (const auto& seg : s.segments) {
      for (const auto& b : seg.blocks) {
        active += b.state == block_state::active_allocated ? 1 : 0;
      }
    }
    EXPECT_EQ(active, st.events) << "every event taken is applied";
    if (!writer) {
      EXPECT_EQ(st.events, 256U);
    }
  }
}

}  // namespace
}  // namespace poolscope::profiler
