// `poolscope bench darray`, run as a subprocess on two host devices at small sizes: the JSON it
// writes is checked for every workload, for figures derived from its own reported times by their
// documented formulas, for bytes moved equal to what the maps imply (computed here), and for the
// baselines beside them. Nothing here asserts on how fast anything is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "poolscope/analysis/trace_check.hpp"
#if __has_include("poolscope/bench/memory_access.hpp")
#include "poolscope/bench/memory_access.hpp"
#endif
#include "subprocess.hpp"

#if defined(POOLSCOPE_CLI_PATH)

namespace {

using nlohmann::json;
using poolscope::testing::last_line;
using poolscope::testing::process_result;
using poolscope::testing::run_process;
using poolscope::testing::temp_path;

constexpr std::int64_t n = 100000;  // a multiple of 20: C's split at 0.7 n is exact
constexpr std::int64_t matmul_n = 64;

/// Runs `poolscope bench darray args... --json FILE`; returns the parsed JSON (null if none).
json run_bench(const std::vector<std::string>& args, process_result& r) {
  const std::string path = temp_path("poolscope-darray-json");
  std::remove(path.c_str());  // a name of its own, which the command may create (no --force)
  std::vector<std::string> argv{POOLSCOPE_CLI_PATH, "bench", "darray"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--json");
  argv.push_back(path);
  r = run_process(argv, {{"POOLSCOPE_LOG", "warn"}});
  const std::string text = poolscope::testing::read_file(path);
  std::remove(path.c_str());
  return text.empty() ? json() : json::parse(text);
}

double fig(const json& w, const char* name) {
  const auto& f = w.at("figures");
  EXPECT_TRUE(f.contains(name)) << "figure " << name << " missing in " << f.dump();
  return f.contains(name) ? f.at(name).get<double>() : 0.0;
}

void expect_near_rel(double got, double want, const char* what) {
  EXPECT_NEAR(got, want, 1e-9 * std::max(1.0, std::abs(want))) << what;
}

void expect_baseline(const json& w, const char* name, double bytes) {
  ASSERT_TRUE(w.at("baselines").contains(name)) << w.at("baselines").dump();
  const json& b = w.at("baselines").at(name);
  EXPECT_EQ(b.at("method"), "memcpy") << "no GPU: memcpy stands in for the CUDA baselines";
  EXPECT_GT(b.at("best_ms").get<double>(), 0.0);
  EXPECT_GE(b.at("median_ms").get<double>(), b.at("best_ms").get<double>());
  EXPECT_EQ(b.at("bytes").get<double>(), bytes);
  expect_near_rel(b.at("gbps").get<double>(), bytes / (b.at("best_ms").get<double>() * 1e6), name);
}

class bench_darray_cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    report_ = new json(run_bench({"--devices", "host:2", "--n", std::to_string(n), "--matmul-n",
                                  std::to_string(matmul_n), "--repeat", "2"},
                                 result_));
  }
  static void TearDownTestSuite() {
    delete report_;
    report_ = nullptr;
  }
  static process_result result_;
  static json* report_;
};

process_result bench_darray_cli::result_;
json* bench_darray_cli::report_ = nullptr;

TEST_F(bench_darray_cli, runs_every_workload_on_host_devices) {
  ASSERT_EQ(result_.exit_code, 0) << result_.out << result_.err;
  const json& j = *report_;
  ASSERT_TRUE(j.is_object()) << result_.out;
  EXPECT_EQ(j.at("backend"), "host:2");
  EXPECT_EQ(j.at("devices"), 2);
  EXPECT_EQ(j.at("gpu"), false);
  EXPECT_EQ(j.at("baselines"), "memcpy");
  EXPECT_EQ(j.at("n"), n);
  EXPECT_EQ(last_line(result_.out), j.at("summary").get<std::string>()) << "summary line last";
  EXPECT_NE(result_.out.find("memcpy"), std::string::npos) << "the table says what stands in";
  for (const char* w : {"D1", "D2", "D3", "D4", "D5"}) {
    ASSERT_TRUE(j.at("workloads").contains(w)) << w;
    EXPECT_EQ(j.at("workloads").at(w).at("error"), "") << w;
    bool has_row = false;
    for (const auto& r : j.at("rows")) {
      has_row = has_row || r.at("workload") == w;
    }
    EXPECT_TRUE(has_row) << "no table row for " << w;
  }
}

