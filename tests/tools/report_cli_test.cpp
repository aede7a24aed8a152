// `poolscope report` on run reports (profiler/report.hpp, what `poolscope demo --report`
// writes): parsed in-process (register_report on a fresh CLI::App, stdout captured) on reports
// written here through run_report; the output is checked against the embedded profiles' own
// renderings. Line and function profile files are covered by replay_cli_test.cpp.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "in_process_cli.hpp"
#include "subprocess.hpp"

#if defined(POOLSCOPE_TEST_REPLAY_CLI) && __has_include("poolscope/profiler/report.hpp")
#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/line_profile.hpp"
#include "poolscope/profiler/report.hpp"
#include "profile_report.hpp"
#include "profiler/profile_test_data.hpp"

namespace poolscope::tools {
void register_report(CLI::App& app);
}  // namespace poolscope::tools

namespace {

using nlohmann::json;
using poolscope::testing::temp_path;

/// Runs `poolscope report args...` in-process; returns stdout.
std::string run_report_cli(const std::vector<std::string>& args) {
  return poolscope::testing::run_in_process(args, poolscope::tools::register_report);
}

/// What `poolscope report` prints for the line profile `p` by default (1 % of its peak), or with
/// --show-live.
std::string table_of(const poolscope::profiler::line_profile& p, bool show_live = false) {
  poolscope::tools::profile_report_options o;
  o.threshold_bytes = poolscope::tools::resolve_threshold("1%", p);
  o.threshold_text = "1%";
  o.show_live = show_live;
  return poolscope::tools::profile_report_text(p, o);
}

std::string error_of(const std::vector<std::string>& args) {
  try {
    (void)run_report_cli(args);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

poolscope::profiler::function_profile scopes_profile() {
  poolscope::profiler::function_profile f;
  poolscope::profiler::scope_record step;
  step.name = "step";
  step.calls = 4;
  step.cpu_total_ns = 4000000;
  step.cpu_self_ns = 1000000;
  step.used_bytes = 1 << 20;
  f.scopes = {step};
  return f;
}

// <root> -> main (m.cpp:3) -> grow (m.cpp:9): self used 3000, rounded 3072
poolscope::profiler::line_profile stacks_profile() {
  using namespace poolscope::profiler::test_data;
  auto main_node = source_frame("main", "m.cpp", 3);
  main_node.children = {source_frame("grow", "m.cpp", 9, allocations(1, 3000, 3072))};
  return profile_of({main_node});
}

/// A run report as the demo writes it: a timeline summary with a scope summary of its own
/// ("scopes" at the top level, as a function profile has) and the profiles under "profiles".
std::string write_run_report(bool function, bool line) {
  poolscope::profiler::timeline_summary summary;
  summary.trace_path = "run.json";
  summary.scopes.push_back({.name = "step", .category = "user", .count = 4, .total_ns = 4000000});
  poolscope::profiler::run_report r{summary};
  if (function) {
    r.add_profile("function", json::parse(scopes_profile().to_json()));
  }
  if (line) {
    r.add_profile("line", json::parse(stacks_profile().to_json()));
  }
  const std::string path = temp_path("poolscope-run-report") + ".json";
  r.write(path);
  return path;
}

TEST(report_cli, run_report_prints_the_profiles_it_holds) {
  // It was taken for a function profile (it has "scopes") and refused: "key 'gpu_timing' not
  // found", though poolscope itself wrote it.
  const std::string path = write_run_report(true, true);
  const std::string out = run_report_cli({"report", path});
  const std::string expected = "function profile (profiles.function):\n" +
                               scopes_profile().to_table() + "\nline profile (profiles.line):\n" +
                               table_of(stacks_profile());
  EXPECT_EQ(out, expected);
  EXPECT_NE(out.find("grow (m.cpp:9)"), std::string::npos) << out;

  // The line profile's options apply to the embedded one.
  const std::string live = run_report_cli({"report", path, "--show-live"});
  EXPECT_NE(live.find(table_of(stacks_profile(), true)), std::string::npos) << live;
  EXPECT_NE(live.find("live at peak"), std::string::npos) << live;
  EXPECT_EQ(run_report_cli({"report", path, "--folded", "--metric", "rounded"}),
            "main (m.cpp:3);grow (m.cpp:9) 3072\n");
  std::remove(path.c_str());
}

TEST(report_cli, run_report_with_one_profile_or_none) {
  const std::string only_function = write_run_report(true, false);
  EXPECT_EQ(run_report_cli({"report", only_function}),
            "function profile (profiles.function):\n" + scopes_profile().to_table());
  std::string m = error_of({"report", only_function, "--folded"});
  EXPECT_NE(m.find(only_function), std::string::npos) << m;
  EXPECT_NE(m.find("profiles.line"), std::string::npos) << m;

  const std::string only_line = write_run_report(false, true);
  EXPECT_EQ(run_report_cli({"report", only_line}),
            "line profile (profiles.line):\n" + table_of(stacks_profile()));

  const std::string none = write_run_report(false, false);
  m = error_of({"report", none});
  EXPECT_NE(m.find(none), std::string::npos) << m;
  EXPECT_NE(m.find("run report"), std::string::npos) << m;

  // A broken embedded profile is named.
  json broken = json::parse(poolscope::testing::read_file(only_function));
  broken["profiles"]["line"] = {{"format", "poolscope.line_profile"}, {"version", 1}};
  const std::string broken_path = temp_path("poolscope-run-report") + ".json";
  {
    std::ofstream f(broken_path);
    f << broken.dump();
  }
  m = error_of({"report", broken_path});
  EXPECT_NE(m.find("profiles.line"), std::string::npos) << m;
  EXPECT_NE(m.find(broken_path), std::string::npos) << m;
  for (const auto& p : {only_function, only_line, none, broken_path}) {
    std::remove(p.c_str());
  }
}

/// A run report whose "profiles" member is `profiles` (JSON text), written as text so that
/// nothing in the test recurses over it.
std::string write_raw_run_report(const std::string& profiles) {
  const std::string path = temp_path("poolscope-run-report") + ".json";
  std::ofstream f(path);
  f << "{\"schema\":\"" << poolscope::profiler::report_schema << "\",\"profiles\":" << profiles
    << "}";
  return path;
}

// `poolscope report` re-serialised a run report's embedded profiles (dump(), which recurses once
// per level) before parsing them again: a crafted report nested 200,000 deep overflowed the
// stack before the line profile's depth check ran. Now the parsed documents are used as they
// are, and a deeply nested value is refused with an error naming the profile.
TEST(report_cli, deeply_nested_run_report_is_refused_not_a_crash) {
  constexpr std::size_t levels = 200000;
  const std::string line = poolscope::profiler::test_data::nested_profile_json(levels);
  const std::string deep_line = write_raw_run_report("{\"line\":" + line + "}");
  std::string m = error_of({"report", deep_line});
  EXPECT_NE(m.find("profiles.line"), std::string::npos) << m.substr(0, 500);
  EXPECT_NE(m.find("nested more than 1024"), std::string::npos) << m.substr(0, 500);
  m = error_of({"report", deep_line, "--folded"});
  EXPECT_NE(m.find("nested more than 1024"), std::string::npos) << m.substr(0, 500);

  // A function profile has no nesting of its own: a nested value where a flag belongs is named
  // by its type (printing it would recurse as deep).
  const std::string brackets = std::string(levels, '[') + std::string(levels, ']');
  const std::string deep_function =
      write_raw_run_report(R"({"function":{"gpu_timing":)" + brackets +
                           R"(,"gpu_pending":0,"gpu_dropped":0,"scopes":[]}})");
  m = error_of({"report", deep_function});
  EXPECT_NE(m.find("profiles.function"), std::string::npos) << m.substr(0, 500);
  EXPECT_NE(m.find("'gpu_timing' is an array"), std::string::npos) << m.substr(0, 500);

  // Nesting where nothing reads it (the parser and the destructor do not recurse) is harmless.
  const std::string elsewhere = write_raw_run_report(
      "{\"line\":" + json::parse(stacks_profile().to_json()).dump() + ",\"x\":" + brackets + "}");
  EXPECT_EQ(run_report_cli({"report", elsewhere}),
            "line profile (profiles.line):\n" + table_of(stacks_profile()));
  for (const auto& p : {deep_line, deep_function, elsewhere}) {
    std::remove(p.c_str());
  }
}

}  // namespace

#endif  // POOLSCOPE_TEST_REPLAY_CLI
