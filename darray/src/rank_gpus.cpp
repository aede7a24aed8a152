// rank_gpus (rank_gpus.hpp).
#include "rank_gpus.hpp"

#include <algorithm>
#include <cstddef>

#include "poolscope/error.hpp"

namespace poolscope::darray::detail {

std::string encode(const rank_gpus& g) {
  std::string line = g.host + ' ' + std::string(to_string(g.between));
  for (const std::string& u : g.uuids) {
    line += ' ' + u;
  }
  return line;
}

rank_gpus decode(const std::string& line) {
  std::vector<std::string> words;
  for (std::size_t at = 0, end = 0; at <= line.size(); at = end + 1) {
    end = std::min(line.find(' ', at), line.size());
    words.push_back(line.substr(at, end - at));
  }
  if (words.size() < 2 || words[0].empty()) {
    throw invalid_argument("darray cuda backend: a rank's GPUs read '" + line +
                           "' (expected a host, a transport and UUIDs)");
  }
  rank_gpus g;
  g.host = words[0];
  g.between = parse_rank_transport(words[1]);
  g.uuids.assign(words.begin() + 2, words.end());
  return g;
}

std::string rank_gpus_error(const std::vector<rank_gpus>& ranks) {
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    if (ranks[r].between != ranks[0].between) {
      return "darray cuda backend: rank 0 moves data between ranks by " +
             std::string(to_string(ranks[0].between)) + " and rank " + std::to_string(r) + " by " +
             std::string(to_string(ranks[r].between)) +
             " (backend_options::between_ranks, --between-ranks): every rank must choose the same";
    }
  }
  if (ranks.empty() || ranks[0].between != rank_transport::nccl) {
    return "";  // staged through host memory: ranks may share a GPU
  }
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    for (std::size_t q = 0; q < r; ++q) {
      if (ranks[q].host != ranks[r].host) {
        continue;
      }
      for (const std::string& u : ranks[r].uuids) {
        if (std::find(ranks[q].uuids.begin(), ranks[q].uuids.end(), u) != ranks[q].uuids.end()) {
          return "darray cuda backend: ranks " + std::to_string(q) + " and " + std::to_string(r) +
                 " of host " + ranks[r].host + " would use the same GPU (UUID " + u +
                 "): NCCL needs a GPU of its own per rank; to share GPUs between ranks, move "
                 "data between them through host memory by MPI (backend_options::between_ranks "
                 "= mpi, --between-ranks mpi)";
        }
      }
    }
  }
  return "";
}

}  // namespace poolscope::darray::detail
