// `poolscope replay LOG`: replays a recorded allocation log (poolscope's recorder, the jsonl
// debug hook or RMM's CSV log; analysis/event_log.hpp) or a PyTorch memory snapshot
// (analysis/memory_snapshot_reader.hpp, snapshot_trace.hpp) against several allocator strategies
// and prints what each would have done, side by side (analysis/replay.hpp; docs/event_log.md,
// docs/snapshot.md).
//
//   poolscope replay run.jsonl --allocators naive,bfc --capacity 80G --json replay.json
//   poolscope replay snap.pickle       # each device's trace; the snapshot's own peaks beside
//   poolscope replay run.jsonl --resource host,host_vmm    # peak physical memory over each
//   poolscope replay run.jsonl --wide     # every figure (bytes exact, upstream frees, slowest)
//
// The table fits 100 columns: peaks in one byte unit, latencies in one time unit, both in the
// headings; --wide and --json carry the rest.
//
// Exit codes: 0; 1 with a message naming the file and line if the log cannot be read or
// parsed, holds no records or no malloc, or naming the strategy/resource that cannot be built;
// 2 for a usage error. Failed allocations under the capacity are a measurement, not an error.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_checks.hpp"
#include "cli_files.hpp"
#include "output_option.hpp"
#include "poolscope/analysis/event_log.hpp"
#include "poolscope/analysis/memory_snapshot_reader.hpp"
#include "poolscope/analysis/replay.hpp"
#include "poolscope/analysis/snapshot_trace.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_vmm_resource.hpp"
#include "profile_report.hpp"

