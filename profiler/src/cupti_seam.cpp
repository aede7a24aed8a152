#include "detail/cupti_seam.hpp"

#include <cuda_runtime.h>
#include <cupti.h>
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <string_view>

#include "poolscope/detail/cuda_check_cupti.hpp"

namespace poolscope::profiler::detail::cupti {
namespace {

std::atomic<request_fn> g_request{nullptr};
std::atomic<complete_fn> g_complete{nullptr};
std::atomic<timestamp_fn> g_timestamp{nullptr};
std::atomic<api_thread_fn> g_api_thread{nullptr};
CUpti_SubscriberHandle g_subscriber = nullptr;  // guarded by the collector (one at a time)

// Statuses are tested and named through the project's one check (poolscope/detail/cuda_check.hpp),
// without throwing: a failing collector disables itself.
using ::poolscope::detail::succeeded;

result make_result(CUptiResult r) {
  result out;
  out.code = static_cast<int>(r);
  out.name = ::poolscope::detail::api_status<CUptiResult>::name(r);
  return out;
}

void CUPTIAPI on_request(uint8_t** buffer, size_t* size, size_t* max_records) {
  *max_records = 0;
  *buffer = nullptr;
  *size = 0;
  if (const request_fn f = g_request.load(std::memory_order_acquire); f != nullptr) {
    f(buffer, size);
  }
}

void CUPTIAPI on_complete(CUcontext /*ctx*/, uint32_t /*stream*/, uint8_t* buffer, size_t size,
                          size_t valid) {
  if (const complete_fn f = g_complete.load(std::memory_order_acquire); f != nullptr) {
    f(buffer, size, valid);
  }
}

uint64_t CUPTIAPI on_timestamp() {
  const timestamp_fn f = g_timestamp.load(std::memory_order_relaxed);
  return f != nullptr ? f() : 0;
}

void CUPTIAPI on_callback(void* /*userdata*/, CUpti_CallbackDomain /*domain*/,
                          CUpti_CallbackId /*cbid*/, const void* /*data*/) {
  if (const api_thread_fn f = g_api_thread.load(std::memory_order_relaxed); f != nullptr) {
    f();
  }
}

CUpti_ActivityKind to_cupti(kind k) {
  switch (k) {
    case kind::concurrent_kernel:
      return CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    case kind::memcpy:
      return CUPTI_ACTIVITY_KIND_MEMCPY;
    case kind::memcpy2:
      return CUPTI_ACTIVITY_KIND_MEMCPY2;
    case kind::memset:
      return CUPTI_ACTIVITY_KIND_MEMSET;
    case kind::memory2:
      return CUPTI_ACTIVITY_KIND_MEMORY2;
    case kind::synchronization:
      return CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    case kind::runtime:
      return CUPTI_ACTIVITY_KIND_RUNTIME;
    case kind::driver:
      return CUPTI_ACTIVITY_KIND_DRIVER;
    case kind::marker:
      return CUPTI_ACTIVITY_KIND_MARKER;
  }
  return CUPTI_ACTIVITY_KIND_INVALID;
}

// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel": CUPTI's names carry the ABI version.
std::string_view strip_version(const char* name) {
  if (name == nullptr) {
    return {};
  }
  std::string_view s(name);
  const auto v = s.rfind("_v");
  if (v != std::string_view::npos && v + 2 < s.size() &&
      s.find_first_not_of("0123456789", v + 2) == std::string_view::npos) {
    s = s.substr(0, v);
  }
  return s;
}

void convert_api(const CUpti_ActivityAPI& a, device_activity& d) {
  const bool runtime = a.kind == CUPTI_ACTIVITY_KIND_RUNTIME;
  d.kind = runtime ? activity_kind::runtime_api : activity_kind::driver_api;
  d.start_ns = a.start;
  d.end_ns = a.end;
  d.thread = a.threadId;
  d.process = a.processId;
  d.correlation = a.correlationId;
  d.callback_id = a.cbid;
  d.return_value = a.returnValue;
  const char* name = nullptr;
  if (succeeded(cuptiGetCallbackName(
          runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API, a.cbid, &name))) {
    d.name = strip_version(name);
  }
  if (d.name.empty()) {
    d.name = runtime ? "cuda runtime call" : "cuda driver call";
  }
}

// One record; false if its kind is not converted.
bool convert(const CUpti_Activity* r, device_activity& d) {
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto& k = *reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      d.kind = activity_kind::kernel;
      d.start_ns = k.start;
      d.end_ns = k.end;
      d.device = k.deviceId;
      d.context = k.contextId;
      d.stream = k.streamId;
      d.correlation = k.correlationId;
      d.grid = {k.gridX, k.gridY, k.gridZ};
      d.block = {k.blockX, k.blockY, k.blockZ};
      d.static_shared_bytes = k.staticSharedMemory;
      d.dynamic_shared_bytes = k.dynamicSharedMemory;
      d.registers = k.registersPerThread;
      d.name = k.name != nullptr ? std::string_view(k.name) : std::string_view("<unnamed kernel>");
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto& m = *reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      d.kind = activity_kind::memcpy;
      d.start_ns = m.start;
      d.end_ns = m.end;
      d.device = m.deviceId;
      d.context = m.contextId;
      d.stream = m.streamId;
      d.correlation = m.correlationId != 0 ? m.correlationId : m.runtimeCorrelationId;
      d.bytes = m.bytes;
      d.copy = static_cast<copy_kind>(m.copyKind <= 10 ? m.copyKind : 0);
      d.src_kind = static_cast<memory_kind>(m.srcKind <= 7 ? m.srcKind : 0);
      d.dst_kind = static_cast<memory_kind>(m.dstKind <= 7 ? m.dstKind : 0);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY2: {
      const auto& m = *reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(r);
      d.kind = activity_kind::memcpy;
      d.peer = true;
      d.start_ns = m.start;
      d.end_ns = m.end;
      d.device = m.deviceId;
      d.context = m.contextId;
      d.stream = m.streamId;
      d.correlation = m.correlationId;
      d.bytes = m.bytes;
      d.copy = static_cast<copy_kind>(m.copyKind <= 10 ? m.copyKind : 0);
      d.src_kind = static_cast<memory_kind>(m.srcKind <= 7 ? m.srcKind : 0);
      d.dst_kind = static_cast<memory_kind>(m.dstKind <= 7 ? m.dstKind : 0);
      d.src_device = m.srcDeviceId;
      d.dst_device = m.dstDeviceId;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto& m = *reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      d.kind = activity_kind::memset;
      d.start_ns = m.start;
      d.end_ns = m.end;
      d.device = m.deviceId;
      d.context = m.contextId;
      d.stream = m.streamId;
      d.correlation = m.correlationId;
      d.bytes = m.bytes;
      d.dst_kind = static_cast<memory_kind>(m.memoryKind <= 7 ? m.memoryKind : 0);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMORY2: {
      const auto& m = *reinterpret_cast<const CUpti_ActivityMemory4*>(r);
      d.kind = activity_kind::memory;
      d.start_ns = m.timestamp;
      d.end_ns = m.timestamp;
      d.device = m.deviceId;
      d.context = m.contextId;
      d.stream = m.streamId;
      d.correlation = m.correlationId;
      d.bytes = m.bytes;
      d.address = m.address;
      d.process = m.processId;
      d.memory_free = m.memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
      d.dst_kind = static_cast<memory_kind>(
          static_cast<int>(m.memoryKind) <= 7 ? static_cast<int>(m.memoryKind) : 0);
      d.name = d.memory_free ? "cuda free" : "cuda alloc";
      return true;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const auto& s = *reinterpret_cast<const CUpti_ActivitySynchronization2*>(r);
      d.kind = activity_kind::synchronization;
      d.start_ns = s.start;
      d.end_ns = s.end;
      d.context = s.contextId;
      d.stream = s.streamId;
      d.correlation = s.correlationId;
      d.return_value = s.returnValue;
      const auto t = static_cast<int>(s.type);
      d.sync = static_cast<sync_kind>(t >= 0 && t <= 4 ? t : 0);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER:
      convert_api(*reinterpret_cast<const CUpti_ActivityAPI*>(r), d);
      return true;
    case CUPTI_ACTIVITY_KIND_MARKER: {
      const auto& m = *reinterpret_cast<const CUpti_ActivityMarker2*>(r);
      d.kind = activity_kind::marker;
      d.start_ns = m.timestamp;
      d.end_ns = m.timestamp;
      d.marker_id = m.id;
      const auto flags = static_cast<unsigned>(m.flags);
      d.marker = (flags & CUPTI_ACTIVITY_FLAG_MARKER_START) != 0U ? marker_phase::start
                 : (flags & CUPTI_ACTIVITY_FLAG_MARKER_END) != 0U ? marker_phase::end
                                                                  : marker_phase::instant;
      if (m.objectKind == CUPTI_ACTIVITY_OBJECT_THREAD) {
        d.thread = m.objectId.pt.threadId;
        d.process = m.objectId.pt.processId;
      }
      d.name = m.name != nullptr ? std::string_view(m.name) : std::string_view();
      d.domain = m.domain != nullptr ? std::string_view(m.domain) : std::string_view();
      return true;
    }
    default:
      return false;
  }
}

}  // namespace

bool result::taken() const noexcept {
  return code == static_cast<int>(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
}

int device_count(std::string& why) noexcept {
  int n = 0;
  if (const char* error = nullptr; !succeeded(cudaGetDeviceCount(&n), &error)) {
    why = error;
    return 0;
  }
  if (n == 0) {
    why = "no CUDA device";
  }
  return n;
}

std::string device_name(int device) noexcept {
  try {
    cudaDeviceProp p{};
    if (!succeeded(cudaGetDeviceProperties(&p, device))) {
      return {};
    }
    return std::string(p.name);
  } catch (...) {
    return {};
  }
}

result subscribe(api_thread_fn on_api) noexcept {
  try {
    g_api_thread.store(on_api, std::memory_order_relaxed);
    char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 1] = {};
    CUpti_SubscriberParams params{};
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "poolscope";
    params.oldSubscriberName = holder;
    params.oldSubscriberSize = sizeof holder - 1;
    CUpti_SubscriberHandle h = nullptr;
    result r = make_result(cuptiSubscribe_v2(&h, &on_callback, nullptr, &params));
    if (!r.ok()) {
      r.holder = holder;
      return r;
    }
    g_subscriber = h;
    if (on_api == nullptr) {
      return r;
    }
    for (const CUpti_CallbackDomain d :
         {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_CB_DOMAIN_NVTX}) {
      // A domain that cannot be enabled only costs the thread mapping for its calls.
      (void)cuptiEnableDomain(1, h, d);
    }
    return r;
  } catch (...) {
    return result{-1, "std::bad_alloc", {}};
  }
}

void unsubscribe() noexcept {
  if (g_subscriber != nullptr) {
    (void)cuptiUnsubscribe(g_subscriber);
    g_subscriber = nullptr;
  }
  g_api_thread.store(nullptr, std::memory_order_relaxed);
}

result use_system_thread_ids() noexcept {
  try {
    return make_result(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM));
  } catch (...) {
    return result{-1, "std::bad_alloc", {}};
  }
}

void use_default_thread_ids() noexcept {
  (void)cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_DEFAULT);
}

