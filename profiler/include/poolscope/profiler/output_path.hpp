// Output paths of processes started together (mpirun, srun, torchrun): `%r` in a path becomes the
// process's rank and `%p` its pid, so the ranks of one launch never write over each other.
//
//   auto path = poolscope::profiler::expand_output_path("trace.%r.json");  // "trace.1.json"
//   auto mine = poolscope::profiler::per_rank_path("t.json", 1);           // "t.rank1.json"
//
// The rank is the launcher's (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID or RANK, the first
// set), read from the environment: no MPI call, so the profilers loaded into any program of a
// launch (the plug-in's POOLSCOPE_* paths) name their files alike. Thread safety: reentrant
// (reads the environment). Errors: invalid_argument naming a '%' followed by anything but r, p
// or %.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace poolscope::profiler {

/// The rank the launcher that started this process gives it, or nullopt when none did.
[[nodiscard]] std::optional<int> launcher_rank();

/// `pattern` with %r replaced by launcher_rank() (0 without a launcher), %p by the pid and %% by
/// %.
[[nodiscard]] std::string expand_output_path(std::string_view pattern);

/// `path` with ".rank<rank>" before its extension ("t.json" -> "t.rank1.json", "t.json.gz" ->
/// "t.rank1.json.gz", "trace" -> "trace.rank1"): the file each rank writes when several ranks
/// are given one path.
[[nodiscard]] std::string per_rank_path(std::string_view path, int rank);

}  // namespace poolscope::profiler
