// The CUDA seam of poolscope::darray: the ONE header through which the darray component reaches
// the CUDA runtime, cuBLAS and NCCL (cuda_backend.cpp and kernels.cu include nothing else from
// those libraries). The planner, the executor and the host backend never include it.
//
// Preconditions
// - device_count() first: without a driver or a GPU every other CUDA call fails (it returns 0
//   then, and make_cuda_backend turns that into device_unavailable).
// - Kernels are launched, streams, events and cuBLAS handles are created on the calling thread's
//   current device: wrap such calls in a device_guard for the device they belong to.
// - A stream passed to a call of another device is an error of the caller (the runtime reports
//   cudaErrorInvalidResourceHandle); cudaStreamWaitEvent and cudaMemcpyPeerAsync may mix devices.
//   cudaGraphLaunch and cudaEventRecord take a stream of any device, whichever is current (the
//   graph and the event being the stream's device's; checked on GPUs under compute-sanitizer:
//   docs/perf.md, "No device switch for a kept graph"); the backend launches kept graphs that
//   way (device_guard's std::defer_lock).
//
// Error conventions
// - Every call returning cudaError_t, cublasStatus_t or ncclResult_t is checked with the project's
//   one check, POOLSCOPE_CUDA_CHECK (poolscope/detail/cuda_check*.hpp), which throws cuda_error
//   carrying the API ("CUDA", "cuBLAS", "NCCL"), the call's source text, file:line, the library's
//   error name and numeric code. For CUDA the runtime's last-error state is cleared first, so a
//   failure never leaks into a later cudaGetLastError().
// - Kernel launches are checked by their own call's status (cudaLaunchKernel, cudaGraphLaunch:
//   kernels.cu has no <<<...>>>); faults inside a kernel surface at the next synchronizing call.
// - Release paths (destructors, deferred frees) are noexcept: they run the call through
//   log_failure, which logs a cuda_error at error level and swallows it.
//
// Thread safety: every function here is thread-safe (the libraries are, except that one cuBLAS
// handle or one NCCL communicator must not be used by two threads at once: callers serialize).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <exception>
#include <mutex>
#include <string>

#include "poolscope/detail/cuda_check.hpp"
#include "poolscope/detail/cuda_check_cublas.hpp"
#include "poolscope/detail/cuda_check_nccl.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

namespace poolscope::darray::detail::seam {

/// Throws cuda_error for a failed call (poolscope/detail/cuda_check.hpp).
template <typename Status>
[[noreturn]] void raise(Status s, const char* call, const char* file, int line) {
  ::poolscope::detail::raise_api_error(s, call, file, line);
}

/// Runs `f` (which may throw) and logs instead of throwing: for destructors and release paths.
template <typename F>
void log_failure(const char* what, F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    poolscope::log(log_level::error, std::string("darray cuda backend: ") + what + ": " + e.what());
  } catch (...) {
    poolscope::log(log_level::error, std::string("darray cuda backend: ") + what + ": unknown");
  }
}

/// Number of CUDA devices; 0 when there is no driver or no GPU (the reason in `reason`).
[[nodiscard]] inline int device_count(std::string* reason = nullptr) noexcept {
  int n = 0;
  if (const char* error = nullptr;
      !::poolscope::detail::succeeded(cudaGetDeviceCount(&n), &error)) {
    if (reason != nullptr) {
      *reason = error;
    }
    return 0;
  }
  if (n == 0 && reason != nullptr) {
    *reason = "no device";
  }
  return n;
}

/// The UUID of the GPU of CUDA ordinal `ordinal`, in hex (what tells GPUs apart across processes:
/// a GPU has one UUID whatever number each process gives it).
[[nodiscard]] inline std::string uuid_of(int ordinal) {
  cudaDeviceProp prop{};
  POOLSCOPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  static constexpr char digits[] = "0123456789abcdef";
  std::string uuid;
  for (const char byte : prop.uuid.bytes) {
    const auto b = static_cast<unsigned char>(byte);
    uuid += digits[b >> 4];
    uuid += digits[b & 15];
  }
  return uuid;
}

/// The driver API's `name` as `Fn` (the signature of the driver's `version`, CUDA's numbering:
/// 12000 for 12.0), through the runtime's entry-point query: nothing links libcuda, so programs
/// start without a driver. Throws cuda_error when this driver has no such function.
template <typename Fn>
[[nodiscard]] Fn driver_function(const char* name, int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  POOLSCOPE_CUDA_CHECK(
      cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    raise(CUDA_ERROR_NOT_FOUND, name, __FILE__, __LINE__);
  }
  return reinterpret_cast<Fn>(fn);
}

}  // namespace poolscope::darray::detail::seam

// POOLSCOPE_CUDA_CHECK takes cudaError_t, cublasStatus_t and ncclResult_t here: the traits of the
// three come with the headers included above.

namespace poolscope::darray::detail::seam {

/// Makes `device` current for the scope and restores the previous device at its end (skipping
/// both calls when it already is). Made with std::defer_lock it switches nothing until engage():
/// for a scope whose calls may not need the device current (a graph launched as it is and an
/// event recorded into the device's stream work from any device, see cuda_backend.cpp), so the
/// switch and its restore are paid only where a call needs them. Not copyable; one thread's.
class device_guard {
 public:
  explicit device_guard(int device) : device_(device) { engage(); }
  device_guard(int device, std::defer_lock_t /*unused*/) noexcept : device_(device) {}
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (switched_) {
      log_failure("restore device", [this] { POOLSCOPE_CUDA_CHECK(cudaSetDevice(previous_)); });
    }
  }

  /// Makes the device current (once; later calls do nothing).
  void engage() {
    if (engaged_) {
      return;
    }
    POOLSCOPE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device_) {
      POOLSCOPE_CUDA_CHECK(cudaSetDevice(device_));
      switched_ = true;
    }
    engaged_ = true;
  }

 private:
  int device_ = 0;
  int previous_ = 0;
  bool engaged_ = false;
  bool switched_ = false;
};

}  // namespace poolscope::darray::detail::seam
