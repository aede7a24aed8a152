// The conformance suite over host_vmm, the virtual resource CI can run
// (the suite: conformance_suite.hpp).
#include "pool/conformance_suite.hpp"

namespace poolscope::pool::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(host_vmm, allocator_conformance, host_vmm_allocators);
}  // namespace poolscope::pool::testing