namespace poolscope::tools {

namespace {

struct replay_command {
  std::string file;
  std::vector<std::string> allocators;
  std::vector<std::string> resources{"host"};
  int device = 0;
  std::string capacity;
  std::string only_allocator;
  std::string json_path;
  bool force = false;
  bool progress = true;
  bool wide = false;
};

/// A progress bar on stderr for one strategy's replay (only called when stderr is a TTY).
std::function<bool(const analysis::replay_progress&)> progress_bar(const std::string& name) {
  return [name](const analysis::replay_progress& p) {
    constexpr int width = 30;
    const double frac =
        p.total == 0 ? 1.0 : static_cast<double>(p.done) / static_cast<double>(p.total);
    const int filled = static_cast<int>(frac * width);
    std::fprintf(stderr, "\r%-14s [%s%s] %3d%%", name.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), static_cast<int>(frac * 100));
    if (p.done >= p.total) {
      std::fprintf(stderr, "\r%*s\r", width + 24, "");
    }
    std::fflush(stderr);
    return true;
  };
}

analysis::replay_result replay_one(const replay_command& cmd, const analysis::event_log& log,
                                   const std::string& resource, const std::string& strategy,
                                   std::size_t capacity) {
  analysis::replay_options opt;
  opt.only_allocator = cmd.only_allocator;
  constexpr std::size_t long_log = std::size_t{1} << 17;
  if (cmd.progress && log.records.size() >= long_log && ::isatty(STDERR_FILENO) != 0) {
    opt.progress = progress_bar(strategy);
    opt.progress_every = std::max<std::size_t>(log.records.size() / 100, 1);
  }
  if (resource == "host") {
    return analysis::replay_on_host(log, strategy, capacity, opt);
  }
  if (resource == "host_vmm") {
    // The capacity is its mapping budget (reserved counts mapped bytes); nothing is touched, so
    // the host needs none of the memory mapped.
    pool::host_vmm_options vo;
    vo.capacity = capacity;
    vo.address_range_bytes = capacity == SIZE_MAX ? std::size_t{1} << 40
                                                  : std::max(vo.address_range_bytes, 2 * capacity);
    pool::host_vmm_resource res{vo};
    auto alloc = pool::make_allocator(strategy, res);
    return analysis::replay(log, *alloc, opt);
  }
  // Device resources: the capacity becomes the allocator's limit (in-use and reserved bytes).
  auto res = pool::make_resource(resource, cmd.device);
  auto alloc = pool::make_allocator(strategy, *res);
  alloc->set_limit(capacity);
  return analysis::replay(log, *alloc, opt);
}

// One unit for a whole column, picked by its largest value, so the column's numbers compare at
// a glance and the unit sits in the header.
struct column_unit {
  const char* name;
  double scale;
};

// The largest unit in which the largest figure reads at least 10: three significant digits or
// more for it, and the column's smaller figures keep theirs (182.9 and 220.0 MiB, not 0.2 and
// 0.2 GiB beside a 1.3 GiB).
column_unit bytes_unit(std::size_t largest) {
  for (const auto& [shift, name] :
       {std::pair{30, "GiB"}, std::pair{20, "MiB"}, std::pair{10, "KiB"}}) {
    if (largest >= (std::size_t{10} << shift)) {
      return {name, 1.0 / static_cast<double>(std::size_t{1} << shift)};
    }
  }
  return {"B", 1.0};
}

column_unit time_unit(double largest_ns) {
  if (largest_ns >= 1e7) {
    return {"ms", 1e-6};
  }
  if (largest_ns >= 1e4) {
    return {"us", 1e-3};
  }
  return {"ns", 1.0};
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// A column of the table: its name, and the group heading above it (columns side by side with
// the same group share one heading, centred over them: "peak (MiB)" over "requested" and
// "reserved"). Two short header lines keep the table narrow where one long name per column would
// not.
struct column {
  std::string group;
  std::string name;
};

// The table: the group line, the names, then the rows; each column as wide as its widest cell
// (and as the other columns of its group, which together are as wide as their heading); the first
// column left-aligned, the others right-aligned, two spaces between columns.
void print_aligned(std::ostream& out, const std::vector<column>& columns,
                   const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(columns.size(), 0);
  for (std::size_t c = 0; c < columns.size(); ++c) {
    width[c] = columns[c].name.size();
    for (const auto& row : rows) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  // The groups: runs of columns [first, last) with one heading.
  std::vector<std::pair<std::size_t, std::size_t>> groups;
  for (std::size_t c = 0; c < columns.size(); ++c) {
    if (c == 0 || columns[c].group != columns[c - 1].group) {
      groups.emplace_back(c, c + 1);
    } else {
      groups.back().second = c + 1;
    }
  }
  const auto span = [&width](std::size_t first, std::size_t last) {
    std::size_t w = 2 * (last - first - 1);
    for (std::size_t c = first; c < last; ++c) {
      w += width[c];
    }
    return w;
  };
  // The columns of a group are as wide as each other (p50 and p99 read as a pair), and together
  // as wide as their heading.
  for (const auto& [first, last] : groups) {
    const std::size_t widest = *std::max_element(width.begin() + first, width.begin() + last);
    std::fill(width.begin() + first, width.begin() + last, widest);
    const std::size_t need = columns[first].group.size();
    if (need > span(first, last)) {
      const std::size_t extra = need - span(first, last);
      const std::size_t k = last - first;
      for (std::size_t c = first; c < last; ++c) {
        width[c] += extra / k + (c + 1 == last ? extra % k : 0);
      }
    }
  }
  std::string line;
  for (const auto& [first, last] : groups) {
    const std::string& heading = columns[first].group;
    const std::size_t room = span(first, last) - heading.size();
    line += (first == 0 ? "" : "  ") + std::string(room - room / 2, ' ') + heading +
            std::string(room / 2, ' ');
  }
  while (!line.empty() && line.back() == ' ') {
    line.pop_back();
  }
  out << line << "\n";
  const auto print_row = [&](const auto& cell_of) {
    std::string text;
    for (std::size_t c = 0; c < columns.size(); ++c) {
      const std::string& cell = cell_of(c);
      const std::string pad(width[c] - cell.size(), ' ');
      text += c == 0 ? cell + pad : "  " + pad + cell;
    }
    out << text << "\n";
  };
  print_row([&](std::size_t c) -> const std::string& { return columns[c].name; });
  for (const auto& row : rows) {
    print_row([&](std::size_t c) -> const std::string& { return row[c]; });
  }
}

// The name a row shows: with one resource (named in the heading) the strategy alone, "bfc" for
// "bfc/host"; with several, the whole name.
std::string row_name(const analysis::replay_result& r, const replay_command& cmd) {
  if (cmd.resources.size() != 1) {
    return r.allocator;
  }
  const std::string tail = "/" + cmd.resources.front();
  const std::size_t at = r.allocator.find(tail);
  const std::size_t end = at == std::string::npos ? at : at + tail.size();
  if (at == std::string::npos || (end != r.allocator.size() && r.allocator[end] != ' ')) {
    return r.allocator;
  }
  return r.allocator.substr(0, at) + r.allocator.substr(at + tail.size());
}

// The table of every strategy. By default what fits a terminal of 100 columns: the peaks in one
// byte unit with one decimal, their ratio, upstream allocations, failures, and the median (p50)
// and 99th percentile (p99) of a malloc's and of a free's time in one time unit. --wide adds
// every figure: the peaks in bytes (and the peak handed out, the allocator's rounding included),
// upstream frees, the slowest call.
void print_table(std::ostream& out, const replay_command& cmd,
                 const std::vector<analysis::replay_result>& results) {
  std::size_t most_bytes = 0;
  double most_ns = 0;
  for (const auto& r : results) {
    most_bytes = std::max({most_bytes, r.peak_requested, r.peak_reserved});
    most_ns = std::max({most_ns, r.malloc_latency.p99_ns, r.free_latency.p99_ns});
    if (cmd.wide) {
      most_ns = std::max({most_ns, r.malloc_latency.max_ns, r.free_latency.max_ns});
    }
  }
  const column_unit b = cmd.wide ? column_unit{"B", 1.0} : bytes_unit(most_bytes);
  const column_unit t = time_unit(most_ns);
  // A figure too small for the column's unit reads "<0.1", never a 0.0 that is not zero.
  const auto bytes = [&b](std::size_t v) {
    const double scaled = static_cast<double>(v) * b.scale;
    if (b.scale == 1.0) {
      return fixed(scaled, 0);
    }
    return v != 0 && scaled < 0.05 ? std::string("<0.1") : fixed(scaled, 1);
  };
  const auto time = [&t](double ns) { return fixed(ns * t.scale, t.scale == 1.0 ? 0 : 1); };
  const std::string peak = std::string("peak (") + b.name + ")";
  const std::string malloc_group = std::string("malloc (") + t.name + ")";
  const std::string free_group = std::string("free (") + t.name + ")";
  std::vector<column> columns{{"", "allocator"}, {peak, "requested"}};
  if (cmd.wide) {
    columns.push_back({peak, "in use"});
  }
  columns.push_back({peak, "reserved"});
  columns.push_back({"reserved /", "requested"});
  columns.push_back({"upstream", "allocs"});
  if (cmd.wide) {
    columns.push_back({"upstream", "frees"});
  }
  columns.push_back({"failed", "allocs"});
  for (const std::string& g : {malloc_group, free_group}) {
    columns.push_back({g, "p50"});
    columns.push_back({g, "p99"});
    if (cmd.wide) {
      columns.push_back({g, "max"});
    }
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : results) {
    std::vector<std::string> row{row_name(r, cmd), bytes(r.peak_requested)};
    if (cmd.wide) {
      row.push_back(bytes(r.peak_in_use));
    }
    row.push_back(bytes(r.peak_reserved));
    row.push_back(fixed(r.ratio, 3));
    row.push_back(std::to_string(r.upstream_allocs));
    if (cmd.wide) {
      row.push_back(std::to_string(r.upstream_frees));
    }
    row.push_back(std::to_string(r.failed_allocations));
    for (const analysis::latency_summary* l : {&r.malloc_latency, &r.free_latency}) {
      row.push_back(time(l->p50_ns));
      row.push_back(time(l->p99_ns));
      if (cmd.wide) {
        row.push_back(time(l->max_ns));
      }
    }
    rows.push_back(std::move(row));
  }
  print_aligned(out, columns, rows);
}

// The summary's verdicts: the lowest peak reserved among the strategies that failed no
// allocation (the memory a run needs), and among those that keep a cache (naive keeps none, so
// it needs least memory and pays an upstream call per request); separately the fastest (lowest
// malloc + free median: the time a request costs).
std::string verdicts(const std::vector<analysis::replay_result>& results) {
  const analysis::replay_result* leanest = nullptr;
  const analysis::replay_result* leanest_pool = nullptr;
  const analysis::replay_result* fastest = nullptr;
  const auto cost = [](const analysis::replay_result& r) {
    return r.malloc_latency.p50_ns + r.free_latency.p50_ns;
  };
  const auto leaner = [](const analysis::replay_result* best, const analysis::replay_result& r) {
    return best == nullptr || r.peak_reserved < best->peak_reserved;
  };
  for (const auto& r : results) {
    if (r.failed_allocations == 0) {
      if (leaner(leanest, r)) {
        leanest = &r;
      }
      if (!r.allocator.starts_with("naive") && leaner(leanest_pool, r)) {
        leanest_pool = &r;
      }
    }
    if (fastest == nullptr || cost(r) < cost(*fastest)) {
      fastest = &r;
    }
  }
  const auto figures = [](const analysis::replay_result& r) {
    return r.allocator + " (" + compact_bytes(r.peak_reserved) + ", " + fixed(r.ratio, 3) +
           " x requested)";
  };
  std::string v;
  if (leanest == nullptr) {
    v += "; every strategy failed allocations under this capacity";
  } else {
    v += "; lowest peak reserved without a failure: " + figures(*leanest);
    if (leanest_pool != nullptr && leanest_pool != leanest) {
      v += ", of the pools that cache: " + figures(*leanest_pool);
    }
  }
  if (fastest != nullptr) {
    v += "; fastest: " + fastest->allocator + " (malloc + free median " + fixed(cost(*fastest), 0) +
         " ns)";
  }
  return v;
}

/// What the log itself says, the same on every strategy: frees of pointers that were not live
/// (a double free, or a log that starts mid-run), mallocs of pointers still live (a lost free),
/// records skipped, failures recorded, events the recorder dropped, blocks never freed (from a
/// replay that failed no allocation: a failed block is not live). Nothing when the log is complete
/// and consistent.
void print_log_notes(std::ostream& out, const std::vector<analysis::replay_result>& results) {
  const analysis::replay_result& r = results.front();
  const auto whole = std::find_if(results.begin(), results.end(),
                                  [](const auto& x) { return x.failed_allocations == 0; });
  std::string notes;
  const auto note = [&notes](std::uint64_t n, const char* one, const char* many) {
    if (n != 0) {
      notes += (notes.empty() ? "" : "; ") + std::to_string(n) + " " + (n == 1 ? one : many);
    }
  };
  note(r.unknown_frees,
       "free of a pointer not live (left out: a double free, or a log begun mid-run)",
       "frees of pointers not live (left out: double frees, or a log begun mid-run)");
  note(r.implied_frees, "malloc of a pointer still live (its free is not in the log: freed there)",
       "mallocs of pointers still live (their frees are not in the log: freed there)");
  note(r.skipped_records, "record skipped (another allocator's, or not a malloc or free)",
       "records skipped (another allocator's, or not a malloc or free)");
  note(r.recorded_failures, "allocation failure recorded", "allocation failures recorded");
  note(r.dropped_events, "event dropped by the recorder (its ring was full; the replay lacks it)",
       "events dropped by the recorder (its ring was full; the replay lacks them)");
  if (whole != results.end()) {
    note(whole->live_at_end, "block never freed", "blocks never freed");
  }
  if (!notes.empty()) {
    out << "log: " << notes << "\n";
  }
}

/// Every strategy replayed on `log`; each result named after `suffix` too (" device 1").
std::vector<analysis::replay_result> replay_all(const replay_command& cmd,
                                                const analysis::event_log& log,
                                                std::size_t capacity, const std::string& suffix) {
  const std::vector<std::string> strategies =
      cmd.allocators.empty() ? pool::allocator_names() : cmd.allocators;
  std::vector<analysis::replay_result> results;
  results.reserve(strategies.size() * cmd.resources.size());
  for (const auto& r : cmd.resources) {
    for (const auto& s : strategies) {
      results.push_back(replay_one(cmd, log, r, s, capacity));
      results.back().allocator += suffix;
    }
  }
  return results;
}

/// The summary line under the table(s): failures in all, the leanest strategy without a failure
/// and the fastest (verdicts).
void print_summary(std::ostream& text, const std::vector<analysis::replay_result>& results,
                   std::uint64_t mallocs) {
  std::uint64_t failed = 0;
  for (const auto& r : results) {
    failed += r.failed_allocations;
  }
  text << "summary: " << results.size() << " allocators, " << mallocs << " mallocs replayed, "
       << failed << " failed allocations in all" << verdicts(results) << "\n";
  text.flush();
}

std::size_t capacity_of(const replay_command& cmd) {
  return cmd.capacity.empty() ? std::numeric_limits<std::size_t>::max()
                              : parse_byte_size(cmd.capacity);
}

void print_heading(std::ostream& text, const replay_command& cmd, std::string_view format,
                   std::size_t records) {
  std::string resources;
  for (const auto& r : cmd.resources) {
    resources += (resources.empty() ? "" : ", ") + r;
  }
  text << "replay of " << cmd.file << " (" << format << ", " << records << " records) on "
       << resources;
  if (!cmd.capacity.empty()) {
    text << ", capacity " << format_bytes(capacity_of(cmd));
  }
  text << "\n";
}

nlohmann::ordered_json json_heading(const replay_command& cmd, std::string_view format,
                                    std::size_t records) {
  nlohmann::ordered_json j;
  j["log"] = cmd.file;
  j["format"] = std::string(format);
  j["records"] = records;
  j["resource"] = cmd.resources.size() == 1 ? nlohmann::ordered_json(cmd.resources.front())
                                            : nlohmann::ordered_json(cmd.resources);
  j["capacity"] = cmd.capacity.empty() ? nlohmann::ordered_json(nullptr)
                                       : nlohmann::ordered_json(capacity_of(cmd));
  return j;
}

void replay_event_log(const replay_command& cmd, std::ostream& text) {
  const std::size_t capacity = capacity_of(cmd);
  const analysis::event_log log = analysis::read_event_log(cmd.file);
  if (!cmd.only_allocator.empty() && std::find(log.allocators.begin(), log.allocators.end(),
                                               cmd.only_allocator) == log.allocators.end()) {
    std::string names;
    for (const auto& n : log.allocators) {
      names += (names.empty() ? "" : ", ") + n;
    }
    throw invalid_argument("poolscope replay: the log has no allocator '" + cmd.only_allocator +
                           "' (it has: " + names + ")");
  }
  if (log.records.empty()) {
    throw runtime_error("poolscope replay: '" + cmd.file +
                        "' holds no allocation records: nothing to replay");
  }
  const std::vector<analysis::replay_result> results = replay_all(cmd, log, capacity, "");
  if (!results.empty() && results.front().mallocs == 0) {
    throw runtime_error("poolscope replay: '" + cmd.file + "' holds " +
                        std::to_string(log.records.size()) + " records but no malloc to replay (" +
                        std::to_string(results.front().skipped_records) +
                        " skipped: another allocator's, or not a malloc or free)");
  }

  print_heading(text, cmd, analysis::to_string(log.format), log.records.size());
  print_table(text, cmd, results);
  if (!results.empty()) {
    print_log_notes(text, results);
  }
  print_summary(text, results, results.empty() ? 0 : results.front().mallocs);

  if (!cmd.json_path.empty()) {
    nlohmann::ordered_json j =
        json_heading(cmd, analysis::to_string(log.format), log.records.size());
    auto& arr = j["results"] = nlohmann::ordered_json::array();
    for (const auto& r : results) {
      arr.push_back(nlohmann::ordered_json::parse(r.to_json()));
    }
    write_output("poolscope replay", "--json", cmd.json_path, j.dump(2) + "\n");
  }
}

/// What a snapshot's trace cannot tell, said: blocks from before its first event (replayed as
/// live at its start), segments held before it, entries its writer dropped.
void print_snapshot_notes(std::ostream& out, const analysis::snapshot_figures& f) {
  if (f.blocks_before_trace != 0) {
    out << "snapshot: the trace begins after " << f.blocks_before_trace << " block"
        << (f.blocks_before_trace == 1 ? "" : "s") << " (" << format_bytes(f.bytes_before_trace)
        << ") were allocated: they open the replay, in address order (when and where they "
           "were allocated is not in the file; what was allocated and freed before the first "
           "event is not either, so the peaks are those from the first event on)\n";
  }
  if (f.reserved_at_start != 0) {
    out << "snapshot: segments of " << format_bytes(f.reserved_at_start)
        << " were held before the first event (counted in source_peak_reserved)\n";
  }
  if (f.segments_inconsistent) {
    out << "snapshot: the segment entries free more than the segments at the end account for "
           "(entries lost): source_peak_reserved is a lower bound\n";
  }
  if (f.frees_not_live != 0) {
    out << "snapshot: " << f.frees_not_live << " free(s) of blocks that were not live (left out)\n";
  }
}

void replay_snapshot(const replay_command& cmd, std::ostream& text) {
  if (!cmd.only_allocator.empty()) {
    throw invalid_argument(
        "poolscope replay: --only-allocator selects a recorded allocator of an event log; '" +
        cmd.file + "' is a memory snapshot (one pool per device, each replayed)");
  }
  const std::size_t capacity = capacity_of(cmd);
  const profiler::memory_snapshot snap = analysis::read_memory_snapshot(cmd.file);
  const std::vector<int> devices = analysis::snapshot_devices(snap);
  std::vector<analysis::snapshot_trace> traces;
  std::size_t records = 0;
  for (int d : devices) {
    traces.push_back(analysis::snapshot_trace_of(snap, d));
    records += traces.back().log.records.size();
  }
  print_heading(text, cmd, "memory_snapshot", records);
  std::vector<analysis::replay_result> all;
  std::vector<int> device_of;
  std::uint64_t mallocs = 0;
  for (const analysis::snapshot_trace& t : traces) {
    const analysis::snapshot_figures& f = t.figures;
    const std::string suffix = devices.size() > 1 ? " dev" + std::to_string(f.device) : "";
    const std::vector<analysis::replay_result> results = replay_all(cmd, t.log, capacity, suffix);
    text << "device " << f.device << ": " << f.entries << " trace entries; the snapshot's own "
         << "source_peak_reserved " << format_bytes(f.source_peak_reserved) << ", peak live "
         << format_bytes(f.source_peak_live) << ", " << f.ooms << " oom(s) recorded\n";
    print_table(text, cmd, results);
    if (!results.empty()) {
      print_log_notes(text, results);
      mallocs += results.front().mallocs;
    }
    print_snapshot_notes(text, f);
    all.insert(all.end(), results.begin(), results.end());
    device_of.insert(device_of.end(), results.size(), f.device);
  }
  print_summary(text, all, mallocs);

  if (!cmd.json_path.empty()) {
    nlohmann::ordered_json j = json_heading(cmd, "memory_snapshot", records);
    auto& figures = j["devices"] = nlohmann::ordered_json::array();
    for (const analysis::snapshot_trace& t : traces) {
      const analysis::snapshot_figures& f = t.figures;
      figures.push_back({{"device", f.device},
                         {"entries", f.entries},
                         {"source_peak_reserved", f.source_peak_reserved},
                         {"source_peak_live", f.source_peak_live},
                         {"reserved_at_start", f.reserved_at_start},
                         {"reserved_at_end", f.reserved_at_end},
                         {"blocks_before_trace", f.blocks_before_trace},
                         {"bytes_before_trace", f.bytes_before_trace},
                         {"ooms", f.ooms},
                         {"segments_inconsistent", f.segments_inconsistent}});
    }
    if (traces.size() == 1) {
      j["source_peak_reserved"] = traces[0].figures.source_peak_reserved;
      j["source_peak_live"] = traces[0].figures.source_peak_live;
    }
    auto& arr = j["results"] = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < all.size(); ++i) {
      nlohmann::ordered_json r = nlohmann::ordered_json::parse(all[i].to_json());
      const auto& f =
          traces[static_cast<std::size_t>(std::find(devices.begin(), devices.end(), device_of[i]) -
                                          devices.begin())]
              .figures;
      r["device"] = device_of[i];
      r["source_peak_reserved"] = f.source_peak_reserved;
      r["source_peak_live"] = f.source_peak_live;
      arr.push_back(std::move(r));
    }
    write_output("poolscope replay", "--json", cmd.json_path, j.dump(2) + "\n");
  }
}

/// True if the file at `path` starts like a pickle (a memory snapshot).
bool is_snapshot_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[2] = {};
  in.read(head, 2);
  return in.gcount() == 2 && analysis::looks_like_pickle(std::string_view(head, 2));
}

void run_replay(const replay_command& cmd) {
  check_file_arguments("poolscope replay",
                       {{"LOG", cmd.file, false}, {"--json", cmd.json_path, true}}, cmd.force);
  // With the JSON on stdout, stdout holds nothing else: the table goes to stderr.
  std::ostream& text = cmd.json_path == "-" ? std::cerr : std::cout;
  if (is_snapshot_file(cmd.file)) {
    replay_snapshot(cmd, text);
  } else {
    replay_event_log(cmd, text);
  }
}

}  // namespace

