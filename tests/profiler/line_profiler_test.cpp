// line_profiler: stack deduplication, attribution, live and live-at-peak figures, unwinders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/host_vmm_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"
#include "poolscope/profiler/line_profiler.hpp"

namespace poolscope::profiler {
namespace {

// Known call sites. noipa: never inlined, cloned or folded together with a look-alike, so each
// has its own return address. The asm after the call keeps it from being a tail call.
__attribute__((noipa)) void* site_a(pool::allocator& a, std::size_t n) {
  void* p = a.allocate({}, n);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}
__attribute__((noipa)) void* site_b(pool::allocator& a, std::size_t n) {
  void* p = a.allocate({}, n + 0);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}
__attribute__((noipa)) void* site_c(pool::allocator& a, std::size_t n) {
  void* p = a.allocate({}, n);
  asm volatile("" : : "r"(p), "r"(n) : "memory");
  return p;
}

/// One step of a scripted scenario: allocate at a site, or free an earlier step's block.
struct step {
  char site;          // 'a', 'b', 'c': allocate at that site; 'f': free the block of step `of`
  std::size_t bytes;  // bytes to allocate
  std::size_t of;     // for 'f': index of the allocating step
};

/// Runs a script from one loop, so each site is always reached through the same stack.
__attribute__((noipa)) void run_script(pool::allocator& a, const std::vector<step>& script,
                                       std::vector<void*>& blocks) {
  blocks.assign(script.size(), nullptr);
  for (std::size_t i = 0; i < script.size(); ++i) {
    const step& s = script[i];
    switch (s.site) {
      case 'a':
        blocks[i] = site_a(a, s.bytes);
        break;
      case 'b':
        blocks[i] = site_b(a, s.bytes);
        break;
      case 'c':
        blocks[i] = site_c(a, s.bytes);
        break;
      default:
        a.deallocate({}, blocks[s.of], script[s.of].bytes);
        blocks[s.of] = nullptr;
        break;
    }
  }
}

/// Every node of the tree, with its depth (root = 0).
void flatten(const profile_node& n, int depth,
             std::vector<std::pair<const profile_node*, int>>& out) {
  out.emplace_back(&n, depth);
  for (const auto& c : n.children) {
    flatten(c, depth + 1, out);
  }
}

std::vector<const profile_node*> nodes_with_self_count(const line_profile& p) {
  std::vector<std::pair<const profile_node*, int>> all;
  flatten(p.root, 0, all);
  std::vector<const profile_node*> out;
  for (auto [n, d] : all) {
    if (n->self.count > 0) {
      out.push_back(n);
    }
  }
  return out;
}

const profile_node* node_with_self_used(const line_profile& p, std::uint64_t used) {
  std::vector<std::pair<const profile_node*, int>> all;
  flatten(p.root, 0, all);
  const profile_node* found = nullptr;
  for (auto [n, d] : all) {
    if (n->self.used == used) {
      EXPECT_EQ(found, nullptr) << "two nodes with self.used " << used;
      found = n;
    }
  }
  return found;
}

/// Path of return addresses from the root down to `target` (exclusive of the root).
bool path_to(const profile_node& n, const profile_node* target, std::vector<std::uint64_t>& path) {
  if (&n == target) {
    return true;
  }
  for (const auto& c : n.children) {
    path.push_back(c.address);
    if (path_to(c, target, path)) {
      return true;
    }
    path.pop_back();
  }
  return false;
}

std::vector<stack_unwinder> available_unwinders() {
  std::vector<stack_unwinder> out;
  for (auto u :
       {stack_unwinder::automatic, stack_unwinder::libunwind, stack_unwinder::glibc_backtrace,
        stack_unwinder::frame_pointer, stack_unwinder::cached_dwarf}) {
    if (unwinder_available(u)) {
      out.push_back(u);
    }
  }
  return out;
}

TEST(line_profiler, same_call_site_twice_is_one_node_with_count_two) {
  pool::host_resource host;
  pool::naive_allocator alloc{host};
  line_profiler prof;
  {
    hooks::scoped_hook on{prof};
    std::vector<void*> blocks;
    run_script(alloc, {{'a', 1000, 0}, {'f', 0, 0}, {'a', 1000, 0}, {'f', 0, 2}}, blocks);
  }
  const line_profile r = prof.report({.symbolize = false});
  const auto leaves = nodes_with_self_count(r);
  ASSERT_EQ(leaves.size(), 1u);
  EXPECT_EQ(leaves[0]->self.count, 2u);
  EXPECT_EQ(leaves[0]->self.used, 2000u);
  EXPECT_EQ(leaves[0]->self.freed, 2000u);
  EXPECT_EQ(leaves[0]->self.live, 0u);
  EXPECT_TRUE(leaves[0]->children.empty());
  EXPECT_EQ(r.root.total.count, 2u);
  EXPECT_EQ(r.unmatched_frees, 0u);
}

TEST(line_profiler, two_call_sites_are_two_leaves_sharing_the_callers_path) {
  pool::host_resource host;
  pool::naive_allocator alloc{host};
  line_profiler prof;
  {
    hooks::scoped_hook on{prof};
    void* a = site_a(alloc, 100);
    void* b = site_b(alloc, 300);
    alloc.deallocate({}, a, 100);
    alloc.deallocate({}, b, 300);
  }
  const line_profile r = prof.report({.symbolize = false});
  const auto leaves = nodes_with_self_count(r);
  ASSERT_EQ(leaves.size(), 2u);
  const profile_node* a = node_with_self_used(r, 100);
  const profile_node* b = node_with_self_used(r, 300);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_TRUE(a->children.empty());
  EXPECT_TRUE(b->children.empty());
  EXPECT_NE(a->address, b->address);
  std::vector<std::uint64_t> pa;
  std::vector<std::uint64_t> pb;
  ASSERT_TRUE(path_to(r.root, a, pa));
  ASSERT_TRUE(path_to(r.root, b, pb));
  // Same depth: both are called from this test body. The paths share every frame but the two
  // innermost (the call into site_x in this function, and the allocate call inside site_x).
  ASSERT_EQ(pa.size(), pb.size());
  ASSERT_GE(pa.size(), 2u);
  for (std::size_t i = 0; i + 2 < pa.size(); ++i) {
    EXPECT_EQ(pa[i], pb[i]) << "frame " << i;
  }
  EXPECT_NE(pa[pa.size() - 2], pb[pb.size() - 2]);
  EXPECT_EQ(r.root.total.used, 400u);
}

TEST(line_profiler, every_unwinder_deduplicates_and_counts) {
  for (stack_unwinder u : available_unwinders()) {
    SCOPED_TRACE(std::string(to_string(u)));
    pool::host_resource host;
    pool::naive_allocator alloc{host};
    line_profiler prof{{.unwinder = u}};
    EXPECT_NE(prof.unwinder(), stack_unwinder::automatic);
    {
      hooks::scoped_hook on{prof};
      for (int i = 0; i < 3; ++i) {
        void* p = site_a(alloc, 64);
        void* q = site_b(alloc, 128);
        alloc.deallocate({}, p, 64);
        alloc.deallocate({}, q, 128);
      }
    }
    const line_profile r = prof.report({.symbolize = false});
    EXPECT_EQ(r.root.total.count, 6u);
    EXPECT_EQ(r.root.total.used, 3u * (64 + 128));
    EXPECT_EQ(r.root.total.live, 0u);
    EXPECT_EQ(r.unwinder, to_string(prof.unwinder()));
    if (u != stack_unwinder::frame_pointer) {
      // DWARF unwinders see the real stacks: one leaf per site, three calls each.
      const auto leaves = nodes_with_self_count(r);
      ASSERT_EQ(leaves.size(), 2u);
      EXPECT_EQ(leaves[0]->self.count, 3u);
      EXPECT_EQ(leaves[1]->self.count, 3u);
    }
  }
}

TEST(line_profiler, acquired_bytes_are_attributed_and_returned) {
  pool::host_resource host;
  pool::best_fit_allocator alloc{host};
  line_profiler prof;
  {
    hooks::scoped_hook on{prof};
    // First: upstream 1024 bytes; second: the cached block.
    std::vector<void*> blocks;
    run_script(alloc, {{'a', 1000, 0}, {'f', 0, 0}, {'a', 1000, 0}, {'f', 0, 2}}, blocks);
    const line_profile mid = prof.report({.symbolize = false});
    const profile_node* a = node_with_self_used(mid, 2000);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->self.count, 2u);
    EXPECT_EQ(a->self.rounded, 2048u);
    EXPECT_EQ(a->self.acquire_count, 1u);
    EXPECT_EQ(a->self.acquired, 1024u);
    EXPECT_EQ(a->self.live_acquired, 1024u);
    EXPECT_EQ(alloc.release_cached(), 1024u);
  }
  const line_profile r = prof.report({.symbolize = false});
  const profile_node* a = node_with_self_used(r, 2000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->self.acquired, 1024u);
  EXPECT_EQ(a->self.live_acquired, 0u);
  EXPECT_EQ(r.root.total.acquired, 1024u);
}

TEST(line_profiler, live_and_live_at_peak_match_a_hand_computed_scenario) {
  pool::host_resource host;
  pool::naive_allocator alloc{host};
  line_profiler prof;
  // Total live after each step in brackets.
  const std::vector<step> first = {
      {'a', 100, 0},  // 0: [100]  peak
      {'b', 200, 0},  // 1: [300]  peak
      {'f', 0, 0},    // 2: [200]
      {'c', 50, 0},   // 3: [250]
      {'f', 0, 1},    // 4: [50]
      {'a', 400, 0},  // 5: [450]  peak: a=400, b=0, c=50
      {'f', 0, 5},    // 6: [50]
      {'b', 100, 0},  // 7: [150]  b changes after the peak; at the peak it was 0
      {'a', 10, 0},   // 8: [160]  now a=10, b=100, c=50
  };
  // The same again plus one step: live after its steps 0-8 is a=20, b=200, c=100 [320] (its
  // own peak of 160 + 450 = 610 is passed later); step 9 makes the new peak [1320] with
  // a=20, b=200, c=1100.
  std::vector<step> second = first;
  second.push_back({'c', 1000, 0});
  const std::vector<std::vector<step>> phases = {first, second};
  std::vector<std::vector<void*>> blocks(phases.size());
  {
    hooks::scoped_hook on{prof};
    // One call instruction for both phases, so each site has one stack.
    for (std::size_t ph = 0; ph < phases.size(); ++ph) {
      run_script(alloc, phases[ph], blocks[ph]);
      const line_profile r = prof.report({.symbolize = false});
      if (ph == 0) {
        EXPECT_EQ(r.peak_live, 450u);
        const profile_node* a = node_with_self_used(r, 510);
        const profile_node* b = node_with_self_used(r, 300);
        const profile_node* c = node_with_self_used(r, 50);
        ASSERT_NE(a, nullptr);
        ASSERT_NE(b, nullptr);
        ASSERT_NE(c, nullptr);
        EXPECT_EQ(a->self.live, 10u);
        EXPECT_EQ(b->self.live, 100u);
        EXPECT_EQ(c->self.live, 50u);
        EXPECT_EQ(a->self.live_at_peak, 400u);
        EXPECT_EQ(b->self.live_at_peak, 0u);
        EXPECT_EQ(c->self.live_at_peak, 50u);
        EXPECT_EQ(a->self.freed, 500u);
        EXPECT_EQ(b->self.freed, 200u);
        EXPECT_EQ(c->self.freed, 0u);
        EXPECT_EQ(a->self.count, 3u);
        EXPECT_EQ(r.root.total.live, 160u);
        EXPECT_EQ(r.root.total.live_at_peak, 450u);
      } else {
        EXPECT_EQ(r.peak_live, 1320u);
        const profile_node* a = node_with_self_used(r, 1020);
        const profile_node* b = node_with_self_used(r, 600);
        const profile_node* c = node_with_self_used(r, 1100);
        ASSERT_NE(a, nullptr);
        ASSERT_NE(b, nullptr);
        ASSERT_NE(c, nullptr);
        EXPECT_EQ(a->self.live_at_peak, 20u);
        EXPECT_EQ(b->self.live_at_peak, 200u);
        EXPECT_EQ(c->self.live_at_peak, 1100u);
        EXPECT_EQ(r.root.total.live, 1320u);
        EXPECT_EQ(r.root.total.live_at_peak, 1320u);
      }
    }
    for (std::size_t ph = 0; ph < phases.size(); ++ph) {
      for (std::size_t i = 0; i < phases[ph].size(); ++i) {
        if (blocks[ph][i] != nullptr) {
          alloc.deallocate({}, blocks[ph][i], phases[ph][i].bytes);
        }
      }
    }
  }
  const line_profile end = prof.report({.symbolize = false});
  EXPECT_EQ(end.root.total.live, 0u);
  EXPECT_EQ(end.root.total.live_at_peak, 1320u);
  EXPECT_EQ(end.root.total.freed, end.root.total.used);
  EXPECT_EQ(nodes_with_self_count(end).size(), 3u);
}

// The profiler asks for no event numbers: alone, its peak_seq is 0; beside a hook that reads them
// (installed first, so delivered after the profiler), it is the number that hook saw on the
// malloc that reached the peak.
TEST(line_profiler, peak_seq_is_the_number_another_hook_reads) {
  struct numbers final : hooks::hook {
    std::vector<std::uint64_t> malloc_seqs;  // one thread
    void on_event(const hooks::event& e) noexcept override { malloc_seqs.push_back(e.seq); }
    [[nodiscard]] hooks::event_filter interests() const noexcept override {
      return hooks::event_filter{}.add(hooks::event_kind::pool_malloc, hooks::event_phase::post);
    }
  };
  pool::host_resource host;
  pool::naive_allocator alloc{host};
  const auto script = [&alloc] {
    void* a = alloc.allocate({}, 100);  // [100]
    void* b = alloc.allocate({}, 200);  // [300]: the peak
    alloc.deallocate({}, a, 100);       // [200]
    void* c = alloc.allocate({}, 50);   // [250]
    alloc.deallocate({}, b, 200);
    alloc.deallocate({}, c, 50);
  };
  line_profiler alone;
  EXPECT_FALSE(alone.wants_sequence());
  {
    hooks::scoped_hook on{alone};
    script();
  }
  EXPECT_EQ(alone.report({.symbolize = false}).peak_live, 300u);
  EXPECT_EQ(alone.report({.symbolize = false}).peak_seq, 0u);

  numbers seen;
  line_profiler beside;
  {
    hooks::scoped_hook on_numbers{seen};
    hooks::scoped_hook on_profiler{beside};
    script();
  }
  ASSERT_EQ(seen.malloc_seqs.size(), 3u);
  EXPECT_NE(seen.malloc_seqs[1], 0u);
  const line_profile r = beside.report({.symbolize = false});
  EXPECT_EQ(r.peak_live, 300u);
  EXPECT_EQ(r.peak_seq, seen.malloc_seqs[1]);  // b's malloc
}

TEST(line_profiler, random_allocations_keep_exact_live_figures) {
  // Thousands of live blocks, freed in random order: the pointer tables grow and shrink.
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  pool::host_resource host;
  pool::naive_allocator alloc{host};  // every block is also an upstream segment
  line_profiler prof;
  std::vector<std::pair<void*, std::size_t>> live;
  std::uint64_t live_bytes = 0;
  std::uint64_t peak = 0;
  std::uint64_t total = 0;
  {
    hooks::scoped_hook on{prof};
    for (int i = 0; i < 20000; ++i) {
      if (live.empty() || (live.size() < 5000 && rng() % 100 < 60)) {
        const std::size_t n = 1 + rng() % 4096;
        live.emplace_back(site_a(alloc, n), n);
        live_bytes += n;
        total += n;
        peak = std::max(peak, live_bytes);
      } else {
        const std::size_t k = rng() % live.size();
        alloc.deallocate({}, live[k].first, live[k].second);
        live_bytes -= live[k].second;
        live[k] = live.back();
        live.pop_back();
      }
    }
    const line_profile r = prof.report({.symbolize = false});
    EXPECT_EQ(r.root.total.live, live_bytes);
    EXPECT_EQ(r.root.total.used, total);
    EXPECT_EQ(r.root.total.freed, total - live_bytes);
    EXPECT_EQ(r.root.total.live_acquired, live_bytes);  // naive: segment == block
    EXPECT_EQ(r.peak_live, peak);
    EXPECT_EQ(r.root.total.live_at_peak, peak);
    EXPECT_EQ(r.unmatched_frees, 0u);
    for (auto [p, n] : live) {
      alloc.deallocate({}, p, n);
    }
  }
  const line_profile r = prof.report({.symbolize = false});
  EXPECT_EQ(r.root.total.live, 0u);
  EXPECT_EQ(r.root.total.live_acquired, 0u);
  EXPECT_EQ(r.unmatched_frees, 0u);
}

TEST(line_profiler, granules_unmapped_in_part_or_across_maps_match_what_was_mapped) {
  // bfc over host_vmm with 64 KiB granules and the eager unmap policy: a block maps the granules it
  // touches (one map call), a free unmaps those no live block touches any more, which may be
  // part of one map (its neighbours keep the shared granules) or span several maps. The
  // profile's live acquired bytes must follow the pool's mapped bytes throughout.
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  pool::host_vmm_resource vm{
      {.address_range_bytes = std::size_t{1} << 30, .granule_bytes = std::size_t{64} << 10}};
  pool::bfc_allocator alloc{vm,
                            {.unmap_high_fraction = 0.0,
                             .unmap_low_fraction = 0.0,
                             .unmap_window_frees = 0,
                             .keep_mapped_granules = 0}};
  line_profiler prof;
  std::vector<std::pair<void*, std::size_t>> live;
  {
    hooks::scoped_hook on{prof};
    // A scripted case first: three neighbours in one granule run, the middle one large.
    void* left = site_a(alloc, 40 << 10);
    void* middle = site_b(alloc, 300 << 10);
    void* right = site_c(alloc, 40 << 10);
    alloc.deallocate({}, middle, 300 << 10);  // unmaps the middle of what was mapped
    alloc.deallocate({}, left, 40 << 10);
    alloc.deallocate({}, right, 40 << 10);  // unmaps what is left, across the maps
    for (int i = 0; i < 4000; ++i) {
      if (live.empty() || (live.size() < 300 && rng() % 100 < 55)) {
        const std::size_t base = std::size_t{1} << (8 + rng() % 13);
        const std::size_t n = base + rng() % base;
        live.emplace_back(site_a(alloc, n), n);
      } else {
        const std::size_t k = rng() % live.size();
        alloc.deallocate({}, live[k].first, live[k].second);
        live[k] = live.back();
        live.pop_back();
      }
      if (i % 1000 == 999) {
        const line_profile r = prof.report({.symbolize = false});
        const pool::allocator_stats st = alloc.stats();
        EXPECT_EQ(r.root.total.live_acquired, st.reserved);
        EXPECT_EQ(r.root.total.acquire_count, st.maps);
        EXPECT_EQ(r.unmatched_frees, 0u);
      }
    }
    for (auto [p, n] : live) {
      alloc.deallocate({}, p, n);
    }
    (void)alloc.release_cached();
  }
  const pool::allocator_stats st = alloc.stats();
  ASSERT_GT(st.unmaps, 0u);
  const line_profile r = prof.report({.symbolize = false});
  EXPECT_EQ(r.root.total.live_acquired, st.reserved);
  EXPECT_EQ(r.root.total.acquire_count, st.maps);
  EXPECT_EQ(r.unmatched_frees, 0u);
}

TEST(line_profiler, frees_of_blocks_allocated_before_installation_are_unmatched) {
  pool::host_resource host;
  pool::best_fit_allocator alloc{host};  // its free only caches: one pool_free event
  void* early = alloc.allocate({}, 256);
  line_profiler prof;
  {
    hooks::scoped_hook on{prof};
    alloc.deallocate({}, early, 256);
  }
  const line_profile r = prof.report({.symbolize = false});
  EXPECT_EQ(r.unmatched_frees, 1u);
  EXPECT_EQ(r.root.total.count, 0u);
  EXPECT_EQ(r.root.total.freed, 0u);
}

TEST(line_profiler, only_allocator_filters_events) {
  pool::host_resource host;
  pool::naive_allocator watched{host};
  pool::naive_allocator other{host};
  line_profiler prof{{.only_allocator = watched.id()}};
  {
    hooks::scoped_hook on{prof};
    void* p = site_a(watched, 10);
    void* q = site_a(other, 20);
    watched.deallocate({}, p, 10);
    other.deallocate({}, q, 20);
  }
  const line_profile r = prof.report({.symbolize = false});
  EXPECT_EQ(r.root.total.count, 1u);
  EXPECT_EQ(r.root.total.used, 10u);
}

TEST(line_profiler, max_depth_cuts_stacks_and_counts_them) {
  pool::host_resource host;
  pool::naive_allocator alloc{host};
  line_profiler prof{{.max_depth = 2}};
  {
    hooks::scoped_hook on{prof};
    void* p = site_a(alloc, 10);
    alloc.deallocate({}, p, 10);
  }
  const line_profile r = prof.report({.symbolize = false});
  EXPECT_EQ(r.truncated_stacks, 2u);  // the malloc and naive's upstream acquisition
  EXPECT_EQ(r.max_depth, 2u);
  std::vector<std::pair<const profile_node*, int>> all;
  flatten(r.root, 0, all);
  for (auto [n, d] : all) {
    EXPECT_LE(d, 2);
  }
  // Each cut stack keeps at most max_depth nodes; the two share theirs when the compiler inlined
  // the allocator's calls alike (an optimized build), not otherwise (a sanitizer build at -Og).
  EXPECT_GE(prof.node_count(), 2u);
  EXPECT_LE(prof.node_count(), r.truncated_stacks * r.max_depth);
}

TEST(line_profiler, reset_forgets_everything) {
  pool::host_resource host;
  pool::best_fit_allocator alloc{host};
  line_profiler prof;
  hooks::scoped_hook on{prof};
  void* p = site_a(alloc, 10);
  prof.reset();
  EXPECT_EQ(prof.node_count(), 0u);
  alloc.deallocate({}, p, 10);
  const line_profile r = prof.report({.symbolize = false});
  EXPECT_EQ(r.root.total.count, 0u);
  EXPECT_EQ(r.unmatched_frees, 1u);
  EXPECT_TRUE(prof.enabled());
  // The same call site again: a new tree, the site counted once (nothing of the old tree, such
  // as a leaf index remembered for this stack, is used).
  void* q = site_a(alloc, 20);
  const line_profile again = prof.report({.symbolize = false});
  EXPECT_EQ(again.root.total.count, 1u);
  EXPECT_EQ(again.root.total.used, 20u);
  EXPECT_GT(prof.node_count(), 0u);
  alloc.deallocate({}, q, 20);
  EXPECT_EQ(prof.report({.symbolize = false}).root.total.live, 0u);
}

// Two profilers installed at once whose trees were built in different orders, then the same
// sites in turn: each profiler's leaves hold their own sites' figures (nothing learnt for one
// stack in one tree, such as its leaf index, is used in the other).
TEST(line_profiler, two_profilers_at_once_keep_their_own_leaves) {
  pool::host_resource host;
  pool::best_fit_allocator alloc{host};
  line_profiler first;
  line_profiler second;
  hooks::scoped_hook on_first{first};
  // first's tree starts with a stack through site_b (from this line, so a leaf of its own).
  alloc.deallocate({}, site_b(alloc, 30), 30);
  hooks::scoped_hook on_second{second};
  for (int i = 0; i < 50; ++i) {
    alloc.deallocate({}, site_a(alloc, 10), 10);
    alloc.deallocate({}, site_b(alloc, 30), 30);
  }
  // (calls, used) of every node where stacks end, in increasing order.
  const auto leaves = [](const line_profile& p) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    std::vector<const profile_node*> todo{&p.root};
    while (!todo.empty()) {
      const profile_node* n = todo.back();
      todo.pop_back();
      if (n->self.count > 0) {
        out.emplace_back(n->self.count, n->self.used);
      }
      for (const auto& c : n->children) {
        todo.push_back(&c);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  using figures = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
  EXPECT_EQ(leaves(first.report({.symbolize = false})), (figures{{1, 30}, {50, 500}, {50, 1500}}));
  EXPECT_EQ(leaves(second.report({.symbolize = false})), (figures{{50, 500}, {50, 1500}}));
  EXPECT_EQ(first.report({.symbolize = false}).root.total.live, 0u);
  EXPECT_EQ(second.report({.symbolize = false}).unmatched_frees, 0u);
}

TEST(line_profiler, rejects_bad_options) {
  EXPECT_THROW(line_profiler({.max_depth = 0}), invalid_argument);
  EXPECT_THROW(line_profiler({.max_depth = 10000}), invalid_argument);
  if (!unwinder_available(stack_unwinder::libunwind)) {
    EXPECT_THROW(line_profiler({.unwinder = stack_unwinder::libunwind}), invalid_argument);
  }
}

// The message of the invalid_argument `make` throws ("" if it throws none).
template <class F>
std::string refusal(F make) {
  try {
    make();
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return {};
}

TEST(line_profiler, skip_modules_of_takes_only_shared_objects_and_at_most_eight) {
  const void* in_libc = reinterpret_cast<const void*>(&::strlen);
  EXPECT_NO_THROW(line_profiler({.skip_modules_of = {in_libc}}));
  // This test's executable: its frames are the application's, an address range cannot tell.
  const std::string main_exe =
      refusal([] { line_profiler({.skip_modules_of = {reinterpret_cast<const void*>(&site_a)}}); });
  EXPECT_NE(main_exe.find("skip_modules_of[0]"), std::string::npos) << main_exe;
  EXPECT_NE(main_exe.find("skip_frames"), std::string::npos) << main_exe;
  const std::string null = refusal([&] { line_profiler({.skip_modules_of = {in_libc, nullptr}}); });
  EXPECT_NE(null.find("skip_modules_of[1]"), std::string::npos) << null;
  const std::string nine =
      refusal([&] { line_profiler({.skip_modules_of = std::vector<const void*>(9, in_libc)}); });
  EXPECT_NE(nine.find("holds 9 addresses; at most 8"), std::string::npos) << nine;
}

TEST(line_profiler, report_names_the_known_call_sites) {
  pool::host_resource host;
  pool::naive_allocator alloc{host};
  line_profiler prof;
  {
    hooks::scoped_hook on{prof};
    void* a = site_a(alloc, 1 << 20);
    void* b = site_b(alloc, 3 << 20);
    alloc.deallocate({}, a, 1 << 20);
    alloc.deallocate({}, b, 3 << 20);
  }
  const line_profile r = prof.report();
  const std::string text = r.to_text();
  const std::string json = r.to_json();
  if (r.symbolizer != "libdw") {
    // dladdr sees only exported symbols; the test executable exports none of its functions, so
    // frames come out as module+offset. Check that, and that nothing is lost.
    EXPECT_NE(text.find("+0x"), std::string::npos) << text;
    EXPECT_EQ(r.root.total.used, 4u << 20);
    GTEST_SKIP() << "symbolizer is " << r.symbolizer << ": function names need libdw";
  }
  EXPECT_NE(text.find("site_a"), std::string::npos) << text;
  EXPECT_NE(text.find("site_b"), std::string::npos) << text;
  EXPECT_NE(text.find("line_profiler_test.cpp:"), std::string::npos) << text;
  EXPECT_NE(json.find("site_a"), std::string::npos);
  const profile_node* a = node_with_self_used(r, 1 << 20);
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a->function.find("site_a"), std::string::npos) << a->function;
  EXPECT_NE(a->file.find("line_profiler_test.cpp"), std::string::npos) << a->file;
  EXPECT_GT(a->line, 0);
  // poolscope's own frames are gone: the innermost frame is the call inside site_a.
  EXPECT_EQ(text.find("poolscope::pool::allocator::allocate"), std::string::npos) << text;
  // The site with more bytes is listed first among siblings.
  EXPECT_LT(text.find("site_b"), text.find("site_a")) << text;
}

}  // namespace
}  // namespace poolscope::profiler
