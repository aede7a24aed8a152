// The poolscope command, run as a subprocess: `pools` and `bench alloc` on the host resource,
// their JSON checked against independent models (the regenerated trace, the strategies'
// documented behaviour), and clean failures on bad options. Nothing here asserts on time.
#include <gtest/gtest.h>

#include <cstdio>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "poolscope/pool/factory.hpp"
#include "subprocess.hpp"

#if defined(POOLSCOPE_CLI_PATH) && __has_include("poolscope/bench/workloads.hpp")
#include "poolscope/bench/memory_access.hpp"
#include "poolscope/bench/workloads.hpp"

namespace {

using nlohmann::json;
using poolscope::testing::last_line;
using poolscope::testing::run_process;
using poolscope::testing::temp_path;

/// Runs `poolscope args... --json FILE` and returns the parsed JSON (and the result).
json run_json(const std::vector<std::string>& args, poolscope::testing::process_result& r) {
  const std::string path = temp_path("poolscope-json");
  std::remove(path.c_str());  // a name of its own, which the command may create (no --force)
  std::vector<std::string> argv{POOLSCOPE_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--json");
  argv.push_back(path);
  r = run_process(argv, {{"POOLSCOPE_LOG", "warn"}});
  const std::string text = poolscope::testing::read_file(path);
  std::remove(path.c_str());
  return text.empty() ? json() : json::parse(text);
}

/// The targets of a `bench alloc --json` report's rows, in order; each row without an error.
std::vector<std::string> row_targets(const json& j) {
  std::vector<std::string> targets;
  for (const auto& row : j["rows"]) {
    targets.push_back(row["target"].get<std::string>());
    EXPECT_TRUE(row["error"].is_null() || row["error"] == "") << row.dump();
  }
  return targets;
}

/// Peak of live requested bytes over a trace, computed here independently of the library.
std::size_t reference_peak(const poolscope::bench::trace& t) {
  std::map<std::uint32_t, std::size_t> live;
  std::size_t sum = 0;
  std::size_t peak = 0;
  for (const auto& op : t.ops) {
    if (op.is_free) {
      sum -= live.at(op.slot);
      live.erase(op.slot);
    } else {
      live[op.slot] = op.bytes;
      sum += op.bytes;
      peak = std::max(peak, sum);
    }
  }
  return peak;
}

TEST(cli_pools, host_json_matches_the_trace) {
  constexpr std::size_t steps = 2;
  constexpr std::uint64_t seed = 7;
  poolscope::testing::process_result r;
  const json j = run_json({"pools", "--resource", "host", "--steps", std::to_string(steps),
                           "--seed", std::to_string(seed)},
                          r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["resource"], "host");
  EXPECT_EQ(j["integrity_ok"], true);
  EXPECT_EQ(last_line(r.out), j["summary"].get<std::string>()) << "summary line last";
  // The command calls itself by its name (it was once `poolscope demo`).
  EXPECT_EQ(j["command"], "pools");
  EXPECT_EQ(j["summary"].get<std::string>().rfind("pools [host]: ", 0), 0U) << j["summary"];
  EXPECT_NE(r.err.find("[pools] "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[demo]"), std::string::npos) << r.err;

  // The same trace, regenerated from the library's generator; counted and peaked here.
  const auto plan = poolscope::bench::make_demo_plan(false, steps);
  const auto tr = poolscope::bench::demo_trace(plan, steps, seed);
  const auto allocs = static_cast<std::size_t>(
      std::count_if(tr.ops.begin(), tr.ops.end(), [](const auto& op) { return !op.is_free; }));
  const std::size_t peak = reference_peak(tr);
  EXPECT_EQ(j["trace"]["ops"], tr.ops.size());
  EXPECT_EQ(j["trace"]["allocations"], allocs);
  EXPECT_EQ(j["trace"]["peak_live_bytes"], peak);

  std::vector<std::string> names;
  for (const auto& s : j["strategies"]) {
    const std::string a = s["allocator"];
    names.push_back(a);
    SCOPED_TRACE(a);
    EXPECT_TRUE(s["error"].is_null()) << s["error"];
    EXPECT_EQ(s["integrity_failures"], 0U);
    EXPECT_EQ(s["allocations"], allocs);
    EXPECT_EQ(s["frees"], allocs);
    EXPECT_EQ(s["stats"]["allocations"], allocs);
    EXPECT_EQ(s["stats"]["deallocations"], allocs);
    EXPECT_EQ(s["stats"]["in_use"], 0U);
    EXPECT_EQ(s["peak_requested"], peak) << "requested bytes do not depend on the strategy";
    EXPECT_GE(s["peak_reserved"].get<std::size_t>(), peak);
    EXPECT_GE(s["ratio"].get<double>(), 1.0);
    EXPECT_EQ(s["upstream_calls"].get<std::uint64_t>(),
              s["upstream_allocs"].get<std::uint64_t>() + s["upstream_frees"].get<std::uint64_t>());
    EXPECT_GE(s["ns_per_op"].get<double>(), 0.0);
    if (a == "naive") {
      // A passthrough reserves exactly what is asked, once per allocation, and caches nothing.
      EXPECT_EQ(s["peak_reserved"], peak);
      EXPECT_EQ(s["upstream_allocs"], allocs);
      EXPECT_EQ(s["upstream_frees"], allocs);
      EXPECT_EQ(s["cached_blocks"], 0U);
    }
    if (a == "best_fit") {
      EXPECT_LT(s["upstream_allocs"].get<std::size_t>(), allocs) << "best_fit reuses blocks";
      EXPECT_EQ(s["upstream_allocs"].get<std::size_t>(),
                s["upstream_frees"].get<std::size_t>() + s["cached_blocks"].get<std::size_t>());
    }
  }
  EXPECT_EQ(names, poolscope::pool::allocator_names());
}

TEST(cli_pools, allocator_subset_and_text_report) {
  poolscope::testing::process_result r;
  const json j =
      run_json({"pools", "--resource", "host", "--steps", "1", "--allocators", "best_fit"}, r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_EQ(j["strategies"].size(), 1U);
  EXPECT_EQ(j["strategies"][0]["allocator"], "best_fit");
  EXPECT_NE(r.out.find("peak reserved"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("best_fit"), std::string::npos);
}

TEST(cli_pools, bad_options_fail_cleanly) {
  const std::vector<std::vector<std::string>> bad{
      {"pools", "--allocators", "no_such_pool"},
      {"pools", "--steps", "0"},
      {"pools", "--steps", "many"},
      {"pools", "--resource", "no_such_resource"},
      {"pools", "--no-such-flag"},
      {"no_such_command"},
      {},
  };
  for (const auto& args : bad) {
    std::vector<std::string> argv{POOLSCOPE_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = run_process(argv);
    std::string cmd;
    for (const auto& a : args) {
      cmd += " " + a;
    }
    SCOPED_TRACE("poolscope" + cmd);
    EXPECT_EQ(r.signal, 0) << "crashed";
    EXPECT_GT(r.exit_code, 0) << r.out << r.err;
    EXPECT_FALSE(r.err.empty()) << "a message on stderr";
  }
}

TEST(cli_main, version_flag_prints_the_project_version) {
  const auto r = run_process({POOLSCOPE_CLI_PATH, "--version"});
  EXPECT_EQ(r.signal, 0) << "crashed";
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // "poolscope MAJOR.MINOR.PATCH" (CMake's PROJECT_VERSION), one line.
  EXPECT_TRUE(std::regex_match(r.out, std::regex("poolscope [0-9]+\\.[0-9]+\\.[0-9]+\n"))) << r.out;
}

TEST(cli_bench, alloc_quick_host_json) {
  poolscope::testing::process_result r;
  const json j = run_json(
      {"bench", "alloc", "--quick", "--resource", "host", "--threads", "1,2", "--seconds", "0.02"},
      r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["resource"], "host");
  EXPECT_EQ(j["quick"], true);
  EXPECT_FALSE(j["method"].get<std::string>().empty());
  EXPECT_EQ(last_line(r.out), j["summary"].get<std::string>()) << "summary line last";

  const auto allocators = poolscope::pool::allocator_names();
  std::set<std::tuple<std::string, std::string, int>> seen;
  std::map<std::string, std::size_t> a5_peak;
  for (const auto& row : j["rows"]) {
    const std::string w = row["workload"];
    const std::string target = row["target"];
    const std::string kind = row["kind"];
    SCOPED_TRACE(w + " " + target + " x" + std::to_string(row["threads"].get<int>()));
    seen.insert({w, target, row["threads"].get<int>()});
    ASSERT_TRUE(row["error"].is_null()) << row["error"];
    EXPECT_GT(row["ops"].get<std::size_t>(), 0U);
    EXPECT_GT(row["samples"].get<std::size_t>(), 0U);
    EXPECT_LE(row["min_ns"].get<double>(), row["median_ns"].get<double>());
    EXPECT_LE(row["median_ns"].get<double>(), row["p99_ns"].get<double>());
    EXPECT_LE(row["p99_ns"].get<double>(), row["max_ns"].get<double>());
    if (kind != "allocator") {
      continue;
    }
    const auto allocs = row["allocations"].get<std::uint64_t>();
    EXPECT_EQ(row["deallocations"].get<std::uint64_t>(), allocs) << "every block returned";
    EXPECT_EQ(row["stats"]["in_use"], 0U);
    // Every row, multi-threaded ones included: a freed block leaves the counters before another
    // thread can take it, so no peak counts a block twice.
    EXPECT_GE(row["ratio"].get<double>(), 1.0);
    if (target == "naive") {
      EXPECT_EQ(row["upstream_allocs"].get<std::uint64_t>(), allocs) << "naive caches nothing";
    }
    if (target == "best_fit" && (w == "A1" || (w == "A3" && row["threads"] == 1))) {
      EXPECT_EQ(row["upstream_allocs"], 1U) << "one size, one thread: one block, reused";
    }
    if (w == "A5") {
      a5_peak[target] = row["peak_requested"].get<std::size_t>();
      if (target == "naive") {
        EXPECT_DOUBLE_EQ(row["ratio"].get<double>(), 1.0);
      }
    }
  }
  // Rows: every workload on the raw resource and on every allocator (A3 once per thread count).
  for (const std::string w : {"A1", "A2", "A3", "A4", "A5"}) {
    for (int th : w == std::string("A3") ? std::vector<int>{1, 2} : std::vector<int>{1}) {
      EXPECT_TRUE(seen.count({w, "host", th})) << w << " baseline x" << th;
      for (const auto& a : allocators) {
        EXPECT_TRUE(seen.count({w, a, th})) << w << " " << a << " x" << th;
      }
    }
  }
  // A5's peak requested, from each allocator's counters, equals the trace's peak that the
  // baseline row computed from the trace alone.
  std::size_t model_peak = 0;
  for (const auto& row : j["rows"]) {
    if (row["workload"] == "A5" && row["kind"] == "baseline") {
      model_peak = row["peak_requested"].get<std::size_t>();
    }
  }
  EXPECT_GT(model_peak, 0U);
  for (const auto& [target, p] : a5_peak) {
    EXPECT_EQ(p, model_peak) << target;
  }
  // The hook figures.
  ASSERT_TRUE(j["hooks"].is_object());
  EXPECT_TRUE(j["owner_bias"].is_boolean());
  EXPECT_GE(j["hooks"]["check_ns"].get<double>(), 0.0);
  EXPECT_GT(j["hooks"]["check_loop_ns"].get<double>(), 0.0);
  EXPECT_EQ(j["hooks"]["events_per_pair"], 4U);
}

TEST(cli_bench, workload_and_allocator_filters) {
  poolscope::testing::process_result r;
  const json j = run_json({"bench", "alloc", "--quick", "--resource", "host", "--workloads", "A1",
                           "--allocators", "best_fit", "--no-baselines", "--seconds", "0.01"},
                          r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_EQ(j["rows"].size(), 1U);
  EXPECT_EQ(j["rows"][0]["workload"], "A1");
  EXPECT_EQ(j["rows"][0]["target"], "best_fit");
  EXPECT_TRUE(j["hooks"].is_null());
}

TEST(cli_bench, compare_thread_cache_adds_rows_without_the_cache_and_without_the_biases) {
  poolscope::testing::process_result r;
  const json j = run_json({"bench", "alloc", "--quick", "--resource", "host", "--workloads", "A1",
                           "--allocators", "bfc,naive", "--no-baselines", "--no-vmm-rows",
                           "--seconds", "0.01", "--compare-thread-cache"},
                          r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<std::string> targets = row_targets(j);
  EXPECT_EQ(targets,
            (std::vector<std::string>{"bfc", "bfc -tc", "bfc -bias", "bfc -tc -bias", "naive"}));
}

TEST(cli_bench, compare_mapped_fit_adds_rows_of_bfc_over_a_virtual_resource_with_the_best_fit) {
  poolscope::testing::process_result r;
  const json j = run_json(
      {"bench", "alloc", "--quick", "--resource", "host", "--workloads", "A5", "--allocators",
       "bfc,naive", "--no-baselines", "--seconds", "0.01", "--compare-mapped-fit"},
      r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<std::string> targets = row_targets(j);
  EXPECT_EQ(targets, (std::vector<std::string>{"bfc", "bfc over host_vmm",
                                               "bfc over host_vmm -mapfit", "naive"}));
  // Over host_vmm itself, the bfc row is the one compared.
  const json v = run_json(
      {"bench", "alloc", "--quick", "--resource", "host_vmm", "--workloads", "A5", "--allocators",
       "bfc", "--no-baselines", "--seconds", "0.01", "--compare-mapped-fit"},
      r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_EQ(v["rows"].size(), 2U);
  EXPECT_EQ(v["rows"][0]["target"], "bfc");
  EXPECT_EQ(v["rows"][1]["target"], "bfc -mapfit");
  EXPECT_GT(v["rows"][1]["stats"]["maps"].get<std::uint64_t>(), 0U) << v["rows"][1].dump();
}

TEST(cli_bench, bad_options_fail_cleanly) {
  const std::vector<std::vector<std::string>> bad{
      {"bench"},
      {"bench", "alloc", "--workloads", "A9"},
      {"bench", "alloc", "--threads", "0"},
      {"bench", "alloc", "--threads", "two"},
      {"bench", "alloc", "--allocators", "nope"},
      {"bench", "alloc", "--resource", "nope"},
      {"bench", "nope"},
  };
  for (const auto& args : bad) {
    std::vector<std::string> argv{POOLSCOPE_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = run_process(argv);
    std::string cmd;
    for (const auto& a : args) {
      cmd += " " + a;
    }
    SCOPED_TRACE("poolscope" + cmd);
    EXPECT_EQ(r.signal, 0) << "crashed";
    EXPECT_GT(r.exit_code, 0) << r.out << r.err;
    EXPECT_FALSE(r.err.empty());
  }
}

bool has_resource(const std::string& name) {
  const auto names = poolscope::pool::resource_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Without a GPU, asking for device memory is an error message and exit code 1, not a crash.
TEST(cli_pools, device_resource_without_gpu_fails_cleanly) {
  if (poolscope::bench::gpu_count() > 0) {
    GTEST_SKIP() << "a GPU is present (cli_pools.cuda_gpu covers it)";
  }
  if (!has_resource("cuda")) {
    GTEST_SKIP() << "the cuda resource is not registered in this build";
  }
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"pools", "--resource", "cuda", "--steps", "1"},
        std::vector<std::string>{"bench", "alloc", "--resource", "cuda", "--quick"}}) {
    std::vector<std::string> argv{POOLSCOPE_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = run_process(argv);
    EXPECT_EQ(r.signal, 0) << "crashed";
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_EQ(r.err.rfind("poolscope", 0), 0U) << "one clean message: " << r.err;
    EXPECT_EQ(r.err.find("poolscope: poolscope"), std::string::npos) << r.err;
  }
}

// On a GPU: the demo on device memory (patterns through cudaMemcpy) keeps every block intact.
TEST(cli_pools, cuda_gpu) {
  if (poolscope::bench::gpu_count() == 0) {
    GTEST_SKIP() << "no GPU: the device-memory demo needs one";
  }
  if (!has_resource("cuda")) {
    GTEST_SKIP() << "the cuda resource is not registered in this build";
  }
  poolscope::testing::process_result r;
  const json j = run_json({"pools", "--resource", "cuda", "--steps", "1"}, r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(j["integrity_ok"], true);
  const auto tr = poolscope::bench::demo_trace(poolscope::bench::make_demo_plan(true, 1), 1, 1);
  for (const auto& s : j["strategies"]) {
    SCOPED_TRACE(s["allocator"].get<std::string>());
    EXPECT_TRUE(s["error"].is_null()) << s["error"];
    EXPECT_EQ(s["peak_requested"], reference_peak(tr));
    EXPECT_EQ(s["stats"]["in_use"], 0U);
  }
}

}  // namespace

#else

TEST(cli, skipped) {
  GTEST_SKIP() << "the poolscope command (or bench/) is not part of this build";
}

#endif
