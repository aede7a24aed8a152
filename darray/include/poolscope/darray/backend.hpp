// backend: the devices a DistributedArray lives on, and the only code that touches their memory.
// Two implementations run the same planner and executor: CUDA (a compute and a transfer stream per
// GPU, events, kernels, cuBLAS, peer copies or NCCL) and host (N fake devices, each with a compute
// and a transfer worker thread, events and memcpy). CI tests everything through the host backend.
//
//   auto be = poolscope::darray::make_backend("host:2");      // or "cuda", "cuda:2", "auto"
//   auto buf = be->allocate(0, 4096);                          // from device 0's pool allocator
//   view v = view::dense(buf->data(), {1024});
//   be->fill(0, queue_kind::compute, dtype::f32, v, scalar::of(1.0));
//   event e = be->record(0, queue_kind::compute);
//   be->wait(1, queue_kind::transfer, e);                     // device 1's transfer queue waits
//
// Queues: every device has a compute and a transfer queue; work on one queue runs in order,
// queues run concurrently; record()/wait() order work across queues and devices (cudaEvent /
// cudaStreamWaitEvent, or their host equivalents). Every enqueue returns at once.
// Memory: buffers come from each device's poolscope allocator (strategy chosen in
// backend_options), so every chunk allocation goes through the hooks. A buffer is returned to its
// allocator when its last owner drops it *and* every event recorded with add_use() has completed
// (checked whenever the backend allocates or synchronizes, and at destruction) — or, when those
// events all belong to one queue, handed at once to an allocation of the same size for work on
// that queue (allocate with a first_use queue: stream-ordered reuse).
// Tracing: every copy is an NVTX range of category darray.transfer, every op one of
// darray.compute, and when a timeline is attached (set_timeline) the host backend adds a slice per
// executed task (device = the device whose queue ran it); on CUDA the timeline's CUPTI records show
// the kernels and copies themselves.
//
// Arithmetic (both backends compute the same values): floating types use the C++/CUDA math
// functions of their type. Integer types: unary exp/log/sin/cos/sqrt are computed in double and
// converted back (truncated toward zero, saturated to the type's range, NaN -> 0); binary pow is
// exact (by squaring: a double is not beyond 2^53), saturated to the type's range, and a negative
// exponent gives the real result truncated toward zero (1 and -1 by parity for a = 1, -1; the
// max for a = 0; else 0); div truncates toward zero and x / 0 is 0; add, sub, mul, abs and neg
// wrap as two's complement. Reductions of floating types may differ between backends by rounding
// only (the order of additions differs).
//
// Processes: a backend is built over a process group (backend_options::group; a group of one by
// default) and numbers the devices of every rank, rank by rank: device_count() counts them all,
// and this process holds [first_local_device(), first_local_device() + local_device_count()).
// Building a backend over a group of several ranks is collective (every rank builds one, with the
// same spec shape). Work is enqueued on this process's devices only (others throw
// invalid_argument); send() and receive() move data between ranks (host devices: MPI on the
// transfer worker; GPUs: NCCL on the transfer stream, or with between_ranks = mpi through pinned
// host memory and MPI), each rank enqueuing its own side in the same order as every other rank
// (the executor issues a plan's pieces in plan order).
// Ownership: the backend owns its devices' queues, allocators and worker threads; buffers and
// events keep the backend state they need alive. Thread safety: enqueue methods may be called
// from several threads at once; calls of different threads on one queue interleave in some order,
// so work that must follow other work (a wait, the op, its record) is enqueued by one thread (the
// executor enqueues each chunk's work from one thread: the caller's or an issuing thread). Errors:
// bad views (rank, extents, device) throw invalid_argument before anything is enqueued; CUDA
// failures throw cuda_error; allocation failures out_of_memory.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "poolscope/darray/fork_join.hpp"
#include "poolscope/darray/geometry.hpp"
#include "poolscope/darray/planner.hpp"
#include "poolscope/darray/process_group.hpp"
#include "poolscope/pool/allocator.hpp"
#include "poolscope/spin_lock.hpp"

namespace poolscope::profiler {
class timeline;
}

namespace poolscope::darray {

/// Element types of distributed arrays.
enum class dtype : std::uint8_t { f32, f64, i32, i64 };
[[nodiscard]] std::size_t size_of(dtype t) noexcept;
[[nodiscard]] std::string_view to_string(dtype t) noexcept;
template <typename T>
inline constexpr bool is_element_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t>;
/// The dtype of T (float, double, int32_t, int64_t).
template <typename T>
constexpr dtype dtype_of() noexcept {
  static_assert(is_element_type_v<T>, "DistributedArray holds float, double, int32_t or int64_t");
  if constexpr (std::is_same_v<T, float>) {
    return dtype::f32;
  } else if constexpr (std::is_same_v<T, double>) {
    return dtype::f64;
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return dtype::i32;
  } else {
    return dtype::i64;
  }
}

enum class unary_op : std::uint8_t { neg, abs, exp, log, sin, cos, sqrt };
enum class binary_op : std::uint8_t { add, sub, mul, div, maximum, minimum, pow };
/// Reductions, and the modes of partial arrays.
enum class reduce_op : std::uint8_t { sum, prod, max, min };
[[nodiscard]] std::string_view to_string(unary_op op) noexcept;
[[nodiscard]] std::string_view to_string(binary_op op) noexcept;
[[nodiscard]] std::string_view to_string(reduce_op op) noexcept;

/// A scalar operand, held as both a double and an int64 (the kernel reads the one of its dtype).
struct scalar {
  double f = 0.0;
  std::int64_t i = 0;
  template <typename T>
  [[nodiscard]] static scalar of(T v) noexcept {
    return scalar{static_cast<double>(v), static_cast<std::int64_t>(v)};
  }
};
/// The identity of `op` for `t` (0, 1, lowest, highest).
[[nodiscard]] scalar identity(reduce_op op, dtype t) noexcept;

/// A strided N-D view of elements in one buffer: element (i0..in) is at
/// base + (offset + sum(i_k * stride_k)) * element size. Strides are in elements, >= 0.
struct view {
  void* base = nullptr;
  std::int64_t offset = 0;
  std::size_t rank = 0;
  std::array<std::int64_t, max_rank> extent{};
  std::array<std::int64_t, max_rank> stride{};

