// ipc_links: how a CUDA backend over several ranks moves a piece between two GPUs of different
// ranks that see each other (ranks of one host) with the copy engines, as it does between the GPUs
// of one process, instead of NCCL's kernels (backend_options::between_ranks = automatic). NCCL
// moves such a piece with SMs that the compute beside it wants, and more slowly than the copy
// engines (docs/perf.md, "Across processes"); CUDA IPC lets the sending rank's copy engine write
// into the receiver's memory directly. Internal to cuda_backend.cpp; through cuda_seam.hpp like it.
//
// Which pairs: GPU a (of rank r) and GPU b (of rank q != r) are linked when each rank can do its
// part: r's pool memory can be exported (the cudaMalloc resource: cudaIpcGetMemHandle) and r sees
// b (a GPU of r's process with b's UUID) with a path to it (the same GPU, or peer access), and the
// same of q for a, and each rank has one GPU (the usual launch: a rank per GPU). A mapping is
// opened once per process, under the GPU that first needs it, and reached from another GPU of the
// process only by peer access to the mapped memory's GPU, which nothing here arranges: ranks of
// several GPUs stay with NCCL. Every rank fills its own GPUs' rows of that table and the group
// reduces it, so every rank holds the same pairs (ipc_pairs): the sender and the receiver of a
// piece always agree on how it moves. Pairs not linked stay with NCCL.
//
// A piece from a (rank r) to b (rank q), the k-th between that ordered pair, is copied by a's
// copy engine into b's memory (a push, as the process's own copies between its GPUs):
// - q, receive: sends r, by the group's MPI, where the piece goes (the IPC handle of the
//   allocation holding it, its offset, bytes and k), and on b's transfer stream waits until b's
//   word "done by a" reaches k (cuStreamWaitValue32).
// - r, send: takes that message (bounded by the group's timeout), maps the allocation (once:
//   mappings are kept by handle), copies the bytes on a's transfer stream (cudaMemcpyAsync into
//   the mapping), then writes k into b's "done by a" word (mapped here too) on the same stream
//   (cuStreamWriteValue32). A stream of its own for the write (after an event) would let the
//   next copy start a few µs sooner, but a kernel enqueued on a's compute stream during the copy
//   then starts only as the copy ends, and the receiver sees the word up to 250 µs late
//   (docs/perf.md, "A GPU per rank, copy engines through CUDA IPC").
// So the copy starts once the data is ready at a; b's stream passes its receive (and the events
// recorded after it, which the work reading the piece waits for) once the bytes are there, and a's
// stream passes its send (which frees the source) once they have left. Unlike an NCCL receive, the
// copy does not wait for the receiver's stream to reach the receive: the destination must hold
// nothing that pending work still uses (backend::receive says so; the executor receives into
// buffers made for the piece), which lets one pair's pieces follow each other on the sender's copy
// engine as closely as within a process. Neither host waits for a GPU; the receiver's host never
// waits for the sender, and the sender's host only for the receiver's host to reach the same
// piece, which it does as every rank issues the same plan in the same order (the k-th pieces pair
// up, and a send waits only for earlier pieces: no cycle).
//
// Faults: a sender that never comes leaves the receiver's stream waiting on a word. The backend's
// watchdog watches every send and receive here and, on a failure, calls open_gates(): each word
// of this rank's GPUs is set well past the last piece it stands for, so its streams run on (the
// bytes of a piece not sent are stale: the failure is what the backend throws next) and the
// backend can be destroyed. A receiver that never comes leaves the sender's host waiting for its
// message, bounded by the group's timeout.
//
// A mapping is kept until the backend goes, keyed by the handle: an allocation the receiver frees
// and makes again has a new handle. Ownership: owns the word arrays, the mappings, and a stream per
// GPU to open its gates on. Thread safety: send() and receive() may be called from several threads;
// the transfers of one pair of GPUs pair up in the order they are called, as with NCCL. Cost: per
// piece a stream memory operation a side, one small MPI message, and on the sender an
// IPC mapping the first time it sees an allocation (the pool's segments: few).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_seam.hpp"
#include "poolscope/darray/process_group.hpp"

