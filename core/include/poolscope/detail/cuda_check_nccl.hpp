// POOLSCOPE_CUDA_CHECK for NCCL calls (ncclResult_t): the trait cuda_check.hpp's check reads.
// The name is the enumerator's ("ncclUnhandledCudaError"), as for the other libraries, not
// ncclGetErrorString's sentence, so no program links NCCL for it. Internal: for seams that include
// <nccl.h> already.
#pragma once

#include <nccl.h>

#include "poolscope/detail/cuda_check.hpp"

namespace poolscope::detail {

/// NCCL (ncclResult_t).
template <>
struct api_status<ncclResult_t> {
  static constexpr const char* api = "NCCL";
  [[nodiscard]] static constexpr bool ok(ncclResult_t s) noexcept { return s == ncclSuccess; }
  [[nodiscard]] static const char* name(ncclResult_t s) noexcept {
    switch (s) {
      case ncclSuccess:
        return "ncclSuccess";
      case ncclUnhandledCudaError:
        return "ncclUnhandledCudaError";
      case ncclSystemError:
        return "ncclSystemError";
      case ncclInternalError:
        return "ncclInternalError";
      case ncclInvalidArgument:
        return "ncclInvalidArgument";
      case ncclInvalidUsage:
        return "ncclInvalidUsage";
      case ncclRemoteError:
        return "ncclRemoteError";
      case ncclInProgress:
        return "ncclInProgress";
      default:
        return "ncclUnknownResult";
    }
  }
  static void clear_error() noexcept {}
};

}  // namespace poolscope::detail
