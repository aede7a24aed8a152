// An out-of-bounds write inside a pool segment, for compute-sanitizer's NVTX memory support.
//
// A kernel writes one byte past a 1000-byte block from a bfc pool over cudaMalloc: still inside
// the block's 1024-byte chunk and its 2 MiB segment, so plain memcheck (which knows only the
// cudaMalloc'd segment) misses it. With nvtx_memory_hook installed the segment is an NVTX
// sub-allocator heap and the block a 1000-byte region, so memcheck reports the write.
//
// The tests only run the kernel; the verdict comes from the sanitizer (scripts/gpu-check.sh or
// by hand), each case in its own process because a reported error ends the CUDA context:
//   compute-sanitizer --tool memcheck --nvtx yes --error-exitcode 1
//     build/bin/poolscope_profiler_tests --gtest_filter='*NvtxOob*WithRegistration'    (reported)
//   compute-sanitizer --tool memcheck --nvtx yes --error-exitcode 1
//     build/bin/poolscope_profiler_tests --gtest_filter='*NvtxOob*WithoutRegistration' (clean)
// (each command on one line)
// Without a GPU both skip. nvtx_test.cpp leaves NVTX to compute-sanitizer when it runs under it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/profiler/nvtx.hpp"

namespace {

__global__ void write_byte(unsigned char* p, std::size_t offset) {
  p[offset] = 0xAB;
}

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// bfc carves blocks out of 2 MiB segments; best_fit (one segment per block, 512-byte rounding)
// also leaves the written byte inside the segment.
std::string strategy() {
  const auto names = poolscope::pool::allocator_names();
  return std::find(names.begin(), names.end(), "bfc") != names.end() ? "bfc" : "best_fit";
}

constexpr std::size_t k_requested = 1000;

// Allocates two blocks (the first one in the middle of the segment's used part), writes one
// byte past the first, frees both. Returns the status of the synchronize after the kernel.
cudaError_t run_oob_write() {
  // compute-sanitizer needs the CUDA runtime initialized before the first NVTX call.
  (void)cudaFree(nullptr);
  auto res = poolscope::pool::make_resource("cuda", 0);
  auto pool = poolscope::pool::make_allocator(strategy(), *res);
  void* before = pool->allocate({}, k_requested);
  void* block = pool->allocate({}, k_requested);
  void* after = pool->allocate({}, k_requested);
  write_byte<<<1, 1>>>(static_cast<unsigned char*>(block), k_requested);
  const cudaError_t launch = cudaGetLastError();
  const cudaError_t sync = cudaDeviceSynchronize();
  std::printf("NvtxOob: %s pool, block %p, wrote byte %zu: launch %s, sync %s\n",
              pool->name().c_str(), block, k_requested, cudaGetErrorName(launch),
              cudaGetErrorName(sync));
  pool->deallocate({}, after, k_requested);
  pool->deallocate({}, block, k_requested);
  pool->deallocate({}, before, k_requested);
  return launch != cudaSuccess ? launch : sync;
}

TEST(nvtx_memcheck_gpu, NvtxOobWriteWithoutRegistration) {
  if (!have_gpu()) {
    GTEST_SKIP() << "no CUDA device";
  }
  // The byte lies inside the cudaMalloc'd segment: a valid access as far as CUDA knows.
  EXPECT_EQ(run_oob_write(), cudaSuccess);
}

TEST(nvtx_memcheck_gpu, NvtxOobWriteWithRegistration) {
  if (!have_gpu()) {
    GTEST_SKIP() << "no CUDA device";
  }
  poolscope::profiler::nvtx_memory_hook heaps{/*device_memory_only=*/true};
  {
    poolscope::hooks::scoped_hook on{heaps};  // before the pool exists: it sees every segment
    // Under compute-sanitizer the write is reported and the kernel aborted, so the status is
    // not checked here; without the sanitizer it is cudaSuccess.
    (void)run_oob_write();
  }
  const auto c = heaps.snapshot();
  EXPECT_GE(c.heaps_registered, 1U);
  EXPECT_EQ(c.heaps_unregistered, c.heaps_registered);  // the pool released its segments
  EXPECT_EQ(c.regions_registered, 3U);
  EXPECT_EQ(c.regions_unregistered, 3U);
  EXPECT_EQ(c.regions_without_heap, 0U);
}

}  // namespace
