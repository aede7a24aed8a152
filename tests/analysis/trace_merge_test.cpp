// `trace merge`: clock offsets estimated from barrier samples against a known offset (simulated
// barriers, randomized), and two hand-written rank traces merged: processes, tracks, ids, times on
// the reference clock, the piece flow, the summary per rank; and the inputs refused.
#include "poolscope/analysis/trace_merge.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/analysis/trace_summary.hpp"
#include "poolscope/error.hpp"
#include "profiler/trace_test_util.hpp"

namespace {

using nlohmann::json;
using poolscope::analysis::estimate_clock_offset;
using poolscope::analysis::merge_traces;
using poolscope::analysis::rank_pid;
using poolscope::profiler::clock_sync_round;
using poolscope::profiler::testing::temp_file;

// Barriers of two ranks on true time: each enters at its own time, nobody leaves before the last
// entered, each leaves some time after. The rank's clock reads true + offset.
struct simulated_sync {
  std::vector<clock_sync_round> reference, rank;
};
simulated_sync simulate(std::mt19937_64& rng, std::int64_t offset, int rounds) {
  std::uniform_int_distribution<std::int64_t> late(0, 50'000);
  std::uniform_int_distribution<std::int64_t> exit(100, 5'000);
  simulated_sync s;
  std::int64_t t0 = 1'000'000'000;  // true time the reference enters round 0
  std::int64_t t1 = t0 + late(rng);
  for (int k = 0; k < rounds; ++k) {
    const std::int64_t last = std::max(t0, t1);
    const std::int64_t out0 = last + exit(rng);
    const std::int64_t out1 = last + exit(rng);
    s.reference.push_back({static_cast<std::uint64_t>(t0), static_cast<std::uint64_t>(out0)});
    s.rank.push_back(
        {static_cast<std::uint64_t>(t1 + offset), static_cast<std::uint64_t>(out1 + offset)});
    t0 = out0 + 30;
    t1 = out1 + 30;
  }
  return s;
}

TEST(trace_merge, clock_offset_bounds_the_true_offset) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> offsets(-5'000'000'000, 5'000'000'000);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t offset = offsets(rng);
    const simulated_sync s = simulate(rng, offset, 1 + trial % 8);
    const auto o = estimate_clock_offset(s.reference, s.rank);
    EXPECT_TRUE(o.consistent);
    EXPECT_LE(std::llabs(o.offset_ns - offset), o.uncertainty_ns) << trial;
    // Each round bounds by both ranks' time in its barrier: later rounds, entered
    // together, are narrow.
    if (trial % 8 >= 2) {
      EXPECT_LE(o.uncertainty_ns, 7'500) << trial;
    }
    EXPECT_EQ(o.at_ns, static_cast<std::int64_t>(s.rank.back().after_ns));
  }
}

TEST(trace_merge, clock_offset_refuses_samples_that_do_not_pair) {
  const std::vector<clock_sync_round> two{{10, 20}, {30, 40}};
  const std::vector<clock_sync_round> one{{10, 20}};
  const std::vector<clock_sync_round> backwards{{10, 20}, {40, 30}};
  EXPECT_THROW((void)estimate_clock_offset(two, one), poolscope::invalid_argument);
  EXPECT_THROW((void)estimate_clock_offset({}, {}), poolscope::invalid_argument);
  EXPECT_THROW((void)estimate_clock_offset(two, backwards), poolscope::invalid_argument);
  // Rounds that disagree (a clock stepped between them): the narrowest alone.
  const std::vector<clock_sync_round> stepped{{10, 20}, {1030, 1040}};
  const auto o = estimate_clock_offset(two, stepped);
  EXPECT_FALSE(o.consistent);
  EXPECT_EQ(o.offset_ns, 0);  // round 0: [10 - 20, 20 - 10]
  EXPECT_EQ(o.uncertainty_ns, 10);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A rank's trace: its origin, events (ts in µs since the origin), distributedInfo.
std::string rank_trace(int rank, const std::string& host, std::uint64_t origin_ns,
                       const std::string& events, const std::string& clock_sync) {
  return R"({"traceEvents":[)" + events + R"(],"displayTimeUnit":"ns","otherData":{"origin_ns":)" +
         std::to_string(origin_ns) + R"(},"distributedInfo":{"backend":"mpi","rank":)" +
         std::to_string(rank) + R"(,"world_size":2,"host":")" + host + R"(","pid":)" +
         std::to_string(4000 + rank) + R"(,"devices":["host device )" + std::to_string(rank) +
         R"("],"clock_sync":)" + clock_sync + "}}";
}

