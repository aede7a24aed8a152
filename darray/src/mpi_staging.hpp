// mpi_staging: how a CUDA backend over several ranks moves GPU data between them when asked to by
// MPI (backend_options::between_ranks = mpi): staged through pinned host memory, with the
// group's MPI point to point (process_group::send / receive, bounded by its timeout). For ranks
// that share a GPU (NCCL refuses two ranks on one GPU) and for machines without a usable NCCL.
// Internal to cuda_backend.cpp; CUDA through cuda_seam.hpp.
//
// A send: the device-to-host copy into pinned staging is enqueued on the device's transfer stream
// (so it starts once the data is ready there, and an event recorded on that stream afterwards
// marks the source free to overwrite); the device's ordered_worker then waits for that copy (an
// event) and sends the staging by MPI. A receive: done where it is issued — the MPI receive into
// pinned staging on the calling thread, then the host-to-device copy enqueued on the transfer
// stream (what reads the piece is ordered after it by the stream). The staging of a receive goes
// back to the pool once its copy has completed (the worker waits for it, in order).
//
// Why this cannot deadlock: every rank issues the same plan's transfers in the same order (the
// executor), and nothing on a GPU ever waits for the host (the only waits are on events of work
// already enqueued). Take the first transfer of the plan not yet complete. Its receiving rank's
// calling thread reaches it: the transfers before it that it blocks on (its receives) are
// complete, and sends never block that thread. Its sending rank's calling thread has handed it to
// the worker for the same reason, and the worker reaches it: the jobs before it in that worker
// are earlier transfers (or staging releases), complete; the copy it waits for is GPU work that
// waits only on GPU work already enqueued. So the MPI send meets the posted receive and that
// transfer completes; by induction every one does. The bound: each MPI wait is the group's
// (timeout, another rank's failure notice), never an unbounded one.
//
// Overlap: none guaranteed. A receive holds the issuing thread until its bytes arrive (the work
// after it is enqueued later), and the bytes cross the host twice (PCIe both ways) rather than
// NVLink.
//
// Ownership: owns the pinned pool, one worker per device and the staging in flight. Thread
// safety: send() and receive() may be called from several threads; the transfers of one device
// pair up with the peer's in the order they are called. Cost: per transfer a pinned allocation
// (pooled), an event, one copy each way and one MPI message.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cuda_seam.hpp"
#include "ordered_worker.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/resource.hpp"

namespace poolscope::darray::detail {

class mpi_staging {
 public:
  /// For the GPUs of these CUDA ordinals (this process's devices, in order) over `group`.
  mpi_staging(std::shared_ptr<process_group> group, std::vector<int> ordinals);
  mpi_staging(const mpi_staging&) = delete;
  mpi_staging& operator=(const mpi_staging&) = delete;
  /// Finishes the sends handed over (each bounded by the group's timeout).
  ~mpi_staging();

  /// Sends `bytes` at `src` (memory of local device `device`) to rank `peer` with `tag`, after the
  /// work enqueued so far on `s` (that device's transfer stream). Returns once enqueued. `what`
  /// names the transfer in failures.
  void send(int device, cudaStream_t s, const void* src, std::size_t bytes, int peer, int tag,
            const std::string& what);
  /// Receives `bytes` from rank `peer` with `tag` into `dst` (memory of local device `device`):
  /// returns once they are in pinned memory and their copy to `dst` is enqueued on `s`. Throws
  /// communication_error when the peer fails or stays silent for the group's timeout.
  void receive(int device, cudaStream_t s, void* dst, std::size_t bytes, int peer, int tag,
               const std::string& what);
  /// Returns once every send handed to the workers has been sent (or has failed).
  void drain();
  /// Throws communication_error for the first send that failed since the last check.
  void check();

 private:
  // Pinned memory from the pool, returned by whoever holds it last (a worker's job).
  struct staging;
  [[nodiscard]] std::shared_ptr<staging> take(std::size_t bytes);
  // An event recorded on `s` (of CUDA ordinal `ordinal`): work enqueued so far there.
  [[nodiscard]] static cudaEvent_t mark(int ordinal, cudaStream_t s);

  std::shared_ptr<process_group> group_;
  std::vector<int> ordinals_;
  std::unique_ptr<pool::resource> pinned_;
  std::unique_ptr<pool::allocator> pool_;
  std::vector<std::unique_ptr<ordered_worker>> workers_;  // per device; last: stop first
};

}  // namespace poolscope::darray::detail
