// The CUDA backend: per GPU a compute and a transfer stream (non-blocking), the pool allocator
// chosen in backend_options over a "cuda" resource, cuBLAS handles, recycled events, and NCCL
// communicators created on first use. Copies within a GPU use cudaMemcpy(2D)Async or the strided
// copy kernel; between GPUs cudaMemcpyPeerAsync, 2-D peer copies, NCCL send/recv, or the copy
// kernel reading or writing peer memory; between ranks NCCL send/recv, or MPI through pinned host
// memory (mpi_staging.hpp). Everything CUDA goes through cuda_seam.hpp.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda_seam.hpp"
#include "gpu_spans.hpp"
#include "ipc_links.hpp"
#include "kernels.hpp"
#include "mpi_staging.hpp"
#include "nccl_watchdog.hpp"
#include "polled_wait.hpp"
#include "poolscope/darray/backend.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/profiler/scope.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "rank_binding.hpp"
#include "rank_gpus.hpp"
#include "scope_sites.hpp"
#include "transfer_slices.hpp"

namespace poolscope::darray {
namespace {

using detail::seam::device_guard;
using detail::seam::log_failure;
using profiler::category;

/// transport::automatic moves pieces between GPUs with the copy engines: raw cudaMemcpyPeerAsync
/// moves D1's bytes faster than NCCL send/recv (docs/perf.md, "Copy engines by default, NCCL on
/// request"), and NCCL's kernels take SMs from the compute a reshard should overlap with. NCCL is
/// used when asked for (transport::nccl).
constexpr bool automatic_uses_nccl = false;

/// Events kept for reuse per device; more are destroyed when released.
constexpr std::size_t event_free_list_capacity = 256;

// Recycles the cudaEvents (without timing) of one device. Shared by the backend and by every
// event it handed out, so events may outlive the backend. Thread-safe (a mutex).
class event_pool {
 public:
  explicit event_pool(int device) noexcept : device_(device) {}
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;
  ~event_pool() {
    for (cudaEvent_t e : free_) {
      log_failure("cudaEventDestroy", [e] { POOLSCOPE_CUDA_CHECK(cudaEventDestroy(e)); });
    }
  }

  [[nodiscard]] int device() const noexcept { return device_; }

  // A free event of this device (created when none is free).
  [[nodiscard]] cudaEvent_t acquire() {
    {
      const std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    const device_guard guard(device_);
    cudaEvent_t e = nullptr;
    POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  // Takes `e` back. An event may be re-recorded at once: waits enqueued on it before keep the
  // state it had when they were enqueued.
  void release(cudaEvent_t e) noexcept {
    try {
      const std::lock_guard lock(mutex_);
      if (free_.size() < event_free_list_capacity) {
        free_.push_back(e);
        return;
      }
    } catch (...) {  // the free list could not grow: destroy it instead
    }
    log_failure("cudaEventDestroy", [e] { POOLSCOPE_CUDA_CHECK(cudaEventDestroy(e)); });
  }

 private:
  int device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

// Whether the work before `e` has completed: cudaEventQuery, whose cudaErrorNotReady is an answer,
// not a failure (it is not sticky; the runtime may still record it as the thread's last error, so
// it is cleared); any other status is a failure of the GPU's work (sticky or not) and throws.
[[nodiscard]] bool event_done(cudaEvent_t e) {
  const cudaError_t s = cudaEventQuery(e);
  if (s == cudaSuccess) {
    return true;
  }
  if (s == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  detail::seam::raise(s, "cudaEventQuery(event)", __FILE__, __LINE__);
}

// The one host wait on GPU work of this backend: polls `e` as polled_wait.hpp says (a few µs back
// to back, then yielding the core, then sleeping), never cudaEventSynchronize or
// cudaStreamSynchronize, which spin under the default scheduling and so starve the threads that
// progress MPI on a rank bound to one core (polled_wait.hpp says why not blocking-sync events).
void wait_for_event(cudaEvent_t e) {
  detail::poll_until([e] { return event_done(e); });
}

// An event of a pool, given back when its holder goes. Not copyable.
struct pooled_event {
  explicit pooled_event(std::shared_ptr<event_pool> p)
      : pool(std::move(p)), handle(pool->acquire()) {}
  pooled_event(const pooled_event&) = delete;
  pooled_event& operator=(const pooled_event&) = delete;
  ~pooled_event() { pool->release(handle); }
  std::shared_ptr<event_pool> pool;
  cudaEvent_t handle;
};

// Waits for the work enqueued so far on `s` (a stream of the pool's device): an event of the pool
// recorded there, waited for as every host wait is.
void wait_for_stream(const std::shared_ptr<event_pool>& events, cudaStream_t s) {
  const pooled_event mark(events);
  POOLSCOPE_CUDA_CHECK(cudaEventRecord(mark.handle, s));
  wait_for_event(mark.handle);
}

// An event recorded on a stream; returns its cudaEvent to the pool when the last handle goes.
class cuda_event final : public detail::event_state {
 public:
  cuda_event(std::shared_ptr<event_pool> pool, cudaEvent_t e, const void* owner, int queue_key,
             std::uint64_t sequence) noexcept
      : event_state(owner, queue_key, sequence), pool_(std::move(pool)), event_(e) {}
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() override { pool_->release(event_); }

  [[nodiscard]] bool ready() const override {
    if (done_.load(std::memory_order_acquire)) {
      return true;
    }
    if (!event_done(event_)) {
      return false;
    }
    done_.store(true, std::memory_order_release);
    return true;
  }
  void wait() const override {
    if (!done_.load(std::memory_order_acquire)) {
      wait_for_event(event_);
      done_.store(true, std::memory_order_release);
    }
  }
  [[nodiscard]] bool known_complete() const noexcept override {
    return done_.load(std::memory_order_acquire);
  }
  [[nodiscard]] cudaEvent_t handle() const noexcept { return event_; }

 private:
  std::shared_ptr<event_pool> pool_;
  cudaEvent_t event_;
  mutable std::atomic<bool> done_{false};  // known complete: no more queries
};

// Enqueues on `s` (of the current device) a wait until the 32-bit word at `word` (pinned host
// memory: unified addressing maps it at the same address on every device) is at least `value`:
// cuStreamWaitValue32, reached through the runtime's entry-point query (nothing links libcuda).
void stream_wait_value(cudaStream_t s, const std::uint32_t* word, std::uint32_t value) {
  static const auto wait_value =
      detail::seam::driver_function<decltype(&cuStreamWaitValue32)>("cuStreamWaitValue32", 12000);
  POOLSCOPE_CUDA_CHECK(
      wait_value(s, reinterpret_cast<CUdeviceptr>(word), value, CU_STREAM_WAIT_VALUE_GEQ));
}

// mpi_staging's copies on GPUs (between_ranks = mpi): cudaMemcpyAsync on each GPU's transfer
// stream (an upload behind a cuStreamWaitValue32 on its gate), then an event from the GPU's pool
// that the staging's worker waits for. Owned by the backend; thread-safe (streams and event pools
// are).
class staging_copies final : public detail::mpi_staging::device_copies {
 public:
  struct queue {
    int ordinal = 0;
    cudaStream_t stream = nullptr;  // the GPU's transfer stream
    std::shared_ptr<event_pool> events;
  };
  explicit staging_copies(std::vector<queue> queues) noexcept : queues_(std::move(queues)) {}

  [[nodiscard]] std::function<void()> enqueue_download(int device, void* to, const void* from,
                                                       std::size_t bytes) override {
    const queue& q = queues_.at(static_cast<std::size_t>(device));
    const device_guard guard(q.ordinal);
    POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, q.stream));
    return completion(q);
  }

  [[nodiscard]] std::function<void()> enqueue_gated_upload(int device, void* to, const void* from,
                                                           std::size_t bytes,
                                                           std::uint32_t* gate) override {
    const queue& q = queues_.at(static_cast<std::size_t>(device));
    const device_guard guard(q.ordinal);
    stream_wait_value(q.stream, gate, 1);
    POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, q.stream));
    return completion(q);
  }

