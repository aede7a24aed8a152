// The CUDA backend's kernels for the element-wise binary ops on double (kernels_typed.hpp).
#include "kernels_impl.cuh"

namespace poolscope::darray::detail {
template struct binary_kernels<double>;
}  // namespace poolscope::darray::detail
