// bfc over a virtual resource (bfc_allocator.hpp, "Over a virtual resource"), on the CPU through
// host_vmm_resource: the physical mapping follows live bytes, every live byte is mapped, no
// unmapped granule is handed out, the hysteresis, the events, out of memory (a mapping budget and
// a real ENOMEM), and a randomized stress. The expected mapping is computed here from the live
// blocks (the union of the granules they touch), independently of the allocator's books; the
// resource's own view (is_mapped, mapped_bytes) and touching the memory check the rest.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hooks/recording_hook.hpp"
#include "pool/model.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_vmm_resource.hpp"

namespace poolscope::pool::testing {
namespace {

using hooks::event_kind;
using hooks::event_phase;
using poolscope::testing::recording_hook;

constexpr std::size_t granule = std::size_t{64} << 10;

host_vmm_options small_options(std::size_t capacity = SIZE_MAX) {
  return {
      .address_range_bytes = std::size_t{1} << 30, .granule_bytes = granule, .capacity = capacity};
}

bfc_options no_hysteresis() {
  bfc_options o;
  o.unmap_high_fraction = 0.0;
  o.unmap_low_fraction = 0.0;
  o.unmap_window_frees = 0;
  o.keep_mapped_granules = 0;
  return o;
}

/// The live blocks and what they imply: the granules they touch.
class live_blocks {
 public:
  explicit live_blocks(std::size_t g) : granule_(g) {}
  void add(void* p, std::size_t bytes) {
    ASSERT_TRUE(ranges_.insert(p, bytes)) << "a block overlaps a live one";
    blocks_[p] = bytes;
  }
  std::size_t remove(void* p) {
    const std::size_t bytes = blocks_.at(p);
    blocks_.erase(p);
    ranges_.erase(p);
    return bytes;
  }
  /// Bytes of the granules the live blocks touch, at their 512-byte rounded sizes (bfc's chunks).
  [[nodiscard]] std::size_t touched_bytes() const {
    std::set<std::uintptr_t> granules;
    for (const auto& [p, bytes] : blocks_) {
      const auto a = reinterpret_cast<std::uintptr_t>(p);
      const std::size_t rounded = (bytes + 511) / 512 * 512;
      for (std::uintptr_t g = a / granule_; g <= (a + rounded - 1) / granule_; ++g) {
        granules.insert(g);
      }
    }
    return granules.size() * granule_;
  }
  /// Checks that every granule of every live block is mapped, as the resource sees it, and
  /// writable (the first and last byte of each granule are written and read back).
  void expect_mapped(const virtual_resource& r) const {
    for (const auto& [p, bytes] : blocks_) {
      auto* c = static_cast<unsigned char*>(p);
      for (std::size_t off = 0; off < bytes; off += granule_) {
        ASSERT_TRUE(r.is_mapped(c + off)) << "live byte " << off << " of a block is unmapped";
      }
      ASSERT_TRUE(r.is_mapped(c + bytes - 1));
      c[0] = 0x11;
      ASSERT_EQ(c[0], 0x11);
      c[bytes - 1] = 0x22;
      ASSERT_EQ(c[bytes - 1], 0x22);
    }
  }
  [[nodiscard]] const std::map<void*, std::size_t>& all() const { return blocks_; }

