// stream_pool_allocator on a real GPU: a block freed on stream S while a kernel on S still
// writes it must not reach stream T until S's work is done, and must reach T once it is; out of
// memory on a device leaves the pool usable. Skipped, with the reason, where there is no GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "pool/gpu_test_support.cuh"
#include "poolscope/error.hpp"
#include "poolscope/pool/cuda_async_resource.hpp"
#include "poolscope/pool/cuda_resource.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/pinned_resource.hpp"
#include "poolscope/pool/stream_pool_allocator.hpp"

namespace poolscope::pool::testing {
namespace {

constexpr std::uint64_t spin_ns = 100'000'000;  // 100 ms: long enough to act while it runs

/// Two non-blocking streams, destroyed at the end of the test.
struct two_streams {
  two_streams() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
  }
  two_streams(const two_streams&) = delete;
  two_streams& operator=(const two_streams&) = delete;
  ~two_streams() {
    (void)cudaStreamSynchronize(s);
    (void)cudaStreamSynchronize(t);
    (void)cudaStreamDestroy(s);
    (void)cudaStreamDestroy(t);
  }
  cudaStream_t s = nullptr;
  cudaStream_t t = nullptr;
};

/// The upstream resources the cross-stream test runs on, as types.
struct over_cuda {
  static std::unique_ptr<resource> make() { return std::make_unique<cuda_resource>(0); }
  // cudaMalloc may wait for the device on some drivers; the rule is still checked then, but
  // "the kernel is still running" cannot be asserted after it.
  static constexpr bool upstream_never_blocks = false;
};
struct over_cuda_async {
  static std::unique_ptr<resource> make() { return std::make_unique<cuda_async_resource>(0); }
  static constexpr bool upstream_never_blocks = true;
};

template <typename Upstream>
class stream_pool_gpu : public ::testing::Test {};
using upstreams = ::testing::Types<over_cuda, over_cuda_async>;
TYPED_TEST_SUITE(stream_pool_gpu, upstreams);

TYPED_TEST(stream_pool_gpu,
           a_block_freed_under_a_running_kernel_reaches_another_stream_only_after) {
  POOLSCOPE_REQUIRE_GPU();
  auto gpu = TypeParam::make();
  two_streams st;
  {
    // best_fit inner: whole blocks of the rounded size, so the reuse is visible by address.
    stream_pool_allocator pool{*gpu, "best_fit"};
    constexpr std::size_t bytes = 1 << 20;
    void* p = pool.allocate(st.s, bytes);
    POOLSCOPE_ASSERT_CUDA(cudaMemsetAsync(p, 0, bytes, st.s));
    spin_then_write<<<1, 256, 0, st.s>>>(static_cast<int*>(p), bytes / sizeof(int), spin_ns, 42);
    POOLSCOPE_ASSERT_CUDA(cudaGetLastError());

    pool.deallocate(st.s, p, bytes);  // the kernel still writes p
    void* q = pool.allocate(st.t, bytes);
    const cudaError_t running = cudaStreamQuery(st.s);
    (void)cudaGetLastError();
    EXPECT_FALSE(overlaps(q, bytes, p, bytes)) << "T got the block S's kernel is writing";
    if (TypeParam::upstream_never_blocks) {
      ASSERT_EQ(running, cudaErrorNotReady) << "the kernel ended before the check: inconclusive";
    }

    // S's pool releases the block behind an event on S; the kernel still runs.
    ASSERT_EQ(pool.release_cached(st.s), bytes);
    const auto before = pool.stats();
    void* q2 = pool.allocate(st.t, bytes);
    const cudaError_t still_running = cudaStreamQuery(st.s);
    (void)cudaGetLastError();
    EXPECT_FALSE(overlaps(q2, bytes, p, bytes))
        << "T got S's released block before S's event completed";
    EXPECT_GT(pool.stats().upstream_allocs, before.upstream_allocs);
    if (TypeParam::upstream_never_blocks) {
      ASSERT_EQ(still_running, cudaErrorNotReady);
    }
    // T's own work on its blocks must not disturb S's kernel.
    POOLSCOPE_ASSERT_CUDA(cudaMemsetAsync(q, 0x7f, bytes, st.t));
    POOLSCOPE_ASSERT_CUDA(cudaMemsetAsync(q2, 0x7f, bytes, st.t));

    POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(st.s));
    POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(st.t));
    std::vector<int> host(bytes / sizeof(int));
    POOLSCOPE_ASSERT_CUDA(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](int v) { return v == 42; }))
        << "S's kernel output was overwritten";

    // S's work is done: its released block now serves T without a new upstream block.
    const auto mid = pool.stats();
    void* r = pool.allocate(st.t, bytes);
    EXPECT_EQ(r, p) << "T did not reuse S's released block after S finished";
    EXPECT_EQ(pool.stats().upstream_allocs, mid.upstream_allocs);
    fill_bytes<<<64, 256, 0, st.t>>>(static_cast<unsigned char*>(r), bytes, 0x33);
    POOLSCOPE_ASSERT_CUDA(cudaGetLastError());
    POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(st.t));
    EXPECT_TRUE(device_bytes_are(r, bytes, 0x33));

    pool.deallocate(st.t, q, bytes);
    pool.deallocate(st.t, q2, bytes);
    pool.deallocate(st.t, r, bytes);
    EXPECT_EQ(pool.stats().in_use, 0U);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TYPED_TEST(stream_pool_gpu, a_cross_stream_free_waits_for_the_freeing_stream) {
  POOLSCOPE_REQUIRE_GPU();
  auto gpu = TypeParam::make();
  two_streams st;
  {
    stream_pool_allocator pool{*gpu, "best_fit"};
    constexpr std::size_t bytes = 1 << 20;
    void* p = pool.allocate(st.s, bytes);
    // Used on T, freed on T: S may reuse it only after T's kernel.
    spin_then_write<<<1, 256, 0, st.t>>>(static_cast<int*>(p), bytes / sizeof(int), spin_ns, 7);
    POOLSCOPE_ASSERT_CUDA(cudaGetLastError());
    pool.deallocate(st.t, p, bytes);
    void* q = pool.allocate(st.s, bytes);
    const cudaError_t running = cudaStreamQuery(st.t);
    (void)cudaGetLastError();
    EXPECT_FALSE(overlaps(q, bytes, p, bytes)) << "S reused a block T's kernel is writing";
    if (TypeParam::upstream_never_blocks) {
      ASSERT_EQ(running, cudaErrorNotReady) << "the kernel ended before the check: inconclusive";
    }
    POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(st.t));
    void* r = pool.allocate(st.s, bytes);
    EXPECT_EQ(r, p) << "the block did not return to S after T finished";
    pool.deallocate(st.s, q, bytes);
    pool.deallocate(st.s, r, bytes);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(stream_pool_gpu_default, the_default_inner_never_shares_memory_under_a_running_kernel) {
  POOLSCOPE_REQUIRE_GPU();
  cuda_async_resource gpu{0};
  two_streams st;
  stream_pool_allocator pool{gpu};  // bfc inside
  constexpr std::size_t bytes = 256 << 10;
  void* p = pool.allocate(st.s, bytes);
  spin_then_write<<<1, 256, 0, st.s>>>(static_cast<int*>(p), bytes / sizeof(int), spin_ns, 5);
  POOLSCOPE_ASSERT_CUDA(cudaGetLastError());
  pool.deallocate(st.s, p, bytes);
  (void)pool.release_cached(st.s);
  std::vector<void*> on_t;
  for (int i = 0; i < 16; ++i) {
    on_t.push_back(pool.allocate(st.t, bytes));
    EXPECT_FALSE(overlaps(on_t.back(), bytes, p, bytes)) << "allocation " << i;
  }
  const cudaError_t running = cudaStreamQuery(st.s);
  (void)cudaGetLastError();
  ASSERT_EQ(running, cudaErrorNotReady) << "the kernel ended before the check: inconclusive";
  for (void* q : on_t) {
    pool.deallocate(st.t, q, bytes);
  }
  POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(st.s));
  // S's memory, released and now idle, serves a third stream without a new upstream block.
  cudaStream_t u = nullptr;
  POOLSCOPE_ASSERT_CUDA(cudaStreamCreateWithFlags(&u, cudaStreamNonBlocking));
  const auto before = pool.stats();
  void* r = pool.allocate(u, bytes);
  EXPECT_EQ(pool.stats().upstream_allocs, before.upstream_allocs);
  pool.deallocate(u, r, bytes);
  POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(u));
  EXPECT_GT(pool.release_cached(), 0U);
  POOLSCOPE_ASSERT_CUDA(cudaStreamDestroy(u));
}

