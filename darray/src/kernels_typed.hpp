// The CUDA backend's kernel entry points for one element type, split so that the kernels compile
// as several translation units in parallel: binary_kernels<T> (element-wise binary ops, the
// largest group) in kernels_binary_<dtype>.cu, typed_kernels<T> (fill, unary ops, reductions,
// gemm) in kernels_other_<dtype>.cu; kernels.cu dispatches on the dtype. Internal to
// kernels*.cu: the contract of each entry is its namesake's in kernels.hpp, with the views already
// checked there. Thread safety: reentrant, as kernels.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "kernels.hpp"

namespace poolscope::darray::detail {

/// Contiguous lines of launch_binary_parts, collapsed (dst, a, b per part) with their element
/// counts; `most` is the largest count.
struct binary_part_lines {
  std::array<std::array<view, 3>, max_binary_parts> lines{};
  std::array<std::int64_t, max_binary_parts> counts{};
  std::size_t parts = 0;
  std::int64_t most = 1;
};

template <typename T>
struct binary_kernels {
  static void binary(const launch_target& on, binary_op op, const view& dst, const view& a,
                     const view& b, const scalar* a_scalar, const scalar* b_scalar);
  static void parts(const launch_target& on, binary_op op, const binary_part_lines& lines);
};

template <typename T>
struct typed_kernels {
  static void fill(const launch_target& on, const view& dst, scalar value);
  static void unary(const launch_target& on, unary_op op, const view& dst, const view& src);
  static void accumulate(const launch_target& on, reduce_op op, const view& acc, const view& src);
  static void reduce(const launch_target& on, reduce_op op, const view& acc, const view& src,
                     int axis, void* scratch);
  static void gemm_accumulate(const launch_target& on, const view& c, const view& a, const view& b);
};

extern template struct binary_kernels<float>;
extern template struct binary_kernels<double>;
extern template struct binary_kernels<std::int32_t>;
extern template struct binary_kernels<std::int64_t>;
extern template struct typed_kernels<float>;
extern template struct typed_kernels<double>;
extern template struct typed_kernels<std::int32_t>;
extern template struct typed_kernels<std::int64_t>;

}  // namespace poolscope::darray::detail
