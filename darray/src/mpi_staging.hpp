// mpi_staging: how a CUDA backend over several ranks moves GPU data between them when asked to by
// MPI (backend_options::between_ranks = mpi): staged through pinned host memory, with the
// group's MPI point to point (process_group::send / receive, bounded by its timeout). For ranks
// that share a GPU (NCCL refuses two ranks on one GPU) and for machines without a usable NCCL.
// Internal to darray. It touches device memory only through device_copies (the CUDA backend's:
// cudaMemcpyAsync on the transfer stream and an event; the tests': host threads), so its logic is
// tested on the CPU, under mpirun (mpi_staging_test.cpp).
//
// A piece moves in chunks (`chunk_bytes`; 0: whole), each a transfer of its own through the
// steps below, so that a chunk's copy to the host, another's MPI message and a third's copy to the
// device run at once instead of one after another: a piece of many chunks takes about as long as
// its slowest step rather than the sum of the three. Both ranks cut a piece the same way (every
// rank must give the same chunk size: the CUDA backend checks it when it starts), and the chunks
// of one piece travel in order with the piece's tag (MPI keeps the order of messages of one tag
// between two ranks).
//
// A chunk sent: the copy from device memory into host staging is enqueued on the device's
// transfer queue (so it starts once the data is ready there, and an event recorded on that queue
// afterwards marks the source free to overwrite); the device's send worker then waits for that
// copy and sends the staging by MPI, so the issuing thread waits neither for the device to produce
// the data nor for the peer to take it, and goes on issuing. A chunk received: the copy from host
// staging into device memory is enqueued at once on the transfer queue behind a gate (a 32-bit
// word of the staging, one per chunk, that the queue waits on: cuStreamWaitValue32 on GPUs), so
// what reads the piece is ordered after its last chunk by the queue as before; the device's
// receive worker makes the MPI receive into the staging and then opens the chunk's gate. So the
// issuing thread never waits for a peer: work issued after a receive — compute on the pieces
// already in place among it — is enqueued at once and runs on the other queues while the piece
// arrives. The staging of a receive goes back to the pool once its copies have completed (the
// send worker waits for them, in order).
//
// Why this cannot deadlock: every rank issues the same plan's transfers in the same order (the
// executor), each cut into the same chunks; the issuing thread never blocks on a transfer; a
// receive worker waits only for its peers; a send worker waits for device work and its peers; and
// device work waits only for work enqueued before it and for the gates of chunks received before
// it. Take the first chunk of the plan not yet complete (a received chunk is complete once its
// bytes are in staging and its gate is open). Its receiving rank's receive worker reaches it: the
// jobs before it are earlier chunks received, complete. Its sending rank's send worker reaches it:
// the jobs before it are earlier chunks sent (complete) or waits for the copies of earlier chunks
// received, which wait only for device work enqueued before them and for gates of earlier chunks,
// all open. Its copy to host waits only for device work enqueued before it, whose gates belong to
// earlier chunks, all open. So the MPI send meets the posted receive and that chunk completes; by
// induction every one does. The bound: each MPI wait is the group's (timeout, another rank's
// failure notice, after which the group's later waits fail at once); a receive that fails opens
// its gate all the same (the copy moves stale bytes, and check() reports the failure), so a queue
// never waits for a gate that no one will open.
//
// Overlap: the issuing thread goes on at once, each device's compute queue runs while its
// transfer queue waits at a gate, and the chunks of a piece pipeline its three steps; the bytes
// still cross the host twice (PCIe both ways) rather than NVLink.
//
// Trace: each send and receive is a slice of its worker's thread ("darray.send 0->3 0.25 MiB",
// args device, src_device, dst_device: transfer_slices.hpp) from the start of its first chunk's
// MPI transfer to the end of its last, in the timeline the constructor's `timeline` gives then, so
// `poolscope trace merge` draws a flow from each piece's send to its receive as on host devices.
//
// Ownership: owns the staging pool (over the resource given), a send worker and a receive worker
// per device and the staging in flight; device_copies is the caller's and must outlive this.
// Thread safety: send() and receive() may be called from several threads; the transfers of one
// device pair up with the peer's in the order they are called. Cost: per transfer a staging
// allocation (pooled) and one worker job more for a receive; per chunk a copy each way, one MPI
// message and a worker job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ordered_worker.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/resource.hpp"
#include "transfer_slices.hpp"

