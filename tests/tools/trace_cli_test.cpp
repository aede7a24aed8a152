// `poolscope trace check` and `poolscope trace summary`, run as a subprocess on traces written
// here by hand: exit codes, the problems named, and the summary's figures against hand-computed
// ones.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "subprocess.hpp"

#ifdef POOLSCOPE_CLI_PATH

namespace {

using nlohmann::json;
using poolscope::testing::process_result;
using poolscope::testing::run_process;
using poolscope::testing::temp_path;

const std::string names = R"JSON(
  {"ph":"M","name":"process_name","pid":1,"tid":0,"args":{"name":"host"}},
  {"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"main"}},
  {"ph":"M","name":"process_name","pid":100,"tid":0,"args":{"name":"GPU 0"}},
  {"ph":"M","name":"thread_name","pid":100,"tid":7,"args":{"name":"stream 7"}},
  {"ph":"M","name":"thread_name","pid":100,"tid":8,"args":{"name":"stream 8"}})JSON";

// Device 0: kernel [10,30) us and [50,60) us on stream 7, a copy of 40000 B over [20,40) us on
// stream 8; a host slice over [0,100) us sets the window. By hand: compute 30 us, transfer
// 20 us, both 10 us (ratio 0.5), busy 40 us, idle 60 us.
const std::string valid_events = R"JSON(
  {"ph":"X","name":"step","cat":"user","pid":1,"tid":1,"ts":0.000,"dur":100.000},
  {"ph":"X","name":"cudaLaunchKernel","cat":"cuda_api","pid":1,"tid":1,"ts":1.000,"dur":2.000},
  {"ph":"X","name":"scale(float*, int)","cat":"kernel","pid":100,"tid":7,"ts":10.000,
   "dur":20.000,"args":{"device":0}},
  {"ph":"X","name":"scale(float*, int)","cat":"kernel","pid":100,"tid":7,"ts":50.000,
   "dur":10.000,"args":{"device":0}},
  {"ph":"X","name":"Memcpy HtoD","cat":"memcpy","pid":100,"tid":8,"ts":20.000,"dur":20.000,
   "args":{"device":0,"bytes":40000}},
  {"ph":"s","name":"launch","cat":"launch","pid":1,"tid":1,"ts":1.000,"id":1},
  {"ph":"f","name":"launch","cat":"launch","pid":100,"tid":7,"ts":10.000,"id":1,"bp":"e"},
  {"ph":"C","name":"memory","pid":100,"tid":0,"ts":5.0,"args":{"in_use":1024}})JSON";

std::string write_trace(const std::string& events) {
  const std::string path = temp_path("poolscope-trace") + ".json";
  std::ofstream f(path);
  f << R"JSON({"traceEvents":[)JSON" << names << "," << events
    << R"JSON(],"displayTimeUnit":"ns"})JSON";
  return path;
}

process_result run_cli(const std::vector<std::string>& args) {
  std::vector<std::string> argv{POOLSCOPE_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {{"POOLSCOPE_LOG", "warn"}});
}

void require_trace_command() {
  const process_result r = run_cli({"trace", "--help"});
  ASSERT_EQ(r.exit_code, 0) << "`poolscope trace` is not registered: main.cpp must call "
                               "poolscope::tools::register_trace (tools/src/cmd_trace.cpp)\n"
                            << r.out << r.err;
}

TEST(trace_cli, check_passes_a_valid_trace) {
  require_trace_command();
  const std::string path = write_trace(valid_events);
  const process_result r = run_cli({"trace", "check", path});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("OK: 13 events"), std::string::npos) << r.out;
  const process_result q = run_cli({"trace", "check", "--quiet", path});
  EXPECT_EQ(q.exit_code, 0);
  EXPECT_TRUE(q.out.empty()) << q.out;
  std::remove(path.c_str());
}

