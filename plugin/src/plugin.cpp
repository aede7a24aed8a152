// The C ABI plug-in: one poolscope allocator per device behind poolscope_malloc/poolscope_free.
// See include/poolscope_alloc.h for the contract. No exception may leave these functions.
#include "poolscope_alloc.h"

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "plugin_options.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/profiler/line_profiler.hpp"
#include "poolscope/profiler/output_path.hpp"
#include "poolscope/profiler/recorder.hpp"
#include "poolscope/profiler/snapshot_recorder.hpp"

#ifndef POOLSCOPE_VERSION_STRING
#error "POOLSCOPE_VERSION_STRING must be defined by the build"
#endif

namespace {

using poolscope::log;
using poolscope::log_level;

constexpr const char* default_allocator = "bfc";
constexpr const char* default_resource = "cuda";

/// One device's pool. Created once, never destroyed: PyTorch and CuPy may free blocks while
/// static destructors run, so the pool must outlive every static.
struct device_pool {
  int device = 0;
  std::string allocator_name;
  std::string resource_name;
  std::unique_ptr<poolscope::pool::resource> resource;
  std::unique_ptr<poolscope::pool::allocator> allocator;  // null if creation failed
  std::string error;                                      // why creation failed
  poolscope::plugin::pool_sizing sizing;                  // POOLSCOPE_LIMIT, ... (plugin_options)
};

/// Constant-initialized and trivially destructible, so nothing here runs at exit.
struct device_slot {
  std::once_flag once;
  std::atomic<device_pool*> pool{nullptr};
};
std::array<device_slot, POOLSCOPE_ALLOC_MAX_DEVICES> g_slots;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : std::string(fallback);
}

void log_error(const std::string& message) noexcept {
  log(log_level::error, message);
}

/// Profilers chosen by the environment: POOLSCOPE_RECORD=FILE (the allocator event log),
/// POOLSCOPE_PROFILE=FILE (the line profile as JSON, written at exit) and POOLSCOPE_SNAPSHOT=FILE
/// (the memory snapshot, written at exit and by poolscope_snapshot). Installed process-wide
/// once, before the first pool is built; never destroyed (blocks may be freed during exit).
struct env_profilers {
  std::unique_ptr<poolscope::profiler::recorder> recorder;
  std::unique_ptr<poolscope::profiler::line_profiler> line_profiler;
  std::string profile_path;
  std::unique_ptr<poolscope::profiler::snapshot_recorder> snapshot;
  std::string snapshot_pattern;  // %p and %r expanded when a snapshot is written
};

/// Writes the snapshot to `pattern` (expanded). Never throws; false (logged) on failure.
bool write_snapshot(const env_profilers& e, const std::string& pattern) noexcept {
  try {
    const std::string path = poolscope::profiler::expand_output_path(pattern);
    e.snapshot->write(path);
    return true;
  } catch (const std::exception& ex) {
    log(log_level::error, std::string("poolscope_alloc: snapshot not written: ") + ex.what());
  } catch (...) {
    log(log_level::error, "poolscope_alloc: snapshot not written: unknown error");
  }
  return false;
}
std::atomic<env_profilers*> g_env_profilers{nullptr};
std::once_flag g_env_profilers_once;

/// atexit: flush the event log and write the line profile. Never throws. Frees can still come
/// after this handler (static destructors, exit handlers registered before the plug-in's first
/// use, which run after it): the event log writes those through, one line at a time.
void finish_env_profilers() noexcept {
  env_profilers* e = g_env_profilers.load(std::memory_order_acquire);
  if (e == nullptr) {
    return;
  }
  try {
    if (e->recorder != nullptr) {
      e->recorder->flush_and_write_through();
    }
    if (e->line_profiler != nullptr) {
      std::ofstream out(e->profile_path, std::ios::trunc);
      out << e->line_profiler->report().to_json();
      if (!out) {
        log_error("poolscope_alloc: cannot write the line profile to '" + e->profile_path + "'");
      }
    }
    if (e->snapshot != nullptr) {
      (void)write_snapshot(*e, e->snapshot_pattern);
    }
  } catch (const std::exception& ex) {
    log(log_level::error, std::string("poolscope_alloc: writing profiles at exit: ") + ex.what());
  } catch (...) {
  }
}

