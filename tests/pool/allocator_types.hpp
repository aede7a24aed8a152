// The fixture types the typed allocator suites run over. Add a line per allocator here; never
// parameterise by strings (STYLE.md rule 9).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"

namespace poolscope::pool::testing {

/// An allocator of type Alloc over a fresh host resource (capacity unlimited unless given).
template <typename Alloc>
struct on_host {
  using allocator_type = Alloc;
  static constexpr bool needs_gpu = false;
  static std::unique_ptr<resource> make_resource(std::size_t capacity = SIZE_MAX) {
    return std::make_unique<host_resource>(capacity);
  }
  static std::unique_ptr<allocator> make(resource& r) { return std::make_unique<Alloc>(r); }
};

using host_allocators = ::testing::Types<on_host<naive_allocator>, on_host<best_fit_allocator>>;

}  // namespace poolscope::pool::testing
