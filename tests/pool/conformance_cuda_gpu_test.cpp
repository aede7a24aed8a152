// The conformance suite over cudaMalloc and cudaMallocAsync; it skips (SetUp) without a GPU
// (the suite: conformance_suite.hpp).
#include "pool/conformance_suite.hpp"

namespace poolscope::pool::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(cuda, allocator_conformance, cuda_allocators);
INSTANTIATE_TYPED_TEST_SUITE_P(cuda_async, allocator_conformance, cuda_async_allocators);
}  // namespace poolscope::pool::testing
