// A log sink for out-of-host-memory tests: keeps the last 16 poolscope log messages (each cut at
// 511 characters) in fixed buffers, so capturing a message allocates nothing (a sink that
// allocated would itself fail while memory is short, and its message would be lost to the test,
// not to the user). Installs itself for its lifetime; restores the default sink after.
// Thread safety: the sink and saw() may be called from any thread.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string_view>

#include "poolscope/log.hpp"

namespace poolscope::testing {

class fixed_log_capture {
 public:
  fixed_log_capture() {
    poolscope::set_log_sink([this](poolscope::log_level, std::string_view message) {
      std::lock_guard lock(mutex_);
      auto& slot = messages_[count_ % messages_.size()];
      const std::size_t n = std::min(message.size(), slot.size() - 1);
      std::memcpy(slot.data(), message.data(), n);
      slot[n] = '\0';
      ++count_;
    });
  }
  fixed_log_capture(const fixed_log_capture&) = delete;
  fixed_log_capture& operator=(const fixed_log_capture&) = delete;
  ~fixed_log_capture() { poolscope::set_log_sink({}); }

  /// True if a message holding `text` was logged (among the last 16).
  [[nodiscard]] bool saw(std::string_view text) {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < std::min<std::size_t>(count_, messages_.size()); ++i) {
      if (std::string_view(messages_[i].data()).find(text) != std::string_view::npos) {
        return true;
      }
    }
    return false;
  }

 private:
  std::mutex mutex_;
  std::array<std::array<char, 512>, 16> messages_{};
  std::size_t count_ = 0;
};

}  // namespace poolscope::testing