std::string sync_text(const std::vector<clock_sync_round>& rounds) {
  json r = json::array();
  for (const auto& x : rounds) {
    r.push_back({x.before_ns, x.after_ns});
  }
  return json::array({{{"label", "start"}, {"rounds", r}}}).dump();
}

// Two ranks on two hosts, rank 1's clock 7 ms ahead: rank 0 sends a piece 0->1 (true time
// 1.000100 s to 1.000150 s), rank 1 receives it (1.000120 s to 1.000200 s: `receive_ts` 70 µs
// and `receive_dur` 80 µs after its origin); `extra_send` adds a second send 0->1 that no rank
// receives; `clock_error_ns` (when not 0) is both slices' args.clock_error_ns, as GPU spans carry;
// `wide_syncs`: barriers whose exits scatter over 60 us, an alignment known only that well.
struct two_ranks {
  temp_file r0{".json"}, r1{".json"}, out{".json"};
  static constexpr std::int64_t offset = 7'000'000;
  explicit two_ranks(const std::string& receive_ts = "70.000",
                     const std::string& receive_dur = "80.000", bool extra_send = false,
                     int clock_error_ns = 0, bool wide_syncs = false) {
    const std::string error =
        clock_error_ns == 0 ? "" : ",\"clock_error_ns\":" + std::to_string(clock_error_ns);
    const std::vector<clock_sync_round> ref =
        wide_syncs
            ? std::vector<clock_sync_round>{{999'000'000, 999'060'000}, {999'060'030, 999'120'000}}
            : std::vector<clock_sync_round>{{999'000'000, 999'000'500}, {999'000'530, 999'000'900}};
    std::vector<clock_sync_round> mine;
    for (const auto& x : wide_syncs ? std::vector<clock_sync_round>{{999'000'100, 999'060'100},
                                                                    {999'060'130, 999'120'100}}
                                    : std::vector<clock_sync_round>{{999'000'100, 999'000'600},
                                                                    {999'000'630, 999'000'950}}) {
      mine.push_back({x.before_ns + offset, x.after_ns + offset});
    }
    // Rank 0: origin 1 s; a send on its transfer thread, a kernel on GPU 0's stream 7, a counter
    // there, a launch flow (id 5) from its host thread.
    write_text(
        r0.path(),
        rank_trace(0, "a", 1'000'000'000,
                   R"j({"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"host: x"}},
{"ph":"M","name":"thread_name","pid":1,"tid":10,"args":{"name":"transfer"}},
{"ph":"M","name":"thread_name","pid":1,"tid":11,"args":{"name":"main"}},
{"ph":"M","name":"process_name","pid":100,"tid":0,"args":{"name":"GPU 0: H"}},
{"ph":"M","name":"thread_name","pid":100,"tid":7,"args":{"name":"stream 7"}},
{"ph":"X","name":"darray.send 0->1 1 MiB","cat":"darray.transfer","pid":1,"tid":10,"ts":100.000,"dur":50.000,"args":{"device":0,"src_device":0,"dst_device":1)j" +
                       error + "}}," +
                       std::string(extra_send ? R"j(
{"ph":"X","name":"darray.send 0->1 1 MiB","cat":"darray.transfer","pid":1,"tid":10,"ts":160.000,"dur":5.000,"args":{"device":0,"src_device":0,"dst_device":1}},)j"
                                              : "") +
                       R"j(
{"ph":"X","name":"launch","cat":"cuda_api","pid":1,"tid":11,"ts":1.000,"dur":2.000},
{"ph":"s","name":"launch","cat":"launch","pid":1,"tid":11,"ts":1.500,"id":5},
{"ph":"X","name":"k","cat":"kernel","pid":100,"tid":7,"ts":5.000,"dur":10.000,"args":{"device":0}},
{"ph":"f","name":"launch","cat":"launch","pid":100,"tid":7,"ts":5.000,"id":5,"bp":"e"},
{"ph":"C","name":"memory (all pools)","pid":100,"tid":0,"ts":5.000,"args":{"in_use":1}})j",
                   sync_text(ref)));
    // Rank 1: origin 1.000050 s true (its clock: + offset); the receive on its thread 20, a
    // launch flow with the same id 5.
    write_text(
        r1.path(),
        rank_trace(1, "b", 1'000'050'000 + offset,
                   R"({"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"host: x"}},
{"ph":"M","name":"thread_name","pid":1,"tid":20,"args":{"name":"transfer"}},
{"ph":"X","name":"darray.receive 0->1 1 MiB","cat":"darray.transfer","pid":1,"tid":20,"ts":)" +
                       receive_ts + R"(,"dur":)" + receive_dur +
                       R"(,"args":{"device":1,"src_device":0,"dst_device":1)" + error + R"(}},
{"ph":"s","name":"launch","cat":"launch","pid":1,"tid":20,"ts":80.000,"id":5},
{"ph":"f","name":"launch","cat":"launch","pid":1,"tid":20,"ts":90.000,"id":5,"bp":"e"})",
                   sync_text(mine)));
  }
};

