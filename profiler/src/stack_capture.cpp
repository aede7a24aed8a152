#include "detail/stack_capture.hpp"

#include <algorithm>
#include <cstring>

#include "detail/python_seam.hpp"

namespace poolscope::profiler::detail {

namespace {
// Room for poolscope's own frames (allocate, emit, deliver, on_event, capture) above the user's:
// a first guess, raised when a stack shows more (the unwinders' cost grows with frames walked).
constexpr std::size_t initial_own_frames = 8;
}  // namespace

stack_capturer::stack_capturer(const stack_capture_options& options) noexcept
    : options_(options), own_(options.skip_modules_of), own_frames_(initial_own_frames) {
  options_.skip_modules_of = {};  // read once, by own_
  options_.max_depth = std::min(options_.max_depth, max_supported_depth);
  if (!python::available()) {
    options_.max_python_depth = 0;
  }
}

std::size_t stack_capturer::capture(std::uintptr_t* out, bool& truncated,
                                    bool outside_lock) noexcept {
  // The Python frames first: when there are some, they stand in for the native frames from the
  // interpreter's first one outwards (the evaluator running them), so the native walk stops there.
  bool python_cut = false;
  std::size_t py = 0;
  std::uintptr_t py_frames[256];
  if (options_.max_python_depth != 0) {
    py = python::capture(py_frames, std::min(options_.max_python_depth, std::size(py_frames)),
                         python_cut, outside_lock);
  }
  if (py != 0 && !options_.native_with_python) {
    truncated = python_cut;
    std::memcpy(out, py_frames, py * sizeof(std::uintptr_t));
    return py;
  }
  std::uintptr_t raw[max_supported_depth + 128];
  const std::size_t own_frames = own_frames_.load(std::memory_order_relaxed);
  const std::size_t capacity =
      std::min(options_.max_depth + options_.skip_frames + own_frames + 1, std::size(raw));
  const std::size_t n = capture_stack(options_.backend, raw, capacity,
                                      py != 0 ? &python::interpreter_code() : nullptr);
  std::size_t top = 0;
  if (options_.skip_poolscope_frames) {
    while (top < n && own_.contains(raw[top])) {
      ++top;
    }
    if (top > own_frames) {
      // More of poolscope on the stack than room was made for (a nested allocator): this stack
      // may be cut short, later ones are not.
      own_frames_.store(std::min<std::size_t>(top + 2, 96), std::memory_order_relaxed);
    }
  }
  top = std::min(n, top + options_.skip_frames);
  std::size_t native = n - top;
  // One frame more than needed is captured, so a full buffer means a cut stack only when
  // poolscope's frames took more room than planned.
  truncated = native > options_.max_depth || n == capacity || python_cut;
  native = std::min(native, options_.max_depth);
  std::memcpy(out, raw + top, native * sizeof(std::uintptr_t));
  std::memcpy(out + native, py_frames, py * sizeof(std::uintptr_t));
  return native + py;
}

symbol symbolize_frame(symbolizer& sym, std::uintptr_t frame) {
  symbol s;
  if (python::resolve(frame, s.function, s.file, s.line)) {
    return s;
  }
  return sym.resolve(frame);
}

}  // namespace poolscope::profiler::detail