  /// Number of elements (1 for rank 0).
  [[nodiscard]] std::int64_t size() const noexcept;
  /// A dense row-major view of `extents` starting at `base`.
  [[nodiscard]] static view dense(void* base, const shape_t& extents);
  /// The elements `part` of a buffer holding `storage` densely (part must be inside storage).
  [[nodiscard]] static view of_box(void* base, const box& storage, const box& part);
  /// True if the elements are consecutive in memory in row-major order.
  [[nodiscard]] bool contiguous() const noexcept;
  [[nodiscard]] shape_t extents() const { return shape_t(extent.begin(), extent.begin() + rank); }
};

/// The work queues of a device.
enum class queue_kind : std::uint8_t { compute, transfer };

namespace detail {
/// A backend's event (cudaEvent or a host flag). Implemented by each backend.
class event_state {
 public:
  virtual ~event_state() = default;
  [[nodiscard]] virtual bool ready() const = 0;
  /// True if already seen complete (a wait or a query returned so): no query, never blocks.
  /// Default: false (unknown).
  [[nodiscard]] virtual bool known_complete() const noexcept { return false; }
  virtual void wait() const = 0;  ///< blocks the calling thread until complete
  /// The backend that recorded it (null when unknown): its queue_key and sequence mean something
  /// only to that backend.
  [[nodiscard]] const void* owner() const noexcept { return owner_; }
  /// The queue the event was recorded on (backend::queue_key).
  [[nodiscard]] int queue_key() const noexcept { return queue_key_; }
  /// Its place on that queue (from 1): the events of one queue complete in sequence order.
  [[nodiscard]] std::uint64_t sequence() const noexcept { return sequence_; }

 protected:
  event_state() = default;
  event_state(const void* owner, int queue_key, std::uint64_t sequence) noexcept
      : owner_(owner), queue_key_(queue_key), sequence_(sequence) {}

 private:
  const void* owner_ = nullptr;
  int queue_key_ = -1;
  std::uint64_t sequence_ = 0;
};
}  // namespace detail

/// A point in one queue's work: complete once everything enqueued before it has run.
/// An empty event is always complete. Copyable handle. Thread-safe.
class event {
 public:
  event() = default;
  explicit event(std::shared_ptr<const detail::event_state> s) noexcept : state_(std::move(s)) {}
  [[nodiscard]] bool empty() const noexcept { return !state_; }
  /// True once complete (never blocks).
  [[nodiscard]] bool ready() const { return !state_ || state_->ready(); }
  /// Blocks the calling thread until complete.
  void wait() const {
    if (state_) {
      state_->wait();
    }
  }
  [[nodiscard]] const detail::event_state* state() const noexcept { return state_.get(); }

