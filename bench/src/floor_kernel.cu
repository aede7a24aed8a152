// The bench's own kernels: D3's floors launch them where the op launches its add and, for a small
// piece between peer GPUs, its copy (cuda_seam.hpp, floor_call::kernel_graph).
#include "cuda_seam.hpp"

namespace poolscope::bench::detail {

__global__ void floor_add(const float* a, const float* b, float* c, int n) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    c[i] = a[i] + b[i];
  }
}

__global__ void floor_copy(const unsigned char* src, unsigned char* dst, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<unsigned long long>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

const void* floor_add_kernel() noexcept {
  return reinterpret_cast<const void*>(&floor_add);
}

const void* floor_copy_kernel() noexcept {
  return reinterpret_cast<const void*>(&floor_copy);
}

}  // namespace poolscope::bench::detail