TEST(trace_cli, check_lists_the_problems_and_fails) {
  require_trace_command();
  const std::string path = write_trace(valid_events + R"JSON(,
    {"ph":"X","name":"overlapping","pid":100,"tid":7,"ts":25.000,"dur":10.000},
    {"ph":"X","name":"unclosed","pid":1,"tid":1,"ts":3.0},
    {"ph":"s","name":"lonely","cat":"launch","pid":1,"tid":1,"ts":1.5,"id":77},
    {"ph":"Z","name":"strange","pid":1,"tid":1,"ts":1},
    {"ph":"X","name":"nameless track","pid":1,"tid":5,"ts":1,"dur":1})JSON");
  const process_result r = run_cli({"trace", "check", path});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  for (const char* expected :
       {"event #13 \"overlapping\"", "without nesting", "event #14 \"unclosed\"", "unclosed",
        "event #15 \"lonely\"", "no flow end", "event #16 \"strange\"", "unknown phase",
        "pid 1 tid 5 has no thread_name", "FAILED: 5 problem(s)"}) {
    EXPECT_NE(r.out.find(expected), std::string::npos) << expected << " not in:\n" << r.out;
  }
  const process_result capped = run_cli({"trace", "check", "--max-issues", "2", path});
  EXPECT_EQ(capped.exit_code, 1);
  EXPECT_NE(capped.out.find("and 3 more"), std::string::npos) << capped.out;
  std::remove(path.c_str());
}