 private:
  std::shared_ptr<const detail::event_state> state_;
};

class backend;

/// Device memory from a backend's allocator. Returned to the allocator when the last shared_ptr
/// goes and every use recorded with add_use() is complete. Thread-safe.
/// Cost: add_use keeps the latest event per queue (a later event of a queue completes after the
/// earlier ones), so it never queries an event and holds at most one event per queue.
class buffer {
 public:
  buffer(std::shared_ptr<backend> owner, int device, void* ptr, std::size_t bytes) noexcept;
  /// A buffer over memory whose earlier work `uses` may still be pending (at most one event per
  /// queue, as add_use keeps them): they count as its first uses.
  buffer(std::shared_ptr<backend> owner, int device, void* ptr, std::size_t bytes,
         std::vector<event> uses) noexcept;
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer();
  [[nodiscard]] void* data() const noexcept { return ptr_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  /// The device (of the backend's numbering) the memory is on.
  [[nodiscard]] int device() const noexcept;
  /// Work that reads or writes this buffer: the memory is not reused before `e` completes.
  void add_use(const event& e);

 private:
  std::shared_ptr<backend> owner_;
  int device_;  // the index among the owner's local devices
  void* ptr_;
  std::size_t bytes_;
  spin_lock uses_lock_;  // guards uses_ (a few instructions under it)
  std::vector<event> uses_;
};

/// How bytes move between devices.
enum class transport : std::uint8_t {
  automatic,  ///< the backend chooses per reshard (backend::groups_transfers)
  peer,       ///< copy engines, piece by piece (cudaMemcpyPeerAsync / 2-D copies; memcpy on host)
  nccl,  ///< NCCL: a reshard's sends and receives in one group (CUDA; host: memcpy, same order)
};
[[nodiscard]] std::string_view to_string(transport t) noexcept;

/// How a CUDA backend over several ranks moves GPU data between them (backend_options::
/// between_ranks; docs/multiprocess.md). Host devices always use MPI.
enum class rank_transport : std::uint8_t {
  /// Copy engines through CUDA IPC between GPUs that see each other (ranks of one host; two ranks
  /// may share a GPU), NCCL between the others: what automatic picks is the same on every rank.
  automatic,
  nccl,  ///< ncclSend / ncclRecv on the transfer stream: a GPU of its own per rank
  mpi,   ///< staged through pinned host memory: device -> host, MPI, host -> device (any GPUs)
};
/// "auto", "nccl" or "mpi".
[[nodiscard]] std::string_view to_string(rank_transport t) noexcept;
/// "auto", "nccl" or "mpi". Throws invalid_argument naming any other text.
[[nodiscard]] rank_transport parse_rank_transport(std::string_view text);
/// "nccl", "mpi in chunks of 4.00 MiB" or "mpi in whole pieces" (backend_options::between_ranks and
/// staging_chunk_bytes, for messages and summaries).
[[nodiscard]] std::string describe_between_ranks(rank_transport t, std::size_t staging_chunk_bytes);

/// Settings of a backend.
struct backend_options {
  std::string allocator = "bfc";  ///< pool strategy per device (pool::allocator_names())
  std::string resource;           ///< "" -> cuda for CUDA devices, host for host devices
  transport transfers = transport::automatic;
  /// Threads that enqueue devices' shares of an elementwise op alongside the calling thread
  /// (backend::issue_each), so the host cost of several GPUs' enqueue calls overlaps. -1: on
  /// CUDA one per GPU after the first when kernels are launched plainly, none with kernel_graphs
  /// (a graph launch is cheap enough that a second thread in the driver costs more than it
  /// overlaps: docs/perf.md, "Issuing threads"); none on host (a queue push); 0: none.
  int issue_threads = -1;
  /// CUDA: launch kernels as one-node graphs, a few kept executables per stream, kernel and block
  /// size: a graph launch costs the host a third of a cudaLaunchKernel (docs/perf.md, "Kernels
  /// launched as graphs"; docs/darray.md). Ignored by host backends.
  bool kernel_graphs = true;
  /// Compute enqueued on a device while a large copy out of it (>= yield_min_bytes) may still
  /// be in flight yields memory bandwidth to that copy: on GPUs, element-wise kernels over
  /// contiguous operands (the vector path) run at 2 blocks per SM instead of 8. A kernel at full
  /// occupancy slows the copy engines reading its device for a peer, while the vector path
  /// loses nothing measurable at 2 blocks per SM; writes into a busy device are not slowed.
  /// The copies are what a reshard or fused op waits for, so they go first, and the fused op
  /// is faster for it (docs/perf.md, "Compute yields to copies out of its device";
  /// docs/darray.md). Host backends only count it.
  bool yield_to_copies = true;
  /// The processes whose devices the backend numbers (null: a group of one, this process).
  std::shared_ptr<process_group> group;
  /// CUDA over several ranks: NCCL between ranks (each rank needs a GPU of its own), or MPI
  /// staged through pinned host memory (ranks may share a GPU; NCCL need not be usable). Every
  /// rank must choose the same. Ignored by host backends and by a group of one.
  rank_transport between_ranks = rank_transport::automatic;
  /// CUDA over several ranks with between_ranks = mpi: pieces move in chunks of this many bytes,
  /// each copied to the host, sent and copied to the device on its own, so that the three steps
  /// of a large piece overlap (docs/multiprocess.md). Smaller chunks pipeline more finely but
  /// each costs a copy, a message and a worker job: 16 MiB reshards fastest of those measured
  /// (docs/perf.md, "Across processes"). 0: a piece moves whole. Every rank must give the same,
  /// as between_ranks (the backend refuses a difference, naming it).
  std::size_t staging_chunk_bytes = std::size_t{16} << 20;
};

/// What a backend did.
struct backend_stats {
  std::uint64_t copies_local = 0;  ///< copies within a device
  std::uint64_t copies_peer = 0;   ///< copies between devices
  std::uint64_t bytes_local = 0;
  std::uint64_t bytes_peer = 0;
  std::uint64_t bytes_nccl = 0;    ///< of bytes_peer, moved by NCCL
  std::uint64_t ops = 0;           ///< compute tasks (fill, unary, binary, reduce, gemm, ...)
  std::uint64_t waits = 0;         ///< waits of one queue for another's event, enqueued
  std::uint64_t waits_elided = 0;  ///< waits that enqueued nothing (already ordered or complete)
  /// Allocations served in stream order by a dropped buffer whose uses were pending on the
  /// queue of the new work (allocate with first_use), without an allocator call.
  std::uint64_t buffers_reused = 0;
  /// Compute tasks enqueued on a device while a large copy out of it was in flight
  /// (backend_options::yield_to_copies: on GPUs, launched with fewer blocks).
  std::uint64_t compute_yielding = 0;
  /// CUDA graph executables made to launch kernels (backend_options::kernel_graphs): one per
  /// stream, kernel and block size, each costing tens of microseconds of host time once.
  std::uint64_t kernel_graphs_made = 0;
  /// Kernel launches through a graph that had to set its executable's grid and arguments first:
  /// a launch with the same ones as one of its kernel's executables' last launch (an op repeated
  /// on the same buffers) sets none.
  std::uint64_t kernel_graph_updates = 0;
  /// Chunk parts, pieces and index nodes the executor visited to pair up what its ops and
  /// reshards read and write (count_parts_visited): the host-side bookkeeping, which grows as
  /// O(P log P) in the parts P of a chunk (tests bound it; the time of an op follows it).
  std::uint64_t parts_visited = 0;
  /// Transfers to or from devices of other ranks this process made (each side counts its own).
  std::uint64_t copies_between_ranks = 0;
  std::uint64_t bytes_between_ranks = 0;
  /// Of bytes_between_ranks, received here by copy engines through CUDA IPC
  /// (rank_transport::automatic between GPUs that see each other).
  std::uint64_t bytes_ipc = 0;
};

/// Every figure of backend_stats with its name, in declaration order: what reports write (the
/// demo's report, each `bench darray` workload's counts), so the names are kept in one place.
inline constexpr std::array<std::pair<std::string_view, std::uint64_t backend_stats::*>, 16>
    backend_stats_fields{{{"copies_local", &backend_stats::copies_local},
                          {"copies_peer", &backend_stats::copies_peer},
                          {"bytes_local", &backend_stats::bytes_local},
                          {"bytes_peer", &backend_stats::bytes_peer},
                          {"bytes_nccl", &backend_stats::bytes_nccl},
                          {"ops", &backend_stats::ops},
                          {"waits", &backend_stats::waits},
                          {"waits_elided", &backend_stats::waits_elided},
                          {"buffers_reused", &backend_stats::buffers_reused},
                          {"compute_yielding", &backend_stats::compute_yielding},
                          {"kernel_graphs_made", &backend_stats::kernel_graphs_made},
                          {"kernel_graph_updates", &backend_stats::kernel_graph_updates},
                          {"parts_visited", &backend_stats::parts_visited},
                          {"copies_between_ranks", &backend_stats::copies_between_ranks},
                          {"bytes_between_ranks", &backend_stats::bytes_between_ranks},
                          {"bytes_ipc", &backend_stats::bytes_ipc}}};

/// The interface the executor drives. See the file comment. Public methods check their arguments
/// and call the private virtual do_* of the implementation.
class backend : public std::enable_shared_from_this<backend> {
 public:
  backend();
  backend(const backend&) = delete;
  backend& operator=(const backend&) = delete;
  virtual ~backend() = default;