namespace poolscope::darray::detail {

/// Which pairs of a group's n GPUs are linked: `can` is n x n, row a filled by the rank of GPU a
/// (can[a * n + b]: that rank can do its part with b), the other ranks' entries 1; `rank_of` gives
/// each GPU's rank; `gathered` is every rank's `can` reduced by minimum. Pair (a, b) is linked when
/// they are of different ranks and can[a][b] and can[b][a]. Pure (tested on the CPU).
[[nodiscard]] std::vector<char> ipc_pairs(const std::vector<std::int64_t>& gathered,
                                          const std::vector<int>& rank_of);

/// The message a receiver gives its sender per piece (see the file comment).
struct ipc_piece {
  cudaIpcMemHandle_t handle{};  ///< the allocation holding the piece
  std::uint64_t offset = 0;     ///< of the piece in it
  std::uint64_t bytes = 0;
  std::uint32_t sequence = 0;  ///< k: the piece's place among the pair's
};

/// What is wrong with a piece received as `got` where `bytes` and the pair's `sequence` are
/// expected ("" when nothing): the ranks then do not run the same program. Pure.
[[nodiscard]] std::string ipc_mismatch(const ipc_piece& got, std::uint64_t bytes,
                                       std::uint32_t sequence);

class ipc_links {
 public:
  /// Collective over `group` (made by MPI; several ranks). `ordinals`: this rank's GPUs (CUDA
  /// ordinals), global numbers first .. first + size - 1; `uuids`: every GPU of the group's UUID
  /// (hex) in global order, and `rank_of` its rank; `exportable`: this rank's pools take their
  /// memory from cudaMalloc.
  ipc_links(std::shared_ptr<process_group> group, std::vector<int> ordinals, int first,
            const std::vector<std::string>& uuids, const std::vector<int>& rank_of,
            bool exportable);
  ipc_links(const ipc_links&) = delete;
  ipc_links& operator=(const ipc_links&) = delete;
  /// Closes the mappings and frees the words (failures logged).
  ~ipc_links();

  /// Whether GPUs a and b (global numbers) are linked.
  [[nodiscard]] bool linked(int a, int b) const noexcept {
    return pairs_[static_cast<std::size_t>(a) * n_ + static_cast<std::size_t>(b)] != 0;
  }
  /// Whether some pair of GPUs of different ranks is not linked (NCCL is needed for it).
  [[nodiscard]] bool needs_nccl() const noexcept { return needs_nccl_; }

  /// This rank's side of a piece from its GPU `local` (on `s`, that GPU's transfer stream, of
  /// which the caller made it current) to GPU `peer` of rank `peer_rank`; `tag` tells the pair's
  /// messages from others. Waits for the receiver's message (the group's bound).
  void send(int local, cudaStream_t s, const void* src, std::size_t bytes, int peer, int peer_rank,
            int tag);
  /// The receiving side of such a piece into `dst` of GPU `local`, which nothing pending uses.
  void receive(int local, cudaStream_t s, void* dst, std::size_t bytes, int peer, int peer_rank,
               int tag);
  /// Sets every word of this rank's GPUs past any piece, so no stream waits on a peer any longer
  /// (after a failure). Never throws; idempotent.
  void open_gates() noexcept;

 private:
  // One GPU of this rank: its words (one per GPU of the group: "done by" it) and the stream that
  // opens its gates.
  struct gpu {
    int ordinal = 0;
    std::uint32_t* words = nullptr;
    cudaStream_t gate_stream = nullptr;
    std::vector<std::uint32_t> sent;      // per peer: pieces sent to it
    std::vector<std::uint32_t> received;  // per peer: pieces received from it
    std::vector<std::uint32_t> opened;    // the words open_gates() writes (kept until copied)
    std::mutex mutex;                     // the two counters and their enqueue
  };
  [[nodiscard]] std::uint32_t* peer_word(int peer, std::size_t index) const noexcept {
    return peer_words_[static_cast<std::size_t>(peer)] + index;
  }
  // The IPC handle of the allocation holding `p` (kept per allocation), and p's offset in it.
  std::uint64_t exported(const void* p, cudaIpcMemHandle_t& handle);
  // The receiver's allocation behind `handle`, mapped here (once) with GPU `local` current.
  void* mapped(int local, const cudaIpcMemHandle_t& handle);
  void release() noexcept;

  std::shared_ptr<process_group> group_;
  std::size_t n_ = 0;
  int first_ = 0;
  std::vector<char> pairs_;
  bool needs_nccl_ = false;
  std::vector<std::unique_ptr<gpu>> gpus_;
  std::vector<std::uint32_t*> peer_words_;  // per global GPU: its words mapped here, or null
  std::mutex mappings_mutex_;
  std::map<std::string, void*> mappings_;                      // by handle bytes
  std::map<unsigned long long, cudaIpcMemHandle_t> exported_;  // by allocation id
};

}  // namespace poolscope::darray::detail
