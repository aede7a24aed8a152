// The profiler's CUDA seam for GPU timing: the only place the function profiler calls the CUDA
// runtime. Everything above it is written once and runs on the CPU (where gpu_available() is
// false and nothing here is called).
//
// Preconditions: call anything but gpu_available() only after gpu_available() returned true.
// Events are opaque handles (cudaEvent_t) created with timing enabled on the device of the stream
// they are acquired for, whichever device is current; record them only on streams of that device.
// Error convention: nothing throws. Functions return false / query_status::error on a CUDA
// failure and put the CUDA error name in `*error` when given (callers log it and disable GPU
// timing: instrumentation failures disable the collector, never the program).
// Thread safety: all functions are thread-safe (the event pool has a mutex; the rest are plain
// CUDA runtime calls, which are thread-safe).
#pragma once

#include <cstdint>

namespace poolscope::profiler::detail::cuda_timing {

/// An event handle (a cudaEvent_t).
using event_handle = void*;

/// True if at least one CUDA device is usable. Evaluated once (cudaGetDeviceCount), cached.
[[nodiscard]] bool gpu_available() noexcept;

/// The calling thread's current device, or -1 on error.
[[nodiscard]] int current_device() noexcept;

/// An event with timing enabled of the device of `stream` (a cudaStream_t; the legacy default
/// stream: the current device), from a pool (created when the pool is empty, with that device
/// current for the call); nullptr on failure.
[[nodiscard]] event_handle acquire_event(void* stream, const char** error = nullptr) noexcept;
/// Returns `e` to the pool of the device it was acquired on (it may still be pending).
void release_event(event_handle e) noexcept;
/// Events acquire_event() has created since the process started (the rest came from the pool).
[[nodiscard]] std::uint64_t events_created() noexcept;

/// cudaEventRecord(e, stream).
[[nodiscard]] bool record(event_handle e, void* stream, const char** error = nullptr) noexcept;

enum class query_status : std::uint8_t { ready, not_ready, error };
/// cudaEventQuery(e).
[[nodiscard]] query_status query(event_handle e, const char** error = nullptr) noexcept;
/// cudaEventSynchronize(e).
[[nodiscard]] bool synchronize(event_handle e, const char** error = nullptr) noexcept;
/// Nanoseconds between two completed events (cudaEventElapsedTime, 0.5 us resolution).
[[nodiscard]] bool elapsed_ns(event_handle start, event_handle end, std::uint64_t& out,
                              const char** error = nullptr) noexcept;

}  // namespace poolscope::profiler::detail::cuda_timing
