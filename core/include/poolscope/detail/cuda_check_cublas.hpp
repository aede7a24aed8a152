// POOLSCOPE_CUDA_CHECK for cuBLAS calls (cublasStatus_t): the trait cuda_check.hpp's check reads,
// with cublasGetStatusName's name ("CUBLAS_STATUS_NOT_INITIALIZED"). Internal: for seams that
// include <cublas_v2.h> already and link CUDA::cublas.
#pragma once

#include <cublas_v2.h>

#include "poolscope/detail/cuda_check.hpp"

namespace poolscope::detail {

/// cuBLAS (cublasStatus_t).
template <>
struct api_status<cublasStatus_t> {
  static constexpr const char* api = "cuBLAS";
  [[nodiscard]] static constexpr bool ok(cublasStatus_t s) noexcept {
    return s == CUBLAS_STATUS_SUCCESS;
  }
  [[nodiscard]] static const char* name(cublasStatus_t s) noexcept {
    const char* out = cublasGetStatusName(s);
    return out != nullptr ? out : "CUBLAS_STATUS_UNKNOWN";
  }
  static void clear_error() noexcept {}
};

}  // namespace poolscope::detail
