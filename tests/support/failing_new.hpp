// Allocation failure on demand, for tests of what code does when the host runs out of memory.
// This header (the countdown) may be included anywhere; the replacement operators that read the
// countdown are in failing_new_operators.hpp, which exactly ONE source file of each test
// executable includes (they replace the global operator new and delete for the whole process,
// the libraries under test included).
//
//   poolscope::testing::fail_nth_new(3);   // the 3rd operator new on this thread from now throws
//   ... code under test ...
//   const int left = poolscope::testing::cancel_failing_new();  // > 0: fewer than 3 happened
//
// Not under AddressSanitizer or ThreadSanitizer, whose allocators own operator new and delete
// (replacing them mixes two allocators): there failing_new_available is false and tests that
// need it skip. Thread safety: the countdown is per thread.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace poolscope::testing {

namespace detail {
inline constinit thread_local int failing_new_countdown = 0;
}  // namespace detail

/// Makes the n-th operator new on this thread from now on (n >= 1) throw std::bad_alloc.
inline void fail_nth_new(int n) noexcept {
  detail::failing_new_countdown = n;
}
/// Stops a pending failure; returns how many allocations were still to go before it (0: it
/// happened).
inline int cancel_failing_new() noexcept {
  const int left = detail::failing_new_countdown;
  detail::failing_new_countdown = 0;
  return left;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool failing_new_available = false;
#else
inline constexpr bool failing_new_available = true;
#endif

}  // namespace poolscope::testing
