#include "detail/cuda_timing_seam.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "poolscope/detail/cuda_check.hpp"

namespace poolscope::profiler::detail::cuda_timing {
namespace {

// Every call's status goes through succeeded(), which leaves no error behind in the runtime's
// last-error state: the application's next cudaGetLastError() must not report the profiler's
// failure as its own.
using ::poolscope::detail::succeeded;

// Free events per device, plus the device each handed-out event belongs to. Leaked: scopes may
// close during static destruction.
struct event_pool {
  std::mutex mutex;
  std::unordered_map<int, std::vector<cudaEvent_t>> free;
  std::unordered_map<cudaEvent_t, int> device_of;
};
event_pool& pool() {
  static auto* p = new event_pool;
  return *p;
}

constexpr std::size_t k_max_free_per_device = 4096;

std::atomic<std::uint64_t> g_created{0};

}  // namespace

bool gpu_available() noexcept {
  static const bool available = [] {
    int n = 0;
    return succeeded(cudaGetDeviceCount(&n)) && n > 0;
  }();
  return available;
}

int current_device() noexcept {
  int d = -1;
  return succeeded(cudaGetDevice(&d)) ? d : -1;
}

namespace {
// A new timing event of `device`, made current for the call when it is not (and the caller's
// device restored after).
cudaEvent_t create_event_on(int device, const char** error) noexcept {
  const int previous = current_device();
  if (previous < 0) {
    if (error != nullptr) {
      *error = "cudaGetDevice failed";
    }
    return nullptr;
  }
  if (previous != device && !succeeded(cudaSetDevice(device), error)) {
    return nullptr;
  }
  cudaEvent_t e = nullptr;
  const bool created = succeeded(cudaEventCreateWithFlags(&e, cudaEventDefault), error);
  if (previous != device) {
    // Back to the device the caller had (it was valid just now).
    (void)succeeded(cudaSetDevice(previous));
  }
  return created ? e : nullptr;
}
}  // namespace

event_handle acquire_event(void* stream, const char** error) noexcept {
  // The stream's device, which need not be the current one (a library may enqueue on another
  // device's stream without switching to it); the legacy default stream is the current device's.
  int device = -1;
  if (!succeeded(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device), error)) {
    return nullptr;
  }
  auto& p = pool();
  try {
    {
      std::lock_guard lock(p.mutex);
      auto& list = p.free[device];
      if (!list.empty()) {
        cudaEvent_t e = list.back();
        list.pop_back();
        return e;
      }
    }
    cudaEvent_t e = create_event_on(device, error);
    if (e == nullptr) {
      return nullptr;
    }
    g_created.fetch_add(1, std::memory_order_relaxed);
    try {
      std::lock_guard lock(p.mutex);
      p.device_of.emplace(e, device);
    } catch (...) {
      (void)succeeded(cudaEventDestroy(e));
      throw;
    }
    return e;
  } catch (...) {
    if (error != nullptr) {
      *error = "out of host memory";
    }
    return nullptr;
  }
}

std::uint64_t events_created() noexcept {
  return g_created.load(std::memory_order_relaxed);
}

void release_event(event_handle e) noexcept {
  if (e == nullptr) {
    return;
  }
  auto* ev = static_cast<cudaEvent_t>(e);
  auto& p = pool();
  try {
    std::lock_guard lock(p.mutex);
    auto it = p.device_of.find(ev);
    if (it != p.device_of.end()) {
      auto& list = p.free[it->second];
      if (list.size() < k_max_free_per_device) {
        list.push_back(ev);
        return;
      }
      p.device_of.erase(it);
    }
  } catch (...) {
    // Fall through: destroy it instead of pooling it.
  }
  (void)succeeded(cudaEventDestroy(ev));
}

bool record(event_handle e, void* stream, const char** error) noexcept {
  return succeeded(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(stream)),
                   error);
}

query_status query(event_handle e, const char** error) noexcept {
  const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(e));
  if (rc == cudaErrorNotReady) {
    return query_status::not_ready;
  }
  return succeeded(rc, error) ? query_status::ready : query_status::error;
}

bool synchronize(event_handle e, const char** error) noexcept {
  return succeeded(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), error);
}

bool elapsed_ns(event_handle start, event_handle end, std::uint64_t& out,
                const char** error) noexcept {
  float ms = 0.0F;
  if (!succeeded(
          cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)),
          error)) {
    return false;
  }
  out = ms <= 0.0F ? 0 : static_cast<std::uint64_t>(std::llround(static_cast<double>(ms) * 1e6));
  return true;
}

}  // namespace poolscope::profiler::detail::cuda_timing
