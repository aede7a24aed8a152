// The CUDA seam of poolscope::pool: the ONE header through which the pool component calls the
// CUDA runtime. Everything above it (resources, the stream pool's event source) is written
// against these functions, so the logic is the same on the CPU and on a GPU.
//
// Preconditions
// - Call device_count() (or require_device()) before anything else that needs a GPU: without a
//   driver or a GPU every other call here fails with a cuda_error (cudaErrorInsufficientDriver,
//   cudaErrorNoDevice), which callers turn into device_unavailable up front.
// - Functions taking a `device` act on that device (a device_guard makes it current and restores
//   the previous one); functions without one act on the calling thread's current device, or on
//   the object passed (a pool, an event, a stream), as the CUDA runtime does.
// - Streams are passed as cudaStream_t; a null stream is the legacy default stream.
//
// Error conventions
// - Every CUDA call is checked with POOLSCOPE_CUDA_CHECK, which throws poolscope::cuda_error
//   (api "CUDA", the call's source text, file:line, cudaGetErrorName and the numeric code) and
//   clears the runtime's last-error state first, so a failure never leaks into a later
//   cudaGetLastError().
// - Allocation functions (malloc, malloc_async, host_alloc) return nullptr when the device or
//   host is out of memory (cudaErrorMemoryAllocation, cleared with cudaGetLastError) and throw
//   cuda_error for every other failure.
// - Release functions (free, free_async, free_host, event_destroy, mem_pool_destroy, the
//   device_guard destructor) are noexcept: a failure is logged at error level and otherwise
//   ignored, because they run in deallocation paths and destructors.
// - device_count() never throws: it returns 0 when there is no driver or no GPU.
//
// Thread safety: every function is thread-safe (the CUDA runtime is); a device_guard changes the
// calling thread's current device for its scope only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "poolscope/detail/cuda_check.hpp"  // POOLSCOPE_CUDA_CHECK
#include "poolscope/error.hpp"

namespace poolscope::pool::detail::cudart {

/// Number of CUDA devices; 0 when there is no driver or no GPU. Never throws.
[[nodiscard]] int device_count() noexcept;
/// Why device_count() is 0: the CUDA error name ("cudaErrorNoDevice", ...), or "no device".
[[nodiscard]] std::string no_device_reason();
/// Throws device_unavailable (no GPU; the message names `who` and the CUDA reason) or
/// invalid_argument (`device` is not an ordinal in [0, device_count())).
void require_device(int device, const char* who);
/// Throws device_unavailable naming `who` unless at least one GPU is present.
void require_any_device(const char* who);

/// Makes `device` current for the scope and restores the previous device at its end.
/// A negative device leaves the current device alone. Not copyable.
class device_guard {
 public:
  explicit device_guard(int device);
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard();

 private:
  int previous_ = -1;
  bool switched_ = false;
};

/// cudaMalloc on the current device; nullptr when out of memory.
[[nodiscard]] void* malloc(std::size_t bytes);
/// cudaFree. Logs failures.
void free(void* ptr) noexcept;

/// A new memory pool for `device` (pinned device memory, no IPC handles) whose release
/// threshold is `release_threshold` bytes (UINT64_MAX: keep everything until trimmed).
/// Throws device_unavailable if the device does not support memory pools.
[[nodiscard]] cudaMemPool_t mem_pool_create(int device, std::uint64_t release_threshold);
/// cudaMemPoolDestroy. Logs failures.
void mem_pool_destroy(cudaMemPool_t pool) noexcept;
/// Reads a uint64 attribute of `pool` (thresholds, reserved/used byte counters).
[[nodiscard]] std::uint64_t mem_pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr);
/// Sets the release threshold of `pool`.
void mem_pool_set_release_threshold(cudaMemPool_t pool, std::uint64_t bytes);
/// cudaMemPoolTrimTo: releases unused pool memory above `keep_bytes` back to the OS.
void mem_pool_trim_to(cudaMemPool_t pool, std::size_t keep_bytes);
/// cudaMallocFromPoolAsync on `stream`; nullptr when out of memory.
[[nodiscard]] void* malloc_async(cudaMemPool_t pool, std::size_t bytes, cudaStream_t stream);
/// cudaFreeAsync on `stream`. Logs failures.
void free_async(void* ptr, cudaStream_t stream) noexcept;

/// cudaHostAlloc (portable pinned host memory); nullptr when out of memory.
[[nodiscard]] void* host_alloc(std::size_t bytes);
/// cudaFreeHost. Logs failures.
void free_host(void* ptr) noexcept;

/// A new event without timing on the current device.
[[nodiscard]] cudaEvent_t event_create();
/// cudaEventRecord(event, stream).
void event_record(cudaEvent_t event, cudaStream_t stream);
/// True once the event has completed, false while it has not (cudaErrorNotReady, cleared);
/// throws for any other status. Never blocks.
[[nodiscard]] bool event_query(cudaEvent_t event);
/// Blocks until the event has completed.
void event_synchronize(cudaEvent_t event);
/// cudaEventDestroy. Logs failures.
void event_destroy(cudaEvent_t event) noexcept;

/// The device `stream` belongs to (cudaStreamGetDevice; the null stream: the current device).
[[nodiscard]] int stream_device(cudaStream_t stream);

/// cudaDeviceSynchronize on `device` (negative: the current device).
void device_synchronize(int device);

}  // namespace poolscope::pool::detail::cudart