TEST(stream_pool_gpu_default, one_pib_throws_out_of_memory_and_the_pool_stays_usable) {
  POOLSCOPE_REQUIRE_GPU();
  for (const char* upstream : {"cuda", "cuda_async"}) {
    SCOPED_TRACE(upstream);
    auto gpu = make_resource(upstream, 0);
    two_streams st;
    stream_pool_allocator pool{*gpu};
    void* keep = pool.allocate(st.t, 1 << 20);
    try {
      (void)pool.allocate(st.s, std::size_t{1} << 50);
      ADD_FAILURE() << "1 PiB was handed out";
    } catch (const out_of_memory& e) {
      EXPECT_EQ(e.requested(), std::size_t{1} << 50);
      EXPECT_NE(e.cause().find("upstream"), std::string::npos) << e.cause();
      EXPECT_EQ(e.context().device, 0);
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failure was left behind";
    EXPECT_EQ(pool.stats().oom_count, 1U);
    void* p = pool.allocate(st.s, 1 << 20);
    fill_bytes<<<16, 256, 0, st.s>>>(static_cast<unsigned char*>(p), 1 << 20, 0x44);
    POOLSCOPE_ASSERT_CUDA(cudaGetLastError());
    POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(st.s));
    EXPECT_TRUE(device_bytes_are(p, 1 << 20, 0x44));
    pool.deallocate(st.s, p, 1 << 20);
    pool.deallocate(st.t, keep, 1 << 20);
  }
}

