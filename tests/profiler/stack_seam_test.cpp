// The stack seam: every unwinder sees the same stack as glibc's backtrace (the reference), from
// the main thread and from other threads, shallow and deep.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../../profiler/src/detail/stack_seam.hpp"

namespace poolscope::profiler::detail {
namespace {

constexpr std::size_t k_capacity = 256;

std::vector<unwind_backend> exact_backends() {
  std::vector<unwind_backend> out;
  for (auto b :
       {unwind_backend::glibc_backtrace, unwind_backend::libunwind, unwind_backend::cached_dwarf}) {
    if (unwind_backend_available(b)) {
      out.push_back(b);
    }
  }
  return out;
}

/// Captures with each backend from one call instruction, so all see the same stack.
__attribute__((noipa)) std::vector<std::vector<std::uintptr_t>> capture_all() {
  std::vector<std::vector<std::uintptr_t>> stacks;
  for (unwind_backend b : exact_backends()) {
    std::vector<std::uintptr_t> frames(k_capacity);
    frames.resize(capture_stack(b, frames.data(), frames.size()));
    stacks.push_back(std::move(frames));
  }
  asm volatile("" ::: "memory");
  return stacks;
}

__attribute__((noipa)) std::vector<std::vector<std::uintptr_t>> nested(int depth) {
  if (depth == 0) {
    return capture_all();
  }
  auto r = nested(depth - 1);
  asm volatile("" ::: "memory");
  return r;
}

void expect_all_equal(const std::vector<std::vector<std::uintptr_t>>& stacks) {
  const auto backends = exact_backends();
  ASSERT_EQ(stacks.size(), backends.size());
  const auto& ref = stacks[0];  // glibc
  EXPECT_GE(ref.size(), 3u);
  for (std::size_t i = 1; i < stacks.size(); ++i) {
    SCOPED_TRACE(unwind_backend_name(backends[i]));
    ASSERT_FALSE(stacks[i].empty());
    // Sanitizers intercept backtrace(): their interceptor's frame comes first in glibc's stack.
    std::size_t skip = 0;
    while (skip < 2 && skip < ref.size() && ref[skip] != stacks[i][0]) {
      ++skip;
    }
    EXPECT_EQ(stacks[i].size() + skip, ref.size());
    const std::size_t n = std::min(stacks[i].size(), ref.size() - skip);
    for (std::size_t k = 0; k < n; ++k) {
      EXPECT_EQ(stacks[i][k], ref[k + skip]) << "frame " << k;
    }
  }
}

TEST(stack_seam, unwinders_agree_on_the_main_thread) {
  expect_all_equal(nested(0));
  expect_all_equal(nested(5));
  expect_all_equal(nested(100));  // deeper than any default max_depth
}

TEST(stack_seam, unwinders_agree_on_other_threads) {
#if defined(__SANITIZE_THREAD__)
  // libunwind's per-thread cache destructor takes a mutex after ThreadSanitizer has let go of
  // the exiting thread, which crashes; the main-thread test covers libunwind there.
  if (unwind_backend_available(unwind_backend::libunwind)) {
    GTEST_SKIP() << "libunwind on a thread that exits crashes under ThreadSanitizer";
  }
#endif
  std::vector<std::vector<std::uintptr_t>> stacks;
  std::thread t([&] { stacks = nested(20); });
  t.join();
  expect_all_equal(stacks);
}

TEST(stack_seam, capacity_is_respected_and_innermost_frames_kept) {
  for (unwind_backend b : exact_backends()) {
    SCOPED_TRACE(unwind_backend_name(b));
    std::uintptr_t full[k_capacity];
    std::uintptr_t few[4];
    const std::size_t n = capture_stack(b, full, k_capacity);
    const std::size_t m = capture_stack(b, few, 4);
    ASSERT_GE(n, 4u);
    ASSERT_EQ(m, 4u);
    // The two calls are two call sites in this function: frame 0 differs (frame 1 where a
    // sanitizer's backtrace interceptor adds a frame on top); the frames above are the same.
    for (std::size_t k = 2; k < 4; ++k) {
      EXPECT_EQ(few[k], full[k]) << k;
    }
    EXPECT_EQ(capture_stack(b, few, 0), 0u);
  }
}

TEST(stack_seam, frame_pointer_walk_never_faults) {
  // This test binary may be built without frame pointers: the walk must still end cleanly.
  std::uintptr_t frames[k_capacity];
  const std::size_t n = capture_stack(unwind_backend::frame_pointer, frames, k_capacity);
  EXPECT_LE(n, k_capacity);
  std::thread t([&] { (void)capture_stack(unwind_backend::frame_pointer, frames, k_capacity); });
  t.join();
}

TEST(stack_seam, symbolizer_names_this_function_or_its_module) {
  std::uintptr_t frames[8];
  ASSERT_GE(capture_stack(default_unwind_backend(), frames, 8), 1u);
  symbolizer sym;
  const symbol s = sym.resolve(frames[0]);
  EXPECT_FALSE(s.module.empty());
  EXPECT_NE(s.module.find("poolscope_profiler_tests"), std::string::npos) << s.module;
  if (std::string(sym.backend()) == "libdw") {
    EXPECT_NE(s.function.find("symbolizer_names_this_function"), std::string::npos) << s.function;
    EXPECT_NE(s.file.find("stack_seam_test.cpp"), std::string::npos) << s.file;
  }
  // Garbage never crashes.
  (void)sym.resolve(0);
  (void)sym.resolve(1);
  (void)sym.resolve(~std::uintptr_t{0});
  EXPECT_EQ(demangle("_ZN9poolscope3fooEv"), "poolscope::foo()");
  EXPECT_EQ(demangle("main"), "main");
}

}  // namespace
}  // namespace poolscope::profiler::detail