 private:
  std::size_t granule_;
  interval_set ranges_;
  std::map<void*, std::size_t> blocks_;
};

TEST(bfc_over_host_vmm, the_mapping_follows_live_bytes) {
  host_vmm_resource r{small_options()};
  bfc_allocator a{r, no_hysteresis()};
  live_blocks live{granule};
  std::vector<void*> order;
  for (const std::size_t bytes : {std::size_t{1000}, std::size_t{200} << 10, std::size_t{3} << 20,
                                  std::size_t{5} << 20, std::size_t{70000}, std::size_t{512}}) {
    void* p = a.allocate({}, bytes);
    live.add(p, bytes);
    order.push_back(p);
    live.expect_mapped(r);
    EXPECT_EQ(a.stats().reserved, live.touched_bytes()) << "after allocating " << bytes;
    EXPECT_EQ(r.mapped_bytes(), live.touched_bytes());
  }
  // Free every other block: the granules no live block touches go back at once.
  for (std::size_t i = 0; i < order.size(); i += 2) {
    a.deallocate({}, order[i], live.remove(order[i]));
    EXPECT_EQ(a.stats().reserved, live.touched_bytes()) << "after free " << i;
    live.expect_mapped(r);
  }
  const allocator_stats s = a.stats();
  EXPECT_EQ(s.reserved, r.mapped_bytes());
  EXPECT_GE(s.virtual_bytes, s.reserved) << "segments hold at least what is mapped";
  EXPECT_EQ(s.mapped_free_bytes, 0U) << "no hysteresis";
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);
  EXPECT_GT(s.maps, 0U);
  EXPECT_GT(s.unmaps, 0U);
  EXPECT_EQ(a.check_invariants(), "");
  for (std::size_t i = 1; i < order.size(); i += 2) {
    a.deallocate({}, order[i], live.remove(order[i]));
  }
  EXPECT_EQ(a.stats().reserved, 0U);
  EXPECT_EQ(r.mapped_bytes(), 0U);
  EXPECT_GT(a.stats().virtual_bytes, 0U) << "the address ranges stay until release_cached";
  EXPECT_EQ(a.release_cached(), 0U) << "nothing mapped to release";
  EXPECT_EQ(a.stats().virtual_bytes, 0U);
  EXPECT_EQ(r.counts().address_bytes, 0U);
}

TEST(bfc_over_host_vmm, the_large_pool_grows_in_place_as_one_range) {
  host_vmm_resource r{small_options()};
  bfc_allocator a{r, no_hysteresis()};
  void* x = a.allocate({}, std::size_t{12} << 20);
  void* y = a.allocate({}, std::size_t{30} << 20);  // no fit: the segment grows
  void* z = a.allocate({}, std::size_t{3} << 20);
  std::vector<bfc_segment_info> segs = a.segments();
  ASSERT_EQ(segs.size(), 1U) << "three large requests, one range";
  EXPECT_GE(segs[0].bytes, std::size_t{45} << 20);
  EXPECT_EQ(static_cast<char*>(y), static_cast<char*>(x) + (std::size_t{12} << 20));
  EXPECT_EQ(a.check_invariants(), "");
  // Freed, x and y merge with each other across what used to be the segment's end.
  a.deallocate({}, x, std::size_t{12} << 20);
  a.deallocate({}, y, std::size_t{30} << 20);
  void* w = a.allocate({}, std::size_t{40} << 20);
  EXPECT_EQ(w, x) << "the 42 MiB freed in front of z serve a 40 MiB request";
  EXPECT_EQ(a.segments().size(), 1U);
  EXPECT_EQ(a.stats().reserved, (std::size_t{43} << 20)) << "40 + 3 MiB live, all of it mapped";
  a.deallocate({}, w, std::size_t{40} << 20);
  a.deallocate({}, z, std::size_t{3} << 20);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(bfc_over_host_vmm, a_cached_pair_maps_nothing_within_the_hysteresis) {
  host_vmm_resource r{small_options()};
  bfc_options o;
  o.keep_mapped_granules = 64;  // 4 MiB
  bfc_allocator a{r, o};
  void* first = a.allocate({}, std::size_t{1} << 20);
  a.deallocate({}, first, std::size_t{1} << 20);
  const allocator_stats warm = a.stats();
  EXPECT_EQ(warm.mapped_free_bytes, std::size_t{1} << 20) << "kept mapped";
  EXPECT_EQ(warm.reserved, std::size_t{1} << 20);
  for (int i = 0; i < 1000; ++i) {
    void* p = a.allocate({}, std::size_t{1} << 20);
    a.deallocate({}, p, std::size_t{1} << 20);
  }
  const allocator_stats after = a.stats();
  EXPECT_EQ(after.maps, warm.maps);
  EXPECT_EQ(after.unmaps, warm.unmaps);
  EXPECT_EQ(a.release_cached(), std::size_t{1} << 20) << "release_cached unmaps the kept granules";
  EXPECT_EQ(a.stats().reserved, 0U);
  EXPECT_EQ(a.stats().mapped_free_bytes, 0U);
}

// The unmap policy over a scripted sequence, against its counts worked out by hand (64 KiB
// granules; marks at 1/2 and 1/4 over the reference; buckets of 4 frees): a step that returns
// to its level maps nothing again, and once the level drops for two buckets the free granules go
// in one batch, the top of the free chunk first, down to the low mark.
TEST(bfc_over_host_vmm, the_unmap_policy_keeps_a_level_and_gives_back_a_drop_in_one_batch) {
  host_vmm_resource r{small_options()};
  bfc_options o;
  o.unmap_high_fraction = 0.5;
  o.unmap_low_fraction = 0.25;
  o.unmap_window_frees = 4;
  o.keep_mapped_granules = 0;
  bfc_allocator a{r, o};
  constexpr std::size_t quarter = std::size_t{256} << 10;  // 4 granules
  const auto step = [&] {
    std::array<void*, 4> p{};
    for (void*& q : p) {
      q = a.allocate({}, quarter);  // carved in turn from the bottom of one small segment
    }
    for (void* q : p) {
      a.deallocate({}, q, quarter);
    }
    return p[0];
  };
  void* const base = step();
  allocator_stats s = a.stats();
  EXPECT_EQ(s.maps, 4U) << "one map per chunk: each touches 4 granules of its own";
  EXPECT_EQ(s.unmaps, 0U) << "1 MiB mapped, within the high mark of 1.5 MiB";
  EXPECT_EQ(s.reserved, std::size_t{1} << 20);
  EXPECT_EQ(s.mapped_free_bytes, std::size_t{1} << 20);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(step(), base) << "the same addresses each step";
  }
  s = a.stats();
  EXPECT_EQ(s.maps, 4U) << "a step at the same level maps nothing";
  EXPECT_EQ(s.unmaps, 0U);
  EXPECT_EQ(a.check_invariants(), "");

  // The level drops to one granule: the bucket that saw the 1 MiB steps ends with the 4th free of
  // these, and the reference becomes 64 KiB (high mark 96 KiB, low mark 80 KiB).
  constexpr std::size_t one = std::size_t{64} << 10;
  for (int i = 0; i < 3; ++i) {
    void* x = a.allocate({}, one);
    EXPECT_EQ(x, base);
    a.deallocate({}, x, one);
    EXPECT_EQ(a.stats().unmaps, 0U) << "free " << i + 1 << " of the bucket";
  }
  void* x = a.allocate({}, one);
  a.deallocate({}, x, one);
  s = a.stats();
  EXPECT_EQ(s.maps, 4U);
  EXPECT_EQ(s.unmaps, 1U) << "granules 1-15 in one run, down to the low mark";
  EXPECT_EQ(s.reserved, one) << "the bottom granule stays, where the next chunk is carved";
  EXPECT_TRUE(r.is_mapped(base));
  EXPECT_FALSE(r.is_mapped(static_cast<char*>(base) + one));
  EXPECT_EQ(a.check_invariants(), "");
  EXPECT_EQ(a.release_cached(), one);
  s = a.stats();
  EXPECT_EQ(s.unmaps, 2U);
  EXPECT_EQ(s.reserved, 0U);
  EXPECT_EQ(s.mapped_free_bytes, 0U) << "release_cached leaves nothing free mapped";
}

TEST(bfc_over_host_vmm, map_and_unmap_events_sum_to_reserved) {
  host_vmm_resource r{small_options()};
  bfc_allocator a{r, no_hysteresis()};
  recording_hook rec{a.id()};
  std::vector<std::pair<void*, std::size_t>> blocks;
  {
    hooks::scoped_hook on{rec, hooks::scope::thread};
    for (const std::size_t bytes : {std::size_t{3000}, std::size_t{2} << 20, std::size_t{300000}}) {
      blocks.emplace_back(a.allocate({}, bytes), bytes);
    }
    a.deallocate({}, blocks[1].first, blocks[1].second);
  }
  std::size_t mapped = 0;
  std::size_t maps = 0;
  std::size_t unmaps = 0;
  for (const auto& r_event : rec.events()) {
    const hooks::event& e = r_event.e;
    if (e.kind == event_kind::segment_map && e.phase == event_phase::post) {
      mapped += e.rounded;
      ++maps;
      EXPECT_EQ(e.reserved, mapped) << "the event carries reserved after the map";
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(e.ptr) % granule, 0U) << "whole granules";
      EXPECT_EQ(e.rounded % granule, 0U);
    } else if (e.kind == event_kind::segment_unmap && e.phase == event_phase::post) {
      mapped -= e.rounded;
      ++unmaps;
      EXPECT_EQ(e.reserved, mapped);
    } else if (e.kind == event_kind::device_alloc) {
      ADD_FAILURE() << "an address range is no device_alloc: reserved counts mapped bytes";
    }
  }
  const allocator_stats s = a.stats();
  EXPECT_EQ(mapped, s.reserved);
  EXPECT_EQ(maps, s.maps);
  EXPECT_EQ(unmaps, s.unmaps);
  EXPECT_GT(unmaps, 0U);
  a.deallocate({}, blocks[0].first, blocks[0].second);
  a.deallocate({}, blocks[2].first, blocks[2].second);
}