TEST_F(bench_darray_cli, d1_times_eta_bytes_and_baselines) {
  ASSERT_TRUE(report_->is_object()) << result_.out << result_.err;
  const json& w = report_->at("workloads").at("D1");
  const double add = fig(w, "t_add_ms");
  const double reshard = fig(w, "t_reshard_ms");
  const double fused = fig(w, "t_fused_ms");
  EXPECT_GT(add, 0.0);
  EXPECT_GT(reshard, 0.0);
  EXPECT_GT(fused, 0.0);
  EXPECT_GT(fig(w, "t_fused_inside_ms"), 0.0);  // A + C, the reshard inside the op
  EXPECT_GE(fig(w, "t_fused_inside_median_ms"), fig(w, "t_fused_inside_ms"));
  expect_near_rel(fig(w, "eta"), (reshard + add - fused) / std::min(reshard, add), "eta");
  // A split at n/2, C at 0.7 n: device 1 needs [n/2, 0.7 n) from device 0.
  const double moved = static_cast<double>((7 * n / 10 - n / 2) * 4);
  EXPECT_EQ(fig(w, "bytes_moved"), moved);
  EXPECT_EQ(fig(w, "bytes_expected"), moved);
  EXPECT_DOUBLE_EQ(moved, (0.7 - 0.5) * static_cast<double>(n) * 4.0);
  EXPECT_EQ(fig(w, "bytes_local"), static_cast<double>(n * 4) - moved);
  expect_near_rel(fig(w, "reshard_gbps"), moved / (reshard * 1e6), "reshard_gbps");
  expect_baseline(w, "peer", moved);
  expect_baseline(w, "peer_one_way", moved);
  expect_baseline(w, "peer_bidirectional", 2 * moved);
  EXPECT_FALSE(w.at("baselines").contains("nccl")) << "no NCCL baseline without a GPU";
  // The backend's own counts over the workload: every darray reshard and fused run (a warm-up
  // and the timed runs of each, both forms) moved exactly `moved` between the devices, so
  // bytes_peer is a whole number (>= 2) of them; pieces under backend::yield_min_bytes: nothing
  // yields.
  const json& be = w.at("backend");
  const auto peer_bytes = be.at("bytes_peer").get<std::uint64_t>();
  const auto moved_bytes = static_cast<std::uint64_t>(moved);
  EXPECT_GE(peer_bytes, 2 * moved_bytes);
  EXPECT_EQ(peer_bytes % moved_bytes, 0U) << peer_bytes;
  EXPECT_GT(be.at("ops").get<std::uint64_t>(), 0U);
  EXPECT_EQ(be.at("compute_yielding").get<std::uint64_t>(), 0U);
  expect_near_rel(fig(w, "ratio_peer"),
                  fig(w, "reshard_gbps") / w.at("baselines").at("peer").at("gbps").get<double>(),
                  "ratio_peer");
}

TEST_F(bench_darray_cli, d2_full_swap_moves_half_the_array) {
  ASSERT_TRUE(report_->is_object()) << result_.out << result_.err;
  const json& w = report_->at("workloads").at("D2");
  // The largest power-of-two side with side^2 <= n / 2.
  std::int64_t side = 1;
  while (4 * side * side <= n / 2) {
    side *= 2;
  }
  EXPECT_EQ(fig(w, "side"), static_cast<double>(side));
  const double half = static_cast<double>(side * side * 4 / 2);
  EXPECT_EQ(fig(w, "bytes_moved"), half) << "rows -> columns on 2 devices moves two quarters";
  EXPECT_EQ(fig(w, "bytes_expected"), half);
  EXPECT_GT(fig(w, "t_reshard_ms"), 0.0);
  EXPECT_GT(fig(w, "t_fused_ms"), 0.0);
  expect_baseline(w, "peer", half);
  expect_near_rel(fig(w, "ratio_peer"),
                  w.at("baselines").at("peer").at("best_ms").get<double>() / fig(w, "t_fused_ms"),
                  "ratio_peer");
}

