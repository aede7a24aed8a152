// What one rank of a launch (mpirun, srun, torchrun) records in its trace so that `poolscope trace
// merge` can join the ranks' traces into one timeline: who the rank is (distributed_info, written
// as the trace's top-level "distributedInfo", the member Holistic Trace Analysis reads), and
// samples of its clock taken around barriers every rank passes together (clock_sync_round), from
// which the merge estimates each clock's offset from rank 0's.
//
//   poolscope::profiler::timeline tl{{.trace_path = "t.rank1.json",
//                                     .distributed = distributed_info{.rank = 1, .world_size =
//                                     2}}};
//   tl.start();
//   tl.add_clock_sync("start", sample_barriers([&] { group.barrier(); }));
//   ... the run ...
//   tl.add_clock_sync("end", sample_barriers([&] { group.barrier(); }));
//   tl.stop();
//
// Why barriers: no rank leaves a barrier before the last one has entered it, so that instant lies
// between each rank's reading before and its reading after, on every rank's clock. Each round
// bounds the offset between two clocks; the merge intersects the rounds' bounds
// (analysis/trace_merge.hpp). The profiler calls no MPI: the caller passes its barrier.
//
// Ownership: plain values. Thread safety: sample_barriers is reentrant (the barrier is the
// caller's). Cost: `rounds` barriers and two clock reads each.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace poolscope::profiler {

/// Who a rank is, for its trace's "distributedInfo".
struct distributed_info {
  int rank = 0;
  int world_size = 1;
  std::string backend = "mpi";         ///< what joins the ranks ("mpi", "nccl")
  std::string host{};                  ///< "": this machine's host name
  std::vector<std::string> devices{};  ///< the rank's devices, as its program names them
};

/// The local clock (hooks::now_ns) read just before entering and just after leaving one barrier.
struct clock_sync_round {
  std::uint64_t before_ns = 0;
  std::uint64_t after_ns = 0;
};

/// Runs `barrier` `rounds` times (every rank must call this with the same `rounds`), reading the
/// clock around each. The first round gathers the ranks; the later ones, entered by every rank
/// at nearly the same time, bound the offsets tightly. Throws invalid_argument if `rounds` < 1;
/// what the barrier throws goes on.
[[nodiscard]] std::vector<clock_sync_round> sample_barriers(const std::function<void()>& barrier,
                                                            int rounds = 8);

/// This machine's host name ("" if it cannot be read).
[[nodiscard]] std::string host_name();

}  // namespace poolscope::profiler
