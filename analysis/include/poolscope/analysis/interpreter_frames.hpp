// interpreter_frames: a Python process's line profile with the interpreter's own frames folded
// away. Between the user's Python lines and the allocator a native stack runs through the
// evaluator, the call machinery and, for ctypes, libffi (`_PyEval_EvalFrameDefault`,
// `_PyObject_MakeTpCall`, `cfunction_call`, `ffi_call_unix64`...): dozens of frames that say
// nothing about the program. `poolscope report` shows each run of them as one node,
// "... 14 interpreter frames", unless asked for the full stacks (--full-stacks).
//
// A frame is the interpreter's when it is native (it has a module: Python frames, the user's
// lines, never are) and
// - its module's file name is "libpython", "python" (the interpreter executable, libpython
//   linked in) or "libffi" (ctypes' foreign calls), each alone or followed by a version or
//   suffix ("python3.12", "libpython3.12.so.1.0", "libffi.so.8"), or starts with "_ctypes."
//   (ctypes' extension module); or
// - its function is a C name (no "::", "<" or "(": C++ never matches) that starts with "_Py",
//   "Py" and a capital letter or '_' (CPython's API: PyObject_Call, PyEval_EvalCode, Py_RunMain),
//   "cfunction_", "method_vectorcall", "vectorcall_", "slot_tp_", "wrapper_call",
//   "wrapperdescr_call", "pymain_", "ffi_call" or "_ctypes_" (the static functions of the same
//   machinery, seen where the interpreter is linked into another program).
//
//   auto [collapsed, runs, frames] = poolscope::analysis::collapse_interpreter_frames(profile);
//
// A run is a maximal chain of interpreter frames (and, inside one, the C library's process start,
// `__libc_start_main` and `__libc_start_call_main` of libc.so, between the interpreter's `_start`
// and its `main`); the interpreter frames right under one call
// site make one node however they branch (the figures of the run's frames become its own, and the
// call sites past the run, those of every branch, its children, merged where they are the same
// frame). Its label gives the frames per path ("... 3-14 interpreter frames" when paths differ).
// A profile without interpreter frames (a C++ program's) is returned unchanged.
//
// Ownership: plain values. Thread safety: reentrant. Cost: linear in the nodes, plus the merge
// of the call sites past each run (linear in their siblings each).
#pragma once

#include <cstddef>

#include "poolscope/profiler/line_profile.hpp"

namespace poolscope::analysis {

/// True if `n` is a frame of the Python interpreter's machinery (the file comment's rule).
[[nodiscard]] bool is_interpreter_frame(const profiler::profile_node& n);

/// A profile with its interpreter frames collapsed, and what was collapsed.
struct collapsed_profile {
  profiler::line_profile profile;
  std::size_t runs = 0;    ///< nodes standing for runs of interpreter frames
  std::size_t frames = 0;  ///< interpreter frames (nodes of the tree) they stand for
};

/// `p` with every run of interpreter frames one node (see the file comment).
[[nodiscard]] collapsed_profile collapse_interpreter_frames(const profiler::line_profile& p);

}  // namespace poolscope::analysis
