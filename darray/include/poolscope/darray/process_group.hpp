// process_group: the processes (ranks) a DistributedArray spans. Every rank runs the same program
// (SPMD); a backend built over a group numbers the devices of every rank, so one index_map names
// them all (docs/multiprocess.md).
//
//   // mpirun -np 2 ./app   (or srun -n 2 ./app)
//   using namespace poolscope::darray;
//   auto group = process_group::from_launcher();          // MPI_COMM_WORLD under a launcher,
//                                                          // a group of one without one
//   auto be = make_backend("host:2", {.group = group});  // devices 0..3: rank 0 has 0, 1
//   auto a = distributed_array<float>::from_host(be, data, {n}, index_map::blocks({n}, 0, 4));
//   auto d = a + a.reshard(index_map::blocks({n}, 0, 4));  // pieces cross ranks by MPI
//   std::vector<float> all = d.to_host();                  // on every rank
//
// Made from MPI (from_mpi, from_launcher: rank and size of MPI_COMM_WORLD; MPI is initialized
// with MPI_THREAD_MULTIPLE unless the application did so first, and finalized at exit if this
// group initialized it), from an NCCL communicator the application already has (adopt_nccl: one
// GPU per rank, the rank and size as the application knows them; no MPI), or a group of one
// (single: no MPI at all, what a program without a launcher gets).
//
// Every wait for another rank is bounded: a transfer or a collective that does not complete
// within timeout() throws communication_error naming the peer, and a rank that fails tells the
// others (fail()), whose next wait throws naming it and its reason. After a failure every later
// wait of the group throws at once, so a program fails within one timeout, never hangs.
//
// Ownership: shared (backends keep their group); the MPI communicators it made are freed with the
// last reference (from_mpi's group lives until exit: MPI cannot be initialized twice). Thread
// safety: every member may be called from several threads at once, except that collectives
// (barrier, broadcast, all_gather, all_reduce) are called by one thread at a time and in the same
// order on every rank, as MPI's are. Cost: a collective or a transfer is one MPI operation,
// polled (with sleeps of up to a millisecond once it has waited a while) until done.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace poolscope::darray {

namespace detail::mpi {
class world;
}

/// Settings of a process group.
struct process_group_options {
  /// The longest wait for another rank (a transfer, a collective) before communication_error.
  /// 0: POOLSCOPE_RANK_TIMEOUT (seconds) if set, else 300 s.
  std::chrono::milliseconds timeout{0};
};

/// The ranks of an SPMD program. See the file comment.
class process_group {
 public:
  /// A group of one process (rank 0 of 1); uses no MPI.
  [[nodiscard]] static std::shared_ptr<process_group> single();
  /// MPI_COMM_WORLD. Every rank must call it (collective). The same group on later calls (the
  /// options of the first call hold). Throws communication_error when poolscope was built
  /// without MPI or MPI fails.
  [[nodiscard]] static std::shared_ptr<process_group> from_mpi(
      const process_group_options& options = {});
  /// from_mpi() when a launcher started this process (mpirun, srun, torchrun: launched()), else
  /// single(). Throws communication_error when a launcher started several ranks and poolscope was
  /// built without MPI (each rank would otherwise run alone, each its own whole program).
  [[nodiscard]] static std::shared_ptr<process_group> from_launcher(
      const process_group_options& options = {});
  /// Adopts an NCCL communicator (ncclComm_t, as PyTorch's ProcessGroupNCCL holds one per GPU)
  /// of `size` ranks in which this process is `rank`, each rank with one GPU: the CUDA backend
  /// moves pieces between ranks on it. No MPI: host collectives (barrier, broadcast, ...) throw
  /// logic_error, and host devices cannot be spread over such a group. The communicator stays
  /// the application's (never destroyed here). Throws invalid_argument naming a null
  /// communicator or a rank outside [0, size).
  [[nodiscard]] static std::shared_ptr<process_group> adopt_nccl(
      void* nccl_comm, int rank, int size, const process_group_options& options = {});