TEST(bfc_over_host_vmm, out_of_memory_releases_the_kept_granules_and_retries_once) {
  // A budget of 2.5 MiB of mappings. A freed 1 MiB block stays mapped (hysteresis), so a 2 MiB
  // request fits only once the pool has released it: the retry does that.
  host_vmm_resource r{small_options(std::size_t{5} << 19)};
  bfc_options o;
  o.keep_mapped_granules = 1024;  // 64 MiB
  bfc_allocator a{r, o};
  recording_hook rec{a.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  void* x = a.allocate({}, std::size_t{1} << 20);
  a.deallocate({}, x, std::size_t{1} << 20);
  ASSERT_EQ(a.stats().mapped_free_bytes, std::size_t{1} << 20);
  void* y = a.allocate({}, std::size_t{2} << 20);
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(rec.of(event_kind::release, event_phase::post).size(), 1U) << "one flush";
  EXPECT_EQ(a.stats().reserved, std::size_t{2} << 20);
  EXPECT_EQ(a.stats().oom_count, 0U);

  // Now nothing is left to release: the same explaining out_of_memory as over any resource.
  try {
    (void)a.allocate({}, std::size_t{1} << 20);
    ADD_FAILURE() << "a request past the budget succeeded";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.requested(), std::size_t{1} << 20);
    EXPECT_EQ(e.context().reserved, std::size_t{2} << 20) << "reserved is what is mapped";
    EXPECT_EQ(e.context().in_use, std::size_t{2} << 20);
    EXPECT_NE(std::string(e.what()).find("upstream exhausted"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.stats().oom_count, 1U);
  EXPECT_EQ(a.check_invariants(), "");
  // The pool stays usable.
  a.deallocate({}, y, std::size_t{2} << 20);
  void* z = a.allocate({}, std::size_t{1} << 20);
  EXPECT_TRUE(r.is_mapped(z));
  a.deallocate({}, z, std::size_t{1} << 20);
  EXPECT_EQ(a.check_invariants(), "");
}

TEST(bfc_over_host_vmm, unmap_fractions_outside_their_range_are_named) {
  host_vmm_resource r{small_options()};
  struct bad_case {
    double high, low;
    const char* field;
    double value;
  };
  for (const bad_case& c : {bad_case{-0.5, 0.0, "unmap_high_fraction", -0.5},
                            bad_case{1.5, 0.0, "unmap_high_fraction", 1.5},
                            bad_case{0.25, -0.5, "unmap_low_fraction", -0.5},
                            bad_case{0.25, 0.5, "unmap_low_fraction", 0.5}}) {
    bfc_options o;
    o.unmap_high_fraction = c.high;
    o.unmap_low_fraction = c.low;
    try {
      bfc_allocator a{r, o};
      ADD_FAILURE() << c.field << " " << c.value << " was accepted";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(c.field) + " = " + std::to_string(c.value)),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(bfc_over_host_vmm, a_limit_caps_the_bytes_mapped) {
  host_vmm_resource r{small_options()};
  bfc_allocator a{r, no_hysteresis()};
  a.set_limit(std::size_t{3} << 20);
  void* p = a.allocate({}, std::size_t{2} << 20);
  EXPECT_THROW((void)a.allocate({}, std::size_t{2} << 20), out_of_memory);
  EXPECT_LE(a.stats().peak_reserved, std::size_t{3} << 20);
  EXPECT_GE(a.stats().limit_hits, 1U);
  a.deallocate({}, p, std::size_t{2} << 20);
}

/// VmData of this process (bytes), which RLIMIT_DATA bounds.
std::size_t data_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmData:", 0) == 0) {
      return std::stoull(line.substr(7)) << 10;
    }
  }
  return 0;
}

/// The child of the ENOMEM test: fills a pool until the system refuses a mapping, then checks
/// that the refusal was the usual out_of_memory and that the pool goes on. Exits 0 on success.
[[noreturn]] void fill_until_enomem() {
  host_vmm_resource r{{.address_range_bytes = std::size_t{1} << 30}};  // 2 MiB granules
  bfc_allocator a{r, no_hysteresis()};
  const rlimit lim{data_bytes() + (std::size_t{32} << 20), RLIM_INFINITY};
  if (setrlimit(RLIMIT_DATA, &lim) != 0) {
    std::exit(3);
  }
  constexpr std::size_t block = std::size_t{2} << 20;
  std::vector<void*> blocks;
  bool refused = false;
  for (int i = 0; i < 64 && !refused; ++i) {
    try {
      blocks.push_back(a.allocate({}, block));
    } catch (const out_of_memory& e) {
      refused = std::string(e.what()).find("upstream exhausted") != std::string::npos;
    }
  }
  if (!refused || blocks.empty() || a.stats().reserved != blocks.size() * block) {
    std::exit(4);
  }
  a.deallocate({}, blocks.back(), block);
  void* again = a.allocate({}, block);
  std::memset(again, 1, block);
  std::exit(a.check_invariants().empty() ? 0 : 5);
}

TEST(bfc_over_host_vmm, enomem_from_the_system_is_out_of_memory_and_the_pool_stays_usable) {
  // In a child process: RLIMIT_DATA bounds writable private mappings, so mprotect fails with
  // ENOMEM once the pool has mapped 32 MiB more than the process held.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's runtime maps its own memory under the child's RLIMIT_DATA";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(fill_until_enomem(), ::testing::ExitedWithCode(0), "");
}

/// The unmap policy's high mark for a reference of `ref` live bytes (bfc_options).
std::size_t high_mark(const bfc_options& o, std::size_t ref) {
  return ref + std::max(o.keep_mapped_granules * granule,
                        static_cast<std::size_t>(static_cast<double>(ref) * o.unmap_high_fraction));
}

void random_operations_keep_every_live_byte_mapped(const bfc_options& options) {
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = env_count("POOLSCOPE_STRESS_OPS", under_sanitizer ? 3'000 : 30'000);
  std::mt19937_64 rng(seed);
  host_vmm_resource r{small_options()};
  bfc_allocator a{r, options};
  live_blocks live{granule};
  std::vector<void*> order;
  const auto rounded = [](std::size_t bytes) { return (bytes + 511) / 512 * 512; };
  std::size_t live_rounded = 0;  // bfc's live chunk bytes, and their peak
  std::size_t peak_rounded = 0;
  for (std::uint64_t op = 0; op < ops; ++op) {
    const bool alloc = order.empty() || (order.size() < 300 && rng() % 2 == 0);
    if (alloc) {
      const std::size_t bytes = log_uniform(rng, 1, std::size_t{8} << 20);
      void* p = a.allocate({}, bytes);
      live.add(p, bytes);
      order.push_back(p);
      live_rounded += rounded(bytes);
      peak_rounded = std::max(peak_rounded, live_rounded);
    } else {
      const std::size_t i = rng() % order.size();
      void* p = order[i];
      order[i] = order.back();
      order.pop_back();
      const std::size_t bytes = live.remove(p);
      a.deallocate({}, p, bytes);
      live_rounded -= rounded(bytes);
    }
    if (op % 997 == 0) {
      a.release_cached();
    }
    if (op % 101 == 0 || op + 1 == ops) {
      live.expect_mapped(r);
      const allocator_stats s = a.stats();
      const std::size_t touched = live.touched_bytes();
      ASSERT_EQ(s.reserved, touched + s.mapped_free_bytes)
          << "op " << op << ": mapped is not the live granules and those kept";
      // The policy's reference is at most the peak of the live chunks' bytes (the live bytes
      // now without a window), so free granules stay mapped only below this high mark.
      const std::size_t ref = options.unmap_window_frees == 0 ? live_rounded : peak_rounded;
      if (s.mapped_free_bytes != 0) {
        ASSERT_LE(s.reserved, high_mark(options, ref))
            << "op " << op << ": free granules kept mapped past the high mark";
      }
      ASSERT_EQ(s.reserved, r.mapped_bytes()) << "op " << op;
      ASSERT_EQ(s.in_use + s.cached_bytes, s.reserved) << "op " << op;
      ASSERT_EQ(a.check_invariants(), "") << "op " << op;
    }
  }
  for (void* p : order) {
    a.deallocate({}, p, live.remove(p));
  }
  a.release_cached();
  EXPECT_EQ(a.stats().reserved, 0U);
  EXPECT_EQ(r.mapped_bytes(), 0U);
}

TEST(bfc_over_host_vmm, random_operations_keep_every_live_byte_mapped) {
  random_operations_keep_every_live_byte_mapped(bfc_options{});
}

TEST(bfc_over_host_vmm, random_operations_keep_every_live_byte_mapped_without_hysteresis) {
  random_operations_keep_every_live_byte_mapped(no_hysteresis());
}

// ---- the mapped fit (bfc_options::mapped_fit_candidates) -------------------------------------

constexpr std::size_t MiB = std::size_t{1} << 20;

/// Counts the bytes one allocator maps (its segment_map events). Install it with scope::thread.
class mapped_bytes_hook final : public hooks::hook {
 public:
  explicit mapped_bytes_hook(std::uint32_t allocator_id) : id_(allocator_id) {}
  void on_event(const hooks::event& e) noexcept override {
    mapped_ += e.allocator_id == id_ ? e.rounded : 0;
  }
  [[nodiscard]] hooks::event_filter interests() const noexcept override {
    return hooks::event_filter{}.add(event_kind::segment_map, event_phase::post);
  }
  [[nodiscard]] std::size_t mapped() const noexcept { return mapped_; }

 private:
  std::uint32_t id_;
  std::size_t mapped_ = 0;
};

/// A pool that keeps every free granule mapped until release_cached (64 MiB of margin), with
/// the mapped fit on or off (the best fit alone).
bfc_options keeping_granules(bool mapped_fit) {
  bfc_options o;
  o.keep_mapped_granules = 1024;
  o.mapped_fit_candidates = mapped_fit ? bfc_options{}.mapped_fit_candidates : 0;
  return o;
}

/// A scripted case of the mapped fit, sizes in MiB. The blocks of `layout` are allocated in
/// turn (large requests: one range grown in place, chunk after chunk); those of `unmapped` are
/// freed and release_cached unmaps their granules; those of `kept` are freed then, their granules
/// kept mapped. Then one request of `request` MiB is made.
struct mapped_fit_case {
  const char* what;
  std::vector<std::size_t> layout;
  std::vector<std::size_t> unmapped;
  std::vector<std::size_t> kept;
  std::size_t request;
  std::size_t best_at, best_maps_mib;  ///< the plain best fit: where the request goes, MiB mapped
  std::size_t fit_at, fit_maps_mib;    ///< the mapped fit
};

/// What the request of `c` did: where it went (MiB from the first block) and the MiB it mapped.
std::pair<std::size_t, std::size_t> run_case(const mapped_fit_case& c, bool mapped_fit) {
  host_vmm_resource r{small_options()};
  bfc_allocator a{r, keeping_granules(mapped_fit)};
  std::vector<char*> blocks;
  std::size_t offset = 0;
  for (const std::size_t mib : c.layout) {
    blocks.push_back(static_cast<char*>(a.allocate({}, mib * MiB)));
    EXPECT_EQ(blocks.back(), blocks.front() + offset * MiB) << "one range, chunk after chunk";
    offset += mib;
  }
  std::size_t unmapped = 0;
  for (const std::size_t i : c.unmapped) {
    a.deallocate({}, blocks[i], c.layout[i] * MiB);
    unmapped += c.layout[i] * MiB;
  }
  EXPECT_EQ(a.release_cached(), unmapped) << "their granules unmapped; the range stays";
  for (const std::size_t i : c.kept) {
    a.deallocate({}, blocks[i], c.layout[i] * MiB);
  }
  EXPECT_EQ(a.check_invariants(), "");
  const allocator_stats before = a.stats();
  char* const p = static_cast<char*>(a.allocate({}, c.request * MiB));
  const allocator_stats after = a.stats();
  EXPECT_EQ(a.check_invariants(), "");
  EXPECT_TRUE(r.is_mapped(p) && r.is_mapped(p + c.request * MiB - 1));
  EXPECT_EQ(after.maps - before.maps, after.reserved == before.reserved ? 0U : 1U)
      << "what is mapped, in one run";
  return {static_cast<std::size_t>(p - blocks.front()) / MiB,
          (after.reserved - before.reserved) / MiB};
}

// Requests whose best fit would map, each against the plain best fit (mapped_fit_candidates 0)
// on the same layout: the mapped fit takes the place with the fewest granules to map.
TEST(bfc_over_host_vmm, the_mapped_fit_takes_the_place_with_the_fewest_granules_to_map) {
  const std::vector<mapped_fit_case> cases{
      // Free [0, 4) unmapped and [6, 11) mapped: the bottom of the larger one maps nothing.
      {"a mapped chunk instead of an unmapped best fit", {4, 2, 5, 2}, {0}, {2}, 4, 0, 4, 6, 0},
      // [4, 6) freed above the unmapped [0, 4) merges with it, its granules at the top of [0, 6);
      // the best fit [8, 11) is unmapped.
      {"the mapped top of a chunk", {4, 2, 2, 3, 2}, {0, 3}, {1}, 2, 8, 2, 4, 0},
      // No place maps nothing: the best fit [0, 3) maps 3 MiB, the bottom of [5, 9) (mapped from
      // 5 to 7) 1 MiB, 16 of its 48 granules.
      {"the fewest granules to map", {3, 2, 2, 2, 2}, {0, 3}, {2}, 3, 0, 3, 5, 1},
  };
  for (const mapped_fit_case& c : cases) {
    SCOPED_TRACE(c.what);
    const auto [best_at, best_mapped] = run_case(c, false);
    EXPECT_EQ(best_at, c.best_at);
    EXPECT_EQ(best_mapped, c.best_maps_mib);
    const auto [fit_at, fit_mapped] = run_case(c, true);
    EXPECT_EQ(fit_at, c.fit_at);
    EXPECT_EQ(fit_mapped, c.fit_maps_mib);
  }
}

/// One pool of the randomized comparison: its resource, the pool, its live blocks, and the bytes
/// it has mapped.
struct compared_pool {
  explicit compared_pool(bool mapped_fit)
      : pool(resource,
             [&] {
               bfc_options o;
               o.mapped_fit_candidates = mapped_fit ? o.mapped_fit_candidates : 0;
               return o;
             }()),
        counter(pool.id()) {}
  host_vmm_resource resource{small_options()};
  bfc_allocator pool;
  live_blocks live{granule};
  mapped_bytes_hook counter;
};

// The same random operations on two pools, the mapped fit and the best fit alone: both keep every
// invariant (no overlap, every live byte mapped, mapped = the live chunks' granules and those
// kept, the pool's own books). What each maps is printed: on random work the mapped fit maps less
// in most runs but not in every one (vmm_workload_test.cpp compares them on fixed workloads).
TEST(bfc_over_host_vmm, the_mapped_fit_keeps_the_invariants_beside_the_best_fit) {
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = env_count("POOLSCOPE_STRESS_OPS", under_sanitizer ? 3'000 : 30'000);
  std::mt19937_64 rng(seed);
  compared_pool fit{true};
  compared_pool best{false};
  hooks::scoped_hook count_fit{fit.counter, hooks::scope::thread};
  hooks::scoped_hook count_best{best.counter, hooks::scope::thread};
  std::vector<std::pair<void*, void*>> order;  // each block's address in fit, in best
  for (std::uint64_t op = 0; op < ops; ++op) {
    if (order.empty() || (order.size() < 300 && rng() % 2 == 0)) {
      const std::size_t bytes = log_uniform(rng, 1, std::size_t{8} << 20);
      order.emplace_back(fit.pool.allocate({}, bytes), best.pool.allocate({}, bytes));
      fit.live.add(order.back().first, bytes);
      best.live.add(order.back().second, bytes);
    } else {
      const std::size_t i = rng() % order.size();
      fit.pool.deallocate({}, order[i].first, fit.live.remove(order[i].first));
      best.pool.deallocate({}, order[i].second, best.live.remove(order[i].second));
      order[i] = order.back();
      order.pop_back();
    }
    if (op % 101 == 0 || op + 1 == ops) {
      for (compared_pool* c : {&fit, &best}) {
        c->live.expect_mapped(c->resource);
        const allocator_stats s = c->pool.stats();
        ASSERT_EQ(s.reserved, c->live.touched_bytes() + s.mapped_free_bytes) << "op " << op;
        ASSERT_EQ(s.reserved, c->resource.mapped_bytes()) << "op " << op;
        ASSERT_EQ(c->pool.check_invariants(), "") << "op " << op;
      }
    }
  }
  const allocator_stats f = fit.pool.stats();
  const allocator_stats b = best.pool.stats();
  std::cout << "[          ] " << ops << " operations: mapped fit " << f.maps << " maps ("
            << fit.counter.mapped() / MiB << " MiB), best fit " << b.maps << " maps ("
            << best.counter.mapped() / MiB << " MiB); peak mapped " << f.peak_reserved / MiB
            << " and " << b.peak_reserved / MiB << " MiB\n";
  for (const auto& [in_fit, in_best] : order) {
    fit.pool.deallocate({}, in_fit, fit.live.remove(in_fit));
    best.pool.deallocate({}, in_best, best.live.remove(in_best));
  }
}

// Threads share one host_vmm: bfc over it (through its thread caches and without), and the
// plain-resource face beside it. Granules are mapped and unmapped under contention; every block
// stays intact while live (its first, middle and last bytes); at the end nothing is mapped.
TEST(host_vmm_concurrency, pools_and_plain_blocks_share_one_resource) {
  constexpr int threads = 8;
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = env_count("POOLSCOPE_CONCURRENCY_OPS", under_sanitizer ? 1000 : 4000);
  host_vmm_resource r{small_options()};
  bfc_allocator bare{r, no_hysteresis()};
  auto cached = make_allocator("bfc", r);
  std::atomic<int> broken{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t));
    struct held {
      void* p;
      std::size_t bytes;
      int where;  // 0: bare pool, 1: cached pool, 2: the resource itself
    };
    std::vector<held> mine;
    const auto value = static_cast<unsigned char>(t + 1);
    const auto give_back = [&](const held& h) {
      const auto* c = static_cast<const unsigned char*>(h.p);
      if (c[0] != value || c[h.bytes - 1] != value || c[h.bytes / 2] != value) {
        broken.fetch_add(1);
      }
      if (h.where == 2) {
        r.deallocate({}, h.p, h.bytes);
      } else {
        (h.where == 0 ? static_cast<allocator&>(bare) : *cached).deallocate({}, h.p, h.bytes);
      }
    };
    for (std::uint64_t op = 0; op < ops; ++op) {
      if (mine.empty() || (mine.size() < 24 && rng() % 2 == 0)) {
        const int where = static_cast<int>(rng() % 3);
        const std::size_t bytes = log_uniform(rng, 1, where == 2 ? 256 << 10 : 4 << 20);
        void* p = where == 2   ? r.try_allocate({}, bytes)
                  : where == 0 ? bare.allocate({}, bytes)
                               : cached->allocate({}, bytes);
        if (p == nullptr) {
          broken.fetch_add(1);
          continue;
        }
        // Its first, middle and last bytes: each in a granule that must be mapped (and not
        // another thread's block).
        auto* c = static_cast<unsigned char*>(p);
        c[0] = c[bytes / 2] = c[bytes - 1] = value;
        mine.push_back({p, bytes, where});
      } else {
        const std::size_t i = rng() % mine.size();
        give_back(mine[i]);
        mine[i] = mine.back();
        mine.pop_back();
      }
    }
    for (const held& h : mine) {
      give_back(h);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(worker, t);
  }
  for (auto& th : pool) {
    th.join();
  }
  EXPECT_EQ(broken.load(), 0) << "a live block was overwritten, or an allocation failed";
  EXPECT_EQ(bare.check_invariants(), "");
  EXPECT_EQ(bare.stats().reserved, 0U) << "no hysteresis: nothing stays mapped";
  cached->release_cached();
  EXPECT_EQ(cached->stats().reserved, 0U);
  EXPECT_EQ(r.mapped_bytes(), 0U);
  EXPECT_EQ(r.allocated_bytes(), 0U);
}

}  // namespace
}  // namespace poolscope::pool::testing
