// `poolscope replay SNAP.pickle` and `poolscope snapshot LOG -o SNAP`, in-process: PyTorch's own
// snapshot (tests/data) replayed with PyTorch's own figures beside the strategies', a recorded log
// turned into a snapshot and replayed back to the figures computed by hand, several devices, and
// bad files refused with the byte or field named.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "in_process_cli.hpp"
#include "poolscope/analysis/memory_snapshot_reader.hpp"
#include "poolscope/analysis/pickle_reader.hpp"
#include "poolscope/profiler/snapshot_builder.hpp"
#include "subprocess.hpp"

#ifdef POOLSCOPE_TEST_REPLAY_CLI

namespace poolscope::tools {
void register_replay(CLI::App& app);
void register_snapshot(CLI::App& app);
}  // namespace poolscope::tools

namespace {

using nlohmann::json;
using poolscope::testing::temp_path;

const std::string sample = std::string(POOLSCOPE_SOURCE_DIR) + "/tests/data/torch_snapshot_varlen";

std::string run_cli(const std::vector<std::string>& args) {
  return poolscope::testing::run_in_process(args, poolscope::tools::register_replay,
                                            poolscope::tools::register_snapshot);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string write_file(const std::string& stem, const std::string& bytes) {
  const std::string path = temp_path(stem);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(snapshot_cli, replay_of_pytorchs_snapshot_sets_its_own_peaks_beside_every_strategy) {
  const json want = json::parse(slurp(sample + ".json"));
  const json j = json::parse(run_cli({"replay", sample + ".pickle", "--json", "-"}));
  EXPECT_EQ(j["format"], "memory_snapshot");
  EXPECT_EQ(j["source_peak_reserved"], want["max_reserved"]);
  EXPECT_EQ(j["source_peak_live"], want["peak_requested"]);
  ASSERT_EQ(j["devices"].size(), 1U);
  EXPECT_EQ(j["devices"][0]["entries"], 3613);
  ASSERT_FALSE(j["results"].empty());
  for (const auto& r : j["results"]) {
    SCOPED_TRACE(r["allocator"].get<std::string>());
    EXPECT_EQ(r["device"], 0);
    EXPECT_EQ(r["source_peak_reserved"], want["max_reserved"]);
    EXPECT_EQ(r["peak_requested"], want["peak_requested"]);  // every strategy is asked the same
    EXPECT_EQ(r["mallocs"], want["actions"]["alloc"]);
    EXPECT_EQ(r["failed_allocations"], 0);
  }
  const std::string text = run_cli({"replay", sample + ".pickle", "--allocators", "bfc"});
  EXPECT_NE(text.find("source_peak_reserved 80.00 MiB (83886080 B)"), std::string::npos) << text;
  EXPECT_NE(text.find("summary: 1 allocators, 1200 mallocs replayed"), std::string::npos) << text;
}

std::string rec(int seq, const char* action, const char* ptr, int size, int rounded,
                const char* phase) {
  return R"({"seq":)" + std::to_string(seq) + R"(,"time_ns":)" + std::to_string(5000 * seq) +
         R"(,"thread":7,"device":-1,"stream":"0x0","allocator":"bfc/host","allocator_id":1,)" +
         R"("action":")" + action + R"(","phase":")" + phase + R"(","ptr":")" + ptr +
         R"(","size":)" + std::to_string(size) + R"(,"rounded":)" + std::to_string(rounded) + "}\n";
}

// A segment of 8192 bytes; A 1000 (1024), B 3000 (3072) in it; free A; C 2000 (2048); free B.
// By hand: live requested 1000, 4000, 3000, 5000, 2000 -> peak 5000; reserved 8192 throughout.
std::string hand_log() {
  return std::string(R"({"format":"poolscope.events","version":1,"pid":1})") + "\n" +
         rec(1, "device_alloc", "0x10000", 8192, 8192, "post") +
         rec(2, "malloc", "0x10000", 1000, 1024, "post") +
         rec(3, "malloc", "0x10400", 3000, 3072, "post") +
         rec(4, "free", "0x10000", 1000, 0, "pre") +
         rec(5, "malloc", "0x11000", 2000, 2048, "post") +
         rec(6, "free", "0x10400", 3000, 0, "pre");
}