  /// "host:2", "cuda:2" (this process's devices; with several ranks "host:2 x 3 ranks").
  [[nodiscard]] std::string name() const;
  /// This backend's number in the process (1, 2, ... in order of creation): it tells apart two
  /// backends of one name in messages ("host:2 #1", "host:2 #3").
  [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
  /// name() and id(): "host:2 #1".
  [[nodiscard]] std::string label() const;
  /// The devices of every rank of group().
  [[nodiscard]] int device_count() const noexcept { return device_total_; }
  [[nodiscard]] bool is_gpu() const noexcept { return do_is_gpu(); }
  /// "NVIDIA H200", "host device 1" (any rank's device: the names are gathered when the backend
  /// is built).
  [[nodiscard]] std::string device_name(int device) const;
  /// The pool allocator of `device` (its stats, limit, release). This process's devices only.
  [[nodiscard]] pool::allocator& allocator(int device);

  /// The processes this backend spans (never null).
  [[nodiscard]] const std::shared_ptr<process_group>& group() const noexcept { return group_; }
  /// The devices of this process: [first_local_device(), first_local_device() +
  /// local_device_count()).
  [[nodiscard]] int local_device_count() const noexcept { return local_count_; }
  [[nodiscard]] int first_local_device() const noexcept { return first_local_; }
  [[nodiscard]] bool is_local(int device) const noexcept {
    return device >= first_local_ && device - first_local_ < local_count_;
  }
  /// The rank holding `device`. Throws invalid_argument naming a device outside
  /// [0, device_count()).
  [[nodiscard]] int rank_of(int device) const;
  /// The first device of `rank` (every rank holds at least one). Throws invalid_argument naming
  /// a rank outside the group.
  [[nodiscard]] int first_device_of(int rank) const;

  /// `bytes` (> 0) of memory on `device`, from its allocator. Frees completed deferred buffers
  /// first — for a small request (< 1 MiB) only once 64 buffers or 64 MiB wait, and half as many
  /// again as the last collection left waiting, so a loop of small ops does not query events on
  /// every allocation. A collection asks each queue at most about log2(waiting events) + 1
  /// times (usually once or twice). Throws out_of_memory (after waiting for every deferred
  /// buffer and retrying once).
  [[nodiscard]] std::shared_ptr<buffer> allocate(int device, std::size_t bytes);
  /// allocate() for a buffer whose first use is work enqueued after this call on (device,
  /// first_use): a buffer of exactly `bytes` dropped while its uses were still pending, all on
  /// that same queue, may be handed over at once — the queue runs the new work after them
  /// (stream-ordered reuse, as a caching allocator reuses a block freed on a stream for that
  /// stream). A loop such as `x = x + y` then holds two buffers per device, not one per op the
  /// host runs ahead. Only the reuse_scan buffers dropped last are looked at; else, or when none
  /// fits, allocate(device, bytes). A reused buffer never went back to its allocator, whose
  /// stats and hooks count it in use throughout (stats().buffers_reused counts these).
  [[nodiscard]] std::shared_ptr<buffer> allocate(int device, std::size_t bytes,
                                                 queue_kind first_use);
  /// The most devices one rank may hold in a group of several (transfers between ranks tag their
  /// messages with the pair of devices).
  static constexpr int max_devices_per_rank = 64;
  /// How many of the buffers dropped last allocate(device, bytes, first_use) looks at.
  static constexpr std::size_t reuse_scan = 8;

  /// An event after the work enqueued so far on (device, q).
  [[nodiscard]] event record(int device, queue_kind q);
  /// Work enqueued later on (device, q) starts after `e` (any device's) completes. Enqueues
  /// nothing when that already holds: `e` is of the same queue, known complete, or not later than
  /// an event of its queue that (device, q) already waits for.
  void wait(int device, queue_kind q, const event& e);
  /// Blocks until every queue of every device is idle; then frees deferred buffers. Reports a
  /// failure of enqueued work since the last synchronize: cuda_error for a device's (CUDA);
  /// runtime_error naming the first failed task (host devices, whose events recorded after that
  /// task throw it from wait(), as do downloads from its device, until synchronize reports it).
  void synchronize();

  /// Copies `src` (on src_device) into `dst` (on dst_device) on (queue_device, q), which must be
  /// one of the two devices. Views must have equal extents. `how` picks the transport between
  /// devices (ignored within a device).
  void copy(int queue_device, queue_kind q, dtype t, const view& dst, int dst_device,
            const view& src, int src_device, transport how = transport::automatic);
  /// One copy of a transfer group.
  struct transfer {
    view dst;
    int dst_device = 0;
    view src;
    int src_device = 0;
  };
  /// Copies every transfer of `list` (each between two devices, equal extents) as one group. A
  /// transfer with one side on another rank is this rank's send or receive of it (see send();
  /// the other side's view is ignored, and that rank's group holds the matching transfer). Else:
  /// with NCCL one grouped call, every send and receive at once (`how` nccl, or automatic on a
  /// backend whose transfers default to NCCL; views must then be contiguous, else the group goes
  /// by copy engines); otherwise the copies one after another on the senders' transfer queues.
  /// Each device's part starts after the work enqueued so far on its transfer queue; afterwards
  /// that queue is ordered after every copy of the group the device sends or receives, so an
  /// event recorded there marks its data arrived (receiver) or free to overwrite (sender).
  void copy_group(dtype t, const std::vector<transfer>& list, transport how);
  /// Whether a reshard with `plan`, asked to move data by `how`, should send its pieces as one
  /// copy_group rather than piece by piece: always for nccl, never for peer; for automatic the
  /// backend's choice (CUDA: when its default transport is NCCL, for the reasons in
  /// docs/darray.md "Transports"; host devices: never).
  [[nodiscard]] bool groups_transfers(const reshard_plan& plan, transport how) const;
  /// Sends `src` (contiguous, on this process's `device`) to `peer_device` of another rank, on
  /// the transfer queue of `device` after the work enqueued there so far: an event recorded there
  /// afterwards marks `src` free to overwrite. The peer's rank enqueues the matching receive();
  /// sends and receives between two devices pair up in the order they are enqueued. Throws
  /// invalid_argument naming a device of this process as the peer, or a strided view.
  void send(int device, dtype t, const view& src, int peer_device);
  /// Receives into `dst` (contiguous, on this process's `device`) what `peer_device` of another
  /// rank sends, on the transfer queue of `device`: an event recorded there afterwards marks the
  /// data arrived. `dst` must hold nothing that pending work still reads or writes (a buffer made
  /// for it): between GPUs that CUDA IPC links the peer's copy engine writes it as soon as the
  /// data is ready there, without waiting for this queue to reach the receive. A failure or a peer
  /// silent for the group's timeout fails the queue's task (communication_error, reported as a
  /// failed task is). On GPUs with between_ranks = mpi a worker receives the bytes into host memory
  /// while the queue waits at a gate before their copy; this returns at once, and a failure throws
  /// from the next synchronize() or transfer.
  void receive(int device, dtype t, const view& dst, int peer_device);
  /// Copies host memory (a view whose base is a host pointer) into `dst` on `device` and blocks
  /// until done (the host memory may be reused on return).
  void upload(int device, dtype t, const view& dst, const view& host_src);
  /// Copies `src` on `device` into host memory after the work on both of its queues, blocking.
  void download(int device, dtype t, const view& host_dst, const view& src);

  /// dst[i] = value.
  void fill(int device, queue_kind q, dtype t, const view& dst, scalar value);
  /// dst[i] = op(src[i]).
  void unary(int device, queue_kind q, dtype t, unary_op op, const view& dst, const view& src);
  /// dst[i] = op(a[i], b[i]); a or b may be a scalar instead (the view is then ignored).
  void binary(int device, queue_kind q, dtype t, binary_op op, const view& dst, const view& a,
              const view& b, const scalar* a_scalar = nullptr, const scalar* b_scalar = nullptr);
  /// The views of one part of binary_parts: dst = op(a, b).
  struct binary_part {
    view dst;
    view a;
    view b;
  };
  /// binary() on each of `parts` (same device, queue and op) as one task where the backend can
  /// (CUDA: one kernel launch for up to 8 contiguous parts; otherwise one per part).
  void binary_parts(int device, queue_kind q, dtype t, binary_op op,
                    const std::vector<binary_part>& parts);
  /// acc[i] = op(acc[i], src[i]).
  void accumulate(int device, queue_kind q, dtype t, reduce_op op, const view& acc,
                  const view& src);
  /// Reduces `src` along `axis` (or all axes when axis < 0) and combines the result into `acc`
  /// (acc = op(acc, reduced)): acc has src's extents without `axis` (rank 0 for all axes).
  void reduce(int device, queue_kind q, dtype t, reduce_op op, const view& acc, const view& src,
              int axis);
  /// c += a @ b for 2-D views with unit column stride (a: m x k, b: k x n, c: m x n).
  void gemm_accumulate(int device, queue_kind q, dtype t, const view& c, const view& a,
                       const view& b);

  /// Attaches (or, with nullptr, detaches) a timeline that receives host-side slices of executed
  /// tasks. The timeline must outlive the attachment.
  void set_timeline(profiler::timeline* t) noexcept;
  /// What the backend did so far. Each figure is exact; work enqueued meanwhile on other threads
  /// may show in some figures and not yet in others.
  [[nodiscard]] backend_stats stats() const;
  /// The plans of this backend's recent reshards (thread-safe; see plan_cache).
  [[nodiscard]] plan_cache& plans() noexcept { return plans_; }
  /// For the executor: adds `n` to stats().parts_visited (one relaxed atomic add; the executor
  /// adds an op's count once).
  void count_parts_visited(std::uint64_t n) noexcept {
    counters_.parts_visited.fetch_add(n, std::memory_order_relaxed);
  }

  /// Calls f(i) once for each i in [0, n) — calls of different i may run at once, on the
  /// backend's issuing threads (backend_options::issue_threads) and this one — and returns when
  /// all have returned, rethrowing the first exception. For enqueue work of different devices
  /// (each i its own device): the enqueue methods are thread-safe.
  template <typename F>
  void issue_each(std::size_t n, F&& f) {
    if (issuers_ != nullptr) {
      issuers_->run(n, detail::task_ref(f));
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        f(i);
      }
    }
  }
  /// The issuing threads besides the caller's (backend_options::issue_threads).
  [[nodiscard]] std::size_t issue_threads() const noexcept {
    return issuers_ != nullptr ? issuers_->helpers() : 0;
  }

