// Every allocator over the host resource when the host runs out of memory for the pool's own
// bookkeeping: each operator new that allocate / deallocate reach is made to fail in turn (a
// sweep: the 1st, the 2nd, ... until one call runs without reaching the failure). After each,
// nothing may be lost: the allocation failed with std::bad_alloc and changed nothing, or it
// succeeded; a free always succeeds; the pool's reserved bytes equal what the resource holds and
// in use + cached; and at the end every byte goes back. Skipped under sanitizers (the failing
// operator new is left out there; see tests/support/failing_new.hpp).
#include <gtest/gtest.h>

#include <cstddef>
#include <new>
#include <string>
#include <vector>

#include "pool/allocator_types.hpp"
#include "support/failing_new.hpp"
#include "support/failing_new_operators.hpp"  // this test program's one inclusion

namespace poolscope::pool::testing {
namespace {

using poolscope::testing::cancel_failing_new;
using poolscope::testing::fail_nth_new;
using poolscope::testing::failing_new_available;

char g_streams[2];
const stream_view S{&g_streams[0]};
const stream_view T{&g_streams[1]};

struct live_block {
  void* ptr;
  std::size_t bytes;
};

template <typename Fixture>
class out_of_host_memory : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!failing_new_available) {
      GTEST_SKIP() << "needs the failing operator new, left out under a sanitizer";
    }
    host_ = Fixture::make_resource();
    alloc_ = Fixture::make(*host_);
  }
  void TearDown() override {
    if (alloc_ == nullptr) {
      return;
    }
    for (const live_block& b : live_) {
      alloc_->deallocate(S, b.ptr, b.bytes);
    }
    const auto s = alloc_->stats();
    EXPECT_EQ(s.in_use, 0U);
    (void)alloc_->release_cached();
    EXPECT_EQ(alloc_->stats().reserved, 0U) << "blocks were lost to the pool";
    EXPECT_EQ(held(), 0U) << "the resource still holds memory";
    EXPECT_EQ(alloc_->stats().invalid_frees, 0U);
  }

  [[nodiscard]] std::size_t held() const {
    return static_cast<host_resource&>(*host_).allocated_bytes();
  }

  // The pool's accounts agree with the resource and with themselves.
  void expect_consistent(const std::string& where) {
    const auto s = alloc_->stats();
    EXPECT_EQ(s.reserved, held()) << where << ": reserved differs from what the resource holds";
    EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved)
        << where << ": in use " << s.in_use << " + cached " << s.cached_bytes;
  }

  // allocate(stream, bytes) with the k-th operator new failing, for k = 1, 2, ... until a call
  // reaches no failure; the block of that call stays live.
  void sweep_allocate(stream_view stream, std::size_t bytes) {
    for (int k = 1; k < 1000; ++k) {
      const std::string where =
          "allocate(" + std::to_string(bytes) + "), new #" + std::to_string(k) + " failing";
      const auto before = alloc_->stats();
      void* p = nullptr;
      bool threw = false;
      fail_nth_new(k);
      try {
        p = alloc_->allocate(stream, bytes);
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      const int left = cancel_failing_new();
      const auto after = alloc_->stats();
      if (threw) {
        EXPECT_EQ(left, 0) << where << ": bad_alloc without the injected failure";
        EXPECT_EQ(after.in_use, before.in_use) << where << ": a failed allocation is in use";
        EXPECT_EQ(after.allocations, before.allocations) << where;
      } else {
        EXPECT_NE(p, nullptr) << where;
        EXPECT_GE(after.in_use, before.in_use + bytes) << where;
      }
      expect_consistent(where);
      if (p != nullptr && left == 0) {
        alloc_->deallocate(stream, p, bytes);  // the failure was absorbed: try the next one
        expect_consistent(where + ", then freed");
        continue;
      }
      if (p != nullptr) {
        live_.push_back({p, bytes});
        return;
      }
    }
    ADD_FAILURE() << "allocate(" << bytes << ") reached 1000 allocations";
  }

  // A block of `bytes` allocated on `on`, then freed on `freed_on` with the k-th operator new
  // failing, for k = 1, 2, ... until the free reaches no failure.
  void sweep_deallocate(stream_view on, stream_view freed_on, std::size_t bytes) {
    for (int k = 1; k < 1000; ++k) {
      const std::string where =
          "deallocate(" + std::to_string(bytes) + "), new #" + std::to_string(k) + " failing";
      const auto before = alloc_->stats();
      void* p = alloc_->allocate(on, bytes);
      fail_nth_new(k);
      alloc_->deallocate(freed_on, p, bytes);
      const int left = cancel_failing_new();
      const auto after = alloc_->stats();
      EXPECT_EQ(after.in_use, before.in_use) << where << ": the freed block is still in use";
      EXPECT_EQ(after.deallocations, before.deallocations + 1) << where;
      expect_consistent(where);
      if (left > 0) {
        return;
      }
    }
    ADD_FAILURE() << "deallocate(" << bytes << ") reached 1000 allocations";
  }

  std::unique_ptr<resource> host_;
  std::unique_ptr<allocator> alloc_;
  std::vector<live_block> live_;
};

TYPED_TEST_SUITE(out_of_host_memory, host_allocators);

// New sizes (the strategies' miss paths: bfc's small, mid and large pools), then the same sizes
// again from the cache (hit paths), then frees.
TYPED_TEST(out_of_host_memory, allocations_fail_cleanly_or_succeed_and_frees_lose_nothing) {
  for (const std::size_t bytes : {std::size_t{3000}, std::size_t{70} << 10, std::size_t{3} << 20}) {
    this->sweep_allocate(S, bytes);
    this->sweep_deallocate(S, S, bytes);
    this->sweep_allocate(S, bytes);  // now cached
  }
  this->expect_consistent("end");
}

// A block freed on another stream than its own (stream_pool queues it behind an event; the
// others take it back at once).
TYPED_TEST(out_of_host_memory, frees_on_another_stream_lose_nothing) {
  this->sweep_allocate(S, 8192);
  this->sweep_deallocate(S, T, 8192);
  this->sweep_allocate(S, 8192);
  this->sweep_allocate(T, 8192);
  this->expect_consistent("end");
}

}  // namespace
}  // namespace poolscope::pool::testing
