// rank_binding (rank_binding.hpp).
#include "rank_binding.hpp"

#include <sched.h>

#include <cstddef>

namespace poolscope::darray::detail {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    return {};  // more CPUs than a cpu_set_t holds, or no such call: the mask is unknown
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) {
      cpus.push_back(c);
    }
  }
  return cpus;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string text;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) {
      ++j;
    }
    if (!text.empty()) {
      text += ',';
    }
    text += std::to_string(cpus[i]);
    if (j > i) {
      text += '-' + std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return text;
}

std::string binding_warning(const std::vector<int>& cpus, rank_transport between) {
  if (between != rank_transport::mpi || cpus.size() != 1) {
    return "";
  }
  return "this rank may run on CPU " + cpu_list_text(cpus) +
         " only (its affinity mask), and moving data between ranks by MPI "
         "(--between-ranks mpi) needs more: the thread issuing the work, the send and receive "
         "workers of each GPU and MPI's progress all take turns on that core, and reshards may "
         "run slower. Open MPI binds each rank to one core when it starts two: start the ranks "
         "with "
         "`mpirun --bind-to none` or `mpirun --map-by slot:PE=2 --bind-to core` "
         "(docs/multiprocess.md)";
}

}  // namespace poolscope::darray::detail
