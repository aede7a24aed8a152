// polled_wait: how a host thread of darray waits for work it can only poll (a CUDA event: the CUDA
// backend's every host wait on GPU work goes through here), without taking a core that another
// thread of the process needs. Internal to darray; no CUDA here (tested on the CPU:
// polled_wait_test.cpp).
//
// Why not the runtime's own waits: cudaEventSynchronize and cudaStreamSynchronize spin under the
// default scheduling (cudaDeviceScheduleAuto spins when the system has more cores than GPUs; it
// counts the machine's cores, not the ones the process is bound to). A launcher that binds a rank
// to one core (mpirun does for two ranks) then shares that core between the spin and the workers
// that progress MPI, and the transfer the wait is for moves many times slower. Changing the
// process's scheduling (cudaSetDeviceFlags) is the application's to do, never a library's.
// Events made with cudaEventBlockingSync would sleep in the driver until an interrupt, but cost
// every wait, however short, the interrupt's wake-up (tens of µs), which a chain of small ops
// (a few µs each) pays per op.
//
// So a wait polls, in three steps (poll_schedule): back to back for a few µs (a small op that
// completes at once keeps its latency); then yielding the core between polls (sched_yield returns
// at once when nothing else is runnable on the core, so a process with cores to spare keeps the
// latency of a spin, and hands the core over when another thread, such as an MPI worker, wants
// it); then, a millisecond on, sleeping between polls, the sleeps doubling to a small cap (a
// long wait costs next to no CPU; each sleep lasts at least the kernel's timer slack, so a wait
// that long ends up to a sleep later than its work, a small share of it).
//
// Thread safety: reentrant. Cost: a poll per pause; a clock read per pause once the first poll
// finds the work unfinished.
#pragma once

#include <chrono>
#include <cstdint>

namespace poolscope::darray::detail {

/// When a wait polls back to back, yields between polls, or sleeps (see the file comment).
struct poll_schedule {
  /// Polls back to back until the wait is this old.
  std::chrono::nanoseconds spin{std::chrono::microseconds(5)};
  /// Then yields between polls for this long.
  std::chrono::nanoseconds yield{std::chrono::milliseconds(1)};
  /// Then sleeps between polls: first this long, each sleep twice the last, at most `max_sleep`.
  std::chrono::microseconds first_sleep{8};
  std::chrono::microseconds max_sleep{64};
};

/// What a wait does between two polls.
struct poll_pause {
  enum class kind : std::uint8_t { spin, yield, sleep };
  kind how = kind::spin;
  std::chrono::microseconds sleep{0};  ///< kind::sleep only

  friend bool operator==(const poll_pause&, const poll_pause&) = default;
};

/// The pause after a poll that found the work unfinished, `waited` after the wait began, the
/// pause before that poll being `previous` (a default poll_pause before the first). Pure.
[[nodiscard]] poll_pause next_pause(const poll_schedule& s, std::chrono::nanoseconds waited,
                                    const poll_pause& previous) noexcept;

/// Takes the pause: nothing, a sched_yield, or a sleep.
void take_pause(const poll_pause& p) noexcept;

/// Calls `done()` until it returns true, pausing between calls as `s` says. An exception from
/// `done()` ends the wait and propagates.
template <typename Done>
void poll_until(Done&& done, const poll_schedule& s = {}) {
  if (done()) {
    return;  // complete already: no clock read
  }
  const auto start = std::chrono::steady_clock::now();
  poll_pause p;
  do {
    p = next_pause(s, std::chrono::steady_clock::now() - start, p);
    take_pause(p);
  } while (!done());
}

}  // namespace poolscope::darray::detail
