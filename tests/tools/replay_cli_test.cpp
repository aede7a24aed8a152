// `poolscope replay` and `poolscope report`, parsed in-process (register_replay/register_report
// on a fresh CLI::App, stdout captured) on logs and reports written here by hand; figures are
// checked against values computed by hand.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "in_process_cli.hpp"
#include "poolscope/analysis/event_log.hpp"
#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/line_profile.hpp"
#include "profile_report.hpp"
#include "profiler/profile_test_data.hpp"
#include "subprocess.hpp"

#ifdef POOLSCOPE_TEST_REPLAY_CLI

namespace poolscope::tools {
void register_replay(CLI::App& app);
void register_report(CLI::App& app);
}  // namespace poolscope::tools

namespace {

using nlohmann::json;
using poolscope::testing::temp_path;

/// Runs `poolscope replay|report args...` in-process; returns stdout.
std::string run_cli(const std::vector<std::string>& args) {
  return poolscope::testing::run_in_process(args, poolscope::tools::register_replay,
                                            poolscope::tools::register_report);
}

std::string write_file(const std::string& stem, const std::string& text) {
  const std::string path = temp_path(stem);
  std::ofstream f(path, std::ios::binary);
  f << text;
  return path;
}

std::string rec(int seq, const char* action, const char* ptr, int size, const char* phase) {
  return R"({"seq":)" + std::to_string(seq) + R"(,"time_ns":)" + std::to_string(1000 + seq) +
         R"(,"thread":7,"device":-1,"stream":"0x0","allocator":"rec/host","allocator_id":1,)" +
         R"("action":")" + action + R"(","phase":")" + phase + R"(","ptr":")" + ptr +
         R"(","size":)" + std::to_string(size) + R"(,"rounded":)" + std::to_string(size) + "}\n";
}

// malloc A 1000, malloc B 3000, free A, malloc C 2000, free B, free C.
// By hand: live requested 1000, 4000, 3000, 5000, 2000, 0 -> peak requested 5000.
// Under a 4096-byte host capacity with naive (which takes exactly the requested bytes from the
// resource): A, B fit (4000), C would make 5000 -> 1 failed allocation, peak requested 4000.
std::string hand_log() {
  return std::string(R"({"format":"poolscope.events","version":1,"pid":1})") + "\n" +
         rec(1, "malloc", "0x1000", 1000, "post") + rec(2, "malloc", "0x2000", 3000, "post") +
         rec(3, "free", "0x1000", 1000, "pre") + rec(4, "malloc", "0x3000", 2000, "post") +
         rec(5, "free", "0x2000", 3000, "pre") + rec(6, "free", "0x3000", 2000, "pre");
}

json replay_json(const std::vector<std::string>& extra, const std::string& log) {
  std::vector<std::string> args{"replay", log, "--json", "-"};
  args.insert(args.end(), extra.begin(), extra.end());
  // With --json -, stdout holds the JSON alone (the table goes to stderr).
  return json::parse(run_cli(args));
}

TEST(replay_cli, peaks_and_counts_match_hand_computation) {
  const std::string log = write_file("poolscope-replay", hand_log());
  const json j = replay_json({"--allocators", "naive,best_fit,bfc"}, log);
  EXPECT_EQ(j["format"], "poolscope");
  EXPECT_EQ(j["records"], 6);
  ASSERT_EQ(j["results"].size(), 3U);
  for (const auto& r : j["results"]) {
    SCOPED_TRACE(r["allocator"].get<std::string>());
    EXPECT_EQ(r["peak_requested"], 5000);
    EXPECT_EQ(r["mallocs"], 3);
    EXPECT_EQ(r["frees"], 3);
    EXPECT_EQ(r["failed_allocations"], 0);
    EXPECT_EQ(r["unknown_frees"], 0);
    EXPECT_GE(r["peak_reserved"].get<std::size_t>(), 5000U);
  }
  const auto& naive = j["results"][0];
  EXPECT_EQ(naive["allocator"].get<std::string>().rfind("naive", 0), 0U);
  // naive: one upstream call per malloc and free, exactly the requested bytes.
  EXPECT_EQ(naive["peak_reserved"], 5000);
  EXPECT_EQ(naive["upstream_allocs"], 3);
  EXPECT_EQ(naive["upstream_frees"], 3);
  EXPECT_DOUBLE_EQ(naive["ratio"].get<double>(), 1.0);
}

