// The commands that run on every rank of a launch (`mpirun -np N poolscope demo`, `poolscope bench
// darray`): each rank parses its own arguments, so the ranks first agree on them (one refusal is
// every rank's, in the same words), and a rank that fails tells the others, who then fail naming
// it, instead of waiting for it.
//
//   auto group = darray::process_group::from_launcher();
//   agree_on_arguments(*group, "poolscope demo", "");  // "" : this rank's arguments are fine
//   on_every_rank(*group, "poolscope demo", [&] { run(); });
//
// Thread safety: called from the main thread (the agreement is a collective). Without a launcher
// (a group of one) these cost nothing and change nothing.
#pragma once

#include <functional>
#include <string>

#include "poolscope/darray/process_group.hpp"

namespace poolscope::tools {

/// Whether `argv` runs, under a launcher of several ranks, a command that runs on every rank
/// (demo, bench darray): such a command must agree on its arguments even when they fail to
/// parse.
[[nodiscard]] bool runs_on_every_rank(int argc, char** argv);

/// The ranks' agreement on their arguments (collective: every rank calls it first): `error` is
/// what is wrong with this rank's ("" when nothing). If some rank gave an error, every rank
/// throws invalid_argument "<command>: rank R of N refused its arguments: <error>" (the first
/// such rank's).
void agree_on_arguments(darray::process_group& g, const std::string& command,
                        const std::string& error);

/// An output path of this rank: %r and %p expanded (profiler::expand_output_path); with several
/// ranks and no %r, the rank's own file beside the one named (t.json -> t.rank1.json), so no
/// rank writes over another's.
[[nodiscard]] std::string rank_output_path(const std::string& path, const darray::process_group& g);

/// The file the ranks' traces are merged into (`poolscope demo --trace` under a launcher): `path`
/// with %p expanded, and %r, which would name one rank, as "merged" (t.%r.json -> t.merged.json;
/// t.json stays t.json).
[[nodiscard]] std::string merged_output_path(const std::string& path);

/// Runs `body`. If it throws, the other ranks are told this one failed (their next wait throws,
/// naming this rank and the error), a watchdog ends the whole launch (MPI_Abort) should this rank
/// still be alive one group timeout later (a rank stuck in MPI's own shutdown), and the exception
/// goes on.
void on_every_rank(darray::process_group& g, const std::string& command,
                   const std::function<void()>& body);

}  // namespace poolscope::tools
