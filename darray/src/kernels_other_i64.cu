// The CUDA backend's kernels for fill, unary ops, reductions and gemm on std::int64_t
// (kernels_typed.hpp).
#include "kernels_impl.cuh"

namespace poolscope::darray::detail {
template struct typed_kernels<std::int64_t>;
}  // namespace poolscope::darray::detail