TEST(replay_cli, every_resource_listed_is_replayed_under_every_strategy) {
  // Over host_vmm, bfc's peak reserved is the memory it mapped: whole 2 MiB granules, so the
  // hand log's 5000 bytes at most take the three blocks' granules (three at most, at least one).
  const std::string log = write_file("poolscope-replay", hand_log());
  const json j = replay_json({"--allocators", "naive,bfc", "--resource", "host,host_vmm"}, log);
  EXPECT_EQ(j["resource"], json::array({"host", "host_vmm"}));
  ASSERT_EQ(j["results"].size(), 4U);
  const std::vector<std::string> expected{"naive/host", "bfc/host", "naive/host_vmm",
                                          "bfc/host_vmm"};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto& r = j["results"][i];
    EXPECT_EQ(r["allocator"], expected[i]);
    EXPECT_EQ(r["peak_requested"], 5000);
    EXPECT_EQ(r["failed_allocations"], 0);
  }
  const std::size_t bfc_vmm = j["results"][3]["peak_reserved"].get<std::size_t>();
  EXPECT_GE(bfc_vmm, std::size_t{2} << 20);
  EXPECT_LE(bfc_vmm, std::size_t{6} << 20);
  EXPECT_EQ(j["results"][2]["peak_reserved"], 5000) << "naive counts what it asked for";
}

// The cells of the table row that starts with `name` in `out` (split at spaces); none if there
// is no such row.
std::vector<std::string> cells_of(const std::string& out, const std::string& name) {
  const std::size_t at = out.find("\n" + name + " ");
  if (at == std::string::npos) {
    return {};
  }
  std::istringstream row(out.substr(at + 1, out.find('\n', at + 1) - at - 1));
  return {std::istream_iterator<std::string>(row), {}};
}

