// Builds allocators and resources by name: what the CLI, the C ABI plug-in and benchmarks use.
//
//   auto res = poolscope::pool::make_resource("host", /*device=*/0);
//   auto pool = poolscope::pool::make_allocator("bfc", *res);
//
// Thread safety: the functions are thread-safe; what they return follows its own class comment.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/resource.hpp"

namespace poolscope::pool {

/// Strategy names accepted by make_allocator, in a stable order.
[[nodiscard]] std::vector<std::string> allocator_names();
/// Resource names accepted by make_resource.
[[nodiscard]] std::vector<std::string> resource_names();

/// A new allocator of strategy `name` over `upstream` (which must outlive it).
/// Throws invalid_argument naming `name` if it is not one of allocator_names().
[[nodiscard]] std::unique_ptr<allocator> make_allocator(std::string_view name, resource& upstream);
/// The same, with the per-thread cache configured by `thread_cache` (allocator.hpp; used by
/// bfc and best_fit, ignored by the others).
[[nodiscard]] std::unique_ptr<allocator> make_allocator(std::string_view name, resource& upstream,
                                                        const thread_cache_options& thread_cache);

/// A new resource: "host", "cuda", "cuda_async", "pinned". `device` selects the GPU for device
/// resources. Throws invalid_argument for an unknown name, device_unavailable without a GPU.
[[nodiscard]] std::unique_ptr<resource> make_resource(std::string_view name, int device = 0);

}  // namespace poolscope::pool