 private:
  // A wait for the work enqueued so far on `q` (its device current), as every host wait: an
  // upload waits behind its gate for as long as the MPI receive takes, and the worker that
  // progresses that receive may share this thread's core.
  static std::function<void()> completion(const queue& q) {
    auto done = std::make_shared<pooled_event>(q.events);
    POOLSCOPE_CUDA_CHECK(cudaEventRecord(done->handle, q.stream));
    return [done] { wait_for_event(done->handle); };
  }
  std::vector<queue> queues_;
};

// Says once per process, at info level, when the CPUs this rank may run on do not suit `between`
// (rank_binding.hpp: one core, data between ranks by MPI). Not a warning: with every host wait
// polled, such a rank reshards about as fast as an unbound one on a GPU (docs/perf.md, "Across
// processes"); a rank with more host work of its own still gains from cores to spare.
void report_binding(const process_group& g, rank_transport between) {
  static std::once_flag warned;
  const std::string why = detail::binding_warning(detail::allowed_cpus(), between);
  if (!why.empty()) {
    std::call_once(warned,
                   [&] { poolscope::log(log_level::info, "darray " + g.describe() + ": " + why); });
  }
}

// The most GPUs of a group whose pairs across ranks are connected when a backend is made
// (cuda_backend::connect_ranks). A connection holds NCCL's buffers (NCCL_BUFFSIZE per channel and
// direction) on both of its GPUs, so all pairs of a large group would take much of their memory.
constexpr int connect_up_front_max = 64;

// Runs `call`, a host call into NCCL with other ranks, watched by `w` as `what`. A call that fails
// because the watchdog aborted the communicators (a peer silent or failed) throws the watchdog's
// failure, which names the cause, with NCCL's own error after it.
template <typename Call>
void watched_nccl_call(detail::nccl_watchdog& w, const std::string& what, Call&& call) {
  const detail::nccl_watchdog::host_call watched(w, what);
  try {
    call();
  } catch (const std::exception& e) {
    try {
      w.check();
    } catch (const communication_error& cause) {
      throw communication_error(std::string(cause.what()) + " (NCCL: " + e.what() + ")");
    }
    throw;
  }
}

// Everything the backend holds for one GPU. Owned by the backend; not movable (mutexes).
struct device_state {
  int ordinal = 0;
  std::string name;
  int sm_count = 1;
  std::array<cudaStream_t, 2> streams{};  // [compute, transfer]
  std::unique_ptr<pool::resource> resource;
  std::unique_ptr<pool::allocator> allocator;
  std::shared_ptr<event_pool> events;
  // Scratch of the all-axes reductions, one per queue (work of a queue runs in order).
  std::array<void*, 2> scratch{};
  std::array<std::mutex, 2> scratch_mutex;
  // cuBLAS handles, one per queue (created on the first gemm of that queue), so that two queues
  // never share a handle's workspace concurrently.
  std::array<cublasHandle_t, 2> blas{};
  std::array<std::mutex, 2> blas_mutex;
  // Scope sites of copies from this device: "darray.copy 0->1".
  std::vector<profiler::scope_site> copy_sites;
  // Launches this device's kernels as graphs (backend_options::kernel_graphs); null: plainly.
  std::unique_ptr<detail::graph_launcher> graphs;
};

// Dense copies between GPUs up to this size go through the copy kernel when the GPUs are peers
// and kernels are launched as graphs (copy_between); larger ones through the copy engines.
constexpr std::size_t small_peer_copy_bytes = std::size_t{64} << 10;

constexpr std::size_t index_of(queue_kind q) noexcept {
  return q == queue_kind::compute ? 0 : 1;
}

template <typename T>
T* element_ptr(const view& v, std::size_t element_bytes) noexcept {
  return reinterpret_cast<T*>(static_cast<std::byte*>(v.base) +
                              v.offset * static_cast<std::int64_t>(element_bytes));
}

bool is_dense_line(const view& v) noexcept {
  return v.rank == 1 && v.stride[0] == 1;
}

// Rows of contiguous elements at a pitch: what cudaMemcpy2D and 3D-peer copies move.
struct pitched {
  std::size_t width = 0;  // bytes per row
  std::size_t height = 0;
  std::size_t dst_pitch = 0;
  std::size_t src_pitch = 0;
};

// Views collapsed jointly (kernels.hpp): a rank-2 pair with unit inner strides whose rows do not
// overlap.
std::optional<pitched> as_pitched(const std::array<view, 2>& v, std::size_t es) noexcept {
  if (v[0].rank != 2 || v[0].stride[1] != 1 || v[1].stride[1] != 1) {
    return std::nullopt;
  }
  pitched p;
  p.width = static_cast<std::size_t>(v[0].extent[1]) * es;
  p.height = static_cast<std::size_t>(v[0].extent[0]);
  p.dst_pitch = static_cast<std::size_t>(v[0].stride[0]) * es;
  p.src_pitch = static_cast<std::size_t>(v[1].stride[0]) * es;
  if (p.dst_pitch < p.width || p.src_pitch < p.width) {
    return std::nullopt;
  }
  return p;
}

// Copies between the host view `h` and the dense bytes `dense` (pack: h -> dense; else back).
void host_strided_copy(const view& h, std::size_t es, std::byte* dense, bool pack) noexcept {
  std::array<std::int64_t, max_rank> ext{1, 1, 1, 1};
  std::array<std::int64_t, max_rank> str{0, 0, 0, 0};
  const std::size_t shift = max_rank - h.rank;
  for (std::size_t d = 0; d < h.rank; ++d) {
    ext[shift + d] = h.extent[d];
    str[shift + d] = h.stride[d];
  }
  auto* base = element_ptr<std::byte>(h, es);
  std::size_t out = 0;
  for (std::int64_t i0 = 0; i0 < ext[0]; ++i0) {
    for (std::int64_t i1 = 0; i1 < ext[1]; ++i1) {
      for (std::int64_t i2 = 0; i2 < ext[2]; ++i2) {
        for (std::int64_t i3 = 0; i3 < ext[3]; ++i3) {
          std::byte* p = base + (i0 * str[0] + i1 * str[1] + i2 * str[2] + i3 * str[3]) *
                                    static_cast<std::int64_t>(es);
          if (pack) {
            std::memcpy(dense + out, p, es);
          } else {
            std::memcpy(p, dense + out, es);
          }
          out += es;
        }
      }
    }
  }
}

using detail::accumulate_site;
using detail::reduce_site;
using detail::site_of;

// The CUDA implementation of backend. Ownership: owns its streams, allocators (and their
// resources), cuBLAS handles, NCCL communicators and scratch; events share an event_pool with it.
// Thread safety: enqueue methods may be called from several threads (cuBLAS handles, NCCL and
// scratch are guarded by mutexes; streams and events are thread-safe). Stream semantics: see
// backend.hpp; every enqueue returns at once except upload, download and synchronize.
class cuda_backend final : public backend {
 public:
  /// GPUs first_ordinal .. first_ordinal + devices - 1 (CUDA's ordinals), as this process's
  /// devices of options.group; `ranks`: what every rank of a group of several made by MPI said of
  /// its GPUs (empty otherwise).
  cuda_backend(int devices, int first_ordinal, const backend_options& options,
               const std::vector<detail::rank_gpus>& ranks = {});
  ~cuda_backend() override;

 private:
  // --- backend ---
  [[nodiscard]] std::string do_name() const override {
    return "cuda:" + std::to_string(devices_.size());
  }
  [[nodiscard]] int do_device_count() const noexcept override {
    return static_cast<int>(devices_.size());
  }
  [[nodiscard]] bool do_is_gpu() const noexcept override { return true; }
  [[nodiscard]] std::string do_device_name(int device) const override { return dev(device).name; }
  [[nodiscard]] pool::allocator& do_allocator(int device) override {
    return *dev(device).allocator;
  }
  [[nodiscard]] stream_view do_alloc_stream(int device) const noexcept override {
    return stream_view{dev(device).streams[0]};
  }
  [[nodiscard]] event do_record(int device, queue_kind q, std::uint64_t sequence) override;
  void do_wait(int device, queue_kind q, const event& e) override;
  void do_synchronize() override;
  void do_copy(int queue_device, queue_kind q, dtype t, const view& dst, int dst_device,
               const view& src, int src_device, transport how) override;
  void do_copy_group(dtype t, const std::vector<transfer>& list,
                     const std::vector<rank_transfer>& between, transport how) override;
  void do_send(int device, dtype t, const view& src, int peer_device, int peer_rank,
               int tag) override;
  void do_receive(int device, dtype t, const view& dst, int peer_device, int peer_rank,
                  int tag) override;
  /// do_send / do_receive: one ncclSend or ncclRecv on the transfer stream, watched.
  void nccl_with_rank(int device, dtype t, const view& v, int peer_device, int rank, bool sending);
  /// do_send / do_receive with between_ranks = mpi: through pinned host memory (staging_).
  void mpi_with_rank(int device, dtype t, const view& v, int peer_device, int rank, int tag,
                     bool sending);
  /// do_send / do_receive between GPUs that ipc_ links: by the copy engines, watched.
  void ipc_with_rank(int device, dtype t, const view& v, int peer_device, int rank, int tag,
                     bool sending);
  /// Whether a transfer of this process's device `local` with `peer_device` goes through ipc_.
  [[nodiscard]] bool by_ipc(int local, int peer_device) const noexcept {
    return ipc_ && ipc_->linked(global_device(local), peer_device);
  }
  /// Enqueues `call` (transfers with other ranks); with a timeline attached, each of `ends`
  /// (device, this rank's end) becomes a slice timed on the GPU around the call's work on its
  /// device's transfer stream (gpu_spans.hpp: what `trace merge` joins into a flow per piece).
  template <typename Call>
  void traced_rank_call(const std::vector<std::pair<int, detail::transfer_ends>>& ends,
                        Call&& call);
  /// The NCCL rank of this process's device `local` in comms_: its global number when the
  /// communicators span the ranks, else its local index (ncclCommInitAll within the process).
  [[nodiscard]] int nccl_rank(int local) const noexcept {
    return comms_span_ranks_ ? global_device(local) : local;
  }
  [[nodiscard]] bool do_groups_automatically(const reshard_plan& plan) const override;
  void do_upload(int device, dtype t, const view& dst, const view& host_src) override;
  void do_download(int device, dtype t, const view& host_dst, const view& src) override;
  void do_fill(int device, queue_kind q, dtype t, const view& dst, scalar value,
               bool yielding) override;
  void do_unary(int device, queue_kind q, dtype t, unary_op op, const view& dst, const view& src,
                bool yielding) override;
  void do_binary(int device, queue_kind q, dtype t, binary_op op, const view& dst, const view& a,
                 const view& b, const scalar* a_scalar, const scalar* b_scalar,
                 bool yielding) override;
  void do_binary_parts(int device, queue_kind q, dtype t, binary_op op,
                       const std::vector<binary_part>& parts, bool yielding) override;
  void do_accumulate(int device, queue_kind q, dtype t, reduce_op op, const view& acc,
                     const view& src) override;
  void do_reduce(int device, queue_kind q, dtype t, reduce_op op, const view& acc, const view& src,
                 int axis) override;
  void do_gemm_accumulate(int device, queue_kind q, dtype t, const view& c, const view& a,
                          const view& b) override;

