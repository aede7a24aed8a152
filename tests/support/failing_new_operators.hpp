// The replacement global operator new and delete behind fail_nth_new (failing_new.hpp). Include
// this header in exactly ONE source file of a test executable (a replacement operator new may not
// be inline, so a second inclusion is a duplicate definition at link time). Left out under
// AddressSanitizer and ThreadSanitizer (see failing_new.hpp).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

#include "support/failing_new.hpp"

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
void* operator new(std::size_t n) {
  int& countdown = poolscope::testing::detail::failing_new_countdown;
  if (countdown > 0 && --countdown == 0) {
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) {
    return p;
  }
  throw std::bad_alloc();
}
// Not inlined: GCC would then see std::free of what it takes for a new-expression's pointer.
[[gnu::noinline]] void operator delete(void* p) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, std::size_t /*n*/) noexcept {
  std::free(p);
}
#endif