  /// The smallest copy compute yields to (backend_options::yield_to_copies): 4 MiB move in
  /// about 10 us over NVLink; shorter copies end before a kernel would gain from yielding.
  static constexpr std::uint64_t yield_min_bytes = std::uint64_t{4} << 20;

  /// The key of a queue in event_state::queue_key().
  [[nodiscard]] static constexpr int queue_key(int device, queue_kind q) noexcept {
    return device * 2 + (q == queue_kind::compute ? 0 : 1);
  }

 protected:
  /// For implementations: a transfer of a group with another rank, seen from this one.
  struct rank_transfer {
    view data;       ///< this side's: the source when sending, the destination when receiving
    int device = 0;  ///< this process's (local index)
    int peer_device = 0;
    int peer_rank = 0;
    int tag = 0;
    bool sending = false;
  };
  /// For implementations: each of `between` by do_send / do_receive, in order.
  void exchange_one_by_one(dtype t, const std::vector<rank_transfer>& between);
  /// For implementations: a group without a grouped transport: each copy on its sender's
  /// transfer queue (by `how`), then each receiver's transfer queue ordered after its senders'.
  void copy_one_by_one(dtype t, const std::vector<transfer>& list, transport how);
  /// For implementations, at the end of the constructor (collective over `group`, null: a group
  /// of one): numbers the devices of every rank, this one's from first_local_device(), and
  /// gathers their names. Throws communication_error when another rank fails meanwhile.
  void join_group(std::shared_ptr<process_group> group);
  /// For implementations: the global number of this process's device `local`.
  [[nodiscard]] int global_device(int local) const noexcept { return first_local_ + local; }
  /// For implementations: counts a transfer to or from another rank in stats().
  void count_between_ranks(std::uint64_t bytes) noexcept;
  /// For implementations: counts bytes received from another rank through CUDA IPC.
  void count_ipc(std::uint64_t bytes) noexcept;
  /// For implementations: the attached timeline (may be null).
  [[nodiscard]] profiler::timeline* attached_timeline() const noexcept;
  /// For implementations, from the constructor: starts the issuing threads of issue_each as
  /// options.issue_threads says (-1: `automatic` of them, capped at one per device after the
  /// first). Throws invalid_argument naming a value below -1.
  void start_issuers(const backend_options& options, int automatic);
  /// For implementations: counts work in stats().
  void count_copy(bool peer, std::uint64_t bytes, bool nccl) noexcept;
  void count_op() noexcept;
  /// For implementations: the counter of stats().kernel_graphs_made (lives as long as this).
  [[nodiscard]] std::atomic<std::uint64_t>* kernel_graphs_counter() noexcept {
    return &counters_.kernel_graphs_made;
  }
  /// For implementations: the counter of stats().kernel_graph_updates (lives as long as this).
  [[nodiscard]] std::atomic<std::uint64_t>* kernel_graph_updates_counter() noexcept {
    return &counters_.kernel_graph_updates;
  }
  /// For implementations, from the constructor: options.yield_to_copies.
  void set_yield_to_copies(bool on) noexcept { yield_to_copies_ = on; }
  /// For implementations: frees deferred buffers whose uses completed (all of them if `all`,
  /// after synchronizing). Call from do_synchronize's callers only through the public methods.
  void collect_deferred(bool all) noexcept;