TEST(replay_cli, table_and_summary_line) {
  const std::string log = write_file("poolscope-replay", hand_log());
  const std::string out = run_cli({"replay", log, "--allocators", "naive,best_fit"});
  // Units in the headings: 5000 bytes requested, best_fit's 512-byte rounding: below 10 KiB, so
  // bytes.
  EXPECT_NE(out.find("peak (B)"), std::string::npos) << out;
  EXPECT_NE(out.find("malloc ("), std::string::npos) << out;
  EXPECT_NE(out.find("summary: 2 allocators, 3 mallocs replayed, 0 failed"), std::string::npos)
      << out;
  EXPECT_NE(out.find("lowest peak reserved without a failure: "), std::string::npos) << out;
  EXPECT_NE(out.find("; fastest: "), std::string::npos) << out;
  EXPECT_EQ(out.find("\nlog: "), std::string::npos) << out;  // a complete, consistent log
  std::istringstream lines(out);
  std::string line;
  std::getline(lines, line);  // "replay of ..."
  std::vector<std::string> table;
  while (std::getline(lines, line) && !line.starts_with("summary")) {
    table.push_back(line);
  }
  // Two heading lines, a row per strategy; one resource, so the rows name the strategy alone.
  ASSERT_EQ(table.size(), 4U) << out;
  EXPECT_TRUE(table[1].starts_with("allocator ")) << out;
  EXPECT_TRUE(table[2].starts_with("naive ")) << out;
  EXPECT_TRUE(table[3].starts_with("best_fit ")) << out;
  // Aligned: the names and every row are one width, at most 100 columns, and a figure ends
  // where its name does. The hand log's figures, by hand: 5000 B requested at peak; naive
  // reserves exactly that, at a ratio of 1.000, with 3 upstream allocations.
  for (const std::string& l : table) {
    EXPECT_LE(l.size(), 100U) << out;
  }
  EXPECT_EQ(table[2].size(), table[1].size()) << out;
  EXPECT_EQ(table[3].size(), table[1].size()) << out;
  std::istringstream naive_row(table[2]);
  std::vector<std::string> cells{std::istream_iterator<std::string>(naive_row), {}};
  ASSERT_GE(cells.size(), 7U) << out;
  EXPECT_EQ(cells[1], "5000") << out;   // requested
  EXPECT_EQ(cells[2], "5000") << out;   // reserved
  EXPECT_EQ(cells[3], "1.000") << out;  // reserved / requested
  EXPECT_EQ(cells[4], "3") << out;      // upstream allocs
  EXPECT_EQ(cells[5], "0") << out;      // failed allocs
  const auto name_end = table[1].find("reserved") + std::string("reserved").size();
  EXPECT_NE(table[2][name_end - 1], ' ') << "a figure ends under the end of its name:\n" << out;
  EXPECT_EQ(table[2].substr(name_end - 4, 4), "5000") << out;

  // bfc's 2 MiB segment makes the unit KiB: naive's 5000 bytes read 4.9, one 16-byte block
  // "<0.1", never a 0.0 that is not zero.
  const std::string kib = run_cli({"replay", log, "--allocators", "naive,bfc"});
  EXPECT_NE(kib.find("peak (KiB)"), std::string::npos) << kib;
  EXPECT_EQ(cells_of(kib, "naive").at(1), "4.9") << kib;
  EXPECT_EQ(cells_of(kib, "bfc").at(2), "2048.0") << kib;
  const std::string tiny_log =
      write_file("poolscope-replay",
                 std::string(R"({"format":"poolscope.events","version":1,"pid":1})") + "\n" +
                     rec(1, "malloc", "0x1000", 16, "post") + rec(2, "free", "0x1000", 16, "pre"));
  const std::string tiny = run_cli({"replay", tiny_log, "--allocators", "naive,bfc"});
  EXPECT_EQ(cells_of(tiny, "naive").at(1), "<0.1") << tiny;
  EXPECT_EQ(cells_of(tiny, "naive").at(2), "<0.1") << tiny;

  // --wide: the peaks to the byte, the peak handed out, upstream frees, the slowest calls.
  const std::string wide = run_cli({"replay", log, "--allocators", "naive", "--wide"});
  EXPECT_NE(wide.find("peak (B)"), std::string::npos) << wide;
  for (const char* name : {"in use", "frees", "max"}) {
    EXPECT_NE(wide.find(name), std::string::npos) << name << "\n" << wide;
  }
  std::istringstream wide_lines(wide);
  std::vector<std::string> wide_table;
  while (std::getline(wide_lines, line)) {
    wide_table.push_back(line);
  }
  ASSERT_GE(wide_table.size(), 4U) << wide;
  std::istringstream wide_row(wide_table[3]);
  std::vector<std::string> wide_cells{std::istream_iterator<std::string>(wide_row), {}};
  ASSERT_GE(wide_cells.size(), 8U) << wide;
  // naive: requested, in use and reserved 5000; 3 upstream allocations and 3 frees.
  EXPECT_EQ(wide_cells[1], "5000") << wide;
  EXPECT_EQ(wide_cells[3], "5000") << wide;
  EXPECT_EQ(wide_cells[5], "3") << wide;
  EXPECT_EQ(wide_cells[6], "3") << wide;
}

TEST(replay_cli, several_resources_name_each_row_by_strategy_and_resource) {
  const std::string log = write_file("poolscope-replay", hand_log());
  const std::string out =
      run_cli({"replay", log, "--allocators", "naive,bfc", "--resource", "host,host_vmm"});
  for (const char* name :
       {"\nnaive/host ", "\nbfc/host ", "\nnaive/host_vmm ", "\nbfc/host_vmm "}) {
    EXPECT_NE(out.find(name), std::string::npos) << name << "\n" << out;
  }
}

