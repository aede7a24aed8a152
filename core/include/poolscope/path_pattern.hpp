// path_pattern: output paths that name their process, for programs run as several processes
// (one per rank or GPU) writing the same option: `snap-%r.pickle`, `events-%p.jsonl`.
//
//   std::string path = poolscope::expand_path("snap-r%r-%p.pickle");  // "snap-r3-41234.pickle"
//
// %p is the process id, %r the rank the launcher gave the process (the first of the variables
// POOLSCOPE_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, SLURM_PROCID, RANK that is set to
// a number; 0 when none is), %% a percent sign. Any other % sequence is refused: a typo is not
// left in a file name.
//
// Errors: invalid_argument naming the pattern and the sequence. Thread safety: reentrant (reads
// the environment). Cost: a few getenv calls.
#pragma once

#include <string>
#include <string_view>

namespace poolscope {

/// `pattern` with %p, %r and %% replaced (see the file comment).
[[nodiscard]] std::string expand_path(std::string_view pattern);

/// The process's rank as %r gives it.
[[nodiscard]] long process_rank() noexcept;

}  // namespace poolscope