// D2's side for tiny n: the largest power of two with side^2 <= n/2 (at least 1), raised to the
// device count; --help says so.
TEST(bench_darray_cli_options, d2_side_for_tiny_n_is_what_help_says) {
  process_result h;
  h = poolscope::testing::run_process({POOLSCOPE_CLI_PATH, "bench", "darray", "--help"});
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("raised to the device count"), std::string::npos) << h.out;
  for (const auto& [elements, devices, side] :
       {std::tuple{7, 3, 3}, std::tuple{4, 4, 4}, std::tuple{64, 2, 4}, std::tuple{4000, 2, 32}}) {
    SCOPED_TRACE("n " + std::to_string(elements) + " on host:" + std::to_string(devices));
    process_result r;
    const json j = run_bench({"--devices", "host:" + std::to_string(devices), "--n",
                              std::to_string(elements), "--repeat", "1", "--only", "D2"},
                             r);
    ASSERT_TRUE(j.is_object()) << r.out << r.err;
    EXPECT_EQ(fig(j.at("workloads").at("D2"), "side"), static_cast<double>(side));
  }
}

TEST_F(bench_darray_cli, d3_small_ops) {
  ASSERT_TRUE(report_->is_object()) << result_.out << result_.err;
  const json& w = report_->at("workloads").at("D3");
  EXPECT_EQ(fig(w, "n"), 4096.0);
  EXPECT_GT(fig(w, "t_add_us"), 0.0);
  EXPECT_GT(fig(w, "t_fused_us"), 0.0);
  EXPECT_GE(fig(w, "t_add_us"), fig(w, "t_add_best_us")) << "median >= best";
  // The chained figures (their values are checked by the bench itself: 129 and 193 everywhere).
  EXPECT_EQ(fig(w, "chain"), 64.0);
  EXPECT_GT(fig(w, "t_add_chained_us"), 0.0);
  EXPECT_GT(fig(w, "t_fused_chained_us"), 0.0);
  const double moved = static_cast<double>((14 * 4096 / 20 - 2048) * 4);
  EXPECT_EQ(fig(w, "bytes_moved"), moved);
  expect_baseline(w, "peer", moved);
}

TEST_F(bench_darray_cli, d4_bandwidth_ratio) {
  ASSERT_TRUE(report_->is_object()) << result_.out << result_.err;
  const json& w = report_->at("workloads").at("D4");
  const double bytes = static_cast<double>(n * 4);
  const double add = fig(w, "t_add_ms");
  EXPECT_GT(add, 0.0);
  expect_near_rel(fig(w, "add_gbps"), 3.0 * bytes / (add * 1e6), "add_gbps: 2 reads + 1 write");
  expect_baseline(w, "copy", bytes);
  expect_near_rel(fig(w, "copy_gbps"), 2.0 * w.at("baselines").at("copy").at("gbps").get<double>(),
                  "copy_gbps: 1 read + 1 write");
  expect_near_rel(fig(w, "ratio"), fig(w, "add_gbps") / fig(w, "copy_gbps"), "ratio");
}

TEST_F(bench_darray_cli, d5_matmul_flops) {
  ASSERT_TRUE(report_->is_object()) << result_.out << result_.err;
  const json& w = report_->at("workloads").at("D5");
  EXPECT_EQ(fig(w, "m"), static_cast<double>(matmul_n));
  const double t = fig(w, "t_ms");
  EXPECT_GT(t, 0.0);
  const double m = static_cast<double>(matmul_n);
  expect_near_rel(fig(w, "tflops"), 2.0 * m * m * m / (t * 1e-3) / 1e12, "tflops");
  ASSERT_TRUE(w.at("baselines").contains("one_device"));
  EXPECT_GT(w.at("baselines").at("one_device").at("best_ms").get<double>(), 0.0);
  expect_near_rel(fig(w, "speedup"), fig(w, "t_one_device_ms") / t, "speedup");
}

