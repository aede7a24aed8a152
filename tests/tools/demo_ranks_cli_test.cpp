// `mpirun -np N poolscope demo` and `poolscope bench darray`: every rank runs them, rank 0 prints
// the summary of every rank's checks, each rank writes its own trace and rank 0 one merged trace
// of them all; a rank given bad arguments makes every rank refuse with the same message. Each
// launch runs as a subprocess with a timeout (a hang fails the test).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "subprocess.hpp"

#if defined(POOLSCOPE_CLI_PATH) && defined(POOLSCOPE_MPIEXEC) && \
    __has_include("poolscope/analysis/trace_check.hpp")
#include "poolscope/analysis/trace_check.hpp"

namespace {

using nlohmann::json;
using poolscope::testing::read_file;
using poolscope::testing::run_process;
using poolscope::testing::temp_path;

// What Open MPI wants to start ranks here (as root, more ranks than cores); under
// AddressSanitizer no leak check in the ranks (Open MPI keeps what MPI_Init allocates: .ci/run).
std::map<std::string, std::string> launch_env() {
  const char* asan = std::getenv("ASAN_OPTIONS");
  return {{"POOLSCOPE_LOG", "warn"},
          {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
          {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
          {"OMPI_MCA_rmaps_base_oversubscribe", "1"},
          {"POOLSCOPE_RANK_TIMEOUT", "60"},
          {"ASAN_OPTIONS",
           (asan != nullptr && *asan != '\0' ? std::string(asan) + ":" : "") + "detect_leaks=0"}};
}

// `mpirun -np <ranks>` of the command `args`, ended after 300 s.
poolscope::testing::process_result launch(int ranks, const std::vector<std::string>& args) {
  std::vector<std::string> argv{POOLSCOPE_MPIEXEC, "-np", std::to_string(ranks)};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, launch_env(), std::chrono::seconds(300));
}

TEST(cli_darray_demo_ranks, three_ranks_check_everything_and_write_a_trace_each) {
  const std::filesystem::path dir = temp_path("poolscope-demo-ranks") + ".d";
  std::filesystem::create_directories(dir);
  const auto r = launch(3, {POOLSCOPE_CLI_PATH, "demo", "--devices", "host:1", "--n", "30000",
                            "--matmul-n", "24", "--repeat", "1", "--trace",
                            (dir / "t.json").string(), "--report", (dir / "r.%r.json").string()});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // One summary (rank 0's), counting every rank's checks.
  EXPECT_EQ(r.out.find("summary:"), r.out.rfind("summary:")) << r.out;
  // Each rank's 10 checks and the merged trace's (rank 0 merges, every rank counts it).
  EXPECT_NE(r.out.find("33 checks passed (11 on each of 3 ranks)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("host:1 x 3 ranks (rank 0: host device 0, rank 1: host device 1, rank "
                       "2: host device 2)"),
            std::string::npos)
      << r.out;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string trace = (dir / ("t.rank" + std::to_string(rank) + ".json")).string();
    const auto check = poolscope::analysis::check_trace(trace);
    EXPECT_TRUE(check.ok()) << trace << ": " << check.to_text();
    const json demo =
        json::parse(read_file((dir / ("r." + std::to_string(rank) + ".json")).string()))
            .at("run")
            .at("demo");
    EXPECT_EQ(demo.at("rank"), rank);
    EXPECT_EQ(demo.at("ranks"), 3);
    EXPECT_EQ(demo.at("devices"), 3);
    for (const auto& c : demo.at("checks")) {
      EXPECT_TRUE(c.at("ok").get<bool>()) << rank << ": " << c.dump();
    }
    // C split at 0.7 of each block of 10000 elements: 0.4 block moves into devices 1 and 2.
    EXPECT_EQ(demo.at("bytes_moved").get<std::int64_t>(), 2 * 4000 * 4);
    EXPECT_GT(demo.at("backend_stats").at("bytes_between_ranks").get<std::int64_t>(), 0);
  }
  // Rank 0 joined them into t.json: valid, a process per rank named after it.
  const std::string merged = (dir / "t.json").string();
  const auto check = poolscope::analysis::check_trace(merged);
  EXPECT_TRUE(check.ok()) << check.to_text();
  std::set<std::string> processes;
  (void)poolscope::analysis::read_trace(merged, [&](std::uint64_t, const json& e) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      processes.insert(e.at("args").at("name").get<std::string>());
    }
  });
  ASSERT_EQ(processes.size(), 3U);
  EXPECT_EQ(processes.begin()->rfind("rank 0: ", 0), 0U) << *processes.begin();
  EXPECT_NE(r.out.find("trace of every rank: " + merged), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

TEST(cli_darray_demo_ranks, bad_input_on_one_rank_is_refused_on_every_rank) {
  // Rank 1 alone asks for --n -5; rank 0's arguments are fine.
  const std::string cli = POOLSCOPE_CLI_PATH;
  const auto r = launch(2, {"/bin/sh", "-c",
                            "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then n=-5; else n=30000; fi; "
                            "exec '" +
                                cli +
                                "' demo --devices host:1 --n $n --repeat 1 --trace /dev/null "
                                "--report /dev/null"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("summary:"), std::string::npos) << r.out;  // nothing ran
  const std::string refusal = "poolscope demo: rank 1 of 2 refused its arguments: --n";
  const auto first = r.err.find(refusal);
  ASSERT_NE(first, std::string::npos) << r.err;
  EXPECT_NE(r.err.find(refusal, first + 1), std::string::npos) << "said by one rank only:\n"
                                                               << r.err;
}

TEST(cli_bench_darray_ranks, two_ranks_run_the_workloads_across_them) {
  const auto r = launch(2, {POOLSCOPE_CLI_PATH, "bench", "darray", "--devices", "host:1", "--n",
                            "20000", "--matmul-n", "16", "--repeat", "2", "--only", "D1,D2,D5"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("summary:"), r.out.rfind("summary:")) << r.out;  // rank 0's only
  EXPECT_NE(r.out.find("on host:1 x 2 ranks"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << r.out;
  // D3 and D4 time one process's calls: refused by name under a launcher.
  const auto d3 =
      launch(2, {POOLSCOPE_CLI_PATH, "bench", "darray", "--devices", "host:1", "--only", "D3"});
  ASSERT_FALSE(d3.timed_out) << d3.out << d3.err;
  EXPECT_NE(d3.exit_code, 0);
  EXPECT_NE(d3.err.find("D3 measures one process's calls"), std::string::npos) << d3.err;
}

// --trace under the launcher: each rank writes its own trace and rank 0 joins them into the one
// named, as the demo does (clocks sampled around barriers, a flow per piece between ranks).
TEST(cli_bench_darray_ranks, two_ranks_write_their_traces_and_one_merged_trace) {
  const std::filesystem::path dir = temp_path("poolscope-bench-ranks") + ".d";
  std::filesystem::create_directories(dir);
  const std::string merged = (dir / "t.json").string();
  const auto r = launch(2, {POOLSCOPE_CLI_PATH, "bench", "darray", "--devices", "host:1", "--n",
                            "20000", "--repeat", "1", "--only", "D1", "--trace", merged});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string trace = (dir / ("t.rank" + std::to_string(rank) + ".json")).string();
    const auto check = poolscope::analysis::check_trace(trace);
    EXPECT_TRUE(check.ok()) << trace << ": " << check.to_text();
  }
  const auto check = poolscope::analysis::check_trace(merged);
  EXPECT_TRUE(check.ok()) << check.to_text();
  std::set<std::string> processes;
  std::size_t sends = 0;
  const auto info = poolscope::analysis::read_trace(merged, [&](std::uint64_t, const json& e) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      processes.insert(e.at("args").at("name").get<std::string>());
    }
    if (e.value("ph", "") == "X" && e.value("name", "").rfind("darray.send ", 0) == 0) {
      ++sends;
    }
  });
  EXPECT_EQ(processes.size(), 2U);
  const json& m = info.other.at("otherData").at("merged");
  EXPECT_TRUE(m.at("clocks_measured").get<bool>()) << m.dump();
  // Every piece one rank sent to the other is joined to its receive: one flow per send.
  EXPECT_GT(sends, 0U);
  EXPECT_EQ(m.at("flows").get<std::size_t>(), sends) << m.dump();
  EXPECT_EQ(m.at("unmatched_transfers").get<std::size_t>(), 0U) << m.dump();
  EXPECT_NE(r.out.find("trace of every rank: " + merged), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

// Ranks whose traces rank 0 cannot read where they wrote them (nodes with disks of their own;
// here each rank in a working directory of its own, the same relative path naming another file on
// each): each sends rank 0 its trace, which rank 0 writes at that path in its own directory, in
// place of a stale file of that name, and merges.
TEST(cli_bench_darray_ranks, traces_rank_0_cannot_see_are_sent_to_it) {
  const std::filesystem::path dir = temp_path("poolscope-bench-own-dirs") + ".d";
  for (int rank = 0; rank < 2; ++rank) {
    std::filesystem::create_directories(dir / ("r" + std::to_string(rank)));
  }
  {
    std::ofstream stale(dir / "r0" / "t.rank1.json");
    stale << "not the trace of this launch";
  }
  const auto r =
      launch(2, {"sh", "-c", "cd \"$0/r$OMPI_COMM_WORLD_RANK\" && exec \"$@\"", dir.string(),
                 POOLSCOPE_CLI_PATH, "bench", "darray", "--devices", "host:1", "--n", "20000",
                 "--repeat", "1", "--only", "D1", "--trace", "t.json", "--force"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string mine = read_file((dir / "r1" / "t.rank1.json").string());
  const std::string copy = read_file((dir / "r0" / "t.rank1.json").string());
  EXPECT_GT(mine.size(), 100U);
  EXPECT_EQ(copy, mine);  // the stale file replaced by rank 1's bytes
  EXPECT_FALSE(std::filesystem::exists(dir / "r1" / "t.json"));  // rank 0 alone merges
  const std::string merged = (dir / "r0" / "t.json").string();
  const auto check = poolscope::analysis::check_trace(merged);
  EXPECT_TRUE(check.ok()) << check.to_text();
  std::set<std::string> processes;
  const auto info = poolscope::analysis::read_trace(merged, [&](std::uint64_t, const json& e) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") {
      processes.insert(e.at("args").at("name").get<std::string>());
    }
  });
  EXPECT_EQ(processes.size(), 2U);
  const json& m = info.other.at("otherData").at("merged");
  EXPECT_GT(m.at("flows").get<std::size_t>(), 0U) << m.dump();
  EXPECT_EQ(m.at("unmatched_transfers").get<std::size_t>(), 0U) << m.dump();
  std::filesystem::remove_all(dir);
}

}  // namespace
#endif
