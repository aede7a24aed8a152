#include "poolscope/profiler/cupti_collector.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <unordered_map>

#include "detail/cupti_seam.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/log.hpp"

namespace poolscope::profiler {

namespace seam = detail::cupti;

// ---------------------------------------------------------------------------------------------
// Names

std::string_view to_string(activity_kind k) noexcept {
  switch (k) {
    case activity_kind::kernel:
      return "kernel";
    case activity_kind::memcpy:
      return "memcpy";
    case activity_kind::memset:
      return "memset";
    case activity_kind::memory:
      return "memory";
    case activity_kind::synchronization:
      return "synchronization";
    case activity_kind::runtime_api:
      return "runtime_api";
    case activity_kind::driver_api:
      return "driver_api";
    case activity_kind::marker:
      return "marker";
  }
  return "unknown";
}

std::string_view to_string(copy_kind k) noexcept {
  switch (k) {
    case copy_kind::unknown:
      return "unknown";
    case copy_kind::htod:
      return "HtoD";
    case copy_kind::dtoh:
      return "DtoH";
    case copy_kind::htoa:
      return "HtoA";
    case copy_kind::atoh:
      return "AtoH";
    case copy_kind::atoa:
      return "AtoA";
    case copy_kind::atod:
      return "AtoD";
    case copy_kind::dtoa:
      return "DtoA";
    case copy_kind::dtod:
      return "DtoD";
    case copy_kind::htoh:
      return "HtoH";
    case copy_kind::ptop:
      return "PtoP";
  }
  return "unknown";
}

std::string_view to_string(memory_kind k) noexcept {
  switch (k) {
    case memory_kind::unknown:
      return "unknown";
    case memory_kind::pageable:
      return "pageable";
    case memory_kind::pinned:
      return "pinned";
    case memory_kind::device:
      return "device";
    case memory_kind::array:
      return "array";
    case memory_kind::managed:
      return "managed";
    case memory_kind::device_static:
      return "device_static";
    case memory_kind::managed_static:
      return "managed_static";
  }
  return "unknown";
}

std::string_view to_string(sync_kind k) noexcept {
  switch (k) {
    case sync_kind::unknown:
      return "synchronization";
    case sync_kind::event_synchronize:
      return "cudaEventSynchronize";
    case sync_kind::stream_wait_event:
      return "cudaStreamWaitEvent";
    case sync_kind::stream_synchronize:
      return "cudaStreamSynchronize";
    case sync_kind::context_synchronize:
      return "cudaDeviceSynchronize";
  }
  return "synchronization";
}

namespace {

struct kind_switch {
  std::string_view name;
  bool cupti_options::*field;
};
constexpr std::array<kind_switch, 8> kind_switches{{
    {"kernels", &cupti_options::kernels},
    {"copies", &cupti_options::copies},
    {"memsets", &cupti_options::memsets},
    {"memory", &cupti_options::memory},
    {"sync", &cupti_options::synchronization},
    {"runtime", &cupti_options::runtime_api},
    {"driver", &cupti_options::driver_api},
    {"markers", &cupti_options::markers},
}};

std::string_view trimmed(std::string_view s) noexcept {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) {
    return {};
  }
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

}  // namespace

cupti_options with_activity_kinds(std::string_view list, cupti_options base) {
  for (const kind_switch& k : kind_switches) {
    base.*k.field = false;
  }
  bool any = false;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    const std::string_view name = trimmed(list.substr(at, comma - at));
    at = comma + 1;
    if (name.empty()) {
      continue;
    }
    if (name == "all") {
      for (const kind_switch& k : kind_switches) {
        base.*k.field = true;
      }
      any = true;
      continue;
    }
    const auto* it = std::find_if(kind_switches.begin(), kind_switches.end(),
                                  [&](const kind_switch& k) { return k.name == name; });
    if (it == kind_switches.end()) {
      throw invalid_argument("poolscope: unknown CUPTI activity kind '" + std::string(name) +
                             "' (expected all or kernels, copies, memsets, memory, sync, "
                             "runtime, driver, markers)");
    }
    base.*it->field = true;
    any = true;
  }
  if (!any) {
    throw invalid_argument("poolscope: empty list of CUPTI activity kinds '" + std::string(list) +
                           "' (to collect none, do not start a collector)");
  }
  base.attach_nvtx = base.markers;
  return base;
}