 private:
  friend class buffer;
  /// allocate() on this process's device `device` (local index).
  [[nodiscard]] std::shared_ptr<buffer> allocate_on(int device, std::size_t bytes);
  void defer_free(int device, void* ptr, std::size_t bytes, std::vector<event> uses) noexcept;
  /// The index among this process's devices of `device` (what the do_* methods and the state
  /// below take); throws invalid_argument naming a device of another rank or of none.
  [[nodiscard]] int local(int device, const char* what) const {
    const int l = device - first_local_;
    if (l < 0 || l >= local_count_) [[unlikely]] {
      device_error(device, what);
    }
    return l;
  }
  /// Throws local()'s error for `device`.
  [[noreturn]] void device_error(int device, const char* what) const;
  /// The checks of send() and receive() (and copy_group's transfers with another rank): the
  /// transfer as this rank sees it, with the tag of the pair's messages.
  [[nodiscard]] rank_transfer between_ranks(int device, const view& v, int peer_device,
                                            bool sending, const char* what) const;
  /// send() or receive() of `x` (nothing when empty), counted in stats().
  void exchange(dtype t, const rank_transfer& x);

  [[nodiscard]] virtual std::string do_name() const = 0;
  [[nodiscard]] virtual int do_device_count() const noexcept = 0;
  [[nodiscard]] virtual bool do_is_gpu() const noexcept = 0;
  [[nodiscard]] virtual std::string do_device_name(int device) const = 0;
  [[nodiscard]] virtual pool::allocator& do_allocator(int device) = 0;
  /// The stream handle allocations on `device` are made with (its compute queue's).
  [[nodiscard]] virtual stream_view do_alloc_stream(int device) const noexcept = 0;
  /// An event with queue_key(device, q) and `sequence` (called under the queue's record lock).
  [[nodiscard]] virtual event do_record(int device, queue_kind q, std::uint64_t sequence) = 0;
  virtual void do_wait(int device, queue_kind q, const event& e) = 0;
  virtual void do_synchronize() = 0;
  virtual void do_copy(int queue_device, queue_kind q, dtype t, const view& dst, int dst_device,
                       const view& src, int src_device, transport how) = 0;
  /// `list`: the transfers within this process (local devices); `between`: those with another
  /// rank. Default: copy_one_by_one, then exchange_one_by_one.
  virtual void do_copy_group(dtype t, const std::vector<transfer>& list,
                             const std::vector<rank_transfer>& between, transport how);
  /// send() and receive() on this process's `device` (local), `peer_device` (global) of
  /// `peer_rank`; `tag` tells the pair's messages from other pairs' (MPI).
  virtual void do_send(int device, dtype t, const view& src, int peer_device, int peer_rank,
                       int tag) = 0;
  virtual void do_receive(int device, dtype t, const view& dst, int peer_device, int peer_rank,
                          int tag) = 0;
  /// groups_transfers for transport::automatic. Default: never.
  [[nodiscard]] virtual bool do_groups_automatically(const reshard_plan& plan) const;
  virtual void do_upload(int device, dtype t, const view& dst, const view& host_src) = 0;
  virtual void do_download(int device, dtype t, const view& host_dst, const view& src) = 0;
  // The element-wise tasks. `yielding`: the task is compute on a device while a large copy out of
  // it may still run (backend_options::yield_to_copies, decided by the public methods): on GPUs,
  // launch it with fewer blocks.
  virtual void do_fill(int device, queue_kind q, dtype t, const view& dst, scalar value,
                       bool yielding) = 0;
  virtual void do_unary(int device, queue_kind q, dtype t, unary_op op, const view& dst,
                        const view& src, bool yielding) = 0;
  virtual void do_binary(int device, queue_kind q, dtype t, binary_op op, const view& dst,
                         const view& a, const view& b, const scalar* a_scalar,
                         const scalar* b_scalar, bool yielding) = 0;
  /// Default: do_binary per part.
  virtual void do_binary_parts(int device, queue_kind q, dtype t, binary_op op,
                               const std::vector<binary_part>& parts, bool yielding);
  virtual void do_accumulate(int device, queue_kind q, dtype t, reduce_op op, const view& acc,
                             const view& src) = 0;
  virtual void do_reduce(int device, queue_kind q, dtype t, reduce_op op, const view& acc,
                         const view& src, int axis) = 0;
  virtual void do_gemm_accumulate(int device, queue_kind q, dtype t, const view& c, const view& a,
                                  const view& b) = 0;

