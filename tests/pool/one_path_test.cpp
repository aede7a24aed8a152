// One path (docs/design.md §2): the same strategy code runs whether or not a hook is installed, and
// a hook only adds events. For every host allocator (strategies and the thread cache around each),
// the same seeded random sequence of allocations and frees runs three times on fresh allocators:
// with no hook, with a hook that asks only for split and merge, and with a counting hook that
// asks for every event. The three runs must hand out the same blocks (each address named by the
// upstream block it lies in and its offset there, as upstream addresses differ between runs) and
// end with the same stats; the two hooked runs must see the same splits and merges, and the
// counting hook one pool_malloc and one pool_free per call.
//
// Knobs: POOLSCOPE_TEST_SEED (printed), POOLSCOPE_ONE_PATH_OPS (operations per run, default
// 4000).
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pool/allocator_types.hpp"
#include "pool/model.hpp"
#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/allocator.hpp"

namespace poolscope::pool::testing {
namespace {

using hooks::event_kind;
using hooks::event_phase;

/// A resource that remembers the blocks it handed out, in order, so that a pointer can be named
/// by (the index of the upstream block that holds it, its offset in that block).
class numbering_resource final : public resource {
 public:
  explicit numbering_resource(resource& real) : real_(&real) {}

  /// "b<index>+<offset>", or "?<address>" for a pointer in no block handed out.
  [[nodiscard]] std::string name_of(const void* p) const {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks_.upper_bound(at);
    if (it != blocks_.begin()) {
      --it;
      if (at < it->first + it->second.bytes) {
        return "b" + std::to_string(it->second.index) + "+" + std::to_string(at - it->first);
      }
    }
    return "?" + std::to_string(at);
  }

 private:
  struct upstream_block {
    std::size_t bytes = 0;
    std::size_t index = 0;
  };
  void* do_try_allocate(stream_view stream, std::size_t bytes) override {
    void* p = real_->try_allocate(stream, bytes);
    if (p != nullptr) {
      blocks_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, next_++};
    }
    return p;
  }
  void do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept override {
    blocks_.erase(reinterpret_cast<std::uintptr_t>(ptr));
    real_->deallocate(stream, ptr, bytes);
  }
  [[nodiscard]] int do_device() const noexcept override { return real_->device(); }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return real_->kind(); }
  [[nodiscard]] std::string do_name() const override { return real_->name(); }

  resource* real_;
  std::map<std::uintptr_t, upstream_block> blocks_;
  std::size_t next_ = 0;
};

/// Counts the split and merge events of one allocator, and asks for nothing else.
class split_merge_hook final : public hooks::hook {
 public:
  explicit split_merge_hook(std::uint32_t id) : id_(id) {}
  [[nodiscard]] hooks::event_filter interests() const noexcept override {
    return hooks::event_filter{}
        .add(event_kind::split, event_phase::instant)
        .add(event_kind::merge, event_phase::instant);
  }
  void on_event(const hooks::event& e) noexcept override {
    if (e.allocator_id != id_) {
      return;
    }
    splits += e.kind == event_kind::split ? 1 : 0;
    merges += e.kind == event_kind::merge ? 1 : 0;
  }
  std::uint64_t splits = 0;
  std::uint64_t merges = 0;

 private:
  std::uint32_t id_;
};

enum class run_with { no_hook, split_merge_hook, counting_hook };

/// What one run saw.
struct run_result {
  std::vector<std::string> blocks;  // every block handed out, named by numbering_resource
  std::string stats;                // the final stats, as JSON
  std::uint64_t splits = 0, merges = 0;
  std::uint64_t mallocs = 0, frees = 0;  // pool_malloc / pool_free post events (counting hook)
};

