#include "cuda_seam.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "poolscope/detail/cuda_check.hpp"
#include "poolscope/detail/cuda_check_nccl.hpp"
#include "poolscope/error.hpp"

namespace poolscope::bench::detail {

int device_count() noexcept {
  int n = 0;
  // (succeeded clears the "no device" error for later callers)
  return ::poolscope::detail::succeeded(cudaGetDeviceCount(&n)) ? n : 0;
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  POOLSCOPE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  POOLSCOPE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace poolscope::bench::detail

namespace poolscope::bench::detail {

namespace {

// Restores the calling thread's current device on scope exit.
class current_device_guard {
 public:
  current_device_guard() { POOLSCOPE_CUDA_CHECK(cudaGetDevice(&previous_)); }
  current_device_guard(const current_device_guard&) = delete;
  current_device_guard& operator=(const current_device_guard&) = delete;
  ~current_device_guard() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// cudaMalloc'd memory on one GPU, freed on scope exit (errors there are ignored: noexcept).
class device_memory {
 public:
  device_memory(int device, std::size_t bytes) : device_(device) {
    POOLSCOPE_CUDA_CHECK(cudaSetDevice(device));
    POOLSCOPE_CUDA_CHECK(cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 1)));
    // Touch the pages so the first timed copy does not pay for their mapping.
    POOLSCOPE_CUDA_CHECK(cudaMemset(ptr_, 1, std::max<std::size_t>(bytes, 1)));
  }
  device_memory(device_memory&& o) noexcept
      : device_(o.device_), ptr_(std::exchange(o.ptr_, nullptr)) {}
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;
  device_memory& operator=(device_memory&&) = delete;
  ~device_memory() {
    if (ptr_ != nullptr) {
      (void)cudaSetDevice(device_);
      (void)cudaFree(ptr_);
    }
  }
  [[nodiscard]] void* get() const noexcept { return ptr_; }

 private:
  int device_;
  void* ptr_ = nullptr;
};

// A non-blocking stream on one GPU, destroyed on scope exit.
class device_stream {
 public:
  explicit device_stream(int device) : device_(device) {
    POOLSCOPE_CUDA_CHECK(cudaSetDevice(device));
    POOLSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  device_stream(device_stream&& o) noexcept
      : device_(o.device_), stream_(std::exchange(o.stream_, nullptr)) {}
  device_stream(const device_stream&) = delete;
  device_stream& operator=(const device_stream&) = delete;
  device_stream& operator=(device_stream&&) = delete;
  ~device_stream() {
    if (stream_ != nullptr) {
      (void)cudaSetDevice(device_);
      (void)cudaStreamSynchronize(stream_);
      (void)cudaStreamDestroy(stream_);
    }
  }
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

// An event without timing on one GPU, destroyed on scope exit.
class device_event {
 public:
  explicit device_event(int device) {
    POOLSCOPE_CUDA_CHECK(cudaSetDevice(device));
    POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming));
  }
  device_event(device_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  device_event(const device_event&) = delete;
  device_event& operator=(const device_event&) = delete;
  device_event& operator=(device_event&&) = delete;
  ~device_event() {
    if (e_ != nullptr) {
      (void)cudaEventDestroy(e_);
    }
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// The communicators of ncclCommInitAll, destroyed on scope exit.
class nccl_comms {
 public:
  explicit nccl_comms(int devices) : comms_(static_cast<std::size_t>(devices), nullptr) {
    POOLSCOPE_CUDA_CHECK(ncclCommInitAll(comms_.data(), devices, nullptr));
  }
  nccl_comms(const nccl_comms&) = delete;
  nccl_comms& operator=(const nccl_comms&) = delete;
  ~nccl_comms() {
    for (ncclComm_t c : comms_) {
      if (c != nullptr) {
        (void)ncclCommDestroy(c);
      }
    }
  }
  [[nodiscard]] ncclComm_t operator[](int device) const noexcept {
    return comms_[static_cast<std::size_t>(device)];
  }

 private:
  std::vector<ncclComm_t> comms_;
};

// Lets `accessor` read and write `owner`'s memory directly, where the hardware allows it.
void enable_peer_access(int accessor, int owner) {
  if (accessor == owner) {
    return;
  }
  int can = 0;
  POOLSCOPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, accessor, owner));
  if (can == 0) {
    return;  // cudaMemcpyPeerAsync then stages through the host: still the raw copy
  }
  POOLSCOPE_CUDA_CHECK(cudaSetDevice(accessor));
  const cudaError_t e = cudaDeviceEnablePeerAccess(owner, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // enabled earlier (by darray's backend, say): not an error here
    return;
  }
  POOLSCOPE_CUDA_CHECK(e);
}

void synchronize_all(const std::vector<device_stream>& streams) {
  for (const auto& s : streams) {
    POOLSCOPE_CUDA_CHECK(cudaSetDevice(s.device()));
    POOLSCOPE_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  }
}

// One untimed warm-up of `enqueue` + sync, then `repeat` timed ones (wall clock).
template <typename Enqueue, typename Sync>
baseline_seconds time_repeated(int repeat, Enqueue&& enqueue, Sync&& sync) {
  enqueue();
  sync();
  std::vector<double> samples;
  for (int i = 0; i < std::max(repeat, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    enqueue();
    sync();
    const auto t1 = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  std::sort(samples.begin(), samples.end());
  baseline_seconds out;
  out.samples = static_cast<int>(samples.size());
  out.best = samples.front();
  const std::size_t mid = samples.size() / 2;
  out.median = samples.size() % 2 == 1 ? samples[mid] : 0.5 * (samples[mid - 1] + samples[mid]);
  return out;
}

}  // namespace

baseline_seconds time_peer_copies(const std::vector<device_link>& links, int repeat) {
  const current_device_guard guard;
  std::vector<device_memory> src;
  std::vector<device_memory> dst;
  std::vector<device_stream> streams;
  for (const auto& l : links) {
    enable_peer_access(l.src, l.dst);
    enable_peer_access(l.dst, l.src);
    src.emplace_back(l.src, l.bytes);
    dst.emplace_back(l.dst, l.bytes);
    streams.emplace_back(l.src);
  }
  POOLSCOPE_CUDA_CHECK(cudaDeviceSynchronize());
  return time_repeated(
      repeat,
      [&] {
        for (std::size_t i = 0; i < links.size(); ++i) {
          const auto& l = links[i];
          POOLSCOPE_CUDA_CHECK(cudaSetDevice(l.src));
          POOLSCOPE_CUDA_CHECK(cudaMemcpyPeerAsync(dst[i].get(), l.dst, src[i].get(), l.src,
                                                   l.bytes, streams[i].get()));
        }
      },
      [&] { synchronize_all(streams); });
}

baseline_seconds time_nccl_send_recv(const std::vector<device_link>& links, int devices,
                                     int repeat) {
  const current_device_guard guard;
  std::vector<device_memory> src;
  std::vector<device_memory> dst;
  for (const auto& l : links) {
    src.emplace_back(l.src, l.bytes);
    dst.emplace_back(l.dst, l.bytes);
  }
  std::vector<device_stream> streams;
  for (int d = 0; d < devices; ++d) {
    streams.emplace_back(d);
  }
  const nccl_comms comms(devices);
  return time_repeated(
      repeat,
      [&] {
        POOLSCOPE_CUDA_CHECK(ncclGroupStart());
        bool group_open = true;
        try {
          for (std::size_t i = 0; i < links.size(); ++i) {
            const auto& l = links[i];
            POOLSCOPE_CUDA_CHECK(ncclSend(src[i].get(), l.bytes, ncclUint8, l.dst, comms[l.src],
                                          streams[static_cast<std::size_t>(l.src)].get()));
            POOLSCOPE_CUDA_CHECK(ncclRecv(dst[i].get(), l.bytes, ncclUint8, l.src, comms[l.dst],
                                          streams[static_cast<std::size_t>(l.dst)].get()));
          }
          group_open = false;
          POOLSCOPE_CUDA_CHECK(ncclGroupEnd());
        } catch (...) {
          if (group_open) {
            (void)ncclGroupEnd();  // close the group; the first error is the one reported
          }
          throw;
        }
      },
      [&] { synchronize_all(streams); });
}

baseline_seconds time_d2d_copy(int device, std::size_t bytes, int repeat) {
  const current_device_guard guard;
  const device_memory src(device, bytes);
  const device_memory dst(device, bytes);
  std::vector<device_stream> streams;
  streams.emplace_back(device);
  POOLSCOPE_CUDA_CHECK(cudaDeviceSynchronize());
  return time_repeated(
      repeat,
      [&] {
        POOLSCOPE_CUDA_CHECK(cudaSetDevice(device));
        POOLSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice,
                                             streams[0].get()));
      },
      [&] { synchronize_all(streams); });
}

namespace {

// A graph and its executable, destroyed on scope exit.
struct graph_pair {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  graph_pair() = default;
  graph_pair(const graph_pair&) = delete;
  graph_pair& operator=(const graph_pair&) = delete;
  ~graph_pair() {
    if (exec != nullptr) {
      (void)cudaGraphExecDestroy(exec);
    }
    if (graph != nullptr) {
      (void)cudaGraphDestroy(graph);
    }
  }
};

// A graph of one node, `kernel` on GPU `device` with `args` over `items` elements (a thread
// each, up to 1024 blocks of 256), and its executable (made on that GPU).
std::unique_ptr<graph_pair> kernel_graph(int device, const void* kernel, void** args,
                                         std::size_t items) {
  POOLSCOPE_CUDA_CHECK(cudaSetDevice(device));
  auto g = std::make_unique<graph_pair>();
  POOLSCOPE_CUDA_CHECK(cudaGraphCreate(&g->graph, 0));
  constexpr std::size_t threads = 256;
  cudaKernelNodeParams p{};
  p.func = const_cast<void*>(kernel);
  p.gridDim = dim3(
      static_cast<unsigned>(std::clamp<std::size_t>((items + threads - 1) / threads, 1, 1024)));
  p.blockDim = dim3(static_cast<unsigned>(threads));
  p.kernelParams = args;
  cudaGraphNode_t node = nullptr;
  POOLSCOPE_CUDA_CHECK(cudaGraphAddKernelNode(&node, g->graph, nullptr, 0, &p));
  POOLSCOPE_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
  return g;
}

// kernel_graph of floor_add_kernel(): c = a + b over `n` floats.
std::unique_ptr<graph_pair> add_graph(int device, const float* a, const float* b, float* c, int n) {
  void* args[] = {&a, &b, &c, &n};
  return kernel_graph(device, floor_add_kernel(), args, static_cast<std::size_t>(n));
}

// kernel_graph of floor_copy_kernel() on GPU `device`: `bytes` from src to dst.
std::unique_ptr<graph_pair> copy_graph(int device, const void* src, void* dst, std::size_t bytes) {
  unsigned long long n = bytes;
  void* args[] = {&src, &dst, &n};
  return kernel_graph(device, floor_copy_kernel(), args, bytes);
}

}  // namespace

/// What the async floors work on: per GPU a buffer, a stream and an event (synchronized); for
/// floor_call::kernel_graph also two operands and a one-kernel graph writing the buffer.
struct floor_state {
  floor_call call;
  std::vector<device_memory> bufs;
  std::vector<device_stream> streams;
  std::vector<device_event> events;
  std::vector<device_memory> operands;              // GPU d's at 2d and 2d + 1
  std::vector<std::unique_ptr<graph_pair>> graphs;  // GPU d's at d

  floor_state(int devices, std::size_t bytes, floor_call how = floor_call::memset) : call(how) {
    for (int d = 0; d < devices; ++d) {
      bufs.emplace_back(d, bytes);
      streams.emplace_back(d);
      events.emplace_back(d);
    }
    if (how == floor_call::kernel_graph) {
      const auto n = static_cast<int>(
          std::min<std::size_t>(bytes / sizeof(float), std::numeric_limits<int>::max()));
      for (int d = 0; d < devices; ++d) {
        operands.emplace_back(d, bytes);
        operands.emplace_back(d, bytes);
        const auto i = static_cast<std::size_t>(d);
        graphs.push_back(add_graph(d, static_cast<const float*>(operands[2 * i].get()),
                                   static_cast<const float*>(operands[2 * i + 1].get()),
                                   static_cast<float*>(bufs[i].get()), n));
      }
    }
    POOLSCOPE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  /// Makes GPU d current where the floor's calls need it: a memset does; a graph launch and an
  /// event record take any GPU's stream (as the op launches its kept graphs).
  void select(int d) const {
    if (call != floor_call::kernel_graph) {
      POOLSCOPE_CUDA_CHECK(cudaSetDevice(d));
    }
  }
  /// GPU d's call and event (a memset with GPU d current: see select).
  void issue(int d, std::size_t bytes) {
    const auto i = static_cast<std::size_t>(d);
    if (call == floor_call::kernel_graph) {
      POOLSCOPE_CUDA_CHECK(cudaGraphLaunch(graphs[i]->exec, streams[i].get()));
    } else {
      POOLSCOPE_CUDA_CHECK(cudaMemsetAsync(bufs[i].get(), 0, bytes, streams[i].get()));
    }
    POOLSCOPE_CUDA_CHECK(cudaEventRecord(events[i].get(), streams[i].get()));
  }
  void wait_all() {
    for (const auto& e : events) {
      POOLSCOPE_CUDA_CHECK(cudaEventSynchronize(e.get()));
    }
  }
};

struct async_floor::state : floor_state {
  /// One copy of a round: its buffers, the source GPU's stream and the event its receiver waits
  /// (with floor_call::kernel_graph, its graph).
  struct copy {
    device_link link;
    device_memory src;
    device_memory dst;
    device_stream stream;
    device_event done;
    std::unique_ptr<graph_pair> graph;
  };
  std::vector<copy> copies;

  state(int devices, std::size_t bytes, const std::vector<device_link>& links, floor_call how)
      : floor_state(devices, bytes, how) {
    copies.reserve(links.size());
    for (const device_link& l : links) {
      if (l.src < 0 || l.src >= devices || l.dst < 0 || l.dst >= devices) {
        throw invalid_argument("async_floor: a copy from GPU " + std::to_string(l.src) +
                               " to GPU " + std::to_string(l.dst) + " is outside GPUs 0.." +
                               std::to_string(devices - 1));
      }
      enable_peer_access(l.src, l.dst);
      enable_peer_access(l.dst, l.src);
      copies.push_back({l, device_memory(l.src, l.bytes), device_memory(l.dst, l.bytes),
                        device_stream(l.src), device_event(l.src), nullptr});
      if (how == floor_call::kernel_graph) {
        copy& c = copies.back();
        c.graph = copy_graph(l.src, c.src.get(), c.dst.get(), l.bytes);
      }
    }
    POOLSCOPE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  /// The copies (or their graphs), each followed by its event on the source GPU's stream.
  void issue_copies() {
    for (const copy& c : copies) {
      select(c.link.src);
      if (c.graph != nullptr) {
        POOLSCOPE_CUDA_CHECK(cudaGraphLaunch(c.graph->exec, c.stream.get()));
      } else {
        POOLSCOPE_CUDA_CHECK(cudaMemcpyPeerAsync(c.dst.get(), c.link.dst, c.src.get(), c.link.src,
                                                 c.link.bytes, c.stream.get()));
      }
      POOLSCOPE_CUDA_CHECK(cudaEventRecord(c.done.get(), c.stream.get()));
    }
  }
  /// GPU d's stream waits for the copies it receives.
  void wait_for_copies(int d) {
    for (const copy& c : copies) {
      if (c.link.dst == d) {
        POOLSCOPE_CUDA_CHECK(
            cudaStreamWaitEvent(streams[static_cast<std::size_t>(d)].get(), c.done.get(), 0));
      }
    }
  }
};

async_floor::async_floor(int devices, std::size_t bytes, const std::vector<device_link>& copies,
                         floor_call call)
    : bytes_(bytes) {
  const current_device_guard guard;
  state_ = std::make_unique<state>(devices, bytes, copies, call);
}

async_floor::~async_floor() {
  int previous = 0;
  const bool known = ::poolscope::detail::succeeded(cudaGetDevice(&previous));
  state_.reset();  // each buffer, stream and event selects its own device to go
  if (known) {
    (void)::poolscope::detail::succeeded(cudaSetDevice(previous));
  }
}

void async_floor::issue(int length) {
  std::optional<current_device_guard> guard;  // (kernel graphs switch no device: see select)
  if (state_->call != floor_call::kernel_graph) {
    guard.emplace();
  }
  const int devices = static_cast<int>(state_->events.size());
  for (int k = 0; k < std::max(length, 1); ++k) {
    state_->issue_copies();
    for (int d = 0; d < devices; ++d) {
      state_->select(d);
      state_->wait_for_copies(d);
      state_->issue(d, bytes_);
    }
  }
}

void async_floor::wait() {
  state_->wait_all();
}

baseline_seconds time_async_floor_threaded(int devices, std::size_t bytes, int repeat) {
  const current_device_guard guard;
  floor_state st(devices, bytes);
  std::atomic<std::uint64_t> round{0};
  std::atomic<int> issued{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  std::mutex failure_mutex;
  std::exception_ptr failure;  // the first issuer's failure (guarded by failure_mutex)
  const auto issuer = [&](int d) {
    std::uint64_t seen = 0;
    try {
      POOLSCOPE_CUDA_CHECK(cudaSetDevice(d));
      while (!stop.load(std::memory_order_acquire)) {
        const std::uint64_t r = round.load(std::memory_order_acquire);
        if (r == seen) {
          continue;  // spin: a sleeping issuer would time its wake-up, not the calls
        }
        seen = r;
        st.issue(d, bytes);
        issued.fetch_add(1, std::memory_order_acq_rel);
      }
    } catch (...) {
      {
        const std::lock_guard lock(failure_mutex);
        if (!failure) {
          failure = std::current_exception();
        }
      }
      failed.store(true, std::memory_order_release);  // after `failure`: the waiter reads it
    }
  };
  std::vector<std::thread> issuers;
  issuers.reserve(static_cast<std::size_t>(devices));
  // Stops and joins the issuers on every exit path.
  struct joiner {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    joiner(std::atomic<bool>& s, std::vector<std::thread>& t) : stop(s), threads(t) {}
    joiner(const joiner&) = delete;
    joiner& operator=(const joiner&) = delete;
    ~joiner() {
      stop.store(true, std::memory_order_release);
      for (auto& t : threads) {
        t.join();
      }
    }
  } const join{stop, issuers};
  for (int d = 0; d < devices; ++d) {
    issuers.emplace_back(issuer, d);
  }
  return time_repeated(
      repeat,
      [&] {
        issued.store(0, std::memory_order_relaxed);
        round.fetch_add(1, std::memory_order_acq_rel);
        while (issued.load(std::memory_order_acquire) < devices &&
               !failed.load(std::memory_order_acquire)) {
        }
        if (failed.load(std::memory_order_acquire)) {
          const std::lock_guard lock(failure_mutex);
          std::rethrow_exception(failure);
        }
      },
      [&] { st.wait_all(); });
}

namespace {

// Ends a capture still open on `stream` at scope exit (a call inside it threw), dropping what
// was captured, so that the stream is usable again.
class capture_guard {
 public:
  explicit capture_guard(cudaStream_t stream) : stream_(stream) {}
  capture_guard(const capture_guard&) = delete;
  capture_guard& operator=(const capture_guard&) = delete;
  ~capture_guard() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (::poolscope::detail::succeeded(cudaStreamIsCapturing(stream_, &status)) &&
        status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(stream_, &partial);
      if (partial != nullptr) {
        (void)cudaGraphDestroy(partial);
      }
      (void)cudaGetLastError();  // the failed capture's error: reported by the call that threw
    }
  }

 private:
  cudaStream_t stream_;
};

}  // namespace

baseline_seconds time_graph_floor(int devices, std::size_t bytes, int repeat) {
  const current_device_guard guard;
  floor_state st(devices, bytes);
  std::vector<device_event> joins;  // joins[d - 1]: GPU d's end, for d >= 1
  for (int d = 1; d < devices; ++d) {
    joins.emplace_back(d);
  }
  const device_event fork(0);
  const cudaStream_t first = st.streams[0].get();
  graph_pair g;
  {
    POOLSCOPE_CUDA_CHECK(cudaSetDevice(0));
    const capture_guard capture(first);
    POOLSCOPE_CUDA_CHECK(cudaStreamBeginCapture(first, cudaStreamCaptureModeThreadLocal));
    POOLSCOPE_CUDA_CHECK(cudaEventRecord(fork.get(), first));
    for (int d = 0; d < devices; ++d) {
      const auto i = static_cast<std::size_t>(d);
      POOLSCOPE_CUDA_CHECK(cudaSetDevice(d));
      if (d > 0) {  // GPU d's stream joins the capture by waiting for GPU 0's
        POOLSCOPE_CUDA_CHECK(cudaStreamWaitEvent(st.streams[i].get(), fork.get(), 0));
      }
      POOLSCOPE_CUDA_CHECK(cudaMemsetAsync(st.bufs[i].get(), 0, bytes, st.streams[i].get()));
      if (d > 0) {
        POOLSCOPE_CUDA_CHECK(cudaEventRecord(joins[i - 1].get(), st.streams[i].get()));
      }
    }
    POOLSCOPE_CUDA_CHECK(cudaSetDevice(0));
    for (const device_event& j : joins) {
      POOLSCOPE_CUDA_CHECK(cudaStreamWaitEvent(first, j.get(), 0));
    }
    POOLSCOPE_CUDA_CHECK(cudaStreamEndCapture(first, &g.graph));
  }
  POOLSCOPE_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
  return time_repeated(
      repeat, [&] { POOLSCOPE_CUDA_CHECK(cudaGraphLaunch(g.exec, first)); },
      [&] { POOLSCOPE_CUDA_CHECK(cudaStreamSynchronize(first)); });
}

}  // namespace poolscope::bench::detail
