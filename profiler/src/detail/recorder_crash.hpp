// The recorder's crash path, reachable by tests (recorder_test.cpp): the fatal-signal flush, and
// the write(2) through which the recorder writes its buffer, replaceable so that a test can make
// writes partial and "crash" between two of them. Not part of the API.
//
// Preconditions and error conventions: nothing here throws. flush_recorders_for_fatal_signal is
// async-signal-safe (atomics and write(2) only). set_recorder_write_for_testing must be called
// while no recorder is writing.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace poolscope::profiler::detail {

/// The shape of write(2).
using recorder_write_function = ssize_t (*)(int fd, const void* data, std::size_t bytes);

/// Makes recorders write their buffers through `f`; nullptr restores ::write. The fatal-signal
/// flush always calls ::write itself.
void set_recorder_write_for_testing(recorder_write_function f) noexcept;

/// What the fatal-signal handler does before it hands the signal on: writes the complete lines
/// each registered recorder has buffered and not yet written.
void flush_recorders_for_fatal_signal() noexcept;

/// Undoes what a (simulated) fatal signal leaves behind for later recorders of the process: after
/// a crash flush no recorder reuses its buffer. For tests that call the crash flush and go on.
void forget_fatal_signal_for_testing() noexcept;

}  // namespace poolscope::profiler::detail
