// Peer access to vmm memory (vmm_options::peer_access): a second GPU reads and writes the granules
// a vmm_resource maps on the first, whenever they were mapped (at the first allocation, as the pool
// grows, after the pool gave its granules back and mapped fresh ones), with no
// cudaDeviceEnablePeerAccess: cuMemSetAccess alone grants it. Without peer_access only the owner
// has access, as the driver's cuMemGetAccess reports. Skipped, with the reason, on fewer than two
// GPUs or when the second cannot access the first.
#include <cuda.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "pool/gpu_test_support.cuh"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/vmm_resource.hpp"

namespace poolscope::pool::testing {
namespace {

constexpr int owner = 0;
constexpr int peer = 1;

/// Empty when devices 0 and 1 exist and 1 can access 0's memory; otherwise why not.
std::string no_peer_reason() {
  std::string why = no_gpu_reason();
  if (!why.empty()) {
    return why;
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    return "needs 2 GPUs, found " + std::to_string(n);
  }
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, peer, owner) != cudaSuccess || can == 0) {
    return "GPU 1 cannot access GPU 0's memory (cudaDeviceCanAccessPeer)";
  }
  return "";
}

#define POOLSCOPE_REQUIRE_PEER()                             \
  do {                                                       \
    const std::string poolscope_no_peer_ = no_peer_reason(); \
    if (!poolscope_no_peer_.empty()) {                       \
      GTEST_SKIP() << poolscope_no_peer_;                    \
    }                                                        \
  } while (false)

/// Adds `delta` to each of n bytes at p (a kernel on whatever device is current).
__global__ void add_to_bytes(unsigned char* p, std::size_t n, unsigned char delta) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<unsigned char>(p[i] + delta);
  }
}

/// The owner fills n bytes at p with `v`; the peer's kernel adds 1 to each (a read and a write
/// through its access); the owner then finds v + 1 in every byte.
::testing::AssertionResult peer_reads_and_writes(void* p, std::size_t n, unsigned char v) {
  const auto check = [](cudaError_t status, const char* what) {
    return status == cudaSuccess
               ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << what << ": " << cudaGetErrorName(status);
  };
  auto* bytes = static_cast<unsigned char*>(p);
  if (auto r = check(cudaSetDevice(owner), "cudaSetDevice(0)"); !r) {
    return r;
  }
  fill_bytes<<<64, 256>>>(bytes, n, v);
  if (auto r = check(cudaDeviceSynchronize(), "fill on GPU 0"); !r) {
    return r;
  }
  if (auto r = check(cudaSetDevice(peer), "cudaSetDevice(1)"); !r) {
    return r;
  }
  add_to_bytes<<<64, 256>>>(bytes, n, 1);
  if (auto r = check(cudaDeviceSynchronize(), "add on GPU 1"); !r) {
    return r;
  }
  if (auto r = check(cudaSetDevice(owner), "cudaSetDevice(0)"); !r) {
    return r;
  }
  return device_bytes_are(p, n, static_cast<unsigned char>(v + 1));
}

/// The driver's access flags of `device` for the mapping at p (cuMemGetAccess, reached as the
/// library reaches the driver: through the runtime's entry-point lookup).
::testing::AssertionResult access_of(int device, const void* p, unsigned long long& flags) {
  using get_access_fn = CUresult (*)(unsigned long long*, const CUmemLocation*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status =
      cudaGetDriverEntryPointByVersion("cuMemGetAccess", &fn, 10020, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return ::testing::AssertionFailure() << "cuMemGetAccess not found";
  }
  CUmemLocation where{};
  where.type = CU_MEM_LOCATION_TYPE_DEVICE;
  where.id = device;
  const CUresult r =
      reinterpret_cast<get_access_fn>(fn)(&flags, &where, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS) {
    return ::testing::AssertionFailure() << "cuMemGetAccess returned " << static_cast<int>(r);
  }
  return ::testing::AssertionSuccess();
}

TEST(vmm_peer_gpu, a_peer_reads_and_writes_granules_whenever_they_were_mapped) {
  POOLSCOPE_REQUIRE_PEER();
  POOLSCOPE_ASSERT_CUDA(cudaSetDevice(owner));
  vmm_resource gpu{owner};
  bfc_allocator pool{gpu};
  const std::size_t granule = gpu.granularity();

  // The first allocation maps the pool's first granules.
  const std::size_t small = 3 * granule + 5;
  void* a = pool.allocate({}, small);
  EXPECT_TRUE(peer_reads_and_writes(a, small, 0x10)) << "the first granules";
  // A larger one, while `a` lives, maps more.
  const auto mapped_before = gpu.mapped_bytes();
  const std::size_t large = 40 * granule + 17;
  void* b = pool.allocate({}, large);
  EXPECT_GT(gpu.mapped_bytes(), mapped_before) << "the pool grew without mapping";
  EXPECT_TRUE(peer_reads_and_writes(b, large, 0x20)) << "granules mapped as the pool grew";
  EXPECT_TRUE(device_bytes_are(a, small, 0x11)) << "the first block changed";

  // Everything back, every free granule unmapped; fresh granules then map at the same addresses
  // or others, and the peer's access covers them too.
  pool.deallocate({}, a, small);
  pool.deallocate({}, b, large);
  (void)pool.release_cached();
  EXPECT_EQ(gpu.mapped_bytes(), 0U);
  void* c = pool.allocate({}, large);
  EXPECT_TRUE(peer_reads_and_writes(c, large, 0x30)) << "granules mapped again after a release";
  unsigned long long flags = 0;
  ASSERT_TRUE(access_of(peer, c, flags));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_TRUE(access_of(owner, c, flags));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  pool.deallocate({}, c, large);
}

TEST(vmm_peer_gpu, without_peer_access_only_the_owner_has_access) {
  POOLSCOPE_REQUIRE_PEER();
  POOLSCOPE_ASSERT_CUDA(cudaSetDevice(owner));
  vmm_options options;
  options.peer_access = false;
  vmm_resource gpu{owner, options};
  const std::size_t n = 2 * gpu.granularity();
  void* p = gpu.try_allocate({}, n);
  ASSERT_NE(p, nullptr);
  unsigned long long flags = 0;
  ASSERT_TRUE(access_of(owner, p, flags));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  ASSERT_TRUE(access_of(peer, p, flags));
  EXPECT_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE) << "GPU 1 was granted access";
  fill_bytes<<<64, 256>>>(static_cast<unsigned char*>(p), n, 0x42);
  POOLSCOPE_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(device_bytes_are(p, n, 0x42));
  gpu.deallocate({}, p, n);
}

}  // namespace
}  // namespace poolscope::pool::testing