/// Why the line profile cannot go to `path` ("" if it can): checked when the profiler is
/// installed, so that a long run does not learn only at exit that its profile is lost. Leaves
/// no file behind that was not there.
std::string profile_path_problem(const std::string& path, const std::string& record_path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  if (existed && !record_path.empty() && std::filesystem::equivalent(path, record_path, ec)) {
    // The profile, written at exit, would overwrite the event log.
    return "it is the file POOLSCOPE_RECORD writes the event log to ('" + record_path + "')";
  }
  errno = 0;
  std::ofstream probe(path, std::ios::app);  // append: an existing file keeps its contents
  if (!probe) {
    const int err = errno;
    return std::string("cannot open it for writing") +
           (err != 0 ? std::string(": ") + std::strerror(err) : std::string());
  }
  probe.close();
  if (!existed) {
    std::filesystem::remove(path, ec);
  }
  return {};
}

void install_env_profilers() noexcept;

/// POOLSCOPE_SNAPSHOT: a snapshot recorder, its path checked now (expanded as it will be at the
/// first write) so that a run does not learn only at exit that its snapshot is lost.
void install_snapshot(env_profilers& e, const char* pattern) noexcept {
  try {
    const std::string problem =
        profile_path_problem(poolscope::profiler::expand_output_path(pattern), "");
    if (!problem.empty()) {
      log_error(std::string("poolscope_alloc: POOLSCOPE_SNAPSHOT ignored: '") + pattern +
                "': " + problem);
      return;
    }
    poolscope::profiler::snapshot_recorder_options options;
    if (const char* n = std::getenv("POOLSCOPE_SNAPSHOT_MAX_ENTRIES"); n != nullptr && *n != '\0') {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(n, &end, 10);
      if (*end != '\0' || v == 0) {
        log_error(std::string("poolscope_alloc: POOLSCOPE_SNAPSHOT_MAX_ENTRIES '") + n +
                  "' is not a positive number; 100000 entries are kept");
      } else {
        options.max_entries = static_cast<std::size_t>(v);
      }
    }
    if (const char* st = std::getenv("POOLSCOPE_SNAPSHOT_STACKS"); st != nullptr && *st != '\0') {
      const std::string_view v = st;
      if (v == "python") {
        options.native_with_python = false;
      } else if (v != "all") {
        log_error(std::string("poolscope_alloc: POOLSCOPE_SNAPSHOT_STACKS '") + st +
                  "' is neither 'all' nor 'python'; native and Python frames are kept (all)");
      }
    }
    // Stacks start at the caller of poolscope_malloc, as the line profile's do.
    options.skip_modules_of.push_back(reinterpret_cast<const void*>(&install_env_profilers));
    e.snapshot = std::make_unique<poolscope::profiler::snapshot_recorder>(options);
    e.snapshot_pattern = pattern;
    poolscope::hooks::install(*e.snapshot);
  } catch (const std::exception& ex) {
    e.snapshot.reset();
    log(log_level::error, std::string("poolscope_alloc: POOLSCOPE_SNAPSHOT ignored: ") + ex.what());
  }
}

