#include "poolscope/analysis/replay.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_resource.hpp"

namespace poolscope::analysis {

namespace {

struct block_key {
  std::uint32_t allocator;
  std::uint64_t ptr;
  friend bool operator==(const block_key&, const block_key&) = default;
};
struct block_key_hash {
  std::size_t operator()(const block_key& k) const noexcept {
    return std::hash<std::uint64_t>{}(k.ptr ^ (std::uint64_t{k.allocator} << 56));
  }
};
struct replayed_block {
  void* ptr;  // nullptr: the replayed allocation failed
  std::size_t bytes;
  std::uint64_t stream;
};

std::uint64_t clock_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

latency_summary summarize(std::vector<std::uint32_t>& ns) {
  latency_summary s;
  s.count = ns.size();
  if (ns.empty()) {
    return s;
  }
  double sum = 0;
  for (auto v : ns) {
    sum += v;
  }
  s.mean_ns = sum / static_cast<double>(ns.size());
  // Nearest-rank percentiles.
  auto rank = [&](double p) {
    auto r = static_cast<std::size_t>(p * static_cast<double>(ns.size()) + 0.999999);
    return r == 0 ? std::size_t{0} : std::min(r - 1, ns.size() - 1);
  };
  const std::size_t i50 = rank(0.50);
  std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(i50), ns.end());
  s.p50_ns = ns[i50];
  const std::size_t i99 = rank(0.99);
  std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(i99), ns.end());
  s.p99_ns = ns[i99];
  s.max_ns = *std::max_element(ns.begin(), ns.end());
  return s;
}

nlohmann::ordered_json latency_json(const latency_summary& l) {
  nlohmann::ordered_json j;
  j["count"] = l.count;
  j["mean_ns"] = l.mean_ns;
  j["p50_ns"] = l.p50_ns;
  j["p99_ns"] = l.p99_ns;
  j["max_ns"] = l.max_ns;
  return j;
}

}  // namespace

replay_result replay(const event_log& log, pool::allocator& alloc, const replay_options& options) {
  replay_result r;
  r.allocator = alloc.name();
  r.dropped_events = log.dropped_events;
  std::uint32_t only = UINT32_MAX;
  if (!options.only_allocator.empty()) {
    auto it = std::find(log.allocators.begin(), log.allocators.end(), options.only_allocator);
    if (it == log.allocators.end()) {
      throw invalid_argument("poolscope: replay: the log has no allocator named '" +
                             options.only_allocator + "'");
    }
    only = static_cast<std::uint32_t>(it - log.allocators.begin());
  }
  auto stream_of = [&](std::uint64_t recorded) {
    return options.map_stream ? options.map_stream(recorded) : stream_view{};
  };

  std::unordered_map<block_key, replayed_block, block_key_hash> live;
  std::vector<std::uint32_t> malloc_ns;
  std::vector<std::uint32_t> free_ns;
  auto record_ns = [](std::vector<std::uint32_t>& v, std::uint64_t t0, std::uint64_t t1) {
    const std::uint64_t d = t1 - t0;
    v.push_back(static_cast<std::uint32_t>(std::min<std::uint64_t>(d, UINT32_MAX)));
  };
  auto do_free = [&](const replayed_block& b, bool timed) {
    const std::uint64_t t0 = timed ? clock_ns() : 0;
    alloc.deallocate(stream_of(b.stream), b.ptr, b.bytes);
    if (timed) {
      record_ns(free_ns, t0, clock_ns());
    }
    ++r.frees;
  };

  const std::size_t total = log.records.size();
  const std::size_t every = options.progress_every == 0 ? total + 1 : options.progress_every;
  for (std::size_t i = 0; i < total; ++i) {
    const log_record& rec = log.records[i];
    if (options.progress && i != 0 && i % every == 0) {
      if (!options.progress({i, total, r.failed_allocations})) {
        r.completed = false;
        break;
      }
    }
    ++r.records;
    if (only != UINT32_MAX && rec.allocator != only) {
      ++r.skipped_records;
      continue;
    }
    const block_key key{rec.allocator, rec.ptr};
    if (rec.kind == hooks::event_kind::pool_malloc && rec.phase == hooks::event_phase::post) {
      if (auto old = live.find(key); old != live.end()) {
        // The log reuses a pointer whose free it never recorded: the block was freed then.
        ++r.implied_frees;
        if (old->second.ptr != nullptr) {
          do_free(old->second, false);
        }
        live.erase(old);
      }
      ++r.mallocs;
      void* p = nullptr;
      const std::uint64_t t0 = clock_ns();
      try {
        p = alloc.allocate(stream_of(rec.stream), rec.size);
      } catch (const out_of_memory&) {
        p = nullptr;
      }
      const std::uint64_t t1 = clock_ns();
      if (p == nullptr && rec.size != 0) {
        ++r.failed_allocations;
      } else {
        record_ns(malloc_ns, t0, t1);
      }
      live.emplace(key, replayed_block{p, rec.size, rec.stream});
    } else if (rec.kind == hooks::event_kind::pool_free && rec.phase == hooks::event_phase::pre) {
      auto it = live.find(key);
      if (it == live.end()) {
        ++r.unknown_frees;
        continue;
      }
      if (it->second.ptr == nullptr) {
        if (it->second.bytes != 0) {
          ++r.frees_of_failed;
        }
      } else {
        do_free(it->second, true);
      }
      live.erase(it);
    } else if (rec.kind == hooks::event_kind::oom) {
      ++r.recorded_failures;
    } else {
      ++r.skipped_records;
    }
  }
  for (const auto& [key, b] : live) {
    if (b.ptr != nullptr) {
      ++r.live_at_end;
    }
  }
  if (options.free_remaining) {
    for (const auto& [key, b] : live) {
      if (b.ptr != nullptr) {
        alloc.deallocate(stream_of(b.stream), b.ptr, b.bytes);
      }
    }
    live.clear();
  }
  if (options.progress && r.completed) {
    (void)options.progress({r.records, total, r.failed_allocations});
  }

  r.final_stats = alloc.stats();
  r.peak_requested = r.final_stats.peak_requested;
  r.peak_reserved = r.final_stats.peak_reserved;
  r.peak_in_use = r.final_stats.peak_in_use;
  r.ratio = r.peak_requested == 0
                ? 0.0
                : static_cast<double>(r.peak_reserved) / static_cast<double>(r.peak_requested);
  r.upstream_allocs = r.final_stats.upstream_allocs;
  r.upstream_frees = r.final_stats.upstream_frees;
  r.malloc_latency = summarize(malloc_ns);
  r.free_latency = summarize(free_ns);
  return r;
}

