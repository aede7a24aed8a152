// stack_capturer: the call stack of an allocation as the profilers keep it — the native frames
// from the caller of poolscope inwards-out (poolscope's own frames dropped), and in a Python
// process the Python frames in place of the interpreter's. Shared by the line profiler and the
// snapshot recorder, so both show the same stacks.
//
// A stack is innermost first: the native frames between the allocation and the first frame of
// the interpreter (an extension's C++: PyTorch's operators, ctypes' libffi), at most max_depth;
// then the thread's Python frames (python_seam.hpp), at most max_python_depth. The Python frames
// are read first, so that when there are some the native walk stops at the interpreter instead
// of walking the evaluator they replace. Without Python frames the native stack is kept whole
// (up to max_depth).
// Symbolizing a stack (symbolize_frame) gives native frames their function, file and line, and
// Python frames theirs.
//
// Thread safety: capture() may be called from any number of threads at once (the adaptive room
// for poolscope's own frames is one relaxed atomic). Cost: the native unwind (stack_seam.hpp),
// and with Python frames their read: a few loads and a cache lookup per frame where the
// interpreter's frames are read directly, C API calls per frame where they are not.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "detail/stack_seam.hpp"

namespace poolscope::profiler {
enum class stack_unwinder : std::uint8_t;  // line_profiler.hpp
}  // namespace poolscope::profiler

namespace poolscope::profiler::detail {

/// The unwinder a profiler's option names; `automatic`: default_unwind_backend().
[[nodiscard]] unwind_backend backend_of(stack_unwinder u) noexcept;

/// Settings of a stack_capturer.
struct stack_capture_options {
  unwind_backend backend = unwind_backend::glibc_backtrace;
  /// Native frames kept (the innermost ones).
  std::size_t max_depth = 24;
  /// Drop the frames of poolscope's shared libraries (and of skip_modules_of) from the top.
  bool skip_poolscope_frames = true;
  /// Further frames dropped from the top after poolscope's.
  std::size_t skip_frames = 0;
  /// Code addresses whose shared objects count as poolscope's own (own_code_ranges).
  std::span<const void* const> skip_modules_of{};
  /// Python frames kept (the innermost ones); 0: native frames only.
  std::size_t max_python_depth = 32;
  /// Where the thread runs Python, also walk the native frames above the interpreter's (PyTorch's
  /// stacks="all"); false keeps the Python frames alone there (stacks="python"), sparing the
  /// native walk. A thread that runs no Python keeps its native frames either way.
  bool native_with_python = true;
};

class stack_capturer {
 public:
  /// Most native frames one capture can keep.
  static constexpr std::size_t max_supported_depth = 256;

  explicit stack_capturer(const stack_capture_options& options) noexcept;

  /// Room `out` must have: max_depth + max_python_depth words.
  [[nodiscard]] std::size_t max_frames() const noexcept {
    return options_.max_depth + options_.max_python_depth;
  }
  /// Writes the calling thread's stack into `out` (see the file comment); returns its depth.
  /// `truncated` is set if frames were cut (by max_depth or max_python_depth). `outside_lock`:
  /// the event was raised outside the allocator's lock, so the GIL may be taken to read the
  /// Python frames of a thread that released it (python_seam.hpp).
  std::size_t capture(std::uintptr_t* out, bool& truncated, bool outside_lock) noexcept;

  [[nodiscard]] const own_code_ranges& own() const noexcept { return own_; }
  [[nodiscard]] unwind_backend backend() const noexcept { return options_.backend; }

 private:
  stack_capture_options options_;
  own_code_ranges own_;
  std::atomic<std::size_t> own_frames_;  // room for poolscope's frames above the user's
};

/// The symbol of one captured frame: a native return address (through `sym`) or a Python frame
/// word (python_seam.hpp; module "" and offset 0).
[[nodiscard]] symbol symbolize_frame(symbolizer& sym, std::uintptr_t frame);

}  // namespace poolscope::profiler::detail
