// rank_binding: whether the CPUs a rank may run on suit the way its CUDA backend moves data
// between ranks. By MPI (rank_transport::mpi) a rank's work is threads — the one issuing the plan,
// a send and a receive worker per GPU — and MPI moves a large message between ranks of one host
// only while a thread polls it; bound to one core (Open MPI binds each of two ranks to one by
// default), those threads take turns on it, and a reshard may run slower (little on a GPU, where
// every host wait polls: docs/perf.md, "Across processes"; docs/multiprocess.md, "Between ranks
// by MPI"). The CUDA backend says so once per process, at info level. Internal to darray; the
// decision is a pure function of the mask and the transport (tested on the CPU:
// rank_binding_test.cpp); the mask comes from sched_getaffinity. Thread safety: reentrant. Cost: a
// system call for the mask, linear in its CPUs.
#pragma once

#include <string>
#include <vector>

#include "poolscope/darray/backend.hpp"

namespace poolscope::darray::detail {

/// The CPUs the calling thread may run on (sched_getaffinity), ascending; empty when the system
/// does not say.
[[nodiscard]] std::vector<int> allowed_cpus();

/// `cpus` (ascending) as a CPU list, runs joined: "3", "0-3,8".
[[nodiscard]] std::string cpu_list_text(const std::vector<int>& cpus);

/// The note (logged at info level) due for a rank of several whose threads may run on `cpus`
/// (ascending; empty: unknown) and whose GPUs exchange data with the other ranks by `between`: ""
/// when none is due (NCCL's work runs on the GPU and its proxy thread; more than one CPU; an
/// unknown mask), else a sentence naming the mask and the launcher's ways to widen it.
[[nodiscard]] std::string binding_warning(const std::vector<int>& cpus, rank_transport between);

}  // namespace poolscope::darray::detail
