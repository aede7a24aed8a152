// integer_pow: a ** b of an integer type as backend.hpp's "Arithmetic" paragraph states it, in one
// place for the host backend (host_backend.cpp) and the CUDA kernels (kernels.cu), so that both
// compute the same values.
//
//   detail::integer_pow<std::int64_t>(3, 35);   // 50031545098999707, exact (a double is not)
//   detail::integer_pow<std::int32_t>(3, 40);   // INT32_MAX: saturated
//   detail::integer_pow<std::int32_t>(2, -1);   // 0: 0.5 truncated toward zero
//
// Exact by squaring (at most 64 squarings, fewer than 8 before an overflow of |a| >= 2); a result
// outside the type's range saturates to its max or min; a negative exponent gives the real result
// truncated toward zero (1 ** b = 1, (-1) ** b = +-1 by parity, 0 ** b = +inf saturated to the
// max, 0 otherwise). Thread safety: pure. Cost: O(log b) integer operations.
#pragma once

#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#define POOLSCOPE_INTEGER_POW_HD __host__ __device__ __forceinline__
#else
#define POOLSCOPE_INTEGER_POW_HD inline
#endif

namespace poolscope::darray::detail {

template <typename T>
POOLSCOPE_INTEGER_POW_HD T integer_pow(T a, T b) noexcept {
  static_assert(std::is_integral_v<T> && std::is_signed_v<T>, "integer_pow of signed integers");
  using U = std::make_unsigned_t<T>;
  const bool odd = (static_cast<U>(b) & U{1}) != 0;  // of negative exponents too
  if (b < 0) {
    if (a == 1) {
      return T{1};
    }
    if (a == -1) {
      return odd ? T{-1} : T{1};
    }
    return a == 0 ? std::numeric_limits<T>::max() : T{0};
  }
  const bool negative = a < 0 && odd;
  const U magnitude = a < 0 ? static_cast<U>(U{0} - static_cast<U>(a)) : static_cast<U>(a);
  // The largest magnitude the result may have: |min| = max + 1 for a negative one.
  const U limit =
      static_cast<U>(static_cast<U>(std::numeric_limits<T>::max()) + (negative ? 1 : 0));
  const T saturated = negative ? std::numeric_limits<T>::min() : std::numeric_limits<T>::max();
  U result = 1;
  if (magnitude <= 1) {
    result = b == 0 ? U{1} : magnitude;
  } else {
    U base = magnitude;
    U e = static_cast<U>(b);
    for (;;) {
      if ((e & U{1}) != 0) {
        if (result > limit / base) {
          return saturated;
        }
        result = static_cast<U>(result * base);
      }
      e = static_cast<U>(e >> 1);
      if (e == 0) {
        break;
      }
      // A later bit of e multiplies base^2 or more into the result.
      if (base > limit / base) {
        return saturated;
      }
      base = static_cast<U>(base * base);
    }
  }
  return negative ? static_cast<T>(U{0} - result) : static_cast<T>(result);
}

}  // namespace poolscope::darray::detail

#undef POOLSCOPE_INTEGER_POW_HD
