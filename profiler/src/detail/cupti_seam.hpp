// The CUPTI seam: the one place in poolscope that calls CUPTI (and the few CUDA runtime calls the
// collector needs: device count and names). Everything above it (cupti_collector, timeline)
// sees plain types and is tested on the CPU with synthetic records.
//
// Conventions:
// - Functions returning `result` never throw: the result carries CUPTI's code and name.
// - The buffer and timestamp callbacks are plain function pointers: CUPTI keeps one set per
//   process, so the collector routes them to its active instance itself.
// - for_each_record converts CUPTI's structs (the versions of the CUDA 13 headers:
//   CUpti_ActivityKernel10, Memcpy6, MemcpyPtoP4, Memset4, Memory4, Synchronization2, API,
//   Marker2) into device_activity with CUPTI's own timestamps and thread ids (the collector puts
//   them on poolscope's clock and OS thread ids). Views in a record are valid during the call.
// Preconditions: none beyond those stated per function; every function may be called without a
// GPU or driver (CUPTI then answers with an error code).
// Thread safety: as CUPTI's (its calls are thread-safe); the registered callbacks are called on
// CUPTI's threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "poolscope/profiler/cupti_collector.hpp"

namespace poolscope::profiler::detail::cupti {

/// The outcome of a CUPTI call.
struct result {
  int code = 0;        ///< CUptiResult (0: success)
  std::string name;    ///< "CUPTI_SUCCESS", "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED", ...
  std::string holder;  ///< subscribe when taken: the client holding CUPTI, if CUPTI says
  [[nodiscard]] bool ok() const noexcept { return code == 0; }
  /// True if another CUPTI client holds the subscriber slot.
  [[nodiscard]] bool taken() const noexcept;
};

/// CUPTI asks for an empty buffer: set *buffer (nullptr to refuse) and *size.
using request_fn = void (*)(std::uint8_t** buffer, std::size_t* size) noexcept;
/// CUPTI hands back a buffer holding `valid` bytes of records.
using complete_fn = void (*)(std::uint8_t* buffer, std::size_t size, std::size_t valid) noexcept;
/// Returns a timestamp in ns.
using timestamp_fn = std::uint64_t (*)() noexcept;
/// Called on the calling thread at the entry of every CUDA runtime/driver API and NVTX call.
using api_thread_fn = void (*)() noexcept;

/// CUDA devices present (cudaGetDeviceCount); 0 with `why` set to the error name otherwise.
[[nodiscard]] int device_count(std::string& why) noexcept;
/// The name of CUDA device `device` ("" if it cannot be read).
[[nodiscard]] std::string device_name(int device) noexcept;

/// Subscribes to CUPTI's callback API (which also tells whether another client holds CUPTI:
/// then it fails with taken()). With `on_api`, enables the runtime, driver and NVTX callback
/// domains and routes their entries to it (a callback on every API call: costly); with nullptr,
/// enables no domain.
[[nodiscard]] result subscribe(api_thread_fn on_api) noexcept;
/// cuptiSetThreadIdType(SYSTEM): API and marker records then carry OS thread ids (gettid).
[[nodiscard]] result use_system_thread_ids() noexcept;
/// Sets CUPTI's thread ids back to its default.
void use_default_thread_ids() noexcept;
/// Undoes subscribe. No-op if not subscribed.
void unsubscribe() noexcept;

/// cuptiActivityRegisterCallbacks with trampolines to `request` and `complete`.
[[nodiscard]] result register_buffers(request_fn request, complete_fn complete) noexcept;
/// cuptiActivityRegisterTimestampCallback.
[[nodiscard]] result register_timestamp(timestamp_fn fn) noexcept;
/// cuptiGetTimestamp (0 on failure).
[[nodiscard]] std::uint64_t timestamp() noexcept;
/// cuptiGetTimestamp as an ns_clock (for estimate_clock_offset).
[[nodiscard]] std::uint64_t timestamp_clock() noexcept;

/// The activity kinds the collector enables.
enum class kind : std::uint8_t {
  concurrent_kernel,
  memcpy,
  memcpy2,
  memset,
  memory2,
  synchronization,
  runtime,
  driver,
  marker,
};
/// CUPTI's name of the kind ("CONCURRENT_KERNEL", ...).
[[nodiscard]] const char* kind_name(kind k) noexcept;
/// cuptiActivityEnable.
[[nodiscard]] result enable(kind k) noexcept;
/// cuptiActivityDisable (errors ignored).
void disable(kind k) noexcept;
/// cuptiActivityFlushAll, forced or not.
result flush_all(bool forced) noexcept;
/// cuptiActivityFlushPeriod.
result set_flush_period(std::uint32_t ms) noexcept;
/// cuptiActivityGetNumDroppedRecords for the global queue (resets CUPTI's count).
[[nodiscard]] std::uint64_t take_dropped_records() noexcept;

/// Converts each record in `buffer` (`valid` bytes) and passes it to `fn`. Returns the number of
/// records of kinds it does not convert (skipped).
std::uint64_t for_each_record(std::uint8_t* buffer, std::size_t valid,
                              const std::function<void(const device_activity&)>& fn) noexcept;

/// The file libcupti was loaded from ("" if unknown).
[[nodiscard]] std::string library_path() noexcept;

}  // namespace poolscope::profiler::detail::cupti
