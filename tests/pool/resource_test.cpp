// The CUDA seam and the CUDA resources, on whatever machine runs the tests: without a GPU they
// must refuse clearly (device_unavailable naming the resource and the CUDA reason); the
// checking macro must name the call, file:line and error and leave no error behind. The GPU
// behaviour itself is in resource_gpu_test.cu.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "../../pool/src/detail/cuda_seam.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/cuda_async_resource.hpp"
#include "poolscope/pool/cuda_resource.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/pinned_resource.hpp"

namespace poolscope::pool::testing {
namespace {

namespace cudart = poolscope::pool::detail::cudart;

int runtime_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// cudaGetLastError() == cudaSuccess, where that can be known: without a driver the runtime
/// reports its failed initialisation from every call, cudaGetLastError included.
::testing::AssertionResult no_error_left() {
  if (runtime_device_count() == 0) {
    return ::testing::AssertionSuccess() << "(no driver: not checkable)";
  }
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "cudaGetLastError() is " << cudaGetErrorName(status);
}

TEST(cuda_seam, device_count_agrees_with_the_runtime_and_never_throws) {
  const int n = runtime_device_count();
  int seam = -1;
  EXPECT_NO_THROW(seam = cudart::device_count());
  EXPECT_EQ(seam, n);
  EXPECT_TRUE(no_error_left()) << "device_count left an error behind";
  if (n == 0) {
    EXPECT_FALSE(cudart::no_device_reason().empty());
  }
}

TEST(cuda_seam, check_macro_names_the_call_place_and_error_and_clears_it) {
  const int line = __LINE__ + 2;
  try {
    POOLSCOPE_CUDA_CHECK(cudaSetDevice(-1));
    ADD_FAILURE() << "cudaSetDevice(-1) succeeded";
  } catch (const cuda_error& e) {
    EXPECT_EQ(e.api(), "CUDA");
    EXPECT_EQ(e.call(), "cudaSetDevice(-1)");
    EXPECT_TRUE(e.file().ends_with("resource_test.cpp")) << e.file();
    EXPECT_EQ(e.line(), line);
    EXPECT_NE(e.code(), 0);
    EXPECT_TRUE(e.error_name().starts_with("cudaError")) << e.error_name();
    const std::string what = e.what();
    EXPECT_TRUE(contains(what, "cudaSetDevice(-1)")) << what;
    EXPECT_TRUE(contains(what, e.error_name())) << what;
    EXPECT_TRUE(contains(what, "resource_test.cpp:" + std::to_string(line))) << what;
    // It is a poolscope::runtime_error, so generic handlers catch it.
    EXPECT_NE(dynamic_cast<const runtime_error*>(&e), nullptr);
  }
  EXPECT_TRUE(no_error_left()) << "the failed call's error was left behind";
}

TEST(cuda_seam, check_macro_passes_success_through) {
  EXPECT_NO_THROW(POOLSCOPE_CUDA_CHECK(cudaSuccess));
}

TEST(cuda_seam, require_device_refuses_clearly) {
  if (runtime_device_count() == 0) {
    try {
      cudart::require_device(0, "my_resource");
      ADD_FAILURE() << "require_device passed without a GPU";
    } catch (const device_unavailable& e) {
      EXPECT_TRUE(contains(e.what(), "my_resource")) << e.what();
      EXPECT_TRUE(contains(e.what(), "needs a CUDA GPU")) << e.what();
    }
  } else {
    EXPECT_NO_THROW(cudart::require_device(0, "my_resource"));
    try {
      cudart::require_device(runtime_device_count(), "my_resource");
      ADD_FAILURE() << "an ordinal past the last device was accepted";
    } catch (const invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "device " + std::to_string(runtime_device_count())))
          << e.what();
    }
    EXPECT_THROW(cudart::require_device(-1, "my_resource"), invalid_argument);
  }
  EXPECT_TRUE(no_error_left());
}

TEST(cuda_resources, without_a_gpu_every_cuda_resource_refuses_with_device_unavailable) {
  if (runtime_device_count() > 0) {
    GTEST_SKIP() << "a GPU is present: resource_gpu_test covers the resources";
  }
  auto refuses = [](auto make, const char* who) {
    try {
      make();
      ADD_FAILURE() << who << " was built without a GPU";
    } catch (const device_unavailable& e) {
      EXPECT_TRUE(contains(e.what(), who)) << e.what();
      EXPECT_TRUE(contains(e.what(), "cudaError") || contains(e.what(), "no device")) << e.what();
    }
  };
  refuses([] { cuda_resource r{0}; }, "cuda_resource");
  refuses([] { cuda_async_resource r{0}; }, "cuda_async_resource");
  refuses([] { pinned_resource r; }, "pinned_resource");
  refuses([] { (void)make_resource("cuda"); }, "cuda_resource");
  refuses([] { (void)make_resource("cuda_async", 0); }, "cuda_async_resource");
  refuses([] { (void)make_resource("pinned"); }, "pinned_resource");
  EXPECT_TRUE(no_error_left());
}

TEST(factory, names_every_resource_and_allocator) {
  const auto res = resource_names();
  for (const char* n : {"host", "cuda", "cuda_async", "pinned"}) {
    EXPECT_NE(std::find(res.begin(), res.end(), n), res.end()) << n;
  }
  const auto alloc = allocator_names();
  const std::vector<std::string> expected{"naive", "best_fit", "bfc", "stream_pool"};
  EXPECT_EQ(alloc, expected);
  try {
    (void)make_resource("bogus");
    ADD_FAILURE() << "an unknown resource was made";
  } catch (const invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "'bogus'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cuda_async")) << e.what();
  }
}

}  // namespace
}  // namespace poolscope::pool::testing