  // --- helpers ---
  [[nodiscard]] device_state& dev(int device) noexcept {
    return *devices_[static_cast<std::size_t>(device)];
  }
  [[nodiscard]] const device_state& dev(int device) const noexcept {
    return *devices_[static_cast<std::size_t>(device)];
  }
  [[nodiscard]] cudaStream_t stream(int device, queue_kind q) const noexcept {
    return dev(device).streams[index_of(q)];
  }
  [[nodiscard]] detail::launch_target target(int device, queue_kind q) const noexcept {
    return detail::launch_target{stream(device, q), dev(device).sm_count, dev(device).graphs.get()};
  }
  // target() for an element-wise task: fewer blocks when it yields to a copy out of its device;
  // `current` (deferred) makes the device current only for a call that needs it, so a kernel
  // graph launched as it is, the common case, switches no device (a switch there and back per
  // GPU is a quarter of a chained op's bookkeeping: docs/perf.md, "No device switch for a kept
  // graph").
  [[nodiscard]] detail::launch_target map_target(int device, queue_kind q, bool yielding,
                                                 device_guard& current) const noexcept {
    detail::launch_target on = target(device, q);
    if (yielding) {
      on.blocks_per_sm = detail::yielding_blocks_per_sm;
    }
    on.current = &current;
    return on;
  }
  [[nodiscard]] bool peer(int from, int to) const noexcept {
    return peer_[static_cast<std::size_t>(from) * devices_.size() + static_cast<std::size_t>(to)] !=
           0;
  }
  // Work enqueued later on `waiter` starts after the work enqueued so far on `s` (of `device`).
  void order_after(cudaStream_t waiter, cudaStream_t s, int device);
  void copy_within(const detail::launch_target& on, std::size_t es, const std::array<view, 2>& v);
  // `current` (deferred) is engaged for every way but a small copy's kept kernel graph.
  void copy_between(int queue_device, cudaStream_t s, std::size_t es, const std::array<view, 2>& v,
                    int dst_device, int src_device, device_guard& current);
  void copy_nccl(int queue_device, cudaStream_t s, std::size_t es, const transfer& x);
  /// ncclSend / ncclRecv of every transfer (contiguous views) in one group, each side on its
  /// device's transfer stream, with this rank's sides of `between`. The caller holds nccl_mutex_
  /// and called ensure_comms().
  void nccl_group(std::size_t es, const std::vector<transfer>& list,
                  const std::vector<rank_transfer>& between = {});
  /// The communicators of a group of several ranks (ncclCommInitRank over every rank's GPUs,
  /// the unique id broadcast from rank 0), or the one adopted from the application.
  void join_rank_comms();
  /// With between_ranks = automatic over a group made by MPI: links the pairs of GPUs CUDA IPC
  /// can join (ipc_), and, when pairs are left, joins the communicators for them (refusing, as
  /// with NCCL, two ranks on one GPU among those). Collective.
  void join_ranks_automatically(const backend_options& options,
                                const std::vector<detail::rank_gpus>& ranks);
  /// NCCL connects two GPUs at their first transfer, in the host call, waiting for the peer: a
  /// peer silent then would hold that call, and the mutex of NCCL calls, where no abort is safe
  /// (nccl_watchdog.hpp). Every rank makes its backend together, so each GPU here exchanges a
  /// byte with every GPU of the other ranks now, and later calls find their connections made.
  /// Bounded by the group's timeout (then communication_error, the communicators aborted).
  /// Groups of more than connect_up_front_max GPUs are left to connect as they transfer: every
  /// connection holds NCCL buffers on both GPUs, which all pairs of a large group would not fit.
  void connect_ranks();
  // Between the GPUs of CUDA ordinals dst_ordinal and src_ordinal.
  void copy_3d_peer(cudaStream_t s, void* dst, int dst_ordinal, const void* src, int src_ordinal,
                    const pitched& p);
  void ensure_comms();
  cublasHandle_t blas_handle(int device, queue_kind q);
  void release_all() noexcept;

  std::vector<std::unique_ptr<device_state>> devices_;
  std::vector<char> peer_;  // peer_[from * n + to]: `from` can access `to`'s memory
  transport default_transport_ = transport::automatic;
  std::mutex nccl_mutex_;  // held by every host call into NCCL (nccl_watchdog.hpp)
  std::vector<ncclComm_t> comms_;
  detail::gpu_spans nccl_spans_;   // the NCCL transfers with other ranks, while traced
  bool comms_adopted_ = false;     // comms_ is the application's: never finalized or destroyed here
  bool comms_span_ranks_ = false;  // comms_ number every rank's GPUs (join_rank_comms)
  // With several ranks and NCCL between them: watches the NCCL work with other ranks (and may
  // abort comms_).
  std::unique_ptr<detail::nccl_watchdog> watchdog_;
  // With several ranks and between_ranks = mpi: moves pieces between ranks through the copies
  // (else both null).
  std::unique_ptr<staging_copies> staging_copies_;
  std::unique_ptr<detail::mpi_staging> staging_;
  // With several ranks and between_ranks = automatic: the pairs of GPUs moved by copy engines
  // through CUDA IPC (or null).
  std::unique_ptr<detail::ipc_links> ipc_;
  /// Throws the watchdog's failure, if any: before NCCL is called on communicators it aborted,
  /// and after synchronizing (work with a failed rank may have ended without its data).
  void check_ranks() const {
    if (watchdog_) {
      watchdog_->check();
    }
    if (staging_) {
      staging_->check();
    }
  }
};

cuda_backend::cuda_backend(int devices, int first_ordinal, const backend_options& options,
                           const std::vector<detail::rank_gpus>& ranks)
    : default_transport_(options.transfers) {
  try {
    const auto n = static_cast<std::size_t>(devices);
    for (std::size_t i = 0; i < n; ++i) {
      auto state = std::make_unique<device_state>();
      state->ordinal = first_ordinal + static_cast<int>(i);
      const device_guard guard(state->ordinal);
      cudaDeviceProp prop{};
      POOLSCOPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, state->ordinal));
      state->name = prop.name;
      state->sm_count = std::max(prop.multiProcessorCount, 1);
      // Registered before creating anything, so release_all frees what was made on a failure.
      devices_.push_back(std::move(state));
      device_state& d = *devices_.back();
      for (auto& s : d.streams) {
        POOLSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      }
      for (auto& p : d.scratch) {
        POOLSCOPE_CUDA_CHECK(cudaMalloc(&p, detail::reduce_scratch_bytes(d.sm_count)));
      }
      d.events = std::make_shared<event_pool>(d.ordinal);
      if (options.kernel_graphs) {
        d.graphs = std::make_unique<detail::graph_launcher>(64, kernel_graphs_counter(),
                                                            kernel_graph_updates_counter());
      }
      d.resource =
          pool::make_resource(options.resource.empty() ? "cuda" : options.resource, d.ordinal);
      d.allocator = pool::make_allocator(options.allocator, *d.resource);
      for (std::size_t j = 0; j < n; ++j) {
        d.copy_sites.push_back(profiler::scope_site::named(
            "darray.copy " + std::to_string(i) + "->" + std::to_string(j),
            category::darray_transfer));
      }
    }
    peer_.assign(n * n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        if (i == j) {
          continue;
        }
        int can = 0;
        POOLSCOPE_CUDA_CHECK(
            cudaDeviceCanAccessPeer(&can, devices_[i]->ordinal, devices_[j]->ordinal));
        if (can == 0) {
          continue;
        }
        const device_guard guard(devices_[i]->ordinal);
        const cudaError_t s = cudaDeviceEnablePeerAccess(devices_[j]->ordinal, 0);
        if (s != cudaSuccess) {
          (void)cudaGetLastError();
        }
        if (s == cudaSuccess || s == cudaErrorPeerAccessAlreadyEnabled) {
          peer_[i * n + j] = 1;
        } else {
          // Copies between the pair still work (staged by the runtime), only slower.
          poolscope::log(log_level::warn, "darray cuda backend: peer access " + std::to_string(i) +
                                              "->" + std::to_string(j) +
                                              " not enabled: " + cudaGetErrorName(s));
        }
      }
    }
    // Launched plainly, a kernel costs the host several µs per GPU: issuing each GPU's share of
    // an op from a thread of its own overlaps those calls. Through a graph a launch costs a third
    // of that, and a second thread in the driver slows the first's calls, so the helpers make
    // small ops slower (docs/perf.md, "Issuing threads"): with graphs the default is none.
    start_issuers(options, options.kernel_graphs ? 0 : devices - 1);
    set_yield_to_copies(options.yield_to_copies);
    join_group(options.group);
    if (group()->size() > 1) {
      report_binding(*group(), options.between_ranks);
    }
    if (group()->size() > 1 && options.between_ranks == rank_transport::mpi) {
      std::vector<staging_copies::queue> queues;
      for (const auto& d : devices_) {
        queues.push_back({d->ordinal, d->streams[1], d->events});
      }
      staging_copies_ = std::make_unique<staging_copies>(std::move(queues));
      staging_ = std::make_unique<detail::mpi_staging>(
          group(), devices, *staging_copies_, pool::make_resource("pinned"),
          [this] { return attached_timeline(); }, options.staging_chunk_bytes);
    } else if (group()->size() > 1) {
      // Collective: every rank makes its communicators now, not at its first transfer (which
      // other ranks reach at other times, or never).
      if (options.between_ranks == rank_transport::automatic && group()->uses_mpi()) {
        join_ranks_automatically(options, ranks);
      } else {
        join_rank_comms();
      }
      watchdog_ = std::make_unique<detail::nccl_watchdog>(comms_, !comms_adopted_, group(),
                                                          nccl_mutex_, [this]() noexcept {
                                                            if (ipc_) {
                                                              ipc_->open_gates();
                                                            }
                                                          });
    }
  } catch (...) {
    release_all();
    throw;
  }
}