void install_env_profilers() noexcept {
  const char* record = std::getenv("POOLSCOPE_RECORD");
  const char* profile = std::getenv("POOLSCOPE_PROFILE");
  const char* snapshot = std::getenv("POOLSCOPE_SNAPSHOT");
  const bool want_record = record != nullptr && *record != '\0';
  bool want_profile = profile != nullptr && *profile != '\0';
  const bool want_snapshot = snapshot != nullptr && *snapshot != '\0';
  if (!want_record && !want_profile && !want_snapshot) {
    return;
  }
  auto* e = new (std::nothrow) env_profilers;
  if (e == nullptr) {
    return;
  }
  if (want_record) {
    try {
      e->recorder = std::make_unique<poolscope::profiler::recorder>(record);
      poolscope::hooks::install(*e->recorder);
    } catch (const std::exception& ex) {
      e->recorder.reset();
      log(log_level::error, std::string("poolscope_alloc: POOLSCOPE_RECORD ignored: ") + ex.what());
    }
  }
  if (want_profile) {
    try {
      const std::string problem =
          profile_path_problem(profile, e->recorder != nullptr ? std::string(record) : "");
      if (!problem.empty()) {
        log_error(std::string("poolscope_alloc: POOLSCOPE_PROFILE ignored: '") + profile +
                  "': " + problem);
        want_profile = false;
      }
    } catch (const std::exception& ex) {
      log(log_level::error,
          std::string("poolscope_alloc: POOLSCOPE_PROFILE ignored: ") + ex.what());
      want_profile = false;
    }
  }
  if (want_profile) {
    try {
      e->profile_path = profile;
      // Stacks start at the caller of poolscope_malloc / poolscope_free: this library's frames
      // are poolscope's own, like those of the libraries it links.
      poolscope::profiler::line_profiler_options options;
      options.skip_modules_of.push_back(reinterpret_cast<const void*>(&install_env_profilers));
      e->line_profiler = std::make_unique<poolscope::profiler::line_profiler>(options);
      poolscope::hooks::install(*e->line_profiler);
    } catch (const std::exception& ex) {
      e->line_profiler.reset();
      log(log_level::error,
          std::string("poolscope_alloc: POOLSCOPE_PROFILE ignored: ") + ex.what());
    }
  }
  if (want_snapshot) {
    install_snapshot(*e, snapshot);
  }
  g_env_profilers.store(e, std::memory_order_release);
  if (std::atexit(finish_env_profilers) != 0) {
    log(log_level::error, "poolscope_alloc: cannot register the exit handler; profiles unwritten");
  }
}

/// POOLSCOPE_TRACE (plugin_options.hpp), with CUPTI unless the pools are on the host resource.
std::once_flag g_env_trace_once;
void install_trace() noexcept {
  try {
    const std::string resource = env_or("POOLSCOPE_RESOURCE", default_resource);
    poolscope::plugin::install_env_trace(resource != "host");
  } catch (const std::exception& e) {
    log(log_level::error, std::string("poolscope_alloc: POOLSCOPE_TRACE ignored: ") + e.what());
  }
}

/// Builds the device's pool from the environment. Never throws: a failure is recorded in the
/// pool (and logged here, once).
device_pool* create_pool(int device) noexcept {
  device_pool* p = new (std::nothrow) device_pool;
  if (p == nullptr) {
    return nullptr;
  }
  try {
    std::call_once(g_env_profilers_once, install_env_profilers);
    std::call_once(g_env_trace_once, install_trace);
  } catch (...) {
    // call_once itself failed: run without the environment's profilers.
  }
  try {
    p->device = device;
    p->allocator_name = env_or("POOLSCOPE_ALLOCATOR", default_allocator);
    p->resource_name = env_or("POOLSCOPE_RESOURCE", default_resource);
    p->sizing = poolscope::plugin::read_pool_sizing();
    p->resource = poolscope::plugin::cap_resource(
        poolscope::pool::make_resource(p->resource_name, device), p->sizing);
    p->allocator = poolscope::pool::make_allocator(p->allocator_name, *p->resource);
    poolscope::plugin::apply_sizing(*p->allocator, p->sizing);
  } catch (const std::exception& e) {
    p->allocator.reset();
    try {
      p->error = e.what();
      log_error("poolscope_alloc: device " + std::to_string(device) +
                ": cannot create allocator '" + p->allocator_name + "' over resource '" +
                p->resource_name + "': " + e.what() +
                "; every allocation on this device will fail");
    } catch (...) {
    }
  } catch (...) {
    p->allocator.reset();
    log(log_level::error, "poolscope_alloc: unknown error while creating a pool");
  }
  return p;
}

/// The device's pool (creating it on first use), or null for a bad device or no host memory.
device_pool* pool_for(int device) noexcept {
  if (device < 0 || device >= POOLSCOPE_ALLOC_MAX_DEVICES) {
    return nullptr;
  }
  device_slot& slot = g_slots[static_cast<std::size_t>(device)];
  device_pool* p = slot.pool.load(std::memory_order_acquire);
  if (p != nullptr) [[likely]] {
    return p;
  }
  try {
    std::call_once(slot.once, [&slot, device] {
      slot.pool.store(create_pool(device), std::memory_order_release);
    });
  } catch (...) {
    return nullptr;  // call_once itself failed (a system error): try again next time
  }
  return slot.pool.load(std::memory_order_acquire);
}

