// What each rank of a CUDA backend over several ranks says of its GPUs when the backend is built
// (make_cuda_backend gathers one line per rank), and the check every rank makes of all of them:
// the same between_ranks everywhere, and, with NCCL between ranks, no GPU used by two ranks of a
// host. Internal to darray; no CUDA here (tested on the CPU: rank_gpus_test.cpp).
// Thread safety: reentrant. Cost: pairs of ranks times their GPUs.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "poolscope/darray/backend.hpp"

namespace poolscope::darray::detail {

/// One rank's GPUs: its host, its choice of transport, the UUIDs of its GPUs (hex text), and with
/// MPI the chunks its pieces move in (backend_options::staging_chunk_bytes).
struct rank_gpus {
  std::string host;
  rank_transport between = rank_transport::automatic;
  std::vector<std::string> uuids;
  std::size_t staging_chunk_bytes = 0;
};

/// The host NCCL takes a rank to run on, for the check of two ranks on one GPU that NCCL makes
/// too: `nccl_hostid` (the NCCL_HOSTID environment variable, which NCCL's host identity follows)
/// when set and not empty, else `host_name`; white space becomes '_' (encode() separates words by
/// spaces). Ranks given NCCL_HOSTIDs of their own are hosts apart to NCCL, which then joins them
/// through its network transport even on one GPU (docs/multiprocess.md, "One GPU, NCCL between
/// ranks"), so they are not refused here either.
[[nodiscard]] std::string nccl_host(const std::string& host_name, const char* nccl_hostid);

/// One line of text for process_group::all_gather ("host mode uuid ...", the mode "auto", "nccl"
/// or "mpi/<chunk bytes>"); host names have no spaces.
[[nodiscard]] std::string encode(const rank_gpus& g);
/// The rank_gpus of an encode()d line. Throws invalid_argument naming a line not made by encode.
[[nodiscard]] rank_gpus decode(const std::string& line);

/// What is wrong with every rank's GPUs (in rank order), "" when nothing is: ranks that chose
/// different transports (or MPI in different chunks), or (NCCL; automatic leaves it to the
/// backend, which knows the pairs CUDA IPC links) two ranks of one host on one GPU —
/// the message then names between_ranks = mpi as the way to share it. Every rank computes the same
/// text from the same lines, so all refuse alike.
[[nodiscard]] std::string rank_gpus_error(const std::vector<rank_gpus>& ranks);

}  // namespace poolscope::darray::detail