cuda_backend::~cuda_backend() {
  for (auto& d : devices_) {
    for (cudaStream_t s : d->streams) {
      if (s != nullptr) {
        log_failure("wait for a stream", [&d, s] { wait_for_stream(d->events, s); });
      }
    }
  }
  // Deferred buffers go back to the allocators while those (and the streams) still exist.
  collect_deferred(true);
  release_all();
}

void cuda_backend::release_all() noexcept {
  // The communicators first, finalized together (one thread drives every device: one group)
  // before each is destroyed, as NCCL asks: a communicator destroyed unfinalized may leave its
  // proxy threads behind, and the process then hung at exit in about one run in ten.
  // The watchdog first (it polls the communicators); communicators it aborted are freed.
  // The MPI sends in flight finish while the streams their copies ran on still exist.
  staging_.reset();
  staging_copies_.reset();
  const bool aborted = watchdog_ && watchdog_->aborted();
  watchdog_.reset();
  ipc_.reset();  // after the watchdog, which may open its gates
  if (comms_adopted_ || aborted) {
    comms_.clear();
  }
  if (!comms_.empty()) {
    log_failure("ncclCommFinalize", [this] {
      POOLSCOPE_CUDA_CHECK(ncclGroupStart());
      for (ncclComm_t c : comms_) {
        if (c == nullptr) {
          continue;
        }
        const ncclResult_t r = ncclCommFinalize(c);
        if (r != ncclSuccess) {
          (void)ncclGroupEnd();
          POOLSCOPE_CUDA_CHECK(r);
        }
      }
      POOLSCOPE_CUDA_CHECK(ncclGroupEnd());
    });
    for (ncclComm_t c : comms_) {
      if (c != nullptr) {
        log_failure("ncclCommDestroy", [c] { POOLSCOPE_CUDA_CHECK(ncclCommDestroy(c)); });
      }
    }
    comms_.clear();
  }
  for (auto& d : devices_) {
    d->allocator.reset();
    d->resource.reset();
  }
  for (auto& d : devices_) {
    for (cublasHandle_t h : d->blas) {
      if (h != nullptr) {
        log_failure("cublasDestroy", [h] { POOLSCOPE_CUDA_CHECK(cublasDestroy(h)); });
      }
    }
    for (void* p : d->scratch) {
      if (p != nullptr) {
        log_failure("cudaFree", [p] { POOLSCOPE_CUDA_CHECK(cudaFree(p)); });
      }
    }
    d->graphs.reset();  // executables still running are freed by CUDA when they complete
    d->events.reset();  // events still handed out keep their pool until they go
    for (cudaStream_t s : d->streams) {
      if (s != nullptr) {
        log_failure("cudaStreamDestroy", [s] { POOLSCOPE_CUDA_CHECK(cudaStreamDestroy(s)); });
      }
    }
  }
  devices_.clear();
}

event cuda_backend::do_record(int device, queue_kind q, std::uint64_t sequence) {
  device_state& d = dev(device);
  cudaEvent_t e = d.events->acquire();
  const cudaError_t s = cudaEventRecord(e, d.streams[index_of(q)]);
  if (s != cudaSuccess) {
    d.events->release(e);
    detail::seam::raise(s, "cudaEventRecord(e, stream)", __FILE__, __LINE__);
  }
  return event(
      std::make_shared<const cuda_event>(d.events, e, this, queue_key(device, q), sequence));
}

void cuda_backend::do_wait(int device, queue_kind q, const event& e) {
  const auto* ce = dynamic_cast<const cuda_event*>(e.state());
  if (ce == nullptr) {
    e.wait();  // not one of ours: the host waits instead
    return;
  }
  POOLSCOPE_CUDA_CHECK(cudaStreamWaitEvent(stream(device, q), ce->handle(), 0));
}

void cuda_backend::do_synchronize() {
  if (staging_) {
    // The transfers by MPI first (idle means they are done too, as on host devices): until a
    // receive opens its gate the transfer stream waits, and this thread then sleeps on the
    // workers rather than polls. Their jobs wait only for device work and peers, never for this
    // thread.
    staging_->drain();
  }
  for (auto& d : devices_) {
    for (cudaStream_t s : d->streams) {
      wait_for_stream(d->events, s);
    }
  }
  nccl_spans_.flush(attached_timeline(), true);  // every traced NCCL transfer has run
  check_ranks();
}

void cuda_backend::order_after(cudaStream_t waiter, cudaStream_t s, int device) {
  if (waiter == s) {
    return;
  }
  event_pool& pool = *dev(device).events;
  cudaEvent_t e = pool.acquire();
  try {
    POOLSCOPE_CUDA_CHECK(cudaEventRecord(e, s));
    POOLSCOPE_CUDA_CHECK(cudaStreamWaitEvent(waiter, e, 0));
  } catch (...) {
    pool.release(e);
    throw;
  }
  pool.release(e);
}

// --- copies ---

void cuda_backend::do_copy(int queue_device, queue_kind q, dtype t, const view& dst, int dst_device,
                           const view& src, int src_device, transport how) {
  const std::size_t es = size_of(t);
  const auto bytes = static_cast<std::uint64_t>(dst.size()) * es;
  const cudaStream_t s = stream(queue_device, q);
  // Deferred: a small copy between peers launched as a kept graph needs no device switch.
  device_guard guard(dev(queue_device).ordinal, std::defer_lock);
  const profiler::scope scope{dev(src_device).copy_sites[static_cast<std::size_t>(dst_device)],
                              stream_view{s}};
  std::array<view, 2> v{dst, src};
  detail::collapse_jointly(v.data(), v.size());
  if (dst_device == src_device) {
    guard.engage();
    copy_within(target(queue_device, q), es, v);
    count_copy(false, bytes, false);
    return;
  }
  const transport chosen = how == transport::automatic ? default_transport_ : how;
  const bool line = is_dense_line(v[0]) && is_dense_line(v[1]);
  const bool nccl = line && (chosen == transport::nccl ||
                             (chosen == transport::automatic && automatic_uses_nccl));
  if (nccl) {
    guard.engage();
    copy_nccl(queue_device, s, es, transfer{v[0], dst_device, v[1], src_device});
  } else {
    copy_between(queue_device, s, es, v, dst_device, src_device, guard);
  }
  count_copy(true, bytes, nccl);
}

void cuda_backend::copy_within(const detail::launch_target& on, std::size_t es,
                               const std::array<view, 2>& v) {
  if (is_dense_line(v[0]) && is_dense_line(v[1])) {
    POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(
        element_ptr<void>(v[0], es), element_ptr<const void>(v[1], es),
        static_cast<std::size_t>(v[0].extent[0]) * es, cudaMemcpyDeviceToDevice, on.stream));
    return;
  }
  if (const auto p = as_pitched(v, es)) {
    POOLSCOPE_CUDA_CHECK(cudaMemcpy2DAsync(
        element_ptr<void>(v[0], es), p->dst_pitch, element_ptr<const void>(v[1], es), p->src_pitch,
        p->width, p->height, cudaMemcpyDeviceToDevice, on.stream));
    return;
  }
  detail::launch_copy(on, es, v[0], v[1]);
}

void cuda_backend::copy_3d_peer(cudaStream_t s, void* dst, int dst_ordinal, const void* src,
                                int src_ordinal, const pitched& p) {
  cudaMemcpy3DPeerParms parms{};
  parms.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), p.src_pitch, p.width, p.height);
  parms.srcDevice = src_ordinal;
  parms.dstPtr = make_cudaPitchedPtr(dst, p.dst_pitch, p.width, p.height);
  parms.dstDevice = dst_ordinal;
  parms.extent = make_cudaExtent(p.width, p.height, 1);
  POOLSCOPE_CUDA_CHECK(cudaMemcpy3DPeerAsync(&parms, s));
}

