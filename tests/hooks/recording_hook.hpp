// Test helper: a hook that keeps a copy of every event it receives (optionally only those of
// one allocator). Used by the hooks and pool test suites.
// Thread safety: thread-safe (one mutex). Cost: a vector push per event; tests only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "poolscope/hooks/hook.hpp"

namespace poolscope::testing {

/// One received event, with the allocator name copied (the event's pointer dies with it).
struct recorded_event {
  hooks::event e;
  std::string allocator_name;
};

/// Records events; `only_allocator` != 0 keeps only that allocator's events; `interests` is what
/// it asks the registry for (every event by default).
class recording_hook final : public hooks::hook {
 public:
  explicit recording_hook(std::uint32_t only_allocator = 0,
                          hooks::event_filter interests = hooks::event_filter::all())
      : only_(only_allocator), interests_(interests) {}

  [[nodiscard]] hooks::event_filter interests() const noexcept override { return interests_; }

  void on_event(const hooks::event& e) noexcept override {
    if (only_ != 0 && e.allocator_id != only_) {
      return;
    }
    std::lock_guard lock(mutex_);
    try {
      events_.push_back({e, e.allocator_name != nullptr ? e.allocator_name : ""});
    } catch (...) {
      dropped_ = true;  // out of host memory: the test checking events will see too few
    }
  }

  /// Every event so far, in delivery order.
  [[nodiscard]] std::vector<recorded_event> events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }
  /// The events of one kind and phase, in delivery order.
  [[nodiscard]] std::vector<hooks::event> of(hooks::event_kind k, hooks::event_phase p) const {
    std::lock_guard lock(mutex_);
    std::vector<hooks::event> out;
    for (const auto& r : events_) {
      if (r.e.kind == k && r.e.phase == p) {
        out.push_back(r.e);
      }
    }
    return out;
  }
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mutex_);
    return events_.size();
  }
  void clear() {
    std::lock_guard lock(mutex_);
    events_.clear();
  }
  [[nodiscard]] bool dropped() const {
    std::lock_guard lock(mutex_);
    return dropped_;
  }

 private:
  std::uint32_t only_;
  hooks::event_filter interests_;
  mutable std::mutex mutex_;
  std::vector<recorded_event> events_;
  bool dropped_ = false;
};

}  // namespace poolscope::testing
