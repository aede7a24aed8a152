// `poolscope demo` on host devices, run as a subprocess: every check passes, the trace passes the
// checker and shows darray transfers and compute per device, the report holds the demo's figures
// and eta is the formula of its own times.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "subprocess.hpp"

#if defined(POOLSCOPE_CLI_PATH) && __has_include("poolscope/analysis/trace_check.hpp")
#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/analysis/trace_summary.hpp"
#if __has_include("poolscope/bench/memory_access.hpp")
#include "poolscope/bench/memory_access.hpp"
#endif

namespace {

using nlohmann::json;
using poolscope::testing::read_file;
using poolscope::testing::run_process;
using poolscope::testing::temp_path;

TEST(cli_darray_demo, host_devices_trace_and_report) {
  const std::string trace = temp_path("poolscope-demo-trace") + ".json";
  const std::string report = temp_path("poolscope-demo-report") + ".json";
  const auto r =
      run_process({POOLSCOPE_CLI_PATH, "demo", "--devices", "host:2", "--n", "200000", "--matmul-n",
                   "48", "--repeat", "1", "--trace", trace, "--report", report},
                  {{"POOLSCOPE_LOG", "warn"}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("summary: all"), std::string::npos) << r.out;

  const auto check = poolscope::analysis::check_trace(trace);
  EXPECT_TRUE(check.ok()) << check.to_text();

  const json rep = json::parse(read_file(report));
  const json& demo = rep.at("run").at("demo");
  EXPECT_EQ(demo.at("backend"), "host:2");
  EXPECT_EQ(demo.at("n"), 200000);
  EXPECT_EQ(demo.at("cupti_kinds"), "");  // host devices: no CUPTI
  EXPECT_EQ(demo.at("kernel_graphs"), true);
  // C split at 0.7 N, A at N/2: 0.2 N floats move from device 0 to device 1.
  EXPECT_EQ(demo.at("bytes_moved").get<std::int64_t>(), 40000 * 4);
  // And the summary says it in the unit that reads best (160000 B = 156.25 KiB), not 0.15 MiB.
  EXPECT_NE(r.out.find("; moved 156 KiB\n"), std::string::npos) << r.out;
  const double add = demo.at("t_add_ms"), reshard = demo.at("t_reshard_ms");
  const double fused = demo.at("t_fused_ms");
  EXPECT_NEAR(demo.at("eta").get<double>(), (add + reshard - fused) / std::min(add, reshard), 1e-9);
  // The fused op's overlap per device, in its best run and the median over its runs (one here):
  // both devices have a ratio (the copy is transfer time on its sender and its receiver), and
  // the median of one run is that run's.
  const json& best = demo.at("overlap_fused");
  const json& median = demo.at("overlap_fused_median");
  ASSERT_EQ(best.size(), 2U) << demo.dump();
  ASSERT_EQ(median.size(), 2U) << demo.dump();
  for (std::size_t d = 0; d < 2; ++d) {
    ASSERT_TRUE(median[d].is_number()) << median.dump();
    EXPECT_GE(median[d].get<double>(), 0.0);
    EXPECT_LE(median[d].get<double>(), 1.0);
    EXPECT_DOUBLE_EQ(median[d].get<double>(), best[d].get<double>());
  }
  EXPECT_NE(r.out.find("the median of its 1 run\n"), std::string::npos) << r.out;
  // The three steps take turns: a warm-up round and the timed one, each step a scope per round.
  EXPECT_EQ(demo.at("rounds"), 1);
  int step_scopes = 0;
  for (const auto& sc : rep.at("profiles").at("function").at("scopes")) {
    const std::string name = sc.at("name");
    if (name == "demo.add" || name == "demo.reshard" || name == "demo.fused") {
      EXPECT_EQ(sc.at("calls"), 2) << name;
      ++step_scopes;
    }
  }
  EXPECT_EQ(step_scopes, 3);
  // The backend's counters: at least the pieces of the two rounds' reshard and fused steps
  // (reductions and the matmul move more), and buffers handed on in queue order (not asserted:
  // they need an op whose inputs' reads are still pending); the text says so too.
  const json& bs = demo.at("backend_stats");
  EXPECT_GE(bs.at("bytes_peer").get<std::int64_t>(), 4 * 40000 * 4);
  EXPECT_GT(bs.at("ops").get<std::int64_t>(), 0);
  EXPECT_GE(bs.at("buffers_reused").get<std::int64_t>(), 0);
  EXPECT_TRUE(bs.contains("compute_yielding")) << bs.dump();
  EXPECT_NE(r.out.find("buffers handed on in queue order"), std::string::npos) << r.out;
  for (const auto& c : demo.at("checks")) {
    EXPECT_TRUE(c.at("ok").get<bool>()) << c.dump();
  }
  // Both devices did darray work that the trace summary attributes to them.
  const auto s = poolscope::analysis::summarize_trace(trace);
  int with_transfer = 0;
  int with_compute = 0;
  for (const auto& d : s.devices) {
    with_transfer += d.transfer_ns > 0 ? 1 : 0;
    with_compute += d.compute_ns > 0 ? 1 : 0;
  }
  EXPECT_GE(with_transfer, 1);
  EXPECT_GE(with_compute, 2);
  std::remove(trace.c_str());
  std::remove(report.c_str());
}

// The pools grow in the warm-up round only: each step's previous result is dropped before it
// runs, so the timed fused runs reuse its buffers (on GPUs a pool growing inside the op blocks the
// host in cudaMalloc before it enqueues anything). With 4 MiB chunks, a result kept alive while
// its successor was computed made the first timed run grow every pool again.
TEST(cli_darray_demo, the_pools_grow_in_the_warm_up_round_only) {
  const std::string trace = temp_path("poolscope-demo-growth") + ".json";
  const auto r =
      run_process({POOLSCOPE_CLI_PATH, "demo", "--devices", "host:2", "--n", "2097152",
                   "--matmul-n", "48", "--repeat", "2", "--trace", trace, "--report", "/dev/null"},
                  {{"POOLSCOPE_LOG", "warn"}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto fused_runs = poolscope::analysis::find_trace_ranges(trace, "demo.fused");
  ASSERT_EQ(fused_runs.found.size(), 3U);  // the warm-up and two timed runs
  const auto per_run = poolscope::analysis::summarize_trace(trace, fused_runs.found, true);
  ASSERT_EQ(per_run.each.size(), 3U);
  for (std::size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(per_run.each[i].upstream_allocs, 0U)
        << "timed run " << i << ": " << per_run.each[i].upstream_bytes << " B";
  }
  std::remove(trace.c_str());
}

TEST(cli_darray_demo, one_device_moves_nothing_and_says_eta_is_not_applicable) {
  const std::string report = temp_path("poolscope-demo-report") + ".json";
  const auto r = run_process(
      {POOLSCOPE_CLI_PATH, "demo", "--devices", "host:1", "--n", "20000", "--matmul-n", "32",
       "--repeat", "1", "--trace", temp_path("poolscope-demo-trace") + ".json", "--report", report},
      {{"POOLSCOPE_LOG", "warn"}});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("summary: all"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; eta n/a;"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; moved 0 B\n"), std::string::npos) << r.out;
  const json demo = json::parse(read_file(report)).at("run").at("demo");
  EXPECT_EQ(demo.at("between_ranks"), "auto");  // the default, recorded
  EXPECT_EQ(demo.at("staging_chunk_bytes"), 16 << 20);
  EXPECT_EQ(demo.at("bytes_moved"), 0);
  EXPECT_TRUE(demo.at("eta").is_null()) << demo.dump();
}

TEST(cli_darray_demo, bad_options_fail_cleanly) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"demo", "--devices", "host:0"},
           {"demo", "--devices", "tpu"},
           {"demo", "--transport", "pigeon"},
           {"demo", "--between-ranks", "gloo"},
           {"demo", "--staging-chunk", "4Q"},
           {"demo", "--staging-chunk", "-1"},
           {"demo", "--n", "0"},
           {"demo", "--kernel-graphs", "maybe"},
       }) {
    std::vector<std::string> argv{POOLSCOPE_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = run_process(argv, {{"POOLSCOPE_LOG", "warn"}});
    EXPECT_NE(r.exit_code, 0) << args[2];
    EXPECT_EQ(r.signal, 0) << args[2];
    EXPECT_FALSE(r.err.empty()) << args[2];
  }
}