json events_of(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(trace_merge, two_ranks_on_one_timeline) {
  two_ranks t;
  const auto r = merge_traces({t.r1.path(), t.r0.path()}, t.out.path());  // any order
  ASSERT_EQ(r.ranks.size(), 2U);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.flows, 1U);
  EXPECT_EQ(r.unmatched_transfers, 0U);
  ASSERT_EQ(r.ranks[1].syncs.size(), 1U);
  const auto& o = r.ranks[1].syncs[0];
  EXPECT_FALSE(o.same_host);
  EXPECT_LE(std::llabs(o.offset_ns - two_ranks::offset), o.uncertainty_ns);
  EXPECT_TRUE(r.clocks_measured);

  const auto check = poolscope::analysis::check_trace(t.out.path());
  EXPECT_TRUE(check.ok()) << check.to_text();
  const json doc = events_of(t.out.path());
  std::map<std::int64_t, std::string> processes;
  std::map<std::pair<std::int64_t, std::int64_t>, std::string> threads;
  const json* send = nullptr;
  const json* receive = nullptr;
  std::vector<json> launch_flows, piece_flows;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      processes[e["pid"]] = e["args"]["name"];
    } else if (e["ph"] == "M" && e["name"] == "thread_name") {
      threads[{e["pid"], e["tid"]}] = e["args"]["name"];
    } else if (e["ph"] == "X" && e["name"].get<std::string>().starts_with("darray.send")) {
      send = &e;
    } else if (e["ph"] == "X" && e["name"].get<std::string>().starts_with("darray.receive")) {
      receive = &e;
    } else if (e.value("cat", "") == "launch") {
      launch_flows.push_back(e);
    } else if (e.value("cat", "") == "darray.piece") {
      piece_flows.push_back(e);
    } else if (e["ph"] == "C") {
      EXPECT_EQ(e["name"], "GPU 0: H: memory (all pools)");
      EXPECT_EQ(e["pid"], rank_pid(0));
    }
  }
  // A process per rank, named after rank, host, pid and devices.
  ASSERT_EQ(processes.size(), 2U);
  EXPECT_EQ(processes[rank_pid(0)], "rank 0: a (pid 4000), host device 0");
  EXPECT_EQ(processes[rank_pid(1)], "rank 1: b (pid 4001), host device 1");
  EXPECT_EQ((threads[{rank_pid(0), 10}]), "transfer");
  EXPECT_EQ((threads[{rank_pid(0), std::int64_t{1} << 30}]), "GPU 0: H: stream 7");
  // Times on rank 0's clock, from the earliest origin (rank 0's, 1 s): the send at 100 µs, the
  // receive at 50 + 70 = 120 µs true, give or take the offset's uncertainty.
  ASSERT_NE(send, nullptr);
  ASSERT_NE(receive, nullptr);
  EXPECT_DOUBLE_EQ((*send)["ts"].get<double>(), 100.0);
  EXPECT_EQ((*send)["pid"], rank_pid(0));
  EXPECT_EQ((*receive)["pid"], rank_pid(1));
  const double error_us = static_cast<double>(o.offset_ns - two_ranks::offset) / 1000.0;
  EXPECT_NEAR((*receive)["ts"].get<double>(), 120.0 - error_us, 1e-9);
  EXPECT_NEAR((*receive)["dur"].get<double>(), 80.0, 1e-9);
  // The launch flows of the two ranks keep apart (id 5 on both): 5 * 2 + rank.
  ASSERT_EQ(launch_flows.size(), 4U);
  std::set<std::uint64_t> ids;
  for (const json& e : launch_flows) {
    ids.insert(e["id"].get<std::uint64_t>());
    EXPECT_EQ(e["id"].get<std::uint64_t>() % 2,
              static_cast<std::uint64_t>(e["pid"].get<std::int64_t>() - rank_pid(0)));
  }
  EXPECT_EQ(ids, (std::set<std::uint64_t>{10, 11}));
  // The piece's flow: from the send's start on rank 0 to the receive's end on rank 1.
  ASSERT_EQ(piece_flows.size(), 2U);
  EXPECT_EQ(piece_flows[0]["ph"], "s");
  EXPECT_EQ(piece_flows[0]["pid"], rank_pid(0));
  EXPECT_EQ(piece_flows[0]["tid"], 10);
  EXPECT_DOUBLE_EQ(piece_flows[0]["ts"].get<double>(), 100.0);
  EXPECT_EQ(piece_flows[1]["ph"], "f");
  EXPECT_EQ(piece_flows[1]["pid"], rank_pid(1));
  EXPECT_NEAR(piece_flows[1]["ts"].get<double>(), 200.0 - error_us, 1e-9);
  EXPECT_EQ(piece_flows[0]["id"], piece_flows[1]["id"]);
  EXPECT_FALSE(ids.contains(piece_flows[0]["id"].get<std::uint64_t>()));
  EXPECT_EQ(doc["otherData"]["merged"]["flows"], 1);
}

