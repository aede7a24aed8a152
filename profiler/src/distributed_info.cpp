// Clock samples around barriers and the host name (distributed_info.hpp).
#include "poolscope/profiler/distributed_info.hpp"

#include <unistd.h>

#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"

namespace poolscope::profiler {

std::vector<clock_sync_round> sample_barriers(const std::function<void()>& barrier, int rounds) {
  if (rounds < 1) {
    throw invalid_argument("sample_barriers: rounds " + std::to_string(rounds) + " (at least 1)");
  }
  std::vector<clock_sync_round> out(static_cast<std::size_t>(rounds));
  for (clock_sync_round& r : out) {
    r.before_ns = hooks::now_ns();
    barrier();
    r.after_ns = hooks::now_ns();
  }
  return out;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) {
    return {};
  }
  return name;
}

}  // namespace poolscope::profiler