TEST(cli_darray_demo, an_unknown_cupti_kind_is_named_before_any_work) {
  const auto r = run_process(
      {POOLSCOPE_CLI_PATH, "demo", "--devices", "host:2", "--cupti-kinds", "kernels,telepathy"},
      {{"POOLSCOPE_LOG", "warn"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.signal, 0);
  EXPECT_NE(r.err.find("'telepathy'"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("summary"), std::string::npos) << r.out;  // nothing ran
}

#if __has_include("poolscope/bench/memory_access.hpp")
// On a GPU, the demo collects the devices' activity and NVTX by default, without the records of
// API calls; `--cupti-kinds all` adds them, and with them the kernels' launch flows.
TEST(cli_darray_demo, cuda_cupti_kinds_default_and_all) {
  if (poolscope::bench::gpu_count() == 0) {
    GTEST_SKIP() << "no GPU: CUPTI collects only on CUDA devices";
  }
  struct seen {
    std::string kinds;
    std::string state;
    int kernels = 0;
    int api_calls = 0;
    std::uint64_t flows = 0;
  };
  const auto run = [](const std::vector<std::string>& extra) {
    const std::string trace = temp_path("poolscope-demo-cuda-trace") + ".json";
    const std::string report = temp_path("poolscope-demo-cuda-report") + ".json";
    std::vector<std::string> argv{POOLSCOPE_CLI_PATH, "demo",       "--devices", "cuda",     "--n",
                                  "1000000",          "--matmul-n", "256",       "--repeat", "1",
                                  "--trace",          trace,        "--report",  report};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto r = run_process(argv, {{"POOLSCOPE_LOG", "warn"}});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    seen s;
    const json rep = json::parse(read_file(report));
    s.kinds = rep.at("run").at("demo").at("cupti_kinds").get<std::string>();
    s.state = rep.at("run").at("cupti").at("state").get<std::string>();
    poolscope::analysis::read_trace(trace, [&s](std::uint64_t, const json& e) {
      const std::string cat = e.value("cat", "");
      s.kernels += cat == "kernel" && e.value("ph", "") == "X" ? 1 : 0;
      s.api_calls += cat == "cuda_api" ? 1 : 0;
    });
    s.flows = poolscope::analysis::check_trace(trace).flows;
    std::remove(trace.c_str());
    std::remove(report.c_str());
    return s;
  };
  const seen light = run({});
  if (light.state == "unavailable") {
    GTEST_SKIP() << "CUPTI is unavailable here (another profiler attached?)";
  }
  EXPECT_EQ(light.kinds, "kernels,copies,memsets,markers");
  EXPECT_GT(light.kernels, 0);
  EXPECT_EQ(light.api_calls, 0);
  const seen all = run({"--cupti-kinds", "all"});
  EXPECT_EQ(all.kinds, "all");
  EXPECT_GT(all.kernels, 0);
  EXPECT_GT(all.api_calls, 0);
  EXPECT_GT(all.flows, light.flows);  // launch flows join API calls to their kernels
}
#endif

}  // namespace
#endif