// A send and a receive left without a flow are told apart: one with no other end in any input,
// and a pair whose receive ends (on the aligned clocks) before its send began.
TEST(trace_merge, sends_and_receives_left_unjoined_say_why) {
  {
    two_ranks t("70.000", "80.000", true);  // a second send that no rank receives
    const auto r = merge_traces({t.r0.path(), t.r1.path()}, t.out.path());
    EXPECT_EQ(r.flows, 1U);
    EXPECT_EQ(r.unmatched_transfers, 1U);
    EXPECT_EQ(r.reversed_transfers, 0U);
    EXPECT_NE(r.to_text().find("(1 transfers without their other end)"), std::string::npos)
        << r.to_text();
  }
  {
    two_ranks t("10.000", "20.000");  // true 1.000060 s to 1.000080 s: before the send's 1.000100
    const auto r = merge_traces({t.r0.path(), t.r1.path()}, t.out.path());
    EXPECT_EQ(r.flows, 0U);
    EXPECT_EQ(r.unmatched_transfers, 2U);
    EXPECT_EQ(r.reversed_transfers, 2U);
    const std::string text = r.to_text();
    EXPECT_EQ(text.find("without their other end"), std::string::npos) << text;
    EXPECT_NE(text.find("(2 transfers in pairs whose receive ends before its send began"),
              std::string::npos)
        << text;
    const auto s = poolscope::analysis::summarize_trace(t.out.path());
    ASSERT_TRUE(s.pieces.has_value());
    EXPECT_EQ(s.pieces->reversed_transfers, 2U);
    EXPECT_NE(s.to_text().find("piece flows between ranks: 0 (2 sends or receives left unjoined, "
                               "2 of them in pairs whose receive ends before its send began)"),
              std::string::npos)
        << s.to_text();
  }
}

