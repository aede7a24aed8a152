// `poolscope report FILE`: renders a saved profiler report. A line-profile JSON
// (profiler/line_profile.hpp, docs/line_profile.md) prints as its text tree, or as folded stacks
// with --folded; a function-profile JSON (profiler/function_profiler.hpp) prints as its table; a
// run report (profiler/report.hpp, `poolscope demo --report`) prints the profiles it holds.
// Which one the file is, is found from its content. Several files (the profiles of the ranks of
// one launch: POOLSCOPE_PROFILE=p.%r.json, `poolscope demo --report` under mpirun) are shown side
// by side and summed (analysis/rank_profiles.hpp).
//
// A line profile prints as a labelled table (profile_report.hpp): by default the call sites with
// at least 1 % of the profile's peak, at most 10 callees under each, functions without their
// parameter lists, and in a Python process each run of the interpreter's own frames as one node
// (analysis/interpreter_frames.hpp; --full-stacks keeps them).
//
//   poolscope report alloc.json                    # --threshold 1% --top 10
//   poolscope report alloc.json --threshold 1M --top 0 --full-names --full-stacks
//   poolscope report alloc.json --folded --metric rounded > alloc.folded
//   poolscope report scopes.json
//   poolscope report r.rank0.json r.rank1.json r.rank2.json
//
// Exit codes: 0; 1 with a message naming the file if it cannot be read or is neither kind; 2 for
// a usage error.
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_checks.hpp"
#include "poolscope/analysis/interpreter_frames.hpp"
#include "poolscope/analysis/line_profile_reader.hpp"
#include "poolscope/analysis/rank_profiles.hpp"
#include "poolscope/byte_size.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/line_profile.hpp"
#include "poolscope/profiler/report.hpp"
#include "profile_report.hpp"

namespace poolscope::tools {

namespace {

struct report_command {
  std::vector<std::string> files;
  std::string file;  // the one being read
  std::string threshold = "1%";
  std::size_t top = 10;
  bool full_names = false;
  bool show_live = false;
  bool full_stacks = false;
  bool folded = false;
  std::string metric = "used";
};

// The documents are taken as parsed, never serialised again: dump() recurses once per level,
// and a crafted file nested 100,000 deep would overflow the stack before the profiles' own depth
// checks ran. (nlohmann's parser and destructor do not recurse.)
profiler::line_profile parse_line_profile(const report_command& cmd, const nlohmann::json& doc,
                                          const std::string& where) {
  try {
    return analysis::line_profile_from_json_document(doc);
  } catch (const std::exception& e) {
    throw invalid_argument("poolscope report: '" + cmd.file + "'" + where + ": " + e.what());
  }
}

profiler::function_profile parse_function_profile(const report_command& cmd,
                                                  const nlohmann::json& doc,
                                                  const std::string& where) {
  try {
    return profiler::function_profile::from_json_document(doc);
  } catch (const std::exception& e) {
    throw invalid_argument("poolscope report: '" + cmd.file + "'" + where + ": " + e.what());
  }
}

// `p` as shown: its runs of interpreter frames collapsed unless --full-stacks.
analysis::collapsed_profile as_shown(const report_command& cmd, const profiler::line_profile& p) {
  if (cmd.full_stacks) {
    return analysis::collapsed_profile{p};
  }
  return analysis::collapse_interpreter_frames(p);
}

void print_line_profile(const report_command& cmd, const analysis::collapsed_profile& shown,
                        profiler::profile_metric metric) {
  const profiler::line_profile& p = shown.profile;
  if (cmd.folded) {
    std::cout << p.to_folded(metric);
    return;
  }
  profile_report_options o;
  o.threshold_bytes = resolve_threshold(cmd.threshold, p);
  o.threshold_text = cmd.threshold;
  o.top = cmd.top;
  o.full_names = cmd.full_names;
  o.show_live = cmd.show_live;
  o.interpreter_runs = shown.runs;
  o.interpreter_frames = shown.frames;
  std::cout << profile_report_text(p, o);
}

// A run report (profiler/report.hpp: "schema": "poolscope.report", what `poolscope demo
// --report` writes) carries its profiles under "profiles": the function profile's table and the
// line profile's tree (or folded stacks) are printed from there.
void report_run(const report_command& cmd, const nlohmann::json& doc,
                profiler::profile_metric metric) {
  const auto profiles = doc.find("profiles");
  const bool have_profiles = profiles != doc.end() && profiles->is_object();
  const auto function = have_profiles ? profiles->find("function") : doc.end();
  const auto line = have_profiles ? profiles->find("line") : doc.end();
  const bool have_function = have_profiles && function != profiles->end();
  const bool have_line = have_profiles && line != profiles->end();
  if (cmd.folded) {
    if (!have_line) {
      throw invalid_argument("poolscope report: '" + cmd.file +
                             "' is a run report without a line profile (profiles.line); "
                             "--folded needs one");
    }
    print_line_profile(cmd, as_shown(cmd, parse_line_profile(cmd, *line, " (profiles.line)")),
                       metric);
    return;
  }
  if (!have_function && !have_line) {
    throw invalid_argument("poolscope report: '" + cmd.file +
                           "' is a run report holding no function or line profile "
                           "(profiles.function, profiles.line)");
  }
  // Both parsed before anything is printed: a broken second profile leaves no half output.
  std::optional<profiler::function_profile> fp;
  std::optional<profiler::line_profile> lp;
  if (have_function) {
    fp = parse_function_profile(cmd, *function, " (profiles.function)");
  }
  if (have_line) {
    lp = parse_line_profile(cmd, *line, " (profiles.line)");
  }
  if (fp) {
    std::cout << "function profile (profiles.function):\n" << fp->to_table();
  }
  if (lp) {
    std::cout << (fp ? "\n" : "") << "line profile (profiles.line):\n";
    print_line_profile(cmd, as_shown(cmd, *lp), metric);
  }
}

nlohmann::json read_document(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw runtime_error("poolscope report: cannot open '" + file + "'");
  }
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    throw invalid_argument("poolscope report: '" + file + "' is not a JSON object");
  }
  return doc;
}