// The best by memory is the lowest peak reserved among the strategies that failed nothing: under
// a capacity that fails naive (it takes exactly what is asked, and C does not fit), bfc and
// best_fit are still judged, and naive is not named even if its peak is lower.
TEST(replay_cli, best_is_chosen_among_strategies_without_failures) {
  const std::string log = write_file("poolscope-replay", hand_log());
  const json j = replay_json({"--allocators", "naive", "--capacity", "4096"}, log);
  ASSERT_EQ(j["results"][0]["failed_allocations"], 1);
  const std::string out = run_cli({"replay", log, "--allocators", "naive", "--capacity", "4096"});
  EXPECT_NE(out.find("every strategy failed allocations under this capacity"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("lowest peak reserved without a failure"), std::string::npos) << out;
}

TEST(replay_cli, an_empty_log_is_an_error) {
  const std::string empty =
      write_file("poolscope-empty", R"({"format":"poolscope.events","version":1,"pid":1})"
                                    "\n");
  try {
    (void)run_cli({"replay", empty});
    ADD_FAILURE() << "an empty log replayed";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("holds no allocation records"), std::string::npos)
        << e.what();
  }
  const std::string frees_only = write_file(
      "poolscope-frees", std::string(R"({"format":"poolscope.events","version":1,"pid":1})") +
                             "\n" + rec(1, "free", "0x1000", 1000, "pre"));
  try {
    (void)run_cli({"replay", frees_only});
    ADD_FAILURE() << "a log without a malloc replayed";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("no malloc to replay"), std::string::npos) << e.what();
  }
}

TEST(replay_cli, an_inconsistent_log_is_said_so_under_the_table) {
  // The hand log, then a double free of A, a free of a pointer never allocated, a block D
  // allocated twice with no free between and never freed: the replay leaves the two frees out,
  // frees D's first block at its second malloc, and says all three, and D.
  const std::string log = write_file(
      "poolscope-replay",
      hand_log() + rec(7, "free", "0x1000", 1000, "pre") + rec(8, "free", "0x9000", 64, "pre") +
          rec(9, "malloc", "0x4000", 512, "post") + rec(10, "malloc", "0x4000", 256, "post"));
  const std::string out = run_cli({"replay", log, "--allocators", "naive,bfc"});
  EXPECT_NE(out.find("\nlog: 2 frees of pointers not live (left out: double frees, or a log "
                     "begun mid-run); 1 malloc of a pointer still live (its free is not in the "
                     "log: freed there); 1 block never freed\n"),
            std::string::npos)
      << out;
  const json j = replay_json({"--allocators", "naive"}, log);
  EXPECT_EQ(j["results"][0]["unknown_frees"], 2);
  EXPECT_EQ(j["results"][0]["implied_frees"], 1);
  EXPECT_EQ(j["results"][0]["live_at_end"], 1);
  EXPECT_EQ(j["results"][0]["peak_requested"], 5000);
}

TEST(replay_cli, capacity_with_suffix_fails_the_allocation_over_it) {
  const std::string log = write_file("poolscope-replay", hand_log());
  for (const char* cap : {"4096", "4K", "4KiB"}) {
    SCOPED_TRACE(cap);
    const json j = replay_json({"--allocators", "naive", "--capacity", cap}, log);
    EXPECT_EQ(j["capacity"], 4096);
    const auto& r = j["results"][0];
    EXPECT_EQ(r["failed_allocations"], 1);
    EXPECT_EQ(r["frees_of_failed"], 1);  // the free of C
    EXPECT_EQ(r["peak_requested"], 4000);
    EXPECT_EQ(r["peak_reserved"], 4000);
  }
}

