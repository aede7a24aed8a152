#include "poolscope/pool/factory.hpp"

#include "poolscope/error.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"

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
  return {"naive", "best_fit"};
}

std::vector<std::string> resource_names() {
  return {"host"};
}

std::unique_ptr<allocator> make_allocator(std::string_view name, resource& upstream) {
  if (name == "naive") {
    return std::make_unique<naive_allocator>(upstream);
  }
  if (name == "best_fit") {
    return std::make_unique<best_fit_allocator>(upstream);
  }
  throw invalid_argument("poolscope: unknown allocator '" + std::string(name) + "' (expected " +
                         joined(allocator_names()) + ")");
}

std::unique_ptr<resource> make_resource(std::string_view name, int /*device*/) {
  if (name == "host") {
    return std::make_unique<host_resource>();
  }
  throw invalid_argument("poolscope: unknown resource '" + std::string(name) + "' (expected " +
                         joined(resource_names()) + ")");
}

}  // namespace poolscope::pool
