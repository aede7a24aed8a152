// replay: peaks and failures of a replayed log against independent models of the allocators.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "poolscope/analysis/event_log.hpp"
#include "poolscope/analysis/replay.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"

namespace poolscope::analysis {
namespace {

using hooks::event_kind;
using hooks::event_phase;

log_record malloc_rec(std::uint64_t ptr, std::size_t size) {
  log_record r;
  r.kind = event_kind::pool_malloc;
  r.phase = event_phase::post;
  r.ptr = ptr;
  r.size = size;
  return r;
}
log_record free_rec(std::uint64_t ptr, std::size_t size) {
  log_record r;
  r.kind = event_kind::pool_free;
  r.phase = event_phase::pre;
  r.ptr = ptr;
  r.size = size;
  return r;
}

event_log make_log(std::vector<log_record> records) {
  event_log log;
  log.allocators = {"recorded"};
  for (std::size_t i = 0; i < records.size(); ++i) {
    records[i].seq = i;
    records[i].line = i + 1;
  }
  log.records = std::move(records);
  return log;
}

/// What an allocator model says about a log.
struct model_result {
  std::size_t peak_requested = 0;
  std::size_t peak_reserved = 0;
  std::uint64_t failed = 0;
  std::uint64_t upstream_allocs = 0;
};

/// naive: reserved == requested; an allocation fails if live + size > capacity.
model_result naive_model(const event_log& log, std::size_t capacity) {
  model_result m;
  std::unordered_map<std::uint64_t, std::size_t> live;  // 0 bytes: failed
  std::size_t used = 0;
  for (const auto& r : log.records) {
    if (r.kind == event_kind::pool_malloc) {
      if (used + r.size > capacity) {
        ++m.failed;
        live[r.ptr] = 0;
        continue;
      }
      used += r.size;
      live[r.ptr] = r.size;
      ++m.upstream_allocs;
      m.peak_requested = std::max(m.peak_requested, used);
    } else if (r.kind == event_kind::pool_free) {
      auto it = live.find(r.ptr);
      if (it != live.end()) {
        used -= it->second;
        live.erase(it);
      }
    }
  }
  m.peak_reserved = m.peak_requested;
  return m;
}

/// best_fit (CuPy's first pool): round to 512; a freed block is cached by its rounded size and
/// reused only for that size; on upstream failure, release the cache and retry once.
model_result best_fit_model(const event_log& log, std::size_t capacity) {
  model_result m;
  std::map<std::size_t, std::size_t> cached;                                    // rounded -> blocks
  std::unordered_map<std::uint64_t, std::pair<std::size_t, std::size_t>> live;  // (req, rounded)
  std::size_t reserved = 0;
  std::size_t requested = 0;
  for (const auto& r : log.records) {
    if (r.kind == event_kind::pool_malloc) {
      const std::size_t rounded = (r.size + 511) / 512 * 512;
      if (cached[rounded] > 0) {
        --cached[rounded];
      } else {
        if (reserved + rounded > capacity) {
          for (auto& [size, n] : cached) {
            reserved -= size * n;
            n = 0;
          }
        }
        if (reserved + rounded > capacity) {
          ++m.failed;
          live[r.ptr] = {0, 0};
          continue;
        }
        reserved += rounded;
        ++m.upstream_allocs;
      }
      requested += r.size;
      live[r.ptr] = {r.size, rounded};
      m.peak_requested = std::max(m.peak_requested, requested);
      m.peak_reserved = std::max(m.peak_reserved, reserved);
    } else if (r.kind == event_kind::pool_free) {
      auto it = live.find(r.ptr);
      if (it != live.end() && it->second.second != 0) {
        requested -= it->second.first;
        ++cached[it->second.second];
      }
      if (it != live.end()) {
        live.erase(it);
      }
    }
  }
  return m;
}

/// A hand-made log: sizes chosen so best_fit's exact-size reuse matters.
event_log hand_log() {
  return make_log({
      malloc_rec(0xa, 1000),   // best_fit: 1024 new            req 1000   res 1024
      malloc_rec(0xb, 3000),   // 3072 new                      req 4000   res 4096
      free_rec(0xa, 1000),     // 1024 cached                   req 3000
      malloc_rec(0xc, 600),    // 1024 reused                   req 3600
      malloc_rec(0xd, 2000),   // 2048 new                      req 5600   res 6144
      free_rec(0xb, 3000),     // 3072 cached                   req 2600
      malloc_rec(0xe, 2900),   // 3072 reused                   req 5500
      malloc_rec(0xf, 100),    // 512 new                       req 5600   res 6656
      free_rec(0xc, 600),      //                               req 5000
      free_rec(0xd, 2000),     //                               req 3000
      malloc_rec(0x10, 5000),  // 5120 new                      req 8000   res 11776
      free_rec(0xe, 2900),
      free_rec(0xf, 100),
      free_rec(0x10, 5000),
  });
}

TEST(replay, hand_log_on_naive_matches_the_model) {
  const event_log log = hand_log();
  const replay_result r = replay_on_host(log, "naive");
  const model_result m = naive_model(log, SIZE_MAX);
  EXPECT_EQ(r.peak_requested, m.peak_requested);
  EXPECT_EQ(r.peak_requested, 8000u);  // by hand: 0xe 2900 + 0xf 100 + 0x10 5000
  EXPECT_EQ(r.peak_reserved, m.peak_reserved);
  EXPECT_DOUBLE_EQ(r.ratio, 1.0);
  EXPECT_EQ(r.upstream_allocs, m.upstream_allocs);
  EXPECT_EQ(r.mallocs, 7u);
  EXPECT_EQ(r.frees, 7u);
  EXPECT_EQ(r.failed_allocations, 0u);
  EXPECT_EQ(r.unknown_frees, 0u);
  EXPECT_EQ(r.live_at_end, 0u);
  EXPECT_EQ(r.records, log.records.size());
  EXPECT_TRUE(r.completed);
  EXPECT_EQ(r.malloc_latency.count, 7u);
  EXPECT_EQ(r.free_latency.count, 7u);
  EXPECT_LE(r.malloc_latency.p50_ns, r.malloc_latency.p99_ns);
  EXPECT_LE(r.malloc_latency.p99_ns, r.malloc_latency.max_ns);
}

TEST(replay, hand_log_on_best_fit_matches_the_model) {
  const event_log log = hand_log();
  const replay_result r = replay_on_host(log, "best_fit");
  const model_result m = best_fit_model(log, SIZE_MAX);
  EXPECT_EQ(r.peak_requested, m.peak_requested);
  EXPECT_EQ(r.peak_reserved, m.peak_reserved);
  EXPECT_EQ(r.peak_reserved, 11776u);  // by hand, see hand_log
  EXPECT_EQ(r.upstream_allocs, m.upstream_allocs);
  EXPECT_EQ(r.upstream_allocs, 5u);
  EXPECT_DOUBLE_EQ(r.ratio, 11776.0 / 8000.0);
  EXPECT_EQ(r.allocator, "best_fit/host");
}

TEST(replay, random_logs_match_the_models) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<log_record> records;
  std::vector<std::pair<std::uint64_t, std::size_t>> live;
  std::uint64_t next_ptr = 0x1000;
  for (int i = 0; i < 3000; ++i) {
    if (live.empty() || rng() % 100 < 55) {
      const std::size_t size = 1 + rng() % 20000;
      records.push_back(malloc_rec(next_ptr, size));
      live.emplace_back(next_ptr, size);
      next_ptr += 0x10000;
    } else {
      const std::size_t k = rng() % live.size();
      records.push_back(free_rec(live[k].first, live[k].second));
      live[k] = live.back();
      live.pop_back();
    }
  }
  const event_log log = make_log(records);
  for (std::size_t capacity : {SIZE_MAX, std::size_t{4} << 20}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const model_result n = naive_model(log, capacity);
    const replay_result rn = replay_on_host(log, "naive", capacity);
    EXPECT_EQ(rn.peak_requested, n.peak_requested);
    EXPECT_EQ(rn.failed_allocations, n.failed);
    const model_result b = best_fit_model(log, capacity);
    const replay_result rb = replay_on_host(log, "best_fit", capacity);
    EXPECT_EQ(rb.peak_requested, b.peak_requested);
    EXPECT_EQ(rb.peak_reserved, b.peak_reserved);
    EXPECT_EQ(rb.failed_allocations, b.failed);
    EXPECT_EQ(rb.upstream_allocs, b.upstream_allocs);
  }
}

TEST(replay, capacity_gives_the_expected_failed_allocations) {
  // Capacity 4096: by hand on naive, 0xb (3500 with 1000 live) fails, so does 0xd after 0xc.
  const event_log log = make_log({
      malloc_rec(0xa, 1000),  // live 1000
      malloc_rec(0xb, 3500),  // 4500 > 4096: fails
      malloc_rec(0xc, 3000),  // live 4000
      malloc_rec(0xd, 200),   // 4200 > 4096: fails
      free_rec(0xb, 3500),    // a free of a failed block
      free_rec(0xa, 1000),    // live 3000
      malloc_rec(0xe, 1000),  // live 4000
      free_rec(0x99, 5),      // never allocated
      free_rec(0xc, 3000),
      free_rec(0xe, 1000),
  });
  const replay_result r = replay_on_host(log, "naive", 4096);
  EXPECT_EQ(r.failed_allocations, 2u);
  EXPECT_EQ(r.frees_of_failed, 1u);
  EXPECT_EQ(r.unknown_frees, 1u);
  EXPECT_EQ(r.mallocs, 5u);
  EXPECT_EQ(r.frees, 3u);  // 0xa, 0xc, 0xe
  EXPECT_EQ(r.peak_requested, 4000u);
  EXPECT_EQ(r.live_at_end, 0u);  // 0xd failed and was never freed: it holds nothing
  EXPECT_EQ(naive_model(log, 4096).failed, 2u);
}

TEST(replay, a_malloc_of_a_live_pointer_frees_its_block_first_and_is_counted) {
  // 0xa's free is missing from the log: its block is freed when 0xa is allocated again, so the
  // peak is the larger of the two sizes, not their sum, and nothing is left at the end.
  const event_log log = make_log({
      malloc_rec(0xa, 1000),
      malloc_rec(0xb, 300),  // live 1300
      malloc_rec(0xa, 500),  // 0xa's 1000 freed first: live 800
      free_rec(0xa, 500),
      free_rec(0xb, 300),
  });
  const replay_result r = replay_on_host(log, "naive");
  EXPECT_EQ(r.implied_frees, 1u);
  EXPECT_EQ(r.unknown_frees, 0u);
  EXPECT_EQ(r.mallocs, 3u);
  EXPECT_EQ(r.frees, 3u);  // passed to the allocator: the two logged and the implied one
  EXPECT_EQ(r.peak_requested, 1300u);
  EXPECT_EQ(r.live_at_end, 0u);
  EXPECT_EQ(r.upstream_allocs, r.upstream_frees);  // naive: every block went back
  EXPECT_NE(r.to_text().find("implied frees 1)"), std::string::npos) << r.to_text();
  EXPECT_NE(r.to_json().find("\"implied_frees\": 1"), std::string::npos) << r.to_json();
}

TEST(replay, other_records_and_allocators_are_skipped) {
  event_log log = make_log({malloc_rec(0xa, 100), malloc_rec(0xb, 200), free_rec(0xa, 100)});
  log.allocators.push_back("inner");
  log.records[1].allocator = 1;
  log_record oom;
  oom.kind = event_kind::oom;
  oom.phase = event_phase::instant;
  oom.size = 1 << 30;
  log.records.push_back(oom);
  log_record dev;
  dev.kind = event_kind::device_alloc;
  dev.ptr = 0x77;
  dev.size = 4096;
  log.records.push_back(dev);
  const replay_result all = replay_on_host(log, "naive");
  EXPECT_EQ(all.mallocs, 2u);
  EXPECT_EQ(all.recorded_failures, 1u);
  EXPECT_EQ(all.skipped_records, 1u);
  EXPECT_EQ(all.live_at_end, 1u);
  EXPECT_EQ(all.peak_requested, 300u);
  const replay_result outer =
      replay_on_host(log, "naive", SIZE_MAX, {.only_allocator = "recorded"});
  EXPECT_EQ(outer.mallocs, 1u);
  EXPECT_EQ(outer.peak_requested, 100u);
  EXPECT_EQ(outer.skipped_records, 2u);
  EXPECT_THROW((void)replay_on_host(log, "naive", SIZE_MAX, {.only_allocator = "nope"}),
               invalid_argument);
  EXPECT_THROW((void)replay_on_host(log, "no_such_strategy"), invalid_argument);
}

TEST(replay, progress_reports_and_can_stop) {
  std::vector<log_record> records;
  for (std::uint64_t i = 0; i < 100; ++i) {
    records.push_back(malloc_rec(0x1000 + i, 64));
  }
  const event_log log = make_log(records);
  std::vector<std::size_t> seen;
  replay_options opt;
  opt.progress_every = 10;
  opt.progress = [&](const replay_progress& p) {
    EXPECT_EQ(p.total, 100u);
    seen.push_back(p.done);
    return true;
  };
  const replay_result r = replay_on_host(log, "naive", SIZE_MAX, opt);
  EXPECT_TRUE(r.completed);
  ASSERT_EQ(seen.size(), 10u);  // at 10, 20, ..., 90 and once at the end
  EXPECT_EQ(seen.front(), 10u);
  EXPECT_EQ(seen.back(), 100u);
  EXPECT_EQ(r.live_at_end, 100u);

  opt.progress = [](const replay_progress& p) { return p.done < 30; };
  const replay_result stopped = replay_on_host(log, "naive", SIZE_MAX, opt);
  EXPECT_FALSE(stopped.completed);
  EXPECT_EQ(stopped.records, 30u);
  EXPECT_EQ(stopped.mallocs, 30u);
}

TEST(replay, rmm_csv_log_replays) {
  const event_log log = parse_event_log_text(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,00:00:00.000001,allocate,0x100,1024,0x0\n"
      "1,00:00:00.000002,allocate,0x200,2048,0x0\n"
      "1,00:00:00.000003,allocate failure,0x0,99999999999,0x0\n"
      "1,00:00:00.000004,free,0x100,1024,0x0\n"
      "1,00:00:00.000005,free,0x200,2048,0x0\n");
  std::vector<std::uint64_t> streams;
  replay_options opt;
  opt.map_stream = [&](std::uint64_t s) {
    streams.push_back(s);
    return stream_view{};
  };
  const replay_result r = replay_on_host(log, "best_fit", SIZE_MAX, opt);
  EXPECT_EQ(r.peak_requested, 3072u);
  EXPECT_EQ(r.recorded_failures, 1u);
  EXPECT_EQ(r.failed_allocations, 0u);
  EXPECT_EQ(streams.size(), 4u);
  const std::string json = r.to_json();
  EXPECT_NE(json.find("\"peak_requested\": 3072"), std::string::npos) << json;
  const std::string text = r.to_text();
  EXPECT_NE(text.find("summary: "), std::string::npos) << text;
}

}  // namespace
}  // namespace poolscope::analysis
