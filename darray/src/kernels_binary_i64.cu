// The CUDA backend's kernels for the element-wise binary ops on std::int64_t (kernels_typed.hpp).
#include "kernels_impl.cuh"

namespace poolscope::darray::detail {
template struct binary_kernels<std::int64_t>;
}  // namespace poolscope::darray::detail
