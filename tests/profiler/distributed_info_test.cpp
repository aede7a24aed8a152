// A rank's trace says who wrote it: distributedInfo (rank, world_size, host, devices, the clock
// samples added) as the top-level member Holistic Trace Analysis reads; sample_barriers reads the
// clock around each barrier; the timeline refuses samples it cannot write. And samples added
// from several threads while events flow all reach the trace.
#include "poolscope/profiler/distributed_info.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "trace_test_util.hpp"

namespace {

using nlohmann::json;
using poolscope::profiler::clock_sync_round;
using poolscope::profiler::distributed_info;
using poolscope::profiler::sample_barriers;
using poolscope::profiler::timeline;
using poolscope::profiler::testing::read_events;
using poolscope::profiler::testing::temp_file;

TEST(distributed_info, sample_barriers_reads_the_clock_around_each_barrier) {
  std::vector<std::uint64_t> inside;
  const auto rounds = sample_barriers([&] { inside.push_back(poolscope::hooks::now_ns()); }, 5);
  ASSERT_EQ(rounds.size(), 5U);
  ASSERT_EQ(inside.size(), 5U);
  for (std::size_t k = 0; k < rounds.size(); ++k) {
    EXPECT_LE(rounds[k].before_ns, inside[k]);
    EXPECT_GE(rounds[k].after_ns, inside[k]);
    if (k > 0) {
      EXPECT_GE(rounds[k].before_ns, rounds[k - 1].after_ns);
    }
  }
  EXPECT_THROW((void)sample_barriers([] {}, 0), poolscope::invalid_argument);
  EXPECT_THROW((void)sample_barriers([] { throw poolscope::runtime_error("peer gone"); }, 2),
               poolscope::runtime_error);
}

TEST(distributed_info, rank_trace_carries_distributed_info_and_clock_samples) {
  temp_file f(".json");
  timeline tl{{.trace_path = f.path(),
               .cupti = false,
               .distributed = distributed_info{.rank = 2,
                                               .world_size = 3,
                                               .backend = "mpi",
                                               .host = "node-a",
                                               .devices = {"host device 2", "host \"3\""}}}};
  tl.start();
  const std::vector<clock_sync_round> start{{10, 20}, {30, 45}};
  const std::vector<clock_sync_round> end{{1000, 1200}};
  tl.add_clock_sync("start", start);
  tl.add_clock_sync("end", end);
  EXPECT_THROW(tl.add_clock_sync("", end), poolscope::invalid_argument);
  EXPECT_THROW(tl.add_clock_sync("empty", {}), poolscope::invalid_argument);
  tl.stop();
  EXPECT_THROW(tl.add_clock_sync("late", end), poolscope::logic_error);
  poolscope::analysis::trace_read_info info;
  (void)read_events(f.path(), &info);
  const json& d = info.other.at("distributedInfo");
  EXPECT_EQ(d.at("rank"), 2);
  EXPECT_EQ(d.at("world_size"), 3);
  EXPECT_EQ(d.at("backend"), "mpi");
  EXPECT_EQ(d.at("host"), "node-a");
  EXPECT_EQ(d.at("pid"), ::getpid());
  EXPECT_EQ(d.at("devices"), json({"host device 2", "host \"3\""}));
  EXPECT_EQ(d.at("clock_sync"), json::parse(R"([{"label":"start","rounds":[[10,20],[30,45]]},)"
                                            R"({"label":"end","rounds":[[1000,1200]]}])"));
  EXPECT_TRUE(info.other.at("otherData").contains("origin_ns"));
}

TEST(distributed_info, a_trace_of_one_process_has_none) {
  temp_file f(".json");
  timeline tl{{.trace_path = f.path(), .cupti = false}};
  tl.start();
  EXPECT_THROW(tl.add_clock_sync("start", std::vector<clock_sync_round>{{1, 2}}),
               poolscope::logic_error);
  tl.stop();
  poolscope::analysis::trace_read_info info;
  (void)read_events(f.path(), &info);
  EXPECT_FALSE(info.other.contains("distributedInfo"));
}

// Clock samples from several threads while host slices flow: every sample is in the trace.
TEST(distributed_info_concurrency, samples_from_several_threads_all_reach_the_trace) {
  temp_file f(".json");
  timeline tl{{.trace_path = f.path(), .cupti = false, .distributed = distributed_info{}}};
  tl.start();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&tl, t] {
      for (int i = 0; i < 50; ++i) {
        const std::uint64_t now = poolscope::hooks::now_ns();
        tl.add_host_slice({.name = "work", .begin_ns = now, .end_ns = now + 1});
        tl.add_clock_sync("t" + std::to_string(t) + "." + std::to_string(i),
                          std::vector<clock_sync_round>{{now, now + 1}});
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  tl.stop();
  poolscope::analysis::trace_read_info info;
  (void)read_events(f.path(), &info);
  std::set<std::string> labels;
  for (const json& s : info.other.at("distributedInfo").at("clock_sync")) {
    labels.insert(s.at("label").get<std::string>());
  }
  EXPECT_EQ(labels.size(), 200U);
  EXPECT_TRUE(labels.contains("t3.49"));
}

}  // namespace
