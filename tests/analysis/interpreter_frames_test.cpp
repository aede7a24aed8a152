// Interpreter frames collapsed (analysis/interpreter_frames.hpp) on profiles built by hand: which
// frames count, how a run that branches becomes one node, the figures kept, C++ left alone. The
// same on a profile recorded from a real Python process: tests/tools/report_python_test.cpp.
#include "poolscope/analysis/interpreter_frames.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "profiler/profile_test_data.hpp"

namespace {

using poolscope::analysis::collapse_interpreter_frames;
using poolscope::analysis::is_interpreter_frame;
using poolscope::profiler::profile_node;
using namespace poolscope::profiler::test_data;

/// A native frame of `module`.
profile_node native(std::string function, std::string module,
                    poolscope::profiler::profile_counts self = {}) {
  profile_node n;
  n.function = std::move(function);
  n.module = std::move(module);
  n.offset = 0x40;
  n.self = self;
  return n;
}

profile_node with(profile_node n, std::vector<profile_node> children) {
  n.children = std::move(children);
  return n;
}

TEST(interpreter_frames, the_rule_by_library_and_by_name) {
  EXPECT_TRUE(is_interpreter_frame(native("main", "/usr/bin/python3.12")));
  EXPECT_TRUE(is_interpreter_frame(native("", "/usr/bin/python3")));
  EXPECT_TRUE(is_interpreter_frame(native("f", "/usr/lib/libpython3.12.so.1.0")));
  EXPECT_TRUE(is_interpreter_frame(native("f", "/usr/lib/x86_64-linux-gnu/libffi.so.8")));
  EXPECT_TRUE(is_interpreter_frame(
      native("f", "/usr/lib/python3.12/lib-dynload/_ctypes.cpython-312-x86_64-linux-gnu.so")));
  // By name, in a program that links the interpreter in.
  for (const char* name :
       {"_PyEval_EvalFrameDefault", "PyObject_Call", "Py_RunMain", "cfunction_call",
        "method_vectorcall_O", "slot_tp_call", "wrapperdescr_call", "pymain_run_python",
        "ffi_call_unix64", "_ctypes_callproc"}) {
    EXPECT_TRUE(is_interpreter_frame(native(name, "/opt/app/bin/embedded"))) << name;
  }
  // Not the interpreter's: C++ names, other libraries, programs whose name only begins alike,
  // and Python frames (the user's lines: no module) whatever their name.
  EXPECT_FALSE(is_interpreter_frame(native("Py_Thing::call()", "/opt/app/bin/embedded")));
  EXPECT_FALSE(is_interpreter_frame(native("Pyramid", "/opt/app/bin/embedded")));
  EXPECT_FALSE(is_interpreter_frame(native("torch::empty", "/opt/libtorch_cpu.so")));
  EXPECT_FALSE(is_interpreter_frame(native("main", "/opt/bin/python_server")));
  EXPECT_FALSE(is_interpreter_frame(native("main", "/opt/lib/libffiber.so")));
  EXPECT_FALSE(is_interpreter_frame(source_frame("PyObject_Call", "model.py", 3)));
  EXPECT_FALSE(is_interpreter_frame(source_frame("<root>", "", 0)));
}

// <root>
//   main (python3) -> Py_RunMain (python3) -> _PyEval_EvalFrameDefault (libpython)
//     -> cfunction_call (libpython) -> my_ext (ext.so) -> alloc (ext.so): 100 B
//     -> _PyObject_Call (libpython) -> PyCFuncPtr_call (_ctypes) -> ffi_call (libffi): 50 B
//   train (model.py:9) -> _PyObject_MakeTpCall (python3) -> my_ext (ext.so): 30 B
TEST(interpreter_frames, a_run_that_branches_is_one_node_over_the_call_sites_past_it) {
  const std::string py = "/usr/bin/python3.12";
  const std::string lib = "/usr/lib/libpython3.12.so.1.0";
  const auto alloc = native("alloc", "/opt/ext.so", allocations(1, 100, 256));
  const auto p = profile_of(
      {with(native("main", py),
            {with(native("Py_RunMain", py),
                  {with(native("_PyEval_EvalFrameDefault", lib),
                        {with(native("cfunction_call", lib),
                              {with(native("my_ext", "/opt/ext.so"), {alloc})}),
                         with(native("_PyObject_Call", lib),
                              {with(native("PyCFuncPtr_call", "/usr/lib/_ctypes.cpython-312.so"),
                                    {native("ffi_call", "/usr/lib/libffi.so.8",
                                            allocations(2, 50, 512))})})})})}),
       with(source_frame("train", "model.py", 9),
            {with(native("_PyObject_MakeTpCall", py),
                  {native("my_ext", "/opt/ext.so", allocations(1, 30, 256))})})});
  const auto c = collapse_interpreter_frames(p);
  EXPECT_EQ(c.runs, 2U);
  EXPECT_EQ(c.frames, 8U);  // 7 under <root>, 1 under train
  EXPECT_EQ(c.profile.root.total, p.root.total);
  ASSERT_EQ(c.profile.root.children.size(), 2U);
  const profile_node& train = c.profile.root.children[0];
  EXPECT_EQ(train.function, "train");
  ASSERT_EQ(train.children.size(), 1U);
  EXPECT_EQ(train.children[0].function, "... 1 interpreter frame");
  ASSERT_EQ(train.children[0].children.size(), 1U);
  EXPECT_EQ(train.children[0].children[0].function, "my_ext");
  EXPECT_EQ(train.children[0].children[0].total.used, 30U);
  // The run from the root: 4 frames to my_ext, 6 to ffi_call's allocations.
  const profile_node& run = c.profile.root.children[1];
  EXPECT_EQ(run.function, "... 4-6 interpreter frames");
  EXPECT_EQ(run.self.used, 50U);  // ffi_call's own, inside the run
  EXPECT_EQ(run.total.used, 150U);
  ASSERT_EQ(run.children.size(), 1U);
  EXPECT_EQ(run.children[0].function, "my_ext");
  ASSERT_EQ(run.children[0].children.size(), 1U);
  EXPECT_EQ(run.children[0].children[0].function, "alloc");
}

TEST(interpreter_frames, call_sites_past_two_branches_of_a_run_merge) {
  // Two paths through the evaluator reach the same extension function: one node past the run,
  // the figures of both.
  const std::string lib = "/usr/lib/libpython3.12.so.1.0";
  const auto p = profile_of({with(
      native("_PyEval_EvalFrameDefault", lib),
      {with(native("cfunction_call", lib), {native("my_ext", "/opt/ext.so", allocations(1, 7, 8))}),
       with(native("method_vectorcall_O", lib),
            {native("my_ext", "/opt/ext.so", allocations(2, 9, 16))})})});
  const auto c = collapse_interpreter_frames(p);
  EXPECT_EQ(c.runs, 1U);
  EXPECT_EQ(c.frames, 3U);
  ASSERT_EQ(c.profile.root.children.size(), 1U);
  const profile_node& run = c.profile.root.children[0];
  EXPECT_EQ(run.function, "... 2 interpreter frames");
  ASSERT_EQ(run.children.size(), 1U);
  EXPECT_EQ(run.children[0].total.count, 3U);
  EXPECT_EQ(run.children[0].total.used, 16U);
}

TEST(interpreter_frames, the_process_start_inside_a_run_is_part_of_it) {
  // The interpreter executable's _start, the C library's start, its main: one run.
  const std::string py = "/usr/bin/python3.12";
  const std::string libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
  const auto p = profile_of(
      {with(native("_start", py),
            {with(native("__libc_start_main", libc),
                  {with(native("__libc_start_call_main", libc),
                        {with(native("main", py),
                              {native("my_ext", "/opt/ext.so", allocations(1, 5, 8))})})})})});
  const auto c = collapse_interpreter_frames(p);
  EXPECT_EQ(c.runs, 1U);
  EXPECT_EQ(c.frames, 4U);
  ASSERT_EQ(c.profile.root.children.size(), 1U);
  EXPECT_EQ(c.profile.root.children[0].function, "... 4 interpreter frames");
  ASSERT_EQ(c.profile.root.children[0].children.size(), 1U);
  EXPECT_EQ(c.profile.root.children[0].children[0].function, "my_ext");
}

TEST(interpreter_frames, a_cpp_profile_is_unchanged) {
  // A C++ program's start (its own _start, the C library's) begins no run.
  const std::string libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
  const auto p = profile_of({with(
      frame("_start", "", 0, 0x1050),
      {with(native("__libc_start_main", libc),
            {with(native("__libc_start_call_main", libc),
                  {with(frame("main", "m.cpp", 3, 0x1100),
                        {frame("PyLike::alloc(int)", "m.cpp", 10, 0x1200, allocations(1, 64, 256)),
                         frame("run", "m.cpp", 20, 0x1300, allocations(2, 10, 512))})})})})});
  const auto c = collapse_interpreter_frames(p);
  EXPECT_EQ(c.runs, 0U);
  EXPECT_EQ(c.frames, 0U);
  EXPECT_EQ(c.profile.to_json(), p.to_json());
}

}  // namespace
