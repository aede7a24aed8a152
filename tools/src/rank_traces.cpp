// One trace of every rank (rank_traces.hpp).
#include "rank_traces.hpp"

#include <cstdio>
#include <exception>
#include <filesystem>
#include <vector>

#include "launch.hpp"
#include "poolscope/analysis/trace_check.hpp"
#include "poolscope/analysis/trace_merge.hpp"
#include "rank_files.hpp"

namespace poolscope::tools {

namespace {
std::string us_text(const char* f, std::int64_t ns) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, static_cast<double>(ns) / 1e3);
  return buf;
}

// "N events, a process per rank, K piece flows between ranks; one host, one clock (...)".
std::string summary_of(const analysis::merge_result& r, std::uint64_t events) {
  std::string s = std::to_string(events) + " events, a process per rank, " +
                  std::to_string(r.flows) + " piece flows between ranks; ";
  if (!r.clocks_measured) {
    return s + "clocks not sampled";
  }
  if (r.max_skew_ns == 0 && r.max_uncertainty_ns == 0) {
    return s + us_text("one host, one clock (barriers measured up to %.1f us)",
                       r.max_same_host_offset_ns);
  }
  return s + us_text("clock skew %.1f us", r.max_skew_ns) +
         us_text(", aligned to within %.1f us", r.max_uncertainty_ns);
}

}  // namespace

merged_trace merge_rank_traces(darray::process_group& g, const std::string& requested,
                               const std::string& mine) {
  merged_trace m;
  m.path = merged_output_path(requested);
  const std::filesystem::path beside = std::filesystem::path(m.path).parent_path();
  const rank_files traces =
      gather_rank_files(g, mine, beside.empty() ? "." : beside.string(), "trace");
  m.rank_paths = traces.paths;
  if (g.rank() == 0 && !traces.problem.empty()) {
    m.problem = traces.problem;
  } else if (g.rank() == 0) {
    try {
      const analysis::merge_result r = analysis::merge_traces(traces.paths, m.path);
      const auto check = analysis::check_trace(m.path);
      if (!check.ok()) {
        m.problem = check.to_text();
      }
      m.summary = summary_of(r, check.events);
    } catch (const std::exception& e) {
      m.problem = e.what();
    }
  }
  // Rank 0's verdict on every rank ("ok", or "x" and the problem).
  const std::string verdict =
      g.all_gather(g.rank() == 0 ? (m.problem.empty() ? "ok" : "x" + m.problem) : "").front();
  m.problem = verdict == "ok" ? std::string() : verdict.substr(1);
  return m;
}

}  // namespace poolscope::tools
