// The CUDA backend's kernels: the host entry points of kernels.hpp, dispatching on the element
// type to the typed entry points (kernels_typed.hpp) that kernels_binary_<dtype>.cu and
// kernels_other_<dtype>.cu instantiate, and the copy kernels, which depend on the element size
// alone. The kernels themselves are in kernels_impl.cuh.
#include "kernels_impl.cuh"

namespace poolscope::darray::detail {

// ------------------------------------------------------------------------------------------
// Host entry points.

std::size_t reduce_scratch_bytes(int /*sm_count*/) noexcept {
  return static_cast<std::size_t>(reduce_max_blocks) * sizeof(std::int64_t);
}

std::int64_t collapse_jointly(view* views, std::size_t count) noexcept {
  const std::size_t rank = views[0].rank;
  i64 n = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    n *= views[0].extent[d];
  }
  if (n == 0) {
    return 0;
  }
  std::size_t r = 0;
  for (std::size_t d = 0; d < rank; ++d) {
    const i64 e = views[0].extent[d];
    if (e == 1) {
      continue;
    }
    bool merge = r > 0;
    for (std::size_t k = 0; k < count && merge; ++k) {
      merge = views[k].stride[r - 1] == views[k].stride[d] * e;
    }
    for (std::size_t k = 0; k < count; ++k) {
      if (merge) {
        views[k].extent[r - 1] *= e;
        views[k].stride[r - 1] = views[k].stride[d];
      } else {
        views[k].extent[r] = e;
        views[k].stride[r] = views[k].stride[d];
      }
    }
    if (!merge) {
      ++r;
    }
  }
  for (std::size_t k = 0; k < count; ++k) {
    if (r == 0) {
      views[k].extent[0] = 1;
      views[k].stride[0] = 1;
    }
    views[k].rank = std::max<std::size_t>(r, 1);
    for (std::size_t d = views[k].rank; d < max_rank; ++d) {
      views[k].extent[d] = 0;
      views[k].stride[d] = 0;
    }
  }
  return n;
}

// Launches are keyed by their arguments' bytes (launch): the argument types have no padding,
// whose bytes would be whatever the stack held.
static_assert(std::has_unique_object_representations_v<layout<1>> &&
              std::has_unique_object_representations_v<layout<2>> &&
              std::has_unique_object_representations_v<layout<3>>);
static_assert(std::has_unique_object_representations_v<operands<double, 2>> &&
              std::has_unique_object_representations_v<vector_reads<2>> &&
              std::has_unique_object_representations_v<part_table<double>> &&
              std::has_unique_object_representations_v<matrix<double>>);
// (floating-point members are not "unique" to the trait, as +0 and -0 compare equal: sizes then)
static_assert(sizeof(constant_fn<float>) == sizeof(float) &&
              sizeof(scalar_left_fn<binary_fn<binary_op::add>, float>) == sizeof(float) &&
              sizeof(scalar_right_fn<binary_fn<binary_op::pow>, double>) == sizeof(double));

void launch_fill(const launch_target& on, dtype t, const view& dst, scalar value) {
  with_type(t, [&](auto tag) { typed_kernels<decltype(tag)>::fill(on, dst, value); });
}

void launch_unary(const launch_target& on, dtype t, unary_op op, const view& dst, const view& src) {
  with_type(t, [&](auto tag) { typed_kernels<decltype(tag)>::unary(on, op, dst, src); });
}

void launch_binary(const launch_target& on, dtype t, binary_op op, const view& dst, const view& a,
                   const view& b, const scalar* a_scalar, const scalar* b_scalar) {
  with_type(t, [&](auto tag) {
    binary_kernels<decltype(tag)>::binary(on, op, dst, a, b, a_scalar, b_scalar);
  });
}

bool launch_binary_parts(const launch_target& on, dtype t, binary_op op,
                         const std::vector<backend::binary_part>& parts) {
  if (parts.empty() || parts.size() > max_binary_parts) {
    return false;
  }
  binary_part_lines l;
  l.parts = parts.size();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    l.lines[i] = {parts[i].dst, parts[i].a, parts[i].b};
    l.counts[i] = collapse_jointly(l.lines[i].data(), 3);
    for (const view& v : l.lines[i]) {
      if (l.counts[i] != 0 && (v.rank != 1 || v.stride[0] != 1)) {
        return false;
      }
    }
    l.most = std::max(l.most, l.counts[i]);
  }
  with_type(t, [&](auto tag) { binary_kernels<decltype(tag)>::parts(on, op, l); });
  return true;
}

void launch_accumulate(const launch_target& on, dtype t, reduce_op op, const view& acc,
                       const view& src) {
  with_type(t, [&](auto tag) { typed_kernels<decltype(tag)>::accumulate(on, op, acc, src); });
}

void launch_reduce(const launch_target& on, dtype t, reduce_op op, const view& acc, const view& src,
                   int axis, void* scratch) {
  with_type(
      t, [&](auto tag) { typed_kernels<decltype(tag)>::reduce(on, op, acc, src, axis, scratch); });
}

void launch_copy(const launch_target& on, std::size_t element_bytes, const view& dst,
                 const view& src) {
  if (element_bytes == 4) {
    run_map<std::uint32_t, 1>(on, std::array<view, 2>{dst, src}, identity_fn{});
  } else {
    run_map<std::uint64_t, 1>(on, std::array<view, 2>{dst, src}, identity_fn{});
  }
}

void launch_gemm_accumulate(const launch_target& on, dtype t, const view& c, const view& a,
                            const view& b) {
  with_type(t, [&](auto tag) { typed_kernels<decltype(tag)>::gemm_accumulate(on, c, a, b); });
}

}  // namespace poolscope::darray::detail