void cuda_backend::copy_between(int queue_device, cudaStream_t s, std::size_t es,
                                const std::array<view, 2>& v, int dst_device, int src_device,
                                device_guard& current) {
  void* dst = element_ptr<void>(v[0], es);
  const void* src = element_ptr<const void>(v[1], es);
  const int other = queue_device == dst_device ? src_device : dst_device;
  if (is_dense_line(v[0]) && is_dense_line(v[1])) {
    const auto bytes = static_cast<std::size_t>(v[0].extent[0]) * es;
    detail::launch_target on{s, dev(queue_device).sm_count, dev(queue_device).graphs.get()};
    if (bytes <= small_peer_copy_bytes && on.graphs != nullptr && peer(queue_device, other)) {
      // A few KiB: the copy kernel reading (or writing) the other GPU's memory, launched as a
      // graph, costs the host a third of a cudaMemcpyPeerAsync (docs/perf.md, "Kernels launched
      // as graphs").
      on.current = &current;
      detail::launch_copy(on, es, v[0], v[1]);
      return;
    }
    current.engage();
    POOLSCOPE_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst, dev(dst_device).ordinal, src, dev(src_device).ordinal, bytes, s));
    return;
  }
  current.engage();  // every other way below runs with the queue's device current
  if (const auto p = as_pitched(v, es)) {
    if (peer(dst_device, src_device) || peer(src_device, dst_device)) {
      // Unified addressing: the copy engines move the rows between the GPUs directly.
      POOLSCOPE_CUDA_CHECK(cudaMemcpy2DAsync(dst, p->dst_pitch, src, p->src_pitch, p->width,
                                             p->height, cudaMemcpyDefault, s));
    } else {
      copy_3d_peer(s, dst, dev(dst_device).ordinal, src, dev(src_device).ordinal, *p);
    }
    return;
  }
  if (peer(queue_device, other)) {
    // The copy kernel on the queue's device reads (or writes) the other GPU's memory.
    detail::launch_copy(
        detail::launch_target{s, dev(queue_device).sm_count, dev(queue_device).graphs.get()}, es,
        v[0], v[1]);
    return;
  }
  // No peer access: 2-D peer copies (the runtime stages them), one per index of the axes a piece
  // does not cover. With unit inner strides a piece is rows of the last axis at the pitch of the
  // second-to-last; otherwise a column of single elements along the last axis; with a zero
  // inner stride a single element.
  const std::size_t rank = v[0].rank;
  const std::size_t last = rank - 1;
  pitched p{es, 1, es, es};
  std::size_t covered = 0;
  if (v[0].stride[last] == 1 && v[1].stride[last] == 1) {
    p.width = static_cast<std::size_t>(v[0].extent[last]) * es;
    p.dst_pitch = p.width;
    p.src_pitch = p.width;
    covered = 1;
    if (rank >= 2) {
      const auto dst_pitch = static_cast<std::size_t>(v[0].stride[last - 1]) * es;
      const auto src_pitch = static_cast<std::size_t>(v[1].stride[last - 1]) * es;
      if (dst_pitch >= p.width && src_pitch >= p.width) {
        p.height = static_cast<std::size_t>(v[0].extent[last - 1]);
        p.dst_pitch = dst_pitch;
        p.src_pitch = src_pitch;
        covered = 2;
      }
    }
  } else if (v[0].stride[last] > 0 && v[1].stride[last] > 0) {
    p.height = static_cast<std::size_t>(v[0].extent[last]);
    p.dst_pitch = static_cast<std::size_t>(v[0].stride[last]) * es;
    p.src_pitch = static_cast<std::size_t>(v[1].stride[last]) * es;
    covered = 1;
  }
  const std::size_t outer = rank - covered;
  std::array<std::int64_t, max_rank> idx{};
  for (;;) {
    std::int64_t dst_off = 0;
    std::int64_t src_off = 0;
    for (std::size_t d = 0; d < outer; ++d) {
      dst_off += idx[d] * v[0].stride[d];
      src_off += idx[d] * v[1].stride[d];
    }
    copy_3d_peer(s, static_cast<std::byte*>(dst) + dst_off * static_cast<std::int64_t>(es),
                 dev(dst_device).ordinal,
                 static_cast<const std::byte*>(src) + src_off * static_cast<std::int64_t>(es),
                 dev(src_device).ordinal, p);
    std::size_t d = outer;
    for (; d > 0; --d) {
      if (++idx[d - 1] < v[0].extent[d - 1]) {
        break;
      }
      idx[d - 1] = 0;
    }
    if (d == 0) {
      return;
    }
  }
}

void cuda_backend::ensure_comms() {
  if (!comms_.empty()) {
    return;
  }
  const int n = static_cast<int>(devices_.size());
  std::vector<int> ordinals(devices_.size());
  for (int i = 0; i < n; ++i) {
    ordinals[static_cast<std::size_t>(i)] = dev(i).ordinal;
  }
  std::vector<ncclComm_t> comms(devices_.size(), nullptr);
  // ncclCommInitAll may leave another device current: restore ours.
  int current = 0;
  POOLSCOPE_CUDA_CHECK(cudaGetDevice(&current));
  const ncclResult_t r = ncclCommInitAll(comms.data(), n, ordinals.data());
  POOLSCOPE_CUDA_CHECK(cudaSetDevice(current));
  POOLSCOPE_CUDA_CHECK(r);
  comms_ = std::move(comms);
}

void cuda_backend::copy_nccl(int queue_device, cudaStream_t s, std::size_t es, const transfer& x) {
  const std::lock_guard lock(nccl_mutex_);
  check_ranks();  // never on communicators the watchdog aborted
  ensure_comms();
  const cudaStream_t send_stream = stream(x.src_device, queue_kind::transfer);
  const cudaStream_t recv_stream = stream(x.dst_device, queue_kind::transfer);
  // Both sides start after the work enqueued so far on the queue (its waits included) ...
  order_after(send_stream, s, queue_device);
  order_after(recv_stream, s, queue_device);
  nccl_group(es, {x});
  // ... and the queue's later work (and its recorded events) after both sides complete.
  order_after(s, send_stream, x.src_device);
  order_after(s, recv_stream, x.dst_device);
}

void cuda_backend::join_ranks_automatically(const backend_options& options,
                                            const std::vector<detail::rank_gpus>& ranks) {
  std::vector<std::string> uuids;
  std::vector<int> rank_of;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    for (const std::string& u : ranks[r].uuids) {
      uuids.push_back(u);
      rank_of.push_back(static_cast<int>(r));
    }
  }
  if (static_cast<int>(uuids.size()) != device_count()) {
    throw logic_error("darray cuda backend: the ranks named " + std::to_string(uuids.size()) +
                      " GPUs for a group of " + std::to_string(device_count()));
  }
  std::vector<int> ordinals;
  for (const auto& d : devices_) {
    ordinals.push_back(d->ordinal);
  }
  // Only cudaMalloc's memory can be exported by cudaIpcGetMemHandle.
  const bool exportable = options.resource.empty() || options.resource == "cuda";
  ipc_ = std::make_unique<detail::ipc_links>(group(), std::move(ordinals), global_device(0), uuids,
                                             rank_of, exportable);
  if (!ipc_->needs_nccl()) {
    return;
  }
  // The communicators span every rank's GPUs, which NCCL refuses on a GPU of two ranks.
  std::vector<detail::rank_gpus> by_nccl = ranks;
  for (detail::rank_gpus& g : by_nccl) {
    g.between = rank_transport::nccl;
  }
  if (const std::string error = detail::rank_gpus_error(by_nccl); !error.empty()) {
    throw invalid_argument(error + "; CUDA IPC could not join every pair of GPUs of different " +
                           "ranks here (it needs the cuda resource, one GPU per rank, and each "
                           "rank seeing the other's GPU)");
  }
  join_rank_comms();
}

void cuda_backend::join_rank_comms() {
  if (void* adopted = group()->nccl_communicator(); adopted != nullptr) {
    // process_group::adopt_nccl: one GPU per rank, the communicator's rank is the group's.
    comms_.assign(1, static_cast<ncclComm_t>(adopted));
    comms_adopted_ = true;
    comms_span_ranks_ = true;
    return;
  }
  ncclUniqueId id{};
  if (group()->rank() == 0) {
    POOLSCOPE_CUDA_CHECK(ncclGetUniqueId(&id));
  }
  group()->broadcast(&id, sizeof id, 0);
  std::vector<ncclComm_t> comms(devices_.size(), nullptr);
  int current = 0;
  POOLSCOPE_CUDA_CHECK(cudaGetDevice(&current));
  // One thread initializes every GPU of this rank: one group, as NCCL asks.
  POOLSCOPE_CUDA_CHECK(ncclGroupStart());
  ncclResult_t r = ncclSuccess;
  for (std::size_t i = 0; i < devices_.size() && r == ncclSuccess; ++i) {
    const cudaError_t set = cudaSetDevice(devices_[i]->ordinal);
    if (set != cudaSuccess) {
      (void)ncclGroupEnd();
      detail::seam::raise(set, "cudaSetDevice(ordinal)", __FILE__, __LINE__);
    }
    r = ncclCommInitRank(&comms[i], device_count(), id, global_device(static_cast<int>(i)));
  }
  const ncclResult_t ended = ncclGroupEnd();
  POOLSCOPE_CUDA_CHECK(cudaSetDevice(current));
  POOLSCOPE_CUDA_CHECK(r);
  POOLSCOPE_CUDA_CHECK(ended);
  comms_ = std::move(comms);
  comms_span_ranks_ = true;
  connect_ranks();
}