TEST(snapshot_cli, a_log_becomes_a_snapshot_that_replays_to_the_hand_figures) {
  const std::string log = write_file("poolscope-snapshot-log", hand_log());
  const std::string out = temp_path("poolscope-snapshot") + ".pickle";
  const std::string said = run_cli({"snapshot", log, "-o", out});
  EXPECT_NE(said.find("1 segments, 8 trace entries on 1 device(s)"), std::string::npos) << said;
  const poolscope::profiler::memory_snapshot s = poolscope::analysis::read_memory_snapshot(out);
  ASSERT_EQ(s.segments.size(), 1U);
  EXPECT_EQ(s.segments[0].total_size, 8192U);
  EXPECT_EQ(s.segments[0].allocated_size, 2048U);  // C, the one block live
  EXPECT_EQ(s.segments[0].requested_size, 2000U);
  ASSERT_EQ(s.device_traces.size(), 1U);
  EXPECT_EQ(s.device_traces[0].front().time_us, 5U);  // the log's ns as us

  const json j = json::parse(run_cli({"replay", out, "--allocators", "naive", "--json", "-"}));
  EXPECT_EQ(j["source_peak_reserved"], 8192);
  EXPECT_EQ(j["source_peak_live"], 5000);
  EXPECT_EQ(j["results"][0]["peak_requested"], 5000);
  EXPECT_EQ(j["results"][0]["live_at_end"], 1);
  std::remove(out.c_str());
}

TEST(snapshot_cli, several_devices_replay_each_on_its_own_pools) {
  poolscope::profiler::snapshot_builder b;
  for (int device : {0, 1}) {
    poolscope::profiler::snapshot_event e;
    e.device = device;
    e.kind = poolscope::hooks::event_kind::device_alloc;
    e.ptr = 0x100000U * static_cast<std::uint64_t>(device + 1);
    e.requested = e.rounded = std::uint64_t{1} << 20;
    b.add(e);
    e.kind = poolscope::hooks::event_kind::pool_malloc;
    e.requested = 1000U * static_cast<std::uint64_t>(device + 1);
    e.rounded = 1024U * static_cast<std::uint64_t>(device + 1);
    b.add(e);
  }
  const std::string path = write_file("poolscope-snapshot-devices", b.snapshot().to_pickle());
  const json j = json::parse(run_cli({"replay", path, "--allocators", "naive,bfc", "--json", "-"}));
  ASSERT_EQ(j["devices"].size(), 2U);
  EXPECT_FALSE(j.contains("source_peak_reserved"));  // per device only
  ASSERT_EQ(j["results"].size(), 4U);
  EXPECT_EQ(j["results"][0]["device"], 0);
  EXPECT_EQ(j["results"][0]["peak_requested"], 1000);
  EXPECT_EQ(j["results"][2]["device"], 1);
  EXPECT_EQ(j["results"][2]["peak_requested"], 2000);
  EXPECT_EQ(j["results"][2]["source_peak_reserved"], 1 << 20);
  EXPECT_NE(j["results"][3]["allocator"].get<std::string>().find(" dev1"), std::string::npos);
}

TEST(snapshot_cli, a_damaged_snapshot_is_refused_naming_the_byte_or_the_field) {
  const std::string bytes = slurp(sample + ".pickle");
  const std::string cut = write_file("poolscope-cut", bytes.substr(0, bytes.size() / 2));
  try {
    (void)run_cli({"replay", cut});
    ADD_FAILURE() << "a truncated snapshot was replayed";
  } catch (const poolscope::analysis::pickle_error& e) {
    EXPECT_NE(std::string(e.what()).find(cut + ": byte "), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)run_cli({"replay", sample + ".pickle", "--only-allocator", "x"}),
               poolscope::invalid_argument);
}

}  // namespace

#endif  // POOLSCOPE_TEST_REPLAY_CLI
