// poolscope's one error header: every exception the project throws is declared here.
//
//   try {
//     void* p = alloc.allocate(stream, bytes);
//   } catch (const poolscope::out_of_memory& e) {
//     std::cerr << e.what();           // names the request, what the pool held and why it failed
//   } catch (const poolscope::invalid_argument& e) {
//     std::cerr << e.what();           // names the offending value
//   }
//
// Thread safety: the types are plain values; copying and reading them from any thread is safe.
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

namespace poolscope {

/// Base of errors caused by the caller: a bad argument, a misuse of an API.
class logic_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// A bad argument. The message names the argument and the offending value.
class invalid_argument : public logic_error {
 public:
  using logic_error::logic_error;
};

/// A runtime failure of an underlying API (CUDA, NCCL, CUPTI) or of the environment.
class runtime_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A failed call into CUDA, NCCL or CUPTI: carries the API, the call text, where it was made and
/// the library's own error name and code.
///
///   POOLSCOPE_CUDA_CHECK(cudaMalloc(&p, n));  // throws cuda_error naming "cudaMalloc(&p, n)"
class cuda_error : public runtime_error {
 public:
  cuda_error(std::string api, int code, std::string error_name, std::string call, std::string file,
             int line);

  /// The library ("CUDA", "NCCL", "CUPTI").
  [[nodiscard]] const std::string& api() const noexcept { return api_; }
  /// The library's numeric error code.
  [[nodiscard]] int code() const noexcept { return code_; }
  /// The library's name for the code, e.g. "cudaErrorMemoryAllocation".
  [[nodiscard]] const std::string& error_name() const noexcept { return error_name_; }
  /// The source text of the failed call.
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  std::string api_;
  int code_;
  std::string error_name_;
  std::string call_;
  std::string file_;
  int line_;
};

/// Raised when no GPU (or no driver) is present for an operation that needs one.
class device_unavailable : public runtime_error {
 public:
  using runtime_error::runtime_error;
};

/// What the allocator held when a request failed; carried by out_of_memory.
struct oom_context {
  std::size_t requested = 0;             ///< bytes asked for
  std::size_t reserved = 0;              ///< bytes the allocator held from upstream
  std::size_t in_use = 0;                ///< bytes handed out and not yet freed
  std::size_t largest_free_block = 0;    ///< largest cached block that could have served a request
  std::size_t cached_other_streams = 0;  ///< bytes cached on other streams (stream pools)
  std::size_t limit = 0;                 ///< the allocator's limit (SIZE_MAX: none)
  int device = -1;                       ///< device id (-1: host)
};

/// An allocation failed. Derives from std::bad_alloc so generic code catches it; the message
/// names the request, reserved, in use, the largest free block, bytes cached on other streams,
/// the limit and the likely cause.
class out_of_memory : public std::bad_alloc {
 public:
  out_of_memory(std::string allocator, oom_context context, std::string cause);

  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }
  [[nodiscard]] const oom_context& context() const noexcept { return context_; }
  [[nodiscard]] std::size_t requested() const noexcept { return context_.requested; }
  /// Why it failed in a few words: "limit", "upstream exhausted", "size overflow", ...
  [[nodiscard]] const std::string& cause() const noexcept { return cause_; }

 private:
  oom_context context_;
  std::string cause_;
  std::string message_;
};

/// Formats a byte count for messages: "1.50 MiB (1572864 B)".
[[nodiscard]] std::string format_bytes(std::size_t bytes);

namespace detail {
[[noreturn]] void throw_api_error(const char* api, int code, const char* error_name,
                                  const char* call, const char* file, int line);
}  // namespace detail

}  // namespace poolscope
