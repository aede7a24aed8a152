// counting_hook against known sequences of operations on the host resource: every (kind, phase)
// cell of the table is checked, the untouched ones included.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <new>
#include <utility>

#include "poolscope/error.hpp"
#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"

namespace {

namespace ph = poolscope::hooks;
using ph::event_kind;
using ph::event_phase;
using poolscope::pool::host_resource;

using expected_table = std::map<std::pair<event_kind, event_phase>, ph::counting_hook::counter>;

void expect_counts(const ph::counting_hook::counts& got, const expected_table& want) {
  std::uint64_t want_total = 0;
  for (int k = 0; k < ph::event_kind_count; ++k) {
    for (int p = 0; p < 3; ++p) {
      const auto kind = static_cast<event_kind>(k);
      const auto phase = static_cast<event_phase>(p);
      const auto it = want.find({kind, phase});
      const ph::counting_hook::counter w =
          it == want.end() ? ph::counting_hook::counter{} : it->second;
      want_total += w.calls;
      const auto& g = got.of(kind, phase);
      EXPECT_EQ(g.calls, w.calls) << ph::to_string(kind) << "/" << ph::to_string(phase) << " calls";
      EXPECT_EQ(g.bytes, w.bytes) << ph::to_string(kind) << "/" << ph::to_string(phase) << " bytes";
    }
  }
  EXPECT_EQ(got.total_calls(), want_total);
}

TEST(counting_hook, counts_a_naive_sequence_exactly) {
  host_resource host;
  poolscope::pool::naive_allocator a{host};
  ph::counting_hook c;
  {
    ph::scoped_hook on{c, ph::scope::thread};
    void* x = a.allocate({}, 100);
    void* y = a.allocate({}, 5000);
    a.deallocate({}, x, 100);
    EXPECT_EQ(a.release_cached(), 0U);  // naive caches nothing
    a.deallocate({}, y, 5000);
  }
  // Bytes are `rounded`, or `requested` where rounded is 0 (pre-malloc, pre-free, release pre).
  expect_counts(c.snapshot(), {
                                  {{event_kind::pool_malloc, event_phase::pre}, {2, 5100}},
                                  {{event_kind::pool_malloc, event_phase::post}, {2, 5100}},
                                  {{event_kind::device_alloc, event_phase::pre}, {2, 5100}},
                                  {{event_kind::device_alloc, event_phase::post}, {2, 5100}},
                                  {{event_kind::pool_free, event_phase::pre}, {2, 5100}},
                                  {{event_kind::pool_free, event_phase::post}, {2, 5100}},
                                  {{event_kind::device_free, event_phase::pre}, {2, 5100}},
                                  {{event_kind::device_free, event_phase::post}, {2, 5100}},
                                  {{event_kind::release, event_phase::pre}, {1, 0}},
                                  {{event_kind::release, event_phase::post}, {1, 0}},
                              });
  EXPECT_EQ(host.allocated_bytes(), 0U);
}

TEST(counting_hook, counts_a_best_fit_sequence_with_failures_exactly) {
  host_resource host;
  poolscope::pool::best_fit_allocator a{host};
  ph::counting_hook c;
  {
    ph::scoped_hook on{c, ph::scope::thread};
    void* x = a.allocate({}, 1000);  // 1024 from upstream
    a.deallocate({}, x, 1000);       // cached
    void* y = a.allocate({}, 700);   // 1024 from the cache: no upstream call
    EXPECT_EQ(x, y);
    a.deallocate({}, y, 700);
    void* z = a.allocate({}, 2000);  // 2048 from upstream
    EXPECT_THROW((void)a.allocate({}, std::size_t{1} << 60), poolscope::out_of_memory);
    a.set_limit(3000);  // 2048 in use + 2000 > 3000
    EXPECT_THROW((void)a.allocate({}, 2000), poolscope::out_of_memory);
    a.set_limit(SIZE_MAX);
    int stranger = 0;
    a.deallocate({}, &stranger, 8);  // unknown pointer
    a.deallocate({}, z, 2000);
    EXPECT_EQ(a.release_cached(), 3072U);  // both cached blocks go back
  }
  constexpr std::uint64_t huge = std::uint64_t{1} << 60;
  expect_counts(
      c.snapshot(),
      {
          {{event_kind::pool_malloc, event_phase::pre}, {5, 1000 + 700 + 2000 + huge + 2000}},
          {{event_kind::pool_malloc, event_phase::post}, {3, 4096}},
          {{event_kind::device_alloc, event_phase::pre}, {2, 3072}},
          {{event_kind::device_alloc, event_phase::post}, {2, 3072}},
          {{event_kind::oom, event_phase::instant}, {2, huge + 2000}},
          {{event_kind::limit_hit, event_phase::instant}, {1, 2000}},
          {{event_kind::invalid_free, event_phase::instant}, {1, 8}},
          {{event_kind::pool_free, event_phase::pre}, {4, 1000 + 700 + 8 + 2000}},
          {{event_kind::pool_free, event_phase::post}, {3, 4096}},
          {{event_kind::release, event_phase::pre}, {1, 0}},
          {{event_kind::release, event_phase::post}, {1, 3072}},
          {{event_kind::device_free, event_phase::pre}, {2, 3072}},
          {{event_kind::device_free, event_phase::post}, {2, 3072}},
      });
  const auto s = a.stats();
  EXPECT_EQ(s.reserved, 0U);
  EXPECT_EQ(host.allocated_bytes(), 0U);
}

TEST(counting_hook, reset_zeroes_every_counter) {
  host_resource host;
  poolscope::pool::naive_allocator a{host};
  ph::counting_hook c;
  ph::scoped_hook on{c, ph::scope::thread};
  a.deallocate({}, a.allocate({}, 64), 64);
  EXPECT_EQ(c.snapshot().total_calls(), 8U);
  c.reset();
  expect_counts(c.snapshot(), {});
  a.deallocate({}, a.allocate({}, 64), 64);
  EXPECT_EQ(c.snapshot().of(event_kind::pool_malloc).calls, 1U);
  EXPECT_EQ(c.snapshot().of(event_kind::pool_malloc).bytes, 64U);
}

}  // namespace