/// The sequence: allocations of sizes from 1 B to 2 MiB (mostly small, some repeated, so that a
/// thread cache hits) on two streams, and frees of random live blocks, then everything freed.
template <typename Fixture>
run_result run(std::uint64_t seed, std::uint64_t ops, run_with with) {
  auto host = Fixture::make_resource();
  numbering_resource numbered{*host};
  auto alloc = Fixture::make(numbered);
  allocator& a = *alloc;
  split_merge_hook splits{a.id()};
  hooks::counting_hook counts;
  std::optional<hooks::scoped_hook> on_splits;
  std::optional<hooks::scoped_hook> on_counts;
  if (with != run_with::no_hook) {
    on_splits.emplace(splits, hooks::scope::thread);
  }
  if (with == run_with::counting_hook) {
    on_counts.emplace(counts, hooks::scope::thread);
  }

  run_result r;
  std::mt19937_64 rng(seed);
  static int streams[2];
  struct live_block {
    void* p;
    std::size_t bytes;
    stream_view stream;
  };
  std::vector<live_block> live;
  const std::size_t repeated[] = {1000, 4096, 70000};
  for (std::uint64_t op = 0; op < ops; ++op) {
    if (live.empty() || (live.size() < 200 && rng() % 2 == 0)) {
      const std::size_t bytes = rng() % 3 == 0    ? repeated[rng() % 3]
                                : rng() % 32 == 0 ? log_uniform(rng, 1, 2 << 20)
                                                  : log_uniform(rng, 1, 64 << 10);
      const stream_view s{&streams[rng() % 2]};
      void* p = a.allocate(s, bytes);
      r.blocks.push_back(numbered.name_of(p));
      live.push_back({p, bytes, s});
    } else {
      const std::size_t i = rng() % live.size();
      a.deallocate(live[i].stream, live[i].p, live[i].bytes);
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (const live_block& b : live) {
    a.deallocate(b.stream, b.p, b.bytes);
  }
  on_counts.reset();
  on_splits.reset();
  r.stats = a.stats().to_json();
  r.splits = splits.splits;
  r.merges = splits.merges;
  const auto snap = counts.snapshot();
  r.mallocs = snap.of(event_kind::pool_malloc, event_phase::pre).calls +
              snap.of(event_kind::pool_malloc, event_phase::post).calls;
  r.frees = snap.of(event_kind::pool_free, event_phase::pre).calls +
            snap.of(event_kind::pool_free, event_phase::post).calls;
  return r;
}

template <typename Fixture>
class one_path : public ::testing::Test {};
TYPED_TEST_SUITE(one_path, host_allocators);

TYPED_TEST(one_path, hooks_add_events_and_change_nothing_else) {
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = env_count("POOLSCOPE_ONE_PATH_OPS", 4000);
  const run_result bare = run<TypeParam>(seed, ops, run_with::no_hook);
  const run_result split_only = run<TypeParam>(seed, ops, run_with::split_merge_hook);
  const run_result counted = run<TypeParam>(seed, ops, run_with::counting_hook);

  ASSERT_EQ(bare.blocks.size(), counted.blocks.size());
  for (std::size_t i = 0; i < bare.blocks.size(); ++i) {
    ASSERT_EQ(bare.blocks[i], split_only.blocks[i])
        << "allocation " << i << " (seed " << seed << "): a split/merge hook changed the block";
    ASSERT_EQ(bare.blocks[i], counted.blocks[i])
        << "allocation " << i << " (seed " << seed << "): a counting hook changed the block";
  }
  EXPECT_EQ(bare.stats, split_only.stats);
  EXPECT_EQ(bare.stats, counted.stats);
  EXPECT_EQ(split_only.splits, counted.splits);
  EXPECT_EQ(split_only.merges, counted.merges);
  // Pre and post events for each call: one pair per allocation and per free.
  EXPECT_EQ(counted.mallocs, 2 * bare.blocks.size());
  EXPECT_EQ(counted.frees, 2 * bare.blocks.size());
  std::cout << "[          ] " << bare.blocks.size() << " allocations, " << split_only.splits
            << " splits, " << split_only.merges << " merges\n";
}

}  // namespace
}  // namespace poolscope::pool::testing
