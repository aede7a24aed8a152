#include "poolscope/hooks/event.hpp"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace poolscope::hooks {

std::string_view to_string(event_kind k) noexcept {
  switch (k) {
    case event_kind::pool_malloc:
      return "pool_malloc";
    case event_kind::pool_free:
      return "pool_free";
    case event_kind::device_alloc:
      return "device_alloc";
    case event_kind::device_free:
      return "device_free";
    case event_kind::split:
      return "split";
    case event_kind::merge:
      return "merge";
    case event_kind::release:
      return "release";
    case event_kind::oom:
      return "oom";
    case event_kind::limit_hit:
      return "limit_hit";
    case event_kind::invalid_free:
      return "invalid_free";
    case event_kind::segment_map:
      return "segment_map";
    case event_kind::segment_unmap:
      return "segment_unmap";
  }
  return "unknown";
}

std::string_view to_string(event_phase p) noexcept {
  switch (p) {
    case event_phase::pre:
      return "pre";
    case event_phase::post:
      return "post";
    case event_phase::instant:
      return "instant";
  }
  return "unknown";
}

std::string_view to_string(free_error e) noexcept {
  switch (e) {
    case free_error::none:
      return "none";
    case free_error::unknown_pointer:
      return "unknown_pointer";
    case free_error::double_free:
      return "double_free";
    case free_error::size_mismatch:
      return "size_mismatch";
    case free_error::null_with_size:
      return "null_with_size";
  }
  return "unknown";
}

std::uint64_t now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ULL +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

namespace {
// Initial-exec and constant-initialized: read on every event without a TLS call or a guard.
[[gnu::tls_model("initial-exec")]] thread_local constinit std::uint64_t t_tid = 0;
}  // namespace

std::uint64_t current_thread_id() noexcept {
  if (t_tid == 0) [[unlikely]] {
    t_tid = static_cast<std::uint64_t>(::syscall(SYS_gettid));
  }
  return t_tid;
}

}  // namespace poolscope::hooks