/// The pool of an already-used device, without creating one.
device_pool* existing_pool(int device) noexcept {
  if (device < 0 || device >= POOLSCOPE_ALLOC_MAX_DEVICES) {
    return nullptr;
  }
  return g_slots[static_cast<std::size_t>(device)].pool.load(std::memory_order_acquire);
}

void log_bad_device(const char* fn, int device) noexcept {
  try {
    log_error(std::string("poolscope_alloc: ") + fn + ": device " + std::to_string(device) +
              " is out of range [0, " + std::to_string(POOLSCOPE_ALLOC_MAX_DEVICES) + ")");
  } catch (...) {
  }
}

std::string stats_json(int device) {
  nlohmann::json j = nlohmann::json::object();
  device_pool* p = nullptr;
  if (device >= 0 && device < POOLSCOPE_ALLOC_MAX_DEVICES) {
    p = existing_pool(device);
  }
  if (p != nullptr && p->allocator != nullptr) {
    j = nlohmann::json::parse(p->allocator->stats().to_json());
    j["name"] = p->allocator->name();
  }
  j["device"] = device;
  j["bad_frees"] = poolscope::plugin::bad_frees(device);
  j["initialized"] = p != nullptr && p->allocator != nullptr;
  j["allocator"] =
      p != nullptr ? p->allocator_name : env_or("POOLSCOPE_ALLOCATOR", default_allocator);
  j["resource"] = p != nullptr ? p->resource_name : env_or("POOLSCOPE_RESOURCE", default_resource);
  if (device < 0 || device >= POOLSCOPE_ALLOC_MAX_DEVICES) {
    j["error"] = "device " + std::to_string(device) + " is out of range";
  } else if (p != nullptr && p->allocator == nullptr) {
    j["error"] = p->error;
  }
  // The names come from the environment and may hold any bytes: made valid UTF-8 (U+FFFD)
  // rather than failing the whole report.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// poolscope_stats_json's text, one buffer per thread. Not a thread_local std::string: that is
// destroyed with the thread's other thread_local objects (for the main thread, in exit() before
// the atexit handlers and static destructors run), and a report asked for after that (a
// framework logging its pools at shutdown) used the freed buffer. A plain pointer stays usable;
// the buffer is freed with the thread's thread_local objects, and one asked for after that is
// never freed (one per thread, at its very end).
constinit thread_local char* t_report = nullptr;
constinit thread_local std::size_t t_report_capacity = 0;
constinit thread_local bool t_report_reaped = false;

/// Frees the thread's report buffer when the thread's thread_local objects are destroyed.
struct report_reaper {
  bool armed = false;
  report_reaper() = default;
  report_reaper(const report_reaper&) = delete;
  report_reaper& operator=(const report_reaper&) = delete;
  ~report_reaper() {
    std::free(t_report);
    t_report = nullptr;
    t_report_capacity = 0;
    t_report_reaped = true;
  }
};
thread_local report_reaper t_report_reaper;

/// `text` copied into the thread's report buffer; null if there is no memory for it.
const char* keep_report(const std::string& text) noexcept {
  const std::size_t need = text.size() + 1;
  if (need > t_report_capacity) {
    char* grown = static_cast<char*>(std::realloc(t_report, need));
    if (grown == nullptr) {
      return nullptr;
    }
    if (t_report == nullptr && !t_report_reaped) {
      t_report_reaper.armed = true;  // its first use registers its destructor
    }
    t_report = grown;
    t_report_capacity = need;
  }
  std::memcpy(t_report, text.c_str(), need);
  return t_report;
}

/// Allocates; on out_of_memory asks the OOM callback (plugin_options.hpp), and retries once if
/// it says so. Throws what the last try threw.
void* allocate_or_ask(device_pool& p, int device, std::size_t size, void* stream) {
  try {
    return p.allocator->allocate(poolscope::stream_view{stream}, size);
  } catch (const poolscope::out_of_memory&) {
    if (!poolscope::plugin::oom_callback_asks_retry(device, size)) {
      throw;
    }
  }
  return p.allocator->allocate(poolscope::stream_view{stream}, size);
}

}  // namespace