TEST(stream_pool_gpu_default, pinned_host_memory_per_stream) {
  POOLSCOPE_REQUIRE_GPU();
  pinned_resource pinned;
  two_streams st;
  stream_pool_allocator pool{pinned, "best_fit"};
  auto* h = static_cast<unsigned char*>(pool.allocate(st.s, 1 << 20));
  std::memset(h, 0x5c, 1 << 20);
  void* d = nullptr;
  POOLSCOPE_ASSERT_CUDA(cudaMalloc(&d, 1 << 20));
  POOLSCOPE_ASSERT_CUDA(cudaMemcpyAsync(d, h, 1 << 20, cudaMemcpyHostToDevice, st.s));
  pool.deallocate(st.s, h, 1 << 20);
  EXPECT_EQ(pool.release_cached(st.s), std::size_t{1} << 20);
  POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(st.s));
  EXPECT_TRUE(device_bytes_are(d, 1 << 20, 0x5c));
  void* r = pool.allocate(st.t, 1 << 20);
  EXPECT_EQ(r, h) << "the released pinned block did not serve T after S finished";
  pool.deallocate(st.t, r, 1 << 20);
  POOLSCOPE_ASSERT_CUDA(cudaFree(d));
}

// Pinned memory is usable from every GPU, so one pinned pool may serve streams of several: its
// events must be made on each stream's device (an event of GPU 0 cannot be recorded on a stream
// of GPU 1), and its barrier must wait for every such GPU, whichever device is current.
TEST(stream_pool_gpu_default, pinned_memory_serves_streams_of_two_gpus) {
  POOLSCOPE_REQUIRE_GPU();
  int gpus = 0;
  POOLSCOPE_ASSERT_CUDA(cudaGetDeviceCount(&gpus));
  if (gpus < 2) {
    GTEST_SKIP() << "needs two GPUs; " << gpus << " present";
  }
  POOLSCOPE_ASSERT_CUDA(cudaSetDevice(1));
  cudaStream_t s1 = nullptr;
  POOLSCOPE_ASSERT_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  POOLSCOPE_ASSERT_CUDA(cudaSetDevice(0));
  cudaStream_t s0 = nullptr;
  POOLSCOPE_ASSERT_CUDA(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  constexpr std::size_t bytes = 1 << 20;
  constexpr std::size_t ints = bytes / sizeof(int);
  // Enqueues a kernel on GPU 1's stream writing `value` into p, leaving GPU 0 current.
  auto write_on_gpu1 = [&](void* p, int value) {
    EXPECT_EQ(cudaSetDevice(1), cudaSuccess);
    spin_then_write<<<1, 256, 0, s1>>>(static_cast<int*>(p), ints, spin_ns, value);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  };
  {
    pinned_resource pinned;
    stream_pool_allocator pool{pinned, "best_fit"};
    void* p = pool.allocate(s0, bytes);
    write_on_gpu1(p, 9);
    pool.deallocate(s1, p, bytes);  // an event on GPU 1's stream, GPU 0 current
    void* q = pool.allocate(s0, bytes);
    const cudaError_t running = cudaStreamQuery(s1);
    (void)cudaGetLastError();
    EXPECT_FALSE(overlaps(q, bytes, p, bytes)) << "GPU 0's stream reused a block GPU 1 writes";
    ASSERT_EQ(running, cudaErrorNotReady) << "the kernel ended before the check: inconclusive";
    POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(s1));
    void* r = pool.allocate(s0, bytes);
    EXPECT_EQ(r, p) << "the block freed on GPU 1's stream did not return once that stream was "
                       "done (its event could not be recorded?)";
    const int* written = static_cast<const int*>(p);
    EXPECT_TRUE(std::all_of(written, written + ints, [](int v) { return v == 9; }));
    pool.deallocate(s0, q, bytes);
    pool.deallocate(s0, r, bytes);

    // The barrier of release_cached() waits for GPU 1 too before the memory goes back.
    void* w = pool.allocate(s1, bytes);
    write_on_gpu1(w, 3);
    pool.deallocate(s1, w, bytes);
    EXPECT_GE(pool.release_cached(), 2 * bytes);
    const cudaError_t after = cudaStreamQuery(s1);
    (void)cudaGetLastError();
    EXPECT_EQ(after, cudaSuccess) << "pinned memory went back while GPU 1 still wrote it";
    EXPECT_EQ(pool.stats().reserved, 0U);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  POOLSCOPE_ASSERT_CUDA(cudaStreamSynchronize(s1));
  POOLSCOPE_ASSERT_CUDA(cudaStreamDestroy(s1));
  POOLSCOPE_ASSERT_CUDA(cudaStreamDestroy(s0));
}

}  // namespace
}  // namespace poolscope::pool::testing
