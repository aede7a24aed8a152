// The CUDA resources on a real GPU: round trips through kernels and copies, stream-ordered
// reuse of cuda_async, pinned host memory, and out-of-memory handling (nullptr, error cleared).
// Skipped, with the reason, where there is no GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "pool/gpu_test_support.cuh"
#include "poolscope/error.hpp"
#include "poolscope/pool/cuda_async_resource.hpp"
#include "poolscope/pool/cuda_resource.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/pinned_resource.hpp"

namespace poolscope::pool::testing {
namespace {

constexpr std::size_t one_pib = std::size_t{1} << 50;

TEST(cuda_resource_gpu, round_trip_through_a_kernel) {
  POOLSCOPE_REQUIRE_GPU();
  cuda_resource r{0};
  EXPECT_EQ(r.device(), 0);
  EXPECT_EQ(r.kind(), memory_kind::device);
  EXPECT_EQ(r.name(), "cuda:0");
  EXPECT_FALSE(r.stream_ordered());
  constexpr std::size_t n = (1 << 20) + 3;
  void* p = r.try_allocate({}, n);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0U);
  cudaPointerAttributes attr{};
  POOLSCOPE_ASSERT_CUDA(cudaPointerGetAttributes(&attr, p));
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, 0);
  fill_bytes<<<64, 256>>>(static_cast<unsigned char*>(p), n, 0xab);
  POOLSCOPE_ASSERT_CUDA(cudaGetLastError());
  POOLSCOPE_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(device_bytes_are(p, n, 0xab));
  r.deallocate({}, p, n);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(cuda_resource_gpu, out_of_memory_returns_null_and_leaves_no_error) {
  POOLSCOPE_REQUIRE_GPU();
  cuda_resource r{0};
  EXPECT_EQ(r.try_allocate({}, one_pib), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the allocation failure was left behind";
  void* p = r.try_allocate({}, 4096);
  ASSERT_NE(p, nullptr) << "the resource is unusable after an out-of-memory";
  r.deallocate({}, p, 4096);
}

TEST(cuda_resource_gpu, a_bad_device_ordinal_is_rejected_naming_it) {
  POOLSCOPE_REQUIRE_GPU();
  int n = 0;
  POOLSCOPE_ASSERT_CUDA(cudaGetDeviceCount(&n));
  try {
    cuda_resource r{n};
    ADD_FAILURE() << "device " << n << " was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("device " + std::to_string(n)), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(cuda_resource{-1}, invalid_argument);
  EXPECT_THROW(cuda_async_resource{n}, invalid_argument);
}

TEST(cuda_resource_gpu, the_factory_makes_every_resource) {
  POOLSCOPE_REQUIRE_GPU();
  for (const char* name : {"cuda", "cuda_async", "pinned", "host"}) {
    auto r = make_resource(name, 0);
    ASSERT_NE(r, nullptr) << name;
    void* p = r->try_allocate({}, 1000);
    ASSERT_NE(p, nullptr) << name;
    r->deallocate({}, p, 1000);
  }
  POOLSCOPE_ASSERT_CUDA(cudaDeviceSynchronize());
}

TEST(cuda_async_resource_gpu, stream_ordered_free_then_reuse_on_the_same_stream) {
  POOLSCOPE_REQUIRE_GPU();
  cuda_async_resource r{0};
  EXPECT_EQ(r.release_threshold(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_TRUE(r.stream_ordered());
  EXPECT_EQ(r.kind(), memory_kind::device);
  EXPECT_EQ(r.name(), "cuda_async:0");
  cudaStream_t s = nullptr;
  POOLSCOPE_ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr std::size_t n = 8 << 20;

  void* p = r.try_allocate(s, n);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0U);
  fill_bytes<<<64, 256, 0, s>>>(static_cast<unsigned char*>(p), n, 0x11);
  POOLSCOPE_ASSERT_CUDA(cudaGetLastError());
  std::vector<unsigned char> host(n);
  POOLSCOPE_ASSERT_CUDA(cudaMemcpyAsync(host.data(), p, n, cudaMemcpyDeviceToHost, s));
  r.deallocate(s, p, n);  // ordered after the copy
  const std::uint64_t reserved = r.pool_reserved_bytes();
  EXPECT_GE(reserved, n);

  // The pool reuses the freed memory in stream order: no new reservation.
  void* q = r.try_allocate(s, n);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(r.pool_reserved_bytes(), reserved) << "the pool grew instead of reusing";
  fill_bytes<<<64, 256, 0, s>>>(static_cast<unsigned char*>(q), n, 0x22);
  POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(s));
  for (std::size_t i = 0; i < n; i += 4099) {
    ASSERT_EQ(host[i], 0x11) << "byte " << i;
  }
  EXPECT_TRUE(device_bytes_are(q, n, 0x22));
  EXPECT_EQ(r.pool_used_bytes(), n);
  r.deallocate(s, q, n);
  POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(s));
  EXPECT_EQ(r.pool_used_bytes(), 0U);
  EXPECT_GE(r.pool_reserved_bytes(), n) << "release threshold max: the pool keeps its memory";
  r.trim_to(0);
  EXPECT_EQ(r.pool_reserved_bytes(), 0U);
  POOLSCOPE_ASSERT_CUDA(cudaStreamDestroy(s));
}

TEST(cuda_async_resource_gpu, release_threshold_is_configurable) {
  POOLSCOPE_REQUIRE_GPU();
  cuda_async_resource r{0, 64 << 20};
  EXPECT_EQ(r.release_threshold(), 64U << 20);
}

TEST(cuda_async_resource_gpu, out_of_memory_returns_null_and_leaves_no_error) {
  POOLSCOPE_REQUIRE_GPU();
  cuda_async_resource r{0};
  cudaStream_t s = nullptr;
  POOLSCOPE_ASSERT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  EXPECT_EQ(r.try_allocate(s, one_pib), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  void* p = r.try_allocate(s, 4096);
  ASSERT_NE(p, nullptr);
  r.deallocate(s, p, 4096);
  POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(s));
  POOLSCOPE_ASSERT_CUDA(cudaStreamDestroy(s));
}

TEST(pinned_resource_gpu, round_trip_through_the_device) {
  POOLSCOPE_REQUIRE_GPU();
  pinned_resource r;
  EXPECT_EQ(r.device(), -1);
  EXPECT_EQ(r.kind(), memory_kind::pinned_host);
  EXPECT_EQ(r.name(), "pinned");
  constexpr std::size_t n = 3 << 20;
  auto* p = static_cast<unsigned char*>(r.try_allocate({}, n));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0U);
  cudaPointerAttributes attr{};
  POOLSCOPE_ASSERT_CUDA(cudaPointerGetAttributes(&attr, p));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = static_cast<unsigned char>(i * 7);
  }
  void* d = nullptr;
  POOLSCOPE_ASSERT_CUDA(cudaMalloc(&d, n));
  POOLSCOPE_ASSERT_CUDA(cudaMemcpy(d, p, n, cudaMemcpyHostToDevice));
  std::memset(p, 0, n);
  POOLSCOPE_ASSERT_CUDA(cudaMemcpy(p, d, n, cudaMemcpyDeviceToHost));
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(p[i], static_cast<unsigned char>(i * 7)) << "byte " << i;
  }
  POOLSCOPE_ASSERT_CUDA(cudaFree(d));
  r.deallocate({}, p, n);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(pinned_resource_gpu, out_of_memory_returns_null_and_leaves_no_error) {
  POOLSCOPE_REQUIRE_GPU();
  pinned_resource r;
  EXPECT_EQ(r.try_allocate({}, one_pib), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace poolscope::pool::testing