/// `poolscope replay LOG`.
void register_replay(CLI::App& app) {
  auto cmd = std::make_shared<replay_command>();
  auto* sub = app.add_subcommand(
      "replay",
      "replay a recorded allocation log (poolscope JSON Lines, jsonl hook or RMM CSV) or a "
      "PyTorch memory snapshot (.pickle) on allocator strategies: peaks, upstream calls, "
      "failures under a capacity, latencies");
  sub->add_option("log", cmd->file, "the log or snapshot file")->required();
  sub->add_option("--allocators", cmd->allocators,
                  "comma-separated strategies (default: all registered)")
      ->delimiter(',')
      ->check(CLI::IsMember(pool::allocator_names()));
  sub->add_option("--resource", cmd->resources,
                  "comma-separated upstream resources, each replayed under every strategy "
                  "(default: host; host_vmm and vmm: reserved is the memory physically mapped)")
      ->delimiter(',')
      ->check(
          CLI::IsMember(std::vector<std::string>{"host", "cuda", "cuda_async", "vmm", "host_vmm"}));
  sub->add_option("--device", cmd->device, "GPU ordinal for device resources")
      ->check(poolscope::tools::non_negative_number());
  sub->add_option("--capacity", cmd->capacity,
                  "bytes the upstream may hold (suffixes K, M, G, T: 512M, 80G; default: no "
                  "limit)")
      ->check(poolscope::tools::byte_count());
  sub->add_option("--only-allocator", cmd->only_allocator,
                  "replay only the records of this recorded allocator (nested pools log each "
                  "request twice)");
  sub->add_option("--json", cmd->json_path,
                  "also write the results as JSON to this file ('-': stdout, the table then goes "
                  "to stderr)")
      ->check(path_value(true))
      ->transform(output_path_option());
  sub->add_flag("--force", cmd->force, "replace the --json file if it exists");
  sub->add_flag("--wide", cmd->wide,
                "every figure in the table: peaks in bytes, the peak handed out, upstream frees, "
                "the slowest malloc and free (wider than 100 columns)");
  sub->add_flag("!--no-progress", cmd->progress, "no progress bar on stderr");
  sub->callback([cmd] { run_replay(*cmd); });
}

}  // namespace poolscope::tools
