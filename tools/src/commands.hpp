// Subcommands of the poolscope CLI. Each lives in its own cmd_<name>.cpp and registers itself
// on the app (options and a callback that runs it); main.cpp calls every register function.
// A callback reports failure by throwing: CLI::RuntimeError(1) for a quiet exit (what it checked
// failed, and it has printed why), usage_error (cli_files.hpp) for a mistake in the command line
// found late (exit code 2), any other std::exception for "poolscope <command>: <message>" and
// exit code 1 (main.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace poolscope::tools {

/// `poolscope demo`: the distributed-array demo (darray_demo.hpp): the main job.
void register_demo(CLI::App& app);
/// `poolscope pools`: every allocator strategy on one workload, integrity checks, pool report.
void register_pools(CLI::App& app);
/// `poolscope bench alloc`: the allocator benchmark.
void register_bench(CLI::App& app);

/// `poolscope replay LOG`: replays an allocation log on allocator strategies, side by side.
void register_replay(CLI::App& app);
/// `poolscope snapshot LOG -o SNAP`: an allocation log as a PyTorch memory snapshot.
void register_snapshot(CLI::App& app);
/// `poolscope report FILE`: renders a saved line-profile or function-profile JSON report.
void register_report(CLI::App& app);
/// `poolscope trace check|summary FILE`: validate a Chrome trace, or summarise its overlap.
void register_trace(CLI::App& app);

}  // namespace poolscope::tools
