// An allocator's counters (detail/allocator_counters.hpp): the paths off the usual one.
#include "detail/allocator_counters.hpp"

namespace poolscope::pool::detail {

void allocator_counters::retire(thread_node& node) noexcept {
  // The exiting thread's credit goes back to the totals, so that the bound of whichever thread
  // counts next stays exact when it is alone; the counts stay in the shard, summed by exact().
  auto& s = static_cast<counter_shard&>(node);
  in_use_.settle(s.credit_in_use);
  requested_.settle(s.credit_requested);
}

void allocator_counters::raise_peaks(std::int64_t in_use, std::int64_t requested) noexcept {
  if (in_use > 0) {
    raise_peak(peak_in_use, static_cast<std::size_t>(in_use));
  }
  if (requested > 0) {
    raise_peak(peak_requested, static_cast<std::size_t>(requested));
  }
}

void allocator_counters::spend_beyond_credit(counter_shard& s, std::size_t rounded,
                                             std::size_t requested) noexcept {
  // Each credit pays what it can; a credit that falls short adds the rest to its total.
  std::size_t bound_u = 0;
  std::size_t bound_r = 0;
  if (s.credit_in_use < rounded) {
    bound_u = in_use_.spend_all(s.credit_in_use, rounded);
  } else {
    s.credit_in_use = s.credit_in_use - rounded;
    bound_u = in_use_.published() - s.credit_in_use;
  }
  if (s.credit_requested < requested) {
    bound_r = requested_.spend_all(s.credit_requested, requested);
  } else {
    s.credit_requested = s.credit_requested - requested;
    bound_r = requested_.published() - s.credit_requested;
  }
  raise_peaks(static_cast<std::int64_t>(bound_u), static_cast<std::int64_t>(bound_r));
}

void allocator_counters::return_credit(counter_shard& s, std::size_t credit_in_use,
                                       std::size_t credit_requested) noexcept {
  // Past the cap, the whole credit goes back to the total: the thread's bound is exact again.
  s.credit_in_use = credit_in_use;
  s.credit_requested = credit_requested;
  const std::size_t cap = credited_total::cap_for(in_use_.published());
  if (credit_in_use > cap) {
    in_use_.settle(s.credit_in_use);
  }
  if (credit_requested > cap) {
    requested_.settle(s.credit_requested);
  }
}

void allocator_counters::on_allocate_unslotted(std::size_t rounded,
                                               std::size_t requested) noexcept {
  if (shards_->claim() != nullptr) {
    on_allocate(rounded, requested);  // the thread's table holds the shard now
    return;
  }
  // No shard (no host memory for one, or the thread's exit has begun): the totals directly.
  unsharded_allocations_.fetch_add(1, std::memory_order_relaxed);
  raise_peaks(static_cast<std::int64_t>(in_use_.add(rounded)),
              static_cast<std::int64_t>(requested_.add(requested)));
}

void allocator_counters::on_free_unslotted(std::size_t rounded, std::size_t requested) noexcept {
  if (shards_->claim() != nullptr) {
    on_free(rounded, requested);
    return;
  }
  unsharded_deallocations_.fetch_add(1, std::memory_order_relaxed);
  in_use_.sub(rounded);
  requested_.sub(requested);
}

allocator_counters::totals allocator_counters::exact() const {
  // The published totals first, then the credits: under concurrent use the two are from nearby
  // instants, and the caller clamps what it reports (allocator::stats).
  std::size_t in_use = in_use_.published();
  std::size_t requested = requested_.published();
  totals t;
  t.allocations = unsharded_allocations_.load(std::memory_order_relaxed);
  t.deallocations = unsharded_deallocations_.load(std::memory_order_relaxed);
  std::size_t credit_in_use = 0;
  std::size_t credit_requested = 0;
  shards_->for_each([&](const thread_node& node) {
    const auto& s = static_cast<const counter_shard&>(node);
    credit_in_use += s.credit_in_use;
    credit_requested += s.credit_requested;
    t.allocations += s.allocations;
    t.deallocations += s.deallocations;
  });
  t.in_use = in_use > credit_in_use ? in_use - credit_in_use : 0;
  t.requested = requested > credit_requested ? requested - credit_requested : 0;
  return t;
}

std::size_t allocator_counters::in_use_bound() noexcept {
  const std::size_t published = in_use_.published();
  const auto* s = static_cast<const counter_shard*>(shards_->local());
  const std::size_t own = s != nullptr ? static_cast<std::size_t>(s->credit_in_use) : 0;
  return published > own ? published - own : 0;
}

}  // namespace poolscope::pool::detail