replay_result replay_on_host(const event_log& log, std::string_view strategy, std::size_t capacity,
                             const replay_options& options) {
  pool::host_resource host{capacity};
  auto alloc = pool::make_allocator(strategy, host);
  return replay(log, *alloc, options);
}

std::string replay_result::to_text() const {
  char buf[2048];
  const int n = std::snprintf(
      buf, sizeof buf,
      "allocator            %s%s\n"
      "records              %zu (malloc %" PRIu64 ", free %" PRIu64 ", skipped %" PRIu64
      ")\n"
      "failed allocations   %" PRIu64 " (recorded failures %" PRIu64
      ")\n"
      "unknown frees        %" PRIu64 " (frees of failed blocks %" PRIu64 ", implied frees %" PRIu64
      ")\n"
      "live at end          %" PRIu64
      "\n"
      "peak requested       %s\n"
      "peak reserved        %s\n"
      "upstream calls       %" PRIu64 " allocs, %" PRIu64
      " frees\n"
      "malloc latency       p50 %.0f ns, p99 %.0f ns, max %.0f ns\n"
      "free latency         p50 %.0f ns, p99 %.0f ns, max %.0f ns\n"
      "summary: peak reserved / peak requested = %.3f, %" PRIu64 " failed allocations\n",
      allocator.c_str(), completed ? "" : " (stopped early)", records, mallocs, frees,
      skipped_records, failed_allocations, recorded_failures, unknown_frees, frees_of_failed,
      implied_frees, live_at_end, format_bytes(peak_requested).c_str(),
      format_bytes(peak_reserved).c_str(), upstream_allocs, upstream_frees, malloc_latency.p50_ns,
      malloc_latency.p99_ns, malloc_latency.max_ns, free_latency.p50_ns, free_latency.p99_ns,
      free_latency.max_ns, ratio, failed_allocations);
  return std::string(
      buf, n > 0 ? std::min<std::size_t>(static_cast<std::size_t>(n), sizeof buf - 1) : 0);
}

std::string replay_result::to_json() const {
  nlohmann::ordered_json j;
  j["allocator"] = allocator;
  j["completed"] = completed;
  j["records"] = records;
  j["mallocs"] = mallocs;
  j["frees"] = frees;
  j["failed_allocations"] = failed_allocations;
  j["unknown_frees"] = unknown_frees;
  j["implied_frees"] = implied_frees;
  j["frees_of_failed"] = frees_of_failed;
  j["recorded_failures"] = recorded_failures;
  j["skipped_records"] = skipped_records;
  j["live_at_end"] = live_at_end;
  j["dropped_events"] = dropped_events;
  j["peak_requested"] = peak_requested;
  j["peak_reserved"] = peak_reserved;
  j["peak_in_use"] = peak_in_use;
  j["ratio"] = ratio;
  j["upstream_allocs"] = upstream_allocs;
  j["upstream_frees"] = upstream_frees;
  j["malloc_latency"] = latency_json(malloc_latency);
  j["free_latency"] = latency_json(free_latency);
  j["final_stats"] = nlohmann::ordered_json::parse(final_stats.to_json());
  return j.dump(2);
}

}  // namespace poolscope::analysis
