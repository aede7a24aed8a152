// Invalid deallocations (allocator.hpp contract): unknown pointers, double frees, wrong sizes and
// null with a size are each reported (invalid_free event with its free_error, a log warning, a
// stats count) and leave the pool consistent and usable.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hooks/recording_hook.hpp"
#include "pool/allocator_types.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/allocator.hpp"

namespace poolscope::pool::testing {
namespace {

using hooks::event_kind;
using hooks::event_phase;
using hooks::free_error;
using poolscope::testing::recording_hook;

/// Strategies that remember freed blocks and so can tell a double free from a stranger's
/// pointer (naive hands blocks straight back upstream: to it a double free is unknown).
template <typename A>
inline constexpr bool detects_double_free = !std::is_same_v<A, naive_allocator>;

template <typename Fixture>
class allocator_invalid_free : public ::testing::Test {
 protected:
  using strategy_type = typename Fixture::strategy_type;

  void SetUp() override {
    resource_ = Fixture::make_resource();
    alloc_ = Fixture::make(*resource_);
    previous_level_ = get_log_level();
    set_log_level(log_level::warn);
    set_log_sink([this](log_level level, std::string_view message) {
      std::lock_guard lock(mutex_);
      logs_.emplace_back(level, std::string(message));
    });
  }
  void TearDown() override {
    set_log_sink({});
    set_log_level(previous_level_);
  }

  std::vector<std::pair<log_level, std::string>> logs() {
    std::lock_guard lock(mutex_);
    return logs_;
  }

  /// Checks that exactly one invalid free was reported since `rec` was installed and
  /// `logs_before` messages were logged: event, warning naming the error and the allocator,
  /// and the stats count.
  void expect_one_report(const recording_hook& rec, std::size_t logs_before,
                         std::uint64_t invalid_before, free_error error, const void* ptr,
                         std::size_t bytes) {
    const auto events = rec.of(event_kind::invalid_free, event_phase::instant);
    ASSERT_EQ(events.size(), 1U);
    EXPECT_EQ(events[0].error, error)
        << hooks::to_string(events[0].error) << " instead of " << hooks::to_string(error);
    EXPECT_EQ(events[0].ptr, ptr);
    EXPECT_EQ(events[0].requested, bytes);
    EXPECT_EQ(events[0].allocator_id, alloc_->id());
    const auto messages = logs();
    ASSERT_EQ(messages.size(), logs_before + 1) << "expected one warning";
    EXPECT_EQ(messages.back().first, log_level::warn);
    const std::string& text = messages.back().second;
    EXPECT_NE(text.find(std::string(hooks::to_string(error))), std::string::npos) << text;
    EXPECT_NE(text.find(alloc_->name()), std::string::npos) << text;
    EXPECT_EQ(alloc_->stats().invalid_frees, invalid_before + 1);
  }

  /// The pool still serves, and its counters still add up.
  void expect_usable() {
    const auto before = alloc_->stats();
    void* p = alloc_->allocate({}, 3000);
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x6b, 3000);
    alloc_->deallocate({}, p, 3000);
    const auto after = alloc_->stats();
    EXPECT_EQ(after.in_use, before.in_use);
    EXPECT_EQ(after.requested_in_use, before.requested_in_use);
    EXPECT_EQ(after.allocations, before.allocations + 1);
    EXPECT_EQ(after.deallocations, before.deallocations + 1);
    EXPECT_EQ(after.invalid_frees, before.invalid_frees);
  }

  std::unique_ptr<resource> resource_;
  std::unique_ptr<allocator> alloc_;