  struct deferred {
    int device;
    void* ptr;
    std::size_t bytes;
    std::vector<event> uses;
    int queue = -1;  // the queue_key of every pending use when they share one (else -1)
  };
  // What the backend knows of each queue's events (see wait() and collect_deferred()).
  struct queue_track {
    std::mutex record_mutex;
    std::uint64_t recorded = 0;              // the last sequence handed out (record_mutex)
    std::atomic<std::uint64_t> complete{0};  // every event up to this sequence has completed
    // The source device of a copy of >= yield_min_bytes enqueued since the last record (-1:
    // none): that record marks the copy's end (yields_to_copies).
    std::atomic<int> copy_source{-1};
  };
  // Per device: the newest event after a large copy out of it, per queue that carried one, not
  // yet seen complete (yields_to_copies).
  struct outgoing_copies {
    std::atomic<bool> any{false};  // !ends.empty() (written under mutex)
    std::mutex mutex;
    std::vector<event> ends;
  };
  struct queue_tracks {
    std::size_t queues = 0;
    std::unique_ptr<queue_track[]> track;
    std::unique_ptr<std::atomic<std::uint64_t>[]> waited;  // [waiter * queues + source]
    std::unique_ptr<outgoing_copies[]> outgoing;           // [device]
  };
  queue_tracks& tracks();
  /// Keeps `end` (recorded after a large copy out of `device`) for yields_to_copies.
  void note_outgoing_copy(int device, const event& end) noexcept;
  /// Whether an element-wise task on (device, q) yields (the do_* methods' `yielding`): on the
  /// compute queue while a copy of at least yield_min_bytes out of `device` (enqueued with copy()
  /// and followed by a record() on its queue, as the executor does) may still be in flight,
  /// asking the device about the newest such copy of each queue; counts a yes in
  /// stats().compute_yielding. False when yield_to_copies is off. Thread-safe.
  [[nodiscard]] bool yields_to_copies(int device, queue_kind q) noexcept;
  /// The queue_key of `e` if this backend recorded it, else -1.
  [[nodiscard]] int own_queue_key(const event& e) const noexcept;
  /// Whether `e` is known complete without asking the device: its own flag, or (one of ours) a
  /// later event of its queue found complete.
  [[nodiscard]] bool settled(const event& e) const noexcept;
  /// collect_deferred's queries (under state_mutex_): raises each queue's `complete` to the
  /// newest of the deferred uses' events found complete, asking the oldest unsettled one first
  /// (pending: nothing of that queue can go), then the newest, then bisecting between them.
  /// Walks the deferred list once (twice for a queue it bisects); sorts only to bisect.
  void settle_deferred_uses() noexcept;

