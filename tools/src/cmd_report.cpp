// `poolscope report FILE`: renders a saved profiler report. A line-profile JSON
// (profiler/line_profile.hpp, docs/line_profile.md) prints as its text tree, or as folded stacks
// with --folded; a function-profile JSON (profiler/function_profiler.hpp) prints as its table.
// Which one the file is, is found from its content.
//
//   poolscope report alloc.json --threshold 1M
//   poolscope report alloc.json --folded --metric rounded > alloc.folded
//   poolscope report scopes.json
//
// Exit codes: 0, or 1 with a message naming the file if it cannot be read or is neither kind.
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "byte_size.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/line_profile.hpp"

namespace poolscope::tools {

namespace {

struct report_command {
  std::string file;
  std::string threshold = "0";
  bool show_live = false;
  bool folded = false;
  std::string metric = "used";
};

void run_report(const report_command& cmd) {
  const std::size_t threshold = parse_byte_size(cmd.threshold);
  const profiler::profile_metric metric = profiler::parse_profile_metric(cmd.metric);
  std::ifstream in(cmd.file, std::ios::binary);
  if (!in) {
    throw runtime_error("poolscope report: cannot open '" + cmd.file + "'");
  }
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    throw invalid_argument("poolscope report: '" + cmd.file + "' is not a JSON object");
  }
  const auto format = doc.find("format");
  if (format != doc.end() && format->is_string() &&
      format->get<std::string>() == "poolscope.line_profile") {
    profiler::line_profile p;
    try {
      p = profiler::line_profile::from_json(text);
    } catch (const std::exception& e) {
      throw invalid_argument("poolscope report: '" + cmd.file + "': " + e.what());
    }
    if (cmd.folded) {
      std::cout << p.to_folded(metric);
    } else {
      std::cout << p.to_text({.threshold_bytes = threshold, .show_live = cmd.show_live});
    }
  } else if (doc.contains("scopes")) {
    if (cmd.folded) {
      throw invalid_argument("poolscope report: '" + cmd.file +
                             "' is a function profile; --folded needs a line profile");
    }
    profiler::function_profile p;
    try {
      p = profiler::function_profile::from_json(text);
    } catch (const std::exception& e) {
      throw invalid_argument("poolscope report: '" + cmd.file + "': " + e.what());
    }
    std::cout << p.to_table();
  } else {
    throw invalid_argument("poolscope report: '" + cmd.file +
                           "' is neither a line profile (format \"poolscope.line_profile\") nor "
                           "a function profile (\"scopes\")");
  }
  std::cout.flush();
}

}  // namespace

/// `poolscope report FILE`.
void register_report(CLI::App& app) {
  auto cmd = std::make_shared<report_command>();
  auto* sub = app.add_subcommand(
      "report",
      "render a saved report: a line-profile JSON as its text tree (or folded stacks), a "
      "function-profile JSON as its table");
  sub->add_option("file", cmd->file, "the JSON report")->required();
  sub->add_option("--threshold", cmd->threshold,
                  "line profile: leave out call sites below this many used and acquired bytes "
                  "(suffixes K, M, G: 1M)");
  sub->add_flag("--show-live", cmd->show_live,
                "line profile: also show live and live-at-peak bytes and calls");
  sub->add_flag("--folded", cmd->folded,
                "line profile: print folded stacks (flamegraph.pl, speedscope) instead");
  sub->add_option("--metric", cmd->metric,
                  "figure of the folded stacks: used, rounded, acquired, live, live_at_peak, "
                  "count")
      ->check(CLI::IsMember(std::vector<std::string>{"used", "rounded", "acquired", "live",
                                                     "live_at_peak", "count"}));
  sub->callback([cmd] { run_report(*cmd); });
}

}  // namespace poolscope::tools