namespace poolscope::darray::detail {

class mpi_staging {
 public:
  /// The copies between a device's memory and host staging.
  class device_copies {
   public:
    virtual ~device_copies() = default;
    /// Enqueues on the transfer queue of local device `device`, after the work enqueued there so
    /// far, a copy of `bytes` from device memory `from` to host memory `to`. Returns a wait for
    /// its completion (called once, by a worker; may throw).
    [[nodiscard]] virtual std::function<void()> enqueue_download(int device, void* to,
                                                                 const void* from,
                                                                 std::size_t bytes) = 0;
    /// Enqueues on the transfer queue of local device `device`, after the work enqueued there so
    /// far, a wait until the 32-bit word at `gate` (host memory, zero now) is not zero, then a
    /// copy of `bytes` from host memory `from` to device memory `to`. The gate is opened from
    /// another thread by a release store of 1 (and a notify, atomic_ref's). Returns a wait for
    /// the copy's completion (called once, by a worker; may throw).
    [[nodiscard]] virtual std::function<void()> enqueue_gated_upload(int device, void* to,
                                                                     const void* from,
                                                                     std::size_t bytes,
                                                                     std::uint32_t* gate) = 0;
  };

  /// For `devices` local devices over `group`; staging from a pool over `host_memory` (pinned,
  /// so that the copies run asynchronously: a caching pool, since pinning costs milliseconds per
  /// large block and a reshard's pieces come back with the same sizes).
  /// `timeline` gives the timeline the transfers' slices go to when each ends (null: none; an
  /// empty function: never traced). Pieces move in chunks of `chunk_bytes` (0: whole).
  mpi_staging(std::shared_ptr<process_group> group, int devices, device_copies& copies,
              std::unique_ptr<pool::resource> host_memory,
              std::function<profiler::timeline*()> timeline = {}, std::size_t chunk_bytes = 0);
  mpi_staging(const mpi_staging&) = delete;
  mpi_staging& operator=(const mpi_staging&) = delete;
  /// Finishes the transfers handed over (each bounded by the group's timeout).
  ~mpi_staging();

  /// Sends `bytes` at `src` (memory of local device `device`) to rank `peer` with `tag`, after the
  /// work enqueued so far on the device's transfer queue. Returns once enqueued. `what` names the
  /// transfer in failures (check()); `traced` is its trace slice (rank_transfer_ends).
  void send(int device, const void* src, std::size_t bytes, int peer, int tag,
            const transfer_ends& traced, const std::string& what);
  /// Receives `bytes` from rank `peer` with `tag` into `dst` (memory of local device `device`),
  /// ordered on the device's transfer queue as a copy enqueued now: returns once that copy is
  /// enqueued (behind its gate), without waiting for the peer. A receive that fails (the peer
  /// fails or stays silent for the group's timeout) is thrown by check(), naming `what`.
  void receive(int device, void* dst, std::size_t bytes, int peer, int tag,
               const transfer_ends& traced, const std::string& what);
  /// Returns once every transfer handed to the workers has been made (or has failed) and every
  /// receive's staging is back in the pool.
  void drain();
  /// Throws communication_error for the first transfer that failed since the last check.
  void check();
  /// The staging pool's figures (what is in flight: in_use).
  [[nodiscard]] pool::allocator_stats staging_stats() const;
  /// The chunks a piece of `bytes` moves in (at least one).
  [[nodiscard]] std::size_t chunks(std::size_t bytes) const noexcept;

 private:
  struct staging;
  struct piece;
  [[nodiscard]] std::shared_ptr<staging> take(std::size_t bytes, std::size_t gates);
  [[nodiscard]] std::size_t checked(int device) const;
  /// Runs `move` (a worker's MPI send or receive of chunk `chunk` of `p`): its failure thrown as
  /// a communication_error naming the piece and chunk (check() reports it); the piece's slice
  /// traced once its last chunk has moved.
  template <typename Move>
  void transfer(piece& p, std::size_t chunk, Move&& move) const;
  /// Hands the staging of a receive back to the pool once `copied` (its uploads) have completed:
  /// a job of device `device`'s send worker.
  void release_after(std::size_t device, std::shared_ptr<staging> host,
                     std::vector<std::function<void()>> copied);

  std::shared_ptr<process_group> group_;
  device_copies& copies_;
  std::unique_ptr<pool::resource> host_memory_;
  std::unique_ptr<pool::allocator> pool_;
  std::function<profiler::timeline*()> timeline_;
  std::size_t chunk_bytes_;
  // Per device; last: they stop first (the receivers before the senders, which may wait for
  // copies behind the receivers' gates).
  std::vector<std::unique_ptr<ordered_worker>> senders_;
  std::vector<std::unique_ptr<ordered_worker>> receivers_;
};

}  // namespace poolscope::darray::detail