void cuda_backend::nccl_group(std::size_t es, const std::vector<transfer>& list,
                              const std::vector<rank_transfer>& between) {
  POOLSCOPE_CUDA_CHECK(ncclGroupStart());
  try {
    // NCCL peers are ranks of the communicator: the devices' numbers over every rank.
    for (const transfer& x : list) {
      const auto bytes = static_cast<std::size_t>(x.dst.size()) * es;
      POOLSCOPE_CUDA_CHECK(ncclSend(element_ptr<const void>(x.src, es), bytes, ncclUint8,
                                    nccl_rank(x.dst_device),
                                    comms_[static_cast<std::size_t>(x.src_device)],
                                    stream(x.src_device, queue_kind::transfer)));
      POOLSCOPE_CUDA_CHECK(ncclRecv(element_ptr<void>(x.dst, es), bytes, ncclUint8,
                                    nccl_rank(x.src_device),
                                    comms_[static_cast<std::size_t>(x.dst_device)],
                                    stream(x.dst_device, queue_kind::transfer)));
    }
    for (const rank_transfer& x : between) {
      const auto bytes = static_cast<std::size_t>(x.data.size()) * es;
      const ncclComm_t comm = comms_[static_cast<std::size_t>(x.device)];
      const cudaStream_t s = stream(x.device, queue_kind::transfer);
      if (x.sending) {
        POOLSCOPE_CUDA_CHECK(ncclSend(element_ptr<const void>(x.data, es), bytes, ncclUint8,
                                      x.peer_device, comm, s));
      } else {
        POOLSCOPE_CUDA_CHECK(
            ncclRecv(element_ptr<void>(x.data, es), bytes, ncclUint8, x.peer_device, comm, s));
      }
    }
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  POOLSCOPE_CUDA_CHECK(ncclGroupEnd());
}

void cuda_backend::do_copy_group(dtype t, const std::vector<transfer>& list,
                                 const std::vector<rank_transfer>& between, transport how) {
  if (staging_ && !between.empty()) {
    // Between ranks by MPI, after the group within the process (its own way, NCCL or not).
    if (!list.empty()) {
      do_copy_group(t, list, {}, how);
    }
    exchange_one_by_one(t, between);
    return;
  }
  if (ipc_ && !between.empty()) {
    // Pairs CUDA IPC links one by one (the copy engines), before the group for the others: every
    // rank issues both in the same order.
    std::vector<rank_transfer> by_nccl;
    std::vector<rank_transfer> linked;
    for (const rank_transfer& x : between) {
      (by_ipc(x.device, x.peer_device) ? linked : by_nccl).push_back(x);
    }
    if (!linked.empty()) {
      exchange_one_by_one(t, linked);
      if (list.empty() && by_nccl.empty()) {
        return;
      }
      do_copy_group(t, list, by_nccl, how);
      return;
    }
  }
  const bool nccl = how == transport::nccl ||
                    (how == transport::automatic && default_transport_ != transport::peer);
  const bool contiguous = std::all_of(list.begin(), list.end(), [](const transfer& x) {
    return x.dst.contiguous() && x.src.contiguous();
  });
  // Within the process: in the NCCL group, or by the copy engines one by one before it.
  const bool within_by_nccl = nccl && contiguous;
  if (!within_by_nccl) {
    copy_one_by_one(t, list, transport::peer);
    if (between.empty()) {
      return;
    }
  }
  const std::vector<transfer> none;
  const std::vector<transfer>& within = within_by_nccl ? list : none;
  // With the other ranks: always one NCCL group (their views are contiguous).
  static const profiler::scope_site site{"darray.nccl_group", category::darray_transfer};
  const profiler::scope scope{site};
  const std::size_t es = size_of(t);
  const std::lock_guard lock(nccl_mutex_);
  check_ranks();
  ensure_comms();
  if (between.empty()) {
    nccl_group(es, within, between);
  } else {
    std::vector<std::pair<int, detail::transfer_ends>> ends;
    for (const rank_transfer& x : between) {
      ends.emplace_back(
          x.device, detail::rank_transfer_ends(x.sending, global_device(x.device), x.peer_device,
                                               static_cast<std::size_t>(x.data.size()) * es));
    }
    traced_rank_call(ends, [&] {
      watched_nccl_call(*watchdog_, "a transfer group with other ranks",
                        [&] { nccl_group(es, within, between); });
    });
    std::vector<int> watched;
    for (const rank_transfer& x : between) {
      if (std::find(watched.begin(), watched.end(), x.device) == watched.end()) {
        watched.push_back(x.device);
        watchdog_->watch(dev(x.device).ordinal, stream(x.device, queue_kind::transfer),
                         "a transfer group with other ranks");
      }
    }
  }
  for (const transfer& x : within) {
    count_copy(true, static_cast<std::uint64_t>(x.dst.size()) * es, true);
  }
}

void cuda_backend::do_send(int device, dtype t, const view& src, int peer_device, int rank,
                           int tag) {
  if (staging_) {
    mpi_with_rank(device, t, src, peer_device, rank, tag, true);
  } else if (by_ipc(device, peer_device)) {
    ipc_with_rank(device, t, src, peer_device, rank, tag, true);
  } else {
    nccl_with_rank(device, t, src, peer_device, rank, true);
  }
}

void cuda_backend::do_receive(int device, dtype t, const view& dst, int peer_device, int rank,
                              int tag) {
  if (staging_) {
    mpi_with_rank(device, t, dst, peer_device, rank, tag, false);
  } else if (by_ipc(device, peer_device)) {
    ipc_with_rank(device, t, dst, peer_device, rank, tag, false);
  } else {
    nccl_with_rank(device, t, dst, peer_device, rank, false);
  }
}

namespace {
// "a send of 4.00 MiB to device 1 of rank 1" (for failures).
std::string rank_transfer_text(bool sending, std::size_t bytes, int peer_device, int rank) {
  return std::string(sending ? "a send of " : "a receive of ") + format_bytes(bytes) +
         (sending ? " to device " : " from device ") + std::to_string(peer_device) + " of rank " +
         std::to_string(rank);
}

// The scope of a transfer with another rank, by NCCL or by MPI.
const profiler::scope_site& rank_transfer_site(bool sending) {
  static const profiler::scope_site send_site{"darray.send", category::darray_transfer};
  static const profiler::scope_site receive_site{"darray.receive", category::darray_transfer};
  return sending ? send_site : receive_site;
}
}  // namespace

void cuda_backend::mpi_with_rank(int device, dtype t, const view& v, int peer_device, int rank,
                                 int tag, bool sending) {
  const cudaStream_t s = stream(device, queue_kind::transfer);
  const profiler::scope scope{rank_transfer_site(sending), stream_view{s}};
  check_ranks();
  const std::size_t es = size_of(t);
  const auto bytes = static_cast<std::size_t>(v.size()) * es;
  const std::string what = rank_transfer_text(sending, bytes, peer_device, rank);
  const detail::transfer_ends traced =
      detail::rank_transfer_ends(sending, global_device(device), peer_device, bytes);
  if (sending) {
    staging_->send(device, element_ptr<const void>(v, es), bytes, rank, tag, traced, what);
  } else {
    staging_->receive(device, element_ptr<void>(v, es), bytes, rank, tag, traced, what);
  }
}

void cuda_backend::ipc_with_rank(int device, dtype t, const view& v, int peer_device, int rank,
                                 int tag, bool sending) {
  const cudaStream_t s = stream(device, queue_kind::transfer);
  const profiler::scope scope{rank_transfer_site(sending), stream_view{s}};
  const device_guard guard(dev(device).ordinal);
  check_ranks();
  const std::size_t es = size_of(t);
  const auto bytes = static_cast<std::size_t>(v.size()) * es;
  const int me = global_device(device);
  traced_rank_call({{device, detail::rank_transfer_ends(sending, me, peer_device, bytes)}}, [&] {
    if (sending) {
      ipc_->send(device, s, element_ptr<const void>(v, es), bytes, peer_device, rank, tag);
    } else {
      ipc_->receive(device, s, element_ptr<void>(v, es), bytes, peer_device, rank, tag);
    }
  });
  watchdog_->watch(dev(device).ordinal, s,
                   rank_transfer_text(sending, bytes, peer_device, rank) + " through CUDA IPC");
  if (!sending) {
    count_ipc(bytes);
  }
}

template <typename Call>
void cuda_backend::traced_rank_call(const std::vector<std::pair<int, detail::transfer_ends>>& ends,
                                    Call&& call) {
  profiler::timeline* tl = attached_timeline();
  // One span per device (its transfer stream's), shared by its transfers of the call.
  std::vector<int> devices;
  if (tl != nullptr) {
    nccl_spans_.flush(tl, false);  // those run by now: a program that never synchronizes holds few
    for (const auto& [device, t] : ends) {
      if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
        devices.push_back(device);
      }
    }
  }
  std::vector<cudaEvent_t> begun;
  const auto discard_from = [&](std::size_t i) {
    for (; i < begun.size(); ++i) {
      detail::gpu_spans::discard(begun[i]);
    }
  };
  try {
    for (const int device : devices) {
      begun.push_back(nccl_spans_.begin(dev(device).ordinal, stream(device, queue_kind::transfer)));
    }
    std::forward<Call>(call)();
  } catch (...) {
    discard_from(0);
    throw;
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    std::vector<detail::transfer_ends> mine;
    for (const auto& [device, t] : ends) {
      if (device == devices[i]) {
        mine.push_back(t);
      }
    }
    try {
      nccl_spans_.end(dev(devices[i]).ordinal, stream(devices[i], queue_kind::transfer), begun[i],
                      std::move(mine), global_device(devices[i]), tl);
    } catch (...) {
      discard_from(i + 1);
      throw;
    }
  }
}

void cuda_backend::nccl_with_rank(int device, dtype t, const view& v, int peer_device, int rank,
                                  bool sending) {
  const cudaStream_t s = stream(device, queue_kind::transfer);
  const profiler::scope scope{rank_transfer_site(sending), stream_view{s}};
  const device_guard guard(dev(device).ordinal);
  const std::lock_guard lock(nccl_mutex_);
  check_ranks();
  ensure_comms();
  const std::size_t es = size_of(t);
  const auto bytes = static_cast<std::size_t>(v.size()) * es;
  const std::string what = rank_transfer_text(sending, bytes, peer_device, rank);
  const int me = global_device(device);
  traced_rank_call({{device, detail::rank_transfer_ends(sending, me, peer_device, bytes)}}, [&] {
    watched_nccl_call(*watchdog_, what, [&] {
      // NCCL pairs a peer's sends and receives in the order they are issued: the plans' order.
      const ncclComm_t comm = comms_[static_cast<std::size_t>(device)];
      if (sending) {
        POOLSCOPE_CUDA_CHECK(
            ncclSend(element_ptr<const void>(v, es), bytes, ncclUint8, peer_device, comm, s));
      } else {
        POOLSCOPE_CUDA_CHECK(
            ncclRecv(element_ptr<void>(v, es), bytes, ncclUint8, peer_device, comm, s));
      }
    });
  });
  watchdog_->watch(dev(device).ordinal, s, what);
}