  // The figures of stats(), each counted alone (relaxed atomics: no lock on the enqueue path).
  struct counters {
    std::atomic<std::uint64_t> copies_local{0};
    std::atomic<std::uint64_t> copies_peer{0};
    std::atomic<std::uint64_t> bytes_local{0};
    std::atomic<std::uint64_t> bytes_peer{0};
    std::atomic<std::uint64_t> bytes_nccl{0};
    std::atomic<std::uint64_t> ops{0};
    std::atomic<std::uint64_t> waits{0};
    std::atomic<std::uint64_t> waits_elided{0};
    std::atomic<std::uint64_t> buffers_reused{0};
    std::atomic<std::uint64_t> compute_yielding{0};
    std::atomic<std::uint64_t> kernel_graphs_made{0};
    std::atomic<std::uint64_t> kernel_graph_updates{0};
    std::atomic<std::uint64_t> parts_visited{0};
    std::atomic<std::uint64_t> copies_between_ranks{0};
    std::atomic<std::uint64_t> bytes_between_ranks{0};
    std::atomic<std::uint64_t> bytes_ipc{0};
  };
  bool yield_to_copies_ = false;
  std::uint64_t id_;

  // The group and the numbering of its devices (join_group): a group of one until then.
  std::shared_ptr<process_group> group_;
  int first_local_ = 0;
  int local_count_ = 0;
  int device_total_ = 0;
  std::vector<int> first_of_rank_;         // per rank, then device_total_
  std::vector<std::string> device_names_;  // of every device, in device order

  std::once_flag tracks_once_;
  // Set (release) once tracks_ is built: tracks()'s fast path.
  std::atomic<bool> tracks_ready_{false};
  queue_tracks tracks_;
  mutable std::mutex state_mutex_;
  std::vector<deferred> deferred_;              // state_mutex_
  std::atomic<std::size_t> deferred_bytes_{0};  // of deferred_ (written under state_mutex_)
  std::atomic<std::size_t> deferred_count_{0};  // deferred_.size() (written under state_mutex_)
  // A small allocation collects once deferred_count_ or deferred_bytes_ reach these, or the
  // fixed minimums if higher (written under state_mutex_ by each partial collection: half as
  // much again as it left waiting; 0 after a full one).
  std::atomic<std::size_t> collect_at_count_{0};
  std::atomic<std::size_t> collect_at_bytes_{0};
  // settle_deferred_uses' scratch (state_mutex_): per queue, the oldest and the newest of the
  // deferred uses' unsettled events; and the events of one queue between the two.
  struct queue_span {
    const detail::event_state* oldest = nullptr;
    const detail::event_state* newest = nullptr;
  };
  std::vector<queue_span> spans_;
  std::vector<const detail::event_state*> between_;
  std::atomic<profiler::timeline*> timeline_{nullptr};
  counters counters_;
  plan_cache plans_;
  std::unique_ptr<detail::fork_join> issuers_;  // null: issue_each is a loop
};

/// What is wrong with a backend spec for make_backend ("" when it is well formed): e.g. "the device
/// count 0 is outside 1..64 (host:N: N host devices; cuda:N: the first N GPUs)". Checks the form
/// only (whether the GPUs exist is make_backend's to find out). Thread safety: reentrant.
[[nodiscard]] std::string backend_spec_error(std::string_view spec);
/// A backend by spec: "host:N" (N fake devices, 1..64), "cuda" (every GPU), "cuda:N" (the first
/// N GPUs), "auto" (cuda with a GPU, else host:2). Throws invalid_argument naming a bad spec and
/// what is wrong with it (backend_spec_error), device_unavailable for "cuda" without a GPU.
[[nodiscard]] std::shared_ptr<backend> make_backend(std::string_view spec,
                                                    const backend_options& options = {});
/// A host backend of `devices` fake devices.
[[nodiscard]] std::shared_ptr<backend> make_host_backend(int devices,
                                                         const backend_options& options = {});
namespace detail {
/// For tests of the error paths: enqueues on (device, q) of a host backend a task that throws
/// runtime_error(what), as a failing kernel would on a GPU. Throws invalid_argument naming any
/// other backend or an absent device.
void enqueue_failing_host_task(backend& be, int device, queue_kind q, const std::string& what);
}  // namespace detail
/// A CUDA backend over GPUs 0..devices-1 (-1: all). Throws device_unavailable without a GPU.
[[nodiscard]] std::shared_ptr<backend> make_cuda_backend(int devices,
                                                         const backend_options& options = {});

}  // namespace poolscope::darray
