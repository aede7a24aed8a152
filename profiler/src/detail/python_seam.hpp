// The profiler's seam to a Python interpreter in the process: the only place the profiler calls
// Python's C API. poolscope has no build dependency on Python: the functions are looked up at
// run time (dlsym in the process's global scope: the python executable, or a libpython loaded
// globally, as in every Python process that loads PyTorch, CuPy or the plug-in through ctypes).
// With no interpreter there, or one too old (before 3.9, without PyFrame_GetBack), available()
// is false and capture() returns nothing: stacks are native frames only.
//
// Preconditions and error conventions:
// - Two ways to read the calling thread's frames. Through the C API (PyEval_GetFrame,
//   PyFrame_GetBack, PyFrame_GetCode: any version from 3.9), holding the GIL as the interpreter
//   requires: a thread that holds it already is read at once; a Python thread that released it
//   around a call into C (PyTorch's operators do, ctypes does) takes it for the walk
//   (PyGILState_Ensure). And on CPython 3.11 to 3.13, directly: the thread state's list of
//   frames, read by a few loads per frame with no call, no reference and no GIL (only the thread
//   itself changes that list, and it is here), each frame's word found in a per-thread cache by
//   (code object, instruction); the GIL is taken only to intern a code object or place met for
//   the first time. The direct reader's layout (python_seam.cpp) is used only once the first
//   captures made holding the GIL found it giving exactly the C API's frames (addresses, code
//   objects, offsets and lines) on this interpreter; any difference turns it off for good.
// - The GIL is taken only when the caller says it may: an event raised while the allocator holds
//   its own lock (device_alloc, segment_map, inside the strategy) must not wait for the GIL,
//   which a thread freeing a tensor holds while it waits for that lock. The pool's events
//   pool_malloc post and pool_free pre come outside the allocator's lock (allocator.cpp), so the
//   profilers take the GIL for those only. An event that may not take it gets the Python frames
//   only if the thread holds the GIL or every frame is cached; else none (native frames only).
//   A thread that never ran Python (no thread state) is never given one: native frames only.
//   Nothing is read while the interpreter is not initialized or is finalizing.
// - Lines are those of the instruction each frame is at (PyFrame_GetLineNumber's, computed once
//   per place with PyCode_Addr2Line); a line a tracer set on a frame object is not read.
// - A Python frame is one word: python_flag | code-object id << 24 | line (a line at or past
//   2^24 is written as 0). Code objects are kept alive (a reference is held) from their first
//   capture, so an id never names another object; at most max_code_objects are kept, later
//   ones are captured as "<python>" with no file.
// - Nothing throws; a failure (no memory for the table) gives a frame of the unknown code id.
// Thread safety: every function is thread-safe (the code table has its own lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "detail/stack_seam.hpp"

namespace poolscope::profiler::detail::python {

/// The flag of a Python frame word (no native return address has it: user space is below it).
inline constexpr std::uintptr_t python_flag = std::uintptr_t{1} << 63;
/// Code objects kept at most.
inline constexpr std::size_t max_code_objects = std::size_t{1} << 16;

/// True if `word` is a Python frame (from capture()), not a native return address.
[[nodiscard]] inline bool is_python_frame(std::uintptr_t word) noexcept {
  return (word & python_flag) != 0;
}

/// True if the interpreter's API was found in this process (looked up once, at the first call).
[[nodiscard]] bool available() noexcept;

/// The interpreter's code (the python executable or libpython): where a native stack enters the
/// evaluator. Empty without an interpreter.
[[nodiscard]] const stop_ranges& interpreter_code() noexcept;

/// True once the interpreter's frames are read directly (see the file comment), false while
/// they are read through the C API.
[[nodiscard]] bool direct_reads() noexcept;

/// Writes the calling thread's Python frames, innermost first, up to `capacity`; returns how
/// many (0 without an interpreter, for a thread that never ran Python, and for one that does not
/// hold the GIL unless `may_take_gil`). Sets `truncated` if there were more.
std::size_t capture(std::uintptr_t* out, std::size_t capacity, bool& truncated,
                    bool may_take_gil) noexcept;

/// The function, file and line of a Python frame word; false if `word` is not one.
bool resolve(std::uintptr_t word, std::string& function, std::string& file, int& line);

}  // namespace poolscope::profiler::detail::python
