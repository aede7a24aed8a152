// Commands on every rank of a launch (launch.hpp).
#include "launch.hpp"

#include <exception>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/profiler/output_path.hpp"

namespace poolscope::tools {

bool runs_on_every_rank(int argc, char** argv) {
  if (darray::process_group::launched() < 2) {
    return false;
  }
  std::vector<std::string_view> words;
  for (int i = 1; i < argc && words.size() < 2; ++i) {
    const std::string_view w = argv[i];
    if (!w.starts_with("-")) {
      words.push_back(w);
    }
  }
  return (!words.empty() && words[0] == "demo") ||
         (words.size() == 2 && words[0] == "bench" && words[1] == "darray");
}

void agree_on_arguments(darray::process_group& g, const std::string& command,
                        const std::string& error) {
  if (g.size() == 1) {
    if (!error.empty()) {
      throw invalid_argument(command + ": " + error);
    }
    return;
  }
  const std::vector<std::string> errors = g.all_gather(error);
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) {
      throw invalid_argument(command + ": rank " + std::to_string(r) + " of " +
                             std::to_string(g.size()) + " refused its arguments: " + errors[r]);
    }
  }
}

std::string rank_output_path(const std::string& path, const darray::process_group& g) {
  const std::string expanded = profiler::expand_output_path(path);
  if (g.size() == 1 || path.find("%r") != std::string::npos || path.empty() || path == "-") {
    return expanded;
  }
  return profiler::per_rank_path(expanded, g.rank());
}

std::string merged_output_path(const std::string& path) {
  std::string pattern;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == 'r') {
      pattern += "merged";
      ++i;
    } else if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == '%') {
      pattern += "%%";
      ++i;
    } else {
      pattern += path[i];
    }
  }
  return profiler::expand_output_path(pattern);
}

void on_every_rank(darray::process_group& g, const std::string& command,
                   const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    if (g.size() > 1) {
      g.fail(command + ": " + e.what());
      // The last resort: this rank ends its part below, and MPI's shutdown waits for every rank.
      std::thread([why = command + ": " + g.describe() + " failed " +
                         std::to_string(g.timeout().count() / 1000) +
                         " s ago and still waits for the other ranks to end",
                   timeout = g.timeout()] {
        std::this_thread::sleep_for(timeout);
        darray::process_group::abort_launch(why);
      }).detach();
    }
    throw;
  }
}

}  // namespace poolscope::tools
