// `poolscope trace check FILE` and `poolscope trace summary FILE`: the CLI over the profiler's
// trace checker and summary (profiler/trace_check.hpp, profiler/overlap.hpp; docs/trace.md).
//
//   poolscope trace check run.json.gz          # exit 0 and "OK: ..." or exit 1 and the problems
//   poolscope trace summary run.json.gz --top 5 --json summary.json
//   poolscope trace summary trace.json --range demo.fused   # only while the fused op ran
//   poolscope trace summary trace.json --range demo.fused --each   # and each run's overlap
//
// Exit codes: check: 0 valid, 1 problems found (listed, each naming its event); summary: 0, or 1
// with a message if the file cannot be read or parsed.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "poolscope/bench/cli_checks.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/overlap.hpp"
#include "poolscope/profiler/trace_check.hpp"

namespace poolscope::tools {

namespace {

struct trace_command {
  std::string file;
  std::size_t max_issues = 200;
  bool quiet = false;
  std::size_t top = 10;
  std::string json_path;
  std::vector<std::string> ranges;
  bool each = false;
};

void run_check(const trace_command& cmd) {
  const profiler::trace_check_result r =
      profiler::check_trace(cmd.file, {.max_issues = cmd.max_issues});
  if (!cmd.quiet || !r.ok()) {
    std::cout << r.to_text();
  }
  std::cout.flush();
  if (!r.ok()) {
    throw CLI::RuntimeError(1);
  }
}

// The slices named by --range, each name's count printed; a name with none is an error that
// lists the names the trace has.
std::vector<profiler::interval> range_windows(const trace_command& cmd) {
  std::vector<profiler::interval> windows;
  for (const std::string& name : cmd.ranges) {
    profiler::trace_ranges r = profiler::find_trace_ranges(cmd.file, name);
    if (r.found.empty()) {
      std::string known;
      for (const std::string& n : r.host_names) {
        known += (known.empty() ? "" : ", ") + n;
      }
      throw invalid_argument("trace summary --range: no slice named '" + name + "' in '" +
                             cmd.file + "'" +
                             (known.empty() ? std::string("; it has no host slices")
                                            : "; its host slices include: " + known));
    }
    std::uint64_t ns = 0;
    for (const profiler::interval& w : r.found) {
      ns += static_cast<std::uint64_t>(w.end_ns - w.begin_ns);
    }
    std::printf("range '%s': %zu slice(s), %.3f ms in all\n", name.c_str(), r.found.size(),
                static_cast<double>(ns) / 1e6);
    windows.insert(windows.end(), r.found.begin(), r.found.end());
  }
  return windows;
}

void run_summary(const trace_command& cmd) {
  const profiler::trace_summary s =
      cmd.ranges.empty() ? profiler::summarize_trace(cmd.file)
                         : profiler::summarize_trace(cmd.file, range_windows(cmd), cmd.each);
  std::fflush(stdout);
  std::cout << s.to_text(cmd.top);
  if (!cmd.json_path.empty()) {
    const std::string text =
        s.to_json(cmd.top).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (cmd.json_path == "-") {
      std::cout << text;
    } else {
      std::ofstream out(cmd.json_path, std::ios::out | std::ios::trunc);
      out << text;
      out.close();
      if (!out) {
        throw runtime_error("cannot write '" + cmd.json_path + "'");
      }
    }
  }
  std::cout.flush();
}

}  // namespace

/// `poolscope trace check|summary FILE`.
void register_trace(CLI::App& app) {
  auto* trace = app.add_subcommand(
      "trace", "check or summarise a Chrome trace written by poolscope's timeline (plain or .gz)");
  trace->require_subcommand(1);

  auto check_cmd = std::make_shared<trace_command>();
  auto* check = trace->add_subcommand(
      "check",
      "validate a trace: JSON, required fields per phase, nesting per track, counters, paired "
      "flows, named tracks; exit 1 with the list of problems");
  check->add_option("file", check_cmd->file, "the trace (.json or .json.gz)")->required();
  check->add_option("--max-issues", check_cmd->max_issues, "problems listed (all are counted)")
      ->check(poolscope::bench::positive_number());
  check->add_flag("-q,--quiet", check_cmd->quiet, "print nothing when the trace is valid");
  check->callback([check_cmd] { run_check(*check_cmd); });

  auto summary_cmd = std::make_shared<trace_command>();
  auto* summary = trace->add_subcommand(
      "summary",
      "per device: compute and transfer busy time, time both were active, overlap ratio, idle "
      "time, top kernels and copies; then the CUDA API calls that took the most host time; "
      "with --range, only while the slices of that name ran");
  summary->add_option("file", summary_cmd->file, "the trace (.json or .json.gz)")->required();
  summary->add_option("--top", summary_cmd->top,
                      "kernels and copies listed per device, and CUDA API calls");
  summary->add_option("--json", summary_cmd->json_path,
                      "also write the summary as JSON to this file ('-': stdout)");
  auto* range = summary->add_option(
      "--range", summary_cmd->ranges,
      "count only the time inside every slice of this name (a scope such as demo.fused, an NVTX "
      "range, a darray op); repeat to add names");
  summary
      ->add_flag("--each", summary_cmd->each,
                 "with --range: also each slice's own overlap per device (slices that overlap "
                 "count as one)")
      ->needs(range);
  summary->callback([summary_cmd] { run_summary(*summary_cmd); });
}

}  // namespace poolscope::tools
