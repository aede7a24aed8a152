// Builds allocators and resources by name: what the CLI, the C ABI plug-in and benchmarks use.
//
//   auto res = poolscope::pool::make_resource("host", /*device=*/0);
//   auto pool = poolscope::pool::make_allocator("bfc", *res);   // bfc behind per-thread caches
//   auto bare = poolscope::pool::make_allocator("bfc", *res, {.thread_cache = false});
//
// Composition: "bfc" and "best_fit" come behind a thread_cache_adaptor unless the options say
// otherwise (a thread's repeated sizes then take no shared lock); "naive" and "stream_pool"
// come as they are. The composed allocator carries the strategy's name ("bfc/host").
// Thread safety: the functions are thread-safe; what they return follows its own class comment.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/resource.hpp"
#include "poolscope/pool/thread_cache_adaptor.hpp"

namespace poolscope::pool {

/// How make_allocator composes a strategy.
struct allocator_options {
  /// A thread_cache_adaptor in front of bfc and best_fit (naive and stream_pool never get one).
  bool thread_cache = true;
  /// Its bounds. In front of bfc, max_block_bytes is capped at bfc's largest small request
  /// (bfc_options::small_request_max): a cached chunk cannot merge with its free neighbours, and
  /// large segments are where bfc's fit on variable-length work comes from.
  thread_cache_adaptor_options cache{};
};

/// Strategy names accepted by make_allocator, in a stable order.
[[nodiscard]] std::vector<std::string> allocator_names();
/// Resource names accepted by make_resource.
[[nodiscard]] std::vector<std::string> resource_names();

/// A new allocator of strategy `name` over `upstream` (which must outlive it), composed as
/// allocator_options{} says. Throws invalid_argument naming `name` if it is not one of
/// allocator_names().
[[nodiscard]] std::unique_ptr<allocator> make_allocator(std::string_view name, resource& upstream);
/// The same, composed as `options` says.
[[nodiscard]] std::unique_ptr<allocator> make_allocator(std::string_view name, resource& upstream,
                                                        const allocator_options& options);

/// A new resource: "host", "cuda", "cuda_async", "pinned". `device` selects the GPU for device
/// resources. Throws invalid_argument for an unknown name, device_unavailable without a GPU.
[[nodiscard]] std::unique_ptr<resource> make_resource(std::string_view name, int device = 0);

}  // namespace poolscope::pool
