// counting_hook: counts events and bytes per kind and phase. The cheapest useful hook.
//
//   poolscope::hooks::counting_hook counts;
//   poolscope::hooks::scoped_hook on{counts};
//   run();
//   auto s = counts.snapshot();
//   std::cout << s.of(event_kind::pool_malloc, event_phase::post).calls;
//
// Thread safety: thread-safe; relaxed atomic counters (a snapshot's fields are each exact).
// Cost: two relaxed atomic adds per event.
#pragma once

#include <array>
#include <atomic>
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
  [[nodiscard]] counts snapshot() const noexcept;
  void reset() noexcept;

 private:
  struct slot {
    std::atomic<std::uint64_t> calls{0};
    std::atomic<std::uint64_t> bytes{0};
  };
  std::array<std::array<slot, 3>, event_kind_count> table_{};
};

}  // namespace poolscope::hooks
