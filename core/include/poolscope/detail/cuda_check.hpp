// The one check for calls into NVIDIA's libraries: POOLSCOPE_CUDA_CHECK(call) runs `call` and, if
// it returned a failure, throws poolscope::cuda_error naming the library, the call's source text,
// file:line, the library's error name and its numeric code.
//
//   POOLSCOPE_CUDA_CHECK(cudaStreamSynchronize(s));     // cudaError_t: this header
//   POOLSCOPE_CUDA_CHECK(cuMemMap(va, n, 0, h, 0));     // CUresult: this header
//   POOLSCOPE_CUDA_CHECK(ncclGroupEnd());               // ncclResult_t: cuda_check_nccl.hpp
//   POOLSCOPE_CUDA_CHECK(cuptiActivityFlushAll(0));     // CUptiResult: cuda_check_cupti.hpp
//   POOLSCOPE_CUDA_CHECK(cublasSgemm(h, ...));          // cublasStatus_t: cuda_check_cublas.hpp
//
// One implementation: the macro and raise_api_error read everything they need from
// api_status<Status>, the trait of the status type the call returns; a library's trait is a
// specialization in a header of its own beside this one, so a seam includes the headers of the
// libraries it already calls and no other. A call returning a type without a trait does not
// compile (a static_assert names the headers). Code that must not throw (collectors, which
// disable themselves instead) tests and names a status through the same trait:
// succeeded(status, &error_name).
//
// For the CUDA runtime the last-error state is cleared before throwing, so a failure never leaks
// into a later cudaGetLastError(). Driver-API names come from cuGetErrorName reached through the
// runtime's entry-point query, so no program links libcuda for them; without a driver the name
// says so (the message still carries the code).
//
// Internal: include it only from seam sources that include the CUDA headers already (it needs
// them, and CUDA::cudart to link). Thread safety: as the libraries' own calls (all thread-safe).
// Cost: one comparison on success; the slow path is out of line.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <concepts>
#include <type_traits>

#include "poolscope/error.hpp"

namespace poolscope::detail {

/// What the check needs of a status type: the library's name, success, the error's name, and
/// what to do before throwing. Specialized per status type; the primary template is undefined.
///   static constexpr const char* api;                  // "CUDA", "NCCL", ...
///   static constexpr bool ok(Status) noexcept;
///   static const char* name(Status) noexcept;          // never null
///   static void clear_error() noexcept;                // clears the failure's state, if any
template <typename Status>
struct api_status;

/// The CUDA runtime (cudaError_t).
template <>
struct api_status<cudaError_t> {
  static constexpr const char* api = "CUDA";
  [[nodiscard]] static constexpr bool ok(cudaError_t s) noexcept { return s == cudaSuccess; }
  [[nodiscard]] static const char* name(cudaError_t s) noexcept { return cudaGetErrorName(s); }
  static void clear_error() noexcept { (void)cudaGetLastError(); }
};

/// The CUDA driver API (CUresult).
template <>
struct api_status<CUresult> {
  static constexpr const char* api = "CUDA driver";
  [[nodiscard]] static constexpr bool ok(CUresult s) noexcept { return s == CUDA_SUCCESS; }
  [[nodiscard]] static const char* name(CUresult s) noexcept {
    using get_name = CUresult (*)(CUresult, const char**);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const char* out = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuGetErrorName", &fn, CUDA_VERSION, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess && fn != nullptr &&
        reinterpret_cast<get_name>(fn)(s, &out) == CUDA_SUCCESS && out != nullptr) {
      return out;
    }
    (void)cudaGetLastError();  // the failed query (no driver) must not linger
    return "CUresult (no driver to name it)";
  }
  static void clear_error() noexcept {}
};

/// True for a status type with an api_status trait in scope.
template <typename Status>
concept checkable_status = requires(Status s) {
  { api_status<Status>::ok(s) } -> std::same_as<bool>;
  { api_status<Status>::name(s) } -> std::same_as<const char*>;
};

/// Throws cuda_error for the failed status `s` of the call whose source text is `call`, made at
/// `file`:`line`.
template <typename Status>
[[noreturn]] [[gnu::cold]] [[gnu::noinline]] void raise_api_error(Status s, const char* call,
                                                                  const char* file, int line) {
  static_assert(checkable_status<Status>);
  using traits = api_status<Status>;
  traits::clear_error();
  throw_api_error(traits::api, static_cast<int>(s), traits::name(s), call, file, line);
}

/// For code that must not throw: true if `s` is the library's success; otherwise clears the
/// failure's state (the CUDA runtime's last error), puts the error's name in `*error_name` when
/// given, and returns false.
template <checkable_status Status>
[[nodiscard]] bool succeeded(Status s, const char** error_name = nullptr) noexcept {
  if (api_status<Status>::ok(s)) [[likely]] {
    return true;
  }
  api_status<Status>::clear_error();
  if (error_name != nullptr) {
    *error_name = api_status<Status>::name(s);
  }
  return false;
}

}  // namespace poolscope::detail

/// Checks a call returning a status with an api_status trait; throws poolscope::cuda_error
/// naming the call text, file:line and the library's error name. See the file comment.
#define POOLSCOPE_CUDA_CHECK(call)                                                               \
  do {                                                                                           \
    const auto poolscope_status_ = (call);                                                       \
    using poolscope_status_type_ = std::remove_cv_t<decltype(poolscope_status_)>;                \
    static_assert(::poolscope::detail::checkable_status<poolscope_status_type_>,                 \
                  "POOLSCOPE_CUDA_CHECK: no api_status for the call's status type (include its " \
                  "poolscope/detail/cuda_check_*.hpp)");                                         \
    if (!::poolscope::detail::api_status<poolscope_status_type_>::ok(poolscope_status_))         \
        [[unlikely]] {                                                                           \
      ::poolscope::detail::raise_api_error(poolscope_status_, #call, __FILE__, __LINE__);        \
    }                                                                                            \
  } while (false)
