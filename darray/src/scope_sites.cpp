#include "scope_sites.hpp"

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace poolscope::darray::detail {
namespace {

// Sites "<prefix><name of op i>" for every op up to `last`, registered on first use.
template <typename Op>
std::vector<profiler::scope_site> sites(std::string_view prefix, Op last) {
  std::vector<profiler::scope_site> v;
  for (std::size_t i = 0; i <= static_cast<std::size_t>(last); ++i) {
    v.push_back(profiler::scope_site::named(
        std::string(prefix) + std::string(to_string(static_cast<Op>(i))),
        profiler::category::darray_compute));
  }
  return v;
}

}  // namespace

const profiler::scope_site& site_of(unary_op op) {
  static const auto table = sites("darray.", unary_op::sqrt);
  return table[static_cast<std::size_t>(op)];
}

const profiler::scope_site& site_of(binary_op op) {
  static const auto table = sites("darray.", binary_op::pow);
  return table[static_cast<std::size_t>(op)];
}

const profiler::scope_site& site_of(reduce_op op) {
  static const auto table = sites("darray.", reduce_op::min);
  return table[static_cast<std::size_t>(op)];
}

const profiler::scope_site& accumulate_site(reduce_op op) {
  static const auto table = sites("darray.accumulate.", reduce_op::min);
  return table[static_cast<std::size_t>(op)];
}

const profiler::scope_site& reduce_site(reduce_op op) {
  static const auto table = sites("darray.reduce.", reduce_op::min);
  return table[static_cast<std::size_t>(op)];
}

}  // namespace poolscope::darray::detail
