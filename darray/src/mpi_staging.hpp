// mpi_staging: how a CUDA backend over several ranks moves GPU data between them when asked to by
// MPI (backend_options::between_ranks = mpi): staged through pinned host memory, with the
// group's MPI point to point (process_group::send / receive, bounded by its timeout). For ranks
// that share a GPU (NCCL refuses two ranks on one GPU) and for machines without a usable NCCL.
// Internal to darray. It touches device memory only through device_copies (the CUDA backend's:
// cudaMemcpyAsync on the transfer stream and an event; the tests': host threads), so its logic is
// tested on the CPU, under mpirun (mpi_staging_test.cpp).
//
// A send: the copy from device memory into host staging is enqueued on the device's transfer
// queue (so it starts once the data is ready there, and an event recorded on that queue
// afterwards marks the source free to overwrite); the device's ordered_worker then waits for that
// copy and sends the staging by MPI, so the issuing thread waits neither for the device to produce
// the data nor for the peer to take it, and goes on issuing. A receive: done where it is issued —
// the MPI receive into host staging on the calling thread, then the copy into device memory
// enqueued on the transfer queue (what reads the piece is ordered after it by the queue). The
// staging of a receive goes back to the pool once its copy has completed (the worker waits for it,
// in order).
//
// Why this cannot deadlock: every rank issues the same plan's transfers in the same order (the
// executor), and nothing on a device ever waits for the host (the only waits are on events of
// work already enqueued). Take the first transfer of the plan not yet complete. Its receiving
// rank's calling thread reaches it: the transfers before it that it blocks on (its receives) are
// complete, and sends never block that thread. Its sending rank's calling thread has handed it to
// the worker for the same reason, and the worker reaches it: the jobs before it in that worker
// are earlier transfers (or staging releases), complete; the copy it waits for is device work
// that waits only on device work already enqueued. So the MPI send meets the posted receive and
// that transfer completes; by induction every one does. The bound: each MPI wait is the group's
// (timeout, another rank's failure notice).
//
// Overlap: none guaranteed. A receive holds the issuing thread until its bytes arrive (the work
// after it is enqueued later), and the bytes cross the host twice (PCIe both ways) rather than
// NVLink.
//
// Ownership: owns the staging pool (over the resource given), one worker per device and the
// staging in flight; device_copies is the caller's and must outlive this. Thread safety: send()
// and receive() may be called from several threads; the transfers of one device pair up with the
// peer's in the order they are called. Cost: per transfer a staging allocation (pooled), a copy
// each way, one MPI message and one worker job.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ordered_worker.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/resource.hpp"

namespace poolscope::darray::detail {

class mpi_staging {
 public:
  /// The copies between a device's memory and host staging.
  class device_copies {
   public:
    virtual ~device_copies() = default;
    /// Enqueues on the transfer queue of local device `device`, after the work enqueued there so
    /// far, a copy of `bytes` from `from` to `to` (to host memory when `to_host`, else from it).
    /// Returns a wait for its completion (called once, by a worker; may throw).
    [[nodiscard]] virtual std::function<void()> enqueue_copy(int device, void* to, const void* from,
                                                             std::size_t bytes, bool to_host) = 0;
  };

  /// For `devices` local devices over `group`; staging from a pool over `host_memory` (pinned,
  /// so that the copies run asynchronously: a caching pool, since pinning costs milliseconds per
  /// large block and a reshard's pieces come back with the same sizes).
  mpi_staging(std::shared_ptr<process_group> group, int devices, device_copies& copies,
              std::unique_ptr<pool::resource> host_memory);
  mpi_staging(const mpi_staging&) = delete;
  mpi_staging& operator=(const mpi_staging&) = delete;
  /// Finishes the sends handed over (each bounded by the group's timeout).
  ~mpi_staging();

  /// Sends `bytes` at `src` (memory of local device `device`) to rank `peer` with `tag`, after the
  /// work enqueued so far on the device's transfer queue. Returns once enqueued. `what` names the
  /// transfer in failures (check()).
  void send(int device, const void* src, std::size_t bytes, int peer, int tag,
            const std::string& what);
  /// Receives `bytes` from rank `peer` with `tag` into `dst` (memory of local device `device`):
  /// returns once they are in host staging and their copy to `dst` is enqueued on the device's
  /// transfer queue. Throws communication_error (naming `what`) when the peer fails or stays
  /// silent for the group's timeout.
  void receive(int device, void* dst, std::size_t bytes, int peer, int tag,
               const std::string& what);
  /// Returns once every send handed to the workers has been sent (or has failed) and every
  /// receive's staging is back in the pool.
  void drain();
  /// Throws communication_error for the first send that failed since the last check.
  void check();
  /// The staging pool's figures (what is in flight: in_use).
  [[nodiscard]] pool::allocator_stats staging_stats() const;

 private:
  struct staging;
  [[nodiscard]] std::shared_ptr<staging> take(std::size_t bytes);
  [[nodiscard]] ordered_worker& worker(int device);

  std::shared_ptr<process_group> group_;
  device_copies& copies_;
  std::unique_ptr<pool::resource> host_memory_;
  std::unique_ptr<pool::allocator> pool_;
  std::vector<std::unique_ptr<ordered_worker>> workers_;  // per device; last: they stop first
};

}  // namespace poolscope::darray::detail
