// `poolscope snapshot LOG -o SNAP.pickle`: a recorded allocation log (poolscope's recorder, the
// jsonl debug hook or RMM's CSV log; analysis/event_log.hpp) turned into a PyTorch memory
// snapshot (profiler/snapshot_builder.hpp), for pytorch.org/memory_viz and
// `python -m torch.cuda._memory_viz`. A log has no stacks: every frames list is empty. Its times
// are the recorder's monotonic clock (time_us counts from the machine's boot, not the epoch).
//
//   poolscope snapshot events.jsonl -o snap.pickle --max-entries 100000
//
// Exit codes: 0, or 1 with a message naming the file and line (an unreadable log), the
// allocator (--only-allocator not in the log) or the output that cannot be written.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>

#include "cli_checks.hpp"
#include "cli_files.hpp"
#include "poolscope/analysis/event_log.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/snapshot_builder.hpp"

namespace poolscope::tools {

namespace {

struct snapshot_command {
  std::string file;
  std::string output;
  std::size_t max_entries = 100000;
  std::string only_allocator;
  bool force = false;
};

void run_snapshot(const snapshot_command& cmd) {
  check_file_arguments("poolscope snapshot", {{"LOG", cmd.file, false}, {"-o", cmd.output, true}},
                       cmd.force);
  const analysis::event_log log = analysis::read_event_log(cmd.file);
  std::uint32_t only = UINT32_MAX;
  if (!cmd.only_allocator.empty()) {
    const auto it = std::find(log.allocators.begin(), log.allocators.end(), cmd.only_allocator);
    if (it == log.allocators.end()) {
      std::string names;
      for (const auto& n : log.allocators) {
        names += (names.empty() ? "" : ", ") + n;
      }
      throw invalid_argument("poolscope snapshot: the log has no allocator '" + cmd.only_allocator +
                             "' (it has: " + names + ")");
    }
    only = static_cast<std::uint32_t>(it - log.allocators.begin());
  }
  profiler::snapshot_builder builder({.max_entries = cmd.max_entries});
  for (const analysis::log_record& r : log.records) {
    if (only != UINT32_MAX && r.allocator != only) {
      continue;
    }
    profiler::snapshot_event e;
    e.kind = r.kind;
    e.phase = r.phase;
    e.device = r.device;
    e.stream = r.stream;
    e.ptr = r.ptr;
    e.requested = r.size;
    e.rounded = r.rounded;
    e.time_us = r.time_ns / 1000;
    e.allocator = r.allocator;
    builder.add(e);
  }
  const profiler::memory_snapshot snap = builder.snapshot();
  write_output("poolscope snapshot", "-o", cmd.output, snap.to_pickle());
  const profiler::snapshot_builder_stats& st = builder.stats();
  std::size_t segments = snap.segments.size();
  std::size_t entries = 0;
  for (const auto& t : snap.device_traces) {
    entries += t.size();
  }
  std::ostream& text = cmd.output == "-" ? std::cerr : std::cout;
  text << "snapshot of " << cmd.file << " (" << analysis::to_string(log.format) << ", "
       << log.records.size() << " records): " << segments << " segments, " << entries
       << " trace entries on " << snap.device_traces.size() << " device(s)";
  if (st.dropped_entries != 0) {
    text << ", " << st.dropped_entries << " older entries dropped (--max-entries "
         << cmd.max_entries << ")";
  }
  if (st.unknown_segments != 0) {
    text << "; blocks from before the log's first event lie in segments made for them";
  }
  text << "\n";
}

}  // namespace

/// `poolscope snapshot LOG -o SNAP`.
void register_snapshot(CLI::App& app) {
  auto cmd = std::make_shared<snapshot_command>();
  auto* sub = app.add_subcommand(
      "snapshot",
      "turn a recorded allocation log into a PyTorch memory snapshot (pickle) for "
      "pytorch.org/memory_viz and torch.cuda._memory_viz");
  sub->add_option("log", cmd->file, "the log file (poolscope JSON Lines, jsonl hook, RMM CSV)")
      ->required();
  sub->add_option("-o,--output", cmd->output, "the snapshot to write ('-': stdout)")
      ->required()
      ->check(path_value(true));
  sub->add_flag("--force", cmd->force, "replace the -o file if it exists");
  sub->add_option("--max-entries", cmd->max_entries,
                  "trace entries kept per device, the last ones (default 100000)")
      ->check(poolscope::tools::whole_number(1, std::int64_t{1} << 40));
  sub->add_option("--only-allocator", cmd->only_allocator,
                  "only the records of this recorded allocator");
  sub->callback([cmd] { run_snapshot(*cmd); });
}

}  // namespace poolscope::tools
