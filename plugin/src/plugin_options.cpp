// The plug-in's sizing, trace, OOM callback and bad-free count (plugin_options.hpp).
#include "plugin_options.hpp"

#include <array>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "poolscope/byte_size.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"
#include "poolscope/profiler/output_path.hpp"
#include "poolscope/profiler/timeline.hpp"

namespace poolscope::plugin {

namespace {

// A resource that hands out at most `cap` bytes in all: past it, try_allocate returns nullptr
// (upstream exhaustion), so the pool releases its cache, retries and then throws out_of_memory.
class capped_resource final : public pool::resource {
 public:
  capped_resource(std::unique_ptr<pool::resource> upstream, std::size_t cap)
      : upstream_(std::move(upstream)), cap_(cap) {}

 private:
  void* do_try_allocate(stream_view stream, std::size_t bytes) override {
    std::size_t held = held_.load(std::memory_order_relaxed);
    do {
      if (bytes > cap_ - held) {
        return nullptr;
      }
    } while (!held_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
    void* p = upstream_->try_allocate(stream, bytes);
    if (p == nullptr) {
      held_.fetch_sub(bytes, std::memory_order_relaxed);
    }
    return p;
  }
  void do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept override {
    upstream_->deallocate(stream, ptr, bytes);
    held_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  [[nodiscard]] int do_device() const noexcept override { return upstream_->device(); }
  [[nodiscard]] pool::memory_kind do_kind() const noexcept override { return upstream_->kind(); }
  [[nodiscard]] std::string do_name() const override { return upstream_->name(); }
  [[nodiscard]] bool do_stream_ordered() const noexcept override {
    return upstream_->stream_ordered();
  }

  std::unique_ptr<pool::resource> upstream_;
  std::size_t cap_;
  std::atomic<std::size_t> held_{0};
};

std::size_t env_bytes(const char* variable, std::size_t fallback) {
  const char* v = std::getenv(variable);
  return v != nullptr && *v != '\0' ? parse_env_bytes(variable, v) : fallback;
}

struct oom_handler {
  poolscope_oom_callback callback = nullptr;
  void* user_data = nullptr;
};
std::mutex g_oom_mutex;
oom_handler g_oom;  // guarded by g_oom_mutex

// Constant-initialized and trivially destructible: frees may come during exit.
std::array<std::atomic<std::uint64_t>, POOLSCOPE_ALLOC_MAX_DEVICES> g_bad_frees{};

// Never destroyed: frees may come after the exit handler stopped it (they are then ignored).
std::atomic<profiler::timeline*> g_trace{nullptr};

void stop_env_trace() noexcept {
  if (profiler::timeline* t = g_trace.load(std::memory_order_acquire); t != nullptr) {
    t->stop();
  }
}

}  // namespace

std::size_t parse_env_bytes(const char* variable, const std::string& text) {
  try {
    return parse_byte_size(text);
  } catch (const std::exception& e) {
    throw invalid_argument(std::string(variable) + "='" + text + "': " + e.what());
  }
}

pool_sizing read_pool_sizing() {
  pool_sizing s;
  s.limit = env_bytes("POOLSCOPE_LIMIT", no_size);
  s.initial = env_bytes("POOLSCOPE_INITIAL_POOL_SIZE", 0);
  s.max_pool = env_bytes("POOLSCOPE_MAX_POOL_SIZE", no_size);
  s.release_threshold = env_bytes("POOLSCOPE_RELEASE_THRESHOLD", no_size);
  if (s.initial > s.max_pool) {
    throw invalid_argument("POOLSCOPE_INITIAL_POOL_SIZE=" + std::to_string(s.initial) +
                           " exceeds POOLSCOPE_MAX_POOL_SIZE=" + std::to_string(s.max_pool));
  }
  if (s.initial > s.limit) {
    throw invalid_argument("POOLSCOPE_INITIAL_POOL_SIZE=" + std::to_string(s.initial) +
                           " exceeds POOLSCOPE_LIMIT=" + std::to_string(s.limit));
  }
  return s;
}

std::unique_ptr<pool::resource> cap_resource(std::unique_ptr<pool::resource> upstream,
                                             const pool_sizing& sizing) {
  if (sizing.max_pool == no_size) {
    return upstream;
  }
  return std::make_unique<capped_resource>(std::move(upstream), sizing.max_pool);
}

void apply_sizing(pool::allocator& a, const pool_sizing& sizing) {
  if (sizing.limit != no_size) {
    a.set_limit(sizing.limit);
  }
  if (sizing.initial != 0) {
    void* p = a.allocate(stream_view{}, sizing.initial);
    a.deallocate(stream_view{}, p, sizing.initial);
  }
}

void after_free(pool::allocator& a, const pool_sizing& sizing) noexcept {
  if (sizing.release_threshold == no_size) {
    return;
  }
  try {
    if (a.stats().cached_bytes > sizing.release_threshold) {
      (void)a.release_cached();
    }
  } catch (...) {
    // A failed release leaves the cache as it was: the next free tries again.
  }
}

void set_oom_callback(poolscope_oom_callback callback, void* user_data) noexcept {
  const std::lock_guard lock(g_oom_mutex);
  g_oom = {callback, user_data};
}

bool oom_callback_asks_retry(int device, std::size_t size) noexcept {
  oom_handler h;
  {
    const std::lock_guard lock(g_oom_mutex);
    h = g_oom;
  }
  // Called outside the lock: the callback may set another one.
  return h.callback != nullptr && h.callback(device, size, h.user_data) != 0;
}

void report_bad_free(int device, const void* ptr, std::size_t size) noexcept {
  if (device >= 0 && device < POOLSCOPE_ALLOC_MAX_DEVICES) {
    g_bad_frees[static_cast<std::size_t>(device)].fetch_add(1, std::memory_order_relaxed);
  }
  try {
    char where[32];
    std::snprintf(where, sizeof where, "%p", ptr);
    log(log_level::error, "poolscope_alloc: bad free of " + std::string(where) + " (" +
                              std::to_string(size) + " bytes) on device " + std::to_string(device) +
                              ", which has no pool: the block is not poolscope's (or the device "
                              "is wrong); ignored, counted in bad_frees");
  } catch (...) {
  }
}

std::uint64_t bad_frees(int device) noexcept {
  if (device < 0 || device >= POOLSCOPE_ALLOC_MAX_DEVICES) {
    return 0;
  }
  return g_bad_frees[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
}

void install_env_trace(bool gpu) {
  const char* path = std::getenv("POOLSCOPE_TRACE");
  if (path == nullptr || *path == '\0') {
    return;
  }
  profiler::timeline_options o;
  o.trace_path = profiler::expand_output_path(path);
  o.cupti = gpu;  // device activity where there are devices; the pool events either way
  auto t = std::make_unique<profiler::timeline>(std::move(o));
  t->start();
  g_trace.store(t.release(), std::memory_order_release);
  if (std::atexit(stop_env_trace) != 0) {
    log(log_level::error,
        "poolscope_alloc: cannot register the exit handler; the trace stays "
        "incomplete");
  }
}

}  // namespace poolscope::plugin
