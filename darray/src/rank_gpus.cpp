// rank_gpus (rank_gpus.hpp).
#include "rank_gpus.hpp"

#include <algorithm>
#include <cctype>
#include <cstddef>

#include "poolscope/error.hpp"

namespace poolscope::darray::detail {

namespace {
// How a rank moves data to the others, as every rank must agree on it.
std::string mode_of(const rank_gpus& g) {
  return describe_between_ranks(g.between, g.staging_chunk_bytes);
}
}  // namespace

std::string nccl_host(const std::string& host_name, const char* nccl_hostid) {
  std::string host = nccl_hostid != nullptr && *nccl_hostid != '\0' ? nccl_hostid : host_name;
  for (char& c : host) {
    if (std::isspace(static_cast<unsigned char>(c)) != 0) {
      c = '_';
    }
  }
  return host.empty() ? std::string("?") : host;
}

std::string encode(const rank_gpus& g) {
  std::string line = g.host + ' ' + std::string(to_string(g.between));
  if (g.between == rank_transport::mpi) {
    line += '/' + std::to_string(g.staging_chunk_bytes);
  }
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
  const std::size_t slash = words[1].find('/');
  g.between = parse_rank_transport(words[1].substr(0, slash));
  if (g.between == rank_transport::mpi) {
    const std::string chunk = slash == std::string::npos ? "" : words[1].substr(slash + 1);
    if (chunk.empty() || chunk.find_first_not_of("0123456789") != std::string::npos ||
        chunk.size() > 19) {
      throw invalid_argument("darray cuda backend: a rank's GPUs read '" + line +
                             "' (expected mpi/<chunk bytes>)");
    }
    g.staging_chunk_bytes = std::stoull(chunk);
  } else if (slash != std::string::npos) {
    throw invalid_argument("darray cuda backend: a rank's GPUs read '" + line +
                           "' (expected auto or nccl alone)");
  }
  g.uuids.assign(words.begin() + 2, words.end());
  return g;
}

std::string rank_gpus_error(const std::vector<rank_gpus>& ranks) {
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    if (mode_of(ranks[r]) != mode_of(ranks[0])) {
      return "darray cuda backend: rank 0 moves data between ranks by " + mode_of(ranks[0]) +
             " and rank " + std::to_string(r) + " by " + mode_of(ranks[r]) +
             " (backend_options::between_ranks and staging_chunk_bytes, --between-ranks and "
             "--staging-chunk): every rank must choose the same";
    }
  }
  if (ranks.empty() || ranks[0].between != rank_transport::nccl) {
    // Staged through host memory, or (automatic) through CUDA IPC where ranks see each other's
    // GPUs: ranks may share a GPU (the backend checks the pairs left to NCCL).
    return "";
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
