#include "cuda_seam.hpp"

#include <cuda_runtime_api.h>

#include "poolscope/error.hpp"

#define POOLSCOPE_BENCH_CUDA_CHECK(call)                                                      \
  do {                                                                                        \
    const cudaError_t poolscope_err_ = (call);                                                \
    if (poolscope_err_ != cudaSuccess) {                                                      \
      ::poolscope::detail::throw_api_error("CUDA", static_cast<int>(poolscope_err_),          \
                                           cudaGetErrorName(poolscope_err_), #call, __FILE__, \
                                           __LINE__);                                         \
    }                                                                                         \
  } while (0)

namespace poolscope::bench::detail {

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error for later callers
    return 0;
  }
  return n;
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  POOLSCOPE_BENCH_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  POOLSCOPE_BENCH_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace poolscope::bench::detail