TEST(trace_cli, check_of_a_missing_or_broken_file_fails) {
  require_trace_command();
  process_result r = run_cli({"trace", "check", "/nonexistent-poolscope-dir/x.json"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("poolscope trace check: cannot open trace"), std::string::npos) << r.err;
  const std::string path = temp_path("poolscope-broken") + ".json";
  {
    std::ofstream f(path);
    f << R"JSON({"traceEvents":[{"ph":"X")JSON";
  }
  r = run_cli({"trace", "check", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE((r.out + r.err).find("not valid JSON"), std::string::npos) << r.out << r.err;
  std::remove(path.c_str());
}

TEST(trace_cli, summary_matches_hand_computed_figures) {
  require_trace_command();
  const std::string path = write_trace(valid_events);
  const std::string json_path = temp_path("poolscope-summary") + ".json";
  const process_result r =
      run_cli({"trace", "summary", path, "--top", "3", "--json", json_path, "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("device 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("overlap ratio 0.500"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("scale(float*, int)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Memcpy HtoD"), std::string::npos) << r.out;
  std::ifstream f(json_path);
  const json j = json::parse(f);
  ASSERT_EQ(j["devices"].size(), 1U);
  const json& d = j["devices"][0];
  EXPECT_EQ(d["device"], 0);
  EXPECT_EQ(d["compute_ns"], 30000);
  EXPECT_EQ(d["transfer_ns"], 20000);
  EXPECT_EQ(d["both_ns"], 10000);
  EXPECT_DOUBLE_EQ(d["overlap_ratio"].get<double>(), 0.5);
  EXPECT_EQ(d["busy_ns"], 40000);
  EXPECT_EQ(d["idle_ns"], 60000);
  ASSERT_EQ(d["top_kernels"].size(), 1U);
  EXPECT_EQ(d["top_kernels"][0]["count"], 2);
  EXPECT_EQ(d["top_kernels"][0]["total_ns"], 30000);
  ASSERT_EQ(d["top_copies"].size(), 1U);
  EXPECT_DOUBLE_EQ(d["top_copies"][0]["gbps"].get<double>(), 2.0);  // 40000 B / 20000 ns
  std::remove(path.c_str());
  std::remove(json_path.c_str());
}

// --range: only the time inside the slices of that name. Two "phase" slices, [15,25) and
// [45,55) us, over valid_events: compute [15,25) + [50,55) = 15 us, transfer [20,25) = 5 us, all
// of it under compute (ratio 1); window 20 us, busy 15, idle 5.
TEST(trace_cli, summary_of_a_range_counts_only_its_slices) {
  require_trace_command();
  const std::string path = write_trace(valid_events + R"JSON(,
  {"ph":"X","name":"phase","cat":"user","pid":1,"tid":1,"ts":15.000,"dur":10.000},
  {"ph":"X","name":"phase","cat":"user","pid":1,"tid":1,"ts":45.000,"dur":10.000})JSON");
  const process_result r = run_cli({"trace", "summary", path, "--range", "phase", "--json", "-"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // With --json -, stdout holds the JSON alone and the text goes to stderr.
  EXPECT_NE(r.err.find("range 'phase': 2 slice(s), sum of slices 0.020 ms, union 0.020 ms"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("overlap ratio 1.000"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("window 20.000 us in 2 ranges"), std::string::npos) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["devices"].size(), 1U);
  const json& d = j["devices"][0];
  EXPECT_EQ(d["window_ns"], 20000);
  EXPECT_EQ(d["compute_ns"], 15000);
  EXPECT_EQ(d["transfer_ns"], 5000);
  EXPECT_EQ(d["both_ns"], 5000);
  EXPECT_EQ(d["idle_ns"], 5000);
  EXPECT_EQ(j["windows"].size(), 2U);

  // --each: the first phase has its transfer all under compute, the second no transfer ("-").
  const process_result each = run_cli({"trace", "summary", path, "--range", "phase", "--each"});
  ASSERT_EQ(each.exit_code, 0) << each.out << each.err;
  EXPECT_NE(each.out.find("per range (2)"), std::string::npos) << each.out;
  // (the last column: no pool grew in either)
  EXPECT_NE(each.out.find("15.000 us       10.000 us      1.000  -\n"), std::string::npos)
      << each.out;
  EXPECT_NE(each.out.find("45.000 us       10.000 us          -  -\n"), std::string::npos)
      << each.out;
  EXPECT_NE(run_cli({"trace", "summary", path, "--each"}).exit_code, 0);  // needs --range

  // A name the trace lacks: exit 1, naming it and the host slices there are.
  const process_result bad = run_cli({"trace", "summary", path, "--range", "nope"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("no slice named 'nope'"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("phase"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("step"), std::string::npos) << bad.err;
  std::remove(path.c_str());
}

// --range over slices that overlap: [10,30) and [20,40) us of "op" sum to 40 us, but their union
// (the window every device's figures count) is 30 us; the text gives both, the JSON too.
TEST(trace_cli, summary_of_overlapping_ranges_gives_their_sum_and_their_union) {
  require_trace_command();
  const std::string path = write_trace(valid_events + R"JSON(,
  {"ph":"X","name":"op","cat":"user","pid":1,"tid":1,"ts":10.000,"dur":20.000},
  {"ph":"X","name":"op","cat":"user","pid":1,"tid":2,"ts":20.000,"dur":20.000})JSON");
  const std::string json_path = temp_path("poolscope-summary") + ".json";
  const process_result r =
      run_cli({"trace", "summary", path, "--range", "op", "--json", json_path, "--force"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("range 'op': 2 slice(s), sum of slices 0.040 ms, union 0.030 ms"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("window 30.000 us"), std::string::npos) << r.out;
  const json j = json::parse(poolscope::testing::read_file(json_path));
  EXPECT_EQ(j["devices"][0]["window_ns"], 30000);
  ASSERT_EQ(j["ranges"].size(), 1U);
  EXPECT_EQ(j["ranges"][0]["name"], "op");
  EXPECT_EQ(j["ranges"][0]["slices"], 2);
  EXPECT_EQ(j["ranges"][0]["sum_ns"], 40000);
  EXPECT_EQ(j["ranges"][0]["union_ns"], 30000);
  std::remove(json_path.c_str());
  std::remove(path.c_str());
}

// A trace with nothing to count is an error, not a summary of zeros.
TEST(trace_cli, summary_of_a_trace_without_a_usable_event_fails) {
  require_trace_command();
  const std::string path = temp_path("poolscope-broken") + ".json";
  std::ofstream(path) << R"JSON({"traceEvents":[{"ph":"X","name":"broken","pid":1,"tid":1}]})JSON";
  const process_result r = run_cli({"trace", "summary", path});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("poolscope trace summary: '" + path +
                       "' holds no usable event (1 events, 1 "
                       "of them unreadable"),
            std::string::npos)
      << r.err;
  std::remove(path.c_str());
}

TEST(trace_cli, summary_of_a_missing_file_fails_with_a_message) {
  require_trace_command();
  const process_result r = run_cli({"trace", "summary", "/nonexistent-poolscope-dir/x.json"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot open"), std::string::npos) << r.err;
}

}  // namespace

#endif  // POOLSCOPE_CLI_PATH