result register_buffers(request_fn request, complete_fn complete) noexcept {
  g_request.store(request, std::memory_order_release);
  g_complete.store(complete, std::memory_order_release);
  try {
    return make_result(cuptiActivityRegisterCallbacks(&on_request, &on_complete));
  } catch (...) {
    return result{-1, "std::bad_alloc", {}};
  }
}

result register_timestamp(timestamp_fn fn) noexcept {
  g_timestamp.store(fn, std::memory_order_relaxed);
  try {
    return make_result(cuptiActivityRegisterTimestampCallback(&on_timestamp));
  } catch (...) {
    return result{-1, "std::bad_alloc", {}};
  }
}

std::uint64_t timestamp() noexcept {
  uint64_t t = 0;
  return succeeded(cuptiGetTimestamp(&t)) ? t : 0;
}

std::uint64_t timestamp_clock() noexcept {
  return timestamp();
}

const char* kind_name(kind k) noexcept {
  switch (k) {
    case kind::concurrent_kernel:
      return "CONCURRENT_KERNEL";
    case kind::memcpy:
      return "MEMCPY";
    case kind::memcpy2:
      return "MEMCPY2";
    case kind::memset:
      return "MEMSET";
    case kind::memory2:
      return "MEMORY2";
    case kind::synchronization:
      return "SYNCHRONIZATION";
    case kind::runtime:
      return "RUNTIME";
    case kind::driver:
      return "DRIVER";
    case kind::marker:
      return "MARKER";
  }
  return "?";
}