 private:
  log_level previous_level_ = log_level::warn;
  std::mutex mutex_;
  std::vector<std::pair<log_level, std::string>> logs_;
};

TYPED_TEST_SUITE(allocator_invalid_free, host_allocators);

TYPED_TEST(allocator_invalid_free, unknown_pointer_is_ignored) {
  auto& a = *this->alloc_;
  void* live = a.allocate({}, 1000);
  const auto before = a.stats();
  const auto logs_before = this->logs().size();

  // A pointer the allocator never saw (another allocator's block), and one inside a live block.
  host_resource other_res;
  naive_allocator other{other_res};
  void* stranger = other.allocate({}, 512);
  void* interior = static_cast<char*>(live) + 256;
  for (void* p : {stranger, interior}) {
    recording_hook rec{a.id()};
    const auto logs_now = this->logs().size();
    const auto invalid_now = a.stats().invalid_frees;
    {
      hooks::scoped_hook on{rec, hooks::scope::thread};
      a.deallocate({}, p, 512);
    }
    this->expect_one_report(rec, logs_now, invalid_now, free_error::unknown_pointer, p, 512);
    EXPECT_TRUE(rec.of(event_kind::pool_free, event_phase::post).empty())
        << "an ignored free was reported as done";
  }
  EXPECT_EQ(this->logs().size(), logs_before + 2);
  const auto after = a.stats();
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(after.requested_in_use, before.requested_in_use);
  EXPECT_EQ(after.deallocations, before.deallocations);
  EXPECT_EQ(after.reserved, before.reserved);
  EXPECT_EQ(after.invalid_frees, before.invalid_frees + 2);
  other.deallocate({}, stranger, 512);
  EXPECT_EQ(other.stats().in_use, 0U) << "the stranger's block was disturbed";

  std::memset(live, 0x11, 1000);  // the live block is still ours
  a.deallocate({}, live, 1000);
  EXPECT_EQ(a.stats().in_use, 0U);
  this->expect_usable();
}

TYPED_TEST(allocator_invalid_free, double_free_is_ignored) {
  using A = typename TestFixture::strategy_type;
  auto& a = *this->alloc_;
  void* keep = a.allocate({}, 2000);
  void* p = a.allocate({}, 1000);
  a.deallocate({}, p, 1000);
  const auto before = a.stats();
  const auto logs_before = this->logs().size();
  recording_hook rec{a.id()};
  {
    hooks::scoped_hook on{rec, hooks::scope::thread};
    a.deallocate({}, p, 1000);
  }
  this->expect_one_report(
      rec, logs_before, before.invalid_frees,
      detects_double_free<A> ? free_error::double_free : free_error::unknown_pointer, p, 1000);
  const auto after = a.stats();
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(after.requested_in_use, before.requested_in_use);
  EXPECT_EQ(after.deallocations, before.deallocations);
  EXPECT_EQ(after.cached_bytes, before.cached_bytes) << "the block was cached twice";
  EXPECT_EQ(after.cached_blocks, before.cached_blocks) << "the block was cached twice";

  // The block is handed out at most once afterwards: two allocations of its size differ.
  void* x = a.allocate({}, 1000);
  void* y = a.allocate({}, 1000);
  EXPECT_NE(x, y);
  a.deallocate({}, x, 1000);
  a.deallocate({}, y, 1000);
  a.deallocate({}, keep, 2000);
  EXPECT_EQ(a.stats().in_use, 0U);
  EXPECT_EQ(a.stats().invalid_frees, before.invalid_frees + 1);
  this->expect_usable();
}

TYPED_TEST(allocator_invalid_free, wrong_size_frees_the_block_with_its_true_size) {
  auto& a = *this->alloc_;
  void* keep = a.allocate({}, 700);
  for (std::size_t wrong : {std::size_t{5000}, std::size_t{1}, std::size_t{1} << 30}) {
    const auto base = a.stats();
    void* p = a.allocate({}, 1000);
    const auto allocated = a.stats();
    const auto logs_before = this->logs().size();
    recording_hook rec{a.id()};
    {
      hooks::scoped_hook on{rec, hooks::scope::thread};
      a.deallocate({}, p, wrong);
    }
    this->expect_one_report(rec, logs_before, allocated.invalid_frees, free_error::size_mismatch, p,
                            wrong);
    const auto post = rec.of(event_kind::pool_free, event_phase::post);
    ASSERT_EQ(post.size(), 1U) << "a corrected free must still free the block";
    EXPECT_EQ(post[0].ptr, p);
    EXPECT_EQ(post[0].requested, 1000U) << "freed with the wrong size";
    EXPECT_EQ(post[0].rounded, allocated.in_use - base.in_use);
    const auto after = a.stats();
    EXPECT_EQ(after.in_use, base.in_use);
    EXPECT_EQ(after.requested_in_use, base.requested_in_use);
    EXPECT_EQ(after.deallocations, allocated.deallocations + 1);
    EXPECT_NE(this->logs().back().second.find(std::to_string(wrong)), std::string::npos)
        << "the warning does not name the size given: " << this->logs().back().second;
    // Now free: a second free of it is invalid, not a corruption.
    a.deallocate({}, p, 1000);
    EXPECT_EQ(a.stats().in_use, base.in_use);
    EXPECT_EQ(a.stats().invalid_frees, allocated.invalid_frees + 2);
  }
  a.deallocate({}, keep, 700);
  EXPECT_EQ(a.stats().in_use, 0U);
  this->expect_usable();
}

TYPED_TEST(allocator_invalid_free, null_with_a_size_is_ignored) {
  auto& a = *this->alloc_;
  void* keep = a.allocate({}, 100);
  const auto before = a.stats();
  const auto logs_before = this->logs().size();
  recording_hook rec{a.id()};
  {
    hooks::scoped_hook on{rec, hooks::scope::thread};
    a.deallocate({}, nullptr, 64);
  }
  this->expect_one_report(rec, logs_before, before.invalid_frees, free_error::null_with_size,
                          nullptr, 64);
  EXPECT_TRUE(rec.of(event_kind::pool_free, event_phase::pre).empty());
  EXPECT_TRUE(rec.of(event_kind::pool_free, event_phase::post).empty());
  const auto after = a.stats();
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(after.deallocations, before.deallocations);
  a.deallocate({}, keep, 100);
  this->expect_usable();
}

TYPED_TEST(allocator_invalid_free, reports_are_silent_below_warn_but_still_counted) {
  auto& a = *this->alloc_;
  set_log_level(log_level::error);
  const auto logs_before = this->logs().size();
  a.deallocate({}, nullptr, 8);
  int x = 0;
  a.deallocate({}, &x, 8);
  EXPECT_EQ(this->logs().size(), logs_before);
  EXPECT_EQ(a.stats().invalid_frees, 2U);
}

}  // namespace
}  // namespace poolscope::pool::testing