// One rank's profiles, and what to call it.
struct rank_profiles {
  std::string label;
  std::optional<profiler::function_profile> function;
  std::optional<profiler::line_profile> line;
};

// The profiles `cmd.file` holds; its label is "rank R" when it says which rank wrote it (a run
// report of the demo under a launcher), else "#i".
rank_profiles load_rank(const report_command& cmd, std::size_t i) {
  const nlohmann::json doc = read_document(cmd.file);
  rank_profiles r;
  r.label = "#" + std::to_string(i + 1);
  const auto format = doc.find("format");
  const auto schema = doc.find("schema");
  if (format != doc.end() && *format == "poolscope.line_profile") {
    r.line = parse_line_profile(cmd, doc, "");
  } else if (schema != doc.end() && *schema == profiler::report_schema) {
    const auto run = doc.find("run");
    if (run != doc.end() && run->is_object()) {
      const auto demo = run->find("demo");
      if (demo != run->end() && demo->is_object()) {
        const auto rank = demo->find("rank");
        if (rank != demo->end() && rank->is_number_integer()) {
          r.label = "rank " + std::to_string(rank->get<std::int64_t>());
        }
      }
    }
    const nlohmann::json& profiles = doc.value("profiles", nlohmann::json::object());
    if (profiles.is_object() && profiles.contains("function")) {
      r.function = parse_function_profile(cmd, profiles["function"], " (profiles.function)");
    }
    if (profiles.is_object() && profiles.contains("line")) {
      r.line = parse_line_profile(cmd, profiles["line"], " (profiles.line)");
    }
  } else if (doc.contains("scopes")) {
    r.function = parse_function_profile(cmd, doc, "");
  }
  if (!r.function && !r.line) {
    throw invalid_argument("poolscope report: '" + cmd.file +
                           "' holds no function or line profile");
  }
  return r;
}