TEST(replay_cli, rmm_csv_log) {
  const std::string log = write_file("poolscope-replay-rmm",
                                     "Thread,Time,Action,Pointer,Size,Stream\n"
                                     "1,10:00:00.000001,allocate,0x1000,1000,0x0\n"
                                     "1,10:00:00.000002,allocate,0x2000,3000,0x0\n"
                                     "1,10:00:00.000003,free,0x1000,1000,0x0\n"
                                     "1,10:00:00.000004,allocate,0x3000,2000,0x0\n"
                                     "1,10:00:00.000005,allocate failure,(nil),999999,0x0\n"
                                     "1,10:00:00.000006,free,0x2000,3000,0x0\n"
                                     "1,10:00:00.000007,free,0x3000,2000,0x0\n");
  const json j = replay_json({"--allocators", "naive"}, log);
  EXPECT_EQ(j["format"], "rmm_csv");
  const auto& r = j["results"][0];
  EXPECT_EQ(r["peak_requested"], 5000);
  EXPECT_EQ(r["recorded_failures"], 1);
  EXPECT_EQ(r["failed_allocations"], 0);
}

TEST(replay_cli, corrupt_line_is_named) {
  std::string text = hand_log();
  const auto third = text.find('\n', text.find('\n') + 1);  // after line 2
  text.insert(third + 1, "{\"seq\": not json\n");           // becomes line 3
  const std::string log = write_file("poolscope-replay-bad", text);
  try {
    (void)run_cli({"replay", log, "--allocators", "naive"});
    FAIL() << "no error for a corrupt line";
  } catch (const poolscope::analysis::parse_error& e) {
    EXPECT_EQ(e.line(), 3U);
    EXPECT_NE(std::string(e.what()).find(log + ":3"), std::string::npos) << e.what();
  }
}

// A log line nested 200,000 deep: nlohmann's parser and destructor do not recurse, and the
// reader never prints a value it refuses, so `poolscope replay` names the line instead of
// overflowing the stack; nesting in a field nobody reads changes nothing.
TEST(replay_cli, deeply_nested_line_is_named_not_a_crash) {
  const std::string brackets = std::string(200000, '[') + std::string(200000, ']');
  std::string text = hand_log();
  const auto second = text.find('\n', text.find('\n') + 1);  // end of line 2
  text.insert(second - 1, R"(,"extra":)" + brackets);        // before line 2's closing brace
  text.insert(text.size() - 2, R"(,"note":)" + brackets);    // before the last line's "}\n"
  const std::string ok = write_file("poolscope-replay-deep", text);
  const json fine = replay_json({"--allocators", "naive"}, ok);
  const json clean =
      replay_json({"--allocators", "naive"}, write_file("poolscope-replay-deep-ref", hand_log()));
  // What the log says (not the latencies, which are measured) is the same as without nesting.
  EXPECT_EQ(fine["records"], clean["records"]);
  ASSERT_EQ(fine["results"].size(), 1U);
  EXPECT_EQ(fine["results"][0]["final_stats"], clean["results"][0]["final_stats"]);
  EXPECT_EQ(fine["results"][0]["final_stats"]["peak_requested"], 5000);

  std::string bad = hand_log();
  const std::string host_device = R"("device":-1)";
  const auto device = bad.find(host_device, bad.find('\n') + 1);  // line 2
  bad.replace(device, host_device.size(), R"("device":)" + brackets);
  const std::string log = write_file("poolscope-replay-deep-bad", bad);
  try {
    (void)run_cli({"replay", log, "--allocators", "naive"});
    FAIL() << "no error for a nested device";
  } catch (const poolscope::analysis::parse_error& e) {
    EXPECT_EQ(e.line(), 2U);
    EXPECT_NE(std::string(e.what()).find("'device'"), std::string::npos)
        << std::string(e.what()).substr(0, 300);
  }
}

