// `poolscope trace check FILE`, `poolscope trace summary FILE` and `poolscope trace merge -o OUT
// FILE...`: the CLI over the trace checker, summary and merge (analysis/trace_check.hpp,
// trace_summary.hpp, trace_merge.hpp; docs/trace.md).
//
//   poolscope trace check run.json.gz          # exit 0 and "OK: ..." or exit 1 and the problems
//   poolscope trace summary run.json.gz --top 5 --json summary.json
//   poolscope trace summary trace.json --range demo.fused   # only while the fused op ran
//   poolscope trace summary trace.json --range demo.fused --each   # and each run's overlap
//   poolscope trace merge -o t.json t.rank0.json t.rank1.json      # one timeline of the ranks
//
// Exit codes: check: 0 valid, 1 problems found (listed, each naming its event); summary and
// merge: 0, or 1 with a message if a file cannot be read, parsed or written or holds no usable
// event; all: 2 for a usage error.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_checks.hpp"
#include "cli_files.hpp"
#include "output_option.hpp"
#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/analysis/trace_merge.hpp"
#include "poolscope/analysis/trace_summary.hpp"
#include "poolscope/error.hpp"

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
  std::vector<std::string> inputs;  ///< merge
  std::string output;               ///< merge
  bool quiet_merge = false;
  bool force = false;
};

void run_merge(const trace_command& cmd) {
  std::vector<file_argument> files;
  for (std::size_t i = 0; i < cmd.inputs.size(); ++i) {
    files.push_back({"FILE " + std::to_string(i + 1), cmd.inputs[i], false});
  }
  files.push_back({"-o", cmd.output, true});
  check_file_arguments("poolscope trace merge", files, cmd.force);
  const analysis::merge_result r = analysis::merge_traces(cmd.inputs, cmd.output);
  if (!cmd.quiet_merge) {
    std::cout << r.to_text();
  }
  std::cout.flush();
}

void run_check(const trace_command& cmd) {
  const analysis::trace_check_result r =
      analysis::check_trace(cmd.file, {.max_issues = cmd.max_issues});
  if (r.events == 0 && r.issue_count == 1 && !r.issues.empty() && r.issues.front().index < 0) {
    // The file itself cannot be read or is not JSON: an error like any command's, on stderr.
    std::string why = r.issues.front().message;
    if (why.starts_with("poolscope: ")) {
      why.erase(0, 11);
    }
    throw runtime_error("poolscope trace check: " + why);
  }
  if (!cmd.quiet || !r.ok()) {
    std::cout << r.to_text();
  }
  std::cout.flush();
  if (!r.ok()) {
    throw CLI::RuntimeError(1);
  }
}

// What --range found for one name: its slices, the sum of their lengths (a slice that overlaps
// another counts in full) and the length of their union (overlapping time once: what the
// summary's window is made of).
struct range_found {
  std::string name;
  std::vector<profiler::interval> slices;
  std::uint64_t sum_ns = 0;
  std::uint64_t union_ns = 0;
};

// The slices named by --range; a name with none is an error that lists the names the trace has.
std::vector<range_found> find_ranges(const trace_command& cmd) {
  std::vector<range_found> out;
  for (const std::string& name : cmd.ranges) {
    analysis::trace_ranges r = analysis::find_trace_ranges(cmd.file, name);
    if (r.found.empty()) {
      std::string known;
      for (const std::string& n : r.host_names) {
        known += (known.empty() ? "" : ", ") + n;
      }
      throw invalid_argument("--range: no slice named '" + name + "' in '" + cmd.file + "'" +
                             (known.empty() ? std::string("; it has no host slices")
                                            : "; its host slices include: " + known));
    }
    range_found f{name, std::move(r.found), 0, 0};
    for (const profiler::interval& w : f.slices) {
      f.sum_ns += static_cast<std::uint64_t>(w.end_ns - w.begin_ns);
    }
    f.union_ns = profiler::total_length(profiler::merge_intervals(f.slices));
    out.push_back(std::move(f));
  }
  return out;
}

