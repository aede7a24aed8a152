// The CUDA backend's kernels for fill, unary ops, reductions and gemm on double
// (kernels_typed.hpp).
#include "kernels_impl.cuh"

namespace poolscope::darray::detail {
template struct typed_kernels<double>;
}  // namespace poolscope::darray::detail