std::string activity_kinds_of(const cupti_options& o) {
  std::string out;
  std::size_t on = 0;
  for (const kind_switch& k : kind_switches) {
    if (o.*k.field) {
      out += (out.empty() ? "" : ",") + std::string(k.name);
      ++on;
    }
  }
  return on == kind_switches.size() ? "all" : out;
}

std::string_view to_string(cupti_state s) noexcept {
  switch (s) {
    case cupti_state::off:
      return "off";
    case cupti_state::running:
      return "running";
    case cupti_state::unavailable:
      return "unavailable";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Clock

std::uint64_t cupti_timestamp() noexcept {
  return hooks::now_ns();
}

std::int64_t estimate_clock_offset(ns_clock other, ns_clock now, int samples) noexcept {
  std::uint64_t best_width = UINT64_MAX;
  std::int64_t offset = 0;
  for (int i = 0; i < (samples > 0 ? samples : 1); ++i) {
    const std::uint64_t a = now();
    const std::uint64_t o = other();
    const std::uint64_t b = now();
    const std::uint64_t width = b >= a ? b - a : UINT64_MAX;
    if (width < best_width) {
      best_width = width;
      offset = static_cast<std::int64_t>(a + width / 2 - o);
    }
  }
  return offset;
}

// ---------------------------------------------------------------------------------------------
// activity_buffer_pool

activity_buffer_pool::activity_buffer_pool(std::size_t count, std::size_t bytes)
    : count_(count), bytes_((bytes + 7) & ~std::size_t{7}) {
  if (count == 0 || bytes == 0) {
    throw invalid_argument("poolscope: activity_buffer_pool needs buffers (count " +
                           std::to_string(count) + ", bytes " + std::to_string(bytes) + ")");
  }
  if (bytes_ > SIZE_MAX / count_) {
    throw invalid_argument("poolscope: activity_buffer_pool of " + std::to_string(count) +
                           " buffers of " + std::to_string(bytes) + " bytes overflows");
  }
  storage_ = static_cast<std::uint8_t*>(::operator new (count_* bytes_, std::align_val_t{64}));
  free_.reserve(count_);
  for (std::size_t i = count_; i > 0; --i) {
    free_.push_back(storage_ + (i - 1) * bytes_);
  }
}

activity_buffer_pool::~activity_buffer_pool() {
  ::operator delete (storage_, std::align_val_t{64});
}

std::uint8_t* activity_buffer_pool::acquire() noexcept {
  std::lock_guard lock(mutex_);
  if (free_.empty()) {
    ++refused_;
    return nullptr;
  }
  std::uint8_t* b = free_.back();
  free_.pop_back();
  return b;
}

bool activity_buffer_pool::owns(const std::uint8_t* p) const noexcept {
  if (p < storage_ || p >= storage_ + count_ * bytes_) {
    return false;
  }
  return static_cast<std::size_t>(p - storage_) % bytes_ == 0;
}

void activity_buffer_pool::release(std::uint8_t* buffer) noexcept {
  std::lock_guard lock(mutex_);
  if (!owns(buffer) || free_.size() >= count_) {
    ++foreign_;
    return;
  }
  for (const std::uint8_t* f : free_) {
    if (f == buffer) {
      ++foreign_;  // released twice
      return;
    }
  }
  free_.push_back(buffer);
}

std::size_t activity_buffer_pool::available() const noexcept {
  std::lock_guard lock(mutex_);
  return free_.size();
}

std::uint64_t activity_buffer_pool::refused() const noexcept {
  std::lock_guard lock(mutex_);
  return refused_;
}

std::uint64_t activity_buffer_pool::foreign() const noexcept {
  std::lock_guard lock(mutex_);
  return foreign_;
}

// ---------------------------------------------------------------------------------------------
// Collector state and CUPTI's callbacks

struct cupti_collector::state {
  state(activity_sink s, const cupti_options& o)
      : sink(std::move(s)), pool(o.buffer_count, o.buffer_bytes) {}

  activity_sink sink;
  activity_buffer_pool pool;
  std::atomic<cupti_state> st{cupti_state::off};
  std::atomic<bool> deliver{false};  // records go to the sink (false once stop() flushed)
  bool used = false;
  std::atomic<clock_mode> clock{clock_mode::callback};
  std::atomic<std::int64_t> offset_ns{0};
  std::atomic<std::uint64_t> records{0};
  std::atomic<std::uint64_t> dropped{0};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<std::uint64_t> unmapped{0};
  // CUPTI reports OS thread ids itself (cuptiSetThreadIdType): no API callbacks, no mapping.
  std::atomic<bool> system_thread_ids{false};
  std::atomic<std::uint64_t> unknown{0};
  std::vector<seam::kind> enabled;
  mutable std::mutex mutex;  // guards the strings below
  std::string reason;
  std::string nvtx_note;
  std::vector<std::string> refused_kinds;
  bool nvtx = false;
};

namespace {

std::mutex g_owner_mutex;                           // serialises start and stop of every collector
std::mutex g_callback_mutex;                        // held while a callback uses the active state
std::shared_ptr<cupti_collector::state> g_active;   // guarded by g_callback_mutex
std::shared_ptr<cupti_collector::state> g_retired;  // a stopped state CUPTI still holds buffers of

// CUPTI names threads by the low 32 bits of pthread_self(); the OS id comes from each thread
// itself, once, on its first CUDA/NVTX call while a collector is subscribed.
std::mutex g_threads_mutex;
std::unordered_map<std::uint32_t, std::uint64_t> g_threads;
thread_local bool t_thread_noted = false;

void note_thread() noexcept {
  if (t_thread_noted) {
    return;
  }
  t_thread_noted = true;
  try {
    const auto key = static_cast<std::uint32_t>(pthread_self());
    std::lock_guard lock(g_threads_mutex);
    g_threads[key] = hooks::current_thread_id();
  } catch (...) {
    t_thread_noted = false;  // no memory: try again on a later call
  }
}

bool map_thread(std::uint64_t& thread) {
  std::lock_guard lock(g_threads_mutex);
  const auto it = g_threads.find(static_cast<std::uint32_t>(thread));
  if (it == g_threads.end()) {
    return false;
  }
  thread = it->second;
  return true;
}

void on_request(std::uint8_t** buffer, std::size_t* size) noexcept {
  std::lock_guard lock(g_callback_mutex);
  if (g_active == nullptr) {
    return;
  }
  *buffer = g_active->pool.acquire();
  *size = *buffer != nullptr ? g_active->pool.buffer_bytes() : 0;
}

void on_complete(std::uint8_t* buffer, std::size_t /*size*/, std::size_t valid) noexcept {
  std::lock_guard lock(g_callback_mutex);
  cupti_collector::state* s = nullptr;
  if (g_active != nullptr && g_active->pool.owns(buffer)) {
    s = g_active.get();
  } else if (g_retired != nullptr && g_retired->pool.owns(buffer)) {
    s = g_retired.get();
  }
  if (s == nullptr) {
    return;  // not ours: nothing we may free
  }
  if (s->deliver.load(std::memory_order_acquire)) {
    const std::int64_t offset =
        s->clock.load(std::memory_order_relaxed) == clock_mode::offset ? s->offset_ns.load() : 0;
    const std::uint64_t skipped =
        seam::for_each_record(buffer, valid, [s, offset](const device_activity& raw) {
          device_activity d = raw;
          if (offset != 0) {
            d.start_ns = to_process_clock(d.start_ns, offset);
            d.end_ns = to_process_clock(d.end_ns, offset);
          }
          const bool host_side = d.kind == activity_kind::runtime_api ||
                                 d.kind == activity_kind::driver_api ||
                                 d.kind == activity_kind::marker;
          if (host_side && d.thread != 0 && !s->system_thread_ids.load(std::memory_order_relaxed) &&
              !map_thread(d.thread)) {
            s->unmapped.fetch_add(1, std::memory_order_relaxed);
          }
          s->records.fetch_add(1, std::memory_order_relaxed);
          s->sink(d);
        });
    s->unknown.fetch_add(skipped, std::memory_order_relaxed);
  }
  s->dropped.fetch_add(seam::take_dropped_records(), std::memory_order_relaxed);
  s->completed.fetch_add(1, std::memory_order_relaxed);
  s->pool.release(buffer);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// cupti_collector

cupti_collector::cupti_collector(activity_sink sink, cupti_options options)
    : options_(options), state_(std::make_shared<state>(std::move(sink), options_)) {}

cupti_collector::~cupti_collector() {
  stop();
}

std::string cupti_collector::library_path() {
  return seam::library_path();
}

std::vector<std::string> cupti_collector::device_names() {
  std::string why;
  const int n = seam::device_count(why);
  std::vector<std::string> names;
  for (int d = 0; d < n; ++d) {
    names.push_back(seam::device_name(d));
  }
  return names;
}

bool cupti_collector::start() {
  std::lock_guard owner(g_owner_mutex);
  state& s = *state_;
  if (s.used) {
    throw logic_error(
        "poolscope: a cupti_collector collects once; create a new one to start again");
  }
  s.used = true;
  const auto unavailable = [&s](std::string why) {
    {
      std::lock_guard lock(s.mutex);
      s.reason = why;
    }
    s.st.store(cupti_state::unavailable, std::memory_order_release);
    log(log_level::warn, "poolscope: CUPTI device activity is off: " + why +
                             "; the timeline goes on with host-side events only");
    return false;
  };
  {
    std::lock_guard lock(g_callback_mutex);
    if (g_active != nullptr) {
      return unavailable("another poolscope collector is running in this process");
    }
  }
  std::string why;
  if (seam::device_count(why) == 0) {
    return unavailable("no usable CUDA device or driver (" + why + ")");
  }
  // OS thread ids from CUPTI itself when it can: otherwise every API call goes through a
  // callback of ours to learn its thread (a few hundred ns per call: most of the tracing cost).
  const bool system_ids = seam::use_system_thread_ids().ok();
  s.system_thread_ids.store(system_ids, std::memory_order_relaxed);
  seam::result r = seam::subscribe(system_ids ? nullptr : &note_thread);
  if (!r.ok()) {
    if (system_ids) {
      seam::use_default_thread_ids();
    }
    if (r.taken()) {
      return unavailable("CUPTI is already taken by another client" +
                         (r.holder.empty() ? std::string() : " (" + r.holder + ")") +
                         ", e.g. Nsight Systems, Nsight Compute or another profiler (" + r.name +
                         ")");
    }
    return unavailable("cuptiSubscribe failed: " + r.name);
  }
  const auto undo = [&] {
    for (const seam::kind k : s.enabled) {
      seam::disable(k);
    }
    s.enabled.clear();
    seam::unsubscribe();
    if (s.system_thread_ids.load(std::memory_order_relaxed)) {
      seam::use_default_thread_ids();
    }
    std::lock_guard lock(g_callback_mutex);
    g_active = nullptr;
  };
  r = seam::register_buffers(&on_request, &on_complete);
  if (!r.ok()) {
    undo();
    return unavailable("cuptiActivityRegisterCallbacks failed: " + r.name);
  }
  if (options_.timestamp_callback && seam::register_timestamp(&cupti_timestamp).ok()) {
    s.clock.store(clock_mode::callback);
  } else {
    s.offset_ns.store(estimate_clock_offset(&seam::timestamp_clock, &hooks::now_ns));
    s.clock.store(clock_mode::offset);
  }
  if (options_.markers) {
    std::lock_guard lock(s.mutex);
    const char* current = std::getenv("NVTX_INJECTION64_PATH");
    const std::string lib = seam::library_path();
    if (!options_.attach_nvtx) {
      s.nvtx = current != nullptr &&
               std::string_view(current).find("libcupti") != std::string_view::npos;
      s.nvtx_note = s.nvtx ? "NVTX_INJECTION64_PATH names libcupti" : "attach_nvtx is off";
    } else if (current == nullptr || *current == '\0') {
      if (!lib.empty() && setenv("NVTX_INJECTION64_PATH", lib.c_str(), 0) == 0) {
        s.nvtx = true;
        s.nvtx_note = "libcupti set as the NVTX tool (" + lib +
                      "); modules that initialised NVTX earlier keep no tool";
      } else {
        s.nvtx_note = "the path of libcupti is unknown: no NVTX markers";
      }
    } else if (std::string_view(current).find("libcupti") != std::string_view::npos) {
      s.nvtx = true;
      s.nvtx_note = std::string("NVTX_INJECTION64_PATH names libcupti (") + current + ")";
    } else {
      s.nvtx_note = std::string("NVTX_INJECTION64_PATH names another tool (") + current +
                    "): CUPTI sees no NVTX markers";
    }
  }
  struct wanted {
    seam::kind k;
    bool on;
  };
  const wanted kinds[] = {
      {seam::kind::concurrent_kernel, options_.kernels},
      {seam::kind::memcpy, options_.copies},
      {seam::kind::memcpy2, options_.copies},
      {seam::kind::memset, options_.memsets},
      {seam::kind::memory2, options_.memory},
      {seam::kind::synchronization, options_.synchronization},
      {seam::kind::runtime, options_.runtime_api},
      {seam::kind::driver, options_.driver_api},
      {seam::kind::marker, options_.markers},
  };
  s.deliver.store(true, std::memory_order_release);
  {
    // Published before the first kind is enabled: from here on, CUPTI's callbacks find it.
    std::lock_guard lock(g_callback_mutex);
    g_active = state_;
  }
  for (const wanted& w : kinds) {
    if (!w.on) {
      continue;
    }
    r = seam::enable(w.k);
    if (r.ok()) {
      s.enabled.push_back(w.k);
    } else {
      std::lock_guard lock(s.mutex);
      s.refused_kinds.push_back(std::string(seam::kind_name(w.k)) + " (" + r.name + ")");
    }
  }
  if (s.enabled.empty()) {
    std::string list;
    {
      std::lock_guard lock(s.mutex);
      for (const std::string& k : s.refused_kinds) {
        list += (list.empty() ? "" : ", ") + k;
      }
    }
    s.deliver.store(false, std::memory_order_release);
    undo();
    return unavailable("CUPTI enabled no activity kind" + (list.empty() ? "" : ": " + list));
  }
  if (options_.flush_period_ms != 0) {
    (void)seam::set_flush_period(options_.flush_period_ms);
  }
  s.st.store(cupti_state::running, std::memory_order_release);
  return true;
}

void cupti_collector::flush() noexcept {
  if (running()) {
    (void)seam::flush_all(true);
  }
}

void cupti_collector::stop() noexcept {
  std::lock_guard owner(g_owner_mutex);
  state& s = *state_;
  if (s.st.load(std::memory_order_acquire) != cupti_state::running) {
    return;
  }
  (void)seam::flush_all(true);
  for (const seam::kind k : s.enabled) {
    seam::disable(k);
  }
  (void)seam::flush_all(true);
  if (options_.flush_period_ms != 0) {
    (void)seam::set_flush_period(0);
  }
  s.deliver.store(false, std::memory_order_release);
  s.dropped.fetch_add(seam::take_dropped_records(), std::memory_order_relaxed);
  seam::unsubscribe();
  if (s.system_thread_ids.load(std::memory_order_relaxed)) {
    seam::use_default_thread_ids();
  }
  {
    std::lock_guard lock(g_callback_mutex);
    g_active = nullptr;
    if (s.pool.available() != s.pool.count()) {
      // CUPTI still holds buffers: keep their memory alive rather than free it under CUPTI.
      g_retired = state_;
      log(log_level::debug,
          "poolscope: CUPTI kept activity buffers after the final flush; "
          "they stay allocated");
    } else if (g_retired == state_) {
      g_retired = nullptr;
    }
  }
  s.st.store(cupti_state::off, std::memory_order_release);
}

bool cupti_collector::running() const noexcept {
  return state_->st.load(std::memory_order_acquire) == cupti_state::running;
}

cupti_status cupti_collector::status() const {
  const state& s = *state_;
  cupti_status out;
  out.state = s.st.load(std::memory_order_acquire);
  out.clock = s.clock.load();
  out.offset_ns = s.offset_ns.load();
  out.records = s.records.load(std::memory_order_relaxed);
  out.dropped_records = s.dropped.load(std::memory_order_relaxed);
  out.buffers_refused = s.pool.refused();
  out.buffers_completed = s.completed.load(std::memory_order_relaxed);
  out.unmapped_threads = s.unmapped.load(std::memory_order_relaxed);
  out.system_thread_ids = s.system_thread_ids.load(std::memory_order_relaxed);
  out.unknown_records = s.unknown.load(std::memory_order_relaxed);
  out.buffer_bytes = s.pool.buffer_bytes();
  out.buffer_count = s.pool.count();
  std::lock_guard lock(s.mutex);
  out.reason = s.reason;
  out.nvtx_note = s.nvtx_note;
  out.nvtx_attached = s.nvtx;
  out.refused_kinds = s.refused_kinds;
  return out;
}

}  // namespace poolscope::profiler
