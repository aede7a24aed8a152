// Shared pieces of the pool's GPU tests (*_gpu_test.cu): the skip when no GPU is present and
// small kernels. Every GPU test starts with POOLSCOPE_REQUIRE_GPU().
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace poolscope::pool::testing {

/// Empty when a CUDA device is usable; otherwise why not.
inline std::string no_gpu_reason() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(status);
  }
  return n == 0 ? "no CUDA device: cudaGetDeviceCount found none" : "";
}

/// Skips the current test, with the reason, when there is no GPU.
#define POOLSCOPE_REQUIRE_GPU()                            \
  do {                                                     \
    const std::string poolscope_no_gpu_ = no_gpu_reason(); \
    if (!poolscope_no_gpu_.empty()) {                      \
      GTEST_SKIP() << poolscope_no_gpu_;                   \
    }                                                      \
  } while (false)

/// Asserts a CUDA call succeeded, naming it.
#define POOLSCOPE_ASSERT_CUDA(call)                              \
  do {                                                           \
    const cudaError_t poolscope_status_ = (call);                \
    ASSERT_EQ(poolscope_status_, cudaSuccess)                    \
        << #call << ": " << cudaGetErrorName(poolscope_status_); \
  } while (false)

// Kernels have internal linkage: each test file gets its own copy.
namespace {

/// Sets n bytes at p to v.
__global__ void fill_bytes(unsigned char* p, std::size_t n, unsigned char v) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = v;
  }
}

/// Spins for about `ns` nanoseconds (the GPU's global timer), then writes `value` to n ints.
__global__ void spin_then_write(int* p, std::size_t n, std::uint64_t ns, int value) {
  std::uint64_t start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    std::uint64_t now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) {
      break;
    }
    __nanosleep(1000);
  }
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
    p[i] = value;
  }
}

}  // namespace

/// Copies n bytes of device memory to the host and checks every byte is v.
inline ::testing::AssertionResult device_bytes_are(const void* p, std::size_t n, unsigned char v) {
  std::vector<unsigned char> host(n);
  const cudaError_t status = cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost);
  if (status != cudaSuccess) {
    return ::testing::AssertionFailure() << "cudaMemcpy: " << cudaGetErrorName(status);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (host[i] != v) {
      return ::testing::AssertionFailure()
             << "byte " << i << " is " << int{host[i]} << ", not " << int{v};
    }
  }
  return ::testing::AssertionSuccess();
}

/// True if [a, a + an) and [b, b + bn) share a byte.
inline bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

}  // namespace poolscope::pool::testing
