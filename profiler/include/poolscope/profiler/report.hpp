// report: the JSON report of a run (schema: docs/report_schema.md) — run metadata, kernel, copy
// and scope summaries, memory peaks, the overlap analysis, and a `profiles` slot where the line
// and function profilers' reports go.
//
//   poolscope::profiler::timeline tl{{.trace_path = "run.json.gz"}};
//   tl.start(); run(); tl.stop();
//   auto r = poolscope::profiler::run_report::from(tl);
//   r.add_profile("function", nlohmann::json::parse(fprof.report().to_json()));
//   r.add_profile("line", nlohmann::json::parse(lprof.report().to_json()));
//   r.set_metadata("command", "train --steps 10");
//   r.write("run.report.json");
//
// Ownership: a plain value holding a timeline_summary snapshot and the added JSON.
// Thread safety: none (a value; use from one thread). Stream semantics: none.
// Cost: to_json is linear in the number of summarized kernels, copies, scopes and allocators.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "poolscope/profiler/timeline.hpp"

namespace poolscope::profiler {

/// The report's schema name and version (docs/report_schema.md).
inline constexpr const char* report_schema = "poolscope.report";
inline constexpr int report_schema_version = 1;

/// A run's report. See the file comment.
class run_report {
 public:
  /// A report of `summary`.
  explicit run_report(timeline_summary summary);
  /// A report of `t`'s summary (the final one once `t` is stopped).
  [[nodiscard]] static run_report from(const timeline& t);

  /// Puts `profile` under "profiles"/`name`, replacing one of the same name. Any JSON value.
  void add_profile(const std::string& name, nlohmann::json profile);
  /// Puts `value` under "run"/`key` (beside the built-in metadata, which it may not replace:
  /// invalid_argument for a built-in key).
  void set_metadata(const std::string& key, nlohmann::json value);

  [[nodiscard]] const timeline_summary& summary() const noexcept { return summary_; }
  [[nodiscard]] const nlohmann::json& profiles() const noexcept { return profiles_; }

  /// The whole report (docs/report_schema.md).
  [[nodiscard]] nlohmann::json to_json() const;
  /// Writes to_json() to `path` (indented). Throws runtime_error naming the path on failure.
  void write(const std::string& path) const;

 private:
  timeline_summary summary_;
  nlohmann::json profiles_ = nlohmann::json::object();
  nlohmann::json metadata_ = nlohmann::json::object();
};

/// The JSON of a collector status, as the report's run.cupti holds it.
[[nodiscard]] nlohmann::json to_json(const cupti_status& s);
/// The JSON of a timeline's counters, as the report's run.timeline holds it.
[[nodiscard]] nlohmann::json to_json(const timeline_stats& s);

}  // namespace poolscope::profiler
