// POOLSCOPE_CUDA_CHECK (poolscope/detail/cuda_check*.hpp) for each library's status type: a
// failure throws cuda_error naming the library, the call's text, file:line, the error's name and
// code; success passes; the call runs once; the CUDA runtime's last error is not left behind.
// Statuses are passed in directly where a real failing call would need a GPU.
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <string>

#include "poolscope/detail/cuda_check.hpp"
#include "poolscope/detail/cuda_check_cublas.hpp"
#include "poolscope/detail/cuda_check_cupti.hpp"
#include "poolscope/detail/cuda_check_nccl.hpp"
#include "poolscope/error.hpp"

namespace {

using poolscope::cuda_error;

// Every trait the check knows of, and none for a plain integer.
static_assert(poolscope::detail::checkable_status<cudaError_t>);
static_assert(poolscope::detail::checkable_status<CUresult>);
static_assert(poolscope::detail::checkable_status<ncclResult_t>);
static_assert(poolscope::detail::checkable_status<CUptiResult>);
static_assert(poolscope::detail::checkable_status<cublasStatus_t>);
static_assert(!poolscope::detail::checkable_status<int>);

// Whether the runtime's last error is clear. Without a driver every runtime call, this one too,
// reports the missing driver again, so it can only be checked with one.
::testing::AssertionResult no_error_left() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    return ::testing::AssertionSuccess() << "(no driver: not checkable)";
  }
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "cudaGetLastError() is " << cudaGetErrorName(status);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// What a check threw (`any`: whether it threw a cuda_error at all).
struct thrown {
  bool any = false;
  std::string api, name, call, file, what;
  int code = 0;
  int line = 0;
};

template <typename F>
thrown catch_from(F&& f) {
  thrown t;
  try {
    f();
  } catch (const cuda_error& e) {
    t = {true, e.api(), e.error_name(), e.call(), e.file(), e.what(), e.code(), e.line()};
  }
  return t;
}

void expect_names_the_place(const thrown& t, int line) {
  EXPECT_TRUE(t.any);
  EXPECT_TRUE(t.file.ends_with("cuda_check_test.cpp")) << t.file;
  EXPECT_EQ(t.line, line);
  EXPECT_TRUE(contains(t.what, t.call)) << t.what;
  EXPECT_TRUE(contains(t.what, t.name)) << t.what;
  EXPECT_TRUE(contains(t.what, "(" + std::to_string(t.code) + ")")) << t.what;
  EXPECT_TRUE(contains(t.what, "cuda_check_test.cpp:" + std::to_string(line))) << t.what;
}

TEST(cuda_check, runtime_failure_names_the_call_and_clears_the_last_error) {
  const int line = __LINE__ + 1;
  const thrown t = catch_from([] { POOLSCOPE_CUDA_CHECK(cudaSetDevice(-1)); });
  expect_names_the_place(t, line);
  EXPECT_EQ(t.api, "CUDA");
  EXPECT_EQ(t.call, "cudaSetDevice(-1)");
  EXPECT_NE(t.code, 0);
  EXPECT_EQ(t.name, cudaGetErrorName(static_cast<cudaError_t>(t.code)));
  EXPECT_TRUE(t.name.starts_with("cudaError")) << t.name;
  EXPECT_TRUE(no_error_left()) << "the failed call's error was left behind";
}

TEST(cuda_check, driver_failure_is_named_with_or_without_a_driver) {
  const int line = __LINE__ + 1;
  const thrown t = catch_from([] { POOLSCOPE_CUDA_CHECK(CUDA_ERROR_INVALID_VALUE); });
  expect_names_the_place(t, line);
  EXPECT_EQ(t.api, "CUDA driver");
  EXPECT_EQ(t.code, 1);
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    EXPECT_EQ(t.name, "CUDA_ERROR_INVALID_VALUE");
  } else {
    EXPECT_TRUE(contains(t.name, "no driver")) << t.name;
  }
  EXPECT_TRUE(no_error_left()) << "naming the error left a runtime error behind";
}

TEST(cuda_check, nccl_failure_is_named_by_its_enumerator) {
  const int line = __LINE__ + 1;
  const thrown t = catch_from([] { POOLSCOPE_CUDA_CHECK(ncclInvalidArgument); });
  expect_names_the_place(t, line);
  EXPECT_EQ(t.api, "NCCL");
  EXPECT_EQ(t.name, "ncclInvalidArgument");
  EXPECT_EQ(t.code, 4);
  EXPECT_EQ(t.call, "ncclInvalidArgument");
  EXPECT_EQ(catch_from([] { POOLSCOPE_CUDA_CHECK(ncclRemoteError); }).name, "ncclRemoteError");
  EXPECT_EQ(catch_from([] { POOLSCOPE_CUDA_CHECK(static_cast<ncclResult_t>(99)); }).name,
            "ncclUnknownResult");
}

TEST(cuda_check, cupti_failure_is_named_by_cupti) {
  const int line = __LINE__ + 1;
  const thrown t = catch_from([] { POOLSCOPE_CUDA_CHECK(CUPTI_ERROR_INVALID_PARAMETER); });
  expect_names_the_place(t, line);
  EXPECT_EQ(t.api, "CUPTI");
  EXPECT_EQ(t.name, "CUPTI_ERROR_INVALID_PARAMETER");
  EXPECT_EQ(t.code, static_cast<int>(CUPTI_ERROR_INVALID_PARAMETER));
}

TEST(cuda_check, cublas_failure_is_named_by_cublas) {
  const int line = __LINE__ + 1;
  const thrown t = catch_from([] { POOLSCOPE_CUDA_CHECK(CUBLAS_STATUS_INVALID_VALUE); });
  expect_names_the_place(t, line);
  EXPECT_EQ(t.api, "cuBLAS");
  EXPECT_EQ(t.name, "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_EQ(t.code, 7);
}

TEST(cuda_check, success_passes_and_the_call_runs_once) {
  int runs = 0;
  const auto counted = [&runs](auto status) {
    ++runs;
    return status;
  };
  EXPECT_NO_THROW(POOLSCOPE_CUDA_CHECK(counted(cudaSuccess)));
  EXPECT_NO_THROW(POOLSCOPE_CUDA_CHECK(counted(CUDA_SUCCESS)));
  EXPECT_NO_THROW(POOLSCOPE_CUDA_CHECK(counted(ncclSuccess)));
  EXPECT_NO_THROW(POOLSCOPE_CUDA_CHECK(counted(CUPTI_SUCCESS)));
  EXPECT_NO_THROW(POOLSCOPE_CUDA_CHECK(counted(CUBLAS_STATUS_SUCCESS)));
  EXPECT_EQ(runs, 5);
  EXPECT_TRUE(catch_from([&] { POOLSCOPE_CUDA_CHECK(counted(ncclSystemError)); }).any);
  EXPECT_EQ(runs, 6);
}

// A generic handler catches it: cuda_error is a poolscope::runtime_error.
TEST(cuda_check, failures_are_runtime_errors) {
  EXPECT_THROW(POOLSCOPE_CUDA_CHECK(ncclInternalError), poolscope::runtime_error);
}

}  // namespace
