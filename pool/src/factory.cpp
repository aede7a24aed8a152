#include "poolscope/pool/factory.hpp"

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
  return make_allocator(name, upstream, thread_cache_options{});
}

std::unique_ptr<allocator> make_allocator(std::string_view name, resource& upstream,
                                          const thread_cache_options& thread_cache) {
  if (name == "naive") {
    return std::make_unique<naive_allocator>(upstream);
  }
  if (name == "best_fit") {
    return std::make_unique<best_fit_allocator>(upstream, thread_cache);
  }
  if (name == "bfc") {
    bfc_options o;
    o.thread_cache = thread_cache;
    return std::make_unique<bfc_allocator>(upstream, o);
  }
  if (name == "stream_pool") {
    return std::make_unique<stream_pool_allocator>(upstream);
  }
  throw invalid_argument("poolscope: unknown allocator '" + std::string(name) + "' (expected " +
                         joined(allocator_names()) + ")");
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
