// The MPI seam of poolscope::darray: the ONE header through which darray reaches MPI
// (mpi_seam.cpp is the only file that includes <mpi.h>). process_group.cpp drives it; nothing
// else calls it. Built without MPI (POOLSCOPE_HAVE_MPI undefined: CMake found no MPI), every
// function but available() throws communication_error saying so.
//
// Preconditions
// - world() first: it initializes MPI (MPI_Init_thread asking MPI_THREAD_MULTIPLE) unless the
//   application already did, and refuses a library that provides less (the host devices' transfer
//   workers and the caller's thread call MPI at once). MPI is finalized when the last world made
//   by this process goes, and only if world() initialized it.
// - Collectives (ibarrier, ibcast, iallgather, iallreduce) are started by one thread at a time, in
//   the same order on every rank (as MPI requires of collectives on one communicator).
//
// Error conventions
// - The communicators the seam makes (duplicates of MPI_COMM_WORLD: one for data and
//   collectives, one for failure notices) have MPI_ERRORS_RETURN, and every call's status is
//   checked with POOLSCOPE_MPI_CHECK: a failure throws communication_error naming the call, its
//   file:line and MPI's error string. Release paths (cancel, the destructor) log instead.
// - Nothing here waits without a bound: requests are polled (test) by process_group, which owns
//   the timeouts.
//
// Thread safety: every function may be called from several threads at once (MPI_THREAD_MULTIPLE),
// except as the collectives precondition says; one request is used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace poolscope::darray::detail::mpi {

/// Whether poolscope was built with MPI.
[[nodiscard]] bool available() noexcept;

/// What a launcher that started this process says of it (mpirun, srun, torchrun): the world size
/// from OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS or WORLD_SIZE (0: no launcher), and
/// the variable it came from. Reads the environment only (no MPI call).
[[nodiscard]] std::pair<int, std::string> launcher_world_size();

/// MPI_Abort on MPI_COMM_WORLD when MPI is running (initialized, not finalized): ends every rank
/// of the job; else ends this process. Needs no world (a watchdog may call it while one is being
/// destroyed). Never returns.
[[noreturn]] void abort_job(int code) noexcept;

/// One pending non-blocking operation. Owned by its caller; not thread-safe.
class request {
 public:
  request() noexcept;
  request(request&&) noexcept;
  request& operator=(request&&) noexcept;
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  /// Cancels the operation if still pending (a request dropped unfinished: a failure path).
  ~request();
  /// True when no operation is pending on it.
  [[nodiscard]] bool done() const noexcept;

  struct state;
  std::unique_ptr<state> s;
};

/// MPI's reduction for iallreduce.
enum class reduce_kind : std::uint8_t { sum, max, min };

/// This process's view of MPI_COMM_WORLD: its rank and size and two duplicates of it. Owned by
/// the process_group made from it; thread-safe as the file comment says.
class world {
 public:
  /// Initializes MPI if needed (see the file comment) and duplicates MPI_COMM_WORLD. Throws
  /// communication_error without MPI, when MPI fails, or when it gives less than
  /// MPI_THREAD_MULTIPLE.
  [[nodiscard]] static std::unique_ptr<world> make();
  world(const world&) = delete;
  world& operator=(const world&) = delete;
  /// Frees the communicators, and finalizes MPI if make() initialized it and no other world is
  /// left (failures logged).
  ~world();

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// MPI_Get_processor_name.
  [[nodiscard]] std::string processor_name() const;

  /// Non-blocking point-to-point on the data communicator.
  [[nodiscard]] request isend(const void* data, std::size_t bytes, int peer, int tag);
  [[nodiscard]] request irecv(void* data, std::size_t bytes, int peer, int tag);
  /// Non-blocking collectives on the data communicator.
  [[nodiscard]] request ibarrier();
  [[nodiscard]] request ibcast(void* data, std::size_t bytes, int root);
  /// Gathers `bytes` from every rank into `out` (size() * bytes, in rank order).
  [[nodiscard]] request iallgather(const void* in, std::size_t bytes, void* out);
  [[nodiscard]] request iallreduce(const std::int64_t* in, std::int64_t* out, int count,
                                   reduce_kind op);

  /// Whether `r` completed (then it is done()); for a receive, the bytes that arrived go to
  /// *received. Throws communication_error when the operation failed.
  [[nodiscard]] bool test(request& r, std::size_t* received = nullptr);
  /// Cancels a pending operation and releases it (no-op when done). Never throws.
  void cancel(request& r) noexcept;

  /// Sends a failure notice to `peer` on the notice communicator (fire and forget: the request is
  /// kept until this world goes).
  void post_notice(int peer, const std::string& text);
  /// A failure notice some rank sent us, if one has arrived: (its rank, its text).
  [[nodiscard]] std::optional<std::pair<int, std::string>> take_notice();

  struct impl;

 private:
  world() noexcept;
  std::unique_ptr<impl> impl_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace poolscope::darray::detail::mpi