TEST(bench_darray_cli_options, only_runs_the_named_workloads) {
  process_result r;
  const json j =
      run_bench({"--devices", "host:2", "--n", "4000", "--repeat", "1", "--only", "D1,D4",
                 "--transport", "peer", "--allocator", "best_fit", "--between-ranks", "mpi"},
                r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("workloads").size(), 2u);
  EXPECT_TRUE(j.at("workloads").contains("D1"));
  EXPECT_TRUE(j.at("workloads").contains("D4"));
  EXPECT_EQ(j.at("transport"), "peer");
  EXPECT_EQ(j.at("between_ranks"), "mpi");
  EXPECT_EQ(j.at("allocator"), "best_fit");
  EXPECT_EQ(j.at("workloads").at("D1").at("figures").at("bytes_moved").get<double>(), 800 * 4.0);
  EXPECT_EQ(j.at("trace"), "") << "not traced without --trace";
}

TEST(bench_darray_cli_options, trace_has_a_slice_per_run_with_the_ops_inside) {
  const std::string trace = temp_path("poolscope-bench-trace") + ".json";
  process_result r;
  const json j = run_bench({"--devices", "host:2", "--n", "4000", "--repeat", "2", "--only",
                            "D1,D3,D4", "--trace", trace},
                           r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("trace"), trace);
  EXPECT_EQ(j.at("cupti_kinds"), "") << "host devices: no CUPTI";
  EXPECT_NE(r.out.find("traced to " + trace), std::string::npos) << r.out;
  const auto check = poolscope::analysis::check_trace(trace);
  EXPECT_TRUE(check.ok()) << check.to_text();

  const json t = json::parse(poolscope::testing::read_file(trace));
  std::remove(trace.c_str());
  std::map<std::string, std::vector<std::pair<double, double>>> slices;  // name -> [begin, end]
  for (const json& e : t.at("traceEvents")) {
    if (e.value("ph", "") == "X") {
      const double ts = e.at("ts").get<double>();
      slices[e.at("name").get<std::string>()].emplace_back(ts, ts + e.at("dur").get<double>());
    }
  }
  // One slice per workload run; one per run of each timed figure, the warm-up included.
  EXPECT_EQ(slices["bench.D1"].size(), 1u);
  EXPECT_EQ(slices["bench.D4"].size(), 1u);
  EXPECT_EQ(slices.count("bench.D2"), 0u) << "D2 did not run";
  for (const char* figure : {"bench.D1.add", "bench.D1.reshard", "bench.D1.fused",
                             "bench.D1.fused_inside", "bench.D4.add"}) {
    EXPECT_EQ(slices[figure].size(), 3u) << figure;
  }
  // D3: its runs (the warm-up too) and chains, each inside the workload's slice; no floors on
  // host devices (they are CUDA calls).
  const json& d3 = j.at("workloads").at("D3").at("figures");
  const auto d3_runs = d3.at("runs").get<std::size_t>();
  EXPECT_EQ(slices["bench.D3.add"].size(), d3_runs + 1);
  EXPECT_EQ(slices["bench.D3.fused"].size(), d3_runs + 1);
  const auto chains = static_cast<std::size_t>(std::max<std::size_t>(10, d3_runs / 10)) + 1;
  EXPECT_EQ(slices["bench.D3.add_chain"].size(), chains);
  EXPECT_EQ(slices["bench.D3.fused_chain"].size(), chains);
  EXPECT_EQ(slices.count("bench.D3.floor"), 0u);
  ASSERT_EQ(slices["bench.D3"].size(), 1u);
  for (const char* figure : {"bench.D3.add", "bench.D3.fused", "bench.D3.add_chain"}) {
    for (const auto& [b, e] : slices[figure]) {
      EXPECT_GE(b, slices["bench.D3"].front().first) << figure;
      EXPECT_LE(e, slices["bench.D3"].front().second) << figure;
    }
  }
  ASSERT_EQ(slices["bench.D1"].size(), 1u);
  const auto [d1_begin, d1_end] = slices["bench.D1"].front();
  for (const auto& [b, e] : slices["bench.D1.fused"]) {
    EXPECT_GE(b, d1_begin);
    EXPECT_LE(e, d1_end);
    // Each fused run holds its pieces' copies and its adds (the host backend's task slices).
    const auto inside = [&](std::string_view prefix) {
      std::ptrdiff_t count = 0;
      for (const auto& [name, spans] : slices) {
        if (name.starts_with(prefix)) {
          count += std::count_if(spans.begin(), spans.end(),
                                 [&](const auto& s) { return s.first >= b && s.second <= e; });
        }
      }
      return count;
    };
    EXPECT_GE(inside("darray.copy 0->1"), 1) << "a copy of C's part from device 0 to 1";
    EXPECT_GE(inside("darray.add"), 2) << "an add per device";
  }
}