// Several ranks' profiles: those every file holds, side by side, then summed.
void report_ranks(const report_command& cmd, profiler::profile_metric metric) {
  std::vector<rank_profiles> ranks;
  for (std::size_t i = 0; i < cmd.files.size(); ++i) {
    report_command one = cmd;
    one.file = cmd.files[i];
    ranks.push_back(load_rank(one, i));
  }
  std::vector<std::string> labels;
  std::vector<profiler::function_profile> functions;
  std::vector<profiler::line_profile> lines;
  for (const rank_profiles& r : ranks) {
    labels.push_back(r.label);
    if (r.function) {
      functions.push_back(*r.function);
    }
    if (r.line) {
      lines.push_back(*r.line);
    }
  }
  const bool all_functions = functions.size() == ranks.size() && !cmd.folded;
  const bool all_lines = lines.size() == ranks.size();
  if (!all_functions && !all_lines) {
    throw invalid_argument("poolscope report: the " + std::to_string(ranks.size()) +
                           " files hold no profile kind in common (a line profile in each, or "
                           "a function profile in each" +
                           (cmd.folded ? std::string(": --folded needs line profiles)") : ")"));
  }
  if (cmd.folded) {
    std::cout << as_shown(cmd, analysis::sum_profiles(lines)).profile.to_folded(metric);
    return;
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    std::cout << (i == 0 ? "profiles: " : ", ") << labels[i] << " " << cmd.files[i];
  }
  std::cout << "\n";
  if (all_functions) {
    std::cout << "\nfunction profiles side by side (calls, inclusive CPU time):\n"
              << analysis::side_by_side(labels, functions, cmd.top)
              << "\nfunction profiles summed over " << ranks.size() << " ranks:\n"
              << analysis::sum_profiles(functions).to_table();
  }
  if (all_lines) {
    // Compared with each rank's interpreter frames collapsed, so the call sites where the ranks
    // branch are the program's; summed first, then collapsed, so the ranks' runs merge.
    std::vector<profiler::line_profile> shown;
    for (const profiler::line_profile& p : lines) {
      shown.push_back(as_shown(cmd, p).profile);
    }
    std::cout << "\nline profiles side by side (used, acquired bytes below each call site):\n"
              << analysis::side_by_side(labels, shown, cmd.top) << "\nline profiles summed over "
              << ranks.size() << " ranks:\n";
    print_line_profile(cmd, as_shown(cmd, analysis::sum_profiles(lines)), metric);
  }
}

void run_report(report_command cmd) {
  if (cmd.threshold.empty() || cmd.threshold.back() != '%') {
    (void)parse_byte_size(cmd.threshold);  // a bad count is refused before the file is read
  }
  const profiler::profile_metric metric = profiler::parse_profile_metric(cmd.metric);
  if (cmd.files.size() > 1) {
    report_ranks(cmd, metric);
    std::cout.flush();
    return;
  }
  cmd.file = cmd.files.front();
  const nlohmann::json doc = read_document(cmd.file);
  const auto string_field = [&doc](const char* key) {
    const auto it = doc.find(key);
    return it != doc.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (string_field("format") == "poolscope.line_profile") {
    print_line_profile(cmd, as_shown(cmd, parse_line_profile(cmd, doc, "")), metric);
  } else if (string_field("schema") == profiler::report_schema) {
    // Checked before "scopes": a run report has a "scopes" summary of its own.
    report_run(cmd, doc, metric);
  } else if (doc.contains("scopes")) {
    if (cmd.folded) {
      throw invalid_argument("poolscope report: '" + cmd.file +
                             "' is a function profile; --folded needs a line profile");
    }
    std::cout << parse_function_profile(cmd, doc, "").to_table();
  } else {
    throw invalid_argument("poolscope report: '" + cmd.file +
                           "' is neither a line profile (format \"poolscope.line_profile\"), a "
                           "function profile (\"scopes\") nor a run report (schema \"" +
                           profiler::report_schema + "\")");
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
      "function-profile JSON as its table, a run report as the profiles it holds");
  sub->add_option("files", cmd->files,
                  "the JSON report; several (the ranks' of one launch): side by side and summed")
      ->required()
      ->check(path_value());
  sub->add_option("--threshold", cmd->threshold,
                  "line profile: leave out call sites below this many used and acquired bytes: "
                  "a share of the profile's peak (5%) or a byte count (suffixes K, M, G: 1M; 0 "
                  "shows all)")
      ->capture_default_str();
  sub->add_option("--top", cmd->top,
                  "line profile: callees shown under each call site (0: all); several files: "
                  "the scopes and call sites side by side")
      ->check(whole_number(0, 1000000))
      ->capture_default_str();
  sub->add_flag("--full-names", cmd->full_names,
                "line profile: keep the functions' parameter lists");
  sub->add_flag("--full-stacks", cmd->full_stacks,
                "line profile: keep the Python interpreter's own frames (by default each run of "
                "them is one node, '... N interpreter frames')");
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
