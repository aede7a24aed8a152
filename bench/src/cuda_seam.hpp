// The bench component's one seam to CUDA (with floor_kernel.cu, its kernels). Everything else
// in bench/ is CUDA-free.
// Preconditions: pointers passed to the copy functions are device memory of the current device
// (or host memory, for the host side); the timed baselines name GPUs in [0, device_count()) and
// must only be called when a GPU is present. Errors: device_count never throws (0 on any error);
// the copies and baselines throw poolscope::cuda_error naming the failed CUDA or NCCL call (the
// baselines free what they allocated before throwing). The baselines leave the current device as
// they found it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace poolscope::bench::detail {

/// cudaGetDeviceCount, or 0 if it fails (no driver, no GPU).
[[nodiscard]] int device_count() noexcept;
/// cudaMemcpy host -> device (synchronous).
void copy_to_device(void* dst, const void* src, std::size_t bytes);
/// cudaMemcpy device -> host (synchronous).
void copy_to_host(void* dst, const void* src, std::size_t bytes);

/// One copy of a baseline pattern: `bytes` from GPU `src` to GPU `dst` (src == dst: within one).
struct device_link {
  int src = 0;
  int dst = 0;
  std::size_t bytes = 0;
};

/// Wall-clock seconds of the timed repetitions of a baseline (after one untimed warm-up).
struct baseline_seconds {
  double best = 0.0;
  double median = 0.0;
  int samples = 0;
};

/// Raw cudaMemcpyPeerAsync of every link at once (one non-blocking stream per link, on its
/// source GPU; peer access enabled where the GPUs allow it), timed from the first enqueue to the
/// end of the last copy, `repeat` (>= 1) times. Buffers come from cudaMalloc and are freed.
[[nodiscard]] baseline_seconds time_peer_copies(const std::vector<device_link>& links, int repeat);

/// NCCL send/recv of every link at once in one group (communicators from ncclCommInitAll over
/// GPUs 0..devices-1, one stream per GPU), timed as time_peer_copies. Links must join distinct
/// GPUs below `devices`.
[[nodiscard]] baseline_seconds time_nccl_send_recv(const std::vector<device_link>& links,
                                                   int devices, int repeat);

/// Raw cudaMemcpyAsync device-to-device of `bytes` within GPU `device` (1 read + 1 write per
/// byte), timed as time_peer_copies.
[[nodiscard]] baseline_seconds time_d2d_copy(int device, std::size_t bytes, int repeat);

/// The asynchronous call an async_floor makes per GPU.
enum class floor_call : std::uint8_t {
  memset,        ///< cudaMemsetAsync of the bytes, standing in for a kernel launch
  kernel_graph,  ///< cudaGraphLaunch of a prebuilt one-kernel graph adding two arrays of the bytes
                 ///< into a third (floor_add_kernel), and each copy a one-kernel graph too
                 ///< (floor_copy_kernel on the source GPU writing the peer's memory), with no
                 ///< device switch: the calls a small darray op makes when its kernels are
                 ///< launched as graphs (it copies pieces up to 64 KiB with a kernel), without its
                 ///< bookkeeping
};

/// The kernel of floor_call::kernel_graph: c[i] = a[i] + b[i] for i < n, grid-stride; its
/// parameters (const float* a, const float* b, float* c, int n).
[[nodiscard]] const void* floor_add_kernel() noexcept;
/// The copy kernel of floor_call::kernel_graph: dst[i] = src[i] for the first n bytes,
/// grid-stride; its parameters (const unsigned char* src, unsigned char* dst, unsigned long long
/// n).
[[nodiscard]] const void* floor_copy_kernel() noexcept;

/// The floor of a small op's cost on `devices` GPUs from one thread, taken a round at a time so
/// that a benchmark can interleave its rounds with the op's own (both then see the same host
/// state): per GPU, cudaSetDevice (not with floor_call::kernel_graph: like the op's launches of its
/// kept graphs, a graph launch and an event record need no switch), one asynchronous call (`call`,
/// over `bytes` per GPU) and one cudaEventRecord; then cudaEventSynchronize on each GPU's event.
/// With `copies`, each round first issues them (cudaMemcpyPeerAsync, or a kernel graph with
/// floor_call::kernel_graph, on a stream of the source GPU, then an event there) and each receiving
/// GPU's stream waits for its copies' events (cudaStreamWaitEvent) before its call: the floor of an
/// op whose operand must move first. Buffers, streams and events are made by the constructor and
/// freed by the destructor. Calls leave the current device as they found it. Not thread-safe: one
/// thread drives an object.
class async_floor {
 public:
  /// Throws invalid_argument for a copy naming a GPU outside 0..devices-1.
  async_floor(int devices, std::size_t bytes, const std::vector<device_link>& copies = {},
              floor_call call = floor_call::memset);
  ~async_floor();
  async_floor(const async_floor&) = delete;
  async_floor& operator=(const async_floor&) = delete;
  /// `length` (>= 1) rounds of the calls back to back (a chain), without waiting.
  void issue(int length = 1);
  /// cudaEventSynchronize on each GPU's last event.
  void wait();

 private:
  struct state;
  std::unique_ptr<state> state_;
  std::size_t bytes_;
};
/// async_floor's calls with one issuing thread per GPU: each GPU's cudaMemsetAsync and
/// cudaEventRecord run on a thread of its own (started before timing, spinning on a counter for
/// the next round), so the calls of different GPUs overlap; the timed thread starts a round,
/// waits until every GPU's calls returned, then synchronizes each event. The floor of a small op
/// on `devices` GPUs however the host spreads its issuing.
[[nodiscard]] baseline_seconds time_async_floor_threaded(int devices, std::size_t bytes,
                                                         int repeat);
/// async_floor's calls as one CUDA graph for all GPUs, captured once from GPU 0's stream: it
/// forks to every other GPU's stream through an event, each GPU's cudaMemsetAsync of `bytes`,
/// and joins back; each round is one cudaGraphLaunch and one cudaStreamSynchronize. What a small
/// op would cost the host if it were launched as one multi-GPU graph rather than a launch and an
/// event per GPU. Throws runtime_error if the driver cannot capture or instantiate it (the
/// stream is left usable).
[[nodiscard]] baseline_seconds time_graph_floor(int devices, std::size_t bytes, int repeat);

}  // namespace poolscope::bench::detail
