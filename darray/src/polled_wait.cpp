// polled_wait (polled_wait.hpp).
#include "polled_wait.hpp"

#include <algorithm>
#include <thread>

namespace poolscope::darray::detail {

poll_pause next_pause(const poll_schedule& s, std::chrono::nanoseconds waited,
                      const poll_pause& previous) noexcept {
  if (waited < s.spin) {
    return {};
  }
  if (waited < s.spin + s.yield) {
    return {poll_pause::kind::yield, std::chrono::microseconds(0)};
  }
  const std::chrono::microseconds sleep = previous.how == poll_pause::kind::sleep
                                              ? std::min(previous.sleep * 2, s.max_sleep)
                                              : std::min(s.first_sleep, s.max_sleep);
  return {poll_pause::kind::sleep, sleep};
}

void take_pause(const poll_pause& p) noexcept {
  switch (p.how) {
    case poll_pause::kind::spin:
      return;
    case poll_pause::kind::yield:
      std::this_thread::yield();
      return;
    case poll_pause::kind::sleep:
      std::this_thread::sleep_for(p.sleep);
      return;
  }
}

}  // namespace poolscope::darray::detail
