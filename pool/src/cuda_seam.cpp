#include "detail/cuda_seam.hpp"

#include <string>

#include "poolscope/log.hpp"

namespace poolscope::pool::detail::cudart {
namespace {

// Runs a release call in a noexcept context: a failure is logged, never thrown.
template <typename F>
void logged(F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    log(log_level::error, e.what());
  } catch (...) {
    log(log_level::error, "poolscope: unknown failure while releasing CUDA resources");
  }
}

// True for cudaSuccess; false (error cleared) for out of memory; throws otherwise.
bool check_alloc(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) {
    return true;
  }
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return false;
  }
  ::poolscope::detail::raise_api_error(status, call, file, line);
}

}  // namespace

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return cudaGetErrorName(status);
  }
  return n == 0 ? "no device" : "a device is present";
}

void require_any_device(const char* who) {
  if (device_count() == 0) {
    throw device_unavailable(std::string("poolscope: ") + who +
                             " needs a CUDA GPU, but none is available (" + no_device_reason() +
                             ")");
  }
}

void require_device(int device, const char* who) {
  // A negative ordinal is wrong on every machine: said first, before any GPU is looked for.
  if (device < 0) {
    throw invalid_argument(std::string("poolscope: ") + who + ": device " + std::to_string(device) +
                           " is not a CUDA device ordinal (ordinals start at 0)");
  }
  require_any_device(who);
  const int n = device_count();
  if (device < 0 || device >= n) {
    throw invalid_argument(std::string("poolscope: ") + who + ": device " + std::to_string(device) +
                           " is not a CUDA device ordinal (" + std::to_string(n) +
                           " device(s) present)");
  }
}

device_guard::device_guard(int device) {
  if (device < 0) {
    return;
  }
  POOLSCOPE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    POOLSCOPE_CUDA_CHECK(cudaSetDevice(device));
    switched_ = true;
  }
}

device_guard::~device_guard() {
  if (switched_) {
    logged([this] { POOLSCOPE_CUDA_CHECK(cudaSetDevice(previous_)); });
  }
}

void* malloc(std::size_t bytes) {
  void* p = nullptr;
  return check_alloc(cudaMalloc(&p, bytes), "cudaMalloc(&p, bytes)", __FILE__, __LINE__) ? p
                                                                                         : nullptr;
}

void free(void* ptr) noexcept {
  logged([ptr] { POOLSCOPE_CUDA_CHECK(cudaFree(ptr)); });
}

cudaMemPool_t mem_pool_create(int device, std::uint64_t release_threshold) {
  int supported = 0;
  POOLSCOPE_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
  if (supported == 0) {
    throw device_unavailable("poolscope: device " + std::to_string(device) +
                             " does not support CUDA memory pools (cudaMallocAsync)");
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  POOLSCOPE_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
  try {
    mem_pool_set_release_threshold(pool, release_threshold);
  } catch (...) {
    mem_pool_destroy(pool);
    throw;
  }
  return pool;
}

void mem_pool_destroy(cudaMemPool_t pool) noexcept {
  logged([pool] { POOLSCOPE_CUDA_CHECK(cudaMemPoolDestroy(pool)); });
}

std::uint64_t mem_pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  std::uint64_t value = 0;
  POOLSCOPE_CUDA_CHECK(cudaMemPoolGetAttribute(pool, attr, &value));
  return value;
}

void mem_pool_set_release_threshold(cudaMemPool_t pool, std::uint64_t bytes) {
  POOLSCOPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &bytes));
}

void mem_pool_trim_to(cudaMemPool_t pool, std::size_t keep_bytes) {
  POOLSCOPE_CUDA_CHECK(cudaMemPoolTrimTo(pool, keep_bytes));
}

void* malloc_async(cudaMemPool_t pool, std::size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  return check_alloc(cudaMallocFromPoolAsync(&p, bytes, pool, stream),
                     "cudaMallocFromPoolAsync(&p, bytes, pool, stream)", __FILE__, __LINE__)
             ? p
             : nullptr;
}

void free_async(void* ptr, cudaStream_t stream) noexcept {
  logged([ptr, stream] { POOLSCOPE_CUDA_CHECK(cudaFreeAsync(ptr, stream)); });
}

void* host_alloc(std::size_t bytes) {
  void* p = nullptr;
  return check_alloc(cudaHostAlloc(&p, bytes, cudaHostAllocPortable),
                     "cudaHostAlloc(&p, bytes, cudaHostAllocPortable)", __FILE__, __LINE__)
             ? p
             : nullptr;
}

void free_host(void* ptr) noexcept {
  logged([ptr] { POOLSCOPE_CUDA_CHECK(cudaFreeHost(ptr)); });
}

cudaEvent_t event_create() {
  cudaEvent_t event = nullptr;
  POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void event_record(cudaEvent_t event, cudaStream_t stream) {
  POOLSCOPE_CUDA_CHECK(cudaEventRecord(event, stream));
}

bool event_query(cudaEvent_t event) {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (status != cudaSuccess) {
    ::poolscope::detail::raise_api_error(status, "cudaEventQuery(event)", __FILE__, __LINE__);
  }
  return true;
}

void event_synchronize(cudaEvent_t event) {
  POOLSCOPE_CUDA_CHECK(cudaEventSynchronize(event));
}

void event_destroy(cudaEvent_t event) noexcept {
  logged([event] { POOLSCOPE_CUDA_CHECK(cudaEventDestroy(event)); });
}

int stream_device(cudaStream_t stream) {
  int device = -1;
  POOLSCOPE_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
  return device;
}

void device_synchronize(int device) {
  device_guard guard{device};
  POOLSCOPE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace poolscope::pool::detail::cudart
