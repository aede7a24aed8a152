// The conformance suite over the CUDA driver's virtual memory (vmm); it skips (SetUp) without a GPU
// (the suite: conformance_suite.hpp).
#include "pool/conformance_suite.hpp"

namespace poolscope::pool::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(vmm, allocator_conformance, vmm_allocators);
}  // namespace poolscope::pool::testing