TEST(bench_darray_cli_options, one_device_moves_nothing_and_has_no_eta) {
  // On one device C.reshard(A.index_map()) moves no byte: there is no transfer for the add to
  // hide, and eta's formula would divide by a reshard of next to no time.
  process_result r;
  const json j =
      run_bench({"--devices", "host:1", "--n", "4000", "--repeat", "1", "--only", "D1"}, r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(j.is_object());
  const json& f = j.at("workloads").at("D1").at("figures");
  EXPECT_EQ(f.at("bytes_moved").get<double>(), 0.0);
  EXPECT_FALSE(f.contains("eta")) << f.dump();
  EXPECT_NE(r.out.find("eta n/a"), std::string::npos) << r.out;
}

TEST(bench_darray_cli_options, rejects_bad_options) {
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--only", "D9"}, std::vector<std::string>{"--transport", "smoke"},
        std::vector<std::string>{"--between-ranks", "gloo"},
        std::vector<std::string>{"--staging-chunk", "4Q"},
        std::vector<std::string>{"--repeat", "0"}, std::vector<std::string>{"--devices", "tpu"}}) {
    std::vector<std::string> argv{POOLSCOPE_CLI_PATH, "bench", "darray", "--n", "4000"};
    argv.insert(argv.end(), bad.begin(), bad.end());
    const auto r = run_process(argv, {{"POOLSCOPE_LOG", "warn"}});
    EXPECT_NE(r.exit_code, 0) << bad[0] << ' ' << bad[1] << ": " << r.out;
    EXPECT_FALSE(r.err.empty()) << bad[0] << ' ' << bad[1];
  }
}

TEST(bench_darray_cli_options, an_unknown_cupti_kind_is_named_before_any_work) {
  const std::string trace = temp_path("poolscope-bench-kinds") + ".json";
  process_result r;
  const json j = run_bench({"--devices", "host:2", "--n", "4000", "--only", "D3", "--trace", trace,
                            "--cupti-kinds", "runtime,telepathy"},
                           r);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.signal, 0);
  EXPECT_NE(r.err.find("'telepathy'"), std::string::npos) << r.err;
  EXPECT_TRUE(j.is_null()) << "nothing ran, nothing written";
  EXPECT_TRUE(poolscope::testing::read_file(trace).empty()) << "no trace begun";
  std::remove(trace.c_str());
}

