// darray semantics on host devices (docs/darray.md, "Semantics"): integer wrap-around, division by
// zero and saturation, floating NaN rules, partial operands completed first, chunk_to_host of a
// partial array, and errors that tell two backends apart. cuda_backend_gpu_test.cpp runs the same
// checks (semantics_checks.hpp) on GPUs.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/error.hpp"
#include "semantics_checks.hpp"

namespace poolscope::darray {
namespace {

TEST(darray_semantics, integers_wrap_divide_by_zero_to_zero_and_saturate) {
  for (const int devices : {1, 2}) {
    SCOPED_TRACE(devices);
    semantics_checks::check_integer_rules(make_host_backend(devices));
  }
}

TEST(darray_semantics, floating_division_and_nan_propagation) {
  semantics_checks::check_float_rules(make_host_backend(2));
}

TEST(darray_semantics, ops_complete_partial_operands_first) {
  for (const int devices : {1, 2}) {
    SCOPED_TRACE(devices);
    semantics_checks::check_partial_operands(make_host_backend(devices));
  }
}

TEST(darray_semantics, chunk_to_host_of_a_partial_array_is_the_chunks_contribution) {
  semantics_checks::check_partial_chunks(make_host_backend(2));
}

TEST(darray_semantics, an_error_about_two_backends_tells_them_apart) {
  auto one = make_host_backend(2);
  auto two = make_host_backend(2);
  ASSERT_EQ(one->name(), two->name());
  EXPECT_NE(one->id(), two->id());
  EXPECT_EQ(one->label(), "host:2 #" + std::to_string(one->id()));
  const std::vector<float> h(8, 1.0F);
  const auto m = index_map::blocks({8}, 0, 2);
  const auto a = distributed_array<float>::from_host(one, h, {8}, m);
  const auto b = distributed_array<float>::from_host(two, h, {8}, m);
  for (const auto& f : {+[](const distributed_array<float>&x, const distributed_array<float>&y) {
                          static_cast<void>(x + y);
                        },
                        +[](const distributed_array<float>&x, const distributed_array<float>&y) {
                          static_cast<void>(darray::matmul(x, y));
                        }}) {
    try {
      f(a, b);
      ADD_FAILURE() << "operands of two backends were accepted";
    } catch (const invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(one->label()), std::string::npos) << what;
      EXPECT_NE(what.find(two->label()), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace poolscope::darray
