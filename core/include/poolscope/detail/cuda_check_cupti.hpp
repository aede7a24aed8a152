// POOLSCOPE_CUDA_CHECK for CUPTI calls (CUptiResult): the trait cuda_check.hpp's check reads, with
// cuptiGetResultString's name ("CUPTI_ERROR_NOT_INITIALIZED"). Internal: for seams that include
// <cupti.h> already and link CUDA::cupti.
#pragma once

#include <cupti.h>

#include "poolscope/detail/cuda_check.hpp"

namespace poolscope::detail {

/// CUPTI (CUptiResult).
template <>
struct api_status<CUptiResult> {
  static constexpr const char* api = "CUPTI";
  [[nodiscard]] static constexpr bool ok(CUptiResult s) noexcept { return s == CUPTI_SUCCESS; }
  [[nodiscard]] static const char* name(CUptiResult s) noexcept {
    const char* out = nullptr;
    if (cuptiGetResultString(s, &out) == CUPTI_SUCCESS && out != nullptr) {
      return out;
    }
    return "CUPTI_ERROR_UNKNOWN_RESULT";
  }
  static void clear_error() noexcept {}
};

}  // namespace poolscope::detail