bool cuda_backend::do_groups_automatically(const reshard_plan& plan) const {
  // Within the process, one NCCL group moves an all-to-all reshard alone somewhat faster than
  // piece-by-piece copy engines, but an op fused with it is slower (nothing computes before the
  // whole group lands), and a reshard where each GPU sends to one peer much slower (docs/perf.md,
  // "Copy engines by default, NCCL on request"). So automatic stays with copy engines unless the
  // backend defaults to NCCL...
  if (default_transport_ == transport::nccl) {
    return true;
  }
  // ... or pieces cross ranks by NCCL: NCCL runs a group's sends and receives at once, spread
  // over its channels, where one call per piece runs them one after another on the transfer
  // stream at a fraction of the link each (docs/perf.md, "Across processes"). The plan is the
  // same on every rank, and so is this choice.
  if (staging_ || group()->size() == 1) {
    return false;
  }
  // Pieces between GPUs that CUDA IPC links move one by one, as within the process.
  return std::any_of(plan.pieces.begin(), plan.pieces.end(), [this](const piece& p) {
    return !p.local && rank_of(p.src_device) != rank_of(p.dst_device) &&
           !(ipc_ && ipc_->linked(p.src_device, p.dst_device));
  });
}

// --- host <-> device ---

// A dense device temporary from the device's allocator, returned after its stream is idle.
class staging_buffer {
 public:
  staging_buffer(device_state& d, cudaStream_t s, std::size_t bytes)
      : alloc_(*d.allocator),
        events_(d.events),
        stream_(s),
        bytes_(bytes),
        ptr_(alloc_.allocate(stream_view{s}, bytes)) {}
  staging_buffer(const staging_buffer&) = delete;
  staging_buffer& operator=(const staging_buffer&) = delete;
  ~staging_buffer() {
    log_failure("wait for a stream", [this] { wait_for_stream(events_, stream_); });
    alloc_.deallocate(stream_view{stream_}, ptr_, bytes_);
  }
  [[nodiscard]] void* data() const noexcept { return ptr_; }

 private:
  pool::allocator& alloc_;
  std::shared_ptr<event_pool> events_;
  cudaStream_t stream_;
  std::size_t bytes_;
  void* ptr_;
};

void cuda_backend::connect_ranks() {
  const int n = device_count();
  if (n > connect_up_front_max) {
    return;
  }
  // Every GPU of this rank sends a byte to, and receives one from, every GPU of the other ranks
  // (a byte of its own each way, from its pool), on its transfer stream, in one group.
  std::vector<std::unique_ptr<staging_buffer>> scratch;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    const cudaStream_t s = stream(static_cast<int>(i), queue_kind::transfer);
    scratch.push_back(
        std::make_unique<staging_buffer>(*devices_[i], s, static_cast<std::size_t>(2 * n)));
    POOLSCOPE_CUDA_CHECK(cudaMemsetAsync(scratch.back()->data(), 0, 2 * n, s));
  }
  POOLSCOPE_CUDA_CHECK(ncclGroupStart());
  try {
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      auto* base = static_cast<unsigned char*>(scratch[i]->data());
      const cudaStream_t s = stream(static_cast<int>(i), queue_kind::transfer);
      for (int peer = 0; peer < n; ++peer) {
        if (!is_local(peer) && !by_ipc(static_cast<int>(i), peer)) {
          POOLSCOPE_CUDA_CHECK(ncclSend(base + peer, 1, ncclUint8, peer, comms_[i], s));
          POOLSCOPE_CUDA_CHECK(ncclRecv(base + n + peer, 1, ncclUint8, peer, comms_[i], s));
        }
      }
    }
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  POOLSCOPE_CUDA_CHECK(ncclGroupEnd());
  // Waited for as every host wait is, within the group's timeout.
  const auto deadline = std::chrono::steady_clock::now() + group()->timeout();
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    const pooled_event done(devices_[i]->events);
    POOLSCOPE_CUDA_CHECK(
        cudaEventRecord(done.handle, stream(static_cast<int>(i), queue_kind::transfer)));
    bool connected = false;
    detail::poll_until([&] {
      connected = event_done(done.handle);
      return connected || std::chrono::steady_clock::now() > deadline;
    });
    if (!connected) {
      // No other thread uses the communicators yet: abort them here (their kernels end, and the
      // scratch with them) and leave nothing for release_all to finalize.
      for (ncclComm_t c : comms_) {
        log_failure("ncclCommAbort", [c] { POOLSCOPE_CUDA_CHECK(ncclCommAbort(c)); });
      }
      comms_.clear();
      const std::string why =
          "the connections with the other ranks' GPUs did not complete within " +
          std::to_string(group()->timeout().count()) +
          " ms (POOLSCOPE_RANK_TIMEOUT sets the bound): a rank did not take part";
      group()->fail(why);
      throw communication_error("darray cuda backend, " + group()->describe() + ": " + why);
    }
  }
}

void cuda_backend::do_upload(int device, dtype t, const view& dst, const view& host_src) {
  static const profiler::scope_site site{"darray.upload", category::darray_transfer};
  device_state& d = dev(device);
  const cudaStream_t s = d.streams[1];
  const device_guard guard(dev(device).ordinal);
  const profiler::scope scope{site, stream_view{s}};
  const std::size_t es = size_of(t);
  const auto bytes = static_cast<std::size_t>(dst.size()) * es;
  order_after(s, d.streams[0], device);  // after the work of both queues
  std::array<view, 2> v{dst, host_src};
  detail::collapse_jointly(v.data(), v.size());
  if (is_dense_line(v[0]) && is_dense_line(v[1])) {
    POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(element_ptr<void>(v[0], es),
                                         element_ptr<const void>(v[1], es), bytes,
                                         cudaMemcpyHostToDevice, s));
  } else if (const auto p = as_pitched(v, es)) {
    POOLSCOPE_CUDA_CHECK(cudaMemcpy2DAsync(element_ptr<void>(v[0], es), p->dst_pitch,
                                           element_ptr<const void>(v[1], es), p->src_pitch,
                                           p->width, p->height, cudaMemcpyHostToDevice, s));
  } else {
    // Dense host bytes (packed unless already dense), then into place on the device.
    std::vector<std::byte> packed;
    const std::byte* dense = element_ptr<const std::byte>(v[1], es);
    if (!is_dense_line(v[1])) {
      packed.resize(bytes);
      host_strided_copy(v[1], es, packed.data(), true);
      dense = packed.data();
    }
    if (is_dense_line(v[0])) {
      POOLSCOPE_CUDA_CHECK(
          cudaMemcpyAsync(element_ptr<void>(v[0], es), dense, bytes, cudaMemcpyHostToDevice, s));
    } else {
      const staging_buffer tmp(d, s, bytes);
      POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(tmp.data(), dense, bytes, cudaMemcpyHostToDevice, s));
      // The kernel walks dst in row-major order, the order the dense temporary holds.
      detail::launch_copy(target(device, queue_kind::transfer), es, v[0],
                          view::dense(tmp.data(), v[0].extents()));
    }
  }
  wait_for_stream(d.events, s);
}

void cuda_backend::do_download(int device, dtype t, const view& host_dst, const view& src) {
  static const profiler::scope_site site{"darray.download", category::darray_transfer};
  device_state& d = dev(device);
  const cudaStream_t s = d.streams[1];
  const device_guard guard(dev(device).ordinal);
  const profiler::scope scope{site, stream_view{s}};
  const std::size_t es = size_of(t);
  const auto bytes = static_cast<std::size_t>(src.size()) * es;
  order_after(s, d.streams[0], device);  // after the work of both queues
  std::array<view, 2> v{host_dst, src};
  detail::collapse_jointly(v.data(), v.size());
  if (is_dense_line(v[0]) && is_dense_line(v[1])) {
    POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(element_ptr<void>(v[0], es),
                                         element_ptr<const void>(v[1], es), bytes,
                                         cudaMemcpyDeviceToHost, s));
    wait_for_stream(d.events, s);
    check_ranks();  // the data may come from a rank that failed
    return;
  }
  if (const auto p = as_pitched(v, es)) {
    POOLSCOPE_CUDA_CHECK(cudaMemcpy2DAsync(element_ptr<void>(v[0], es), p->dst_pitch,
                                           element_ptr<const void>(v[1], es), p->src_pitch,
                                           p->width, p->height, cudaMemcpyDeviceToHost, s));
    wait_for_stream(d.events, s);
    check_ranks();  // the data may come from a rank that failed
    return;
  }
  // Dense host bytes (the destination itself when dense), from the device view made dense.
  std::vector<std::byte> packed;
  std::byte* dense = element_ptr<std::byte>(v[0], es);
  if (!is_dense_line(v[0])) {
    packed.resize(bytes);
    dense = packed.data();
  }
  if (is_dense_line(v[1])) {
    POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(dense, element_ptr<const void>(v[1], es), bytes,
                                         cudaMemcpyDeviceToHost, s));
    wait_for_stream(d.events, s);
    check_ranks();  // the data may come from a rank that failed
  } else {
    const staging_buffer tmp(d, s, bytes);
    detail::launch_copy(target(device, queue_kind::transfer), es,
                        view::dense(tmp.data(), v[1].extents()), v[1]);
    POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(dense, tmp.data(), bytes, cudaMemcpyDeviceToHost, s));
    wait_for_stream(d.events, s);
    check_ranks();  // the data may come from a rank that failed
  }
  if (!packed.empty()) {
    host_strided_copy(v[0], es, packed.data(), false);
  }
}

