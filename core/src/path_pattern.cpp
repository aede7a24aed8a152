#include "poolscope/path_pattern.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "poolscope/error.hpp"

namespace poolscope {

long process_rank() noexcept {
  for (const char* name : {"POOLSCOPE_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                           "SLURM_PROCID", "RANK"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') {
      continue;
    }
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    if (*end == '\0' && r >= 0) {
      return r;
    }
  }
  return 0;
}

std::string expand_path(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') {
      out.push_back(pattern[i]);
      continue;
    }
    if (i + 1 == pattern.size()) {
      throw invalid_argument("poolscope: path '" + std::string(pattern) +
                             "' ends in a lone '%' (%p: pid, %r: rank, %%: '%')");
    }
    switch (pattern[++i]) {
      case 'p':
        out += std::to_string(::getpid());
        break;
      case 'r':
        out += std::to_string(process_rank());
        break;
      case '%':
        out.push_back('%');
        break;
      default:
        throw invalid_argument("poolscope: path '" + std::string(pattern) + "' holds '%" +
                               std::string(1, pattern[i]) +
                               "', which is not %p (pid), %r (rank) or %%");
    }
  }
  return out;
}

}  // namespace poolscope