result enable(kind k) noexcept {
  try {
    return make_result(cuptiActivityEnable(to_cupti(k)));
  } catch (...) {
    return result{-1, "std::bad_alloc", {}};
  }
}

void disable(kind k) noexcept {
  (void)cuptiActivityDisable(to_cupti(k));
}

result flush_all(bool forced) noexcept {
  try {
    return make_result(cuptiActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0));
  } catch (...) {
    return result{-1, "std::bad_alloc", {}};
  }
}

result set_flush_period(std::uint32_t ms) noexcept {
  try {
    return make_result(cuptiActivityFlushPeriod(ms));
  } catch (...) {
    return result{-1, "std::bad_alloc", {}};
  }
}

std::uint64_t take_dropped_records() noexcept {
  size_t dropped = 0;
  return succeeded(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped)) ? dropped : 0;
}

std::uint64_t for_each_record(std::uint8_t* buffer, std::size_t valid,
                              const std::function<void(const device_activity&)>& fn) noexcept {
  std::uint64_t skipped = 0;
  if (buffer == nullptr || valid == 0) {
    return 0;
  }
  CUpti_Activity* r = nullptr;
  while (succeeded(cuptiActivityGetNextRecord(buffer, valid, &r))) {
    device_activity d;
    if (!convert(r, d)) {
      ++skipped;
      continue;
    }
    try {
      fn(d);
    } catch (...) {
      // The sink must not throw; a failing record is lost, the rest of the buffer is not.
      ++skipped;
    }
  }
  return skipped;
}

std::string library_path() noexcept {
  try {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&cuptiGetVersion), &info) != 0 &&
        info.dli_fname != nullptr) {
      return info.dli_fname;
    }
  } catch (...) {
  }
  return {};
}

}  // namespace poolscope::profiler::detail::cupti