#if __has_include("poolscope/bench/memory_access.hpp")
// On GPUs `--cupti-kinds runtime` puts every CUDA call of the timed ops in the trace, inside the
// runs' slices (what D3's per-op overhead is made of); the default collects none.
TEST(bench_darray_cli_options, cuda_runtime_calls_traced_on_request) {
  if (poolscope::bench::gpu_count() == 0) {
    GTEST_SKIP() << "no GPU: CUPTI collects only on CUDA devices";
  }
  struct seen {
    std::size_t adds = 0;   // bench.D3.add slices
    std::size_t calls = 0;  // CUDA API calls that start inside one
  };
  const auto run = [](const std::vector<std::string>& extra, json& j) {
    const std::string trace = temp_path("poolscope-bench-cuda-trace") + ".json";
    std::vector<std::string> args{"--devices", "cuda", "--repeat", "1",
                                  "--only",    "D3",   "--trace",  trace};
    args.insert(args.end(), extra.begin(), extra.end());
    process_result r;
    j = run_bench(args, r);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    std::vector<std::pair<double, double>> adds;  // [begin, end]
    std::vector<double> api_calls;                // their starts
    poolscope::analysis::read_trace(trace, [&](std::uint64_t, const json& e) {
      if (e.value("ph", "") != "X") {
        return;
      }
      const double ts = e.at("ts").get<double>();
      if (e.value("name", "") == "bench.D3.add") {
        adds.emplace_back(ts, ts + e.at("dur").get<double>());
      } else if (e.value("cat", "") == "cuda_api") {
        api_calls.push_back(ts);
      }
    });
    std::remove(trace.c_str());
    seen s;
    s.adds = adds.size();
    for (const double t : api_calls) {
      s.calls += std::any_of(adds.begin(), adds.end(),
                             [t](const auto& a) { return t >= a.first && t <= a.second; })
                     ? 1
                     : 0;
    }
    return s;
  };
  json light;
  const seen plain = run({}, light);
  EXPECT_EQ(light.value("cupti_kinds", ""), "kernels,copies,memsets,markers");
  EXPECT_GE(plain.adds, 100u);  // the warm-up and the timed runs
  EXPECT_EQ(plain.calls, 0u);
  json traced;
  const seen all = run({"--cupti-kinds", "kernels,runtime"}, traced);
  EXPECT_EQ(traced.value("cupti_kinds", ""), "kernels,runtime");
  ASSERT_TRUE(traced.is_object());
  // At least a launch and an event record per device in every run.
  EXPECT_GE(all.calls, 2 * all.adds * traced.at("devices").get<std::size_t>());
}

// On GPUs D3 times the ops beside their own calls without their bookkeeping (a kernel graph and
// an event per GPU; the small copy a kernel graph too), alone and chained, and beside the memset
// floors; the table compares A + B and its chain with the former.
TEST(bench_darray_cli_options, d3_floors_of_the_ops_own_calls_on_gpus) {
  if (poolscope::bench::gpu_count() == 0) {
    GTEST_SKIP() << "no GPU: D3's floors are CUDA calls";
  }
  process_result r;
  const json j = run_bench({"--devices", "cuda", "--repeat", "1", "--only", "D3"}, r);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json& b = j.at("workloads").at("D3").at("baselines");
  for (const char* name : {"floor", "floor_chained", "floor_graphs", "floor_graphs_chained",
                           "floor_fused", "floor_fused_graphs", "floor_threaded"}) {
    ASSERT_TRUE(b.contains(name)) << name << " missing in " << b.dump();
    EXPECT_GT(b.at(name).at("median_ms").get<double>(), 0.0) << name;
  }
  const auto method = [&](const char* name) { return b.at(name).at("method").get<std::string>(); };
  EXPECT_EQ(method("floor_graphs"), "a kernel graph + event per GPU");
  EXPECT_EQ(method("floor"), "a memset + event per GPU");
  std::map<std::string, std::string> baseline_of;  // D3's rows: figure -> baseline cell
  for (const json& row : j.at("rows")) {
    if (row.at("workload") == "D3") {
      baseline_of[row.at("figure").get<std::string>()] = row.at("baseline").get<std::string>();
    }
  }
  const auto has = [&](const std::string& figure, const std::string& method_text) {
    const auto it = baseline_of.find(figure);
    return it != baseline_of.end() && it->second.find(method_text) != std::string::npos;
  };
  EXPECT_TRUE(has("A + B, n = 4096 (median)", method("floor_graphs")));
  EXPECT_TRUE(has("  floor with memsets (median)", method("floor")));
  EXPECT_TRUE(has("  per op in a chain of 64, one wait (medians)", method("floor_graphs_chained")));
  EXPECT_TRUE(has("  floor with memsets, chained", method("floor_chained")));
  EXPECT_TRUE(has("  floor with its calls (median)", method("floor_fused_graphs")));
  EXPECT_TRUE(has("  floor with memsets, peer copy (median)", method("floor_fused")));
}
#endif

}  // namespace

#endif  // POOLSCOPE_CLI_PATH
