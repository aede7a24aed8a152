// counting_hook: counts events and bytes per kind and phase. The cheapest useful hook.
//
//   poolscope::hooks::counting_hook counts;
//   poolscope::hooks::scoped_hook on{counts};
//   run();
//   auto s = counts.snapshot();
//   std::cout << s.of(event_kind::pool_malloc, event_phase::post).calls;
//
// Thread safety: thread-safe; relaxed atomic counters, striped by thread over 16 shards of their
// own cache lines, so threads counting at once rarely share a line. A snapshot sums the shards:
// each field holds every event counted before the snapshot began (and perhaps some during it).
// Cost: two relaxed atomic adds per event, on the calling thread's shard.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "poolscope/hooks/hook.hpp"

namespace poolscope::hooks {

class counting_hook final : public hook {
 public:
  struct counter {
    std::uint64_t calls = 0;
    std::uint64_t bytes = 0;  ///< sum of `rounded` (or `requested` where rounded is 0)
  };
  /// Counts by (kind, phase), taken by value.
  struct counts {
    std::array<std::array<counter, 3>, event_kind_count> table{};
    [[nodiscard]] const counter& of(event_kind k, event_phase p = event_phase::post) const {
      return table[static_cast<int>(k)][static_cast<int>(p)];
    }
    [[nodiscard]] std::uint64_t total_calls() const;
  };

  void on_event(const event& e) noexcept override;
  /// False: counts need no order, so a counting hook alone leaves events unnumbered.
  [[nodiscard]] bool wants_sequence() const noexcept override { return false; }
  /// False: nor any time.
  [[nodiscard]] bool wants_time() const noexcept override { return false; }
  [[nodiscard]] counts snapshot() const noexcept;
  void reset() noexcept;

 private:
  struct slot {
    std::atomic<std::uint64_t> calls{0};
    std::atomic<std::uint64_t> bytes{0};
  };
  static constexpr std::size_t shard_count = 16;
  struct alignas(64) shard {
    std::array<std::array<slot, 3>, event_kind_count> table{};
  };
  std::array<shard, shard_count> shards_{};  // an event counts in shard (thread id % 16)
};

}  // namespace poolscope::hooks