extern "C" {

POOLSCOPE_ALLOC_API void* poolscope_malloc(ssize_t size, int device, void* stream) {
  if (size < 0) [[unlikely]] {
    try {
      log_error("poolscope_alloc: poolscope_malloc: negative size " + std::to_string(size) +
                " on device " + std::to_string(device) + " rejected");
    } catch (...) {
    }
    return nullptr;
  }
  if (size == 0) {
    return nullptr;
  }
  device_pool* p = pool_for(device);
  if (p == nullptr) [[unlikely]] {
    log_bad_device("poolscope_malloc", device);
    return nullptr;
  }
  if (p->allocator == nullptr) [[unlikely]] {
    return nullptr;  // creation failed; logged once when it did
  }
  try {
    return allocate_or_ask(*p, device, static_cast<std::size_t>(size), stream);
  } catch (const poolscope::out_of_memory& e) {
    log(log_level::error, e.what());
  } catch (const std::exception& e) {
    try {
      log_error(std::string("poolscope_alloc: poolscope_malloc(") + std::to_string(size) +
                "): " + e.what());
    } catch (...) {
    }
  } catch (...) {
    log(log_level::error, "poolscope_alloc: poolscope_malloc: unknown error");
  }
  return nullptr;
}

POOLSCOPE_ALLOC_API void poolscope_free(void* ptr, ssize_t size, int device, void* stream) {
  if (ptr == nullptr) {
    return;
  }
  if (size < 0) [[unlikely]] {
    try {
      log_error("poolscope_alloc: poolscope_free: negative size " + std::to_string(size) +
                " for a block on device " + std::to_string(device) + "; ignored (leaked)");
    } catch (...) {
    }
    return;
  }
  device_pool* p = existing_pool(device);
  if (p == nullptr || p->allocator == nullptr) [[unlikely]] {
    poolscope::plugin::report_bad_free(device, ptr, static_cast<std::size_t>(size));
    return;
  }
  // noexcept: unknown pointers, double frees and wrong sizes are reported by the allocator.
  p->allocator->deallocate(poolscope::stream_view{stream}, ptr, static_cast<std::size_t>(size));
  poolscope::plugin::after_free(*p->allocator, p->sizing);
}

POOLSCOPE_ALLOC_API const char* poolscope_stats_json(int device) {
  const char* failed = "{\"error\":\"poolscope_stats_json failed\"}";
  try {
    const char* kept = keep_report(stats_json(device));
    return kept != nullptr ? kept : failed;
  } catch (...) {
    return failed;
  }
}

POOLSCOPE_ALLOC_API size_t poolscope_release_cached(int device) {
  std::size_t released = 0;
  const int first = device < 0 ? 0 : device;
  const int last = device < 0 ? POOLSCOPE_ALLOC_MAX_DEVICES - 1 : device;
  if (device >= POOLSCOPE_ALLOC_MAX_DEVICES) {
    log_bad_device("poolscope_release_cached", device);
    return 0;
  }
  for (int d = first; d <= last; ++d) {
    device_pool* p = existing_pool(d);
    if (p == nullptr || p->allocator == nullptr) {
      continue;
    }
    try {
      released += p->allocator->release_cached();
    } catch (const std::exception& e) {
      try {
        log_error(std::string("poolscope_alloc: poolscope_release_cached(") + std::to_string(d) +
                  "): " + e.what());
      } catch (...) {
      }
    } catch (...) {
    }
  }
  return released;
}

POOLSCOPE_ALLOC_API void poolscope_set_oom_callback(poolscope_oom_callback callback,
                                                    void* user_data) {
  poolscope::plugin::set_oom_callback(callback, user_data);
}

POOLSCOPE_ALLOC_API int poolscope_snapshot(const char* path) {
  try {
    // Recording starts with the environment's profilers: here at the latest.
    std::call_once(g_env_profilers_once, install_env_profilers);
  } catch (...) {
    return -1;
  }
  const env_profilers* e = g_env_profilers.load(std::memory_order_acquire);
  if (e == nullptr || e->snapshot == nullptr) {
    log(log_level::error,
        "poolscope_alloc: poolscope_snapshot: recording is off (set POOLSCOPE_SNAPSHOT=FILE "
        "before the first allocation)");
    return -1;
  }
  try {
    return write_snapshot(*e, path != nullptr ? std::string(path) : e->snapshot_pattern) ? 0 : -1;
  } catch (...) {
    return -1;
  }
}

POOLSCOPE_ALLOC_API const char* poolscope_version(void) {
  return POOLSCOPE_VERSION_STRING;
}

}  // extern "C"
