// Per-rank output paths (output_path.hpp).
#include "poolscope/profiler/output_path.hpp"

#include <unistd.h>

#include <cstdlib>

#include "poolscope/error.hpp"

namespace poolscope::profiler {

std::optional<int> launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != nullptr && *end == '\0' && r >= 0 && r < (1L << 30)) {
        return static_cast<int>(r);
      }
    }
  }
  return std::nullopt;
}

std::string expand_output_path(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 8);
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') {
      out += pattern[i];
      continue;
    }
    const char next = i + 1 < pattern.size() ? pattern[i + 1] : '\0';
    switch (next) {
      case 'r':
        out += std::to_string(launcher_rank().value_or(0));
        break;
      case 'p':
        out += std::to_string(::getpid());
        break;
      case '%':
        out += '%';
        break;
      default:
        throw invalid_argument("output path '" + std::string(pattern) + "': '%" +
                               (next == '\0' ? std::string() : std::string(1, next)) + "' at " +
                               std::to_string(i) + " is not %r (rank), %p (pid) or %% (a '%')");
    }
    ++i;
  }
  return out;
}

std::string per_rank_path(std::string_view path, int rank) {
  const std::string tag = ".rank" + std::to_string(rank);
  const std::size_t slash = path.rfind('/');
  const std::size_t name = slash == std::string_view::npos ? 0 : slash + 1;
  // The extension starts at the first '.' of the file name after its first character (so
  // "t.json.gz" keeps ".json.gz", and ".trace" has none).
  const std::size_t dot = path.find('.', name + 1);
  if (dot == std::string_view::npos) {
    return std::string(path) + tag;
  }
  return std::string(path.substr(0, dot)) + tag + std::string(path.substr(dot));
}

}  // namespace poolscope::profiler