TEST(replay_cli, truncated_last_line_is_named) {
  std::string text = hand_log();
  text.resize(text.size() - 20);  // cut line 7 in the middle, no newline
  const std::string log = write_file("poolscope-replay-cut", text);
  try {
    (void)run_cli({"replay", log, "--allocators", "naive"});
    FAIL() << "no error for a truncated log";
  } catch (const poolscope::analysis::parse_error& e) {
    EXPECT_EQ(e.line(), 7U);
    EXPECT_NE(std::string(e.what()).find(":7"), std::string::npos) << e.what();
  }
}

TEST(replay_cli, unknown_allocator_and_bad_capacity_are_clear_errors) {
  const std::string log = write_file("poolscope-replay", hand_log());
  try {
    (void)run_cli({"replay", log, "--allocators", "naive,no_such_pool"});
    FAIL() << "no error for an unknown allocator";
  } catch (const CLI::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_pool"), std::string::npos) << e.what();
  }
  try {
    (void)run_cli({"replay", log, "--capacity", "12Q"});
    FAIL() << "no error for a bad capacity";
  } catch (const CLI::ValidationError& e) {
    EXPECT_NE(std::string(e.what()).find("12Q"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)run_cli({"replay", "/nonexistent/poolscope.jsonl"}), std::exception);
}

// <root> -> main (m.cpp:3) -> big (m.cpp:10) self used 3000, acquired 4096
//                          -> small (m.cpp:20) self used 10
poolscope::profiler::line_profile hand_profile() {
  using namespace poolscope::profiler::test_data;
  auto main_node = source_frame("main", "m.cpp", 3);
  main_node.children = {source_frame("big", "m.cpp", 10, allocations(1, 3000, 3072, 4096, 1)),
                        source_frame("small", "m.cpp", 20, allocations(2, 10, 512))};
  return profile_of({main_node});
}

TEST(report_cli, line_profile_text_threshold_and_folded) {
  const auto p = hand_profile();
  const std::string path = write_file("poolscope-lp", p.to_json());
  // By default: call sites with 1 % of the peak (no peak here: of the 3010 bytes used, 30 B).
  const std::string text = run_cli({"report", path});
  EXPECT_NE(text.find("big (m.cpp:10)"), std::string::npos) << text;
  EXPECT_EQ(text.find("small (m.cpp:20)"), std::string::npos) << text;  // 10 B < 30 B
  EXPECT_NE(text.find("(1 more call site, below the threshold or past --top)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("--threshold 1%"), std::string::npos) << text;
  // Labelled columns, each figure under its name.
  EXPECT_NE(text.find("used  acquired  calls  call site"), std::string::npos) << text;
  EXPECT_NE(text.find("2.93 KiB  4.00 KiB      1      big (m.cpp:10)"), std::string::npos) << text;

  const std::string all = run_cli({"report", path, "--threshold", "0"});
  EXPECT_NE(all.find("small (m.cpp:20)"), std::string::npos) << all;
  const std::string cut = run_cli({"report", path, "--threshold", "1K"});
  EXPECT_NE(cut.find("big (m.cpp:10)"), std::string::npos) << cut;
  EXPECT_EQ(cut.find("small (m.cpp:20)"), std::string::npos) << cut;  // 10 B < 1 KiB
  const std::string top = run_cli({"report", path, "--threshold", "0", "--top", "1"});
  EXPECT_NE(top.find("big (m.cpp:10)"), std::string::npos) << top;
  EXPECT_EQ(top.find("small (m.cpp:20)"), std::string::npos) << top;  // the second callee

  const std::string folded = run_cli({"report", path, "--folded"});
  EXPECT_NE(folded.find("main (m.cpp:3);big (m.cpp:10) 3000\n"), std::string::npos) << folded;
  EXPECT_NE(folded.find("main (m.cpp:3);small (m.cpp:20) 10\n"), std::string::npos) << folded;
  const std::string rounded = run_cli({"report", path, "--folded", "--metric", "rounded"});
  EXPECT_NE(rounded.find("small (m.cpp:20) 512\n"), std::string::npos) << rounded;
}

TEST(report_cli, function_names_lose_their_parameter_lists_unless_asked) {
  using namespace poolscope::profiler::test_data;
  const std::string full =
      "ns::run<int>(std::vector<int, std::allocator<int> > const&, char) const";
  auto node = source_frame(full, "m.cpp", 7, allocations(1, 4096, 4096));
  const std::string path = write_file("poolscope-lp", profile_of({node}).to_json());
  const std::string text = run_cli({"report", path});
  EXPECT_NE(text.find("ns::run<int> (m.cpp:7)"), std::string::npos) << text;
  EXPECT_EQ(text.find("char) const"), std::string::npos) << text;
  const std::string kept = run_cli({"report", path, "--full-names"});
  EXPECT_NE(kept.find(full + " (m.cpp:7)"), std::string::npos) << kept;
}

TEST(report_cli, short_function_names) {
  using poolscope::tools::short_function_name;
  EXPECT_EQ(short_function_name("f(int)"), "f");
  EXPECT_EQ(short_function_name("ns::f<int>(int, char const*) const"), "ns::f<int>");
  EXPECT_EQ(short_function_name("S::operator()(int) const"), "S::operator()");
  EXPECT_EQ(short_function_name("S::operator()"), "S::operator()");
  EXPECT_EQ(short_function_name("main::{lambda(int)#1}::operator()(int) const"),
            "main::{lambda(int)#1}::operator()");
  EXPECT_EQ(short_function_name("std::function<void (int)>::operator()(int) const"),
            "std::function<void (int)>::operator()");
  EXPECT_EQ(short_function_name("bool operator<(A const&, A const&)"), "bool operator<");
  // The functions a lambda is nested in keep their names, their lists shortened.
  EXPECT_EQ(short_function_name("ns::f(int, char)::{lambda()#1}::operator()() const"),
            "ns::f(...)::{lambda()#1}::operator()");
  EXPECT_EQ(short_function_name("S::operator()(unsigned long) const::{lambda(int)#1}::operator()"
                                "(int) const"),
            "S::operator()(...)::{lambda(int)#1}::operator()");
  EXPECT_EQ(
      short_function_name("std::_Function_handler<void (), ns::(anonymous namespace)::g(ns::a "
                          "const&, std::vector<int, std::allocator<int> >&)::{lambda()#4}>::"
                          "_M_invoke(std::_Any_data const&)"),
      "std::_Function_handler<void (), ns::(anonymous namespace)::g(...)::{lambda()#4}>::"
      "_M_invoke");
  EXPECT_EQ(short_function_name("f(int"), "f(int");
  EXPECT_EQ(short_function_name("plain"), "plain");
  EXPECT_EQ(short_function_name("_start"), "_start");
}

TEST(report_cli, function_profile_table) {
  poolscope::profiler::function_profile f;
  poolscope::profiler::scope_record step;
  step.name = "step";
  step.calls = 4;
  step.cpu_total_ns = 4000000;
  step.cpu_self_ns = 1000000;
  step.used_bytes = 1 << 20;
  f.scopes = {step};
  const std::string path = write_file("poolscope-fp", f.to_json());
  const std::string out = run_cli({"report", path});
  EXPECT_EQ(out, f.to_table());
  EXPECT_NE(out.find("step"), std::string::npos) << out;
  EXPECT_THROW((void)run_cli({"report", path, "--folded"}), std::exception);
}

TEST(report_cli, neither_kind_is_an_error) {
  const std::string path = write_file("poolscope-x", R"({"hello": 1})");
  try {
    (void)run_cli({"report", path});
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  const std::string junk = write_file("poolscope-x", "not json");
  EXPECT_THROW((void)run_cli({"report", junk}), std::exception);
}

}  // namespace

#endif  // POOLSCOPE_TEST_REPLAY_CLI