  /// Whether a launcher started this process: the world size its environment gives
  /// (OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS or WORLD_SIZE), 0 when none did.
  [[nodiscard]] static int launched() noexcept;

  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;
  ~process_group();

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// Whether host collectives and host transfers go through MPI (from_mpi).
  [[nodiscard]] bool uses_mpi() const noexcept { return world_ != nullptr; }
  /// The adopted NCCL communicator (an ncclComm_t), or null.
  [[nodiscard]] void* nccl_communicator() const noexcept { return nccl_comm_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// This host's name (MPI_Get_processor_name, or gethostname).
  [[nodiscard]] std::string host_name() const;
  /// This rank's place among the ranks on its host, and how many there are (from the host names
  /// every rank gave when the group was made; 0 and 1 for a group of one or an adopted one).
  [[nodiscard]] int local_rank() const noexcept { return local_rank_; }
  [[nodiscard]] int local_size() const noexcept { return local_size_; }
  /// "rank 1 of 3" (for messages).
  [[nodiscard]] std::string describe() const;

  // --- host collectives (a group of one does them in place) ---
  /// Returns once every rank has called it.
  void barrier();
  /// `bytes` at `data` of rank `root` into `data` of every rank.
  void broadcast(void* data, std::size_t bytes, int root);
  /// Every rank's `value`, in rank order.
  [[nodiscard]] std::vector<std::int64_t> all_gather(std::int64_t value);
  /// Every rank's `text`, in rank order.
  [[nodiscard]] std::vector<std::string> all_gather(const std::string& text);
  /// The sum, max or min of every rank's values, element by element.
  enum class reduction : std::uint8_t { sum, max, min };
  [[nodiscard]] std::vector<std::int64_t> all_reduce(const std::vector<std::int64_t>& values,
                                                     reduction op);

  // --- point to point (the host devices' transfers; MPI groups only) ---
  /// Sends `bytes` at `data` to rank `peer` with `tag` (0..32767), returning once they are sent.
  /// Messages of one tag between two ranks arrive in the order they were sent.
  void send(const void* data, std::size_t bytes, int peer, int tag);
  /// Receives exactly `bytes` from rank `peer` with `tag` into `data`. Throws communication_error
  /// when a message of another size arrives (the ranks do not run the same program).
  void receive(void* data, std::size_t bytes, int peer, int tag);

  // --- faults ---
  /// Tells every other rank that this one failed (`why`): their next wait throws
  /// communication_error naming this rank and `why`. Later waits of this group throw too. Never
  /// throws (a notice that cannot be sent is logged).
  void fail(const std::string& why) noexcept;
  /// The first failure this group saw (its own, a timeout, or another rank's notice), if any.
  [[nodiscard]] std::optional<std::string> failure() const;
  /// failure(), after taking another rank's notice if one has arrived (for a thread that watches
  /// the ranks without waiting on the group: the CUDA backend's NCCL watchdog).
  [[nodiscard]] std::optional<std::string> poll_failure();
  /// Ends every rank of the job at once (MPI_Abort; without MPI running, this process exits),
  /// after writing "poolscope: <why>" to stderr: the last resort when a rank cannot fail cleanly.
  /// Static: it needs no group (a watchdog may call it while the group is being destroyed).
  [[noreturn]] static void abort_launch(const std::string& why, int code = 1) noexcept;

 private:
  struct token {};

 public:
  /// For the factories (use them).
  process_group(token, int rank, int size, std::unique_ptr<detail::mpi::world> world,
                void* nccl_comm, std::chrono::milliseconds timeout);

 private:
  /// Throws communication_error if a failure was seen (a notice is looked for first).
  void check_failed();
  /// Notes `why` as the group's failure unless one is noted already; returns the first one.
  std::string note_failure(const std::string& why);
  /// The MPI world, or logic_error naming `what` for a group without MPI.
  detail::mpi::world& mpi(const char* what) const;
  template <typename Request>
  void wait_for(Request& r, const std::string& what, int peer, std::size_t* received = nullptr);

  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::unique_ptr<detail::mpi::world> world_;
  void* nccl_comm_ = nullptr;
  std::chrono::milliseconds timeout_;
  mutable std::mutex failure_mutex_;
  std::optional<std::string> failure_;  // failure_mutex_
};

}  // namespace poolscope::darray
