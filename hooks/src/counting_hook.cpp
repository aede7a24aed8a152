#include "poolscope/hooks/counting_hook.hpp"

namespace poolscope::hooks {

void counting_hook::on_event(const event& e) noexcept {
  auto& s =
      shards_[e.thread % shard_count].table[static_cast<int>(e.kind)][static_cast<int>(e.phase)];
  s.calls.fetch_add(1, std::memory_order_relaxed);
  s.bytes.fetch_add(e.rounded != 0 ? e.rounded : e.requested, std::memory_order_relaxed);
}

counting_hook::counts counting_hook::snapshot() const noexcept {
  counts c;
  for (const shard& sh : shards_) {
    for (int k = 0; k < event_kind_count; ++k) {
      for (int p = 0; p < 3; ++p) {
        c.table[k][p].calls += sh.table[k][p].calls.load(std::memory_order_relaxed);
        c.table[k][p].bytes += sh.table[k][p].bytes.load(std::memory_order_relaxed);
      }
    }
  }
  return c;
}

void counting_hook::reset() noexcept {
  for (shard& sh : shards_) {
    for (auto& row : sh.table) {
      for (auto& s : row) {
        s.calls.store(0, std::memory_order_relaxed);
        s.bytes.store(0, std::memory_order_relaxed);
      }
    }
  }
}

std::uint64_t counting_hook::counts::total_calls() const {
  std::uint64_t n = 0;
  for (const auto& row : table) {
    for (const auto& c : row) {
      n += c.calls;
    }
  }
  return n;
}

}  // namespace poolscope::hooks
