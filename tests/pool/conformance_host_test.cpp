// The conformance suite over the host resource, with and without the thread cache
// (the suite: conformance_suite.hpp).
#include "pool/conformance_suite.hpp"

namespace poolscope::pool::testing {
INSTANTIATE_TYPED_TEST_SUITE_P(host, allocator_conformance, host_allocators);
}  // namespace poolscope::pool::testing