void run_summary(const trace_command& cmd) {
  check_file_arguments("poolscope trace summary",
                       {{"FILE", cmd.file, false}, {"--json", cmd.json_path, true}}, cmd.force);
  // With the JSON on stdout, stdout holds nothing else: the text goes to stderr.
  std::ostream& text = cmd.json_path == "-" ? std::cerr : std::cout;
  const std::vector<range_found> ranges = find_ranges(cmd);
  std::vector<profiler::interval> windows;
  for (const range_found& f : ranges) {
    // Slices of one name may overlap (nested scopes, ops on several threads): their sum then
    // exceeds their union, and the union is what the per-device window counts.
    char line[512];
    std::snprintf(line, sizeof line,
                  "range '%s': %zu slice(s), sum of slices %.3f ms, union %.3f ms (overlapping "
                  "slices counted once)\n",
                  f.name.c_str(), f.slices.size(), static_cast<double>(f.sum_ns) / 1e6,
                  static_cast<double>(f.union_ns) / 1e6);
    text << line;
    windows.insert(windows.end(), f.slices.begin(), f.slices.end());
  }
  const analysis::trace_summary s = cmd.ranges.empty()
                                        ? analysis::summarize_trace(cmd.file)
                                        : analysis::summarize_trace(cmd.file, windows, cmd.each);
  if (s.events <= s.malformed) {
    throw runtime_error("poolscope trace summary: '" + cmd.file + "' holds no usable event (" +
                        std::to_string(s.events) + " events, " + std::to_string(s.malformed) +
                        " of them unreadable; poolscope trace check " + cmd.file + " names them)");
  }
  text << s.to_text(cmd.top);
  text.flush();
  if (!cmd.json_path.empty()) {
    nlohmann::json j = s.to_json(cmd.top);
    if (!ranges.empty()) {
      // Per --range name (the summary's "windows" are the union of them all).
      nlohmann::json& rj = j["ranges"] = nlohmann::json::array();
      for (const range_found& f : ranges) {
        rj.push_back({{"name", f.name},
                      {"slices", f.slices.size()},
                      {"sum_ns", f.sum_ns},
                      {"union_ns", f.union_ns}});
      }
    }
    write_output("poolscope trace summary", "--json", cmd.json_path,
                 j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
}

}  // namespace

/// `poolscope trace check|summary FILE`, `poolscope trace merge -o OUT FILE...`.
void register_trace(CLI::App& app) {
  auto* trace = app.add_subcommand(
      "trace",
      "check, summarise or merge Chrome traces written by poolscope's timeline (plain or .gz)");
  trace->require_subcommand(1);

  auto check_cmd = std::make_shared<trace_command>();
  auto* check = trace->add_subcommand(
      "check",
      "validate a trace: JSON, required fields per phase, nesting per track, counters, paired "
      "flows, named tracks; exit 1 with the list of problems");
  check->add_option("file", check_cmd->file, "the trace (.json or .json.gz)")->required();
  check->add_option("--max-issues", check_cmd->max_issues, "problems listed (all are counted)")
      ->check(poolscope::tools::positive_number());
  check->add_flag("-q,--quiet", check_cmd->quiet, "print nothing when the trace is valid");
  check->callback([check_cmd] { run_check(*check_cmd); });

  auto summary_cmd = std::make_shared<trace_command>();
  auto* summary = trace->add_subcommand(
      "summary",
      "per device: compute and transfer busy time, time both were active, overlap ratio, idle "
      "time, top kernels and copies; then the CUDA API calls that took the most host time; "
      "with --range, only while the slices of that name ran");
  summary->add_option("file", summary_cmd->file, "the trace (.json or .json.gz)")->required();
  summary
      ->add_option("--top", summary_cmd->top,
                   "kernels and copies listed per device, and CUDA API calls")
      ->check(poolscope::tools::non_negative_number());
  summary
      ->add_option("--json", summary_cmd->json_path,
                   "also write the summary as JSON to this file ('-': stdout, the text then "
                   "goes to stderr)")
      ->check(path_value(true))
      ->transform(output_path_option());
  summary->add_flag("--force", summary_cmd->force, "replace the --json file if it exists");
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

  auto merge_cmd = std::make_shared<trace_command>();
  auto* merge = trace->add_subcommand(
      "merge",
      "join the traces of the ranks of one launch (t.rank0.json t.rank1.json ...) into one "
      "trace: a process per rank, clocks aligned to rank 0's from the samples each rank took "
      "around barriers, flows from each reshard piece's send to its receive");
  merge->add_option("-o,--output", merge_cmd->output, "the merged trace to write (.gz compresses)")
      ->required()
      ->check(path_value())
      ->transform(output_path_option());
  merge->add_option("files", merge_cmd->inputs, "the ranks' traces (.json or .json.gz)")
      ->required();
  merge->add_flag("-q,--quiet", merge_cmd->quiet_merge, "print nothing");
  merge->add_flag("--force", merge_cmd->force, "replace the -o file if it exists");
  merge->callback([merge_cmd] { run_merge(*merge_cmd); });
}

}  // namespace poolscope::tools
