// The plug-in's options beyond choosing a pool: sizing (POOLSCOPE_LIMIT,
// POOLSCOPE_INITIAL_POOL_SIZE, POOLSCOPE_MAX_POOL_SIZE, POOLSCOPE_RELEASE_THRESHOLD), the trace
// (POOLSCOPE_TRACE), the OOM callback and the count of frees naming a device without a pool.
// Kept apart from plugin.cpp's pool bookkeeping; plugin.cpp calls these at a pool's creation,
// around an allocation that fails, after a free, and when a free names no pool.
//
//   pool_sizing sizing = read_pool_sizing();            // throws invalid_argument naming the
//   auto res = cap_resource(std::move(res), sizing);     //   variable and its value
//   apply_sizing(*alloc, sizing, device);
//
// Thread safety: every function is thread-safe. Errors: read_pool_sizing throws; nothing else
// throws but install_env_trace, whose failure plugin.cpp logs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/resource.hpp"
#include "poolscope_alloc.h"

namespace poolscope::plugin {

inline constexpr std::size_t no_size = std::numeric_limits<std::size_t>::max();

/// The sizing variables of the environment (no_size where unset).
struct pool_sizing {
  std::size_t limit = no_size;              ///< POOLSCOPE_LIMIT: allocator::set_limit
  std::size_t initial = 0;                  ///< POOLSCOPE_INITIAL_POOL_SIZE: reserved at creation
  std::size_t max_pool = no_size;           ///< POOLSCOPE_MAX_POOL_SIZE: cap on upstream bytes
  std::size_t release_threshold = no_size;  ///< POOLSCOPE_RELEASE_THRESHOLD: cached bytes kept
};

/// A byte count as the variables take it: "1073741824", "512M", "20G", "1.5GiB" (binary units).
/// Throws invalid_argument naming `variable` and `text`.
[[nodiscard]] std::size_t parse_env_bytes(const char* variable, const std::string& text);

/// The sizing variables, parsed. Throws invalid_argument naming the first bad one.
[[nodiscard]] pool_sizing read_pool_sizing();

/// `upstream` wrapped so that it hands out at most `sizing.max_pool` bytes in all (a request past
/// it is upstream exhaustion: the pool releases its cache, retries, then fails); `upstream` itself
/// when no cap is set.
[[nodiscard]] std::unique_ptr<pool::resource> cap_resource(std::unique_ptr<pool::resource> upstream,
                                                           const pool_sizing& sizing);

/// Sets the limit and reserves the initial size (a block taken and given back, which a caching
/// pool then holds). Throws out_of_memory if the initial size cannot be had.
void apply_sizing(pool::allocator& a, const pool_sizing& sizing);

/// After a free: returns the pool's cached bytes to its resource when they exceed the threshold.
void after_free(pool::allocator& a, const pool_sizing& sizing) noexcept;

/// poolscope_set_oom_callback's state.
void set_oom_callback(poolscope_oom_callback callback, void* user_data) noexcept;
/// Calls the OOM callback for a request that did not fit; true if it asks for a retry. False
/// when none is set.
[[nodiscard]] bool oom_callback_asks_retry(int device, std::size_t size) noexcept;

/// A free naming `device`, which has no pool: logged with the pointer and counted.
void report_bad_free(int device, const void* ptr, std::size_t size) noexcept;
/// Frees counted by report_bad_free for `device` (0 for a device out of range).
[[nodiscard]] std::uint64_t bad_frees(int device) noexcept;

/// POOLSCOPE_TRACE=FILE: a timeline (pool events and memory counters; CUPTI's device activity
/// when `gpu`) started now and written at exit. Nothing when the variable is unset. Throws
/// runtime_error if the file cannot be created.
void install_env_trace(bool gpu);

}  // namespace poolscope::plugin