// GPU spans come through a clock anchor known to some microseconds (args.clock_error_ns): a
// receive that ends before its send began by less than the two errors is joined, without a flow
// (no arrow goes back in time); by more, it is reversed as without errors.
TEST(trace_merge, a_reversal_within_the_clocks_errors_is_joined) {
  // The receive ends 20 us (true) before the send began.
  {
    two_ranks t("10.000", "20.000", false, 12'000);  // 24 us of error in all: joined
    const auto r = merge_traces({t.r0.path(), t.r1.path()}, t.out.path());
    EXPECT_EQ(r.flows, 0U);
    EXPECT_EQ(r.pairs_within_clock_error, 1U);
    EXPECT_EQ(r.unmatched_transfers, 0U);
    EXPECT_EQ(r.reversed_transfers, 0U);
    EXPECT_NE(r.to_text().find("0 piece flows between ranks and 1 pairs joined without one (the "
                               "receive ends before its send began, by less than the error of "
                               "their times: GPU clock anchors, clocks aligned between hosts)"),
              std::string::npos)
        << r.to_text();
    const json doc = events_of(t.out.path());
    for (const auto& e : doc["traceEvents"]) {
      EXPECT_NE(e.value("cat", ""), "darray.piece") << e.dump();
    }
    const auto s = poolscope::analysis::summarize_trace(t.out.path());
    ASSERT_TRUE(s.pieces.has_value());
    EXPECT_EQ(s.pieces->pairs_within_clock_error, 1U);
    EXPECT_NE(s.to_text().find("piece flows between ranks: 0 (0 sends or receives left unjoined); "
                               "1 pair(s) joined without a flow, reversed by less than the "
                               "error of their times"),
              std::string::npos)
        << s.to_text();
  }
  {
    two_ranks t("10.000", "20.000", false, 9'000);  // 18 us in all: still reversed
    const auto r = merge_traces({t.r0.path(), t.r1.path()}, t.out.path());
    EXPECT_EQ(r.flows, 0U);
    EXPECT_EQ(r.pairs_within_clock_error, 0U);
    EXPECT_EQ(r.reversed_transfers, 2U);
  }
  {
    // No GPU spans, but rank 1's host aligned to within tens of us: joined likewise.
    two_ranks t("10.000", "20.000", false, 0, true);
    const auto r = merge_traces({t.r0.path(), t.r1.path()}, t.out.path());
    EXPECT_GE(r.max_uncertainty_ns, 20'000);
    EXPECT_EQ(r.pairs_within_clock_error, 1U);
    EXPECT_EQ(r.unmatched_transfers, 0U);
  }
}

TEST(trace_merge, summary_of_a_merged_trace_is_per_rank) {
  two_ranks t;
  (void)merge_traces({t.r0.path(), t.r1.path()}, t.out.path());
  const auto s = poolscope::analysis::summarize_trace(t.out.path());
  ASSERT_EQ(s.ranks.size(), 2U);
  // Rank 0: device 0 with the kernel (10 µs) and its send (50 µs), which does not count on
  // device 1 there: device 1 is rank 1's.
  ASSERT_EQ(s.devices.size(), 2U);
  EXPECT_EQ(s.devices[0].rank, 0);
  EXPECT_EQ(s.devices[0].device, 0);
  EXPECT_EQ(s.devices[0].transfer_ns, 50'000U);
  EXPECT_EQ(s.devices[0].compute_ns, 10'000U);
  EXPECT_EQ(s.devices[1].rank, 1);
  EXPECT_EQ(s.devices[1].device, 1);
  EXPECT_EQ(s.devices[1].transfer_ns, 80'000U);
  EXPECT_EQ(s.ranks[0].name, "rank 0: a (pid 4000), host device 0");
  EXPECT_EQ(s.ranks[1].transfer_ns, 80'000U);
  EXPECT_EQ(s.ranks[1].both_ns, 0U);
  ASSERT_TRUE(s.clock.has_value());
  EXPECT_TRUE(s.clock->measured);
  EXPECT_GT(s.clock->max_skew_ns, 6'000'000);
  ASSERT_EQ(s.kernels.size(), 1U);
  EXPECT_EQ(s.kernels[0].rank, 0);
  const std::string text = s.to_text();
  EXPECT_NE(text.find("rank 1 device 1: window"), std::string::npos) << text;
  EXPECT_NE(text.find("  rank 0: 1 device(s), compute 10.000 us, transfer 50.000 us"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("estimated skew between hosts 7."), std::string::npos) << text;
  // The one piece: its send joined to its receive.
  ASSERT_TRUE(s.pieces.has_value());
  EXPECT_EQ(s.pieces->flows, 1U);
  EXPECT_EQ(s.pieces->unmatched_transfers, 0U);
  EXPECT_NE(text.find("piece flows between ranks: 1 (0 sends or receives left unjoined)"),
            std::string::npos)
      << text;
  EXPECT_EQ(s.to_json()["piece_flows"]["flows"], 1);
}

TEST(trace_merge, refuses_inputs_that_are_not_one_launch) {
  two_ranks t;
  EXPECT_THROW((void)merge_traces({}, t.out.path()), poolscope::invalid_argument);
  EXPECT_THROW((void)merge_traces({t.r0.path(), t.r0.path()}, t.out.path()),
               poolscope::invalid_argument);
  EXPECT_THROW((void)merge_traces({t.r0.path(), t.r1.path()}, t.r1.path()),
               poolscope::invalid_argument);
  // Two files of rank 0.
  temp_file again(".json");
  write_text(again.path(), rank_trace(0, "c", 5, "", "[]"));
  try {
    (void)merge_traces({t.r0.path(), again.path()}, t.out.path());
    ADD_FAILURE() << "two rank 0s merged";
  } catch (const poolscope::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("are both rank 0"), std::string::npos) << e.what();
  }
  // A rank of another launch's size.
  temp_file other(".json");
  std::string text = rank_trace(1, "c", 5, "", "[]");
  text.replace(text.find("\"world_size\":2"), 14, "\"world_size\":3");
  write_text(other.path(), text);
  EXPECT_THROW((void)merge_traces({t.r0.path(), other.path()}, t.out.path()),
               poolscope::invalid_argument);
}

// Ranks of one host read one clock: not shifted, whatever the barriers measured.
// A track a program named on its host process at a tid the merge would otherwise give a device
// track (darray's NCCL spans: 2^30 + device), seen after the device's events: the device track
// moves to a tid the host leaves free, and the two never share one.
TEST(trace_merge, device_tracks_move_to_tids_the_host_leaves_free) {
  two_ranks t;
  std::string text = poolscope::profiler::testing::read_bytes(t.r0.path());
  const std::string counter = R"j({"ph":"C","name":"memory (all pools)")j";
  ASSERT_NE(text.find(counter), std::string::npos);
  text.insert(
      text.find(counter),
      R"({"ph":"M","name":"thread_name","pid":1,"tid":1073741824,"args":{"name":"NCCL, device 0"}},
{"ph":"X","name":"span","cat":"darray.transfer","pid":1,"tid":1073741824,"ts":10.000,"dur":10.000},
)");
  write_text(t.r0.path(), text);
  (void)merge_traces({t.r0.path(), t.r1.path()}, t.out.path());
  const auto check = poolscope::analysis::check_trace(t.out.path());
  EXPECT_TRUE(check.ok()) << check.to_text();
  std::map<std::int64_t, std::string> rank0_threads;
  const json merged = events_of(t.out.path());
  for (const json& e : merged["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == rank_pid(0)) {
      rank0_threads[e["tid"]] = e["args"]["name"];
    }
  }
  const std::int64_t first = std::int64_t{1} << 30;
  EXPECT_EQ(rank0_threads[first], "NCCL, device 0");
  EXPECT_EQ(rank0_threads[first + 1], "GPU 0: H: stream 7");
}

TEST(trace_merge, ranks_of_one_host_are_not_shifted) {
  two_ranks t;
  std::string text = poolscope::profiler::testing::read_bytes(t.r1.path());
  text.replace(text.find("\"host\":\"b\""), 10, "\"host\":\"a\"");
  write_text(t.r1.path(), text);
  const auto r = merge_traces({t.r0.path(), t.r1.path()}, t.out.path());
  ASSERT_EQ(r.ranks[1].syncs.size(), 1U);
  EXPECT_TRUE(r.ranks[1].syncs[0].same_host);
  EXPECT_EQ(r.max_skew_ns, 0);
  EXPECT_GT(r.max_same_host_offset_ns, 6'000'000);
  const json merged = events_of(t.out.path());  // kept alive for the loop over its events
  for (const json& e : merged["traceEvents"]) {
    if (e["ph"] == "X" && e["name"].get<std::string>().starts_with("darray.receive")) {
      // Rank 1's own clock, from rank 0's origin: its origin is 50 µs + 7 ms later.
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 7'050.0 + 70.0);
    }
  }
}

}  // namespace
