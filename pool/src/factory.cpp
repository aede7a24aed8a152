#include "poolscope/pool/factory.hpp"

#include <algorithm>

#include "poolscope/error.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/cuda_async_resource.hpp"
#include "poolscope/pool/cuda_resource.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"
#include "poolscope/pool/pinned_resource.hpp"
#include "poolscope/pool/stream_pool_allocator.hpp"

namespace poolscope::pool {

namespace {
std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    out += out.empty() ? n : "|" + n;
  }
  return out;
}
}  // namespace

std::vector<std::string> allocator_names() {
  return {"naive", "best_fit", "bfc", "stream_pool"};
}

std::vector<std::string> resource_names() {
  return {"host", "cuda", "cuda_async", "pinned"};
}

std::unique_ptr<allocator> make_allocator(std::string_view name, resource& upstream) {
  return make_allocator(name, upstream, allocator_options{});
}

std::unique_ptr<allocator> make_allocator(std::string_view name, resource& upstream,
                                          const allocator_options& options) {
  if (name == "naive") {
    return std::make_unique<naive_allocator>(upstream);
  }
  if (name == "stream_pool") {
    return std::make_unique<stream_pool_allocator>(upstream);
  }
  std::unique_ptr<allocator> strategy;
  thread_cache_adaptor_options cache = options.cache;
  if (name == "best_fit") {
    strategy = std::make_unique<best_fit_allocator>(upstream);
  } else if (name == "bfc") {
    const bfc_options bfc;
    cache.max_block_bytes = std::min(cache.max_block_bytes, bfc.small_request_max);
    strategy = std::make_unique<bfc_allocator>(upstream, bfc);
  } else {
    throw invalid_argument("poolscope: unknown allocator '" + std::string(name) + "' (expected " +
                           joined(allocator_names()) + ")");
  }
  if (!options.thread_cache) {
    return strategy;
  }
  return std::make_unique<thread_cache_adaptor>(std::move(strategy), cache);
}

std::unique_ptr<resource> make_resource(std::string_view name, int device) {
  if (name == "host") {
    return std::make_unique<host_resource>();
  }
  if (name == "cuda") {
    return std::make_unique<cuda_resource>(device);
  }
  if (name == "cuda_async") {
    return std::make_unique<cuda_async_resource>(device);
  }
  if (name == "pinned") {
    return std::make_unique<pinned_resource>();
  }
  throw invalid_argument("poolscope: unknown resource '" + std::string(name) + "' (expected " +
                         joined(resource_names()) + ")");
}

}  // namespace poolscope::pool