// --- compute ---

void cuda_backend::do_fill(int device, queue_kind q, dtype t, const view& dst, scalar value,
                           bool yielding) {
  static const profiler::scope_site site{"darray.fill", category::darray_compute};
  device_guard guard(dev(device).ordinal, std::defer_lock);
  const profiler::scope scope{site, stream_view{stream(device, q)}};
  detail::launch_fill(map_target(device, q, yielding, guard), t, dst, value);
  count_op();
}

void cuda_backend::do_unary(int device, queue_kind q, dtype t, unary_op op, const view& dst,
                            const view& src, bool yielding) {
  device_guard guard(dev(device).ordinal, std::defer_lock);
  const profiler::scope scope{site_of(op), stream_view{stream(device, q)}};
  detail::launch_unary(map_target(device, q, yielding, guard), t, op, dst, src);
  count_op();
}

void cuda_backend::do_binary(int device, queue_kind q, dtype t, binary_op op, const view& dst,
                             const view& a, const view& b, const scalar* a_scalar,
                             const scalar* b_scalar, bool yielding) {
  device_guard guard(dev(device).ordinal, std::defer_lock);
  const profiler::scope scope{site_of(op), stream_view{stream(device, q)}};
  detail::launch_binary(map_target(device, q, yielding, guard), t, op, dst, a, b, a_scalar,
                        b_scalar);
  count_op();
}

void cuda_backend::do_binary_parts(int device, queue_kind q, dtype t, binary_op op,
                                   const std::vector<binary_part>& parts, bool yielding) {
  device_guard guard(dev(device).ordinal, std::defer_lock);
  const profiler::scope scope{site_of(op), stream_view{stream(device, q)}};
  const detail::launch_target on = map_target(device, q, yielding, guard);
  if (detail::launch_binary_parts(on, t, op, parts)) {
    count_op();
    return;
  }
  for (const binary_part& p : parts) {
    detail::launch_binary(on, t, op, p.dst, p.a, p.b, nullptr, nullptr);
    count_op();
  }
}

void cuda_backend::do_accumulate(int device, queue_kind q, dtype t, reduce_op op, const view& acc,
                                 const view& src) {
  const device_guard guard(dev(device).ordinal);
  const profiler::scope scope{accumulate_site(op), stream_view{stream(device, q)}};
  detail::launch_accumulate(target(device, q), t, op, acc, src);
  count_op();
}

void cuda_backend::do_reduce(int device, queue_kind q, dtype t, reduce_op op, const view& acc,
                             const view& src, int axis) {
  const device_guard guard(dev(device).ordinal);
  const profiler::scope scope{reduce_site(op), stream_view{stream(device, q)}};
  device_state& d = dev(device);
  // The scratch of this queue: launches of two threads on one queue must not interleave.
  const std::lock_guard lock(d.scratch_mutex[index_of(q)]);
  detail::launch_reduce(target(device, q), t, op, acc, src, axis, d.scratch[index_of(q)]);
  count_op();
}

cublasHandle_t cuda_backend::blas_handle(int device, queue_kind q) {
  device_state& d = dev(device);
  cublasHandle_t& h = d.blas[index_of(q)];
  if (h == nullptr) {
    cublasHandle_t created = nullptr;
    POOLSCOPE_CUDA_CHECK(cublasCreate(&created));
    const cublasStatus_t s = cublasSetStream(created, d.streams[index_of(q)]);
    if (s != CUBLAS_STATUS_SUCCESS) {
      (void)cublasDestroy(created);
      detail::seam::raise(s, "cublasSetStream(created, stream)", __FILE__, __LINE__);
    }
    h = created;
  }
  return h;
}

// The leading dimension cuBLAS may use for a row-major matrix view (unit column stride), or 0
// when the view cannot be passed to cuBLAS.
std::int64_t leading_dimension(const view& v) noexcept {
  const std::int64_t cols = std::max<std::int64_t>(v.extent[1], 1);
  if (v.extent[1] > 1 && v.stride[1] != 1) {
    return 0;
  }
  const std::int64_t ld = v.extent[0] <= 1 ? std::max(v.stride[0], cols) : v.stride[0];
  return ld >= cols && ld <= INT_MAX ? ld : 0;
}

void cuda_backend::do_gemm_accumulate(int device, queue_kind q, dtype t, const view& c,
                                      const view& a, const view& b) {
  static const profiler::scope_site site{"darray.gemm", category::darray_compute};
  const device_guard guard(dev(device).ordinal);
  const profiler::scope scope{site, stream_view{stream(device, q)}};
  const std::int64_t m = c.extent[0];
  const std::int64_t n = c.extent[1];
  const std::int64_t k = a.extent[1];
  count_op();
  if (m == 0 || n == 0 || k == 0) {
    return;
  }
  const std::int64_t lda = leading_dimension(a);
  const std::int64_t ldb = leading_dimension(b);
  const std::int64_t ldc = leading_dimension(c);
  const bool blas = (t == dtype::f32 || t == dtype::f64) && lda > 0 && ldb > 0 && ldc > 0 &&
                    m <= INT_MAX && n <= INT_MAX && k <= INT_MAX;
  if (!blas) {
    detail::launch_gemm_accumulate(target(device, q), t, c, a, b);
    return;
  }
  device_state& d = dev(device);
  const std::lock_guard lock(d.blas_mutex[index_of(q)]);
  const cublasHandle_t h = blas_handle(device, q);
  // Row-major C = A B is column-major C^T = B^T A^T: swap the operands, keep the layouts.
  const auto mi = static_cast<int>(m);
  const auto ni = static_cast<int>(n);
  const auto ki = static_cast<int>(k);
  if (t == dtype::f32) {
    const float one = 1.0F;
    POOLSCOPE_CUDA_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, mi, ki, &one,
                                     element_ptr<const float>(b, 4), static_cast<int>(ldb),
                                     element_ptr<const float>(a, 4), static_cast<int>(lda), &one,
                                     element_ptr<float>(c, 4), static_cast<int>(ldc)));
  } else {
    const double one = 1.0;
    POOLSCOPE_CUDA_CHECK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, mi, ki, &one,
                                     element_ptr<const double>(b, 8), static_cast<int>(ldb),
                                     element_ptr<const double>(a, 8), static_cast<int>(lda), &one,
                                     element_ptr<double>(c, 8), static_cast<int>(ldc)));
  }
}

}  // namespace

namespace {
// The first GPU (CUDA ordinal) of this rank's `n`, with `available` visible here. The ranks of a
// host take them in turn (local rank k: k n .. k n + n - 1) and wrap round when there are more
// ranks than that (k n mod available: four ranks of cuda:1 on two GPUs share each in pairs); a
// rank whose turn would run past the last GPU takes the first n. Where each rank sees only its
// own (CUDA_VISIBLE_DEVICES per rank, srun --gpus-per-task), that is the first n. Collective: the
// ranks then compare their choices of `between` (and its staging chunks) and their GPUs' UUIDs,
// and all refuse alike what rank_gpus_error finds (with NCCL, two ranks of a host on one GPU).
// `all`: every rank's lines.
int first_gpu_of_rank(process_group& g, int n, int available, const backend_options& o,
                      std::vector<detail::rank_gpus>& all) {
  int first = static_cast<int>((static_cast<long long>(g.local_rank()) * n) % available);
  if (first + n > available) {
    first = 0;
  }
  detail::rank_gpus mine{detail::nccl_host(g.host_name(), std::getenv("NCCL_HOSTID")),
                         o.between_ranks,
                         {},
                         o.staging_chunk_bytes};
  for (int d = first; d < first + n; ++d) {
    mine.uuids.push_back(detail::seam::uuid_of(d));
  }
  all.clear();
  for (const std::string& line : g.all_gather(detail::encode(mine))) {
    all.push_back(detail::decode(line));
  }
  if (const std::string error = detail::rank_gpus_error(all); !error.empty()) {
    throw invalid_argument(error);
  }
  return first;
}
}  // namespace

std::shared_ptr<backend> make_cuda_backend(int devices, const backend_options& options) {
  std::string reason;
  const int available = detail::seam::device_count(&reason);
  if (available == 0) {
    throw device_unavailable("darray cuda backend: no CUDA device (" + reason + ")");
  }
  if (devices == 0 || devices < -1 || devices > available) {
    throw invalid_argument("darray cuda backend: devices = " + std::to_string(devices) +
                           " (expected -1 for all, or 1.." + std::to_string(available) + ")");
  }
  const int n = devices < 0 ? available : devices;
  if (options.group && options.group->size() > 1 && options.between_ranks == rank_transport::mpi &&
      !options.group->uses_mpi()) {
    throw invalid_argument(
        "darray cuda backend: between_ranks = mpi needs a process group made by "
        "MPI, and " +
        options.group->describe() +
        " was adopted from an NCCL communicator (use between_ranks = nccl)");
  }
  int first = 0;
  std::vector<detail::rank_gpus> ranks;
  if (options.group && options.group->nccl_communicator() != nullptr) {
    // An adopted NCCL communicator's GPU is the one current when it was made (the application's).
    POOLSCOPE_CUDA_CHECK(cudaGetDevice(&first));
  } else if (options.group && options.group->size() > 1) {
    first = first_gpu_of_rank(*options.group, n, available, options, ranks);
  }
  return std::make_shared<cuda_backend>(n, first, options, ranks);
}

}  // namespace poolscope::darray
